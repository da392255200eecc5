"""The rank side of a resharded resume row: one half of it per rank call, at that half's world size.

Why its own entry: a row saved at world size W and loaded at W' needs both world sizes, and the
warm rank pool runs one at a time, so the controller (``doors/reshard.py``) sends the first
halves of a batch of rows at W, then the second halves at W' (``reshard.Half``: which half, and
the folder between them). Each half trains its reference and its candidate over its own steps and
compares them step by step as :func:`entry.run_one` does; the judge joins the two halves into one
row. References are not kept between rows (each half's is its own), and there is no float32 twin
(no expected gap) on these rows.

Import target for the pool: ``harness.parity.ranks.phases:run_batch``.
"""

from __future__ import annotations

import dataclasses
import warnings

from harness.parity.plan.config import ParityConfig, resume
from harness.parity.ranks import entry, train
from harness.parity.ranks.measure import stepcheck
from harness.parity.ranks.restart.reshard import Half
from harness.parity.ranks.wire import RankRow
from harness.rank import context
from harness.rank.subtests import agree, leave_group

Request = tuple[ParityConfig, int, str]
"""``(the row, which half: 1 or 2, the folder between the halves)``."""


def run_half(config: ParityConfig, part: int, folder: str, index: int = 0) -> RankRow:
    """One half of a resharded row on this rank, as ``entry.run_one`` records a row (never raises)."""
    ctx = context.current()
    here = config if part == 1 else resume.landing(config)
    if here.world_size != ctx.world_size or here.backend != ctx.backend:
        raise ValueError(
            f"half {part} of {config.id} needs {here.backend} world size {here.world_size}, but this "
            f"batch runs on {ctx.backend} world size {ctx.world_size}"
        )
    half = Half(part=part, folder=folder, saved_world_size=config.world_size)
    reference = train.Run(here, "reference", ctx.device, half=half)
    for _ in reference:
        pass
    reference_ok = entry.everywhere(f"half{part}/{index}/reference", reference.error is None)
    candidate = None
    check = None
    if reference_ok:
        steps = stepcheck.ReferenceSteps(reference.steps, first=reference.first)
        check = stepcheck.Check(here, steps)
        candidate = train.Run(here, "candidate", ctx.device, check=check, half=half)
        for _ in candidate:
            pass
    if reference_ok:
        entry.everywhere(f"half{part}/{index}/candidate", candidate is not None and candidate.error is None)
    wire = dataclasses.replace(
        reference.rank_run(), steps=tuple(stepcheck.wire_step(full, ctx.rank) for full in reference.steps)
    )
    # the full tensors of the steps the causes read (rank 0)
    wire = entry.with_kept(wire, check.kept if check is not None else {}, ctx.rank, first=reference.first)
    return RankRow(
        id=config.id,
        part=part,
        fp32_gap=None,
        reference=wire,
        reference_description=reference.description,
        reference_reused=False,
        candidate=candidate.rank_run() if candidate is not None else None,
        candidate_description=candidate.description
        if candidate is not None
        else "not run: the reference failed",
    )


def run_batch(requests: list[Request]) -> list[RankRow]:
    """Run each requested half in order; one :class:`~harness.parity.ranks.wire.RankRow` per
    request (isolated as ``entry.run_batch`` isolates configurations)."""
    ctx = context.current()
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for index, (config, part, folder) in enumerate(requests):
            result = run_half(config, part, folder, index)
            failed = result.failed
            if failed and ctx.world_size > 1:
                leave_group()  # unblock peers still waiting in a collective with this rank
            if ctx.world_size > 1 and not agree(ctx, f"halves{index}", ok=not failed):
                entry.forget()
            results.append(result)
    return results
