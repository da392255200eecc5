"""Named tolerance profiles: how close a candidate must stay to its reference.

Why named: a report row says ``fp16`` and the reader can look up exactly what that allows. A value
``c`` of the candidate matches the reference value ``r`` when ``|c - r| <= atol + rtol * |r|``,
computed in float64, with NaN matching NaN and an infinity matching the same infinity. ``exact``
asks every element to be equal (NaN at the same places; ``-0.0`` equals ``0.0``).

| profile | rtol | atol | used for |
|---|---|---|---|
| ``exact`` | 0 | 0 | gloo at any world size: measured bit-exact (every precision, fused optimizers included; from 3 ranks on, the reference reduces as its candidate does, and a fused optimizer's reference steps the candidate's shards) |
| ``fp32`` | 1.3e-6 | 1e-5 | clipping under FSDP (a norm summed in another order); float32 on NCCL (fallback) |
| ``bf16`` | 1.6e-2 | 1e-3 | bfloat16 mixed precision on NCCL (fallback) |
| ``fp16`` | 1e-3 | 1e-3 | float16 mixed precision on NCCL (fallback) |

The ``rtol`` values are torch.testing's defaults for each dtype. They decide no gloo row of a
non-clipping loop: those are ``exact`` at every world size. And they no longer decide a row whose
straight comparison is not bitwise: the staged check does (``judge/staged.py``: the reference
re-anchored each step; local gradients bitwise, each reduced element within the order-free bound,
the update bitwise). Where a tolerance decides,
the report says so (``toleranced``, the profile's name) rather than calling the row bitwise. A
tolerance is a fallback, not a proof: a relative tolerance of ``bf16``'s size lets a systematic
0.5 % error through, which is why gloo rows no longer use one. Discrete state (the scale, the
growth tracker, found_inf and every skip decision) must match exactly whatever the profile.
"""

from __future__ import annotations

import dataclasses

from harness.parity.plan.config import ParityConfig
from harness.parity.workload import registry


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ToleranceProfile:
    """``|candidate - reference| <= atol + rtol * |reference|``, elementwise in float64."""

    name: str
    rtol: float
    """Relative tolerance, >= 0."""
    atol: float
    """Absolute tolerance, >= 0."""

    def __post_init__(self) -> None:
        if not self.rtol >= 0:
            raise ValueError(f"rtol must be >= 0, got {self.rtol}")
        if not self.atol >= 0:
            raise ValueError(f"atol must be >= 0, got {self.atol}")

    @property
    def bitwise(self) -> bool:
        return self.rtol == 0 and self.atol == 0

    def describe(self) -> str:
        return "bitwise" if self.bitwise else f"rtol {self.rtol:g}, atol {self.atol:g}"


EXACT = ToleranceProfile(name="exact", rtol=0.0, atol=0.0)
FP32 = ToleranceProfile(name="fp32", rtol=1.3e-6, atol=1e-5)
BF16 = ToleranceProfile(name="bf16", rtol=1.6e-2, atol=1e-3)
FP16 = ToleranceProfile(name="fp16", rtol=1e-3, atol=1e-3)
PROFILES = {profile.name: profile for profile in (EXACT, FP32, BF16, FP16)}


def get(name: str) -> ToleranceProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"tolerance profile must be one of {sorted(PROFILES)}, got {name!r}") from None


def profile_for(config: ParityConfig) -> ToleranceProfile:
    """``exact`` on gloo at any world size: at 2 ranks the sum of two addends does not depend on
    the order, and from 3 on the reference reduces through the candidate's own collectives on its
    buffer layout (``ranks/sides/reduce_layout.py``), so every element is summed in the same order on
    both sides (gloo's ring is deterministic), and FSDP's divisions by its divide factors are the
    same operations. A fused optimizer too: its CPU kernel rounds an element by its offset in the
    tensor it is given (the vector body or the scalar tail), and the reference steps the
    candidate's shards as tensors of their own (``ranks/sides/optim/step_pieces.py``), so every element
    takes the same path on every CPU. Except for an FSDP engine on path ``unscale_clip``: it sums
    the total norm in another order than the reference (``judge/clip_norm.py``: measured 1 to 2
    float32 ulp apart), so where the clip bites every gradient is multiplied by a coefficient an ulp off
    (measured: the MLP clipped at 0.05 fails ``exact`` from step 3 to 5 in every precision under
    FSDP1, and in fp16 and bf16 under FSDP2, and passes ``fp32``; a DDP candidate clips as its
    reference does). Elsewhere (NCCL: its algorithm and channel count, not the buffer alone, set
    the order, and no run here has shown the mirrored reduction bitwise there), the profile of the
    precision, which the report marks as a fallback tolerance. A workload whose sums are exact in
    any order (``Workload.exact_sums``, the built-in ``canary``) is ``exact`` everywhere."""
    if _exact_sums(config.workload):
        return EXACT  # the canary: every sum exact in any order, on any backend
    if config.backend == "gloo":
        clip_order = config.loop.path == "unscale_clip" and config.engine != "ddp"
        return FP32 if clip_order else EXACT
    return {"fp32": FP32, "bf16": BF16, "fp16": FP16}[config.precision.dtype]


def _exact_sums(workload: str) -> bool:
    """Whether ``workload`` declares that its gradients sum exactly in any order (a workload that
    cannot be resolved here declares nothing: its own error comes where it is built)."""
    try:
        return registry.get(workload).exact_sums
    except Exception:  # noqa: BLE001 - resolving is the rank's job; here only a hint is read
        return False
