"""The worked Hugging Face example of docs/your-model.md ("A Hugging Face model") runs as written.

Why a test: an example that no longer runs teaches the wrong thing. The module and the command
are read out of the page (``doc_pages``), the module written into a fresh folder outside the
checkout, and the command run there."""

import pytest

from suites.models.support import INSTALL_HINT, run_doc_example

# A real run of the page's example from a fresh folder (half a minute on two cores): `make e2e`.
pytestmark = pytest.mark.e2e

pytest.importorskip(
    "transformers", reason=f"the real-model tier needs Hugging Face transformers: {INSTALL_HINT}"
)


def test_the_hugging_face_example_passes_from_a_fresh_folder(tmp_path):
    done = run_doc_example("my_hf_workloads", "my_hf_workloads:tiny_llama", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pass  fsdp2-reshard-bf16-sgd-tiny_llama-w2" in done.stdout
    assert (
        "FSDP units: `tiny_llama` LlamaDecoderLayer (auto" in (tmp_path / "reports" / "parity.md").read_text()
    )
