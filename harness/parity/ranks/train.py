"""One training run on this rank (rank side): the loop every engine shares, a step at a time.

Each step::

    zero_grad -> loss -> scaler.scale(loss).backward() -> engine.after_backward()
                     (``accumulate > 1``: every microbatch's, ``accumulate.py``)
    -> planned faults -> [unscale_ each optimizer, engine.before_step(), clip_grad_norm_]
       (path "unscale_clip" at ``config.loop.clip``, its norm recorded; the first two for some engines)
    -> the unscaled gradients (recorded whole, or measured where they live) -> scaler.step(each
       optimizer) -> scaler.update() -> loss, scale, tracker, found_inf, skip decisions, then the
       parameters and optimizer state (recorded whole, or measured: ``stepcheck.Check``)

LR schedulers step after every update, and a resume row's forward RNG runs on from step to step
(``sides/loop_state.LoopState``, every run's). A resume row's candidate saves, drops everything and
loads into a fresh engine before step ``config.resume.at`` (``resume.Restart``, built only for the
runs that need it). A resharded row runs as two halves (``half``: one rank call at each world
size, ``reshard.py``): the first trains up to ``resume_at`` and saves, the second builds afresh,
loads and trains on.

The units' activations are checkpointed on both sides when ``config.loop.checkpoint`` says so
(``checkpoint.install``), the model compiled when ``config.compile`` says so (``compiled.install``:
``compile_s`` is what its first step took beyond the median of the others), and the losses and
backward run under ``loss_parallel()`` when the workload's training does (``tp/mirror.py``).

A run never raises: a failure is recorded as the run's ``error`` (prefixed ``[rank N]``) with the
steps before it, so a candidate that crashes (torch's scaler on some paths) still gets a row.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist

from harness.failure_text import prefix_lines
from harness.parity.plan.config import Fault, ParityConfig
from harness.parity.ranks.measure import record, stepcheck
from harness.parity.ranks.restart import reshard, resume
from harness.parity.ranks.sides import accumulate, checkpoint, compiled, engines, loop_state, roles
from harness.parity.ranks.sides.tp import mirror as tp_mirror
from harness.parity.ranks.wire import RankRun, RankStep, StepTensors
from harness.rank import context


def make_scaler(config: ParityConfig, role: str, device: torch.device) -> Any:
    """The candidate's scaler (``config.scale.scaler``); a DDP reference's is ``torch.amp.GradScaler``."""
    kwargs = {"init_scale": config.scale.init_scale, "growth_interval": config.scale.growth_interval}
    if role == "reference" and config.reference == "ddp":
        return torch.amp.GradScaler(device.type, **kwargs)
    if config.scale.scaler == "torch":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchShardedGradScaler

        # Its default ``process_group=dist.group.WORLD`` is evaluated when torch imports the module:
        # on a warm rank whose default group was re-created since, it would reduce over the
        # destroyed group and hang. Pass the current one, as a user re-creating groups must.
        return TorchShardedGradScaler(device=device.type, process_group=dist.group.WORLD, **kwargs)
    from scaler import ShardedGradScaler

    return ShardedGradScaler(device.type, **kwargs)


def _counters(scaler: Any) -> dict[str, int]:
    if not hasattr(scaler, "skipped_steps"):
        return {}
    return {
        "steps": scaler.steps,
        "skipped_steps": scaler.skipped_steps,
        "growths": scaler.growths,
        "backoffs": scaler.backoffs,
    }


def poison(engine: engines.Engine, params: list[torch.Tensor], fault: Fault) -> None:
    """Write the fault's value into element 0 of this rank's largest local gradient of ``params``."""
    local = [engine.local(p.grad) for p in params if p.grad is not None]
    local = [g._values() if g.is_sparse else g for g in local]
    target = max(local, key=lambda g: g.numel(), default=None)
    if target is None or target.numel() == 0:
        raise RuntimeError(f"fault {fault.id}: rank {engine.rank} holds no gradient element to poison")
    with torch.no_grad():
        target.view(-1)[0] = float(fault.value)


def faults_now(config: ParityConfig, role: str, step: int, rank: int) -> list[Fault]:
    """The reference takes every fault on every rank: what all candidate ranks must then do."""
    return [f for f in config.faults if f.step == step and (role == "reference" or f.rank in (None, rank))]


class LocalSkipCheck:
    """Whether the optimizer step left each group's parameters bitwise unchanged on this rank: a
    copy of every local tensor before, compared after (``None``: the rank holds no element)."""

    def __init__(self, groups: list[list[torch.Tensor]], engine: engines.Engine) -> None:
        self.before = [[engine.local(p).detach().clone() for p in group] for group in groups]

    def skipped(self, groups: list[list[torch.Tensor]], engine: engines.Engine) -> list[bool | None]:
        found: list[bool | None] = []
        for before, group in zip(self.before, groups, strict=True):
            after = [engine.local(p).detach() for p in group]
            equal = all(torch.equal(b, a) for b, a in zip(before, after, strict=True))
            found.append(None if sum(t.numel() for t in after) == 0 else equal)
        self.before = []
        return found


class SharedSkipCheck:
    """:class:`LocalSkipCheck` for a replicated run (a reference: every rank holds all of it):
    each rank compares only its contiguous ``1/world`` share of every tensor's elements and the
    ranks agree (one small all-reduce per step): exact, as the shares cover every element once."""

    def __init__(self, groups: list[list[torch.Tensor]], engine: engines.Engine) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = engine.device
        self.before = [[self._share(engine.local(p)).clone() for p in group] for group in groups]

    def _share(self, tensor: torch.Tensor) -> torch.Tensor:
        flat = tensor.detach().reshape(-1)
        size = -(-flat.numel() // self.world)
        return flat[self.rank * size : (self.rank + 1) * size]

    def skipped(self, groups: list[list[torch.Tensor]], engine: engines.Engine) -> list[bool | None]:
        changed, numel = [], []  # summed over the ranks in one all-reduce: any change, all elements
        for before, group in zip(self.before, groups, strict=True):
            after = [self._share(engine.local(p)) for p in group]
            changed.append(float(not all(torch.equal(b, a) for b, a in zip(before, after, strict=True))))
            numel.append(float(sum(t.numel() for t in after)))
        self.before = []
        if self.world > 1:
            summed = torch.tensor(changed + numel, dtype=torch.float64, device=self.device)
            dist.all_reduce(summed)
            changed, numel = summed[: len(changed)].tolist(), summed[len(changed) :].tolist()
        return [None if n == 0 else c == 0 for c, n in zip(changed, numel, strict=True)]


SHARED_SKIP_MB = 16.0
"""A reference whose parameters hold less copies all of them and decides alone: on a small model
the all-reduce :class:`SharedSkipCheck` needs costs more (a collective's latency, every step) than
the copy it saves."""


def skip_check(
    role: str, groups: list[list[torch.Tensor]], engine: engines.Engine
) -> LocalSkipCheck | SharedSkipCheck:
    """The skip check of a ``role`` run: a reference's shared when its parameters reach
    :data:`SHARED_SKIP_MB` (the same on every rank: each holds the same model)."""
    size = sum(p.numel() * p.element_size() for group in groups for p in group) / 2**20
    shared = role == "reference" and dist.is_initialized() and size >= SHARED_SKIP_MB
    return (SharedSkipCheck if shared else LocalSkipCheck)(groups, engine)


Observer = Callable[[engines.Engine, int], AbstractContextManager[Any]]
"""``observe(engine, step)``: a context around one step's forward and backward (``localize.py``
puts hooks on every module inside it)."""


class Run:
    """One training run of ``config``'s ``role`` on this rank, a step at a time.

    Iterate it to train: each iteration yields the step's record (``wire.RankStep``) as the
    step ends, so that a reference too large to keep can be compared as it runs
    (``stepcheck.ReferenceSteps``). Without ``check``, a step's record holds the full parameters,
    gradients and optimizer state on every rank (``record=False``: none; the localization's
    replays record nothing). With ``check`` (a candidate's), it holds what the check measured
    (``stepcheck.Check``). ``slim``: a function applied to each step before it is kept in
    :attr:`steps` (a reference too large to keep keeps its scalars only). ``summed_in_reverse``: a
    reference whose reductions sum the ranks in reverse order (``Engine.summed_in_reverse``: the
    drift's second reference, ``drift.py``).
    """

    def __init__(
        self,
        config: ParityConfig,
        role: str,
        device: torch.device,
        *,
        observe: Observer | None = None,
        last_step: int | None = None,
        check: stepcheck.Check | None = None,
        record: bool = True,
        half: reshard.Half | None = None,
        summed_in_reverse: bool = False,
    ) -> None:
        self.config, self.role, self.device = config, role, device
        self.summed_in_reverse = summed_in_reverse
        self.observe, self.check, self.record = observe, check, record
        self.first = 0
        self.last = config.steps if last_step is None else min(config.steps, last_step + 1)
        if half is not None:  # a resharded row's half: up to the resume step, or from it on
            assert config.resume.at is not None, "checked by ParityConfig"
            self.first, self.last = (
                (0, config.resume.at) if half.part == 1 else (config.resume.at, config.steps)
            )
        self.steps: list[RankStep] = []
        self.error: str | None = None
        self.description = role
        self.counters: dict[str, int] = {}
        self.duration_s = 0.0
        self.step_s: list[float] = []
        """Each step's own time, in order (what ``compile_s`` reads)."""
        self.slim: Callable[[RankStep], RankStep] | None = None
        self.alias = False
        """Record the parameters and optimizer state as the live tensors, not copies, and let the
        live gradients go once recorded (a reference compared in lockstep: each step is read
        before the next one trains, ``entry.py``, and nothing reads its gradients but the record);
        the recorded gradients are copies always (an optimizer may change them in place)."""
        self.rank = dist.get_rank()  # kept: a failed run's rank leaves the group before it reports
        self.loop = loop_state.LoopState(config, device)
        """Schedulers and the forward RNG policy (``sides/loop_state.py``)."""
        self.restart = (
            resume.Restart(config, role, device, self.loop, half)
            if resume.restarts(config, role, half)
            else None
        )
        """A resume row's restart, or a resharded row's hand-over (``resume.py``); ``None`` elsewhere."""
        self.engine: engines.Engine | None = None
        self.optimizers: list[torch.optim.Optimizer] = []
        self.scaler: Any = None
        """What trains, once built (while iterating): a replay anchors one side to the other's
        state between steps (``localize.py``)."""

    def __iter__(self) -> Iterator[RankStep]:
        started = time.perf_counter()
        rank = self.rank
        scaler = None
        restart = self.restart
        try:
            if restart is not None and restart.arrives():  # a resharded row's second half: fresh, then loaded
                engine, groups, optimizers, scaler = restart.arrive(self.first, self._new_scaler)
                self.description = (
                    f"from step {self.first} at world size {engine.world_size}: {engine.description}"
                )
            else:
                engine = roles.build(self.config, self.role, self.device)
                engine.summed_in_reverse = self.summed_in_reverse
                checkpoint.install(engine, self.config, self.role)
                compiled.install(engine, self.config, self.role)
                self.description = engine.description
                groups = engine.param_groups(2 if self.config.loop.path == "two_optimizers" else 1)
                optimizers = [engine.make_optimizer(group) for group in groups]
                scaler = self._new_scaler()
                self.loop.start(engine, optimizers)
            self.engine, self.optimizers, self.scaler = engine, optimizers, scaler
            hand = None
            if self.config.loop.accumulate > 1 and self.role == "reference" and not engine.reduces_itself:
                hand = accumulate.HandAccumulation(self.config, engine)
            for step in range(self.first, self.last):
                if restart is not None and restart.restarts_at(step):
                    engine, groups, optimizers, scaler = restart.restart(
                        step, engine, optimizers, scaler, self._new_scaler
                    )
                    self.description += f"; saved after step {step - 1}, resumed in {engine.description}"
                    self.engine, self.optimizers, self.scaler = engine, optimizers, scaler
                if restart is not None:
                    restart.before_step(step, engine)
                timed = time.perf_counter()
                found = self._step(step, rank, engine, groups, optimizers, scaler, hand)
                self.step_s.append(time.perf_counter() - timed)
                if restart is not None:
                    found = restart.after_step(step, found)
                self.steps.append(self.slim(found) if self.slim is not None else found)
                context.heartbeat()  # a slow step of a large model is progress, not a hang
                self.duration_s += time.perf_counter() - started
                yield found
                started = time.perf_counter()  # the time spent suspended is not this run's
                del found  # a step compared in lockstep is dropped before the next one trains
            if (
                restart is not None and restart.departs()
            ):  # a resharded row's first half: save for the other world size
                restart.depart(self.last, engine, optimizers, scaler)
            if scaler is not None:
                self.counters = _counters(scaler)
        except Exception:  # noqa: BLE001 - recorded; the caller decides what it means
            self.error = prefix_lines(traceback.format_exc(), rank)
        finally:
            if restart is not None:
                restart.close()
            self.duration_s += time.perf_counter() - started

    @property
    def compile_s(self) -> float | None:
        """What compiling cost this run: its first step's time beyond the median of the later
        steps' (``None``: it compiled nothing, or ran one step). Compiling is lazy, so the first
        step traces and generates every graph (or reads it from the cache)."""
        if not compiled.count(self.engine) or len(self.step_s) < 2:
            return None
        return max(0.0, self.step_s[0] - statistics.median(self.step_s[1:]))

    def _new_scaler(self) -> Any:
        return make_scaler(self.config, self.role, self.device)

    def _step(
        self,
        step: int,
        rank: int,
        engine: engines.Engine,
        groups: list[list[torch.Tensor]],
        optimizers: list[torch.optim.Optimizer],
        scaler: Any,
        hand: accumulate.HandAccumulation | None = None,
    ) -> RankStep:
        config, check = self.config, self.check
        for opt in optimizers:  # before a reference run in lockstep trains its step (``begin``)
            opt.zero_grad(set_to_none=True)
        if check is not None:
            check.begin(step)
        scale = scaler.get_scale()
        with (
            self.observe(engine, step) if self.observe else contextlib.nullcontext(),
            tp_mirror.loss_context(engine.workload),
        ):
            if config.loop.accumulate > 1:
                recorded_loss = accumulate.forward_backward(engine, self.role, config, step, scaler, hand)
            else:
                recorded_loss = engine.forward_backward(step, scaler)
        if hand is None:
            engine.after_backward()
        for fault in faults_now(config, self.role, step, rank):
            poison(engine, groups[fault.optimizer], fault)
        unscaled = config.loop.path == "unscale_clip" or engine.unscales_first
        clip_norm = None
        if unscaled:
            for opt in optimizers:
                scaler.unscale_(opt)
            engine.before_step()
            if config.loop.path == "unscale_clip":
                clip_norm = engine.clip_grad_norm_(config.loop.clip)
        grads = None
        if check is not None:
            check.grads(step, engine, None if unscaled else scale)
        elif self.record:
            divide = not unscaled and scale != 1  # into new tensors: the live ones need no copy first
            grads = stepcheck.unscaled(engine.full_grads(copy=not divide), scale if divide else 1)
        skips = skip_check(self.role, groups, engine)
        found_inf = []
        for opt in optimizers:
            scaler.step(opt)
            found_inf.append(sum(float(v.sum()) for v in scaler._found_inf_per_device(opt).values()))
        scaler.update()
        self.loop.after_update()
        skipped = skips.skipped(groups, engine)
        tensors = None
        if check is None and self.record:
            params, state = engine.full_after_step(optimizers, copy=not self.alias)
            assert grads is not None, "recorded above"
            tensors = StepTensors(params=params, grads=grads, optim_state=state)
        if self.alias:  # recorded: the live gradients are not read again before the next step's
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
        found = record.rank_step(
            loss=recorded_loss,
            scale=scaler.get_scale(),
            tracker=int(scaler._get_growth_tracker()),
            found_inf=found_inf,
            skipped=skipped,
            clip_norm=clip_norm,
            accumulated_in=accumulate.accumulated_in(config, hand, engine),
            checkpoint=engine.recorded_checkpoint or checkpoint.recorded(config, self.role),
            compiled=compiled.recorded(engine, config),
            tensors=tensors,
            buffers=engine.own_buffers() if check is None and self.record else None,
        )
        if check is not None:
            found = check.after_step(step, engine, optimizers, found)
        return found

    def rank_run(self) -> RankRun:
        """What this rank sends of the run (``record.rank_run``)."""
        return record.rank_run(
            rank=self.rank,
            steps=self.steps,
            counters=self.counters if self.error is None else {},
            error=self.error,
            duration_s=self.duration_s - (self.check.waited_s if self.check is not None else 0.0),
            compile_s=self.compile_s,
            facts=self.engine.facts if self.engine is not None else None,
        )


def run(
    config: ParityConfig,
    role: str,
    device: torch.device,
    *,
    observe: Observer | None = None,
    last_step: int | None = None,
    record: bool = True,
) -> tuple[RankRun, str]:
    """Train ``config``'s ``role`` through (``last_step``, or) every step and keep every step's
    record; ``(its rank_run, description)``. A run never raises (see the module docstring)."""
    training = Run(config, role, device, observe=observe, last_step=last_step, record=record)
    for _ in training:
        pass
    return training.rank_run(), training.description
