"""The parity engine's front-door examples run as written: ``test_my_model.py`` with its ``pytest``
command, and the CLI's ``--list`` command (docs/your-model.md, "The three front doors"; the README
shows the same test file).

Why a test: an example that no longer runs teaches the wrong thing. The test file and the commands
are read out of the page (``doc_pages``) and run in a fresh folder outside the checkout that holds
the user's ``my_workloads.py`` (the suites' ``fixtures/user_workloads.py``, whose ``resmlp`` the
page's skeleton stands for).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from suites import doc_pages

# An inner pytest session of 20 parity rows and a CLI run (most of a minute on two cores): `make e2e`.
pytestmark = pytest.mark.e2e

PAGE = "docs/your-model.md"
USER_WORKLOADS = doc_pages.ROOT / "fixtures" / "user_workloads.py"


def _command(starting: str) -> list[str]:
    """The page's shell command that starts with ``starting``, split as the shell would."""
    (found,) = [
        command
        for block in doc_pages.blocks(Path(PAGE))
        if block.lang == "bash"
        for command in doc_pages.commands(block)
        if command.startswith(starting)
    ]
    return shlex.split(found)


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    shutil.copy(USER_WORKLOADS, tmp_path / "my_workloads.py")
    return tmp_path


def test_the_readme_shows_the_pages_test_file():
    assert (
        doc_pages.block_starting("README.md", "# test_my_model.py").code
        == doc_pages.block_starting(PAGE, "# test_my_model.py").code
    )


def test_the_pytest_front_door_example_passes_with_its_command(user_folder):
    test_file = doc_pages.block_starting(PAGE, "# test_my_model.py").code
    (user_folder / "test_my_model.py").write_text(test_file)
    program, *args = _command("pytest test_my_model.py")
    assert program == "pytest"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=user_folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cases = list(ET.parse(user_folder / "junit.xml").getroot().iter("testcase"))
    assert len(cases) >= 10, done.stdout[-3000:]
    assert all("fsdp2" in case.get("name") and "bf16" in case.get("name") for case in cases)
    properties = {p.get("name") for p in cases[0].iter("property")}
    assert {"parity.status", "parity.first_diverging_step", "parity.worst"} <= properties


def test_the_clis_list_command_runs_as_written(user_folder):
    program, *args = _command(
        "python -m harness.parity --workload my_workloads:resmlp -k 'fsdp2 and bf16' --list"
    )
    done = subprocess.run(
        [sys.executable, *args], cwd=user_folder, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = [line for line in done.stdout.splitlines() if line.startswith("fsdp2-") and "-resmlp-" in line]
    assert len(ids) >= 10 and all("bf16" in line for line in ids), done.stdout
