"""RankPool driven directly (no plugin): reuse of warm ranks, group changes, clean shutdown, and
finding what the ranks left running (by the pool's tag, never a process the pool did not start)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

import harness
from harness.controller import reaper
from harness.controller.pool import CaseSpec, RankPool
from harness.outcome import judge
from harness.spec import DistConfig
from suites.harness.selftest import alive


def rank_and_pid():
    ctx = harness.current()
    import torch.distributed as dist

    return ctx.rank, dist.get_world_size(), os.getpid()


def unpicklable():
    return threading.Lock()


SPARSE_EQ_FIRST_LINE = "Could not run 'aten::eq.Tensor' with arguments from the 'SparseCPU' backend."


def raise_a_multi_line_message_on_rank_1():
    """Rank 1 raises what torch raises for ``==`` on sparse tensors: a message of many lines, the
    last of them a dispatcher registration, not the error."""
    if harness.current().rank == 1:
        raise NotImplementedError(
            f"{SPARSE_EQ_FIRST_LINE} This could be because the operator doesn't exist for this backend.\n"
            "\nCPU: registered at aten/src/ATen/RegisterCPU.cpp:30477 [kernel]\n"
            "PythonDispatcher: registered at ../aten/src/ATen/core/PythonFallbackKernel.cpp:196 "
            "[backend fallback]"
        )


_left_running: list[subprocess.Popen] = []  # keeps the Popen alive: its __del__ would warn


def leave_a_process_running():
    """Start a process in this rank's process group (as a DataLoader worker is) and leave it running."""
    _left_running.append(subprocess.Popen(["sleep", "600"]))
    return os.getpid(), _left_running[-1].pid


def leave_escapees_running():
    """Start a child in a new session, and a daemon (``setsid``, its parent gone) that is not even a
    child of the rank any more; leave both running."""
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    _left_running.append(subprocess.Popen(["sleep", "600"], start_new_session=True, **quiet))
    # The daemon prints its pid once in its own session, and its parent shell has exited when we return.
    sh = subprocess.Popen(
        ["sh", "-c", "setsid sh -c 'echo $$; exec sleep 600 >/dev/null' &"], stdout=subprocess.PIPE
    )
    daemon = int(sh.stdout.readline())
    sh.stdout.close()
    sh.wait()
    _until_execed(daemon, "sleep")
    return os.getpid(), _left_running[-1].pid, daemon


def _until_execed(pid: int, command: str, timeout_s: float = 10.0) -> None:
    """Wait until ``pid`` runs ``command``: a process in the middle of ``exec`` shows an empty
    environment in ``/proc``, so a scan for the tag at that instant misses it (seen once under
    load); the test asks about a daemon that is running, not one still starting."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read().strip() == command:
                    return
        except OSError:
            return  # gone: the assertions say so
        time.sleep(0.01)


def case(target, world_size, **kw):
    return CaseSpec(
        target=target,
        config=DistConfig(world_size=world_size),
        deadline_s=30.0,
        collective_timeout_s=10.0,
        **kw,
    )


@pytest.fixture(scope="module")
def pool():
    pool = RankPool()
    yield pool
    pool.close()
    assert pool.leftovers() == []


def test_ranks_stay_warm_across_world_size_changes(pool):
    def run(world_size):
        results = pool.run(case(f"{__name__}:rank_and_pid", world_size))
        return judge(results, world_size=world_size).values

    two = run(2)
    four = run(4)
    two_again = run(2)
    assert [(r, ws) for r, ws, _ in two] == [(0, 2), (1, 2)]
    assert [(r, ws) for r, ws, _ in four] == [(r, 4) for r in range(4)]
    assert [pid for *_, pid in two] == [pid for *_, pid in four[:2]] == [pid for *_, pid in two_again]
    assert pool.started_ranks == 4


def test_unimportable_target_fails_on_every_rank(pool):
    verdict = judge(pool.run(case("no_such_module_here:test_x", 2)), world_size=2)
    assert verdict.outcome == "failed"
    assert "ModuleNotFoundError: No module named 'no_such_module_here'" in verdict.summary


def test_a_failure_whose_message_spans_lines_is_headlined_by_its_type_and_first_line(pool):
    verdict = judge(pool.run(case(f"{__name__}:raise_a_multi_line_message_on_rank_1", 2)), world_size=2)
    assert verdict.summary == (
        "1 of 2 ranks did not pass; root cause: rank 1 failed: NotImplementedError: "
        f"{SPARSE_EQ_FIRST_LINE} This could be because the operator doesn't exist for this backend."
    )
    assert "[rank 1] PythonDispatcher: registered at" in verdict.message, "the full report stays below"


def test_unpicklable_return_value_is_a_clear_failure(pool):
    verdict = judge(pool.run(case(f"{__name__}:unpicklable", 2)), world_size=2)
    assert verdict.outcome == "failed"
    assert "cannot be sent to the controller" in verdict.message
    # ... and the pool goes on working after the failure (the group is rebuilt).
    assert judge(pool.run(case(f"{__name__}:rank_and_pid", 2)), world_size=2).outcome == "passed"


def test_pool_rejects_bad_thread_count():
    with pytest.raises(ValueError, match="threads_per_rank must be >= 1, got 0"):
        RankPool(threads_per_rank=0)


def test_leftovers_sees_rank_group_members_and_close_kills_them(pool):
    """``leftovers()`` lists every live process of this pool's rank groups (a rank and what it left
    running), not those of another live pool (the module's); ``close()`` kills the left-running
    processes and returns them, and then there is none."""
    assert judge(pool.run(case(f"{__name__}:rank_and_pid", 2)), world_size=2).outcome == "passed"
    other = RankPool()
    try:
        values = judge(other.run(case(f"{__name__}:leave_a_process_running", 2)), world_size=2).values
        ranks, children = zip(*values, strict=True)
        assert sorted(other.leftovers()) == sorted(ranks + children)
    finally:
        outlived = other.close()
    assert sorted(outlived) == sorted(children)
    assert other.leftovers() == []
    assert [pid for pid in children if alive(pid)] == []
    assert pool.pids and all(alive(pid) for pid in pool.pids), "the other pool's close hit these ranks"
    assert judge(pool.run(case(f"{__name__}:rank_and_pid", 2)), world_size=2).outcome == "passed"


def test_descendants_that_left_the_rank_group_are_found_and_killed():
    """A child started with ``start_new_session=True`` and a ``setsid`` daemon left the rank's process
    group (and the daemon its process tree): ``leftovers()`` still lists them, and ``close()`` kills
    them and returns them."""
    pool = RankPool()
    try:
        results = pool.run(case(f"{__name__}:leave_escapees_running", 1))
        ((rank, child, daemon),) = judge(results, world_size=1).values
        assert rank not in (os.getpgid(child), os.getpgid(daemon))
        assert sorted(pool.leftovers()) == sorted([rank, child, daemon])
    finally:
        outlived = pool.close()
    assert sorted(outlived) == sorted([child, daemon])
    assert [pid for pid in (rank, child, daemon) if alive(pid)] == []


def test_processes_the_pool_did_not_start_are_never_reported_or_killed():
    """Three strangers survive a pool's ``kill()`` and ``close()`` and are never in ``leftovers()``: a
    group leader whose pid the pool's record of a rank names (what pid reuse produces: the old design
    sent SIGKILL to that group), a process carrying another controller's tag (another session's
    rank), and a process a test starts from the controller while the pool runs."""
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    other_env = {**os.environ, reaper.TAG_VAR: uuid.uuid4().hex}
    strangers = [
        subprocess.Popen(["sleep", "600"], start_new_session=True, **quiet),
        subprocess.Popen(["sleep", "600"], start_new_session=True, env=other_env, **quiet),
    ]
    pool = RankPool()
    try:
        assert judge(pool.run(case(f"{__name__}:rank_and_pid", 1)), world_size=1).outcome == "passed"
        strangers.append(subprocess.Popen(["sleep", "600"], **quiet))
        pool._ranks[0].pid = strangers[0].pid  # the pool's record of rank 0 now names a stranger's group
        assert os.getpgid(strangers[0].pid) == strangers[0].pid
        assert not {p.pid for p in strangers} & set(pool.leftovers())
        pool.kill()
        assert [p.pid for p in strangers if not alive(p.pid)] == []
        assert pool.close() == []
        assert [p.pid for p in strangers if not alive(p.pid)] == []
    finally:
        pool.close()
        for proc in strangers:
            proc.kill()
            proc.wait()


def test_processes_started_from_the_controller_do_not_inherit_the_tag(pool):
    """The controller holds the tag only while it starts the forkserver: what a test starts (an
    inner pytest session) is not the pool's, and an inner pool's tag is its own. (The test starts
    ranks itself: under xdist, or in another order, it may be the first of the module to run.)"""
    assert judge(pool.run(case(f"{__name__}:rank_and_pid", 2)), world_size=2).outcome == "passed"
    assert pool.pids
    assert os.environ.get(reaper.TAG_VAR) != reaper.controller_tag()
    assert all(reaper.carries_tag(pid, reaper.controller_tag()) for pid in pool.pids)


def where_preloaded_was_imported():
    import sys

    module = sys.modules.get("suites.harness.preloaded")
    return (None if module is None else module.IMPORTED_BY), os.getpid()


_PRELOAD_SCRIPT = f"""
from harness.controller.pool import CaseSpec, RankPool
from harness.outcome import judge
from harness.spec import DistConfig
pool = RankPool(preload=("suites.harness.preloaded",))
spec = CaseSpec(target="{__name__}:where_preloaded_was_imported", config=DistConfig(world_size=1),
                deadline_s=60.0, collective_timeout_s=30.0)
print(judge(pool.run(spec), world_size=1).values[0])
pool.close()
"""


def test_a_preloaded_module_is_imported_once_by_the_forkserver_not_by_each_rank():
    """A fresh process (its forkserver not started yet): the rank finds the module imported, by
    another process (the forkserver it was forked from)."""
    done = subprocess.run(
        [sys.executable, "-c", _PRELOAD_SCRIPT], capture_output=True, text=True, timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    imported_by, rank_pid = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert imported_by is not None and imported_by != rank_pid
