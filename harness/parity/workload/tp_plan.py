"""A workload's tensor-parallel plan: its own ``{pattern: ParallelStyle}``, or ``"auto"`` read from
a Hugging Face model, resolved to the modules it names.

Why ``"auto"``: Hugging Face models that support tensor parallelism name it in their configuration
class (``LlamaConfig.base_model_tp_plan = {"layers.*.self_attn.q_proj": "colwise", ...}``), for the
base model (``model.model`` inside ``LlamaForCausalLM``). ``"auto"`` maps those words to torch's
styles (``colwise`` -> ``ColwiseParallel()``, ``rowwise`` -> ``RowwiseParallel()``) and prefixes
the keys with the base model's attribute, as ``units="auto"`` reads ``_no_split_modules``.

Why resolve the patterns here: ``parallelize_module`` skips a key that matches no module with a
warning, so a plan with a typo trains without TP on that module and nobody is told. Here such a
key is an error naming it. Patterns are matched as ``parallelize_module`` matches them: the key
split at ``.``, each part against one name part with ``fnmatch`` (``*`` never spans a dot).
"""

from __future__ import annotations

from fnmatch import fnmatch
from typing import TYPE_CHECKING, Any

from harness.parity.workload.spec import Workload, WorkloadError

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from torch import nn

AUTO = "auto"
WORDS = ("colwise", "rowwise")
"""The words of a Hugging Face plan that ``"auto"`` maps (the reference mirrors these two)."""


def _style(word: str) -> Any:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}[word]()


def _hugging_face_plan(workload: Workload, model: nn.Module) -> dict[str, Any]:
    config = getattr(model, "config", None)
    words = getattr(config, "base_model_tp_plan", None)
    if not words:
        raise WorkloadError(
            f"workload {workload.name!r}: tp_plan='auto' reads the Hugging Face model's "
            f"config.base_model_tp_plan, and {type(model).__name__} has "
            f"{'no config' if config is None else repr(words)}; give the plan yourself, e.g. "
            "tp_plan={'layers.*.attention.q': ColwiseParallel(), 'layers.*.attention.o': RowwiseParallel()}"
        )
    prefix = getattr(model, "base_model_prefix", "")
    inner = prefix and getattr(model, prefix, None) is not None and getattr(model, prefix) is not model
    plan = {}
    for key, word in words.items():
        if word not in WORDS:
            raise WorkloadError(
                f"workload {workload.name!r}: tp_plan='auto': {type(model).__name__}'s base_model_tp_plan "
                f"gives {key!r} the style {word!r}, which is not one of {WORDS}; give the plan yourself "
                "with torch's ParallelStyles"
            )
        plan[f"{prefix}.{key}" if inner else key] = _style(word)
    return plan


def resolve(workload: Workload, model: nn.Module) -> dict[str, Any]:
    """``workload.tp_plan`` as ``parallelize_module`` takes it (``"auto"`` read from ``model``).
    Raises :class:`WorkloadError` naming the fix when there is none or a key matches no module."""
    if workload.tp_plan is None:
        raise WorkloadError(
            f"workload {workload.name!r} has no tp_plan: give it Workload(tp_plan={{pattern: "
            "ParallelStyle}}) or tp_plan='auto' for a Hugging Face model with base_model_tp_plan"
        )
    plan = _hugging_face_plan(workload, model) if workload.tp_plan == AUTO else dict(workload.tp_plan)  # type: ignore[arg-type]
    names = [name for name, _ in model.named_modules() if name]
    for key in plan:
        if not any(matches(key, name) for name in names):
            raise WorkloadError(
                f"workload {workload.name!r}: tp_plan key {key!r} matches no module of "
                f"{type(model).__name__} (parallelize_module would skip it with a warning and train that "
                f"module without TP); module names look like {names[:6]}"
            )
    return plan


_HEADS = (("num_attention_heads", "attention heads"), ("num_key_value_heads", "key-value heads"))


def check_degree(workload: Workload, model: nn.Module, degree: int) -> None:
    """Refuse a TP degree that splits a Hugging Face model's heads under its own plan
    (``tp_plan="auto"``): its column-split q, k and v give each rank whole heads only when the
    degree divides the number of heads and of key-value heads; a rank holding part of a head fails
    in the model's reshape, far from the cause. Raises :class:`WorkloadError` naming the fix."""
    config = getattr(model, "config", None)
    if workload.tp_plan != AUTO or config is None:
        return
    for field, words in _HEADS:
        heads = getattr(config, field, None)
        if isinstance(heads, int) and heads % degree:
            fits = [d for d in range(2, heads + 1) if heads % d == 0]
            raise WorkloadError(
                f"workload {workload.name!r}: tp {degree} splits {type(model).__name__}'s {heads} {words} "
                f"({field}), and each TP rank must hold whole heads; use a tp that divides {heads} "
                f"({', '.join(map(str, fits)) or 'none above 1'}), or a model with more heads"
            )


def matches(key: str, name: str) -> bool:
    """Whether the plan key ``key`` names the module ``name`` (part by part, ``fnmatch``)."""
    keys, parts = key.split("."), name.split(".")
    return len(keys) == len(parts) and all(fnmatch(part, k) for k, part in zip(keys, parts, strict=True))


def styled_modules(plan: dict[str, Any], model: nn.Module) -> list[tuple[str, Any]]:
    """``(module name, style)`` of every module the plan parallelizes, in module order (a module two
    keys name gets the later key's style, as ``parallelize_module`` applies keys in order)."""
    found: dict[str, Any] = {}
    for key, style in plan.items():
        for name, _ in model.named_modules():
            if name and matches(key, name):
                found[name] = style
    order = {name: index for index, (name, _) in enumerate(model.named_modules())}
    return sorted(found.items(), key=lambda item: order[item[0]])


def sharded_dims(plan: dict[str, Any], model: nn.Module) -> dict[str, int]:
    """``{parameter name: the dim the TP group shards it on}`` for the parameters ``plan`` splits
    (torch's styles: a ``ColwiseParallel`` linear's weight and bias on dim 0, an embedding's weight
    on dim 1; a ``RowwiseParallel`` linear's weight on dim 1, its bias whole, an embedding's weight
    on dim 0). Every other parameter, a ``SequenceParallel`` norm's included, is whole on each TP
    rank."""
    from torch import nn
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    modules = dict(model.named_modules())
    dims: dict[str, int] = {}
    for name, style in styled_modules(plan, model):
        module = modules[name]
        embedding = isinstance(module, nn.Embedding)
        if isinstance(style, ColwiseParallel):
            dims[f"{name}.weight"] = 1 if embedding else 0
            if getattr(module, "bias", None) is not None:
                dims[f"{name}.bias"] = 0
        elif isinstance(style, RowwiseParallel):
            dims[f"{name}.weight"] = 0 if embedding else 1
    return dims


def describe(workload: Workload, model: nn.Module) -> str:
    """The plan in words (``--list`` and the report): ``layers.*.attention.q ColwiseParallel, ...``,
    and where an ``"auto"`` plan came from."""
    plan = resolve(workload, model)
    said = ", ".join(f"{key} {type(style).__name__}" for key, style in plan.items())
    if workload.tp_plan == AUTO:
        return f"{said} (auto, from {type(model).__name__}.config.base_model_tp_plan)"
    return said
