"""The precision a configuration trains in: the low dtype, the recipe that applies it, and the
candidate's mixed-precision policy in full.

Why a part: the dtype alone does not say where it is applied (``plan/recipe.py``: FSDP's policy,
a float32 reduce, autocast, or both), and each recipe has its own rules against the engine; the
part owns them, its words in the id and its share of the reference key.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from harness.parity.plan import recipe as recipes
from harness.parity.plan.config.axes import PRECISIONS, choice
from harness.parity.plan.precision import PrecisionPolicy
from harness.parity.workload import registry

if TYPE_CHECKING:
    from harness.parity.plan.config import ParityConfig


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Precision:
    """``Precision()`` is float32; ``Precision(dtype="bf16", recipe="reduce32")`` is ``bf16-reduce32``."""

    dtype: str = "fp32"
    """``fp32``, or ``fp16``/``bf16``: FSDP mixed precision (param and reduce dtype); the DDP
    reference then trains a copy in that dtype and keeps float32 master weights, as FSDP does."""
    recipe: str = "pure"
    """How ``dtype`` is applied (``recipe.KINDS``): ``pure`` (FSDP's policy), ``reduce32`` (the
    policy reducing in float32), ``autocast`` (float32 parameters, the forward under
    ``torch.autocast``) or ``mixed`` (the policy and autocast); see ``recipe.py``. A float32
    precision has no recipe: it is reset to ``pure``, so ``Precision()`` is the plain float32 twin
    of any recipe (the expected gap's run)."""
    mixed: PrecisionPolicy | None = None
    """The candidate's mixed-precision policy in full (reduce dtype, buffers, input and output
    casts, low-precision grads); ``None``: the engine's default for ``dtype``
    (``precision.default``). The reference emulates whichever applies (:meth:`policy`)."""

    def __post_init__(self) -> None:
        choice("precision", self.dtype, PRECISIONS)
        if self.dtype == "fp32" and self.recipe != "pure":
            object.__setattr__(self, "recipe", "pure")  # frozen: the one normalisation

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            raise TypeError(
                f"a Precision is not a string: compare its dtype (precision.dtype == {other!r}) or its "
                "recipe's name (precision.name)"
            )
        if not isinstance(other, Precision):
            return NotImplemented
        return (self.dtype, self.recipe, self.mixed) == (other.dtype, other.recipe, other.mixed)

    def __hash__(self) -> int:
        return hash((self.dtype, self.recipe, self.mixed))

    def check(self, config: ParityConfig) -> None:
        """Refuse a recipe or policy the configuration cannot run as named."""
        if config.engine == "user":
            if self.dtype != "fp32" or self.mixed is not None:
                raise ValueError(
                    "engine='user' trains in the precision the workload's parallelize function sets "
                    "(its MixedPrecisionPolicy per fully_shard, read on the ranks): leave precision fp32 "
                    f"and mixed None, got precision={self.dtype!r}, mixed={self.mixed!r}"
                )
            return
        recipes.check(self.recipe, config.engine, self.dtype, self.mixed)
        if self.mixed is not None:
            if self.mixed.param != self.dtype:
                raise ValueError(
                    f"mixed.param must be the configuration's precision {self.dtype!r}, got {self.mixed.param!r}"
                )
            self.mixed.check_for(config.engine)
        if registry.get(config.workload).sparse and self.recipe != "pure":
            raise ValueError(
                "the sparse 'embedding' workload trains in its precision throughout: recipe 'pure' only"
            )

    @property
    def name(self) -> str:
        """The recipe as users name it: ``fp32``, ``pure-bf16``, ``fp16-reduce32``, ``autocast-fp16``,
        ``mixed-bf16`` (``recipe.RECIPES``)."""
        return recipes.name(self.recipe, self.dtype)

    @property
    def autocast(self) -> str | None:
        """The dtype both sides' forward autocasts to (``fp16``/``bf16``), or ``None``."""
        return self.dtype if self.recipe in recipes.AUTOCASTING else None

    def policy(self, engine: str) -> PrecisionPolicy | None:
        """The candidate's mixed precision under ``engine`` (``None`` in float32): what the FSDP
        engines apply and the low-precision DDP reference emulates, field by field. ``None`` under
        ``user``: the function's policies are read on the ranks (``ranks/sides/user``)."""
        if engine == "user":
            return None
        return recipes.policy(self.recipe, engine, self.dtype, self.mixed)

    def id_parts(self, engine: str) -> list[str]:
        """``autocast``/``mixed`` before the dtype, ``reduce32`` after it, then a policy's own word
        (none under ``user``: the function sets the precision)."""
        if engine == "user":
            return []
        parts = [self.recipe] if self.recipe in recipes.AUTOCASTING else []
        parts.append(self.dtype)
        if self.recipe == "reduce32":
            parts.append("reduce32")
        if self.mixed is not None and (
            word := self.mixed.word(recipes.policy(self.recipe, engine, self.dtype, None))
        ):
            parts.append(word)
        return parts
