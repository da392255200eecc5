"""Resharded resume rows, run in two halves (controller side): save at one world size, load at another.

Why two rank calls: the warm rank pool runs one world size at a time, so a row saved at W and
loaded at W' (``Resume.world_size``) cannot run in one. For each batch of rows that
share ``(backend, W, W')`` this makes one folder per row (under ``SHARDSCALE_RESUME_DIR``, or the
system's temporary folder: every rank of both calls sees it), sends the first halves to W ranks
(``ranks/phases.py``: reference and candidate train to the resume step, the candidate saves, the
reference hands its state over), then the second halves of the rows whose first half went well to
W' ranks (both sides load and train the rest), judges each row from both halves
(``result.judge_halves``) and removes the folders. A failed row is not localized (its replay
would need both world sizes too).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from harness.parity.judge import result as results
from harness.parity.plan.config import ParityConfig
from harness.parity.ranks.measure.record import RunRecord
from harness.parity.ranks.restart import DIR_ENV
from harness.parity.ranks.wire import RankRow

TARGET = "harness.parity.ranks.phases:run_batch"

Judged = tuple[results.ParityResult, RunRecord | None, RunRecord | None]
"""``(verdict, reference record, candidate record)`` as ``runner`` returns them."""


def groups(configs: list[ParityConfig]) -> Iterator[tuple[tuple[str, int, int], list[ParityConfig]]]:
    """Resharded rows by ``(backend, saving world size, resuming world size)``, first-seen order."""
    found: dict[tuple[str, int, int], list[ParityConfig]] = {}
    for config in configs:
        assert config.resume.world_size is not None, "only resharded rows run here"
        found.setdefault((config.backend, config.world_size, config.resume.world_size), []).append(config)
    yield from found.items()


def _folder(config: ParityConfig) -> str:
    root = os.environ.get(DIR_ENV) or None
    try:
        return tempfile.mkdtemp(prefix="shardscale-reshard-", dir=root)
    except OSError as error:
        raise OSError(
            f"cannot make the folder between the halves of {config.id} under "
            f"{root or tempfile.gettempdir()}: {error}; set {DIR_ENV} to a writable folder every rank sees"
        ) from error


def _first_went_well(parts: list[RankRow]) -> bool:
    """Both sides ran the first half without error on every rank (the second may then run)."""
    return all(p.candidate is not None and not p.failed for p in parts)


def judged_batch(batch: list[ParityConfig], execute: Any, failed_batch: type[Exception]) -> list[Judged]:
    """The verdicts of ``batch`` (rows of one :func:`groups` key), in order. ``failed_batch``:
    the executor's exception for a rank call that did not come back (every row of that half is
    then an ``error`` with its report)."""
    backend, saved, resumed = batch[0].backend, batch[0].world_size, batch[0].resume.world_size
    folders = {config.id: _folder(config) for config in batch}
    try:
        try:
            firsts = execute([(c, 1, folders[c.id]) for c in batch], backend, saved, target=TARGET)
        except failed_batch as failure:
            return [
                (results.failed_batch(c, f"the first half (world size {saved}): {failure}"), None, None)
                for c in batch
            ]
        first = {c.id: [rank[index] for rank in firsts] for index, c in enumerate(batch)}
        onward = [c for c in batch if _first_went_well(first[c.id])]
        second: dict[str, list[RankRow]] = {}
        if onward:
            try:
                seconds = execute([(c, 2, folders[c.id]) for c in onward], backend, resumed, target=TARGET)
                second = {c.id: [rank[index] for rank in seconds] for index, c in enumerate(onward)}
            except failed_batch as failure:
                lost = f"the second half (world size {resumed}): {failure}"
                return [
                    (results.failed_batch(c, lost), None, None)
                    if c in onward
                    else results.judge_halves(c, first[c.id], None)
                    for c in batch
                ]
        return [results.judge_halves(c, first[c.id], second.get(c.id)) for c in batch]
    finally:
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)
