"""The pytest front door as a user meets it: ``parity_test`` on their own workload, in a test file
of their own, in a folder outside the checkout (one pytest session, read by several tests)."""

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

# An inner pytest session of a user's parity tests (most of a minute on two cores): `make e2e`.
pytestmark = pytest.mark.e2e

USER_WORKLOADS = Path(__file__).parents[2] / "fixtures" / "user_workloads.py"

USER_TESTS = """
from harness.parity import parity_test
from my_workloads import resmlp


@parity_test(resmlp, k="fsdp2 and reshard and fp32 and sgd and not offload")
def test_resmlp_trains_like_ddp(parity):
    assert parity.passed, parity.explanation


@parity_test("my_workloads:l2_outside_forward", k="fsdp1 and full_shard and orig and fp32 and sgd and suite=fsdp_vs_ddp")
def test_weight_decay_outside_forward(parity):
    assert parity.passed, parity.explanation
"""

BAD_USER_TESTS = """
from harness.parity import parity_test


@parity_test("my_workloads:data_not_deterministic")
def test_never_collected(parity):
    pass
"""


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """``(pytest's output, {test id: (outcome, {property: value})})`` of the user's session."""
    folder = tmp_path_factory.mktemp("user")
    shutil.copy(USER_WORKLOADS, folder / "my_workloads.py")
    (folder / "test_my_model.py").write_text(USER_TESTS)
    (folder / "test_bad_workload.py").write_text(BAD_USER_TESTS)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-rA",
            "-p",
            "no:cacheprovider",
            "--junitxml=junit.xml",
            "--continue-on-collection-errors",
            "test_my_model.py",
            "test_bad_workload.py",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    cases = {}
    for case in ET.parse(folder / "junit.xml").getroot().iter("testcase"):
        outcome = (
            "failed"
            if case.find("failure") is not None
            else "error"
            if case.find("error") is not None
            else "passed"
        )
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        cases[case.get("name")] = (outcome, properties)
    return done.stdout + done.stderr, cases


def test_a_workload_expands_into_one_test_per_configuration_with_its_metrics(session):
    _, cases = session
    outcome, properties = cases["test_resmlp_trains_like_ddp[fsdp2-reshard-fp32-sgd-resmlp-w2]"]
    assert outcome == "passed"
    assert properties["parity.status"] == "pass" and properties["parity.profile"] == "exact"
    assert properties["parity.first_diverging_step"] == "-"


def test_a_model_that_trains_differently_when_sharded_fails_with_the_step_and_tensor(session):
    output, cases = session
    config_id = "fsdp1-full_shard-orig-fp32-sgd-l2_outside_forward-w2"
    outcome, properties = cases[f"test_weight_decay_outside_forward[{config_id}]"]
    assert outcome == "failed" and properties["parity.status"] == "FAIL"
    assert properties["parity.first_diverging_step"] == "0"
    # Which tensor differs most at step 0 is the CPU kernels' business (a gradient on AVX-512, a
    # parameter 1 ulp off under ATEN_CPU_CAPABILITY=avx2): the property names one, with its step.
    assert re.match(r"step 0, (grad|param|optim_state|buffer) [\w.]+", properties["parity.worst"]), properties
    assert f"{config_id}: fail (profile exact)" in output


def test_a_workload_that_cannot_be_used_is_a_collection_error_naming_the_fix(session):
    output, _ = session
    assert (
        "parity_test('my_workloads:data_not_deterministic'): workload 'resmlp': batch(rank=0, step=0) "
        in output
    )
    assert "returned different data on two calls" in output
