"""Public checks of assignment 06, exercises 1-3: the rank layout, the process groups and the DeviceMesh,
and which rank sees which data; and the picture of a layout.

    from autograder.checks.composition import check_rank_layout
    check_rank_layout(rank_layout, 16, expected=..., tp=2, pp=2, dp=4)

`rank_layout` is compared with the groups Megatron-LM's RankGenerator builds; the groups and the mesh are
built in real ranks, and `local_batch` is run on every rank of a mesh.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from autograder.runtime.compare import CheckFailure, fmt_shape
from autograder.runtime.dist import run_distributed

from .common import (
    _TIMEOUT, _call_program, _check_layout_shape, _groups_of, _one_rank, _rank_logging_to_log_file, _student,
)

__all__ = [
    "check_rank_layout", "check_rank_layout_errors", "check_process_groups", "check_device_mesh", "check_local_batch",
    "plot_rank_layout",
]


# ---------------------------------------------------------------------------
# Exercise 1: rank_layout
# ---------------------------------------------------------------------------

def check_rank_layout(rank_layout, world_size: int, *, expected: dict, **sizes) -> None:
    """`rank_layout(world_size, **sizes)` returns, for every key of `expected`, exactly its rank lists.

    Order matters (the order of the groups, and of the ranks in a group), as in
    Megatron-LM's `RankGenerator`: groups list the combinations of the other
    dimensions with the innermost varying fastest; inside a group the innermost
    selected dimension varies fastest.
    """
    call = f"rank_layout({world_size}" + "".join(f", {k}={v!r}" for k, v in sizes.items()) + ")"
    got = _one_rank(_call_program, rank_layout, (world_size,), sizes)
    if not isinstance(got, dict):
        raise CheckFailure(f"{call} returned {type(got).__name__}, expected a dict {{name: [[ranks], ...]}}")
    missing = [k for k in expected if k not in got]
    if missing:
        raise CheckFailure(f"{call}: no key(s) {missing}; returned keys: {sorted(got)}")
    for name, want in expected.items():
        groups = got[name]
        _check_layout_shape(name, groups, world_size, call)
        groups = [list(g) for g in groups]
        if groups == want:
            continue
        if sorted(map(sorted, groups)) == sorted(map(sorted, want)):
            hint = ("the same groups, in another order: list the groups, and the ranks inside each group, "
                    "with the innermost dimension varying fastest")
        elif len(groups) != len(want) or any(len(g) != len(want[0]) for g in groups):
            hint = (f"{len(groups)} group(s) of size(s) {sorted({len(g) for g in groups})}; expected "
                    f"{len(want)} of size {len(want[0]) if want else 0}")
        else:
            hint = "different ranks in the groups"
        i = next((i for i, (a, b) in enumerate(zip(groups, want)) if a != b), min(len(groups), len(want)))
        raise CheckFailure(
            f"{call}[{name!r}] is wrong ({hint}).\n  expected: {want}\n  got:      {groups}\n"
            f"  first difference at group {i}: expected {want[i] if i < len(want) else 'nothing'}, "
            f"got {groups[i] if i < len(groups) else 'nothing'}")


def _errors_program(rank, world_size, fn, cases):
    out = []
    for args, kwargs, _ in cases:
        try:
            result = fn(*args, **kwargs)
            out.append(("returned", type(result).__name__, ""))
        except NotImplementedError:
            raise  # a stub: reported as such
        except Exception as exc:  # noqa: BLE001 - sent back as data, judged in the parent
            out.append(("raised", type(exc).__name__, str(exc)[:1000]))
    return out


def check_rank_layout_errors(rank_layout, cases) -> None:
    """Every case `(args, kwargs, mentions)` raises ValueError whose message names the sizes in `mentions`."""
    cases = [(tuple(a), dict(k), tuple(m)) for a, k, m in cases]
    sent = [(args, kwargs, ()) for args, kwargs, _ in cases]  # what the message must name stays here
    for (args, kwargs, mentions), (what, kind, text) in zip(cases, _one_rank(_errors_program, rank_layout, sent)):
        call = "rank_layout(" + ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]) + ")"
        if what == "returned":
            raise CheckFailure(f"{call}: expected a ValueError naming {', '.join(mentions) or 'the sizes'} (these "
                               f"sizes and order cannot be laid out as Megatron does), got a {kind}")
        if kind != "ValueError":
            raise CheckFailure(f"{call} raised {kind}: {text}; expected a ValueError naming the sizes")
        absent = [m for m in mentions if m not in text]
        if absent:
            raise CheckFailure(f"{call} raised ValueError({text!r}), which does not name {absent}: say which "
                               f"sizes do not fit")


# ---------------------------------------------------------------------------
# Exercise 2: the process groups, and the DeviceMesh
# ---------------------------------------------------------------------------

def _groups_rank(rank, world_size, fn, layout):
    _rank_logging_to_log_file()
    groups = _student(fn, layout, what="build_process_groups")
    if not isinstance(groups, dict):
        raise CheckFailure(f"rank {rank}: build_process_groups returned {type(groups).__name__}, expected a dict")
    out = {}
    for name in layout:
        pg = groups.get(name)
        if pg is None:
            out[name] = None
            continue
        if not isinstance(pg, dist.ProcessGroup):
            raise CheckFailure(f"rank {rank}: build_process_groups()[{name!r}] is a {type(pg).__name__}, "
                               f"expected a torch.distributed.ProcessGroup")
        members = dist.get_process_group_ranks(pg)
        total = torch.tensor([float(rank)], dtype=torch.float64)
        dist.all_reduce(total, group=pg)
        out[name] = (members, total.item())
    return out


def check_process_groups(build_process_groups, layout: dict, *, world_size: int,
                         timeout: float = 20.0) -> None:
    """Every rank gets, for every name of `layout`, the group that contains it, and the group works.

    Checked on each rank: the group's ranks (`dist.get_process_group_ranks`) are
    this rank's group of the layout; an all-reduce of the ranks' numbers over it
    sums exactly its members; a name whose groups leave this rank out (the
    embedding group on a middle stage) has no group. Groups created in a
    different order on different ranks hang in `new_group`: the runner stops
    them (after `timeout` seconds at most) and reports the line each rank was
    blocked on. Creating the groups takes about a second.
    """
    for name, groups in layout.items():
        _check_layout_shape(name, groups, world_size, "check_process_groups")
    results = run_distributed(_groups_rank, world_size, args=(build_process_groups, layout), timeout=timeout)
    for rank, out in enumerate(results):
        for name, groups in layout.items():
            want = _groups_of(groups, rank)
            got = out[name]
            if want is None:
                if got is not None:
                    raise CheckFailure(f"rank {rank}: layout[{name!r}] has no group containing rank {rank}, yet "
                                       f"build_process_groups returned one with ranks {got[0]}")
                continue
            if got is None:
                raise CheckFailure(f"rank {rank}: build_process_groups()[{name!r}] is missing; expected the group "
                                   f"{want}")
            members, total = got
            if sorted(members) != sorted(want):
                raise CheckFailure(f"rank {rank}: build_process_groups()[{name!r}] has ranks {members}, expected "
                                   f"{want} (this rank's group of layout[{name!r}])")
            if total != sum(want):
                raise CheckFailure(f"rank {rank}: an all-reduce over build_process_groups()[{name!r}] summed to "
                                   f"{total:g}, expected {sum(want)} (the sum of its ranks {want})")


def _mesh_rank(rank, world_size, fn, sizes, order):
    _rank_logging_to_log_file()
    mesh = _student(fn, order=order, what="build_device_mesh", **sizes)
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    groups = {n: mesh[n].mesh.flatten().tolist() for n in names}
    return {"names": names, "shape": tuple(mesh.mesh.shape), "groups": groups, "type": type(mesh).__name__}


def check_device_mesh(build_device_mesh, *, world_size: int, order: str, expected: dict,
                      timeout: float = _TIMEOUT, **sizes) -> None:
    """The mesh has one named dimension per token of `order`, outermost first, and `mesh[name]` is this
    rank's group of `expected[name]` on every rank."""
    want_names = tuple(reversed(order.split("-")))
    results = run_distributed(_mesh_rank, world_size, args=(build_device_mesh, sizes, order), timeout=timeout)
    call = f"build_device_mesh({', '.join(f'{k}={v}' for k, v in sizes.items())}, order={order!r})"
    for rank, out in enumerate(results):
        if out["type"] != "DeviceMesh":
            raise CheckFailure(f"rank {rank}: {call} returned a {out['type']}, expected a DeviceMesh")
        if out["names"] != want_names:
            raise CheckFailure(f"rank {rank}: {call} has dimensions {out['names']} (shape {out['shape']}); "
                               f"expected {want_names}: the order's tokens reversed, because a DeviceMesh's last "
                               f"dimension is the innermost (adjacent ranks)")
        for name, groups in expected.items():
            want = _groups_of(groups, rank)
            if out["groups"][name] != want:
                raise CheckFailure(f"rank {rank}: {call}[{name!r}] spans ranks {out['groups'][name]}, expected "
                                   f"{want} (rank_layout's {name} group of rank {rank}, order {order!r})")


# ---------------------------------------------------------------------------
# Exercise 3: the data of each rank
# ---------------------------------------------------------------------------

def _batch_rank(rank, world_size, fn, shape, names, tokens, labels):
    _rank_logging_to_log_file()
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    out = _student(fn, tokens, labels, mesh=mesh, what="local_batch")
    if not isinstance(out, dict) or not {"tokens", "labels", "positions"} <= set(out):
        raise CheckFailure(f"rank {rank}: local_batch returned {type(out).__name__} "
                           f"{sorted(out) if isinstance(out, dict) else ''}; expected a dict with keys "
                           f"'tokens', 'labels', 'positions'")
    coords = {n: mesh[n].get_local_rank() for n in names}
    return {"coords": coords, **{k: torch.as_tensor(out[k]).clone() for k in ("tokens", "labels", "positions")}}


def _zigzag_positions(seq: int, cp: int, c: int) -> torch.Tensor:
    """Chunks c and 2*cp-1-c of 2*cp equal chunks (Megatron's get_batch_on_this_cp_rank)."""
    chunks = torch.arange(seq).chunk(2 * cp)
    return torch.cat([chunks[c], chunks[2 * cp - 1 - c]]) if cp > 1 else torch.arange(seq)


def check_local_batch(local_batch, *, mesh_shape: tuple, mesh_dim_names: tuple, batch: int = 4, seq: int = 8,
                      seed: int = 0, timeout: float = _TIMEOUT) -> None:
    """Each rank's tokens, labels and positions on a mesh with dims among dp, cp, tp, pp.

    DP rank d of D: rows [d*B/D, (d+1)*B/D); CP rank c of C: the zigzag chunks c
    and 2C-1-c of the sequence, positions their global positions; TP ranks and
    pipeline stages: identical data. The checks name which rule a rank broke.
    """
    world_size = math.prod(mesh_shape)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 1000, (batch, seq), generator=gen)
    labels = torch.randint(0, 1000, (batch, seq), generator=gen)
    results = run_distributed(_batch_rank, world_size, args=(local_batch, tuple(mesh_shape), tuple(mesh_dim_names),
                                                             tokens, labels), timeout=timeout)
    size = dict(zip(mesh_dim_names, mesh_shape))
    D, C = size.get("dp", 1), size.get("cp", 1)
    for rank, out in enumerate(results):
        d, c = out["coords"].get("dp", 0), out["coords"].get("cp", 0)
        where = f"rank {rank} (mesh coordinates {out['coords']})"
        rows = slice(d * batch // D, (d + 1) * batch // D)
        pos = _zigzag_positions(seq, C, c)
        if not torch.equal(out["positions"].reshape(-1).long(), pos):
            raise CheckFailure(f"{where}: positions {out['positions'].tolist()}, expected {pos.tolist()} "
                               f"(CP rank {c} of {C} keeps sequence chunks {c} and {2 * C - 1 - c} of {2 * C})")
        for key, full in (("tokens", tokens), ("labels", labels)):
            want = full[rows][:, pos]
            got = out[key]
            if tuple(got.shape) != tuple(want.shape):
                raise CheckFailure(f"{where}: {key} has shape {fmt_shape(got.shape)}, expected {fmt_shape(want.shape)} "
                                   f"([B/dp, S/cp] = [{batch}/{D}, {seq}/{C}])")
            if not torch.equal(got, want):
                same_rows = [r for r in range(batch) if torch.equal(full[r][pos], got[0])]
                hint = (f"its first row is global row {same_rows[0]}, expected row {rows.start} (DP rank {d} of {D}: "
                        f"rows {rows.start}..{rows.stop - 1}; use the DP coordinate, not the global rank)"
                        if same_rows else "the values are not the global batch's at these rows and positions")
                raise CheckFailure(f"{where}: wrong {key}: {hint}")


# ---------------------------------------------------------------------------
# Pictures
# ---------------------------------------------------------------------------

def plot_rank_layout(layout: dict, *, gpus_per_node: int = 8, names=("tp", "cp", "pp", "dp"), title: str = ""):
    """One row per dimension, one cell per rank, coloured by the rank's group; node boundaries drawn.

    A glance shows which groups stay inside a node (fast NVLink) and which
    cross nodes (InfiniBand).
    """
    from matplotlib import colormaps

    from autograder.lessons.plots import new_figure, picture

    if not isinstance(gpus_per_node, int) or isinstance(gpus_per_node, bool) or gpus_per_node < 1:
        raise ValueError(f"plot_rank_layout: gpus_per_node must be a positive int, got {gpus_per_node!r}")
    shown = [n for n in names if n in layout]
    if not shown:
        raise ValueError(f"plot_rank_layout: layout has none of the dimensions {tuple(names)}: its keys are "
                         f"{list(layout)}")
    names = shown
    world = 1 + max(r for groups in layout.values() for g in groups for r in g)
    fig, ax = new_figure(figsize=(min(14, 1.2 + 0.45 * world), 0.8 + 0.6 * len(names)))
    cmap = colormaps["tab20"]
    for row, name in enumerate(names):
        for gi, group in enumerate(layout[name]):
            for r in group:
                ax.add_patch(_rect(r, row, cmap(gi % 20)))
                ax.text(r + 0.5, row + 0.5, str(gi), ha="center", va="center", fontsize=7)
    for boundary in range(0, world + 1, gpus_per_node):
        ax.axvline(boundary, color="black", linewidth=2)
    ax.set_xlim(0, world)
    ax.set_ylim(0, len(names))
    ax.set_yticks([i + 0.5 for i in range(len(names))], [f"{n} ({len(layout[n][0])})" for n in names])
    ax.set_xticks([r + 0.5 for r in range(world)], [str(r) for r in range(world)], fontsize=7)
    ax.set_xlabel(f"global rank (thick lines: nodes of {gpus_per_node} GPUs); the number in a cell is its group")
    ax.set_title(title or "rank layout: one colour per group")
    ax.invert_yaxis()
    return picture(fig)


def _rect(x, y, color):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), 1, 1, facecolor=color, edgecolor="white")
