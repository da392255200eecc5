"""Which rows of the real-model tier run (``make models``: all; ``make test``: a handful).

Why two sizes: every engine, precision and planted fault for five architectures is a few minutes
on two cores, too much for ``make test``, which runs a handful of rows (the FSDP2 bf16 row that
a reference casting buffers broke, one FSDP1 row, one row of each other model). ``make models``
sets ``SHARDSCALE_MODELS=all`` for the whole matrices. Without ``transformers`` installed, every
module of the tier is skipped at collection with the install command
(``pytest.importorskip`` at the top of each).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from suites import doc_pages

INSTALL_HINT = "pip install 'shardscale[models]' (make setup installs it into .venv)"

FULL = os.environ.get("SHARDSCALE_MODELS") == "all"
"""``make models``: every row of every model's matrix."""

SMOKE = "fsdp2-reshard-bf16-sgd-{name}-w2"
"""The row of each model that ``make test`` runs (FSDP2 in bf16: where buffers and casts matter)."""


def rows(name: str, *extra: str) -> str:
    """The ``-k`` expression of a model's rows: all under ``make models``, else its smoke row(s)."""
    if FULL:
        return ""
    ids = [SMOKE.format(name=name), *extra]
    return " or ".join(f"({row})" for row in ids)


PAGE = "docs/your-model.md"
"""The page whose worked examples the tier runs (checking your own model)."""


def run_doc_example(module: str, workload: str, folder: Path, *extra: str) -> subprocess.CompletedProcess:
    """The code block of ``docs/your-model.md`` that starts with ``# {module}.py`` written into
    ``folder`` (outside the checkout, as a user's own module), and the page's ``python -m
    harness.parity`` command that names ``--workload {workload}`` run there (reports in
    ``folder/reports``, plus ``extra``)."""
    code = doc_pages.block_starting(PAGE, f"# {module}.py").code
    shell = [block for block in doc_pages.blocks(Path(PAGE)) if block.lang == "bash"]
    (command,) = [
        line for block in shell for line in doc_pages.commands(block) if f"--workload {workload}" in line
    ]
    (folder / f"{module}.py").write_text(code)
    args = shlex.split(command)
    assert args[:3] == ["python", "-m", "harness.parity"], command
    return subprocess.run(
        [sys.executable, *args[1:], "--out", str(folder / "reports"), *extra],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
