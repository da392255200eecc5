"""Gradient accumulation over ``config.loop.accumulate`` microbatches (rank side), on both sides.

Each step runs ``K`` forwards and backwards before the scaler unscales and steps, microbatch ``i``
of step ``s`` on the workload's batch ``s * K + i`` (a distinct batch each), its loss divided by
``K`` as users average microbatches. Two sync modes (``config.loop.sync``):

* ``every``: every microbatch's gradients are reduced at once and summed, reduced, in the
  parameters' float32 (FSDP1 adds each reduce-scattered shard, cast to the parameter dtype, into
  ``_saved_grad_shard``; FSDP2 adds each new sharded gradient into ``sharded_param.grad``);
* ``last``: the candidate skips the reduction until the last microbatch (DDP and FSDP1
  ``no_sync()``, FSDP2 ``set_requires_gradient_sync(False)``) and sums the unreduced gradients
  meanwhile, in a dtype of each engine's own (:func:`unsynced_dtype`), then reduces the sum once.

Why the reference reduces by hand: DDP's own reducer, syncing every microbatch, all-reduces the
parameter's whole ``.grad``, the earlier microbatches' average included, which rounds otherwise
than FSDP's "reduce the new gradient, then add". So the reference (DDP or the low-precision twin)
runs every microbatch under ``no_sync()`` and :class:`HandAccumulation` reduces as its candidate
does: each microbatch then sums, or sums in the candidate's unsynced dtype then reduces once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from harness.parity.plan.config import ParityConfig
from harness.parity.plan.precision import PrecisionPolicy
from harness.parity.ranks.sides import engines, reduce_layout, references, twin
from harness.parity.ranks.sides.twin import DTYPES


def accumulated_in(config: ParityConfig, hand: HandAccumulation | None, engine: engines.Engine) -> str | None:
    """What a step records of its accumulation: the dtype its unreduced microbatch gradients were
    summed in (the reference's hand accumulation's, the candidate's :func:`unsynced_dtype` under
    the policy it runs), or ``None`` where nothing was summed unreduced."""
    if config.loop.accumulate == 1 or config.loop.sync != "last":
        return None
    dtype = hand.unsynced if hand is not None else unsynced_dtype(config, engine.running_policy())
    return str(dtype).removeprefix("torch.")


def unsynced_dtype(config: ParityConfig, policy: PrecisionPolicy | None = None) -> torch.dtype:
    """The dtype the candidate sums its unreduced gradients in under ``sync="last"``, read in torch
    2.13's sources. FSDP1: autograd accumulates each microbatch into the unsharded flat
    parameter's ``.grad`` in the parameter dtype (``_post_backward_hook`` returns before any cast
    when not syncing; ``prepare_gradient_for_backward`` keeps an unsharded ``.grad``), cast to the
    reduce dtype only at the last. FSDP2: ``FSDPParam.to_accumulated_grad_if_needed`` casts the
    first microbatch's gradient to the reduce dtype and ``accumulate_unsharded_grad_if_needed``
    adds the next ones into it (a reduce dtype equal to the parameter dtype is clamped to
    ``None``: plain autograd accumulation in that dtype). ``policy``: the one the side runs, when
    the configuration does not name it (a user's function's units')."""
    policy = config.policy if policy is None else policy
    if policy is None:
        return torch.float32
    return DTYPES[policy.param] if config.engine == "fsdp1" else DTYPES[policy.reduce_dtype]


@contextlib.contextmanager
def _fsdp2_unsynced(module: Any) -> Iterator[None]:
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def microbatch_sync(engine: engines.Engine, role: str, sync: bool) -> Any:
    """The context of one microbatch's forward and backward: the reference never reduces inside
    (:class:`HandAccumulation` does); the candidate skips its reduction when ``sync`` is False."""
    if role == "reference" and not engine.reduces_itself:
        return engine.wrapped.no_sync()  # type: ignore[operator]
    if sync:
        return contextlib.nullcontext()
    if isinstance(engine, engines.FSDP2) and not hasattr(engine.wrapped, "no_sync"):  # a user's DDP has it
        return _fsdp2_unsynced(engine.wrapped)
    return engine.wrapped.no_sync()  # type: ignore[operator]


class HandAccumulation:
    """The reference's accumulation, reduced by hand as its candidate reduces (module docstring).

    ``lows``: the parameters backward writes gradients into (the twin's working copy, or the
    float32 model itself); ``masters``: the parameters the optimizer steps (the same for float32).
    ``on_reduce``: told what is handed to each reduction, before it runs (one gradient per ``lows``
    parameter, ``None`` where it has none): each microbatch's gradients (``sync="every"``), or
    their unreduced sum once (``sync="last"``; ``sync`` overrides the configuration's: a
    pipeline's twin, ``pipeline/twin.py``). The staged check reads the reference's local
    gradients there (``ranks/staged.py``); it must not change them.
    """

    def __init__(
        self,
        config: ParityConfig,
        engine: engines.Engine,
        *,
        on_reduce: Callable[[list[torch.Tensor | None]], None] | None = None,
        sync: str | None = None,
        moved_after: list[frozenset[int] | None] | None = None,
    ) -> None:
        self.sync = sync or config.loop.sync
        self.on_reduce = on_reduce
        policy = config.policy
        if isinstance(engine, references.LowPrecisionDDP):
            self.lows = list(engine.working.parameters())
            policy = engine.policy
        else:
            self.lows = list(engine.module.parameters())
        self.layout = engine.candidate_layout()
        self.masters = list(engine.module.parameters())
        self.reduce = torch.float32 if policy is None else DTYPES[policy.reduce_dtype]
        self.unsynced = unsynced_dtype(config, policy)
        self.factors = twin.divide_factors(config.engine, self.reduce, engine.data_parallel_size)
        self.in_reverse = engine.summed_in_reverse
        self.moved_after = moved_after or [None] * len(self.lows)
        """Per ``lows`` parameter, the microbatches after which its sum so far moves into the
        unsynced dtype (``None``: after each); between moves the microbatches add up in the
        gradient's own dtype, as a pipeline stage's split backward adds them
        (``pipeline/halves.py``)."""
        self._open: list[torch.Tensor | None] = [None] * len(self.lows)
        self._pending: list[torch.Tensor | None] = [None] * len(self.lows)
        self._synced: list[torch.Tensor | None] = [None] * len(self.masters)

    def after_microbatch(self, last: bool, microbatch: int | None = None) -> None:
        """Fold this microbatch's gradients in (and clear them: the next backward starts from
        none, as FSDP's does); after the last, the masters hold the reduced sum. ``microbatch``:
        its index, where :attr:`moved_after` names some."""
        grads = [low.grad for low in self.lows]
        for low in self.lows:
            low.grad = None
        if self.sync == "every":
            self._add_reduced(grads)
        else:
            self._sum_unsynced(grads, microbatch, last)
            if last:
                self._add_reduced(self._pending)
        if last:
            for master, synced in zip(self.masters, self._synced, strict=True):
                master.grad = synced
            self._open = [None] * len(self.lows)
            self._pending = [None] * len(self.lows)
            self._synced = [None] * len(self.masters)

    def _sum_unsynced(self, grads: list[torch.Tensor | None], microbatch: int | None, last: bool) -> None:
        for index, grad in enumerate(grads):
            if grad is not None:
                opened = self._open[index]
                if opened is None:
                    self._open[index] = grad
                else:
                    opened += grad  # in the gradient's dtype, between two moves
            moves = self.moved_after[index]
            if last or moves is None or microbatch in moves or self.unsynced == getattr(grad, "dtype", None):
                self._move(index)

    def _move(self, index: int) -> None:
        """The open sum into the unsynced one (FSDP2's post-backward hook)."""
        opened, self._open[index] = self._open[index], None
        if opened is None:
            return
        pending = self._pending[index]
        if pending is None:
            self._pending[index] = opened.to(self.unsynced)
        else:
            pending += opened  # in the unsynced dtype, the earlier sum first, as the candidate adds

    def _add_reduced(self, grads: list[torch.Tensor | None]) -> None:
        """Reduce ``grads`` and add them to the reduced sum so far, in each master's dtype
        (float32: where FSDP adds each new reduced shard)."""
        if self.on_reduce is not None:
            self.on_reduce(grads)
        if all(grad is None for grad in grads):
            return
        reduced = reduce_layout.reduce(
            self.layout, self.lows, grads, self.reduce, self.factors, in_reverse=self.in_reverse
        )
        for index, grad in enumerate(reduced):
            if grad is None:
                continue
            grad = grad.to(self.masters[index].dtype)
            before = self._synced[index]
            self._synced[index] = grad if before is None else before + grad


def forward_backward(
    engine: engines.Engine,
    role: str,
    config: ParityConfig,
    step: int,
    scaler: Any,
    hand: HandAccumulation | None,
) -> float:
    """Every microbatch of ``step``, forward and scaled backward; the mean of the microbatches'
    losses as recorded. ``hand``: the reference's :class:`HandAccumulation`."""
    count = config.loop.accumulate
    scale = scaler.get_scale()
    recorded = []
    for index in range(count):
        last = index == count - 1
        with microbatch_sync(engine, role, config.loop.sync == "every" or last):
            loss, value = engine.losses(step * count + index, scale)
            scaler.scale(loss / count).backward()
        if hand is not None:
            hand.after_microbatch(last)
        recorded.append(value)
    return sum(recorded) / count
