"""The map in docs/architecture.md is true: it names every module of ``harness/`` (the parity engine
included) and no module that is gone.

Why read the folders when the test runs: modules move (matrices into their own folder, a side
split in two), and a map checked against a list written here would go stale with them. The map's
"Every module, and what it owns" tables are read as they stand: a heading that names a folder
(``#### `harness/parity/` ``) starts a table whose rows name modules by their path below it
(``| `plan/config/loop.py` | ... |``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def map_section(text: str) -> str:
    """The section "The map" of the document: from its heading to the next of the same level."""
    found = re.search(r"^## The map\n(.*?)(?=^## )", text, flags=re.M | re.S)
    assert found, "docs/architecture.md has no section '## The map' followed by another section"
    return found.group(1)


def named_in_map(section: str) -> list[str]:
    """Every module a table of the map names, as its path from the checkout (``harness/...py``)."""
    folder, named = None, []
    for line in section.splitlines():
        heading = re.match(r"^#+ .*`(harness/[\w/]*)`", line)
        if heading:
            folder = heading.group(1).rstrip("/") + "/"
            continue
        row = re.match(r"^\| `([\w/]+\.py)` \|", line)
        if row:
            assert folder is not None, f"the map names {row.group(1)} before a heading names its folder"
            named.append(folder + row.group(1))
    return named


def modules(under: str) -> set[str]:
    """The ``.py`` modules under ``under`` in the checkout, as paths: every one but an
    ``__init__.py`` that only marks its package (one that defines a function or class owns
    something, as ``plan/config/__init__.py`` owns ``ParityConfig``, and is on the map)."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / under).rglob("*.py")
        if "__pycache__" not in path.parts and (path.name != "__init__.py" or _defines(path))
    }


def _defines(path: Path) -> bool:
    return re.search(r"^(def|class) ", path.read_text(), flags=re.M) is not None


@pytest.fixture(scope="module")
def named() -> list[str]:
    return named_in_map(map_section(ARCHITECTURE.read_text()))


@pytest.mark.parametrize("under", ["harness/parity", "harness"])
def test_the_map_names_every_module(named, under):
    missing = sorted(modules(under) - set(named))
    assert missing == [], (
        f"docs/architecture.md, 'The map', has no row for {missing}: add "
        "'| `path/below/the/table's/folder.py` | what it owns |' to the table of its folder"
    )


def test_the_map_names_no_module_that_is_gone(named):
    gone = sorted(set(named) - modules("harness"))
    assert gone == [], f"docs/architecture.md, 'The map', names {gone}, which are not in the checkout"


def test_the_map_names_each_module_once(named):
    assert sorted({m for m in named if named.count(m) > 1}) == []


def test_a_module_missing_from_the_map_is_found():
    section = map_section(ARCHITECTURE.read_text())
    without = "\n".join(line for line in section.splitlines() if "`plan/config/loop.py`" not in line)
    assert "harness/parity/plan/config/loop.py" in named_in_map(section)
    assert "harness/parity/plan/config/loop.py" not in named_in_map(without)


def test_the_document_has_the_section_adding_a_feature():
    text = ARCHITECTURE.read_text()
    found = re.search(r"^## Adding a feature\n(.*?)(?=^## )", text, flags=re.M | re.S)
    assert found, "docs/architecture.md has no section '## Adding a feature'"
    steps = re.findall(r"^\d+\. \*\*(.+?)\*\*", found.group(1), flags=re.M)
    assert steps == [
        "Its sub-configuration",
        "Its plan",
        "Its ranks",
        "Its causes",
        "Its report",
        "Its plants",
        "Its docs",
    ]
