"""A killed rank says why, and a slow but steady case is not a hung one (issue 25, item 5).

The memory watch's readers run on fake ``/proc`` and cgroup files; a rank that SIGKILLs itself
shows the whole path (its verdict says "not the OOM killer" and how much memory the ranks held);
heartbeats keep a case alive past its deadline, and a parity deadline error names its flag."""

from __future__ import annotations

import os
import signal
import time

import pytest

import harness
from harness.controller import memory
from harness.controller.pool import CaseSpec, RankPool
from harness.outcome import RankResult, judge
from harness.spec import DistConfig


# -- readers, on fake files -------------------------------------------------------------------------
def _write(path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_cgroup_v2_events_file_is_found_from_proc_self_cgroup(tmp_path):
    events = _write(tmp_path / "cg/user.slice/job/memory.events", "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    proc = _write(tmp_path / "cgroup", "0::/user.slice/job\n")
    assert memory.oom_events_file(proc, root=str(tmp_path / "cg")) == events
    assert memory.oom_kills(events) == 2


def test_cgroup_v1_oom_control_is_found_when_there_is_no_v2_memory_controller(tmp_path):
    control = _write(
        tmp_path / "cg/memory/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"
    )
    proc = _write(tmp_path / "cgroup", "4:memory:/not/visible/here\n0::/\n")
    assert memory.oom_events_file(proc, root=str(tmp_path / "cg")) == control
    assert memory.oom_kills(control) == 5


def test_no_cgroup_counter_is_none_not_an_error(tmp_path):
    assert memory.oom_events_file(str(tmp_path / "missing")) is None
    assert memory.oom_kills(None) is None
    assert memory.oom_kills(_write(tmp_path / "memory.events", "oom 0\n")) is None


def test_rss_reads_peak_and_current_from_proc_status(tmp_path):
    _write(tmp_path / "42/status", "Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n")
    assert memory.rss(42, proc=str(tmp_path)) == (2048 * 1024, 1024 * 1024)
    assert memory.rss(43, proc=str(tmp_path)) is None


def test_kernel_log_names_the_killed_pid_only():
    log = "[1.0] Out of memory: Killed process 4242 (python) total-vm:1kB\n"
    assert memory.kernel_log_names_oom(4242, log) is True
    assert memory.kernel_log_names_oom(424, log) is False


def test_a_rising_oom_count_reads_as_the_oom_killer(tmp_path):
    events = _write(tmp_path / "memory.events", "oom_kill 1\n")
    watch = memory.MemoryWatch({0: None}, events_file=events)
    _write(tmp_path / "memory.events", "oom_kill 2\n")
    said = watch.explain_death(0, -signal.SIGKILL)
    assert said.startswith("killed by the OOM killer") and "1 -> 2" in said, said


def test_a_steady_oom_count_reads_as_not_the_oom_killer(tmp_path):
    events = _write(tmp_path / "memory.events", "oom_kill 1\n")
    watch = memory.MemoryWatch({0: None}, events_file=events)
    assert watch.explain_death(0, -signal.SIGKILL).startswith("not the OOM killer"), watch.explain_death(
        0, -9
    )


def test_the_death_is_in_the_verdicts_root_cause():
    results = [
        RankResult(rank=0, status="died", exitcode=-9, death="killed by the OOM killer; memory held: x"),
        RankResult(rank=1, status="passed", order=1),
    ]
    assert "SIGKILL (-9): killed by the OOM killer; memory held" in judge(results, world_size=2).summary


# -- through the pool ---------------------------------------------------------------------------------
_HELD_MB = 256


def hold_memory_then_kill_rank_1() -> None:
    """Every rank touches ``_HELD_MB`` megabytes (more than a warm rank holds before the case: the
    figures must come from samples taken while the case ran), then rank 1 is SIGKILLed."""
    held = bytearray(_HELD_MB * 1024**2)
    for i in range(0, len(held), 4096):
        held[i] = 1
    time.sleep(1.0)  # the controller samples while the case runs
    if harness.current().rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


def _peak_mb(text: str, rank: int) -> float:
    import re

    found = re.search(rf"rank {rank} peak ([\d.]+) (MB|GB)", text)
    assert found is not None, text
    return float(found.group(1)) * (1024 if found.group(2) == "GB" else 1)


def beat_for(seconds: float, step_s: float) -> None:
    """Steps of ``step_s`` for ``seconds`` in all, each followed by a heartbeat."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(step_s)
        harness.heartbeat()


@pytest.fixture(scope="module")
def pool():
    pool = RankPool(peer_grace_s=2.0)
    yield pool
    pool.close()


def test_a_sigkilled_rank_says_it_was_not_the_oom_killer_and_what_memory_the_ranks_held(pool):
    results = pool.run(
        CaseSpec(target=f"{__name__}:hold_memory_then_kill_rank_1", config=DistConfig(world_size=2))
    )
    verdict = judge(results, world_size=2)
    root = verdict.summary
    assert "rank 1 died with signal SIGKILL (-9)" in root, verdict.message
    if memory.oom_events_file() is None and memory.kernel_log_names_oom(os.getpid()) is None:
        assert "unknown whether the OOM killer did it" in root
    else:
        assert "not the OOM killer" in root, root
    assert "memory held: rank 0 peak" in root and "controller peak" in root, root
    assert _peak_mb(root, 0) >= _HELD_MB and _peak_mb(root, 1) >= _HELD_MB, root


def test_heartbeats_keep_a_slow_case_alive_past_its_deadline(pool):
    spec = CaseSpec(
        target=f"{__name__}:beat_for",
        config=DistConfig(world_size=2),
        args=(6.0, 0.3),  # twice the deadline; the deadline long enough for a rank to start on busy cores
        deadline_s=3.0,
        collective_timeout_s=2.0,
    )
    results = pool.run(spec)
    assert [r.status for r in results] == ["passed", "passed"], judge(results, world_size=2).message


def test_the_parity_deadline_error_names_the_flag_that_raises_it():
    from harness.parity.doors import runner

    class Pool:
        def run(self, spec):
            return [RankResult(rank=0, status="timeout"), RankResult(rank=1, status="passed", order=1)]

    execute = runner.pool_executor(Pool(), deadline_per_config_s=7.0)
    with pytest.raises(runner.BatchFailed, match=r"--deadline SECONDS") as failed:
        execute([object()], "gloo", 2)
    assert "no progress (no training step finished) for 7s" in str(failed.value)


def _count_parity_heartbeats(config) -> int:
    """Train ``config``'s reference on this rank, counting heartbeats (none rate-limited away)."""
    from harness.parity.ranks import train
    from harness.rank import context

    beats: list[int] = []
    sent, every = context._HEARTBEAT, context._HEARTBEAT_EVERY_S
    context._HEARTBEAT, context._HEARTBEAT_EVERY_S = (lambda: beats.append(1)), 0.0
    try:
        train.run(config, "reference", harness.current().device)
    finally:
        context._HEARTBEAT, context._HEARTBEAT_EVERY_S = sent, every
    return len(beats)


def test_the_parity_loop_beats_once_per_training_step(ranks):
    from harness.parity.plan.matrices import default as matrix

    config = matrix.sparse(world_size=2)[0]
    assert ranks.run(_count_parity_heartbeats, config, world_size=2) == [config.steps] * 2
