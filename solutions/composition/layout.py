"""Reference solution, assignment 06 (part 1): the rank layout, its groups and mesh, and the data of each rank.

`rank_layout` lists every group of every parallel dimension exactly as
Megatron-LM's `RankGenerator` (megatron/core/parallel_state.py) builds them,
the expert groups folded onto the same ranks as Megatron's second generator
does; `build_process_groups` creates them (every rank every group, in one
order); `build_device_mesh` is the same layout as a PyTorch `DeviceMesh`;
`local_batch` cuts the global batch for one rank of a DP x CP x TP (x PP) mesh.
Training: solutions/composition/train.py; the planner: solutions/composition/planner.py.

Tested by:  .venv/bin/python -m pytest -q tests/test_composition_solutions.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

__all__ = ["DIMENSIONS", "rank_layout", "build_process_groups", "build_device_mesh", "local_batch"]

# The tokens of an order string, innermost (adjacent ranks) first in a string such as "tp-cp-ep-dp-pp".
DIMENSIONS = ("tp", "cp", "ep", "dp", "pp")


# ---------------------------------------------------------------------------
# Given helper (no exercise): Megatron's order string, checked
# ---------------------------------------------------------------------------

def _parse_order(order: str, sizes: dict) -> list[str]:
    """The order's tokens, innermost first, with every missing size-1 dimension appended (as Megatron does).

    ValueError for an unknown or repeated token, or a dimension of size > 1 that
    the order leaves out (Megatron raises RuntimeError there).
    """
    if not isinstance(order, str) or not order:
        raise ValueError(f"order must be a string such as 'tp-cp-ep-dp-pp', got {order!r}")
    tokens = order.lower().split("-")
    unknown = [t for t in tokens if t not in DIMENSIONS]
    if unknown:
        raise ValueError(f"order {order!r}: unknown dimension(s) {unknown}; use {', '.join(DIMENSIONS)}")
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"order {order!r} names a dimension twice")
    for name in DIMENSIONS:
        if name not in tokens:
            if sizes[name] != 1:
                raise ValueError(f"order {order!r} leaves out {name}, whose size is {sizes[name]} (not 1)")
            tokens.append(name)
    return tokens


# ---------------------------------------------------------------------------
# Exercise 1: rank_layout
# ---------------------------------------------------------------------------

def _orthogonal_groups(world_size: int, tokens: list[str], sizes: dict, selected: str) -> list[list[int]]:
    """Every group that varies the dimensions in `selected` ("dp-cp") and fixes all the others.

    Rank = sum(coordinate[d] * stride[d]) with strides the prefix products of the
    sizes in order (innermost stride 1). Groups are listed with the first
    unselected dimension varying fastest; inside a group the first selected
    dimension varies fastest (Megatron's `generate_masked_orthogonal_rank_groups`).
    """
    ### BEGIN SOLUTION
    chosen = set(selected.split("-"))
    strides, stride = {}, 1
    for t in tokens:
        strides[t] = stride
        stride *= sizes[t]
    inner = [t for t in tokens if t in chosen]      # vary inside a group, first fastest
    outer = [t for t in tokens if t not in chosen]  # fixed inside a group: which group

    def enumerate_offsets(dims):  # every combination, the first dimension fastest
        offsets = [0]
        for d in dims:
            offsets = [o + i * strides[d] for i in range(sizes[d]) for o in offsets]
        return offsets

    group_offsets = enumerate_offsets(inner)
    return [[base + off for off in group_offsets] for base in enumerate_offsets(outer)]
    ### END SOLUTION


def rank_layout(world_size: int, *, tp: int = 1, cp: int = 1, pp: int = 1, dp: int | None = None,
                ep: int = 1, etp: int | None = None, order: str = "tp-cp-ep-dp-pp") -> dict:
    """Every group of every dimension as lists of global ranks, as Megatron-LM's `RankGenerator`.

    Keys: "tp", "cp", "pp", "dp", "dp_cp", "tp_pp" (Megatron's model-parallel
    group) from the attention generator (tp, cp, dp, pp; ep = 1); "ep", "etp",
    "edp" from the expert generator on the same ranks (etp, ep, edp, pp; cp = 1;
    edp = world / (etp * ep * pp)); "embedding": the first and last rank of each
    pipeline group (one rank when pp = 1). `dp` defaults to world / (tp * cp * pp),
    `etp` to `tp`. ValueError when a size does not divide, or for an order
    Megatron rejects (see `_parse_order`; with experts, ep > 1 or etp != tp,
    and pp > 1, an order not ending in "pp" needs the same data-parallel size
    for attention and experts, and both generators the same pipeline groups).
    A dense model (ep = 1, etp = tp) never uses the expert groups, so those two
    checks are skipped for it (Megatron applies them anyway, so it rejects,
    e.g., the course's order tp-cp-pp-dp with cp > 1 and pp > 1).
    """
    ### BEGIN SOLUTION
    for name, value in (("world_size", world_size), ("tp", tp), ("cp", cp), ("pp", pp), ("ep", ep)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"rank_layout: {name} must be a positive int, got {value!r}")
    etp = tp if etp is None else etp
    for name, value in (("dp", dp), ("etp", etp)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"rank_layout: {name} must be a positive int, got {value!r}")
    model = tp * cp * pp
    if world_size % model:
        raise ValueError(f"rank_layout: world_size ({world_size}) is not divisible by tp * cp * pp "
                         f"({tp} * {cp} * {pp} = {model})")
    if dp is None:
        dp = world_size // model
    elif model * dp != world_size:
        raise ValueError(f"rank_layout: tp * cp * pp * dp ({tp} * {cp} * {pp} * {dp} = {model * dp}) "
                         f"!= world_size ({world_size})")
    expert = etp * ep * pp
    if world_size % expert:
        raise ValueError(f"rank_layout: world_size ({world_size}) is not divisible by etp * ep * pp "
                         f"({etp} * {ep} * {pp} = {expert})")
    edp = world_size // expert
    dense_sizes = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}
    expert_sizes = {"tp": etp, "cp": 1, "ep": ep, "dp": edp, "pp": pp}
    dense_tokens = _parse_order(order, dense_sizes)
    expert_tokens = _parse_order(order, expert_sizes)

    def dense(sel):
        return _orthogonal_groups(world_size, dense_tokens, dense_sizes, sel)

    def experts(sel):
        return _orthogonal_groups(world_size, expert_tokens, expert_sizes, sel)

    layout = {"tp": dense("tp"), "cp": dense("cp"), "pp": dense("pp"), "dp": dense("dp"),
              "dp_cp": dense("dp-cp"), "tp_pp": dense("tp-pp")}
    layout["embedding"] = [[g[0], g[-1]] if len(g) > 1 else [g[0]] for g in layout["pp"]]
    moe = ep > 1 or etp != tp  # a dense model never uses the expert groups: Megatron's two checks are moot
    if moe and not (order.lower().endswith("pp") or pp == 1 or edp == dp):
        raise ValueError(f"rank_layout: order {order!r} does not end in pp, so the data-parallel sizes of "
                         f"attention (dp = {dp}) and experts (edp = {edp}) must be equal (Megatron: "
                         f"'When not using pp-last rank ordering, ...')")
    if moe and experts("pp") != layout["pp"]:
        raise ValueError(f"rank_layout: with order {order!r} the pipeline groups of attention and experts differ "
                         f"(tp = {tp}, cp = {cp}, etp = {etp}, ep = {ep}); Megatron requires them equal")
    layout.update(ep=experts("ep"), etp=experts("tp"), edp=experts("dp"))
    return layout
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 2: the groups, and the same layout as a DeviceMesh
# ---------------------------------------------------------------------------

def build_process_groups(layout: dict) -> dict:
    """Create every group of `layout` on every rank; return this rank's group of each dimension.

    `dist.new_group` is collective over the whole world: every rank must call it
    for every group, in the same order, even for groups it is not part of
    (Megatron's `initialize_model_parallel` loops `for ranks in
    generator.get_ranks(...)` on every rank). Returns {name: ProcessGroup}
    with, for each name, the group that contains this rank (a name whose
    groups do not contain this rank, e.g. "embedding" on a middle pipeline
    stage, is left out).
    """
    ### BEGIN SOLUTION
    rank = dist.get_rank()
    mine = {}
    for name in layout:  # the same order on every rank: the dict's own
        for ranks in layout[name]:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[name] = group
    return mine
    ### END SOLUTION


def build_device_mesh(*, tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, order: str = "tp-cp-pp-dp"):
    """The same layout as a DeviceMesh over the CPU ranks, one named dimension per token of `order`.

    `init_device_mesh` lays ranks out row-major: its LAST dimension is the
    innermost (adjacent ranks). So the mesh's dimensions are the order's
    tokens reversed: "tp-cp-pp-dp" -> shape (dp, pp, cp, tp), names
    ("dp", "pp", "cp", "tp"). `mesh["tp"]` is then this rank's TP group,
    equal to `rank_layout(..., order=order)["tp"]`'s group of this rank.
    Every size (1 included) is a dimension. ValueError for an order that is
    not a permutation of tp, cp, pp, dp, or sizes whose product is not the world size.
    """
    ### BEGIN SOLUTION
    sizes = {"tp": tp, "cp": cp, "pp": pp, "dp": dp}
    tokens = order.lower().split("-") if isinstance(order, str) else None
    if tokens is None or sorted(tokens) != sorted(sizes):
        raise ValueError(f"build_device_mesh: order must be a permutation of tp, cp, pp, dp, got {order!r}")
    world = dist.get_world_size()
    if tp * cp * pp * dp != world:
        raise ValueError(f"build_device_mesh: tp * cp * pp * dp ({tp} * {cp} * {pp} * {dp} = "
                         f"{tp * cp * pp * dp}) != world size ({world})")
    names = tuple(reversed(tokens))  # outermost first
    return init_device_mesh("cpu", tuple(sizes[n] for n in names), mesh_dim_names=names)
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 3: the data of each rank
# ---------------------------------------------------------------------------

def _mesh_coordinate(mesh, name: str) -> tuple[int, int]:
    """(this rank's index along mesh dimension `name`, its size); (0, 1) if the mesh has no such dimension."""
    if name not in (mesh.mesh_dim_names or ()):
        return 0, 1
    return mesh[name].get_local_rank(), mesh[name].size()


def local_batch(tokens: torch.Tensor, labels: torch.Tensor, *, mesh) -> dict:
    """This rank's part of the global batch `tokens`, `labels` `[B, S]` on a mesh with dims among dp, cp, tp, pp.

    - DP: rank d of D takes the rows `[d*B/D, (d+1)*B/D)`; the ranks of one DP
      group see different sequences.
    - CP: the sequence is cut into 2*C chunks and CP rank c keeps chunks c and
      2C-1-c, concatenated (Megatron's `get_batch_on_this_cp_rank`: equal causal
      work per rank); `positions` are the global positions of the kept tokens.
    - TP and PP: every rank of a TP group, and every stage, gets the same data.
    Returns {"tokens": [B/D, S/C], "labels": [B/D, S/C], "positions": [S/C]}.
    ValueError (naming the sizes) if B is not divisible by D or, with C > 1, S by 2*C.
    """
    ### BEGIN SOLUTION
    d, D = _mesh_coordinate(mesh, "dp")
    c, C = _mesh_coordinate(mesh, "cp")
    B, S = tokens.shape
    if tuple(labels.shape) != (B, S):
        raise ValueError(f"local_batch: labels {list(labels.shape)} must have the shape of tokens {[B, S]}")
    if B % D:
        raise ValueError(f"local_batch: the batch ({B}) is not divisible by the DP size ({D})")
    if C > 1 and S % (2 * C):
        raise ValueError(f"local_batch: the sequence ({S}) is not divisible by 2 * CP size ({2 * C})")
    rows = slice(d * B // D, (d + 1) * B // D)
    positions = torch.arange(S)
    if C > 1:
        chunks = positions.chunk(2 * C)
        positions = torch.cat([chunks[c], chunks[2 * C - 1 - c]])
    return {"tokens": tokens[rows][:, positions].contiguous(), "labels": labels[rows][:, positions].contiguous(),
            "positions": positions}
    ### END SOLUTION
