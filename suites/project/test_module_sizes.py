"""The engine stays readable in pieces: no folder under ``harness/`` holds more than 14 modules, no
module more than 400 lines.

Why a test: a feature added as one more module in a crowded folder, or a hundred more lines in a
long one, is how the engine became a blackboard before (a folder of 15 modules, six of them
``*_causes.py``; a configuration module of 449 lines). A feature that needs room gets a folder of
its own (``judge/causes/``, ``plan/config/``, ``plan/matrices/``, ``ranks/sides/full/``).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MOST_MODULES = 14
MOST_LINES = 400


def test_no_folder_of_harness_holds_more_than_14_modules():
    crowded = {
        folder.relative_to(ROOT).as_posix(): count
        for folder in (ROOT / "harness").rglob("*")
        if folder.is_dir() and folder.name != "__pycache__"
        if (count := len(list(folder.glob("*.py")))) > MOST_MODULES
    }
    assert crowded == {}, f"folders with more than {MOST_MODULES} modules: {crowded}; give a feature a folder"


def test_no_module_of_harness_is_longer_than_400_lines():
    long = {
        path.relative_to(ROOT).as_posix(): lines
        for path in (ROOT / "harness").rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MOST_LINES
    }
    assert long == {}, f"modules over {MOST_LINES} lines: {long}; split each by what it owns"
