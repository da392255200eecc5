"""Check a workload before any rank trains it (controller side): bad input fails fast, naming the fix.

Why before: a workload whose data is not deterministic, whose loss is not a finite scalar or whose
``units`` are not in the model would make every configuration fail (or, worse, pass) for a reason
that has nothing to do with sharding. These checks build the model once in this process, draw
rank 0's batch of step 0 twice and run the loss once, unwrapped, in float32: a second or so.
A model that works here but crashes under FSDP is not rejected: that is a ``crash`` row.
"""

from __future__ import annotations

from typing import Any

from harness.parity.workload import registry, units
from harness.parity.workload.spec import Workload, WorkloadError


def _raised(workload: Workload, what: str) -> WorkloadError:
    return WorkloadError(registry.raised(f"workload {workload.name!r}: {what} raised"))


def same(first: Any, second: Any) -> bool:
    """Equal data: tensors of the same dtype, shape and values (through dicts, lists, tuples)."""
    import torch

    if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
        return (
            isinstance(first, torch.Tensor)
            and isinstance(second, torch.Tensor)
            and first.dtype == second.dtype
            and first.shape == second.shape
            and bool(torch.equal(first, second))
        )
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(same(first[k], second[k]) for k in first)
    if isinstance(first, (list, tuple)) and isinstance(second, (list, tuple)):
        return len(first) == len(second) and all(same(a, b) for a, b in zip(first, second, strict=True))
    return bool(first == second)


def check(workload: Workload, *, seed: int = 0) -> None:
    """Raise :class:`WorkloadError` if ``workload`` cannot give meaningful parity runs."""
    import torch
    from torch import nn

    try:
        model = registry.build_model(workload, seed)
    except Exception:  # noqa: BLE001 - the user's code raised: show where
        raise _raised(workload, "model()") from None
    if not isinstance(model, nn.Module):
        raise WorkloadError(
            f"workload {workload.name!r}: model() returned {type(model).__name__}, not a torch.nn.Module; "
            "pass the module class or a function that builds it"
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise WorkloadError(f"workload {workload.name!r}: the model has no trainable parameter")
    classes = units.classes_in(model)
    for unit in units.resolve(workload, model):
        if not isinstance(unit, type) or not issubclass(unit, nn.Module):
            raise WorkloadError(f"workload {workload.name!r}: units must be nn.Module classes, got {unit!r}")
        if not any(isinstance(m, unit) for m in model.modules() if m is not model):
            raise WorkloadError(
                f"workload {workload.name!r}: units class {unit.__qualname__} does not occur in the model "
                f"(below the root), so FSDP would wrap nothing with it; name classes the model contains: "
                f"{classes}"
            )
    try:
        batch = registry.make_batch(workload, seed, 0, 0)
        again = registry.make_batch(workload, seed, 0, 0)
    except Exception:  # noqa: BLE001
        raise _raised(workload, "batch(rank=0, step=0)") from None
    if not same(batch, again):
        raise WorkloadError(
            f"workload {workload.name!r}: batch(rank=0, step=0) returned different data on two calls. "
            "Data that is not deterministic makes every comparison meaningless (the reference and the "
            "candidate would train on different batches): draw it from torch's RNG, which the engine "
            "seeds per (seed, rank, step), or derive it from rank and step, not from a global counter, "
            "Python's random, numpy's RNG or the clock"
        )
    num_items = None
    if workload.takes_num_items:
        assert workload.items is not None, "checked by Workload"
        try:
            num_items = int(workload.items(batch))
        except Exception:  # noqa: BLE001
            raise _raised(workload, "items(batch) at step 0") from None
        if num_items < 1:
            raise WorkloadError(
                f"workload {workload.name!r}: items(batch) counts {num_items} items in rank 0's batch of "
                "step 0; a loss divided by num_items needs a batch with items to count"
            )
    try:
        with registry.seeded(registry.forward_seed(seed, 0, 0)):
            loss = workload.loss_of(model, batch, num_items)
    except Exception:  # noqa: BLE001
        raise _raised(workload, "loss(model, batch) at step 0") from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise WorkloadError(
            f"workload {workload.name!r}: loss(model, batch) must return a floating-point scalar tensor, "
            f"got {shape}; reduce it, e.g. with .mean()"
        )
    if not bool(torch.isfinite(loss).all()):
        raise WorkloadError(
            f"workload {workload.name!r}: the loss at step 0 is {loss.item()} in float32, before any "
            "sharding or scaling; a parity run needs a finite loss to start from"
        )
