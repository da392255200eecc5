"""The ranks' forkserver started before the CLI imports and plans anything (controller side).

Why: ``python -m harness.parity`` spends about 1.5 s importing torch and the engine's controller
side and 1 s resolving its matrix before its first pool asks for ranks, and the forkserver spends
about 3 s importing torch and the engine's rank side (:data:`RANK_MODULE`, preloaded) before it
forks one. Started first, the two import on two cores at once. Skipped where no rank starts: a
listing, help, or a process torchrun launched (it is a rank itself).
"""

from __future__ import annotations

from harness.parity.doors import launched
from harness.parity.ranks.requests import RANK_MODULE

NO_RANKS = frozenset({"--list", "-h", "--help"})
"""Arguments under which the CLI starts no rank."""


def start(argv: list[str]) -> bool:
    """Start the forkserver now, importing :data:`RANK_MODULE` for the ranks; whether it did."""
    if NO_RANKS & set(argv) or launched.launched():
        return False
    from harness.controller import reaper

    reaper.preload(RANK_MODULE)
    reaper.start_tagged_forkserver(reaper.controller_tag())
    return True
