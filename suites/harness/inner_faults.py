"""Failing distributed tests, run as an inner pytest session by ``test_faults.py`` (not collected).

Each test breaks in one known way on rank 1; the outer tests assert on the reported outcome.
Order matters: the hang tests are followed by passing tests that must run on a fresh pool.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import harness
from harness.rank import faults


def _record_pid(label: str) -> None:
    out = Path(os.environ["SHARDSCALE_SELFTEST_DIR"])
    (out / f"{label}-rank{harness.current().rank}.pid").write_text(str(os.getpid()))


def _all_reduce() -> None:
    t = torch.ones(1)
    dist.all_reduce(t)


@harness.distributed(world_size=2)
def test_first_passes():
    _record_pid("first")
    _all_reduce()


@harness.distributed(world_size=2)
def test_rank_raises():
    faults.raise_on(1, ValueError("boom from the test body"))
    _all_reduce()


@harness.distributed(world_size=2)
def test_sys_exit():
    faults.exit_on(1, 1)
    _all_reduce()


@harness.distributed(world_size=2)
def test_os_exit():
    faults.exit_on(1, 3, hard=True)
    _all_reduce()


@harness.distributed(world_size=2)
def test_sigsegv():
    faults.signal_on(1, signal.SIGSEGV)
    _all_reduce()


@harness.distributed(world_size=2)
def test_sigkill():
    faults.signal_on(1, signal.SIGKILL)
    _all_reduce()


@harness.distributed(world_size=2)
def test_skip_on_one_rank(rank):
    if rank == 1:
        pytest.skip("only rank 1 thinks this should be skipped")
    _all_reduce()


@harness.distributed(world_size=2)
def test_skip_on_every_rank():
    pytest.skip("no rank can run this")


@harness.distributed(world_size=2, deadline=3.0)
def test_hang():
    _record_pid("before-hang")
    faults.hang_on(1)
    _all_reduce()


@harness.distributed(world_size=2)
def test_after_hang_passes():
    _record_pid("after-hang")
    _all_reduce()


@harness.distributed(world_size=2, deadline=3.0)
def test_hang_holding_gil():
    faults.hang_on(1, hold_gil=True)
    _all_reduce()


@harness.distributed(world_size=(2, 4))
def test_after_gil_hang_passes(world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size


def _subtest_body(lr, steps):
    rank = harness.current().rank
    t = torch.tensor([lr * steps])
    dist.all_reduce(t)
    if rank == 1 and lr == 0.5:
        raise AssertionError(f"diverged at lr={lr}")


@harness.distributed(world_size=2)
def test_subtests_report_each_failing_config():
    configs = [{"lr": lr, "steps": steps} for lr in (0.1, 0.5) for steps in (1, 2)]
    harness.run_subtests(configs, _subtest_body)


def _raise_on_rank0():
    faults.raise_on(0, KeyError("missing on rank 0"))
    return harness.current().rank


def test_fixture_reports_failing_rank(ranks):
    ranks.run(_raise_on_rank0, world_size=2)


@harness.distributed(world_size=2)
def test_last_passes():
    _all_reduce()
