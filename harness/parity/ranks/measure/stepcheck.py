"""The candidate checked against its reference step by step, where the data lives (rank side).

Why here and not in the judge: a full gather of every tensor at every step, shipped to the
controller and compared there, costs memory in proportion to model size x steps on rank 0 and in
the controller, and time far beyond the training it checks. Instead each rank compares its own
pieces of the candidate (``local.py``) with the same elements of its own reference (a replicated
run: every rank holds all of it) as each step ends, and sends only distances: per tensor the
largest abs/rel/ULP distance and the mismatch count (``distance.partial``), which the judge merges
exactly (``distance.merged``).

Full tensors still travel for the two steps the known causes read (``judge/causes/``): the
*origin*, the first step whose gradients differ at all (not a step with a planted fault, nor an
overflow of the reference), and the first step where a tensor check fails. Whether a step is one
of them is agreed by all-reduces, so every rank joins the same gathers (docs/architecture.md,
section 4.5). Past the origin, a step whose gradients differ keeps only this rank's pieces of them
until its parameters are measured, and gathers them whole only if the step fails: a row that
drifts within its tolerance (a bf16 model) gathers its gradients once, not at every step. A test
that reads every step's tensors asks for ``keep_all``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from harness.parity.plan import profiles
from harness.parity.plan.config import ParityConfig, poisoned_steps
from harness.parity.ranks.measure import compared, gap, local
from harness.parity.ranks.sides import engines
from harness.parity.ranks.sides.full import reuse
from harness.parity.ranks.wire import Gap, Meta, RankStep, StepTensors, Tensors


class ReferenceSteps:
    """A reference run's steps (full tensors on every rank), served in step order: from a finished
    run (a cached reference) or from one still running, a step at a time (``live``: the run is too
    large to keep; each step is dropped once the candidate's step after it begins)."""

    def __init__(
        self, steps: list[RankStep], live: Iterator[RankStep] | None = None, *, first: int = 0
    ) -> None:
        self._steps = dict(enumerate(steps, first))
        """By step index (``first``: the index of ``steps[0]``, a resharded row's second half's)."""
        self._next = first + len(steps)
        self._live = live
        self._drops = live is not None

    def step(self, index: int) -> RankStep | None:
        if self._drops:  # before the next step is trained: one step's tensors at a time
            for old in [k for k in self._steps if k < index]:
                del self._steps[old]
        while self._live is not None and index >= self._next:
            found = next(self._live, None)
            if found is None:
                self._live = None
                break
            self._steps[self._next] = found
            self._next += 1
        return self._steps.get(index)

    def held(self, step: RankStep) -> RankStep:
        """``step`` as it may be held past the next step: a live run's step records the tensors
        its run goes on to change (``train.Run.alias``), so its parameters and optimizer state are
        copied; a finished run's are its own already."""
        if not self._drops or step.tensors is None:
            return step
        tensors = step.tensors
        state = {
            name: {k: v.clone() for k, v in values.items()} for name, values in tensors.optim_state.items()
        }
        params = {name: value.clone() for name, value in tensors.params.items()}
        return dataclasses.replace(
            step, tensors=dataclasses.replace(tensors, params=params, optim_state=state)
        )

    def finish(self) -> None:
        """Let a run still going end (it records its counters; no step is kept)."""
        if self._live is not None:
            for _ in self._live:
                pass
            self._live = None


def meta(pieces: dict[str, local.Piece]) -> Meta:
    return {name: (piece.shape, piece.dtype) for name, piece in pieces.items()}


def full_meta(tensors: Tensors) -> Meta:
    return {name: (tuple(value.shape), value.dtype) for name, value in tensors.items()}


def flat_state(state: dict[str, Tensors]) -> Tensors:
    """Optimizer state by ``name:key`` (the judge's names)."""
    return {f"{name}:{key}": value for name, values in state.items() for key, value in values.items()}


def own_buffers(buffers: Tensors, rank: int) -> Tensors:
    """This rank's buffers by the judge's names (``bn.running_mean [rank 1]``)."""
    return {f"{name} [rank {rank}]": value for name, value in buffers.items()}


def wire_step(step: RankStep, rank: int) -> RankStep:
    """A reference's step as it travels: its scalars, its tensors' names, shapes and dtypes, and
    (rank 0) its gradients' sums of squares; no tensors (see :meth:`Check.after_step` for the
    steps whose tensors do travel)."""
    shapes = {"buffer": full_meta(own_buffers(step.buffers, rank))}
    grad_squares = None
    tensors = step.tensors
    if rank == 0 and tensors is not None:
        shapes.update(
            grad=full_meta(tensors.grads),
            param=full_meta(tensors.params),
            optim_state=full_meta(flat_state(tensors.optim_state)),
        )
        grad_squares = {name: square_sum(g) for name, g in tensors.grads.items()}
    return RankStep(
        loss=step.loss,
        scale=step.scale,
        tracker=step.tracker,
        found_inf=step.found_inf,
        skipped=step.skipped,
        clip_norm=step.clip_norm,
        accumulated_in=step.accumulated_in,
        checkpoint=step.checkpoint,
        meta=shapes,
        grad_squares=grad_squares,
    )


def _tensors(step: RankStep) -> StepTensors:
    """A reference step's full tensors (every rank holds them: the reference is replicated)."""
    assert step.tensors is not None, "a reference step compared with records its full tensors"
    return step.tensors


def shares(tensors: Tensors, rank: int, world: int) -> Iterator[torch.Tensor]:
    """Rank ``rank``'s contiguous ``1/world`` of each of a replicated run's ``tensors`` (views):
    every rank holds the same bits, so whether any element overflowed is each rank's share looked
    at once and agreed in the all-reduce the flags take anyway (``compared.agreed``), not every
    element looked at on every rank."""
    for value in tensors.values():
        flat = value.reshape(-1)
        size = -(-flat.numel() // world)
        yield flat[rank * size : (rank + 1) * size]


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every element of ``tensor`` is finite, exactly. The sum first: an infinity or a NaN
    makes every partial sum it enters infinite or NaN, and no later addition (or cast) makes those
    finite again, so a finite sum means finite elements. Summing reads the tensor once and writes
    nothing, where ``isfinite().all()`` writes a mask of every element first (a 27.5M-element
    share: 8 ms against 173 ms here). A sum that is not finite (finite elements that overflow
    their dtype's range together, or any element that is not finite) is checked element by
    element."""
    if tensor.is_floating_point() and bool(tensor.sum().isfinite()):
        return True
    return bool(tensor.isfinite().all())


def square_sum(tensor: torch.Tensor) -> float:
    """The sum of ``tensor``'s squares in float64 (a norm's part), squared in the float64 copy
    itself: one copy of the tensor, not two (at 55M parameters a float64 copy is 440 MB)."""
    return float(tensor.double().square_().sum())


def squares(pieces: dict[str, local.Piece]) -> dict[str, float]:
    """Per gradient, :func:`square_sum` of this rank's elements."""
    return {name: square_sum(piece.values) for name, piece in pieces.items() if piece.values is not None}


class Check:
    """One candidate run measured against ``reference`` as it trains (``train.run``'s ``check``).

    Per step: :meth:`begin` (the reference's step), :meth:`grads` (before the optimizer step),
    :meth:`after_step` (fills the step's record). ``kept`` maps each step whose full tensors
    travel to the reference's step there."""

    def __init__(
        self,
        config: ParityConfig,
        reference: ReferenceSteps,
        *,
        twin: ReferenceSteps | None = None,
        keep_all: bool = False,
    ) -> None:
        self.twin = twin
        """The float32 twin of a mixed-precision reference: :attr:`gap` measures the distance
        between the two, step by step as the candidate trains."""
        self.gap: Gap | None = None
        self.waited_s = 0.0
        """Time spent in the reference's (and the twin's) steps run in lockstep from :meth:`begin`."""
        self.profile = profiles.profile_for(config)
        self.poisoned = poisoned_steps(config)
        self.reference = reference
        self.keep_all = keep_all
        self.kept: dict[int, RankStep] = {}
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self._origin_found = False
        self._failure_found = False
        self._ref: RankStep | None = None
        self._grads: compared.Measured = compared.Measured()
        self._grad_meta: Meta = {}
        self._squares: dict[str, float] = {}
        self._full_grads: Tensors | None = None
        self._pending: dict[str, local.Piece] | None = None
        """A step past the origin whose gradients differ: this rank's pieces of them, copied before
        the optimizer step, gathered whole only if the step turns out to be the first failing one
        (:meth:`after_step`) instead of a whole gather at every differing step."""
        self._origin = False

    def begin(self, step: int) -> None:
        self._ref = None  # let a reference compared in lockstep drop the step before
        started = time.perf_counter()
        found = self.reference.step(step)
        twin = self.twin.step(step) if self.twin is not None and found is not None else None
        self.waited_s += time.perf_counter() - started  # the reference's time, not the candidate's
        if found is None:
            raise RuntimeError(f"the reference recorded no step {step} to compare the candidate's with")
        self._ref = found
        if self.twin is not None:
            self._measure_gap(step, twin)

    def _measure_gap(self, step: int, twin: RankStep | None) -> None:
        if twin is None:  # the float32 twin failed: no expected gap
            self.twin, self.gap = None, None
            return
        ref = self._reference()
        found = gap.of_steps([(ref.loss, twin.loss, self._params(ref), self._params(twin))])
        self.gap = found if self.gap is None else gap.merge([self.gap, found])

    def _params(self, step: RankStep) -> Tensors | None:
        """A full step's parameters, where this rank measures them (rank 0)."""
        return _tensors(step).params if self.rank == 0 else None

    def _reference(self) -> RankStep:
        assert self._ref is not None, "begin() came first"
        return self._ref

    def grads(self, step: int, engine: engines.Engine, scale: float | None) -> None:
        """Measure this rank's gradients as the optimizer will receive them (``scale``: still
        scaled by it); gather them whole when this step may be one whose tensors travel. One
        all-reduce agrees which gradients exist on any rank and whether any rank's differ, fail
        or (the reference's) overflow."""
        pieces, held = local.grads(engine, scale)
        reference = _tensors(self._reference()).grads
        finite = all(all_finite(share) for share in shares(reference, self.rank, self.world))
        kept, (overflow,) = compared.agreed(
            compared.compare_each(reference, pieces, self.profile), held, [not finite], engine.device
        )
        self._grads = compared.merged(kept, set(reference))
        pieces = {name: pieces[name] for name in pieces if name in kept}
        self._grad_meta = meta(pieces)
        self._squares = squares(pieces)
        poisoned = step in self.poisoned
        differ, fail = self._grads.differ, self._grads.fail
        self._grads.fail = fail and not poisoned
        self._origin = not self._origin_found and differ and not overflow and not poisoned
        wanted = self.keep_all or (differ and not poisoned and not self._failure_found)
        self._full_grads, self._pending = None, None
        if wanted and (self.keep_all or not self._origin_found):  # they travel: gathered now
            full = engine.full_grads(copy=scale in (None, 1))  # collective; only rank 0's travels
            if self.rank == 0:
                self._full_grads = full if scale is None else unscaled(full, scale)
        elif wanted:  # they travel only if this step is the first to fail: gathered then, if so
            self._pending = {name: _copied(piece) for name, piece in pieces.items()}

    def after_step(
        self,
        step: int,
        engine: engines.Engine,
        optimizers: list[torch.optim.Optimizer],
        record: RankStep,
    ) -> RankStep:
        """Measure parameters, optimizer state and this rank's buffers: ``record`` with the
        distances, the tensors' names, shapes and dtypes and, on a kept step, the full tensors."""
        params, state, state_held = local.params_and_state(engine, optimizers)
        reference = self._reference()
        ref = _tensors(reference)
        ref_state = flat_state(ref.optim_state)
        measured = {"grad": self._grads, "param": compared.compare(ref.params, params, self.profile)}
        buffers = own_buffers(engine.own_buffers(), self.rank)
        own = {name: local.Piece(tuple(v.shape), v.dtype, 0, v.reshape(-1)) for name, v in buffers.items()}
        measured["buffer"] = compared.compare(
            own_buffers(reference.buffers, self.rank), own, self.profile, align=True
        )
        local_fail = measured["param"].fail or measured["buffer"].fail or self._grads.fail
        each = compared.compare_each(ref_state, state, self.profile)
        if state_held is None:  # every rank measures the same state names (``local.params_and_state``)
            measured["optim_state"] = compared.merged(each, set(ref_state))
            (failed,) = compared.any_rank([local_fail or measured["optim_state"].fail], engine.device)
        else:  # one all-reduce: which state exists on any rank, and any rank's failure
            kept, (any_failed,) = compared.agreed(each, state_held, [local_fail], engine.device)
            measured["optim_state"] = compared.merged(kept, set(ref_state))
            state = {name: state[name] for name in state if name in kept}
            failed = any_failed or measured["optim_state"].fail
        measured = {kind: measured[kind] for kind in ("grad", "param", "optim_state", "buffer")}
        keep = self.keep_all or self._origin or (failed and not self._failure_found)
        self._origin_found |= self._origin
        self._failure_found |= failed
        shapes = {"buffer": meta(own)}
        if self.rank == 0:
            shapes.update({"grad": self._grad_meta, "param": meta(params), "optim_state": meta(state)})
        record = dataclasses.replace(
            record,
            diffs={kind: m.partials for kind, m in measured.items()},
            meta=shapes,
            grad_squares=self._squares,
        )
        if not keep:
            self._pending = None
            return record
        full_params, full_state = engine.full_after_step(optimizers)  # collective: agreed above
        if self._pending is not None:  # on every rank alike: agreed in grads()
            self._full_grads = whole_on_rank_zero(self._pending, self.rank)  # collective
            self._pending = None
        if self.rank != 0:  # only rank 0's full tensors travel (``entry.with_kept``)
            self.kept[step] = _untensored(reference)
            return record
        held = self.kept[step] = self.reference.held(reference)
        ref = _tensors(held)
        grads = self._full_grads
        if grads is None:  # bitwise equal to the reference's (or not compared: a planted fault)
            grads = {} if step in self.poisoned else ref.grads
        tensors = StepTensors(params=full_params, grads=grads, optim_state=full_state)
        reuse.share_tensors(ref, tensors)
        record = dataclasses.replace(record, tensors=tensors)
        return record


def _copied(piece: local.Piece) -> local.Piece:
    """``piece`` with its values copied to the CPU (they are the live gradients' own)."""
    if piece.values is None:
        return piece
    return dataclasses.replace(piece, values=piece.values.detach().to("cpu", copy=True))


def whole_on_rank_zero(pieces: dict[str, local.Piece], rank: int) -> Tensors | None:
    """Every rank's ``pieces`` (each element compared by one rank: ``local.py``) as whole tensors
    on rank 0, ``None`` elsewhere; a collective of every rank (one ``gather_object``)."""
    mine = [(name, piece.start, piece.values) for name, piece in pieces.items() if piece.values is not None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        every: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(mine, every, dst=0)
    else:
        every = [mine]
    if rank != 0 or every is None:
        return None
    whole = {name: torch.zeros(piece.shape, dtype=piece.dtype) for name, piece in pieces.items()}
    for sent in every:
        for name, start, values in sent:
            whole[name].view(-1)[start : start + values.numel()] = values
    return whole


def _untensored(step: RankStep) -> RankStep:
    """A kept step where only its scalars are read (a rank other than 0: ``entry.with_kept``)."""
    return dataclasses.replace(step, tensors=None)


def unscaled(grads: Tensors, scale: float) -> Tensors:
    """Still-scaled gradients divided by the scale (``local.divided``: exact for a power of two),
    in their own dtype. ``grads`` (a gather of the caller's own) is emptied as it goes, each scaled
    tensor let go as its unscaled one is made: one model's gradients at a time, not two."""
    if scale == 1:
        return {name: grads.pop(name) for name in list(grads)}
    return {name: local.divided(grads.pop(name), scale) for name in list(grads)}
