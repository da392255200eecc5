"""At the deadline: the root cause does not depend on how short the deadline is, and each rank's
Python stack is reported once, apart from what the rank printed and from its own failure."""

from __future__ import annotations

import pytest

import harness
from harness.controller.pool import CaseSpec, RankPool
from harness.outcome import judge
from harness.spec import DistConfig


def hang_on_rank_1_then_all_reduce():
    import torch
    import torch.distributed as dist

    print(f"rank {harness.current().rank} before the collective", flush=True)
    harness.rank.faults.hang_on(1)
    dist.all_reduce(torch.ones(1))


@pytest.fixture(scope="module")
def hung():
    """A case whose deadline falls before ``peer_grace_s`` has passed since rank 0's collective
    timed out (the issue's ``deadline=10``, scaled down): the verdict."""
    pool = RankPool(peer_grace_s=5.0)
    try:
        results = pool.run(
            CaseSpec(
                target=f"{__name__}:hang_on_rank_1_then_all_reduce",
                config=DistConfig(world_size=2),
                deadline_s=4.0,
                collective_timeout_s=1.0,
            )
        )
    finally:
        pool.close()
    return judge(results, world_size=2), results


def test_root_cause_at_a_short_deadline_is_the_rank_that_hung(hung):
    verdict, _ = hung
    assert "root cause: rank 1 did not finish before the deadline" in verdict.summary, verdict.message


def test_rank_that_failed_before_the_deadline_keeps_its_own_failure_text(hung):
    _, results = hung
    rank0 = results[0]
    assert rank0.status == "failed"
    assert rank0.text.rstrip().splitlines()[-1].startswith("[rank 0] ")
    assert "Python stacks" not in rank0.text and "Thread 0x" not in rank0.text


def test_every_ranks_stack_is_reported_once(hung):
    verdict, results = hung
    assert [r.stacks.count("Python stacks at the deadline") for r in results] == [1, 1]
    assert verdict.message.count("[rank 1] Python stacks at the deadline") == 1
    assert [line.endswith(" in hang_on") for line in verdict.message.splitlines()].count(True) == 1


def test_rank_output_holds_what_the_rank_printed_and_no_stack(hung):
    _, results = hung
    assert [r.stdout for r in results] == [f"rank {r} before the collective\n" for r in (0, 1)]
    assert all("Thread 0x" not in r.log and "hang_on" not in r.log for r in results)
