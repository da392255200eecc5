"""SyncBatchNorm on one process: a microbatch's pieces run side by side, sharing its statistics.

Why: ``SyncBatchNorm`` normalizes by the statistics of every data-parallel rank's batch together
(its all-reduce), so its split means the whole batch where ``BatchNorm`` means each rank's share
(``batchnorm_per_rank``). One process cannot all-reduce with itself, and torch's
``SyncBatchNorm`` refuses a CPU tensor under an initialized process group (as a rank of the pool
is). So the stage runs its own: every ``SyncBatchNorm`` of the float64 model normalizes by its
input's batch statistics (:func:`install`), and the pieces of one microbatch run as threads
(:func:`losses`) that meet at each ``SyncBatchNorm``, where each normalizes its own input by the
statistics of all of them, autograd-connected, so the gradient flows through the shared statistics
to every piece as the all-reduce's backward makes it flow. The forward draws no random numbers
(the stage checks), so the threads' interleaving changes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from torch import nn

from harness.parity.ranks.truth import pieces

TIMEOUT_S = 600.0
"""How long a piece waits for the others at a ``SyncBatchNorm`` before the stage gives up (a piece
that raised never arrives: its error is what is reported)."""

_ACTIVE = threading.local()
"""The calling thread's lockstep and its index in it, while :func:`losses` runs it."""


class _Meeting:
    """The pieces' inputs to each ``SyncBatchNorm`` call, by call number, and the barrier they meet at."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.barrier = threading.Barrier(count, timeout=TIMEOUT_S)
        self.inputs: dict[int, list[torch.Tensor | None]] = {}
        self.lock = threading.Lock()


def install(model: nn.Module) -> bool:
    """Every ``SyncBatchNorm`` of ``model`` normalizes as described above; whether it holds any."""
    found = False
    for module in model.modules():
        if isinstance(module, nn.SyncBatchNorm):
            module.forward = _forward.__get__(module)  # type: ignore[method-assign]
            found = True
    return found


def _statistics(inputs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The per-channel mean and biased variance over every input's batch and spatial dims."""
    joined = torch.cat([x.transpose(0, 1).reshape(x.shape[1], -1) for x in inputs], dim=1)
    mean = joined.mean(dim=1)
    var = (joined - mean.unsqueeze(1)).pow(2).mean(dim=1)
    return mean, var, joined.shape[1]


def _forward(self: nn.SyncBatchNorm, x: torch.Tensor) -> torch.Tensor:
    meeting: _Meeting | None = getattr(_ACTIVE, "meeting", None)
    if meeting is None or not self.training:
        together = [x]
    else:
        index, calls = _ACTIVE.index, _ACTIVE.calls
        _ACTIVE.calls = calls + 1
        with meeting.lock:
            meeting.inputs.setdefault(calls, [None] * meeting.count)[index] = x
        meeting.barrier.wait()
        together = meeting.inputs[calls]  # type: ignore[assignment]
    if not self.training:
        return nn.functional.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
        )
    mean, var, count = _statistics(together)  # type: ignore[arg-type]
    first = meeting is None or _ACTIVE.index == 0
    if first and self.track_running_stats and self.running_mean is not None:
        with torch.no_grad():
            momentum = self.momentum if self.momentum is not None else 0.1
            self.running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
            unbiased = var.detach() * count / max(count - 1, 1)
            self.running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)
    shape = [1, -1] + [1] * (x.dim() - 2)
    out = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
    if self.affine:
        out = out * self.weight.view(shape) + self.bias.view(shape)
    return out


def losses(
    served: list[pieces.Piece], split: pieces.Split, loss: Callable[[pieces.Piece], torch.Tensor]
) -> list[torch.Tensor]:
    """``loss(piece)`` of every piece, the pieces of each microbatch (one a data-parallel rank) run
    side by side as threads meeting at every ``SyncBatchNorm``; in the order of ``served``."""
    found: dict[int, torch.Tensor] = {}
    with pieces.as_process(0, split.ranks):  # the main thread's view: the threads answer through it
        for microbatch in range(split.microbatches):
            _run_microbatch(served, split, loss, microbatch, found)
    return [found[number] for number in range(len(served))]


def _run_microbatch(
    served: list[pieces.Piece],
    split: pieces.Split,
    loss: Callable[[pieces.Piece], torch.Tensor],
    microbatch: int,
    found: dict[int, torch.Tensor],
) -> None:
    """The pieces of ``microbatch`` run side by side, their losses into ``found`` by number."""
    group = [(number, piece) for number, piece in enumerate(served) if piece.microbatch == microbatch]
    meeting = _Meeting(len(group))
    errors: list[BaseException] = []

    def run(
        index: int,
        number: int,
        piece: pieces.Piece,
        meeting: _Meeting = meeting,
        errors: list[BaseException] = errors,
    ) -> None:
        _ACTIVE.meeting, _ACTIVE.index, _ACTIVE.calls = meeting, index, 0
        try:
            with pieces.as_process(piece.rank, split.ranks):
                found[number] = loss(piece)
        except BaseException as error:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(error)
            meeting.barrier.abort()  # the others stop waiting for this one
        finally:
            _ACTIVE.meeting = None

    threads = [
        threading.Thread(target=run, args=(index, number, piece), name=f"truth-{piece.name()}")
        for index, (number, piece) in enumerate(group)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        first = next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
        raise first
