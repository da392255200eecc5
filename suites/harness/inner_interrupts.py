"""Distributed tests interrupted from the pytest side, run as inner sessions by
``test_interruptions.py`` (not collected): pytest-timeout (signal and thread methods) and Ctrl-C.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import harness

# Python installs its KeyboardInterrupt handler only if SIGINT was not ignored when it started, and a
# session launched from a background job (``cmd &``, CI runners) inherits SIGINT ignored: the Ctrl-C
# test would then hang until the outer fixture's deadline. Restore it, as an interactive shell has it.
signal.signal(signal.SIGINT, signal.default_int_handler)


def _mark_started(rank: int) -> None:
    Path(os.environ["SHARDSCALE_SELFTEST_DIR"], f"started{rank}").write_text(str(os.getpid()))


@harness.distributed(world_size=2)
def test_warms_the_ranks_up(rank):
    """Starts the ranks, so that the next test's timeout falls inside its case, not in the start."""


@harness.distributed(world_size=2)
@pytest.mark.timeout(2)
def test_times_out_by_signal(rank):
    harness.rank.faults.hang_on(1)


@harness.distributed(world_size=2)
def test_after_the_timeout_passes(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size


@harness.distributed(world_size=2)
@pytest.mark.timeout(2, method="thread")
def test_times_out_by_thread(rank):
    _mark_started(rank)
    harness.rank.faults.hang_on(1)


@harness.distributed(world_size=2, deadline=600)
def test_hangs_until_interrupted(rank):
    _mark_started(rank)
    harness.rank.faults.hang_on(1, hold_gil=True)
    dist.barrier()
