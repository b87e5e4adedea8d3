"""Warm ranks for one submission's checks: a pool of rank processes per world size, kept across checks.

    pool = RankPool(loads, resolve, namespace)
    results = pool.run(payload, world_size, timeout=20.0)   # the ranks' results, or None: not decided here
    if results is None:
        results = run_distributed(fn, world_size, ...)       # the fresh runner decides

`run_distributed` forks a fresh process per rank for every call: on a 2-core
machine that is 0.03-0.1 CPU-seconds per rank and call, most of it the
operating system copying a process that holds torch (issue 31), and a
submission's checks make 50-100 calls. The trusted grader's zygote
(autograder.grading.trusted) runs its checks here instead: the ranks of a
world size are forked once, connect once (one gloo process group), and then
run one check after another, each with a fresh namespace of its own in the
rendezvous store (the collective agreement, the ranks' "done" keys).

Only a run that succeeds on every rank is answered here. Whatever else
happens (an exception, a crash, a rank that computes too long, ranks that
stop using the CPU, a world size or option the pool does not serve) makes
`run` return None after the pool is torn down, and the caller runs the check
on the fresh runner, whose verdicts (with every rank's traceback or stack,
on evidence: autograder.runtime.dist) are the only ones there are. So a
broken check cannot reach the next one's verdict: its pool is gone, and the
next check of that size forks a new one. Giving up here is never a verdict,
so the pool may give up early and on the clock.

Between checks each rank puts back what a check may have changed and the
fresh runner would not carry over: the random generators (torch's and
NumPy's as the zygote has them now, Python's reseeded as a fork does),
torch's default dtype, grad mode and thread count, the working directory,
and every process group but the default one. Python objects that
a check's rank program changes in place (a module-level cache in the
student's code) do persist into the next check run by the same pool; the
grader's verdicts on the kept mutants and references are checked to be the
same with and without the pool (tests/test_rank_pool.py).
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import io
import json
import os
import pickle
import random
import select
import shutil
import signal
import sys
import tempfile
import time

__all__ = ["RankPool"]

# At most this many warm rank processes at once (the least recently used pools go first).
MAX_WARM_RANKS = 12
# A check in the pool is given up (and run fresh) past this share of its CPU budget on one rank, ...
GIVE_UP_BUDGET_SHARE = 0.25
GIVE_UP_CPU_MIN_S = 2.0
# ... after this long in which no rank dispatched a torch op (its count, autograder.runtime.agreement) and the
# ranks together ran less than half the time (a deadlock, a sleep; a rank that waits for its peers at the end
# polls the store, a little; more ranks than cores computing in plain Python each run a fraction of the time;
# a check whose ranks keep no count: the ranks together ran or waited for a CPU less than a tenth of the time).
# Not the time the ranks waited for a CPU where they count their ops: on a busy machine every wake-up of a
# rank that polls waits there, and a pool whose ranks had stopped waited for its wall-clock limit below; a
# rank that works but is starved still dispatches ops. Giving up is never a verdict (the check runs fresh), ...
GIVE_UP_IDLE_S = 1.0
_RAN_SHARE = 0.5
_BUSY_SHARE = 0.1
# ... or after this long on the clock.
GIVE_UP_WALL_S = 60.0
# How long the ranks of a new pool get to connect before the pool is given up.
START_WALL_S = 60.0


class _Pool:
    """The ranks of one world size: processes forked from this one, each with a pipe in and a pipe out."""

    def __init__(self, world_size: int, root: str, serve, inherited: list[int]):
        self.world_size = world_size
        self.dir = tempfile.mkdtemp(prefix=f"pool{world_size}-", dir=root)
        self.pids: list[int] = []
        self.to: list[int] = []
        self.back: list[int] = []
        self.jobs = 0
        try:
            for rank in range(world_size):
                self._fork(rank, serve, inherited)
        except BaseException:
            self.close()  # the ranks already made: none left waiting for the others
            raise

    def _fork(self, rank: int, serve, inherited: list[int]) -> None:
        """Fork rank `rank`: in the child, close every other rank's pipes and serve; never return there."""
        world_size = self.world_size
        r_in, w_in = os.pipe()
        r_out, w_out = os.pipe()
        pid = os.fork()
        if pid == 0:  # the rank: never returns
            try:
                os.close(w_in)
                os.close(r_out)
                for fd in self.to + self.back + inherited:  # the other ranks' pipes, of every pool
                    with contextlib.suppress(OSError):
                        os.close(fd)
                serve(rank, world_size, self.dir, r_in, w_out)
            except BaseException:  # noqa: BLE001 - said in the rank's log (the pool's reason for giving up)
                import traceback

                with contextlib.suppress(Exception):
                    traceback.print_exc()
                    sys.stderr.flush()
            finally:
                os._exit(70)
        os.close(r_in)
        os.close(w_out)
        self.pids.append(pid)
        self.to.append(w_in)
        self.back.append(r_out)

    def close(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in self.pids:
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
        for fd in self.to + self.back:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.pids, self.to, self.back = [], [], []
        shutil.rmtree(self.dir, ignore_errors=True)


class RankPool:
    """Warm ranks, a pool per world size (see the module docstring). `loads` turns a request's bytes into
    `(fn, world_size, kwargs)`, `resolve(value, namespace)` binds the student's names, as the zygote does."""

    def __init__(self, loads, resolve, namespace: dict, root: str | None = None):
        self._loads, self._resolve, self._namespace = loads, resolve, namespace
        self._root = tempfile.mkdtemp(prefix="autograder-pool-", dir=root)
        self._pools: dict[int, _Pool] = {}  # in order of last use
        self.served = self.declined = 0
        self.gave_up = ""  # why the pool last gave a run back

    # -- the zygote's side ----------------------------------------------------------------
    def run(self, payload: bytes, world_size: int, kwargs: dict):
        """The list of per-rank results of the request `payload` (bytes of (fn, world_size, kwargs)), or None
        where the pool does not decide it (the caller runs it fresh)."""
        if not self._serves(world_size, kwargs):
            return None
        try:
            pool = self._pool(world_size)
        except OSError as exc:  # no process could be made (the sandbox's limit on processes, memory)
            pool = self._give_up(f"the pool's ranks could not start: {exc}"[:300])
        if pool is None:
            self.declined += 1
            return None  # (it did not start: self.gave_up says why)
        try:
            results = self._job(pool, payload, float(kwargs.get("timeout", 20.0)),
                                bool(kwargs.get("check_collectives", True)))
        except Exception as exc:  # noqa: BLE001 - anything unexpected here: the fresh runner decides
            results = self._give_up(f"{type(exc).__name__}: {exc}"[:300])
        if results is None:  # this pool, and the memory of the others, are not kept for the fresh run
            self.close(keep_root=True)
            self.declined += 1
        else:
            self.served += 1
        return results

    @staticmethod
    def _serves(world_size, kwargs) -> bool:
        return (sys.platform.startswith("linux") and isinstance(world_size, int) and 1 <= world_size <= MAX_WARM_RANKS
                and kwargs.get("backend", "gloo") == "gloo" and kwargs.get("start_method") in (None, "fork")
                and not kwargs.get("show_output") and os.environ.get("AUTOGRADER_START_METHOD", "") != "spawn")

    def _pool(self, world_size: int) -> _Pool | None:
        pool = self._pools.pop(world_size, None)
        if pool is None:
            while self._pools and sum(p.world_size for p in self._pools.values()) + world_size > MAX_WARM_RANKS:
                self._drop(next(iter(self._pools)))
            for stream in (sys.stdout, sys.stderr):  # nothing buffered here is written twice by a rank
                with contextlib.suppress(Exception):
                    stream.flush()
            inherited = [fd for p in self._pools.values() for fd in p.to + p.back]
            pool = _Pool(world_size, self._root, self._serve_rank, inherited)
            if self._replies(pool, START_WALL_S) is None:
                pool.close()
                return None
        self._pools[world_size] = pool
        return pool

    def _give_up(self, why: str) -> None:
        self.gave_up = why
        return None

    def _drop(self, world_size: int) -> None:
        pool = self._pools.pop(world_size, None)
        if pool is not None:
            pool.close()

    def close(self, keep_root: bool = False) -> None:
        for ws in list(self._pools):
            self._drop(ws)
        if not keep_root:
            shutil.rmtree(self._root, ignore_errors=True)

    def _job(self, pool: _Pool, payload: bytes, timeout: float, check: bool):
        from autograder.runtime.plaindata import safe_load

        pool.jobs += 1
        job = os.path.join(pool.dir, f"job{pool.jobs}")
        os.mkdir(job)
        with open(os.path.join(job, "payload"), "wb") as f:
            f.write(payload)
        with open(os.path.join(job, "state"), "wb") as f:
            pickle.dump(_State.take(), f)
        line = (json.dumps({"job": pool.jobs, "dir": job, "check": check}) + "\n").encode()
        for fd in pool.to:
            os.write(fd, line)
        cap = max(GIVE_UP_CPU_MIN_S, GIVE_UP_BUDGET_SHARE * timeout)
        if self._replies(pool, GIVE_UP_WALL_S, cpu_cap=cap, job=job if check else None) is None:
            return None
        results = []
        for rank in range(pool.world_size):
            with open(os.path.join(job, f"rank{rank}.result"), "rb") as f:
                results.append(safe_load(f.read()))
        shutil.rmtree(job, ignore_errors=True)
        return results

    def _replies(self, pool: _Pool, wall: float, cpu_cap: float | None = None, job: str | None = None
                 ) -> bool | None:
        """Wait for an "ok" from every rank; None (give up, the reason in `self.gave_up`) on anything else (see
        the module docstring). `job`: the check's folder, where its ranks count their ops."""
        from autograder.runtime.dist import _progress, _sched

        def counts():
            got = [_progress(job, r) for r in range(pool.world_size)] if job else []
            return [c[0] for c in got] if got and all(c is not None for c in got) else None

        t0 = time.monotonic()
        pending = dict(zip(pool.back, range(pool.world_size)))
        base = {r: _sched(pid) for r, pid in enumerate(pool.pids)}
        if any(v is None for v in base.values()):
            return self._give_up("a rank's scheduler record cannot be read")
        last, ops = base, counts()
        active_at = t0
        look_at = t0 + 0.25
        wait = 0.002
        while pending:
            now = time.monotonic()
            if now - t0 > wall:
                return self._give_up(f"not finished after {wall:g} s")
            if now - active_at > GIVE_UP_IDLE_S:
                return self._give_up(f"no rank made progress for {GIVE_UP_IDLE_S:g} s")
            ready, _, _ = select.select(list(pending), [], [], wait)
            wait = min(wait * 2, 0.05)
            for fd in ready:
                data = os.read(fd, 64)
                if data != b"ok\n":  # a failure, a crash (end of file) or anything unexpected
                    rank = pending[fd]
                    try:
                        with open(os.path.join(pool.dir, f"rank{rank}.log"), "rb") as f:
                            f.seek(0, os.SEEK_END)
                            f.seek(max(0, f.tell() - 1500))
                            tail = f.read().decode("utf-8", "replace")
                    except OSError:
                        tail = ""
                    return self._give_up(f"rank {rank} {'failed' if data else 'ended'}: {tail}")
                del pending[fd]
            if not pending:
                break
            if time.monotonic() < look_at:
                continue
            window = time.monotonic() - (look_at - 0.25)
            look_at = time.monotonic() + 0.25
            now_sched = {r: _sched(pid) for r, pid in enumerate(pool.pids)}
            if any(v is None for v in now_sched.values()):
                return self._give_up("a rank is gone")
            now_ops = counts()
            if any(v[2] for v in now_sched.values()):  # uninterruptible sleep: a page fault, disk I/O
                active = True
            elif now_ops is not None and ops is not None:
                active = now_ops != ops or sum(now_sched[r][0] - last[r][0] for r in now_sched) > _RAN_SHARE * window
            else:
                active = sum(v[0] + v[1] for v in now_sched.values()) - sum(v[0] + v[1] for v in last.values()) \
                    > _BUSY_SHARE * window
            if active:
                active_at = time.monotonic()
            last, ops = now_sched, now_ops
            if cpu_cap is not None and any(now_sched[r][0] - base[r][0] > cpu_cap for r in now_sched):
                return self._give_up(f"a rank computed for more than {cpu_cap:g} CPU-seconds")
        return True

    # -- a rank's side --------------------------------------------------------------------
    def _serve_rank(self, rank: int, world_size: int, root: str, requests: int, reply: int) -> None:
        """A pool rank: connect once, then run each check it is sent until its pipe closes."""
        from autograder.runtime.dist import _DONE, _set_parent_death_signal, _wait_for_all_ranks_to_finish

        fd = os.open(os.path.join(root, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        # what the rank's Python prints goes there too (in the zygote, sys.stdout is the zygote's capped log)
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), write_through=True)
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", buffering=0), write_through=True)
        _set_parent_death_signal()
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        faulthandler.enable(file=sys.stderr, all_threads=True)  # a crash's stack, in the pool's reason
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch
        import torch.distributed as dist

        from autograder.runtime.agreement import CollectiveAgreement

        torch.set_num_threads(1)  # spec 6: a forked child's first multi-threaded op can hang
        forever = datetime.timedelta(days=7)  # the zygote gives up on the pool, never the clock in here
        store = dist.FileStore(os.path.join(root, "store"), world_size)
        store.set_timeout(forever)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=forever)
        dist.barrier()
        cwd = os.getcwd()
        os.write(reply, b"ok\n")
        lines = os.fdopen(requests, "rb")
        for raw in lines:
            req = json.loads(raw)
            job = req["dir"]
            os.ftruncate(1, 0)  # this check's output only (a print loop in one check does not add up over all)
            with open(os.path.join(job, "payload"), "rb") as f:
                fn, _, kwargs = self._loads(f.read())
            args = self._resolve(tuple(kwargs.get("args", ())), self._namespace)
            jstore = dist.PrefixStore(f"job{req['job']}/", store)
            with open(os.path.join(job, "state"), "rb") as f:
                pickle.load(f).put_back()
            if req["check"]:
                agreement = CollectiveAgreement(jstore, rank, journal=os.path.join(job, f"rank{rank}.p2p"),
                                                progress=os.path.join(job, f"rank{rank}.progress"))
                with agreement:
                    result = fn(rank, world_size, *args)
                agreement.finish()
            else:
                result = fn(rank, world_size, *args)
                jstore.set(_DONE.format(rank=rank), b"{}")
            _wait_for_all_ranks_to_finish(jstore, world_size)
            tmp = os.path.join(job, f"rank{rank}.result.tmp")
            torch.save(result, tmp)
            os.replace(tmp, os.path.join(job, f"rank{rank}.result"))
            del fn, args, kwargs, result
            _destroy_subgroups(dist)
            os.chdir(cwd)
            os.write(reply, b"ok\n")
        os._exit(0)


def _destroy_subgroups(dist) -> None:
    """Every process group but the default one (a check's groups are its own)."""
    from torch.distributed import distributed_c10d as c10d

    default = c10d._get_default_group()
    for group in list(c10d._world.pg_map):
        if group is not default:
            dist.destroy_process_group(group)


class _State:
    """What a check may change in a rank process, as the zygote has it now: a fresh rank would start with it (see
    the module docstring)."""

    @classmethod
    def take(cls) -> _State:
        import torch

        state = cls()
        state.torch_rng = torch.get_rng_state()
        np = sys.modules.get("numpy")
        state.np_rng = np.random.get_state() if np is not None else None
        state.dtype = torch.get_default_dtype()
        state.grad = torch.is_grad_enabled()
        return state

    def put_back(self) -> None:
        import torch

        torch.set_rng_state(self.torch_rng)
        random.seed()  # as after a fork: Python's random reseeds itself in a forked child (os.register_at_fork)
        np = sys.modules.get("numpy")
        if self.np_rng is not None and np is not None:
            np.random.set_state(self.np_rng)
        torch.set_default_dtype(self.dtype)
        torch.set_grad_enabled(self.grad)
        torch.set_num_threads(1)
