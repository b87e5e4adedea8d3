"""The volume formulas of assignment 06's section of autograder/lessons/volume.py, against ledgers and 04's counts.

    .venv/bin/python -m pytest -q tests/test_composition_volume.py

- 03's `pp_step_p2p_bytes` (which the planner's `pp_boundary_bytes` sends are): what PyTorch's
  pipeline actually sends between two stages of the small GPT under TP + SP, measured with the ledger;
- `ring_attention_bytes_per_layer`: the per-rank send counts of the course's spec
  for assignment 04 (COURSE_SPEC 4.4: forward 2(w-1), backward 2(w-1) + 2w or 2(w-1)).
"""

from __future__ import annotations

import pytest
import torch

import autograder.checks.composition as checks  # noqa: F401 - DTensor, FSDP, pipelining imported in the parent
from autograder.runtime.dist import run_distributed
from autograder.runtime.ledger import CommLedger
from autograder.lessons.tinygpt import ModelArgs, TinyGPT, master_state
from autograder.lessons.volume import pp_step_p2p_bytes, ring_attention_bytes_per_layer
from solutions.composition import train as T


def _pipeline_program(rank, world_size, microbatches, batch, seq):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))
    pp_group = mesh["pp"].get_group()
    model = TinyGPT(ModelArgs()).double()
    model.load_state_dict(master_state(ModelArgs()))
    stage = T.split_model_for_pipeline(model, pp_rank=pp_group.rank(), pp_size=2)
    T.apply_tensor_parallel(stage, mesh["tp"])
    schedule = T.build_schedule(stage, pp_group=pp_group, n_microbatches=microbatches, loss_fn=T.pipeline_loss_fn)
    tokens = torch.randint(0, 16, (batch, seq), generator=torch.Generator().manual_seed(0))
    records = []
    for step in range(2):  # the first step also exchanges shapes (metadata); the second is the steady state
        with CommLedger() as ledger:
            with loss_parallel():
                if pp_group.rank() == 0:
                    schedule.step(tokens)
                else:
                    schedule.step(target=tokens, losses=[])
        records = ledger.records
    return pp_group.rank(), [(r.op, r.bytes, r.dtype) for r in records if r.op in ("send", "recv")]


@pytest.mark.parametrize("microbatches", [2, 4])
def test_pp_step_p2p_bytes_match_pytorchs_pipeline(microbatches):
    batch, seq, h = 4, 8, ModelArgs().dim
    for stage, records in run_distributed(_pipeline_program, 4, args=(microbatches, batch, seq)):
        expected = pp_step_p2p_bytes(seq, batch // microbatches, h, 2, stage, microbatches, bytes_per_element=8, tp=2,
                                     sequence_parallel=True)
        sent = sum(b for op, b, dtype in records if op == "send" and dtype == "float64")
        received = sum(b for op, b, dtype in records if op == "recv" and dtype == "float64")
        # stage 0 sends the activations (forward), stage 1 their gradients (backward); each receives the other's
        assert sent == expected["total"], (stage, records)
        assert received == pp_step_p2p_bytes(seq, batch // microbatches, h, 2, 1 - stage, microbatches,
                                             bytes_per_element=8, tp=2, sequence_parallel=True)["total"]


def test_ring_attention_bytes_follow_the_spec_counts():
    s, b, kv, w, B = 16, 2, 4, 4, 8
    block = b * (s // w) * kv * B
    got = ring_attention_bytes_per_layer(s, b, kv, w, bytes_per_element=B)
    assert got["forward"] == 2 * (w - 1) * block
    assert got["backward"] == 2 * (w - 1) * block + 2 * (w - 1) * block  # TransformerEngine's dK/dV count
    full = ring_attention_bytes_per_layer(s, b, kv, w, bytes_per_element=B, dkv_full_ring=True)
    assert full["backward"] == 2 * (w - 1) * block + 2 * w * block       # the course's, and ring-flash-attention's
    assert ring_attention_bytes_per_layer(s, b, kv, 1)["total"] == 0
    with pytest.raises(ValueError, match="15"):
        ring_attention_bytes_per_layer(15, b, kv, 4)


def _tp_plan_program(rank, world_size, batch, seq):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel
    import torch.nn.functional as F

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    model = TinyGPT(ModelArgs()).double()
    model.load_state_dict(master_state(ModelArgs()))
    T.apply_tensor_parallel(model, mesh["tp"])
    tokens = torch.randint(0, 16, (batch, seq), generator=torch.Generator().manual_seed(0))
    with CommLedger() as ledger:
        with loss_parallel():
            F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    return ledger.records


def test_the_tp_plan_communicates_what_the_lesson_says():
    """02_tp_and_fsdp.md section 2: per block, forward 2 all-gathers + 2 reduce-scatters of [b, s, h]; the
    embedding's output is reduce-scattered and the head's input all-gathered once more; backward mirrors
    forward (PyTorch keeps the gathered input for the weight gradient: tp_pair_bytes(regather=False))."""
    from autograder.lessons.volume import bytes_sent, tp_layer_bytes

    batch, seq, t = 2, 8, 2
    args = ModelArgs()
    full = batch * seq * args.dim
    for records in run_distributed(_tp_plan_program, t, args=(batch, seq)):
        def count(op, phase):
            return len([r for r in records if r.op == op and r.phase == phase and r.shape and
                        torch.Size(r.shape).numel() == full])
        layers = args.n_layers
        assert count("all_gather", "forward") == 2 * layers + 1      # + the head's input
        assert count("reduce_scatter", "forward") == 2 * layers + 1  # + the embedding's output
        assert count("reduce_scatter", "backward") == 2 * layers + 1
        assert count("all_gather", "backward") == 2 * layers + 1
        per_layer = tp_layer_bytes(seq, batch, args.dim, t, bytes_per_element=8, sequence_parallel=True,
                                   regather=False)
        activation = [r for r in records if r.shape and torch.Size(r.shape).numel() == full]
        assert bytes_sent(activation, phase="forward") == pytest.approx(layers * per_layer["forward"] + full * 8)
