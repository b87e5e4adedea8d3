"""Reference solution, assignment 06 (exercise 13): a stage's model and optimizer state under DCP's flat keys.

    state = checkpoint_state(stage_module, optimizer)
    torch.distributed.checkpoint.save(state, checkpoint_id="ckpt/step_2")    # every rank, its own pieces
    torch.distributed.checkpoint.load(state, checkpoint_id="ckpt/step_2")    # another layout: fills them in place

Tested by:  .venv/bin/python -m pytest -q tests/test_composition_solutions.py tests/test_jobs.py
"""

from __future__ import annotations

__all__ = ["checkpoint_state"]


# ---------------------------------------------------------------------------
# Exercise 13: the checkpoint's keys
# ---------------------------------------------------------------------------

def checkpoint_state(stage_module, optimizer) -> dict:
    """This rank's part of a checkpoint, `{flat key: tensor}`, with keys that do not depend on the layout.

    - `model.<name>` for every parameter of the stage, `<name>` its name in the
      whole single-process TinyGPT (`layers.2.attention.wq.weight`: the split
      kept the global names); the value is the parameter itself (a DTensor
      under TP or FSDP: DCP writes this rank's shard, and `dcp.load` fills it
      in place, resharded);
    - `optim.<name>.<key>` for every entry of the optimizer's state of that
      parameter (AdamW: `step`, `exp_avg`, `exp_avg_sq`), the tensor itself;
    - the last stage's copy of the tied head (`output.weight` on a stage
      without `tok_embeddings`) under the embedding's name,
      `model.tok_embeddings.weight` (and its state under `optim.tok_embeddings.weight.*`):
      the copies are equal, DCP writes the piece once, and a run with one stage
      (where the head is the embedding) finds it under that key.
    """
    ### BEGIN SOLUTION
    state = {}
    for name, param in stage_module.named_parameters():
        if name == "output.weight" and stage_module.tok_embeddings is None:
            name = "tok_embeddings.weight"  # the head's copy of the tied embedding: one key for both
        state[f"model.{name}"] = param
        for key, value in optimizer.state.get(param, {}).items():
            state[f"optim.{name}.{key}"] = value
    return state
    ### END SOLUTION
