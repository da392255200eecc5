"""The ground truth of every split a run's rows train (controller side): one rank call per world.

Why apart from the runner: the stage is a verdict of its own (``judge/semantics.py``) that no
row's comparison needs; each row's outcome carries its split's verdict once the run ends. It is
measured before the rows run, or, with a second group of ranks, there while the first group runs
rows (:class:`Pending`); the runner only asks for it (``runner.run(ground_truth=True)``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
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


class Pending:
    """The ground truth of every split the rows train (:func:`measured`), each row's
    verdict carrying its split's once the run ends. With a second group of ranks, measured there
    while the first group already runs rows (that group's own rows wait for it): the stage's
    seconds overlap the matrix instead of preceding it."""

    def __init__(
        self, runnable: list[ParityConfig], execute: Any, parallel: Sequence[Any], failed: type[Exception]
    ) -> None:
        self._failed = failed
        self._found: dict[tuple[object, ...], semantics.Semantics] = {}
        self._errors: list[BaseException] = []
        self._done = threading.Event()
        self.executors = [execute, *parallel]
        if not parallel:
            self._measure(runnable, execute)
            return
        second = parallel[0]

        def after_the_truth(*args: Any, **kwargs: Any) -> list[list[Any]]:
            self._done.wait()
            return second(*args, **kwargs)

        self.executors[1] = after_the_truth
        threading.Thread(
            target=self._measure, args=(runnable, second), name="parity-ground-truth", daemon=True
        ).start()

    def _measure(self, runnable: list[ParityConfig], execute: Any) -> None:
        try:
            self._found.update(measured(runnable, execute, self._failed))
        except BaseException as error:  # noqa: BLE001 - raised where the run ends
            self._errors.append(error)
        finally:
            self._done.set()

    def on(self, outcome: Any) -> Any:
        """``outcome`` with its split's ground truth (the stage's own error raised here)."""
        self._done.wait()
        if self._errors:
            raise self._errors[0]
        found = self._found.get(semantics.key(outcome.result.config))
        if found is None:
            return outcome
        return dataclasses.replace(outcome, result=dataclasses.replace(outcome.result, semantics=found))
