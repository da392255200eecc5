"""What one training run recorded, step by step: every rank's part, merged on the controller.

Why two shapes: every rank records its own scalars (loss, scale, growth tracker, found_inf, skip
decisions) and its own distances from the reference (``stepcheck.py``: each rank compares its
pieces of the candidate where they live), so the ranks send :func:`rank_run` records
(``wire.RankRun``, of ``wire.RankStep``: what crosses the process boundary) and the controller
merges them into one :class:`RunRecord` per run with :func:`merge_rank_runs`: the
distances of each tensor's pieces into one :class:`~harness.parity.ranks.measure.distance.TensorDiff`, the
gradients' sums of squares into one norm. Full tensors travel for the few steps the known causes
read (rank 0; ``StepRecord.params`` and the others are empty elsewhere). Records are keyed by
(step, rank), never by arrival order; tensors are on the CPU in their own dtype.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from harness.parity.ranks.measure.distance import TensorDiff, merged
from harness.parity.ranks.wire import (
    FunctionFacts,
    Meta,
    Partial,
    RankRun,
    RankStep,
    ResumeAudit,
    StepTensors,
    Tensors,
)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StepRecord:
    """One optimizer iteration (``scale -> backward -> [unscale_] -> step -> update``)."""

    step: int
    losses: tuple[float, ...]
    """The unscaled loss, by rank."""
    scales: tuple[float, ...]
    """The scale after ``update()``, by rank."""
    trackers: tuple[int, ...]
    """The growth tracker after ``update()``, by rank."""
    found_inf: tuple[tuple[float, ...], ...]
    """By rank, by optimizer: the found_inf the scaler held after ``step()`` (before ``update()``)."""
    skipped: tuple[tuple[bool | None, ...], ...]
    """By rank, by optimizer: whether ``step()`` left the rank's parameters bitwise unchanged;
    ``None`` where the rank holds no element of that optimizer's parameters (an empty shard)."""
    params: Tensors
    """Full parameters after the step, by name (gathered on rank 0)."""
    grads: Tensors
    """Full gradients as the optimizer received them, unscaled (and clipped on ``unscale_clip``)."""
    optim_state: dict[str, Tensors]
    """Full optimizer state after the step, by parameter name then state key."""
    buffers: tuple[Tensors, ...] = ()
    """By rank, each rank's own module buffers after the step, by name (buffers are replicated,
    never sharded, and DDP broadcasts rank 0's while FSDP does not, so each rank's count)."""
    meta: dict[str, Meta] | None = None
    """By kind (``grad``, ``param``, ``optim_state``, ``buffer``), each tensor's full shape and
    dtype by the judge's name (``w:exp_avg``, ``bn.running_mean [rank 1]``); ``None``: read them
    off the tensors (a record made whole, as the unit tests make them)."""
    diffs: dict[str, dict[str, TensorDiff]] | None = None
    """The candidate's distance from the reference by kind and name, measured on the ranks
    (``None``: measure the full tensors)."""
    grad_norm: float | None = None
    """The 2-norm of the recorded gradients, from the ranks' sums of squares (``None``: from
    :attr:`grads`)."""
    clip_norms: tuple[float, ...] = ()
    """By rank, the total norm ``clip_grad_norm_`` returned (path ``unscale_clip``; empty: the
    run did not clip). Each rank's own: a clip that used its partial norm shows here."""
    accumulated_in: str | None = None
    """The dtype the run summed its unreduced microbatch gradients in (``accumulate > 1`` with
    ``sync="last"``: ``bfloat16``, ``float32``), as rank 0 said; ``None``: it did not."""
    checkpoint: str | None = None
    """How the run recomputed its checkpointed units: ``replay`` (the RNG state replayed),
    ``no_replay``; ``None``: it did not checkpoint."""
    compiled: str | None = None
    """What of the run's model ran compiled, as rank 0 read it off the modules (``3 modules,
    inductor``); ``None``: nothing did (``sides/compiled.py``)."""
    resume: tuple[ResumeAudit | None, ...] = ()
    """By rank, from a resume row's resumed step on: the audit ``ranks/restart/resume.py``
    recorded (:class:`~harness.parity.ranks.wire.ResumeAudit`); empty on every other step."""

    def skipped_anywhere(self) -> bool:
        return any(flag for flags in self.skipped for flag in flags)

    def shapes(self, kind: str) -> Meta:
        """:attr:`meta` of ``kind``, or read off the full tensors."""
        if self.meta is not None and kind in self.meta:
            return self.meta[kind]
        return {name: (tuple(value.shape), value.dtype) for name, value in self.tensors(kind).items()}

    def tensors(self, kind: str) -> Tensors:
        """The full tensors of ``kind`` by the judge's names (empty where none travelled)."""
        if kind == "param":
            return self.params
        if kind == "grad":
            return self.grads
        if kind == "buffer":
            return {
                f"{name} [rank {rank}]": value
                for rank, own in enumerate(self.buffers)
                for name, value in own.items()
            }
        return {
            f"{name}:{key}": value for name, state in self.optim_state.items() for key, value in state.items()
        }


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RunRecord:
    """One run (the reference or the candidate) of one configuration."""

    role: str
    """``reference`` or ``candidate``."""
    description: str
    """What ran, in words (``DDP, fp16 working copy with float32 master weights``)."""
    steps: tuple[StepRecord, ...]
    counters: tuple[dict[str, int], ...] = ()
    """By rank, after the last step: the scaler's ``steps``/``skipped_steps``/``growths``/``backoffs``
    (empty dicts for a scaler without counters)."""
    error: str | None = None
    """The failure text when the run raised on some rank (``[rank N]``-prefixed); steps stop there."""
    duration_s: float = 0.0
    compile_s: float | None = None
    """What compiling cost the run (``config.compile``): its first step's time beyond the median
    of the others, on its slowest rank; ``None``: it compiled nothing."""
    facts: FunctionFacts | None = None
    """A user's function: what was read off its modules (``wire.FunctionFacts``)."""

    def to_wire(self) -> dict[str, Any]:
        """Plain dicts, lists and tensors (what pickle and the JSON-free archive carry)."""
        wire = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "steps"}
        wire["steps"] = [dataclasses.asdict(step) for step in self.steps]
        return wire

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> RunRecord:
        data = dict(wire)
        data["steps"] = tuple(_step_from_dict(step) for step in data["steps"])
        data["counters"] = tuple(data.get("counters", ()))
        return cls(**data)


def _step_from_dict(data: dict[str, Any]) -> StepRecord:
    return StepRecord(
        step=data["step"],
        losses=tuple(data["losses"]),
        scales=tuple(data["scales"]),
        trackers=tuple(data["trackers"]),
        found_inf=tuple(tuple(flags) for flags in data["found_inf"]),
        skipped=tuple(tuple(flags) for flags in data["skipped"]),
        params=dict(data["params"]),
        grads=dict(data["grads"]),
        optim_state={name: dict(state) for name, state in data["optim_state"].items()},
        buffers=tuple(dict(own) for own in data.get("buffers", ())),
        meta=data.get("meta"),
        diffs=_diffs_from_wire(data.get("diffs")),
        grad_norm=data.get("grad_norm"),
        clip_norms=tuple(data.get("clip_norms", ())),
        accumulated_in=data.get("accumulated_in"),
        checkpoint=data.get("checkpoint"),
        compiled=data.get("compiled"),
        resume=tuple(_audit_from_wire(audit) for audit in data.get("resume", ())),
    )


def _audit_from_wire(audit: Any) -> ResumeAudit | None:
    """A resume audit as :meth:`RunRecord.to_wire` left it (``dataclasses.asdict`` makes it a dict)."""
    if audit is None or isinstance(audit, ResumeAudit):
        return audit
    return ResumeAudit(**audit)


def _diffs_from_wire(diffs: Any) -> dict[str, dict[str, TensorDiff]] | None:
    if diffs is None:
        return None
    return {
        kind: {name: d if isinstance(d, TensorDiff) else TensorDiff(**d) for name, d in by_name.items()}
        for kind, by_name in diffs.items()
    }


def rank_step(
    *,
    loss: float,
    scale: float,
    tracker: int,
    found_inf: list[float],
    skipped: list[bool | None],
    tensors: StepTensors | None,
    buffers: Tensors | None = None,
    clip_norm: float | None = None,
    accumulated_in: str | None = None,
    checkpoint: str | None = None,
    compiled: str | None = None,
) -> RankStep:
    """One rank's part of one step; ``tensors`` on rank 0 only, ``buffers`` (this rank's own) on
    every rank; ``clip_norm``: what this rank's ``clip_grad_norm_`` returned (``None``: no clip);
    ``accumulated_in``: the dtype unreduced microbatch gradients were summed in (``None``: none
    were); ``checkpoint``: how checkpointed units were recomputed (``None``: none were);
    ``compiled``: what ran compiled (``None``: nothing)."""
    return RankStep(
        loss=loss,
        scale=scale,
        tracker=tracker,
        found_inf=tuple(found_inf),
        skipped=tuple(skipped),
        tensors=tensors,
        buffers=buffers or {},
        clip_norm=clip_norm,
        accumulated_in=accumulated_in,
        checkpoint=checkpoint,
        compiled=compiled,
    )


def rank_run(
    *,
    rank: int,
    steps: list[RankStep],
    counters: dict[str, int],
    error: str | None,
    duration_s: float,
    compile_s: float | None = None,
    facts: FunctionFacts | None = None,
) -> RankRun:
    """One rank's part of one run, as sent to the controller."""
    return RankRun(
        rank=rank,
        steps=tuple(steps),
        counters=counters,
        error=error,
        duration_s=duration_s,
        compile_s=compile_s,
        facts=facts,
    )


def merge_rank_runs(role: str, description: str, parts: list[RankRun], *, first_step: int = 0) -> RunRecord:
    """One :class:`RunRecord` from every rank's :func:`rank_run`; steps end where the first rank
    stopped (``first_step``: the index of the parts' first step, a resharded row's second half's)."""
    parts = sorted(parts, key=lambda part: part.rank)
    ranks = [part.rank for part in parts]
    assert ranks == list(range(len(parts))), f"expected one part per rank, got ranks {ranks}"
    errors = [part.error for part in parts if part.error]
    count = min(len(part.steps) for part in parts)
    steps = []
    for index in range(first_step, first_step + count):
        per_rank = [part.steps[index - first_step] for part in parts]
        tensors = per_rank[0].tensors
        steps.append(
            StepRecord(
                step=index,
                losses=tuple(s.loss for s in per_rank),
                scales=tuple(s.scale for s in per_rank),
                trackers=tuple(s.tracker for s in per_rank),
                found_inf=tuple(tuple(s.found_inf) for s in per_rank),
                skipped=tuple(tuple(s.skipped) for s in per_rank),
                params=tensors.params if tensors is not None else {},
                grads=tensors.grads if tensors is not None else {},
                optim_state=tensors.optim_state if tensors is not None else {},
                buffers=tuple(s.buffers for s in per_rank) if per_rank[0].buffers else (),
                meta=_merged_meta(per_rank),
                diffs=_merged_diffs(index, per_rank),
                grad_norm=_grad_norm(per_rank),
                clip_norms=_clip_norms(per_rank),
                accumulated_in=per_rank[0].accumulated_in,
                checkpoint=per_rank[0].checkpoint,
                compiled=per_rank[0].compiled,
                resume=tuple(s.resume for s in per_rank) if any(s.resume for s in per_rank) else (),
            )
        )
    return RunRecord(
        role=role,
        description=description,
        steps=tuple(steps),
        counters=tuple(part.counters for part in parts),
        error="\n".join(errors) if errors else None,
        duration_s=max(part.duration_s for part in parts),
        compile_s=max((p.compile_s for p in parts if p.compile_s is not None), default=None),
        facts=parts[0].facts,
    )


def joined(first: RunRecord, second: RunRecord, description: str) -> RunRecord:
    """One run from a resharded row's two halves (each merged from its own world size's ranks):
    the steps of both, the counters of the second (the run's end), the first error."""
    return RunRecord(
        role=first.role,
        description=description,
        steps=first.steps + second.steps,
        counters=second.counters,
        error=first.error or second.error,
        duration_s=first.duration_s + second.duration_s,
    )


def _merged_meta(per_rank: list[RankStep]) -> dict[str, Meta] | None:
    """Rank 0's names, shapes and dtypes (every rank states all of them), and each rank's buffers'."""
    first = per_rank[0].meta
    if first is None:
        return None
    meta = {kind: dict(found) for kind, found in first.items() if kind != "buffer"}
    meta["buffer"] = {name: m for s in per_rank for name, m in (s.meta or {}).get("buffer", {}).items()}
    return meta


def _merged_diffs(step: int, per_rank: list[RankStep]) -> dict[str, dict[str, TensorDiff]] | None:
    """Each tensor's distance from its pieces' on every rank (``distance.merged``)."""
    if all(s.diffs is None for s in per_rank):
        return None
    pieces: dict[str, dict[str, list[Partial]]] = {}
    for s in per_rank:
        for kind, by_name in (s.diffs or {}).items():
            for name, part in by_name.items():
                pieces.setdefault(kind, {}).setdefault(name, []).append(part)
    return {
        kind: {name: merged(parts, step=step, kind=kind, name=name) for name, parts in by_name.items()}
        for kind, by_name in pieces.items()
    }


def _grad_norm(per_rank: list[RankStep]) -> float | None:
    """The 2-norm from every rank's sums of squares, tensor by tensor in rank 0's order."""
    if all(s.grad_squares is None for s in per_rank):
        return None
    names = list((per_rank[0].meta or {}).get("grad") or per_rank[0].grad_squares or {})
    total = 0.0
    for name in names:
        total += sum((s.grad_squares or {}).get(name, 0.0) for s in per_rank)
    return math.sqrt(total) if math.isfinite(total) else total


def _clip_norms(per_rank: list[RankStep]) -> tuple[float, ...]:
    """Each rank's clip norm, or none when no rank clipped."""
    norms = [s.clip_norm for s in per_rank]
    if all(norm is None for norm in norms):
        return ()
    return tuple(float("nan") if norm is None else float(norm) for norm in norms)
