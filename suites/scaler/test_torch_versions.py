"""The torch versions shardscale supports: one floor, stated in pyproject.toml and checked on import."""

import re
from pathlib import Path

import pytest

import scaler

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_requires_the_floor_that_import_checks():
    dependencies = re.search(r"^dependencies = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert dependencies is not None
    assert f'"torch>={scaler._TORCH_FLOOR}"' in dependencies.group(1)


def test_a_torch_older_than_the_floor_is_refused_naming_the_fix():
    with pytest.raises(
        ImportError, match=r"shardscale needs torch>=2.6, found torch 2.5.1; install a newer one"
    ):
        scaler._check_torch_version("2.5.1")


@pytest.mark.parametrize("version", ["2.6.0", "2.6.0+cu124", "2.13.0+cpu"])
def test_the_floor_and_newer_torch_are_accepted(version):
    scaler._check_torch_version(version)
