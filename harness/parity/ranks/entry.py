"""The rank side of the parity engine: many configurations in one rank call, on the warm group.

Why batched: a configuration costs well under a second on an existing process group, but seconds
when ranks are spawned for it, so the controller sends a list of configurations and every rank
runs them in the same order. References are cached (many candidates share one: same workload,
precision, optimizer, path and faults), and each configuration is isolated: if any rank's run
failed, the failing rank leaves the group (so peers waiting in a collective with it get an error
instead of hanging), the ranks agree through the case's store, and every rank re-creates the
group before the next configuration.

Import target for the pool: ``harness.parity.ranks.entry:run_batch``.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
import torch.distributed as dist

from harness.parity.plan.config import ParityConfig
from harness.parity.ranks import train
from harness.parity.ranks.measure import stepcheck
from harness.parity.ranks.requests import Request, keep_budget, twin_config
from harness.parity.ranks.sides.full import gather
from harness.parity.ranks.wire import RankRow, RankRun, RankStep
from harness.rank import context
from harness.rank.subtests import agree, all_ranks, leave_group


@dataclasses.dataclass(slots=True)
class _Kept:
    """A finished reference run, kept: every step's full tensors and what travels of it."""

    steps: list[RankStep]
    wire: RankRun
    description: str
    nbytes: int


class KeptReferences:
    """The finished reference runs this rank keeps for later configurations with the same reference
    (``ParityConfig.reference_key``), in this batch or a later one, oldest first.

    Its lifetime is the default process group's: it lives in the group's stash
    (``context.group_stash``), as a reference's collectives ran on that group and every rank must
    reuse it or train it again alike; a re-created group (after a failed configuration) starts
    with none kept."""

    def __init__(self) -> None:
        self.runs: dict[tuple[Any, ...], _Kept] = {}

    def get(self, key: tuple[Any, ...]) -> _Kept | None:
        return self.runs.get(key)

    def drop(self, key: tuple[Any, ...]) -> None:
        """Let go of the run kept under ``key`` (no later configuration reads it)."""
        self.runs.pop(key, None)

    def clear(self) -> None:
        """Keep none (a test that changes how references are built clears them around the change)."""
        self.runs.clear()

    def keep(self, key: tuple[Any, ...], kept: _Kept, budget: int) -> None:
        """Keep ``kept``, dropping the oldest kept runs while all of them exceed ``budget``."""
        self.runs[key] = kept
        while sum(k.nbytes for k in self.runs.values()) > budget and len(self.runs) > 1:
            del self.runs[next(iter(self.runs))]


_KEPT = context.GroupKey[KeptReferences]()
"""In the default group's stash: the reference runs kept on it."""


def kept_references() -> KeptReferences:
    """The reference runs kept for the current default group (made empty the first time)."""
    return context.group_stash().setdefault(_KEPT, KeptReferences)


def _nbytes(step: RankStep) -> int:
    def walk(value: Any) -> int:
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        if isinstance(value, dict):
            return sum(walk(v) for v in value.values())
        return 0

    tensors = step.tensors
    held = walk(step.buffers)
    if tensors is not None:
        held += walk(tensors.params) + walk(tensors.grads) + walk(tensors.optim_state)
    return held


@dataclasses.dataclass(slots=True)
class _Reference:
    """One reference on this rank, ready to be compared with: kept, or running (``training``)."""

    steps: stepcheck.ReferenceSteps
    description: str
    reused: bool
    wire: RankRun | None = None
    training: train.Run | None = None
    """A run too large to keep, still going: its steps come as the candidate asks for them."""

    @property
    def error(self) -> str | None:
        if self.wire is not None:
            return self.wire.error
        return self.training.error if self.training is not None else None

    def rank_run(self) -> RankRun:
        """What travels of the run (scalars, names, shapes and dtypes; no tensors)."""
        if self.wire is not None:
            return self.wire
        assert self.training is not None
        return self.training.rank_run()


def _reference(config: ParityConfig, device: Any, reused: bool | None = None) -> _Reference:
    """The reference of ``config`` on this rank: kept from an earlier configuration, or trained
    now and kept when its full tensors fit :func:`keep_budget` (the same on every rank: the
    reference is replicated, so its size is too) and a later configuration reads it (``reused``;
    ``None``: not known, keep what fits), or else left running to be compared a step at a time.
    A kept reference that no later configuration reads is let go once it is handed out."""
    kept = kept_references()
    key = config.reference_key()
    found = kept.get(key)
    if found is not None:
        if reused is False:
            kept.drop(key)
        return _Reference(stepcheck.ReferenceSteps(found.steps), found.description, True, found.wire)
    budget = keep_budget() if reused is not False else 0
    training = train.Run(config, "reference", device)
    training.alias = budget == 0  # compared a step at a time from the first
    rank = dist.get_rank()
    steps = iter(training)
    nbytes = 0
    for step in steps:
        nbytes += _nbytes(step)
        if nbytes > budget:  # too large to keep: from here on the run keeps scalars only
            training.slim = lambda full: stepcheck.wire_step(full, rank)
            training.alias = True
            kept = list(training.steps)
            training.steps[:] = [stepcheck.wire_step(full, rank) for full in kept]
            live = stepcheck.ReferenceSteps(kept, live=steps)
            return _Reference(live, training.description, False, training=training)
    wire = dataclasses.replace(
        training.rank_run(), steps=tuple(stepcheck.wire_step(full, rank) for full in training.steps)
    )
    if training.error is None and reused is not False:
        kept.keep(key, _Kept(training.steps, wire, training.description, nbytes), budget)
    return _Reference(stepcheck.ReferenceSteps(training.steps), training.description, False, wire)


def forget() -> None:
    """Drop the reference runs and the mesh kept for the default group (after a failed
    configuration; the group re-created then starts with none kept anyway)."""
    context.group_stash().pop(_KEPT)
    gather.forget_meshes()


def everywhere(key: str, ok: bool) -> bool:
    """Whether ``ok`` holds on every rank (agreed through the store); a rank where it does not
    first leaves the group, so that peers blocked in a collective with it get an error at once."""
    ctx = context.current()
    if ctx.world_size == 1:
        return ok
    if not ok:
        leave_group()
    return all_ranks(ctx, key, ok=ok)


def with_kept(wire: RankRun, kept: dict[int, RankStep], rank: int, *, first: int = 0) -> RankRun:
    """``wire`` (a reference's, maybe kept and shared) with the full tensors of the ``kept``
    steps (rank 0; ``first``: the index of ``wire``'s first step, a resharded row's second half's)."""
    if not kept or rank != 0:
        return wire
    steps = list(wire.steps)
    for index, full in kept.items():
        if 0 <= index - first < len(steps):
            steps[index - first] = dataclasses.replace(steps[index - first], tensors=full.tensors)
    return dataclasses.replace(wire, steps=tuple(steps))


def run_one(config: ParityConfig | Request, index: int = 0, *, keep_all: bool = False) -> RankRow:
    """Reference and candidate runs of ``config`` (the ``index``-th of its batch) on this rank,
    compared step by step where the data lives (``stepcheck.py``); never raises. Whether the
    candidate runs is agreed first: one rank's error must not send it into collectives its peers
    skip (docs/architecture.md, section 4.5). ``keep_all``: every step's full tensors travel."""
    reused: tuple[bool | None, bool | None] = (None, None)
    if isinstance(config, Request):
        config, reused = config.config, (config.reference_reused, config.twin_reused)
    device = context.current().device
    rank = context.current().rank
    reference = _reference(config, device, reused[0])
    running = reference.training is not None
    reference_ok = running or everywhere(f"parity{index}/reference", reference.error is None)
    twin = None
    twin_of = twin_config(config)
    if twin_of is not None and reference_ok:
        # The expected mixed-precision gap: the same workload, optimizer and data in float32
        # (kept like any reference: the fp32 configurations of the matrix share it), measured
        # step by step as the candidate trains, so that only numbers travel.
        twin = _reference(twin_of, device, reused[1])
    candidate = None
    check = None
    if reference_ok:
        check = stepcheck.Check(
            config, reference.steps, twin=twin.steps if twin is not None else None, keep_all=keep_all
        )
        candidate = train.Run(config, "candidate", device, check=check)
        for _ in candidate:
            pass
    candidate_ok = reference_ok and everywhere(f"parity{index}/candidate", candidate.error is None)
    if candidate_ok:  # finish runs still going (no steps are left: the candidate took them all)
        for still in (reference, twin):
            if still is not None:
                still.steps.finish()
    if running:
        reference_ok = everywhere(f"parity{index}/reference", reference.error is None)
    twin_ok = twin is not None and twin.error is None and check is not None and check.twin is not None
    return RankRow(
        id=config.id,
        fp32_gap=check.gap if candidate_ok and reference_ok and twin_ok and check is not None else None,
        reference=with_kept(reference.rank_run(), check.kept if check is not None else {}, rank),
        reference_description=reference.description,
        reference_reused=reference.reused,
        candidate=candidate.rank_run() if candidate is not None and reference_ok else None,
        candidate_description=candidate.description
        if candidate is not None
        else "not run: the reference failed",
    )


def run_batch(configs: list[ParityConfig | Request], keep_all: bool = False) -> list[RankRow]:
    """Run every configuration of ``configs`` in order; one
    :class:`~harness.parity.ranks.wire.RankRow` per configuration.

    torch's deprecation notices (``FutureWarning``: NO_SHARD, ``all_gather_into_tensor``) are
    silenced here: the matrix exercises those APIs on purpose, once per configuration.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return _run_batch(configs, keep_all)


def run_batch_keeping_tensors(configs: list[ParityConfig | Request]) -> list[RankRow]:
    """:func:`run_batch` with every step's full tensors travelling (tests that read them)."""
    return run_batch(configs, keep_all=True)


def _run_batch(configs: list[ParityConfig | Request], keep_all: bool) -> list[RankRow]:
    ctx = context.current()
    results = []
    for index, item in enumerate(configs):
        config = item.config if isinstance(item, Request) else item
        if config.world_size != ctx.world_size or config.backend != ctx.backend:
            raise ValueError(
                f"configuration {config.id} needs {config.backend} world size {config.world_size}, "
                f"but this batch runs on {ctx.backend} world size {ctx.world_size}"
            )
        result = run_one(item, index, keep_all=keep_all)
        failed = result.failed
        if failed and ctx.world_size > 1:
            leave_group()  # unblock peers still waiting in a collective with this rank
        if ctx.world_size > 1 and not agree(ctx, f"parity{index}", ok=not failed):
            forget()
        results.append(result)
    return results
