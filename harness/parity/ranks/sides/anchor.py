"""A reference held to its candidate's state, a step at a time (rank side): the staged check's anchor.

Why: from 3 ranks on, a candidate that sums its ranks' gradients in another order than its
reference (another collective, NCCL's channels, a custom reduce-scatter) is a last bit away after
step 0, and a straight-through comparison then compounds that bit through every later step until
only a tolerance can decide. Anchored, the reference starts each step from the candidate's
parameters, optimizer state, buffers and scaler state, and takes the candidate's reduced
gradients once the staged check has judged them (``ranks/staged.py``): rounding never compounds,
and what is left to compare after the optimizer step is the update alone.

Every function here writes into the *reference*; the candidate is only read (its full tensors,
gathered by the caller through the engine's own collectives).
"""

from __future__ import annotations

from typing import Any

import torch

from harness.parity.ranks.sides import engines
from harness.parity.ranks.sides.full import gather


def local_grads(engine: engines.Engine) -> dict[str, torch.Tensor]:
    """The reference's unreduced gradients (after its ``backward``, before ``after_backward``
    reduces them): each rank's own, by name, in the dtype backward computed them in."""
    return {
        gather.clean_name(name): param.grad.detach().clone()
        for name, param in engine.trained_module().named_parameters()
        if param.grad is not None
    }


def adopt_grads(engine: engines.Engine, grads: dict[str, torch.Tensor]) -> None:
    """The candidate's reduced gradients (full, by name) become the reference's, in the dtype its
    own reduction gave them (``keep_low_precision_grads``: the working dtype on float32 masters,
    through ``.data`` as FSDP does)."""
    for name, param in engine.named_trainable():
        grad = grads.get(name)
        if grad is None:
            param.grad = None
            continue
        own = param.grad
        value = grad.to(param.device, own.dtype if own is not None else param.dtype)
        if own is not None and own.dtype != param.dtype:
            param.grad = torch.empty_like(param)
            param.grad.data = value
        else:
            param.grad = value.clone()


def load(
    engine: engines.Engine,
    optimizers: list[torch.optim.Optimizer],
    params: dict[str, torch.Tensor],
    state: dict[str, dict[str, torch.Tensor]],
    buffers: dict[str, torch.Tensor],
) -> None:
    """The candidate's full parameters and optimizer state (``engine.full_after_step``'s names)
    and this rank's buffers written into the reference's (float32 masters for a low-precision
    twin: its working copy is refreshed from them at the next forward)."""
    with torch.no_grad():
        for name, param in engine.module.named_parameters():
            value = params.get(gather.clean_name(name))
            if value is None:
                raise KeyError(f"anchoring the reference: the candidate has no parameter {name!r}")
            param.copy_(value)
        names = {id(p): n for n, p in engine.named_trainable()}
        for opt in optimizers:
            for group in opt.param_groups:
                for param in group["params"]:
                    wanted = state.get(names[id(param)])
                    if wanted:
                        _load_state(opt.state[param], wanted, param.device)
        for name, buffer in engine.trained_module().named_buffers():
            value = buffers.get(gather.clean_name(name))
            if value is not None:
                buffer.copy_(value)


def _load_state(own: dict[str, Any], wanted: dict[str, torch.Tensor], device: torch.device) -> None:
    for key, value in wanted.items():
        current = own.get(key)
        if isinstance(current, torch.Tensor):
            current.copy_(value)
        elif current is None:  # the reference has not stepped where the candidate has
            own[key] = value.to(device).clone() if value.dim() else value.clone()
        else:
            own[key] = type(current)(value.item())


def load_scaler(reference: Any, candidate: Any) -> None:
    """The candidate scaler's scale and growth tracker into the reference's (torch's keys: ours
    reads and writes them)."""
    found = candidate.state_dict()
    if found:
        reference.load_state_dict(found)


def total_norm(engine: engines.Engine) -> float:
    """The 2-norm of the reference's (unscaled) gradients, measured without clipping."""
    grads = [p.grad for _, p in engine.named_trainable() if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0


def clip_with_norm(engine: engines.Engine, max_norm: float, norm: float) -> None:
    """Clip the reference's gradients by the coefficient ``max_norm / (norm + 1e-6)`` that the
    candidate's measured ``norm`` gives (once the check found that norm right): the same
    multiplication as the candidate's, so the update can stay bitwise."""
    params = [p for _, p in engine.named_trainable() if p.grad is not None]
    if params:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, torch.tensor(norm, dtype=torch.float32))


Held = tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]], dict[str, torch.Tensor]]
"""A candidate's full parameters, full optimizer state (by name) and this rank's buffers."""


def candidate_state(engine: engines.Engine, optimizers: list[torch.optim.Optimizer]) -> Held:
    """What the reference is anchored to: the candidate's full parameters and optimizer state
    (a collective: every rank calls it) and this rank's own buffers."""
    params, state = engine.full_after_step(optimizers)
    return params, state, engine.own_buffers()


def hold(
    engine: engines.Engine,
    optimizers: list[torch.optim.Optimizer],
    scaler: Any,
    held: Held,
    candidate_scaler: Any,
) -> None:
    """The reference (``engine``, its ``optimizers`` and ``scaler``) set to the candidate's
    ``held`` state and its scaler's: both sides then start the next step from the same state."""
    params, state, buffers = held
    load(engine, optimizers, params, state, buffers)
    load_scaler(scaler, candidate_scaler)
