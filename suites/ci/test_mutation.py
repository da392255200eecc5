"""The mutation check's plants: each still applies to ``scaler/`` exactly as written (so the check
can never silently test nothing), changes what it says, and names tests that exist."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ci.gate.suites import CPU
from ci.mutation import plants
from ci.mutation.plants import PLANTS, Edit, Plant, PlantError

ROOT = Path(__file__).resolve().parents[2]
BUG_CLASSES = {
    "no_agreement",
    "sum_for_max",
    "no_backoff",
    "growth_interval_off_by_one",
    "growth_past_float32",
    "fp16_sparse_not_coalesced",
    "fp32_bf16_sparse_not_coalesced",
    "fused_not_agreed",
    "fused_no_inf_check",
    "unscale_by_the_scale",
    "bounds_ignored",
    "load_state_dict_drops_tracker",
    "dead_skip_counter",
    "fp16_grads_unchecked",
    "dtensor_grads_not_local",
    "records_hold_a_private_enum",
}
"""The bug classes the gate must catch (issue: the mutation check), each a plant."""


_PACKAGES = ("scaler", "harness/parity", "harness/controller")
"""Where plants edit: the library, the parity engine and the controller (the ranks' allocator)."""


@pytest.fixture
def copy(tmp_path):
    for package in _PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package)
    return tmp_path


def test_every_required_bug_class_has_a_plant_and_names_are_unique():
    names = [plant.name for plant in PLANTS]
    assert BUG_CLASSES <= set(names) and len(names) == len(set(names))


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p.name)
def test_the_plant_applies_and_leaves_valid_python_that_differs(tmp_path, plant):
    """Each plant on a copy of the files it edits (``plants.apply`` writes no other)."""
    named = {f"{edit.package}/{edit.file}" for edit in plant.edits}
    for name in named:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, tmp_path / name)
    before = {name: (tmp_path / name).read_text() for name in named}
    plants.apply(plant, tmp_path)
    for name in named:
        after = (tmp_path / name).read_text()
        assert after != before[name], name
        ast.parse(after, filename=name)
        assert "planted" in after


def test_every_test_a_plant_runs_is_collected():
    """Node ids name parametrizations (parity configuration ids among them), which change with the
    code: a plant whose tests are gone would make the gate exit 2 ("ran no test"), never a kill.
    Collected under the gate's CPU marker, as the mutation check runs them through the gate: a
    plant's test marked ``e2e`` (or ``gpu``) would be deselected there, and the plant never killed."""
    tests = sorted({test for plant in PLANTS for test in plant.tests})
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", CPU.marker]
        + tests,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    collected = done.stdout.splitlines()
    for test in tests:
        assert any(
            line == test or line.startswith(test + "[") or line.startswith(test + "::") for line in collected
        ), test


def test_a_plant_whose_text_is_gone_fails_loudly_naming_itself_and_the_fix(copy):
    stale = Plant(
        name="stale", bug="-", edits=(Edit(file="_rule.py", old="no such code\n", new=""),), tests=("x",)
    )
    with pytest.raises(
        PlantError, match=r"plant stale no longer applies: .* scaler/_rule.py .* update ci/mutation/plants.py"
    ):
        plants.apply(stale, copy)


def test_a_plant_whose_text_occurs_twice_fails_loudly(copy):
    twice = Plant(
        name="twice", bug="-", edits=(Edit(file="_rule.py", old="import", new="import"),), tests=("x",)
    )
    with pytest.raises(PlantError, match="occurs .* times in scaler/_rule.py"):
        plants.apply(twice, copy)


def _mutation(*args):
    return subprocess.run(
        [sys.executable, "-m", "ci.mutation", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_parity_engine_has_plants_for_every_check_its_report_claims():
    engine = {plant.name for plant in PLANTS if plant.edits[0].package == "harness/parity"}
    assert {
        "parity_ranks_not_checked_for_agreement",
        "parity_scaler_state_not_checked",
        "parity_loss_of_rank_0_only",
        "parity_grads_not_compared",
        "parity_params_not_compared",
        "parity_optim_state_not_compared",
        "parity_buffers_not_compared",
        "parity_exact_not_bitwise",
        "parity_reference_casts_buffers",
    } <= engine


def test_every_known_resume_cause_has_a_plant_of_its_name():
    from harness.parity.judge.causes import resume

    assert {known.name for known in resume.CAUSES} <= {plant.name for plant in PLANTS}


def test_list_names_each_plant_and_its_tests():
    done = _mutation("--list", "--only", "sum_for_max")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("sum_for_max: found_inf agreed with SUM")
    assert "    suites/scaler/test_sharded_distributed.py" in done.stdout.splitlines()


def test_an_unknown_plant_is_a_usage_error_listing_the_plants():
    done = _mutation("--only", "nope")
    assert done.returncode == 2 and "--only nope: no such plant; the plants are no_agreement, " in done.stderr
