"""Which module classes become FSDP units: the workload's own tuple, or ``"auto"`` resolved on the model.

Why ``"auto"``: Hugging Face models name the layers that must not be split across devices in the
class attribute ``_no_split_modules`` (``["LlamaDecoderLayer"]``); accelerate's FSDP auto-wrap and
torchtitan-style recipes make those the FSDP units. ``"auto"`` takes the same names and resolves
each to the class of that name found among the model's submodules, so a user need not import
layer classes from deep inside a library. Resolved on a built model (the engines on the ranks, the
checks on the controller), since only the model knows which classes it contains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.parity.workload.spec import Workload, WorkloadError

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from torch import nn

AUTO = "auto"


def resolve(workload: Workload, model: nn.Module) -> tuple[type[nn.Module], ...]:
    """``workload.units``, or for ``"auto"`` the classes ``type(model)._no_split_modules`` names,
    in the order named. Raises :class:`WorkloadError` naming the fix when that cannot be done."""
    if workload.units != AUTO:
        return workload.units  # type: ignore[return-value]
    names = getattr(type(model), "_no_split_modules", None)
    if not names:
        raise WorkloadError(
            f"workload {workload.name!r}: units='auto' reads {type(model).__name__}._no_split_modules, "
            f"which is {names!r}; name the FSDP units yourself, e.g. units=(MyDecoderLayer,) "
            f"(one of the classes the model contains: {classes_in(model)[:8]})"
        )
    found = {type(m).__name__: type(m) for m in model.modules() if m is not model}
    missing = [name for name in names if name not in found]
    if len(missing) == len(names):
        raise WorkloadError(
            f"workload {workload.name!r}: units='auto': {type(model).__name__}._no_split_modules names "
            f"{list(names)}, none of which occurs in the model; name the FSDP units yourself, "
            f"e.g. units=(MyDecoderLayer,)"
        )
    return tuple(found[name] for name in names if name in found)


def classes_in(model: nn.Module) -> list[str]:
    """The class names of the model's submodules (below the root), sorted."""
    return sorted({type(m).__name__ for m in model.modules() if m is not model})


def describe(workload: Workload, model: nn.Module) -> str:
    """Which units ``workload`` gets on ``model``, in words (``--list`` and the report say it):
    ``LlamaDecoderLayer (auto, from LlamaForCausalLM._no_split_modules)``."""
    chosen = resolve(workload, model)
    names = ", ".join(u.__name__ for u in chosen) or "none (the root only)"
    if workload.units == AUTO:
        return f"{names} (auto, from {type(model).__name__}._no_split_modules)"
    return names


def chosen(name_or_spec: str) -> str:
    """:func:`describe` for a registered name or ``module:function`` (builds the model once, on
    the controller; a :class:`WorkloadError` names the fix)."""
    from harness.parity.workload import registry

    workload = registry.get(name_or_spec)
    return describe(workload, registry.build_model(workload, 0))
