"""A plant's parts: exact text edits to a copy of the project, and the plant that names its tests.

Why exact edits: an edit names the exact text it replaces; if that text is no longer in the file
exactly once, applying the plant raises :class:`PlantError` naming the plant, so a refactor can
never turn the mutation check into one that silently tests nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

_LISTS = {
    "scaler": "plants.py",
    "harness/parity": "engine_plants.py",
    "harness/controller": "cost_plants.py",
    "harness/torch_private": "user_plants.py",
}
"""Where each package's plants are listed (what to update when one no longer applies)."""


class PlantError(RuntimeError):
    """A plant no longer applies to the current ``scaler/``."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Edit:
    """Replace ``old`` (present exactly once in ``file``) by ``new``."""

    file: str
    """Path under ``package``."""
    old: str
    new: str
    package: str = "scaler"
    """The folder, relative to the project root, that ``file`` is in (``scaler``,
    ``harness/parity``, ``harness/controller`` or ``harness/torch_private``)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Plant:
    """One bug class, as edits to ``scaler/``, and the tests that must catch it."""

    name: str
    bug: str
    """What the planted code does wrong, in words."""
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]
    """What the gate runs against the mutant (pytest paths or node ids)."""

    def __post_init__(self) -> None:
        if not self.edits or not self.tests:
            raise ValueError(f"plant {self.name}: needs at least one edit and one test")


def apply(plant: Plant, root: Path) -> None:
    """Apply ``plant`` to the project copy at ``root`` (its files are edited in place)."""
    for edit in plant.edits:
        path = root / edit.package / edit.file
        text = path.read_text()
        count = text.count(edit.old)
        if count != 1:
            where = "is no longer in" if count == 0 else f"occurs {count} times in"
            raise PlantError(
                f"plant {plant.name} no longer applies: its target text {where} {edit.package}/{edit.file} "
                f"({edit.old.strip().splitlines()[0]!r}...); update ci/mutation/{_LISTS.get(edit.package, 'plants.py')}"
            )
        path.write_text(text.replace(edit.old, edit.new))
