"""Localization, rank side: re-run both sides of a failed configuration up to its first diverging
step with hooks on every module, and send each module's forward output and output gradient back.

Why a re-run: recording every activation of every step would cost every passing configuration
memory and time, while a failed one is cheap to replay (the runs are deterministic, and these
models train for a few steps). So the runner calls :func:`run_batch` only for configurations that
failed, after judging them, with the step to look at.

What is recorded, at that step only, on every rank (each rank's own activations: the batch is
per rank, never sharded):

* ``forward``: each module's output, in the order the modules *finish* their forward (a child
  before its parent, so the first entry that differs is the innermost module that made the
  difference);
* ``backward``: the gradient of the loss with respect to each module's output, in the order
  backward produces them (tensor hooks on the outputs: no full backward hooks, which wrap a
  module's inputs and interfere with FSDP's own).

Re-anchored (``anchor=True``, for a step after 0 of a row the staged check can judge): the two
sides train in lockstep up to the step, and before it the reference takes the candidate's full
parameters, optimizer state, buffers and scale (``sides/anchor.py``, as the staged check does), so
both start the probed step from one state and a last bit that earlier steps drifted (a norm
summed in another order by a clip, a reduction on NCCL) cannot be mistaken for the first divergence.

When a module's forward output diverged on some rank, both sides are replayed once more with
``ops.OpProbe`` inside that rank's first diverging module, recording its ATen ops, so the report
can go one level deeper and name the first op (``pinpoint.locate_op``).

Modules are named as in the user's model: wrappers (FSDP1's ``FullyShardedDataParallel``, DDP)
are skipped, and their prefixes (``_fsdp_wrapped_module.``, ``module.``) never appear, because the
hooks go on the model the engine built (``Engine.trained_module``), below any wrapper. A module
called more than once per step gets ``#1``, ``#2`` ... after its name; a module with several
tensor outputs, ``[i]`` per output. Tensors travel to the controller as CPU copies.

Import target for the pool: ``harness.parity.ranks.localize:run_batch``.
"""

from __future__ import annotations

import contextlib
import time
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from harness.failure_text import prefix_lines
from harness.parity.plan import profiles
from harness.parity.plan.config import ParityConfig
from harness.parity.ranks import entry, train
from harness.parity.ranks.measure import ops
from harness.parity.ranks.sides import anchor as anchoring
from harness.parity.ranks.sides import engines
from harness.parity.ranks.sides.full.gather import module_names
from harness.parity.ranks.wire import Probed, ProbedOps, ProbedSide
from harness.rank import context
from harness.rank.subtests import agree, leave_group


def _tensors(value: Any) -> list[torch.Tensor]:
    """The floating-point tensors in a module's output (nested tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU copy of this rank's values (a DTensor output becomes its full tensor)."""
    if hasattr(tensor, "full_tensor"):
        tensor = tensor.full_tensor()
    return tensor.detach().to("cpu", copy=True)


class Probe:
    """Hooks on every module of one run, active during the forward and backward of one step."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.forward: list[tuple[str, torch.Tensor]] = []
        self.backward: list[tuple[str, torch.Tensor]] = []
        self._calls: dict[str, int] = {}

    def _key(self, name: str) -> str:
        calls = self._calls.get(name, 0)
        self._calls[name] = calls + 1
        return name if calls == 0 else f"{name}#{calls}"

    def _forward_hook(self, name: str, engine: engines.Engine) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            key = self._key(name)
            tensors = _tensors(output)
            for index, tensor in enumerate(tensors):
                label = key if len(tensors) == 1 else f"{key}[{index}]"
                self.forward.append((label, _local(engine.observed(name, tensor))))
                if tensor.requires_grad:
                    tensor.register_hook(self._backward_hook(label, name, engine))

        return hook

    def _backward_hook(self, label: str, name: str, engine: engines.Engine) -> Any:
        def hook(grad: torch.Tensor) -> None:
            self.backward.append((label, _local(engine.observed(name, grad))))

        return hook

    @contextlib.contextmanager
    def observe(self, engine: engines.Engine, step: int) -> Iterator[None]:
        if step != self.step:
            yield
            return
        handles = [
            module.register_forward_hook(self._forward_hook(name, engine))
            for name, module in module_names(engine.trained_module())
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def recorded(self) -> ProbedSide:
        """What travels: each module's values, in the order they were recorded."""
        return ProbedSide(forward=tuple(self.forward), backward=tuple(self.backward))


Probes = dict[str, "Probe | ops.OpProbe"]
"""What observes each role (``reference``, ``candidate``) as it replays."""


def _replay(config: ParityConfig, step: int, probes: Probes, anchor: str = "") -> str | None:
    """Both sides through ``step`` with ``probes[role].observe`` (``anchor``, the store key of the
    agreement it needs: in lockstep, the reference re-anchored to the candidate's state before
    ``step``); the first error (``None``: none)."""
    device = context.current().device
    if anchor and step > 0:  # step 0 begins from one state on both sides already
        return _anchored(config, step, probes, device, anchor)
    error = None
    for role in ("reference", "candidate"):
        try:
            run, _ = train.run(
                config, role, device, observe=probes[role].observe, last_step=step, record=False
            )
            raised = run.error
        except Exception:  # noqa: BLE001 - train.run records its own errors; this is the probe's
            raised = prefix_lines(traceback.format_exc(), context.current().rank)
        if raised and error is None:
            error = f"the {role} raised while being probed:\n{raised}"
    return error


_ROLES = ("candidate", "reference")


def _anchored(
    config: ParityConfig,
    step: int,
    probes: Probes,
    device: torch.device,
    key: str,
) -> str | None:
    """Both sides a step at a time up to ``step``, then the candidate's state into the reference
    (collective; every rank agrees first that both sides are still running), then ``step``
    observed; the first error (``None``: none)."""
    runs = {
        role: train.Run(config, role, device, observe=probes[role].observe, last_step=step, record=False)
        for role in _ROLES
    }
    steps = {role: iter(run) for role, run in runs.items()}
    for _ in range(step):
        for role in _ROLES:
            next(steps[role], None)
    cand, ref = runs["candidate"], runs["reference"]
    running = cand.error is None and ref.error is None and cand.engine is not None and ref.engine is not None
    if not entry.everywhere(key, running):
        for role in _ROLES:
            steps[role].close()  # type: ignore[attr-defined]
    else:
        try:
            held = anchoring.candidate_state(cand.engine, cand.optimizers)  # type: ignore[arg-type]
            anchoring.hold(ref.engine, ref.optimizers, ref.scaler, held, cand.scaler)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - recorded as the probe's error
            return "re-anchoring the reference raised:\n" + prefix_lines(
                traceback.format_exc(), context.current().rank
            )
        for role in _ROLES:
            for _ in steps[role]:  # the probed step (the last one)
                pass
    for role in _ROLES:
        if runs[role].error:
            return f"the {role} raised while being probed:\n{runs[role].error}"
    if not running:
        return "another rank's run raised before the probed step"
    return None


def _any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank (every rank must replay, or none: the runs are collective)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=context.current().device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def run_one(config: ParityConfig, step: int, index: int = 0, anchor: bool = False) -> Probed:
    """Both sides of ``config`` through ``step`` (``anchor``: re-anchored before it), probed at
    ``step`` module by module, then, when a forward output diverged on any rank, once more op by
    op inside this rank's first diverging module (``ops.py``). Never raises."""
    started = time.perf_counter()
    probes = {role: Probe(step) for role in ("reference", "candidate")}
    error = _replay(config, step, probes, f"localize{index}/anchor" if anchor else "")
    found_ops = None
    # Whether the op-level replay (collective) happens must not hang on one rank's error alone.
    if entry.everywhere(f"localize{index}/replay", error is None):
        target = ops.first_forward_divergence(
            probes["reference"].forward, probes["candidate"].forward, profiles.profile_for(config)
        )
        if _any_rank(target is not None):
            op_probes = {role: ops.OpProbe(step, target or "") for role in ("reference", "candidate")}
            if target is None:  # replay for the collectives' sake, recording nothing
                op_probes = {role: Probe(-1) for role in ("reference", "candidate")}  # type: ignore[misc]
            error = _replay(config, step, op_probes, f"localize{index}/anchor-ops" if anchor else "")
            if target is not None:
                found_ops = ProbedOps(
                    module=target,
                    reference=tuple(op_probes["reference"].ops),
                    candidate=tuple(op_probes["candidate"].ops),
                )
    return Probed(
        id=config.id,
        step=step,
        reference=probes["reference"].recorded(),
        candidate=probes["candidate"].recorded(),
        ops=found_ops,
        error=error,
        duration_s=time.perf_counter() - started,
    )


def run_batch(requests: list[tuple[ParityConfig, int, bool]]) -> list[Probed]:
    """Probe each ``(configuration, step, anchor)`` in order, isolated as ``entry.run_batch``
    isolates configurations (a rank that failed leaves the group; every rank re-creates it)."""
    ctx = context.current()
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for index, (config, step, anchor) in enumerate(requests):
            result = run_one(config, step, index, anchor)
            failed = result.error is not None
            if failed and ctx.world_size > 1:
                leave_group()
            if ctx.world_size > 1 and not agree(ctx, f"localize{index}", ok=not failed):
                entry.forget()
            results.append(result)
    return results
