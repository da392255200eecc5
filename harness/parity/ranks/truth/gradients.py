"""The float64 model, a loss call's gradient, and what can explain a split that differs.

Why float64 on one process: summed in any order, float64 rounds some 1e-16 of a gradient's
largest element, where a split that means another thing than the whole batch is off by a
percent or more (measured: 8.5e-16 against 0.69 for a per-microbatch mean over uneven token
counts). So the distance between the split and the whole batch says what the training means, and
:data:`BOUND` separates the two with room on both sides (its derivation is in its docstring).

Dropout: each process draws its own masks, and no whole batch draws the masks its split would, so
the model runs in eval mode on both sides (dropout modules and the attention dropout that reads
``self.training`` are identities) but for its batch norms, which go on normalizing by their
batch's statistics (that is what they mean in training). A forward that still draws random numbers
(``F.dropout(..., training=True)``) is :class:`~pieces.Unsupported`, checked by running the whole
batch under two seeds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from harness.parity.workload import registry
from harness.parity.workload.spec import Workload
from harness.torch_private.modules import batch_norm_base

BOUND = 1e-9
"""How far (relative to the largest element of the whole batch's gradient) a split may land from
the whole batch when both mean the same thing. Both compute every gradient element as a sum of the
same terms, grouped otherwise (by piece, then over the pieces), through the same network; the
float64 results then differ by at most about ``(n + d) u`` times the sum of the terms' magnitudes
(Higham, Accuracy and Stability of Numerical Algorithms, 4.2: ``n`` terms summed in any order,
``d`` rounded operations on a path through the network, ``u = 2**-53 = 1.1e-16``). For a check's
model (``n`` up to 1e5 terms an element, ``d`` up to 1e2) and terms whose magnitudes sum to up to
1e2 times the largest element, that is ``1e5 x 1.1e-16 x 1e2 = 1.1e-9``. The assumption on the
magnitudes is checked on every step, not trusted: the whole batch is also computed with its
samples in reverse order (the same mathematics, summed in another order), and a reordering that
already moves the gradient past :data:`ROUNDING_ROOM` of the bound means the model is too
ill-conditioned for it (the stage says so instead of judging)."""

ROUNDING_ROOM = 1e-3
"""The share of :data:`BOUND` that a reordering of the whole batch may take (measured here: a few
1e-16 for every built-in workload, 1e-6 of the bound)."""


def float64_model(workload: Workload, seed: int) -> nn.Module:
    """The workload's model from ``seed`` in float64, in eval mode but for its batch norms; a
    Hugging Face mixture of experts computes its experts eagerly (its grouped matmul has no float64
    kernel on the CPU; the eager loop computes the same)."""
    model = registry.build_model(workload, seed).double()
    model.eval()
    batch_norm = batch_norm_base()
    for module in model.modules():
        if isinstance(module, batch_norm):
            module.train()
    experts = getattr(getattr(model, "config", None), "_experts_implementation", None)
    if experts not in (None, "eager") and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    return model


def trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def gradient(model: nn.Module, loss: Callable[[], torch.Tensor], retain_graph: bool = False) -> torch.Tensor:
    """The gradient of ``loss()`` over the trainable parameters, flattened into one float64 vector
    (parameters the loss does not reach count as zero)."""
    named = trainable(model)
    for _, param in named:
        param.grad = None
    value = loss()
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise ValueError("the loss must be a scalar tensor")
    value.backward(retain_graph=retain_graph)
    parts = []
    for _, param in named:
        grad = param.grad
        if grad is None:
            parts.append(torch.zeros(param.numel(), dtype=torch.float64))
        else:
            parts.append((grad.to_dense() if grad.is_sparse else grad).reshape(-1).double())
        param.grad = None
    return torch.cat(parts)


def gradients_of(model: nn.Module, losses: list[torch.Tensor]) -> list[torch.Tensor]:
    """:func:`gradient` of each of ``losses``, computed already in one graph (a lockstep's pieces
    share their ``SyncBatchNorm`` statistics): each backward keeps the graph for the next."""
    found = []
    for number, value in enumerate(losses):
        last = number == len(losses) - 1
        found.append(gradient(model, lambda value=value: value, retain_graph=not last))
    return found


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a - b|`` over ``max |b|``: the distance of ``a`` from ``b`` relative to ``b``'s largest
    element (0 where both are zero)."""
    a, b = a.detach(), b.detach()
    scale = float(b.abs().max()) if b.numel() else 0.0
    gap = float((a - b).abs().max()) if b.numel() else 0.0
    if scale == 0.0:
        return 0.0 if gap == 0.0 else float("inf")
    return gap / scale


def fitted_weights(columns: list[torch.Tensor], target: torch.Tensor) -> tuple[list[float], float]:
    """The weights ``w`` for which ``sum w_p columns[p]`` comes closest to ``target`` (least
    squares), and how far that sum still is from it (:func:`relative`)."""
    matrix = torch.stack(columns, dim=1)
    solution = torch.linalg.lstsq(matrix, target.unsqueeze(1)).solution.squeeze(1)
    return [float(w) for w in solution], relative(matrix @ solution, target)


def draws_random(model: nn.Module, loss: Callable[[], torch.Tensor]) -> bool:
    """Whether the loss changes with torch's RNG (a forward that draws random numbers)."""
    with torch.no_grad():
        with registry.seeded(1):
            first = loss()
        with registry.seeded(2):
            second = loss()
    return not torch.equal(first, second)


@contextlib.contextmanager
def outputs(model: nn.Module) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Every module's tensor output, in the order the forward produced them, while inside."""
    found: list[tuple[str, torch.Tensor]] = []
    handles = []
    for name, module in model.named_modules():
        if not name:
            continue

        def hook(_module: nn.Module, _inputs: object, output: object, name: str = name) -> None:
            if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
                output = output[0]
            if isinstance(output, torch.Tensor) and output.dim() > 0 and output.is_floating_point():
                found.append((name, output.detach().clone()))

        handles.append(module.register_forward_hook(hook))
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


def _called_once(outputs: list[tuple[str, torch.Tensor]]) -> set[str]:
    names = [name for name, _ in outputs]
    return {name for name in names if names.count(name) == 1}


def first_differing_module(
    model: nn.Module, whole: list[tuple[str, torch.Tensor]], pieces: list[list[tuple[str, torch.Tensor]]]
) -> tuple[str, str, float] | None:
    """The first module (in forward order) whose output on the whole batch differs, beyond
    :data:`BOUND`, from its outputs on the pieces concatenated: ``(name, class, distance)``;
    ``None`` when every module that can be compared so agrees (a difference in the loss only).
    Compared: modules called once per forward, whose outputs on the pieces concatenate to the
    whole's shape (an expert's activation, called once per expert on the tokens routed to it, does
    not line up row for row, and is left out)."""
    modules = dict(model.named_modules())
    once = {name for name in _called_once(whole) if all(name in _called_once(outs) for outs in pieces)}
    per_piece = [dict(outs) for outs in pieces]
    for name, output in whole:
        if name not in once:
            continue
        parts = [outs.get(name) for outs in per_piece]
        if any(part is None for part in parts):
            continue
        joined = torch.cat(parts)  # type: ignore[arg-type]
        if joined.shape != output.shape:
            continue
        distance = relative(joined, output)
        if distance > BOUND:
            return name, type(modules[name]).__name__, distance
    return None
