"""The staged check, rank side: every step judged from a common state, stage by stage.

Why: a straight-through comparison is a proof only where both sides sum every element in the
same order (gloo, the reference reducing through the candidate's layout: ``reduce_layout.py``).
A candidate that reduces in another order (NCCL's algorithms, a custom reduce-scatter, a bucket
grouped otherwise) is a last bit away after step 0, and the bits compound. Here the reference is
*anchored* (``sides/anchor.py``): each step both sides start from the candidate's parameters,
optimizer state, buffers and scale, and the step is checked in the order it runs:

1. **local gradients**: each rank's gradients as they enter the candidate's reduction
   (``sides/capture.py``) against the reference's own on that rank, bitwise; and each rank's
   loss. A module that runs otherwise when wrapped, a cast, a dtype: a compute mismatch.
2. **the reduction**: every element of the candidate's reduced gradient within the order-free
   bound of the exact mean of the ranks' local gradients (``measure/bound.py``): true for every
   order, world size and backend, and still broken by a wrong divide factor, a missing rank, a
   wrong scale or a reduction in a lower dtype.
3. **the update**: the reference adopts the candidate's reduced gradients (and, on path
   ``unscale_clip``, clips them by the candidate's own total norm, itself checked against the
   reference's measure of the same gradients), steps its optimizer and scaler, and the two
   parameter sets, optimizer states, scales and each rank's buffers are compared, bitwise (a
   fused optimizer's too: the reference steps the candidate's shards, ``sides/optim/step_pieces.py``).

The runner asks for it (``STAGED_TARGET``) only for rows whose straight comparison was not
bitwise, so a bitwise matrix costs nothing more. Rows it cannot judge (a resume, a sparse
workload, a DDP candidate: its reducer runs in C++) are never sent. Accumulation with
``sync="last"`` reduces once per step, the sum of the microbatches' unreduced gradients: those
sums are the local gradients compared and bounded; with ``sync="every"`` each microbatch is
reduced, and each microbatch's local gradients are compared, the sum of the reductions bounded
(``bound.check_sum``).

Import target for the pool: ``harness.parity.ranks.staged:run_batch``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import traceback
import warnings
from collections.abc import Iterator

import torch
import torch.distributed as dist

from harness.failure_text import prefix_lines
from harness.parity.plan.config import ParityConfig, poisoned_steps
from harness.parity.ranks import entry, train
from harness.parity.ranks.drift import reordering_drift
from harness.parity.ranks.measure import bound, ulp
from harness.parity.ranks.sides import (
    accumulate,
    anchor,
    capture,
    checkpoint,
    compiled,
    engines,
    loop_state,
    roles,
)
from harness.parity.ranks.sides.full import gather
from harness.parity.ranks.sides.twin import DTYPES
from harness.parity.ranks.wire import Bounded, Compared, StagedRun, StagedStep
from harness.rank import context
from harness.rank.subtests import agree, leave_group


class _Side:
    """One side's engine, optimizers, scaler and schedulers."""

    def __init__(self, config: ParityConfig, role: str, device: torch.device) -> None:
        self.engine = roles.build(config, role, device)
        checkpoint.install(self.engine, config, role)
        compiled.install(self.engine, config, role)
        self.groups = self.engine.param_groups(2 if config.loop.path == "two_optimizers" else 1)
        self.optimizers = [self.engine.make_optimizer(group) for group in self.groups]
        self.scaler = train.make_scaler(config, role, device)
        self.loop = loop_state.LoopState(config, device)
        self.loop.start(self.engine, self.optimizers)
        self.config, self.role = config, role
        self.hand = None
        self.unreduced: dict[str, list[torch.Tensor]] = {}
        """The reference's local gradients as its hand accumulation reduces them: each microbatch's
        (``sync="every"``), or their unreduced sum once (``sync="last"``)."""
        self._names = [gather.clean_name(n) for n, _ in self.engine.trained_module().named_parameters()]
        if config.loop.accumulate > 1 and role == "reference":
            self.hand = accumulate.HandAccumulation(config, self.engine, on_reduce=self._record_unreduced)

    def _record_unreduced(self, grads: list[torch.Tensor | None]) -> None:
        """Keep a copy of what the hand accumulation hands to its reduction (its local gradients)."""
        for name, grad in zip(self._names, grads, strict=True):
            if grad is not None:
                self.unreduced.setdefault(name, []).append(grad.detach().clone())

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def backward(self, step: int, scale: float) -> float:
        """Forward and scaled backward (every microbatch, accumulated as the row says), then the
        candidate's reduction; the reference's stays for the caller (:func:`_step`)."""
        self.unreduced = {}
        if self.config.loop.accumulate > 1:
            return accumulate.forward_backward(
                self.engine, self.role, self.config, step, self.scaler, self.hand
            )
        loss, recorded = self.engine.losses(step, scale)
        self.scaler.scale(loss).backward()
        return recorded

    def unscale_and_prepare(self, config: ParityConfig) -> bool:
        """``unscale_`` where the loop unscales first (path ``unscale_clip``, or the engine asks);
        whether it did."""
        unscaled = config.loop.path == "unscale_clip" or self.engine.unscales_first
        if unscaled:
            for opt in self.optimizers:
                self.scaler.unscale_(opt)
            self.engine.before_step()
        return unscaled

    def step(self) -> None:
        for opt in self.optimizers:
            self.scaler.step(opt)
        self.scaler.update()
        self.loop.after_update()


def _compared(want: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> dict[str, Compared]:
    """Per name in either, the two tensors compared elementwise (a name on one side only: every
    element differs, ``inf`` ulp)."""
    out: dict[str, Compared] = {}
    for name in sorted(set(want) | set(got)):
        a, b = want.get(name), got.get(name)
        if a is None or b is None or tuple(a.shape) != tuple(b.shape):
            size = (a if a is not None else b).numel()  # type: ignore[union-attr]
            out[name] = Compared(elements=size, differing=size, max_ulp=float("inf"))
            continue
        if ulp.same_bits(a, b):  # the common case of an anchored step: nothing to measure
            out[name] = Compared(elements=a.numel(), differing=0, max_ulp=0.0)
            continue
        apart = ulp.distances(a, b)
        out[name] = Compared(
            elements=a.numel(),
            differing=int((apart > 0).sum()),
            max_ulp=float(apart.max()) if a.numel() else 0.0,
        )
    return out


def _prefixed(kind: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"{kind}:{name}": value for name, value in tensors.items()}


def _flat_state(state: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {f"{name}:{key}": value for name, values in state.items() for key, value in values.items()}


def _reduce_dtype(config: ParityConfig, engine: engines.Engine, name: str) -> torch.dtype:
    """The dtype the candidate sums ``name``'s gradient over its ranks in (configured, or read:
    the user's unit's)."""
    if engine.units_reduce_dtypes is not None and name in engine.units_reduce_dtypes:
        return engine.units_reduce_dtypes[name]
    if config.policy is None:
        return torch.float32
    return DTYPES[config.policy.reduce_dtype]


def _step(config: ParityConfig, step: int, cand: _Side, ref: _Side, poisoned: bool) -> StagedStep:
    rank = dist.get_rank()
    scale = cand.scaler.get_scale()
    cand.zero_grad()
    ref.zero_grad()
    with capture.local_grads(cand.engine) as cand_local:
        cand_loss = cand.backward(step, scale)
        cand.engine.after_backward()
    for fault in train.faults_now(config, "candidate", step, rank):
        train.poison(cand.engine, cand.groups[fault.optimizer], fault)
    reduced = cand.engine.full_grads()  # collective, on every rank; still scaled
    ref_loss = ref.backward(step, scale)
    if ref.hand is not None:  # reduced by its hand accumulation already
        ref_local = ref.unreduced
    else:
        ref_local = {name: [grad] for name, grad in anchor.local_grads(ref.engine).items()}
        ref.engine.after_backward()  # its own mirrored reduction: kept to say whether the order differed
    mirrored = ref.engine.full_grads()
    # Never entering a reduction is the reduction stage's fact (their reduced gradients are each
    # rank's own there), not a local difference: compared where the candidate reduces.
    never = cand.engine.facts.never_reduced if cand.engine.facts is not None else ()
    entering = {n: g for n, g in ref_local.items() if n not in never}
    local = None if cand_local is None else _compared(_stacked(entering), _stacked(cand_local))
    names = sorted(reduced)
    reductions = config.loop.accumulate if config.loop.accumulate > 1 and config.loop.sync == "every" else 1
    means = [  # collectives: every rank, the same number of them
        bound.exact_means({n: v[k] for n, v in ref_local.items() if len(v) > k}, names, cand.engine.device)
        for k in range(reductions)
    ]
    reduction: dict[str, Bounded] = {}
    reduction_names: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    reordered = 0
    if rank == 0:
        world = dist.get_world_size()
        reduction = {
            name: _checked(
                bound.check_sum(
                    reduced[name], [m[name] for m in means], world, _reduce_dtype(config, cand.engine, name)
                )
            )
            for name in names
            if not poisoned
        }
        reduction_names = (
            tuple(sorted(set(mirrored) - set(reduced))),
            tuple(sorted(set(reduced) - set(mirrored))),
        )
        reordered = sum(v.differing for v in _compared(mirrored, reduced).values())
    anchor.adopt_grads(ref.engine, reduced)
    del reduced, mirrored, means, ref_local, cand_local
    cand_unscaled = cand.unscale_and_prepare(config)
    ref.unscale_and_prepare(config)
    clip = None
    if config.loop.path == "unscale_clip" and cand_unscaled:
        own = anchor.total_norm(ref.engine)  # the reference's measure of the same gradients
        cand_norm = cand.engine.clip_grad_norm_(config.loop.clip)  # collective
        anchor.clip_with_norm(ref.engine, config.loop.clip, cand_norm)
        clip = (cand_norm, own)
    cand.step()
    ref.step()
    return StagedStep(
        loss=(cand_loss, ref_loss),
        local=local,
        poisoned=poisoned,
        reduction=reduction,
        reduction_names=reduction_names,
        reordered=reordered,
        clip=clip,
        scale=(cand.scaler.get_scale(), ref.scaler.get_scale()),
        tracker=(int(cand.scaler._get_growth_tracker()), int(ref.scaler._get_growth_tracker())),
    )


def _stacked(grads: dict[str, list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Each name's gradients, one per reduction, as one tensor (a count that differs shows)."""
    return {name: torch.stack(values) for name, values in grads.items()}


def _checked(found: bound.Checked) -> Bounded:
    return Bounded(elements=found.elements, violations=found.violations, worst_ratio=found.worst_ratio)


def _update(cand: _Side, ref: _Side, found: StagedStep) -> StagedStep:
    """Stage 3, then the anchor for the next step: the candidate's full state into the reference;
    ``found`` with the update's and the buffers' comparisons."""
    held = anchor.candidate_state(cand.engine, cand.optimizers)  # collective
    params, state, buffers = held
    own = _compared(ref.engine.own_buffers(), buffers)  # this rank's own (never sharded)
    update: dict[str, Compared] = {}
    if dist.get_rank() == 0:
        ref_params, ref_state = ref.engine.full_after_step(ref.optimizers)
        want = {**_prefixed("param", ref_params), **_prefixed("optim_state", _flat_state(ref_state))}
        got = {**_prefixed("param", params), **_prefixed("optim_state", _flat_state(state))}
        update = _compared(want, got)
    anchor.hold(ref.engine, ref.optimizers, ref.scaler, held, cand.scaler)
    return dataclasses.replace(found, buffers=own, update=update)


@contextlib.contextmanager
def deterministic(device: torch.device) -> Iterator[None]:
    """On a GPU, both sides under ``torch.use_deterministic_algorithms(True)`` (cuBLAS with a
    fixed workspace, ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` unless set): the local stage's premise,
    that the same computation from the same state gives the same bits, holds only then, and an op
    without a deterministic kernel raises naming itself, which the check records. On the CPU its
    kernels already are; nothing changes. Restored afterwards."""
    if device.type != "cuda":
        yield
        return
    before = torch.are_deterministic_algorithms_enabled()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def run_one(config: ParityConfig, drift: bool = False) -> StagedRun:
    """The staged check of ``config`` on this rank: one record per step (module docstring); never
    raises (an error is recorded, prefixed with the rank). ``drift``: also the drift a reordering
    alone produces (``drift.py``; two more reference runs)."""
    device = context.current().device
    rank = dist.get_rank()
    steps: list[StagedStep] = []
    error = None
    reordering: tuple[float, ...] | None = None
    started = time.perf_counter()
    try:
        with deterministic(device):
            steps, reordering = _run(config, device, drift)
    except Exception:  # noqa: BLE001 - recorded; the controller reads it
        error = prefix_lines(traceback.format_exc(), rank)
    return StagedRun(
        id=config.id,
        rank=rank,
        steps=tuple(steps),
        error=error,
        drift=reordering,
        duration_s=time.perf_counter() - started,
    )


def _run(
    config: ParityConfig, device: torch.device, drift: bool
) -> tuple[list[StagedStep], tuple[float, ...] | None]:
    """Both sides in lockstep, every step: the steps' records (and the drift, if asked)."""
    steps: list[StagedStep] = []
    poisoned = poisoned_steps(config)
    cand = _Side(config, "candidate", device)
    if (refused := cand.engine.staged_refusal()) is not None:
        raise ValueError(refused)
    ref = _Side(config, "reference", device)
    anchor.load_scaler(ref.scaler, cand.scaler)
    for step in range(config.steps):
        found = _step(config, step, cand, ref, step in poisoned)
        steps.append(_update(cand, ref, found))
        context.heartbeat()
    return steps, (reordering_drift(config, device) if drift else None)


def run_batch(requests: list[tuple[ParityConfig, bool]]) -> list[StagedRun]:
    """:func:`run_one` for each ``(configuration, drift)`` in order, isolated as
    ``entry.run_batch`` isolates them (a rank that failed leaves the group; the ranks agree; the
    group is re-created)."""
    ctx = context.current()
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for index, (config, drift) in enumerate(requests):
            found = run_one(config, drift)
            if found.error and ctx.world_size > 1:
                leave_group()
            if ctx.world_size > 1 and not agree(ctx, f"staged{index}", ok=not found.error):
                entry.forget()
            results.append(found)
    return results
