"""The ground truth of every split a run's rows train (controller side): one rank call per world.

Why apart from the runner: the stage is a verdict of its own (``judge/semantics.py``) that no
row's comparison needs, measured before the rows run so that each row's outcome carries its split's
verdict; the runner only asks for it (``runner.run(ground_truth=True)``).
"""

from __future__ import annotations

from typing import Any

from harness.parity.judge import semantics
from harness.parity.plan.config import ParityConfig, by_world

TARGET = "harness.parity.ranks.truth.stage:run_batch"
"""The ground truth of each split (``ranks/truth/stage.py``): every rank computes its share."""


def measured(
    configs: list[ParityConfig], execute: Any, failed: type[Exception]
) -> dict[tuple[object, ...], semantics.Semantics]:
    """The ground truth of every split ``configs`` train (resharded rows aside: a split is one
    world size's), one request per split, sent to the ranks of its first row's world; each rank
    computes its share (``ranks/truth/stage.py``). ``execute``: the runner's executor; ``failed``:
    what it raises when a rank call does not come back (every split of that call is an error)."""
    wanted: dict[tuple[object, ...], ParityConfig] = {}
    for config in configs:
        if config.resume.world_size is None:
            wanted.setdefault(semantics.key(config), config)
    found: dict[tuple[object, ...], semantics.Semantics] = {}
    for (backend, world_size), group in by_world(wanted.values()):
        try:
            per_rank = execute(group, backend, world_size, target=TARGET)  # type: ignore[call-arg]
        except failed as failure:
            for config in group:
                found[semantics.key(config)] = semantics.Semantics(
                    name=semantics.name(config),
                    status="error",
                    reason=str(failure).splitlines()[0],
                    detail=str(failure),
                )
            continue
        for index, config in enumerate(group):
            run = per_rank[index % world_size][index]
            found[semantics.key(config)] = semantics.judge(config, run)
    return found
