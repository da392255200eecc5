"""RankPool driven directly (no plugin): reuse of warm ranks, group changes, clean shutdown."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest
from selftest import alive

import harness
from harness.outcome import judge
from harness.pool import CaseSpec, RankPool
from harness.spec import DistConfig


def rank_and_pid():
    ctx = harness.current()
    import torch.distributed as dist

    return ctx.rank, dist.get_world_size(), os.getpid()


def unpicklable():
    return threading.Lock()


_left_running: list[subprocess.Popen] = []  # keeps the Popen alive: its __del__ would warn


def leave_a_process_running():
    """Start a process in this rank's process group (as a DataLoader worker is) and leave it running."""
    _left_running.append(subprocess.Popen(["sleep", "600"]))
    return os.getpid(), _left_running[-1].pid


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


def test_unpicklable_return_value_is_a_clear_failure(pool):
    verdict = judge(pool.run(case(f"{__name__}:unpicklable", 2)), world_size=2)
    assert verdict.outcome == "failed"
    assert "cannot be sent to the controller" in verdict.message
    # ... and the pool goes on working after the failure (the group is rebuilt).
    assert judge(pool.run(case(f"{__name__}:rank_and_pid", 2)), world_size=2).outcome == "passed"


def test_pool_rejects_bad_thread_count():
    with pytest.raises(ValueError, match="threads_per_rank must be >= 1, got 0"):
        RankPool(threads_per_rank=0)


def test_leftovers_sees_rank_group_members_and_close_kills_them():
    """``leftovers()`` lists every live process of a rank's group (a rank and what it left running);
    after ``close()`` there is none, the left-running processes included."""
    pool = RankPool()
    try:
        values = judge(pool.run(case(f"{__name__}:leave_a_process_running", 2)), world_size=2).values
        ranks, children = zip(*values, strict=True)
        assert sorted(pool.leftovers()) == sorted(ranks + children)
    finally:
        pool.close()
    assert pool.leftovers() == []
    assert [pid for pid in children if alive(pid)] == []
