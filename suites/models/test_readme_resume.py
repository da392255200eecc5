"""The README's Hugging Face resume check ("Does my training resume exactly?") runs as written.

Why a test: an example that no longer runs teaches the wrong thing. The module and the command
are read out of README.md, the module written into a fresh folder outside the checkout (so the
ranks import the user's own save and load from there), and the command run there."""

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from suites.models.support import INSTALL_HINT

# A real run of the README's example from a fresh folder (about a minute on two cores): `make e2e`.
pytestmark = pytest.mark.e2e

pytest.importorskip(
    "transformers", reason=f"the real-model tier needs Hugging Face transformers: {INSTALL_HINT}"
)

README = Path(__file__).resolve().parents[2] / "README.md"
MODULE = "# my_hf_resume.py"


def _blocks(text):
    """The fenced code blocks of ``text``, without their fences."""
    parts = text.split("```")
    return [part.split("\n", 1)[1] for part in parts[1::2]]


def test_the_readme_hugging_face_resume_check_passes_bitwise_from_a_fresh_folder(tmp_path):
    blocks = _blocks(README.read_text())
    (module,) = [block for block in blocks if block.startswith(MODULE)]
    (command,) = [
        line
        for block in blocks
        for line in block.splitlines()
        if "--workload my_hf_resume:tiny_llama" in line
    ]
    (tmp_path / "my_hf_resume.py").write_text(module)
    args = shlex.split(command)
    assert args[:3] == ["python", "-m", "harness.parity"]
    done = subprocess.run(
        [sys.executable, *args[1:], "--out", str(tmp_path / "reports"), "--no-plot"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for method in ("dcp", "sopt", "user"):
        assert f"pass  fsdp2-reshard-fp32-sgd-tiny_llama-resume@3-{method}-w2" in done.stdout
    report = (tmp_path / "reports" / "parity.md").read_text()
    assert report.count("| pass | bitwise |") == 3
