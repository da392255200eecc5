"""The worked FSDP2 + TP example of docs/your-model.md ("Tensor parallelism and HSDP") runs as
written.

Why a test: an example that no longer runs teaches the wrong thing. The module and the command are
read out of the page (``doc_pages``), the module written into a fresh folder outside the checkout,
and the command run there (4 ranks, half a minute on two cores: the ``two_d`` tier)."""

import pytest

from suites.models.support import INSTALL_HINT, run_doc_example

pytestmark = pytest.mark.two_d

pytest.importorskip(
    "transformers", reason=f"the real-model tier needs Hugging Face transformers: {INSTALL_HINT}"
)


def test_the_tensor_parallel_example_passes_bitwise_from_a_fresh_folder(tmp_path):
    done = run_doc_example("my_tp_workloads", "my_tp_workloads:tp_llama", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pass  fsdp2-tp2-reshard-bf16-sgd-tp_llama-w4" in done.stdout
    assert "pass  fsdp2-tp2-reshard-bf16-reduce32-adamw-tp_llama-w4" in done.stdout
    report = (tmp_path / "reports" / "parity.md").read_text()
    assert "model.layers.*.self_attn.q_proj ColwiseParallel" in report
    assert "(auto, from LlamaForCausalLM.config.base_model_tp_plan)" in report
    assert report.count("| bitwise") >= 5, report
