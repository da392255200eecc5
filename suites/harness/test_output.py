"""What ranks print follows pytest's conventions: it is in the test's "Captured stdout/stderr"
sections, each line labelled with its rank; with ``-s`` it is shown live; per-rank logs of failed
tests go under pytest's basetemp unless ``--rank-logs`` says otherwise."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from suites.harness.selftest import inner_env

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
INNER = HERE / "inner_output.py"


def section(out: str, title: str) -> str:
    """The text of the first report section whose header line contains ``title``."""
    match = re.search(rf"^-+ {re.escape(title)} -+\n(.*?)(?=^[-=_]{{3,}} )", out, re.S | re.M)
    assert match, f"no section {title!r} in:\n{out}"
    return match.group(1)


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """One inner session with pytest's default capture and ``-rA``: its terminal output and basetemp."""
    out = tmp_path_factory.mktemp("output")
    basetemp = out / "basetemp"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(INNER),
            "-k",
            "not waits",
            "-p",
            "no:cacheprovider",
            "-rA",
            f"--basetemp={basetemp}",
        ],
        cwd=ROOT,
        env=inner_env(uuid.uuid4().hex, out),
        capture_output=True,
        text=True,
        timeout=240,
    )
    return {"out": proc.stdout, "rc": proc.returncode, "basetemp": basetemp}


def test_rank_stdout_is_in_the_failed_tests_captured_stdout_labelled_by_rank(captured):
    text = section(captured["out"], "Captured stdout call")
    assert "[rank 0] hello from rank 0\n" in text and "[rank 1] hello from rank 1\n" in text


def test_rank_stderr_is_in_the_failed_tests_captured_stderr_labelled_by_rank(captured):
    text = section(captured["out"], "Captured stderr call")
    assert "[rank 0] warning from rank 0\n" in text and "[rank 1] warning from rank 1\n" in text
    assert "hello from" not in text


def test_passing_tests_output_is_shown_with_rP(captured):
    assert "[rank 0] passing output of rank 0" in captured["out"]
    assert "[rank 1] passing output of rank 1" in captured["out"]


def test_fixture_style_output_is_captured_too(captured):
    assert "[rank 1] fixture-style output of rank 1" in captured["out"]


def test_failure_report_does_not_repeat_the_output(captured):
    failure = captured["out"].split("Captured stdout call")[0]
    assert "root cause: rank 1 failed: AssertionError: rank 1 fails after printing" in failure
    assert "hello from rank" not in failure


def test_rank_logs_of_failed_tests_go_under_basetemp(captured):
    # On CI (``CI`` set) pytest's short summary repeats the whole failure message, so the
    # line may appear twice; it must name one folder.
    (line,) = {line for line in captured["out"].splitlines() if line.startswith("rank logs: ")}
    logs = Path(line.removeprefix("rank logs: "))
    assert logs.is_relative_to(captured["basetemp"]), line
    assert "hello from rank 1" in (logs / "rank1.log").read_text()


def test_with_s_rank_output_is_shown_live(tmp_path):
    """The inner test passes only if the outer test read rank 0's line while the test still ran."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", f"{INNER}::test_waits_until_its_output_is_seen", "-s", "-q"]
        + ["-p", "no:cacheprovider"],
        cwd=ROOT,
        env=inner_env(uuid.uuid4().hex, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "[rank 0] waiting for the go file" in line:
                (tmp_path / "go").write_text("")
        assert proc.wait(timeout=120) == 0, "".join(seen)
    finally:
        proc.kill()
        proc.wait()
