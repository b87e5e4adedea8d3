"""Collective agreement: before a collective runs, every rank of its group must be calling the same one.

`run_distributed` enters `CollectiveAgreement` around each rank program. For
every collective (all-reduce, all-gather, reduce-scatter, all-to-all,
broadcast, barrier, ...; not P2P) a rank publishes what it is about to call
(op, shape, dtype, and the line of the student's code that called it) in the
run's store, then reads what every other rank of the group called as its
collective number n on that group. If they differ, every rank raises the same
`CollectiveMismatch`, which says it in the course's words:

    collective #2 on the group of ranks [0, 1] differs between ranks:
      rank 0: all_reduce of [4, 8] float32, called at Cell In[5], line 12, in all_reduce_gradients
      rank 1: all_gather of [8, 8] float32, called at Cell In[5], line 14, in all_reduce_gradients

If a peer instead returned from its rank program having made fewer calls on
that group, the waiting ranks say so. Without this check gloo may return wrong
numbers for ranks that disagree on a shape, or abort the process (spec 6);
torch's own check (`TORCH_DISTRIBUTED_DEBUG=DETAIL`) reports ops the student
never called (the runner's barrier, `REDUCE`/`SCATTER` for a reduce-scatter).

Cost: one store write and w - 1 reads per collective (FileStore: well under a
millisecond). While it waits for a slow peer it blocks without using the CPU,
so the runner's deadlock detection still sees an idle rank.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import pickle
import sys
import time

import torch
import torch._dynamo  # noqa: F401 - entering a dispatch mode imports it (~3 s): pay once, before forking ranks
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CollectiveAgreement", "CollectiveMismatch", "NonContiguousTensor", "call_site", "DONE_KEY"]

# dispatcher op -> course name; the ones whose input shape must agree across the group
_OPS = {
    ("c10d", "allreduce_"): "all_reduce",
    ("c10d", "allreduce_coalesced_"): "all_reduce",
    ("c10d", "_allgather_base_"): "all_gather",
    ("c10d", "allgather_"): "all_gather",
    ("c10d", "allgather_coalesced_"): "all_gather",
    ("c10d", "allgather_into_tensor_coalesced_"): "all_gather",
    ("c10d", "_reduce_scatter_base_"): "reduce_scatter",
    ("c10d", "reduce_scatter_"): "reduce_scatter",
    ("c10d", "reduce_scatter_tensor_coalesced_"): "reduce_scatter",
    ("c10d", "alltoall_base_"): "all_to_all",
    ("c10d", "alltoall_"): "all_to_all",
    ("c10d", "broadcast_"): "broadcast",
    ("c10d", "reduce_"): "reduce",
    ("c10d", "gather_"): "gather",
    ("c10d", "scatter_"): "scatter",
    ("c10d", "barrier"): "barrier",
    ("_c10d_functional", "all_reduce"): "all_reduce",
    ("_c10d_functional", "all_reduce_"): "all_reduce",
    ("_c10d_functional", "all_reduce_coalesced"): "all_reduce",
    ("_c10d_functional", "all_gather_into_tensor"): "all_gather",
    ("_c10d_functional", "all_gather_into_tensor_out"): "all_gather",
    ("_c10d_functional", "all_gather_into_tensor_coalesced"): "all_gather",
    ("_c10d_functional", "reduce_scatter_tensor"): "reduce_scatter",
    ("_c10d_functional", "reduce_scatter_tensor_coalesced"): "reduce_scatter",
    ("_c10d_functional", "all_to_all_single"): "all_to_all",
    ("_c10d_functional", "broadcast"): "broadcast",
    ("_c10d_functional", "broadcast_"): "broadcast",
}
# point-to-point ops: not agreed on (a pair, not a group), written to the rank's journal
_P2P = {("c10d", "send"): "send", ("c10d", "recv_"): "recv", ("c10d", "recv_any_source_"): "recv"}
# Ops whose per-rank input shapes may legitimately differ (uneven all-to-all splits, root-only buffers).
_SHAPE_FREE = {"all_to_all", "gather", "scatter", "barrier"}
_INPUT_ARGS = ("tensors", "input_tensor", "input_tensors", "input", "inputs", "input_list", "tensor")

DONE_KEY = "__rank_done/{rank}"  # the key autograder.runtime.dist writes when a rank program returns


class CollectiveMismatch(RuntimeError):
    """Ranks of one group called different collectives (or one rank stopped calling them)."""


class NonContiguousTensor(ValueError):
    """The student's code gave a collective a non-contiguous tensor (gloo copies it; NCCL refuses it)."""


def _direct_student_caller():
    """The student's frame that called the collective directly, or None (a library, or a check, called it).

    Walking outwards from the dispatch, torch's frames and the course's own
    (dispatch modes such as the ledger or a check's guard) are passed over;
    the first other frame decides.
    """
    from autograder.runtime.report import is_student_file

    torch_dir = os.path.dirname(torch.__file__) + os.sep
    course_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # autograder/
    frame = sys._getframe(1)
    while frame is not None:
        f = frame.f_code.co_filename
        if f.startswith(torch_dir) or f.startswith(course_dir):
            frame = frame.f_back
            continue
        return frame if is_student_file(f) else None
    return None


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def call_site(skip_files=()) -> str:
    """Where the student's code called the current op: `Cell In[5], line 12, in forward`."""
    from autograder.runtime.report import describe_location, is_student_file

    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if is_student_file(code.co_filename) and code.co_filename not in skip_files:
            return describe_location(code.co_filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name))
        frame = frame.f_back
    return "(not called from your code)"


def p2p_site() -> dict:
    """Where the student's code posted the current send or receive, for the journal: `where` (as call_site
    names it), `line` (that line's source) and `caller` (the next frame of the student's code outwards, if any),
    so that a deadlock's report can quote the line that posted an op without a partner."""
    import linecache

    from autograder.runtime.report import describe_location, is_student_file

    found = []
    frame = sys._getframe(1)
    while frame is not None and len(found) < 2:
        code = frame.f_code
        if is_student_file(code.co_filename):
            found.append((code.co_filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name)))
        frame = frame.f_back
    if not found:
        return {"where": "(not called from your code)", "line": "", "caller": ""}
    filename, lineno, name = found[0]
    return {"where": describe_location(filename, lineno, name),
            "line": linecache.getline(filename, lineno).strip(),
            "caller": describe_location(*found[1]) if len(found) > 1 else ""}


def _first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _group(by_name):
    """(group name, global ranks of the group) of a c10d or functional collective's arguments."""
    for value in by_name.values():
        if type(value).__name__ == "ScriptObject":
            try:
                pg = dist.ProcessGroup.unbox(value)
            except Exception:  # noqa: BLE001 - a ReduceOp or Work, not a group
                continue
            return str(pg.group_name), dist.get_process_group_ranks(pg)
    name = by_name.get("group_name")
    if isinstance(name, str):
        from torch.distributed.distributed_c10d import _resolve_process_group

        pg = _resolve_process_group(name)
        return name, dist.get_process_group_ranks(pg)
    return None, None


def _describe(fp: dict) -> str:
    if fp is None:
        return "nothing"
    if fp["op"] == "barrier":
        what = "barrier"
    else:
        shape = "[" + ", ".join(str(d) for d in fp["shape"]) + "]"
        what = f"{fp['op']} of {shape} {fp['dtype']}"
    return f"{what}, called at {fp['where']}"


class CollectiveAgreement(TorchDispatchMode):
    """The check described in the module docstring; `store` is the run's rendezvous store."""

    def __init__(self, store, rank: int, journal: str | None = None, progress: str | None = None):
        super().__init__()
        self.store = store
        self.rank = rank
        self.counts: dict[str, int] = {}
        # the journal of this rank's sends and receives (a file, one JSON line each, written before the op
        # runs): the runner matches them across ranks when the ranks hang (autograder.runtime.dist)
        self._journal = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if journal else None
        # how many ops this rank has dispatched, in a file the runner maps too: a deadlocked rank's count stands
        # still, a slow rank's moves (autograder.runtime.dist._DeadlockWatch)
        # (and, second, whether it is inside a communication op right now: c10d's or a functional collective's)
        self._count = self._in_comm = None
        if progress:
            with open(progress, "wb") as f:
                f.write(bytes(16))
            with open(progress, "r+b") as f:
                self._map = mmap.mmap(f.fileno(), 16)
            self._count = ctypes.c_uint64.from_buffer(self._map)
            self._in_comm = ctypes.c_uint64.from_buffer(self._map, 8)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._count is not None:
            self._count.value += 1
            if func.namespace in ("c10d", "_c10d_functional"):
                self._in_comm.value = 1
                try:
                    return self._dispatch(func, args, kwargs)
                finally:
                    self._in_comm.value = 0
        return self._dispatch(func, args, kwargs)

    def _dispatch(self, func, args, kwargs):
        kwargs = kwargs or {}
        key = (func.namespace, func._schema.name.split("::")[-1])
        op = _OPS.get(key)
        if op is not None:
            self._contiguous(op, args, kwargs)
            self._agree(op, func, args, kwargs)
        elif key in _P2P and self._journal is not None:
            self._write_journal(_P2P[key], func, args, kwargs)
        return func(*args, **kwargs)

    def _write_journal(self, op, func, args, kwargs) -> None:
        by_name = {a.name: v for a, v in zip(func._schema.arguments, args)}
        by_name.update(kwargs)
        _, ranks = _group(by_name)
        peer = by_name.get("dst", by_name.get("dstRank")) if op == "send" else by_name.get("src", by_name.get("srcRank"))
        if isinstance(peer, int) and ranks and 0 <= peer < len(ranks):
            peer = ranks[peer]  # a group rank: the runner matches global ranks
        elif not isinstance(peer, int):
            peer = None
        tensor = _first_tensor(by_name.get("tensors"))
        record = {"op": op, "peer": peer, "tag": int(by_name.get("tag", 0) or 0),
                  "shape": list(tensor.shape) if tensor is not None else [],
                  "dtype": str(tensor.dtype).replace("torch.", "") if tensor is not None else "",
                  **p2p_site()}
        try:
            os.write(self._journal, (json.dumps(record) + "\n").encode())
        except OSError:
            pass

    def _contiguous(self, op, args, kwargs) -> None:
        """A collective called by the student's code gets contiguous tensors (NCCL requires it; gloo hides it)."""
        bad = [t for t in _tensors(list(args) + list(kwargs.values())) if not t.is_contiguous()]
        if not bad:
            return
        frame = _direct_student_caller()
        if frame is None:
            return
        from autograder.runtime.report import describe_location

        code = frame.f_code
        where = describe_location(code.co_filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name))
        t = bad[0]
        raise NonContiguousTensor(
            f"{op} was given a non-contiguous tensor (shape {list(t.shape)}, strides "
            f"{tuple(t.stride())}), called at {where}. gloo copies it quietly, NCCL refuses it "
            f"(\"Tensors must be contiguous\") and an in-place result may not land in your view: pass "
            f"`.contiguous()` (and copy the result back if you need it in the view).")

    def finish(self) -> None:
        """The rank program returned: tell the others how many collectives it made on each group."""
        self.store.set(DONE_KEY.format(rank=self.rank), pickle.dumps(dict(self.counts)))

    def _agree(self, op, func, args, kwargs) -> None:
        by_name = {a.name: v for a, v in zip(func._schema.arguments, args)}
        by_name.update(kwargs)
        gname, ranks = _group(by_name)
        if gname is None or not ranks or len(ranks) < 2:
            return
        tensor = None
        for key in _INPUT_ARGS:
            if key in by_name:
                tensor = _first_tensor(by_name[key])
                if tensor is not None:
                    break
        n = self.counts.get(gname, 0) + 1
        self.counts[gname] = n
        mine = {
            "op": op,
            "shape": tuple(tensor.shape) if tensor is not None else (),
            "dtype": str(tensor.dtype).replace("torch.", "") if tensor is not None else "",
            "where": call_site(),
        }
        key = f"__agreement/{gname}/{n}/" + "{rank}"
        self.store.set(key.format(rank=self.rank), pickle.dumps(mine))
        fps = {self.rank: mine}
        finished = {}
        for peer in ranks:
            if peer == self.rank:
                continue
            fp, done = self._wait_for(key.format(rank=peer), peer)
            if fp is None:
                finished[peer] = done.get(gname, 0)
            else:
                fps[peer] = fp
        if finished:
            self._raise_finished(op, gname, ranks, n, fps, finished)
        ref = fps[ranks[0]]
        for peer in ranks[1:]:
            if not _same(ref, fps[peer]):
                self._raise_differ(ranks, n, fps)

    def _wait_for(self, key: str, peer: int):
        """(fingerprint, None) once the peer published it, or (None, its counts) if it finished first.

        Peers usually arrive within milliseconds of each other, so the store is
        looked at often at first, then less and less often, up to every 20 ms
        (about 0.1 % of a CPU: a rank waiting here still looks idle to the
        runner's deadlock detection). The pause grows by a third each time, so
        a peer is seen at most a third of its delay late.
        """
        done_key = DONE_KEY.format(rank=peer)
        pause = 0.0001
        while True:
            if self.store.check([key]):
                return pickle.loads(self.store.get(key)), None
            if self.store.check([done_key]):
                if self.store.check([key]):
                    continue
                return None, pickle.loads(self.store.get(done_key))
            time.sleep(pause)
            pause = min(pause * 1.33, 0.02)

    def _raise_differ(self, ranks, n, fps) -> None:
        lines = [f"collective #{n} on the group of ranks {list(ranks)} differs between ranks:"]
        lines += [f"  rank {r}: {_describe(fps[r])}" for r in ranks]
        lines.append("Every rank of a group must call the same collectives, with the same shapes and dtypes, "
                     "in the same order (gloo may otherwise return wrong numbers or abort).")
        raise CollectiveMismatch("\n".join(lines))

    def _raise_finished(self, op, gname, ranks, n, fps, finished) -> None:
        lines = [f"collective #{n} on the group of ranks {list(ranks)}: not every rank called it:"]
        for r in ranks:
            if r in finished:
                lines.append(f"  rank {r}: returned from its rank program after {finished[r]} collective(s) "
                             f"on this group")
            else:
                lines.append(f"  rank {r}: {_describe(fps[r])}")
        lines.append("Every rank of a group must make the same collective calls: one rank skipped one "
                     "(a collective inside an `if rank == ...`?), or made an extra one.")
        raise CollectiveMismatch("\n".join(lines))


def _same(a: dict, b: dict) -> bool:
    if a["op"] != b["op"]:
        return False
    if a["op"] in _SHAPE_FREE and "" in (a["dtype"], b["dtype"]):
        # a rank with no tensor in a root-only argument (scatter's inputs and gather's outputs off
        # the root, e.g. DTensor's `distribute_tensor` from rank 0): nothing to compare
        return True
    if a["dtype"] != b["dtype"]:
        return False
    return a["op"] in _SHAPE_FREE or a["shape"] == b["shape"]
