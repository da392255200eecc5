"""torchrun mode: the same test bodies, launched by ``torchrun --nproc-per-node 2`` (env://).

Problems with the command line (no torchrun around, a missing file, a test name that does not
exist, no test for this world size) are found before any process group is joined, so they are
tested by calling ``main`` in this process with torchrun's environment variables set.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness.frontends import torchrun

HERE = Path(__file__).parent


@pytest.mark.e2e
def test_torchrun_runs_the_same_bodies_and_reports_failures(tmp_path):
    env = {**os.environ, "SHARDSCALE_SELFTEST_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "harness.frontends.torchrun",
            "--deadline",
            "60",
            str(HERE / "test_distributed.py"),
            f"{HERE / 'inner_faults.py'}::test_rank_raises",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    out = proc.stdout
    assert proc.returncode != 0, out
    assert "test_distributed.py::test_all_reduce_sums_ranks[gloo-2] PASSED" in out, out + proc.stderr
    assert "test_distributed.py::test_subtests_all_pass[gloo-2] PASSED" in out
    assert (
        "test_distributed.py::test_parametrize_reaches_ranks[1-gloo-2] SKIPPED (needs pytest fixtures "
        "['tmp_path'], which torchrun mode does not provide)" in out
    )
    assert "inner_faults.py::test_rank_raises[gloo-2] FAILED" in out
    assert "root cause: rank 1 failed: ValueError: boom from the test body" in out
    assert "[rank 1] ValueError: boom from the test body" in out
    assert "harness.frontends.torchrun: 4 passed, 1 failed, 2 skipped (world size 2, gloo)" in out


def torchrun_env(monkeypatch, rank, world_size):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world_size))


def write_test_file(tmp_path, body):
    """A test file with a unique module name (ranks import test files by their stem)."""
    path = tmp_path / f"test_torchrun_{uuid.uuid4().hex[:8]}.py"
    path.write_text(body)
    return path


TWO_RANKS_ONLY = """
import harness

@harness.distributed(world_size=2)
def test_two(rank):
    pass
"""


def test_outside_torchrun_says_how_to_run_it(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert torchrun.main([str(write_test_file(tmp_path, TWO_RANKS_ONLY))]) == 4
    err = capsys.readouterr().err
    assert "harness.frontends.torchrun runs inside torchrun" in err
    assert "torchrun --standalone --nproc-per-node 2 -m harness.frontends.torchrun" in err


def test_missing_file_is_named_once_by_rank_0(monkeypatch, capsys, tmp_path):
    torchrun_env(monkeypatch, 0, 2)
    assert torchrun.main([str(tmp_path / "test_nowhere.py")]) == 4
    assert (
        capsys.readouterr().err
        == f"harness.frontends.torchrun: no such file: {tmp_path / 'test_nowhere.py'}\n"
    )
    torchrun_env(monkeypatch, 1, 2)
    assert torchrun.main([str(tmp_path / "test_nowhere.py")]) == 4
    assert capsys.readouterr().err == ""


def test_unknown_test_name_is_a_usage_error(monkeypatch, capsys, tmp_path):
    path = write_test_file(tmp_path, TWO_RANKS_ONLY)
    torchrun_env(monkeypatch, 0, 2)
    assert torchrun.main([f"{path}::test_too"]) == 4
    assert f"no test named 'test_too' in {path}" in capsys.readouterr().err


def test_no_test_for_this_world_size_exits_5_naming_what_the_tests_declare(monkeypatch, capsys, tmp_path):
    path = write_test_file(tmp_path, TWO_RANKS_ONLY)
    torchrun_env(monkeypatch, 0, 3)
    assert torchrun.main([str(path)]) == 5
    out = capsys.readouterr().out
    assert "harness.frontends.torchrun: no tests ran: no distributed test for gloo with world size 3" in out
    assert "declared: gloo-2" in out


HANGS_WITH_A_SHORT_DEADLINE = """
import harness

@harness.distributed(world_size=1, deadline=3)
def test_hangs(rank):
    harness.rank.faults.hang_on(0)
"""


@pytest.mark.e2e
def test_marker_deadline_overrides_the_default(tmp_path):
    """A test marked ``deadline=3`` is stopped at 3 s, with its stacks, though ``--deadline`` is 600."""
    path = write_test_file(tmp_path, HANGS_WITH_A_SHORT_DEADLINE)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
        + ["-m", "harness.frontends.torchrun", "--deadline", "600", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode != 0
    assert "Timeout (0:00:03)!" in proc.stderr, proc.stderr[-3000:]
    assert "in test_hangs" in proc.stderr
