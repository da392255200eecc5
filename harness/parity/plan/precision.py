"""The candidate's mixed precision as one value, from which both sides of a parity run are derived.

Why one value: a verdict means "sharding changed nothing", so the DDP reference must do everything
the candidate does except shard. FSDP1 and FSDP2 do *different* things in the same precision
(torch 2.13, ``torch/distributed/fsdp/api.py`` and ``_fully_shard/_fsdp_api.py``):

=========================  ==============================  ======================================
field                      FSDP1 ``MixedPrecision``        FSDP2 ``MixedPrecisionPolicy``
=========================  ==============================  ======================================
``param``                  ``param_dtype``                 ``param_dtype``
``reduce``                 ``reduce_dtype``                ``reduce_dtype`` (== param: None)
``buffers``                ``buffer_dtype`` (cast once)    none: buffers are never cast
``inputs``                 the root only (default)         every ``fully_shard`` module
``output``                 none                            ``output_dtype``, every module
``keep_low_precision_...`` grads stay in ``param_dtype``   none: grads always in the param's dtype
=========================  ==============================  ======================================

The engines build FSDP's arguments from a :class:`PrecisionPolicy` (``engines.FSDP1.wrap``,
``engines.FSDP2.wrap``) and the low-precision DDP reference emulates the very same value
(``references.LowPrecisionDDP``), so the two cannot drift apart: a reference that casts buffers the
candidate keeps in float32 (Hugging Face's rotary ``inv_freq``) is a mismatch in *this* value,
not in two copies of it. Torch-free (a :class:`~harness.parity.ParityConfig` carries one).
"""

from __future__ import annotations

import dataclasses

DTYPE_NAMES = ("fp32", "fp16", "bf16")
INPUT_CASTS = ("root", "units", "none")
"""Where floating-point forward inputs are cast to ``param``: at the root module only (FSDP1's
default, ``cast_root_forward_inputs``), at every wrapped module, root and units (FSDP2's
``cast_forward_inputs``, FSDP1's ``cast_forward_inputs=True``), or nowhere."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PrecisionPolicy:
    """How a candidate runs in low precision; dtypes by name (``fp32``, ``fp16``, ``bf16``)."""

    param: str
    """Dtype of the parameters in forward and backward (the sharded/master copy stays float32)."""
    reduce: str | None = None
    """Dtype of the gradient reduction; ``None``: ``param``."""
    buffers: str | None = None
    """Dtype floating-point buffers are cast to (FSDP1 ``buffer_dtype``); ``None``: buffers keep
    the dtype the model gave them (FSDP2 always: it has no buffer dtype)."""
    inputs: str = "root"
    """Where forward inputs are cast to ``param``; one of :data:`INPUT_CASTS`."""
    output: str | None = None
    """FSDP2 ``output_dtype``: every wrapped module's floating-point outputs cast to it."""
    keep_low_precision_grads: bool = False
    """FSDP1: gradients handed to the optimizer in ``param`` instead of float32."""

    def __post_init__(self) -> None:
        for field in ("param", "reduce", "buffers", "output"):
            value = getattr(self, field)
            allowed = DTYPE_NAMES if field != "param" else DTYPE_NAMES[1:]
            if value is not None or field == "param":
                if value not in allowed:
                    raise ValueError(f"PrecisionPolicy.{field} must be one of {allowed}, got {value!r}")
        if self.inputs not in INPUT_CASTS:
            raise ValueError(f"PrecisionPolicy.inputs must be one of {INPUT_CASTS}, got {self.inputs!r}")

    @property
    def reduce_dtype(self) -> str:
        """The dtype gradients are reduced in (``reduce``, else ``param``)."""
        return self.reduce or self.param

    def check_for(self, engine: str) -> None:
        """Raise ``ValueError`` for a field ``engine`` has no way to express."""
        if engine == "fsdp2":
            if self.buffers is not None:
                raise ValueError(
                    f"FSDP2 never casts buffers (MixedPrecisionPolicy has no buffer dtype), got buffers={self.buffers!r}"
                )
            if self.keep_low_precision_grads:
                raise ValueError(
                    "keep_low_precision_grads is FSDP1's; FSDP2 hands float32 grads to the optimizer"
                )
            if self.inputs == "root":
                raise ValueError(
                    "FSDP2 casts inputs at every fully_shard module or nowhere: inputs='units' or 'none'"
                )
        elif engine == "fsdp1":
            if self.output is not None:
                raise ValueError(
                    f"output dtype is FSDP2's; FSDP1's MixedPrecision has none, got output={self.output!r}"
                )
        else:
            raise ValueError(f"a mixed-precision policy applies to FSDP engines only, not {engine!r}")

    def word(self, default: PrecisionPolicy | None) -> str:
        """What differs from ``default``, as one word of a configuration id (``reduce_fp32.out_fp32``)."""
        parts = []
        base = default or PrecisionPolicy(param=self.param)
        if self.reduce_dtype != base.reduce_dtype:
            parts.append(f"reduce_{self.reduce_dtype}")
        if self.buffers != base.buffers:
            parts.append(f"buffers_{self.buffers or 'kept'}")
        if self.inputs != base.inputs:
            parts.append(f"inputs_{self.inputs}")
        if self.output != base.output:
            parts.append(f"out_{self.output or 'kept'}")
        if self.keep_low_precision_grads != base.keep_low_precision_grads:
            parts.append("lowgrads" if self.keep_low_precision_grads else "fp32grads")
        return ".".join(parts)


def default(engine: str, precision: str) -> PrecisionPolicy | None:
    """What the engines apply for ``precision`` when a configuration names no policy: ``param`` and
    ``reduce`` in the precision, and each FSDP's own defaults for the rest (FSDP1 casts buffers
    and the root's inputs; FSDP2 casts no buffer and every module's inputs). ``None`` in float32."""
    if precision == "fp32":
        return None
    if engine == "fsdp2":
        return PrecisionPolicy(param=precision, reduce=precision, inputs="units")
    return PrecisionPolicy(param=precision, reduce=precision, buffers=precision, inputs="root")
