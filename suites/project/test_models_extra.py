"""The real-model tier is optional: without ``transformers`` it is skipped at collection, saying how
to install it, and the rest of the project never imports ``transformers``."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = "import sys\nsys.modules['transformers'] = None  # as if it were not installed\n"


def test_without_transformers_the_model_tier_skips_at_collection_naming_the_install(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(_BLOCK)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/models", "-q", "-rs", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 5), done.stdout[-2000:]  # 5: every module skipped, no test item left
    assert (
        "SKIPPED" in done.stdout
        and "transformers" in done.stdout
        and "pip install 'shardscale[models]'" in done.stdout
    ), done.stdout[-2000:]
    assert " passed" not in done.stdout
