"""The unsharded twin of a pipeline (rank side): the whole model on every rank, running the
candidate's microbatches in the order each stage accumulates them.

Why this is the candidate's twin: every schedule torch offers runs a stage's backward passes in
ascending microbatch order, and autograd adds each into the stage's gradients (FSDP2, told not
to sync, sums them unsharded in its reduce dtype); after the last, the stage reduces the sum once
over its ``dp`` group and divides it by the microbatch count (``perform_reduce_grad``). The twin
does the same arithmetic on the whole model: each microbatch's scaled loss back-propagated in
order, the sum reduced once per candidate bucket (each stage's units, and each stage's own
root: ``reduce_layout.of``), divided by the count; then each tied parameter's copies summed
as the candidate sums them across stages. Two addends sum alike in any order, so the tie's sum
is bitwise whichever stage adds first. Measured bitwise on gloo against ``ScheduleGPipe`` and
``Schedule1F1B`` (the issue's measurement) and every schedule the matrix runs.

A schedule that cuts the backward in two (``interleaved_zb``, ``zbv``, ``dualpipev``: input
gradients first, weight gradients later) still adds each weight gradient in ascending order, but
where the reduce dtype is not the parameters', FSDP2 moves the sum into it only at each input
half: the microbatches whose weight halves run between two of a stage's input halves add up in
the parameters' dtype first. The twin sums them so, read off torch's plan (``halves.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from harness.parity.ranks.sides import accumulate
from harness.parity.ranks.sides import stages as split
from harness.parity.ranks.sides.engines import to_device


@dataclasses.dataclass(frozen=True, slots=True)
class Piping:
    """What the twin mirrors of a pipeline: from the configuration (the built-in rows,
    ``roles.py``), or read off the schedule a user's function built (``user/pipeline.py``)."""

    schedule: str
    """The schedule's key in ``SCHEDULES`` (its order of microbatches: ``split.backward_order``)."""
    microbatches: int
    io: Callable[[Any], tuple[torch.Tensor, torch.Tensor]]
    """``batch -> (first stage's input, target)``."""
    loss: Callable[..., torch.Tensor]
    """``(last stage's output, target) -> one microbatch's loss``."""
    holds: Callable[[str], bool]
    """Whether this rank's candidate holds a parameter or buffer of that name (its stages')."""
    moves: dict[str, frozenset[int]] | None = None
    """Each parameter's microbatches after which its stage's FSDP2 moves the sum so far into its
    reduce dtype (``halves.moved_after``, by the whole model's names); ``None``: after each."""


class PipelineTwin:
    """Mixed into a reference engine (``MirroredDDP``, ``LowPrecisionDDP``) for a pipeline row:
    its step is :meth:`forward_backward`; nothing is left for ``after_backward``. Its
    :attr:`piping` is set before the first step."""

    piping: Piping

    def forward_backward(self, step: int, scaler: Any) -> float:
        engine: Any = self
        config, piping = engine.config, self.piping
        count = piping.microbatches
        if hasattr(engine, "working"):  # the low-precision twin computes in its working copy
            with torch.no_grad():
                for low, master in zip(engine.working.parameters(), engine.module.parameters(), strict=True):
                    low.copy_(master)
        hand = accumulate.HandAccumulation(config, engine, sync="last", moved_after=self._moved_after())
        batch = to_device(
            engine.finish(engine.batch(step, engine.data_rank), scaler.get_scale()), engine.device
        )
        inputs, target = piping.io(batch)
        parts = split.split_microbatches(inputs, count)
        targets = split.split_microbatches(target, count)
        order = split.backward_order(piping.schedule, count)
        values = [0.0] * count
        with engine.forward_rng(step):
            for position, index in enumerate(order):
                with engine.wrapped.no_sync():
                    loss = piping.loss(split.whole_output(engine.wrapped, parts[index]), targets[index])
                    scaler.scale(loss).backward()
                values[index] = loss.item()
                hand.after_microbatch(position == count - 1, index)
        masters = dict(engine.module.named_parameters())
        for param in masters.values():
            if param.grad is not None:
                param.grad.div_(count)
        for tie in engine.ties:
            grads = [masters[name].grad for name in tie if masters[name].grad is not None]
            if not grads:
                continue
            total = grads[0].clone()
            for more in grads[1:]:
                total += more
            for name in tie:
                masters[name].grad = total.clone()
        return sum(values) / count

    def _moved_after(self) -> list[frozenset[int] | None] | None:
        """:attr:`Piping.moves` for each parameter backward writes into (the working copy's, or
        the model's), in :class:`accumulate.HandAccumulation`'s order."""
        moves = self.piping.moves
        if moves is None:
            return None
        engine: Any = self
        written = engine.working if hasattr(engine, "working") else engine.module
        names = [name for name, _ in written.named_parameters()]
        unknown = [name for name in names if name not in moves]
        if unknown:
            raise RuntimeError(f"the pipeline twin knows no stage of {unknown[:3]} (halves.moved_after)")
        return [moves[name] for name in names]

    def after_backward(self) -> None:
        """Reduced in :meth:`forward_backward` already."""

    def own_buffers(self) -> dict[str, torch.Tensor]:
        """The buffers of the stages the candidate's rank holds (it names no other)."""
        return {name: value for name, value in super().own_buffers().items() if self.piping.holds(name)}  # type: ignore[misc]


def mirror(cls: type) -> type:
    """``cls`` (a reference engine) as a pipeline's twin."""
    return type(f"Pipelined{cls.__name__}", (PipelineTwin, cls), {})
