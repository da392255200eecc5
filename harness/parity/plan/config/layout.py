"""How the candidate engine lays the model out: FSDP1's sharding strategy and flat or original
parameters, FSDP2's resharding after forward, CPU offload.

Why a part: these fields mean something for one engine each, and the rules of which applies where
are the layout's own; the core configuration only names the engine.
"""

from __future__ import annotations

import dataclasses

from harness.parity.plan.config.axes import FSDP1_SHARDING, choice


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """The candidate's layout; fields that do not apply to its engine stay ``None``."""

    sharding: str | None = None
    """FSDP1 only: ``full_shard``, ``shard_grad_op``, ``no_shard`` or ``hybrid_shard``."""
    use_orig_params: bool | None = None
    """FSDP1 only."""
    reshard_after_forward: bool | None = None
    """FSDP2 only."""
    offload: bool = False
    """FSDP2: ``CPUOffloadPolicy(pin_memory=False)``; FSDP1: ``CPUOffload(offload_params=True)``."""

    def check(self, engine: str) -> None:
        """Refuse a field that does not apply to ``engine``, or one it needs that is missing."""
        if engine == "fsdp1":
            choice("sharding", self.sharding, FSDP1_SHARDING)
            if self.use_orig_params is None:
                raise ValueError("use_orig_params must be True or False for engine='fsdp1'")
        elif self.sharding is not None or self.use_orig_params is not None:
            raise ValueError(f"sharding and use_orig_params apply to engine='fsdp1' only, not {engine!r}")
        if engine == "fsdp2":
            if self.reshard_after_forward is None:
                raise ValueError("reshard_after_forward must be True or False for engine='fsdp2'")
        elif self.reshard_after_forward is not None:
            raise ValueError(f"reshard_after_forward applies to engine='fsdp2' only, not {engine!r}")
        if self.offload and engine == "ddp":
            raise ValueError("offload applies to FSDP engines only; use engine='fsdp1' or 'fsdp2'")
        if self.offload and engine == "user":
            raise ValueError(
                "engine='user' lays the model out as the workload's parallelize function does: set "
                "CPUOffloadPolicy in its fully_shard calls, not offload=True"
            )

    def id_parts(self, engine: str, mesh: list[str]) -> list[str]:
        """The id's words from the engine's on: FSDP1's strategy and ``orig``/``flat``, the mesh's
        words, FSDP2's ``reshard``/``keep``, ``offload``."""
        parts: list[str] = []
        if engine == "fsdp1":
            parts += [self.sharding, "orig" if self.use_orig_params else "flat"]  # type: ignore[list-item]
        parts += mesh
        if engine == "fsdp2":
            parts.append("reshard" if self.reshard_after_forward else "keep")
        if self.offload:
            parts.append("offload")
        return parts

    def reduce_layout_key(self, engine: str) -> tuple[object, ...]:
        """What of the candidate's gradient buffers the reference mirrors from 3 ranks on: FSDP1's
        strategy (a reduce-scatter, an all-reduce of the whole flat gradient, or HYBRID_SHARD's two
        stages) and ``use_orig_params`` (its alignment padding)."""
        if engine != "fsdp1":
            return ()
        stages = self.sharding if self.sharding in ("no_shard", "hybrid_shard") else "reduce_scatter"
        return (stages, self.use_orig_params)
