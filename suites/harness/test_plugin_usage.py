"""How the plugin answers mistakes and missing hardware, seen from a pytest session of its own:
a bad ``distributed`` marker is an error of that test, a lambda cannot be marked, and strict GPU
mode (``--require-gpus N``) fails GPU tests that would skip for lack of GPUs."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
import torch

import harness
from harness.frontends.session import gpu_skip_reason
from suites.harness.selftest import inner_env

BAD_MARKER = """
import pytest

@pytest.mark.distributed(world_size=0)
def test_bad_world_size(rank):
    pass

def test_plain():
    pass
"""

GPU_TESTS = """
import pytest
import harness

@harness.distributed(world_size=1, backend="nccl")
def test_nccl_one(rank):
    pass

@harness.distributed(world_size=2, backend="nccl")
def test_nccl_two(rank):
    pass

@pytest.mark.gpu
@pytest.mark.skipif(True, reason="needs a CUDA GPU")
def test_cuda_kernel():
    pass

def _world_size():
    return 1

@pytest.mark.gpu
def test_nccl_fixture_style(ranks):
    ranks.run(_world_size, world_size=1, backend="nccl")
"""


def pytest_session(tmp_path, source, *args):
    """Run pytest on one test file holding ``source``; return (exit code, output)."""
    path = tmp_path / f"test_usage_{uuid.uuid4().hex[:8]}.py"
    path.write_text(source)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(path), "-p", "no:cacheprovider", "-rA", *args],
        cwd=tmp_path,
        env=inner_env(uuid.uuid4().hex, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_invalid_marker_is_an_error_of_that_test_and_the_others_run(tmp_path):
    rc, out = pytest_session(tmp_path, BAD_MARKER)
    assert rc == 1, out
    assert "ERROR collecting" not in out and "site-packages/pluggy" not in out, out
    assert "ERROR at setup of test_bad_world_size" in out, out
    assert (
        "invalid @pytest.mark.distributed(...) on test_bad_world_size: world_size must be an int >= 1, got 0"
        in out
    )
    assert "PASSED" in out and "::test_plain" in out


def test_lambda_cannot_be_marked_distributed():
    with pytest.raises(TypeError, match=r"harness.distributed\(\.\.\.\) cannot mark a lambda.*def test_"):
        harness.distributed(world_size=2)(lambda rank: None)


def test_distributed_still_marks_functions_and_classes():
    def test_function(rank):
        pass

    class TestClass:
        pass

    for obj in (test_function, TestClass):
        marked = harness.distributed(world_size=2)(obj)
        assert [m.kwargs["world_size"] for m in marked.pytestmark if m.name == "distributed"] == [2]


def test_gpu_skip_reason_counts_gpus_in_english():
    assert gpu_skip_reason(1, 0) == "nccl world size 1 needs 1 CUDA GPU, this machine has 0"
    assert gpu_skip_reason(2, 1) == "nccl world size 2 needs 2 CUDA GPUs, this machine has 1"


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    """``pytest -m gpu --require-gpus 1`` over GPU_TESTS on this machine without GPUs: (exit code,
    output). Without the option the same tests skip and the session passes (``test_sessions.py``)."""
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA GPUs")
    return pytest_session(tmp_path_factory.mktemp("strict"), GPU_TESTS, "-m", "gpu", "--require-gpus", "1")


def outcome_line(out, name):
    return next((line for line in out.splitlines() if line.split(" - ")[0].endswith(f"::{name}")), "")


def test_strict_mode_fails_gpu_tests_that_would_skip_for_lack_of_gpus(strict):
    rc, out = strict
    assert rc == 1, out
    for name in ("test_nccl_one", "test_cuda_kernel", "test_nccl_fixture_style"):
        assert outcome_line(out, name).startswith(("ERROR", "FAILED")), f"{name} did not fail:\n{out}"
    assert "this machine has 0 CUDA GPUs and " in out and "was skipped: Skipped: needs a CUDA GPU" in out
    assert "strict GPU mode (--require-gpus 1): nccl world size 1 needs 1 CUDA GPU, this machine has 0" in out


def test_strict_mode_still_skips_tests_needing_more_gpus_than_required(strict):
    rc, out = strict
    assert outcome_line(out, "test_nccl_two") == "", out  # neither ERROR nor FAILED
    assert "1 skipped" in out and ": nccl world size 2 needs 2 CUDA GPUs, this machine has 0" in out


def test_strict_mode_is_named_in_the_session_header(strict):
    rc, out = strict
    assert "strict GPU mode (--require-gpus 1): this machine has 0 CUDA GPUs" in out.splitlines()[:8]


def test_require_gpus_must_not_be_negative(tmp_path):
    rc, out = pytest_session(tmp_path, "def test_x():\n    pass\n", "--require-gpus", "-1")
    assert rc == 4
    assert "--require-gpus must be >= 0 (the number of CUDA GPUs this runner must have), got -1" in out
