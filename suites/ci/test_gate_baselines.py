"""Golden baselines: one CSV per backend and torch version, read back exactly, and the nearest
torch version's file when this one has none."""

import math
from pathlib import Path

import pytest

from ci.gate import baselines
from ci.gate.baselines import StepPoint
from ci.gate.cli import DEFAULT_BASELINES
from harness.parity.plan.config import unsupported_reason


def test_a_written_file_reads_back_exactly_including_non_finite_values(tmp_path):
    curves = {
        "cfg-b": [StepPoint(step=0, scale=2.0**20, grad_norm=math.inf, loss=(0.1 + 0.2, 1 / 3))],
        "cfg-a": [
            StepPoint(step=0, scale=1024.0, grad_norm=math.nan, loss=(2.5,)),
            StepPoint(step=1, scale=512.0, grad_norm=1e-300, loss=(-math.inf,)),
        ],
    }
    path = tmp_path / "gloo" / "torch-2.13.0.csv"
    baselines.write(path, curves, backend="gloo", version=(2, 13, 0))
    back = baselines.read(path)
    assert list(back) == ["cfg-a", "cfg-b"]  # sorted: a rewrite reorders nothing
    assert back["cfg-b"] == curves["cfg-b"]
    assert math.isnan(back["cfg-a"][0].grad_norm) and back["cfg-a"][1] == curves["cfg-a"][1]


def test_each_row_is_one_step_of_one_configuration(tmp_path):
    path = tmp_path / "b.csv"
    baselines.write(
        path,
        {"cfg": [StepPoint(step=0, scale=4.0, grad_norm=0.5, loss=(1.5, 2.5))]},
        backend="gloo",
        version=(2, 13, 0),
    )
    rows = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    assert rows == ["configuration,step,scale,grad_norm,loss", "cfg,0,4.0,0.5,1.5 2.5"]


def test_a_file_with_another_header_names_the_file_and_the_fix(tmp_path):
    path = tmp_path / "torch-2.13.0.csv"
    path.write_text("config,step,value\n")
    with pytest.raises(
        baselines.BaselineError, match=r"torch-2.13.0.csv: the first row .* --update-baselines"
    ):
        baselines.read(path)


def test_a_row_that_skips_a_step_is_refused_naming_the_row(tmp_path):
    path = tmp_path / "torch-2.13.0.csv"
    path.write_text("configuration,step,scale,grad_norm,loss\ncfg,0,1.0,1.0,1.0\ncfg,2,1.0,1.0,1.0\n")
    with pytest.raises(baselines.BaselineError, match="row 3: cfg step 2 follows step 0"):
        baselines.read(path)


@pytest.mark.parametrize(
    ("text", "version"), [("2.13.0+cpu", (2, 13, 0)), ("2.6", (2, 6, 0)), ("2.14.0a0+git1234", (2, 14, 0))]
)
def test_torch_versions_are_read_without_their_build_suffix(text, version):
    assert baselines.torch_version(text) == version


def test_an_unreadable_torch_version_is_an_error_naming_it():
    with pytest.raises(baselines.BaselineError, match="cannot read a torch version from 'nightly'"):
        baselines.torch_version("nightly")


@pytest.mark.parametrize(
    ("versions", "running", "chosen"),
    [
        ([(2, 5, 1), (2, 13, 0)], (2, 6, 0), (2, 5, 1)),
        ([(2, 11, 0), (2, 13, 0)], (2, 12, 0), (2, 13, 0)),  # a tie goes to the newer
        ([(2, 13, 0), (2, 13, 1)], (2, 13, 1), (2, 13, 1)),
        ([(2, 13, 0)], (3, 0, 0), (2, 13, 0)),
    ],
)
def test_the_nearest_version_is_the_smallest_major_then_minor_then_patch_gap(versions, running, chosen):
    assert baselines.nearest(versions, running) == chosen


def test_this_torch_versions_file_is_chosen_when_it_exists_and_differences_are_then_regressions(tmp_path):
    for version in ("2.12.0", "2.13.0"):
        (tmp_path / "gloo").mkdir(exist_ok=True)
        (tmp_path / "gloo" / f"torch-{version}.csv").write_text("")
    choice = baselines.choose(tmp_path, "gloo", (2, 13, 0))
    assert choice.path.name == "torch-2.13.0.csv" and choice.exact
    other = baselines.choose(tmp_path, "gloo", (2, 6, 0))
    assert other.path.name == "torch-2.12.0.csv" and not other.exact
    assert "nearest to torch 2.6.0: differences are drift" in other.describe()
    assert baselines.choose(tmp_path, "nccl", (2, 13, 0)) is None


def _cpu_tier_configs():
    from suites.parity import (
        test_cpu_offload,
        test_forced_inf,
        test_fsdp_vs_ddp,
        test_fused_optimizer,
        test_loop_parity,
        test_recipe_parity,
        test_showcase,
        test_side_by_side,
        test_sparse,
        test_uneven,
    )

    modules = (
        test_fsdp_vs_ddp,
        test_forced_inf,
        test_sparse,
        test_cpu_offload,
        test_side_by_side,
        test_showcase,
        test_uneven,
        test_recipe_parity,
        test_loop_parity,
        test_fused_optimizer,
    )
    return {
        c.id
        for module in modules
        for c in module.CONFIGS
        if unsupported_reason(c) is None and _in_make_test(module, c)
    }


def _in_make_test(module, config) -> bool:
    """A row a module gives to another tier (its ``tier``: ``suites/parity/conftest.py``) is not
    the CPU tier's, so it has no baseline there."""
    tier = getattr(module, "tier", None)
    return tier is None or tier(config) is None


def test_every_committed_baseline_is_a_configuration_the_cpu_tier_runs():
    files = baselines.available(DEFAULT_BASELINES, "gloo")
    assert files, f"no gloo baselines under {DEFAULT_BASELINES}"
    runnable = _cpu_tier_configs()
    for version, path in files.items():
        recorded = baselines.read(path)
        assert set(recorded) <= runnable, f"{path}: {sorted(set(recorded) - runnable)}"
        assert all(points[0].step == 0 for points in recorded.values())
        assert isinstance(path, Path) and version >= (2, 6, 0)
