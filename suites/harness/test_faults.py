"""The outside view: failing distributed tests run as an inner pytest session, outcomes asserted.

The inner session (``inner_faults.py``) runs once per module, in a subprocess, with a JUnit XML
report; each test here checks one reported outcome. The subprocess carries a unique tag in its
environment so that every process it started (ranks, forkserver, DataLoader workers) can be found
in ``/proc`` afterwards: none may be left.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from suites.harness.selftest import inner_env, junit_outcomes, tagged_pids

# An inner session of faulty tests and a killed pytest, seen from outside: `make e2e`. The same
# deaths and hangs inside one session stay in `make test` (test_deaths_and_progress.py, test_deadlines.py).
pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


@pytest.fixture(scope="module")
def inner(tmp_path_factory):
    """Run inner_faults.py once; return {test name: (outcome, text)}, the output, the tag and dir."""
    out = tmp_path_factory.mktemp("inner")
    tag = uuid.uuid4().hex
    junit = out / "junit.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(HERE / "inner_faults.py"),
            "-p",
            "no:cacheprovider",
            "-q",
            f"--junitxml={junit}",
            f"--rank-logs={out / 'rank-logs'}",
            "--dist-deadline=30",
        ],
        cwd=ROOT,
        env=inner_env(tag, out),
        capture_output=True,
        text=True,
        timeout=240,
    )
    outcomes = junit_outcomes(junit)
    return {"outcomes": outcomes, "stdout": proc.stdout, "rc": proc.returncode, "tag": tag, "dir": out}


def outcome(inner, name):
    assert name in inner["outcomes"], f"{name} not in the inner report:\n{inner['stdout'][-3000:]}"
    return inner["outcomes"][name]


def assert_failed_naming(inner, name, *needles):
    kind, text = outcome(inner, name)
    assert kind == "failure", f"{name}: expected a failure, got {kind}\n{text}"
    for needle in needles:
        assert needle in text, f"{name}: {needle!r} missing from the report:\n{text}"
    assert text.rstrip().splitlines()[-1].startswith("reproduce: cd ")
    assert f"inner_faults.py::{name}" in text.rstrip().splitlines()[-1]


def test_inner_session_exit_code_and_passes(inner):
    assert inner["rc"] == 1
    for name in ("test_first_passes", "test_after_hang_passes", "test_last_passes"):
        assert outcome(inner, name)[0] == "passed"
    assert outcome(inner, "test_after_gil_hang_passes[gloo-2]")[0] == "passed"
    assert outcome(inner, "test_after_gil_hang_passes[gloo-4]")[0] == "passed"


def test_rank_raises_fails_naming_rank_with_traceback(inner):
    assert_failed_naming(
        inner,
        "test_rank_raises",
        "root cause: rank 1 failed: ValueError: boom from the test body",
        '[rank 1]   File "',
        "in test_rank_raises",
    )


def test_sys_exit_on_rank_1_fails(inner):
    assert_failed_naming(inner, "test_sys_exit", "root cause: rank 1 failed: SystemExit: 1", "sys.exit(1)")


def test_os_exit_on_rank_1_fails_with_exit_code(inner):
    assert_failed_naming(inner, "test_os_exit", "root cause: rank 1 died with exit code 3")


def test_sigsegv_on_rank_1_fails_with_signal(inner):
    assert_failed_naming(
        inner, "test_sigsegv", "root cause: rank 1 died with signal SIGSEGV", "Segmentation fault"
    )


def test_sigkill_on_rank_1_fails_with_signal(inner):
    assert_failed_naming(inner, "test_sigkill", "root cause: rank 1 died with signal SIGKILL (-9)")


def test_skip_on_one_rank_fails(inner):
    assert_failed_naming(
        inner, "test_skip_on_one_rank", "root cause: rank 1 skipped", "asymmetric skip", "only rank 1 thinks"
    )


def test_skip_on_every_rank_skips(inner):
    kind, text = outcome(inner, "test_skip_on_every_rank")
    assert kind == "skipped" and "no rank can run this" in text


@pytest.mark.parametrize("name", ["test_hang", "test_hang_holding_gil"])
def test_hang_fails_at_deadline_with_every_rank_stack(inner, name):
    assert_failed_naming(
        inner,
        name,
        "rank 1 did not finish before the deadline",
        "[rank 0] Python stacks at the deadline",
        "[rank 1] Python stacks at the deadline",
        "in hang_on",
        f"in {name}",
    )


def test_next_test_after_hang_runs_on_a_fresh_pool(inner):
    pids = {p.name: p.read_text() for p in inner["dir"].glob("*.pid")}
    assert pids["before-hang-rank1.pid"] != pids["after-hang-rank1.pid"]
    assert pids["first-rank0.pid"] != pids["after-hang-rank0.pid"]


def test_subtests_report_each_failing_configuration(inner):
    assert_failed_naming(
        inner,
        "test_subtests_report_each_failing_config",
        "2 of 4 subtests failed on rank 1",
        "subtest 2 (lr=0.5, steps=1) failed",
        "subtest 3 (lr=0.5, steps=2) failed",
    )
    kind, text = outcome(inner, "test_subtests_report_each_failing_config")
    assert "lr=0.1" not in text
    assert "[rank 1] [rank 1]" not in text


def test_fixture_style_failure_names_rank(inner):
    kind, text = outcome(inner, "test_fixture_reports_failing_rank")
    assert kind == "failure"
    assert "RankFailure: 1 of 2 ranks did not pass; root cause: rank 0 failed: KeyError" in text
    assert "reproduce: cd " in text


def test_rank_logs_kept_for_failed_tests(inner):
    logs = inner["dir"] / "rank-logs"
    rank1 = next(logs.glob("*test_os_exit*")) / "rank1.log"
    assert "status: died" in rank1.read_text()
    assert not list(logs.glob("*test_first_passes*"))


def test_no_process_left_after_the_inner_session(inner):
    deadline = time.monotonic() + 10
    while tagged_pids(inner["tag"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tagged_pids(inner["tag"]) == []


HANGER = """
import os, pathlib, harness

@harness.distributed(world_size=2, deadline=600)
def test_hangs_forever(rank):
    pathlib.Path(os.environ["SHARDSCALE_SELFTEST_DIR"], f"started{rank}").write_text("")
    harness.rank.faults.hang_on(rank, hold_gil=(rank == 1))
"""


def test_ranks_die_when_pytest_is_killed(tmp_path):
    """SIGKILL of the controller mid-test: the ranks (one holding the GIL) still go away."""
    (tmp_path / "test_hanger.py").write_text(HANGER)
    tag = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", str(tmp_path / "test_hanger.py"), "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        env=inner_env(tag, tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"started{r}").exists() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, (
                "the inner session never started ranks"
            )
            time.sleep(0.1)
        assert len(tagged_pids(tag)) >= 4  # pytest, forkserver, two ranks
    finally:
        proc.kill()
        proc.wait(10)
    deadline = time.monotonic() + 15
    while tagged_pids(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tagged_pids(tag) == []
