"""Precision recipes: *how* a configuration's low dtype is applied, named as users name them.

Why a dimension of its own: ``precision`` says which low dtype a run uses, but not where. Users run
four different things with the same dtype (docs/architecture.md, "Recipes"), and FSDP and DDP
differ in each of them, so a parity tool that checks one answers a question nobody asked:

=================  =======================================================================
recipe             what the candidate does (its reference, the unsharded twin, does the same)
=================  =======================================================================
``pure-D``         FSDP casts parameters to ``D`` and reduces in ``D`` (FSDP1
                   ``MixedPrecision(D, D, D)``, FSDP2 ``MixedPrecisionPolicy(D, D)``); the
                   matrix's original rows, whose ids name only ``D``
``D-reduce32``     as ``pure-D`` but gradients reduced in float32 (torchtitan's default)
``autocast-D``     float32 parameters, the forward under ``torch.autocast(dtype=D)`` (the
                   classic AMP recipe, the reason a grad scaler exists)
``mixed-D``        FSDP's ``pure-D`` policy *and* autocast (accelerate's, Lightning's "-mixed")
=================  =======================================================================

Every recipe trains through the loss scaler, bf16 ones too, as the ``pure-bf16`` rows always have
(the scaler then only ever grows: bf16 has float32's range). A float32 run has no recipe.
Torch-free: a :class:`~harness.parity.ParityConfig` carries the recipe's kind and dtype.
"""

from __future__ import annotations

import dataclasses

from harness.parity.plan import precision as mixed_precision
from harness.parity.plan.precision import PrecisionPolicy

KINDS = ("pure", "reduce32", "autocast", "mixed")
"""``Precision.recipe``: how the low dtype is applied (the recipe's name without its dtype)."""
LOW = ("fp16", "bf16")
RECIPES = tuple(f"{d}-reduce32" if kind == "reduce32" else f"{kind}-{d}" for kind in KINDS for d in LOW)
"""Every recipe name: ``pure-fp16``, ``pure-bf16``, ``fp16-reduce32``, ... ``mixed-bf16``."""
AUTOCASTING = ("autocast", "mixed")
"""The kinds whose forward runs under ``torch.autocast``."""


def name(kind: str, precision: str) -> str:
    """The recipe's name (``autocast-fp16``); ``fp32`` for a float32 run."""
    if precision == "fp32":
        return "fp32"
    return f"{precision}-reduce32" if kind == "reduce32" else f"{kind}-{precision}"


def parse(recipe: str) -> tuple[str, str]:
    """``(kind, precision)`` of a recipe name; ``ValueError`` listing the names otherwise."""
    for kind in KINDS:
        for dtype in LOW:
            if name(kind, dtype) == recipe:
                return kind, dtype
    raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")


def policy(kind: str, engine: str, precision: str, given: PrecisionPolicy | None) -> PrecisionPolicy | None:
    """The FSDP mixed-precision policy the recipe gives ``engine`` (``None``: float32 parameters,
    no policy): the configuration's own ``given`` one, else the engine's default for the dtype,
    reducing in float32 for ``reduce32``."""
    if precision == "fp32" or kind == "autocast":
        return None
    if given is not None:
        return given
    base = mixed_precision.default(engine, precision)
    if kind == "reduce32" and base is not None:
        return dataclasses.replace(base, reduce="fp32")
    return base


def check(kind: str, engine: str, precision: str, given: PrecisionPolicy | None) -> None:
    """Raise ``ValueError`` for a recipe the configuration cannot run as named."""
    if kind not in KINDS:
        raise ValueError(f"recipe must be one of {KINDS}, got {kind!r}")
    if kind == "autocast" and given is not None:
        raise ValueError(
            "recipe 'autocast' keeps float32 parameters, so it takes no mixed-precision policy; "
            "use recipe='mixed' for FSDP's policy plus autocast"
        )
    if kind == "reduce32" and given is not None and given.reduce_dtype != "fp32":
        raise ValueError(f"recipe 'reduce32' reduces in fp32, but mixed.reduce is {given.reduce_dtype!r}")
    if kind != "pure" and engine == "ddp":
        raise ValueError(f"recipe {kind!r} applies to FSDP candidates; a DDP candidate runs 'pure' only")
