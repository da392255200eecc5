"""The suites pass whatever the test order and however many xdist workers share them out.

An inner session runs the suites whose tests share warm ranks and module-scoped rank fixtures
(``suites/scaler`` and the harness's own pool and marker tests) on two xdist workers, in reverse
order (``-p reverse_order``): a test that passes only after another has run on the same ranks, or
only when its module runs whole on one worker, fails here. The harness self-tests that run inner
sessions are left out: each builds its inner session in a fixture of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from suites.harness.selftest import inner_env, junit_outcomes

# An inner session over whole suites: a minute on two cores, so `make e2e`, not `make test`.
pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
SHARED_RANK_SUITES = [
    "suites/scaler",
    "suites/harness/test_pool.py",
    "suites/harness/test_distributed.py",
    "suites/harness/test_case_isolation.py",
    "suites/harness/test_testcase.py",
    "suites/harness/test_testcase_mpc_style.py",
]


def test_suites_pass_on_two_xdist_workers_in_reverse_order(tmp_path):
    env = inner_env(uuid.uuid4().hex, tmp_path)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *SHARED_RANK_SUITES, "-n", "2", "-p", "reverse_order"]
        + ["-p", "no:cacheprovider", "-q", f"--junitxml={junit}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    outcomes = junit_outcomes(junit)
    bad = sorted(name for name, (kind, _) in outcomes.items() if kind in ("failure", "error"))
    assert bad == [], proc.stdout[-5000:]
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert len(outcomes) > 200, "the inner session ran fewer tests than the suites hold"
