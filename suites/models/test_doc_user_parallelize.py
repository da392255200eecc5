"""The README's worked example of a user's own parallelization ("Your own parallelization, as
written": a torchtitan-shaped function over a tiny Hugging Face Llama) passes from a folder outside
the checkout, at world size 4 as the README runs it and at 2."""

import shlex
import subprocess
import sys

import pytest

from suites import doc_pages
from suites.models.support import INSTALL_HINT

# Two real runs with inductor compiling on two cores (a minute or more): `make e2e`.
pytestmark = pytest.mark.e2e

pytest.importorskip(
    "transformers", reason=f"the real-model tier needs Hugging Face transformers: {INSTALL_HINT}"
)


def _run(folder, *extra: str) -> subprocess.CompletedProcess:
    code = doc_pages.block_starting("README.md", "# my_parallel_llama.py").code
    (folder / "my_parallel_llama.py").write_text(code)
    shell = [b for b in doc_pages.blocks(doc_pages.Path("README.md")) if b.lang == "bash"]
    (command,) = [
        line for b in shell for line in doc_pages.commands(b) if "my_parallel_llama:tiny_llama" in line
    ]
    args = shlex.split(command)
    return subprocess.run(
        [sys.executable, *args[1:], "--out", str(folder / "reports"), *extra],
        cwd=folder, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@pytest.mark.parametrize("world_size", ["4", "2"])
def test_the_readme_function_passes_from_a_fresh_folder(tmp_path, world_size):
    done = _run(tmp_path, "--world-size", world_size)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"pass  user-dp{world_size}-own-tiny_llama-w{world_size}" in done.stdout
    report = (tmp_path / "reports" / "parity.md").read_text()
    assert "## Your parallelization: your parallelize_llama() on mesh" in report
    assert "activation checkpointing kept (replaying the RNG)" in report
