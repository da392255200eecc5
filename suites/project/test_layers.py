"""The harness keeps the shape docs/architecture.md draws: the parity engine's stages in order,
the controller and the rank side apart, and no import cycle in any package. The contracts are
import-linter's, declared in pyproject.toml; these tests run them on the checkout and show that
each one fails on the import it forbids, planted into a scratch copy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(where: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=where, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A copy of the harness and the contracts, to plant imports into."""
    shutil.copytree(ROOT / "harness", tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _plant(root: Path, module: str, line: str) -> None:
    path = root / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n{line}  # planted\n")


def test_the_checkout_keeps_every_import_contract():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_a_rank_side_module_importing_a_front_door_breaks_the_pipeline_contract(scratch):
    _plant(scratch, "harness.parity.ranks.sides.engines", "from harness.parity.doors import runner")
    out = _lint(scratch)
    assert out.returncode == 1
    assert "harness.parity.ranks is not allowed to import harness.parity.doors" in out.stdout


def test_a_judge_importing_a_renderer_breaks_the_pipeline_contract(scratch):
    _plant(scratch, "harness.parity.judge.result", "from harness.parity.report import render")
    out = _lint(scratch)
    assert out.returncode == 1
    assert "harness.parity.judge is not allowed to import harness.parity.report" in out.stdout


def test_the_controller_importing_the_rank_side_breaks_the_role_contract(scratch):
    _plant(scratch, "harness.controller.case_run", "from harness.rank import execute")
    out = _lint(scratch)
    assert out.returncode == 1
    assert "harness.controller is not allowed to import harness.rank" in out.stdout


def test_a_cycle_between_two_modules_of_a_stage_breaks_the_acyclic_contract(scratch):
    _plant(
        scratch,
        "harness.parity.ranks.sides.optim.optimizers",
        "from harness.parity.ranks.sides import engines",
    )
    out = _lint(scratch)
    assert out.returncode == 1
    assert "No cycles are allowed in harness.parity.ranks.sides" in out.stdout


def test_a_function_local_import_counts_as_an_import(scratch):
    """A cycle cannot be hidden by importing inside a function."""
    _plant(
        scratch,
        "harness.parity.ranks.sides.optim.optimizers",
        "def _later():\n    from harness.parity.ranks.sides import engines\n    return engines",
    )
    out = _lint(scratch)
    assert out.returncode == 1
    assert "No cycles are allowed in harness.parity.ranks.sides" in out.stdout
