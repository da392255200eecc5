"""Whatever interrupts ``RankPool.run`` while ranks are inside a case (pytest-timeout's signal,
Ctrl-C, an exception raised by a signal handler), the ranks of that case are gone when the
interruption leaves ``run``, and the next case runs on fresh ranks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import harness
from harness.controller.pool import CaseSpec, RankPool
from harness.outcome import judge
from harness.spec import DistConfig
from suites.harness.selftest import alive, inner_env, tagged_pids


class Interrupted(Exception):
    """What a signal handler raises inside the waiting controller (as pytest-timeout's does)."""


def hang_on_rank_1_after_a_collective():
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))
    harness.rank.faults.hang_on(1)


def rank_pid():
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return os.getpid(), t.item()


def case(target):
    return CaseSpec(
        target=f"{__name__}:{target}",
        config=DistConfig(world_size=2),
        deadline_s=120.0,
        collective_timeout_s=60.0,
    )


@pytest.fixture
def pool():
    pool = RankPool()
    yield pool
    pool.close()
    assert pool.leftovers() == []


@pytest.fixture
def alarm():
    """``alarm(seconds, exc)``: raise ``exc`` from a SIGALRM handler after ``seconds``."""

    def arm(seconds, exc):
        def handler(signum, frame):
            raise exc

        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, seconds)

    before = signal.getsignal(signal.SIGALRM)
    yield arm
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, before)


def interrupt_a_hung_case(pool, alarm, exc):
    """Run a case whose rank 1 hangs; interrupt ``run`` with ``exc``; return the ranks' pids."""
    assert judge(pool.run(case("rank_pid")), world_size=2).outcome == "passed"
    pids = list(pool.pids)
    alarm(1.0, exc)
    with pytest.raises(type(exc)):
        pool.run(case("hang_on_rank_1_after_a_collective"))
    return pids


@pytest.mark.parametrize("exc", [Interrupted("timeout"), KeyboardInterrupt()], ids=["exception", "ctrl-c"])
def test_interrupted_case_leaves_no_rank_running(pool, alarm, exc):
    """The ranks that were inside the case are dead when the interruption leaves ``run``, so
    nothing is left to wait for (Ctrl-C returns at once) and nothing can leak into the next case."""
    pids = interrupt_a_hung_case(pool, alarm, exc)
    assert [pid for pid in pids if alive(pid)] == []


def test_next_case_after_an_interruption_runs_on_fresh_ranks(pool, alarm):
    pids = interrupt_a_hung_case(pool, alarm, Interrupted("timeout"))
    verdict = judge(pool.run(case("rank_pid")), world_size=2)
    assert verdict.outcome == "passed", verdict.message
    assert [value for _, value in verdict.values] == [2.0, 2.0]
    assert not {pid for pid, _ in verdict.values} & set(pids)


def test_close_after_an_interruption_leaves_no_process(alarm):
    pool = RankPool()
    interrupt_a_hung_case(pool, alarm, KeyboardInterrupt())
    assert pool.close() == []
    until = time.monotonic() + 10
    while pool.leftovers() and time.monotonic() < until:
        time.sleep(0.05)
    assert pool.leftovers() == []


# -- the outside view: inner pytest sessions ----------------------------------------------------
HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def start(out_dir, *selection):
    """Start ``pytest inner_interrupts.py::<selection>`` with a unique tag, its output to a file."""
    tag = uuid.uuid4().hex
    out_dir.mkdir()
    tests = [f"{HERE / 'inner_interrupts.py'}::{name}" for name in selection]
    command = [sys.executable, "-m", "pytest", *tests, "-p", "no:cacheprovider", "-q", "-rA"]
    with open(out_dir / "stdout.txt", "w") as stdout:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=inner_env(tag, out_dir), stdout=stdout, stderr=subprocess.STDOUT
        )
    return {"proc": proc, "tag": tag, "dir": out_dir}


def wait_until_gone(tag):
    until = time.monotonic() + 15
    while tagged_pids(tag) and time.monotonic() < until:
        time.sleep(0.1)
    return tagged_pids(tag)


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """Three inner sessions run at once: a pytest-timeout (signal method) between two passing tests,
    a pytest-timeout with the thread method, and a hung test interrupted by SIGINT (Ctrl-C) once
    its ranks are up. Each: ``{"rc", "out", "tag"}``."""
    root = tmp_path_factory.mktemp("interrupts")
    running = {
        "signal": start(
            root / "signal",
            "test_warms_the_ranks_up",
            "test_times_out_by_signal",
            "test_after_the_timeout_passes",
        ),
        "thread": start(root / "thread", "test_times_out_by_thread"),
        "ctrl_c": start(root / "ctrl_c", "test_hangs_until_interrupted"),
    }
    try:
        ctrl_c = running["ctrl_c"]
        until = time.monotonic() + 120
        while not all((ctrl_c["dir"] / f"started{r}").exists() for r in (0, 1)):
            if ctrl_c["proc"].poll() is not None or time.monotonic() > until:
                break  # the test below reports what the session said
            time.sleep(0.05)
        ctrl_c["proc"].send_signal(signal.SIGINT)
        until = time.monotonic() + 240
        for session in running.values():
            session["rc"] = session["proc"].wait(max(1.0, until - time.monotonic()))
    finally:
        for session in running.values():
            if session["proc"].poll() is None:
                session["proc"].kill()
                session["proc"].wait()
    for session in running.values():
        session["out"] = (session["dir"] / "stdout.txt").read_text()
    return running


@pytest.mark.e2e
def test_pytest_timeout_fails_the_test_with_rank_stacks_and_the_next_test_passes(sessions):
    out = sessions["signal"]["out"]
    assert "FAILED suites/harness/inner_interrupts.py::test_times_out_by_signal" in out, out
    assert "Failed: Timeout (>2.0s) from pytest-timeout" in out, out
    assert "PASSED suites/harness/inner_interrupts.py::test_after_the_timeout_passes" in out, out
    assert "[rank 1] Python stacks when the case was interrupted (Failed: Timeout" in out, out
    assert "in hang_on" in out
    assert wait_until_gone(sessions["signal"]["tag"]) == []


@pytest.mark.e2e
def test_pytest_timeout_thread_method_ends_pytest_with_no_process_left(sessions):
    """pytest-timeout's thread method ends the whole pytest process (``os._exit``); the ranks go
    with it."""
    thread = sessions["thread"]
    assert thread["rc"] == 1 and "Timeout" in thread["out"], thread["out"]
    assert wait_until_gone(thread["tag"]) == []


@pytest.mark.e2e
def test_ctrl_c_during_a_hung_test_ends_pytest_with_no_process_left(sessions):
    ctrl_c = sessions["ctrl_c"]
    assert ctrl_c["rc"] == 2 and "KeyboardInterrupt" in ctrl_c["out"], ctrl_c["out"]
    assert wait_until_gone(ctrl_c["tag"]) == []
