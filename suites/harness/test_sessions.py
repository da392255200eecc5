"""Sessions side by side, GPU skips and cleanup, seen from outside (inner sessions in subprocesses).

Inner sessions of ``inner_sessions.py`` run at once: ``x`` under pytest-xdist with two workers,
``a`` and ``b``, two plain sessions that wait for each other inside a test (``make e2e``: a minute
on two cores); and on its own (on a machine without GPUs) ``nccl``, which runs only the NCCL tests
and starts no rank (``make test``). Each inner session has its own
``SHARDSCALE_TAG`` (to find what it left in ``/proc``) and a ``sitecustomize`` on ``PYTHONPATH``
that logs every Python interpreter started and every fork, exec or spawn made from Python, so that
"started no process" is an observation rather than an inference.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from suites.harness.selftest import (
    alive,
    harness_spawns,
    inner_env,
    junit_outcomes,
    log_spawns,
    wait_until_gone,
)

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
GLOO_TESTS = {f"test_all_reduce[{v}]" for v in range(6)} | {
    "test_sessions_overlap",
    "test_leaves_a_process_running",
}


@dataclasses.dataclass
class Inner:
    """One inner session: its process, outcomes and the processes it started."""

    name: str
    tag: str
    out: Path
    proc: subprocess.Popen
    rc: int | None = None
    outcomes: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)

    @property
    def stdout(self) -> str:
        return (self.out / f"stdout-{self.name}.txt").read_text()

    def spawn_log(self) -> list[str]:
        path = self.out / f"spawn-{self.name}.log"
        return path.read_text().splitlines() if path.exists() else []

    def records(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in self.out.glob(f"record-{self.name}-*.json")]


def start(name: str, out: Path, *args: str, peers: str = "") -> Inner:
    """Start an inner session of ``inner_sessions.py`` (does not wait for it)."""
    tag = uuid.uuid4().hex
    env = log_spawns(inner_env(tag, out), out, out / f"spawn-{name}.log")
    env.update(SHARDSCALE_SELFTEST_SESSION=name, SHARDSCALE_SELFTEST_PEERS=peers)
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(HERE / "inner_sessions.py"),
        "-p",
        "no:cacheprovider",
        "-q",
        "-rA",
        f"--junitxml={out / f'junit-{name}.xml'}",
        f"--rank-logs={out / f'rank-logs-{name}'}",
        "--dist-deadline=90",
        *args,
    ]
    with open(out / f"stdout-{name}.txt", "w") as stdout:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=stdout, stderr=subprocess.STDOUT)
    return Inner(name=name, tag=tag, out=out, proc=proc)


def finish(*sessions: Inner, timeout_s: float = 240) -> None:
    """Wait for every session (killing all of them if one overruns) and read their reports."""
    try:
        until = time.monotonic() + timeout_s
        for inner in sessions:
            inner.rc = inner.proc.wait(max(0.0, until - time.monotonic()))
    finally:
        for inner in sessions:
            if inner.proc.poll() is None:
                inner.proc.kill()
                inner.proc.wait(10)
    for inner in sessions:
        junit = inner.out / f"junit-{inner.name}.xml"
        assert junit.exists(), f"session {inner.name} wrote no report:\n{inner.stdout[-3000:]}"
        inner.outcomes = junit_outcomes(junit)


def assert_every_gloo_test_passed(inner: Inner) -> None:
    failed = sorted(name for name, (kind, _) in inner.outcomes.items() if kind != "passed")
    assert not failed, f"session {inner.name}: {failed} did not pass\n{inner.stdout[-3000:]}"
    assert set(inner.outcomes) == GLOO_TESTS, inner.stdout[-3000:]
    assert inner.rc == 0, inner.stdout[-3000:]


E2E = pytest.mark.e2e
"""The tests on the three gloo sessions (a minute of inner pytest sessions on two cores): ``make e2e``."""


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """Sessions ``x`` (xdist, 2 workers), ``a`` and ``b`` (waiting for each other), all run at once."""
    out = tmp_path_factory.mktemp("sessions")
    running = [
        start("x", out, "-m", "not gpu", "-n", "2"),
        start("a", out, "-m", "not gpu", peers="b"),
        start("b", out, "-m", "not gpu", peers="a"),
    ]
    finish(*running)
    return {inner.name: inner for inner in running}


@E2E
def test_xdist_workers_pass_every_test(sessions):
    x = sessions["x"]
    assert_every_gloo_test_passed(x)
    assert {r["worker"] for r in x.records()} == {"gw0", "gw1"}, "both workers must have run tests"


@E2E
def test_concurrent_sessions_overlap_and_pass_every_test(sessions):
    """Both pass, ``test_sessions_overlap`` included: each saw the other's ranks up during it."""
    assert_every_gloo_test_passed(sessions["a"])
    assert_every_gloo_test_passed(sessions["b"])


@E2E
def test_every_session_and_xdist_worker_has_its_own_store_port(sessions):
    ports: dict[tuple[str, str], set[int]] = {}
    for inner in sessions.values():
        for record in inner.records():
            ports.setdefault((record["session"], record["worker"]), set()).add(record["port"])
    assert set(ports) == {("x", "gw0"), ("x", "gw1"), ("a", "main"), ("b", "main")}
    assert all(len(p) == 1 for p in ports.values()), f"one store per pool: {ports}"
    assert len({p for (p,) in ports.values()}) == 4, f"ports shared between pools: {ports}"


@E2E
def test_spawn_log_sees_the_ranks_start(sessions):
    """The detector the NCCL test relies on sees a gloo session start its forkserver and ranks."""
    log = sessions["a"].spawn_log()
    assert any(line.split()[1] == "started" and "multiprocessing.forkserver" in line for line in log), log
    assert sum(line.split()[1] == "os.fork" for line in log) >= 2, log


@E2E
def test_no_process_left_after_the_sessions(sessions):
    """Ranks, forkservers and a process a rank left running are all gone when a session ends, and
    the process left running is reported (under xdist, by the controller, naming the worker)."""
    left_running = {p.name: int(p.read_text()) for p in sessions["a"].out.glob("left-running-*.pid")}
    assert {name.split("-")[2] for name in left_running} == {"x", "a", "b"}
    assert [name for name, pid in left_running.items() if alive(pid)] == []
    for name, pid in left_running.items():
        session, worker = name.removesuffix(".pid").split("-")[2:]
        where = "" if worker == "main" else f" of {worker}"
        line = (
            f"shardscale: 1 process(es) started by ranks{where} outlived the session and were killed: [{pid}]"
        )
        assert line in sessions[session].stdout, sessions[session].stdout[-3000:]
    for inner in sessions.values():
        assert wait_until_gone(inner.tag) == [], f"session {inner.name} left processes"


@pytest.fixture(scope="module")
def nccl_session(tmp_path_factory):
    """Session ``nccl``: only the NCCL tests (``-m gpu``), on a machine without GPUs. A fixture of
    its own: it starts no rank, so its tests stay in ``make test`` without the sessions above."""
    if _gpus():
        pytest.skip(f"needs a machine without CUDA GPUs (this one has {_gpus()}): the NCCL tests would run")
    inner = start("nccl", tmp_path_factory.mktemp("nccl"), "-m", "gpu")
    finish(inner)
    return inner


def test_nccl_tests_without_gpus_are_skipped_naming_the_gpus_needed(nccl_session):
    assert nccl_session.rc == 0, nccl_session.stdout[-3000:]
    needs = {
        "test_nccl_all_reduce[nccl-1]": "nccl world size 1 needs 1 CUDA GPU, this machine has 0",
        "test_nccl_all_reduce[nccl-2]": "nccl world size 2 needs 2 CUDA GPUs, this machine has 0",
        "test_nccl_fixture_style": "nccl world size 2 needs 2 CUDA GPUs, this machine has 0",
    }
    assert set(nccl_session.outcomes) == set(needs), nccl_session.stdout[-3000:]
    for name, reason in needs.items():
        kind, text = nccl_session.outcomes[name]
        assert kind == "skipped" and reason in text, f"{name}: {kind}, {text}"


def test_nccl_session_without_gpus_starts_no_process(nccl_session):
    """The one interpreter started is pytest's own, and the harness made no fork, exec or spawn
    (what ``import torch`` itself starts on some builds is not the harness's)."""
    log = nccl_session.spawn_log()
    assert log and log[0].split(" ", 2)[:2] == [str(nccl_session.proc.pid), "started"], log
    assert harness_spawns(log, nccl_session.proc.pid) == [], log


LEAKY_CONFTEST = '''
import os
import pathlib
import subprocess

import pytest

from harness.frontends import plugin


class LeakyPool:
    """A pool whose ranks left a process running: close() kills it and returns its pid."""

    def __init__(self):
        self.left = subprocess.Popen(["sleep", "600"])
        pathlib.Path(os.environ["SHARDSCALE_SELFTEST_DIR"], "left.pid").write_text(str(self.left.pid))

    def close(self):
        self.left.kill()
        self.left.wait()
        return [self.left.pid]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    if not session.config.pluginmanager.has_plugin("dsession"):  # not the xdist controller: it runs no test
        session.config.stash[plugin._state_key].pool = LeakyPool()
'''


@pytest.mark.parametrize(
    ("args", "where"),
    [pytest.param((), "", id="plain"), pytest.param(("-n", "1"), " of gw0", id="xdist", marks=E2E)],
)
def test_plugin_reports_what_the_pool_killed_at_the_end(tmp_path, args, where):
    """The processes ``RankPool.close()`` killed because they outlived the session are named in the
    terminal summary, the controller's under xdist (the pool is a stand-in that kills a ``sleep``)."""
    (tmp_path / "conftest.py").write_text(LEAKY_CONFTEST)
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    pass\n")
    tag = uuid.uuid4().hex
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args, str(tmp_path)],
        cwd=tmp_path,
        env=inner_env(tag, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    left = int((tmp_path / "left.pid").read_text())
    assert proc.returncode == 0, proc.stdout
    expected = (
        f"shardscale: 1 process(es) started by ranks{where} outlived the session and were killed: [{left}]"
    )
    assert expected in proc.stdout
    assert not alive(left)
    assert wait_until_gone(tag) == []
