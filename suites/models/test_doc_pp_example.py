"""The worked pipeline example of docs/your-model.md ("Pipeline parallelism") runs as written, and
the README's command is the page's.

Why a test: an example that no longer runs teaches the wrong thing. The module and the command are
read out of the page (``doc_pages``), the module written into a fresh folder outside the checkout,
and the command run there (2 ranks, 1F1B, a tiny Hugging Face Llama: the ``pipeline`` tier)."""

from pathlib import Path

import pytest

from suites.models.support import INSTALL_HINT, run_doc_example

pytestmark = pytest.mark.pipeline

pytest.importorskip(
    "transformers", reason=f"the real-model tier needs Hugging Face transformers: {INSTALL_HINT}"
)

COMMAND = "python -m harness.parity --workload my_pp_workloads:pp_llama --pp 2 --schedule 1f1b"


def test_the_readme_runs_the_pages_pipeline_command():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    page = (Path(__file__).resolve().parents[2] / "docs" / "your-model.md").read_text()
    assert COMMAND in readme and COMMAND in page


def test_the_pipeline_example_passes_bitwise_from_a_fresh_folder(tmp_path):
    done = run_doc_example("my_pp_workloads", "my_pp_workloads:pp_llama", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pass  fsdp2-pp2-1f1b-mb4-keep-bf16-sgd-pp_llama-w2" in done.stdout
    assert "pass  fsdp2-pp2-1f1b-mb4-reshard-fp16-adamw-pp_llama-w2" in done.stdout
    report = (tmp_path / "reports" / "parity.md").read_text()
    assert (
        "`pp_llama` 2 stages (1f1b): model.embed_tokens, model.layers.0 | model.layers.1, model.norm, "
        "lm_head (cut auto, evenly)" in report
    ), report
    assert report.count("| bitwise") >= 16, report
