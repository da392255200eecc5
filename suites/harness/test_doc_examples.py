"""The harness's examples in docs/harness.md run as written.

Why a test: an example that no longer runs teaches the wrong thing. Each python block of the page
is read out of it (``doc_pages``) and written, as it stands, into a test file of a fresh folder
outside the checkout, as a user's own; one inner pytest session runs them. The page's one-machine
torchrun command runs from the checkout, as the page says.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from suites import doc_pages
from suites.harness.selftest import inner_env, junit_outcomes

# An inner pytest session and a torchrun launch (most of a minute on two cores): `make e2e`.
pytestmark = pytest.mark.e2e

PAGE = "docs/harness.md"
ROOT = doc_pages.ROOT
EXAMPLES = [block for block in doc_pages.blocks(Path(PAGE)) if block.lang == "python"]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """``{test name: (outcome, text)}`` and the output of the page's examples, run by pytest."""
    folder = tmp_path_factory.mktemp("harness-docs")
    for number, block in enumerate(EXAMPLES):
        (folder / f"test_doc_example_{number}.py").write_text(block.code)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--junitxml=junit.xml"],
        cwd=folder,
        env=inner_env(uuid.uuid4().hex, folder),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return junit_outcomes(folder / "junit.xml"), done.stdout + done.stderr


def test_the_page_has_the_two_examples():
    assert [block.code.splitlines()[1] for block in EXAMPLES] == [
        "import harness",
        "import harness  # before: from torch.testing._internal.common_distributed import MultiProcessTestCase",
    ]


def test_the_distributed_examples_pass_at_each_world_size(session):
    outcomes, output = session
    for name in ("test_sum[gloo-2]", "test_sum[gloo-4]", "test_fixture_style"):
        assert outcomes.get(name, ("missing", ""))[0] == "passed", output[-3000:]


def test_the_migrated_test_case_passes_on_the_warm_pool(session):
    outcomes, output = session
    assert outcomes.get("test_sum", ("missing", ""))[0] == "passed", output[-3000:]
    assert len(outcomes) == 4, output[-3000:]


def test_the_one_machine_torchrun_command_runs_as_written(tmp_path):
    (shell,) = [
        command
        for block in doc_pages.blocks(Path(PAGE))
        if block.lang == "bash"
        for command in doc_pages.commands(block)
        if "--standalone" in command
    ]
    program, *args = shlex.split(shell)
    assert program == ".venv/bin/torchrun", shell
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *args],
        cwd=ROOT,
        env={**inner_env(uuid.uuid4().hex, tmp_path), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "harness.frontends.torchrun: 4 passed, 2 skipped (world size 2, gloo)" in done.stdout
