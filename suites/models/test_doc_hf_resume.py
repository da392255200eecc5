"""The Hugging Face resume check of docs/your-model.md ("Does my training resume exactly?") runs
as written.

Why a test: an example that no longer runs teaches the wrong thing. The module and the command
are read out of the page (``doc_pages``), the module written into a fresh folder outside the
checkout (so the ranks import the user's own save and load from there), and the command run
there."""

import pytest

from suites.models.support import INSTALL_HINT, run_doc_example

# A real run of the page's example from a fresh folder (about a minute on two cores): `make e2e`.
pytestmark = pytest.mark.e2e

pytest.importorskip(
    "transformers", reason=f"the real-model tier needs Hugging Face transformers: {INSTALL_HINT}"
)


def test_the_hugging_face_resume_check_passes_bitwise_from_a_fresh_folder(tmp_path):
    done = run_doc_example("my_hf_resume", "my_hf_resume:tiny_llama", tmp_path, "--no-plot")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for method in ("dcp", "sopt", "user"):
        assert f"pass  fsdp2-reshard-fp32-sgd-tiny_llama-resume@3-{method}-w2" in done.stdout
    report = (tmp_path / "reports" / "parity.md").read_text()
    assert report.count("| pass | bitwise |") == 3
