"""torchrun mode: the same test bodies, launched by ``torchrun --nproc-per-node 2`` (env://)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


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
            "harness.torchrun",
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
    assert "test_distributed.py::test_parametrize_reaches_ranks[1-gloo-2] SKIPPED" in out
    assert "inner_faults.py::test_rank_raises[gloo-2] FAILED" in out
    assert "root cause: rank 1 failed: ValueError: boom from the test body" in out
    assert "[rank 1] ValueError: boom from the test body" in out
    assert "harness.torchrun: 4 passed, 1 failed, 2 skipped (world size 2, gloo)" in out
