"""A resume row, checked: the step it resumes at, how it checkpoints, the layout and world size it
comes back in.

Why a part: a resume is one more axis of a configuration with rules of its own (a step inside the
run, a method the workload supports, a layout change DCP can reshard); the part owns them, its
words in the id and its share of the reference key.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from harness.parity.plan.config.layout import Layout
from harness.parity.workload import registry

if TYPE_CHECKING:
    from harness.parity.plan.config import ParityConfig

METHODS = ("dcp", "sharded_optimizer", "user")
"""How a resume row checkpoints (``ranks/restart/resume_store.py``): ``dcp`` (torch.distributed.checkpoint's
``get_state_dict``/``set_state_dict``, sharded, to a folder), ``sharded_optimizer`` (the optimizer
through ``scaler.ShardedOptimizer``'s name-keyed state), ``user`` (the workload's ``save``/``load``)."""
WORDS = {"dcp": "dcp", "sharded_optimizer": "sopt", "user": "user"}
"""Each method's word in a configuration id (``resume@3-sopt``)."""

LAYOUTS: dict[str, tuple[str, Layout]] = {
    "fsdp_flat": ("fsdp1", Layout(sharding="full_shard", use_orig_params=False)),
    "fsdp_orig": ("fsdp1", Layout(sharding="full_shard", use_orig_params=True)),
    "fully_shard": ("fsdp2", Layout(reshard_after_forward=True)),
    "fully_shard_keep": ("fsdp2", Layout(reshard_after_forward=False)),
    "data_parallel": ("ddp", Layout()),
}
"""The layouts a resume row may come back in, as an engine and its layout (``...-into_fully_shard_keep``
in ids): FSDP1 FULL_SHARD with flat or original parameters, FSDP2 resharding after forward or
keeping, DDP. Named so that no id holds another engine's name (``-k`` matches substrings of ids:
``-k "not fsdp2"`` must keep a DDP row that resumes in FSDP2)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Resume:
    """A resume row (``at`` set), or none (every field ``None``)."""

    at: int | None = None
    """The candidate trains ``at`` steps, saves a checkpoint, drops everything, loads it into a
    fresh model (new random weights) and trains the rest; the reference trains straight through
    (``ranks/restart/resume.py``). ``None``: no resume."""
    method: str | None = None
    """How the checkpoint is written (:data:`METHODS`)."""
    layout: str | None = None
    """The engine layout the candidate comes back in (:data:`LAYOUTS`: FSDP1 -> FSDP2, FSDP2
    reshard -> keep, DDP -> FSDP2); ``None``: the one it saved in."""
    world_size: int | None = None
    """The world size the candidate comes back at (``w4to2`` in the id: saved at the
    configuration's world size 4, loaded at 2); its reference changes world size with it at the
    same step. Two rank calls, one per world size (``doors/reshard.py``). ``None``: the same one."""

    def check(self, config: ParityConfig) -> None:
        """Refuse a resume the engine cannot run, naming the field and the fix."""
        if self.at is None:
            for field in ("method", "layout", "world_size"):
                if getattr(self, field) is not None:
                    raise ValueError(
                        f"resume_{field}={getattr(self, field)!r} needs resume_at (the step to resume at)"
                    )
            return
        if self.method not in METHODS:
            raise ValueError(f"resume_method must be one of {METHODS}, got {self.method!r}")
        if not 1 <= self.at < config.steps:
            raise ValueError(
                f"resume_at must be a step between 1 and {config.steps - 1} (steps={config.steps}): the "
                f"candidate trains that many steps before it saves, got {self.at}"
            )
        if config.reference != "ddp" or config.loop.accumulate > 1 or config.loop.path == "two_optimizers":
            raise ValueError(
                "resume_at runs with reference='ddp', one optimizer and no gradient accumulation"
            )
        if self.method == "user" and registry.get(config.workload).save is None:
            raise ValueError(
                f"resume_method='user' needs a workload with save and load; {config.workload!r} has none "
                "(use resume_method='dcp')"
            )
        if self.layout is not None:
            self._check_layout(config)
        if self.world_size is not None:
            self._check_world_size(config)

    def _check_world_size(self, config: ParityConfig) -> None:
        other = self.world_size
        if not isinstance(other, int) or other < 1 or other == config.world_size:
            raise ValueError(
                f"resume_world_size must be a world size other than world_size={config.world_size} (the "
                f"one the row saves at), got {other!r}; leave it None to resume at the same world size"
            )
        if self.layout is not None:
            raise ValueError(
                "resume_world_size and resume_layout change one thing each: resume at another world "
                "size or in another layout, not both in one row"
            )
        if self.method == "sharded_optimizer" and config.engine != "fsdp2":
            raise ValueError(
                "resume_world_size with resume_method='sharded_optimizer' needs engine='fsdp2': the "
                "name-keyed method keeps FSDP1's flat shards in a file per rank, which no other world "
                "size can read (use resume_method='dcp')"
            )

    def _check_layout(self, config: ParityConfig) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"resume_layout must be one of {tuple(LAYOUTS)}, got {self.layout!r}")
        if self.method == "sharded_optimizer":
            raise ValueError(
                "resume_layout needs a checkpoint DCP can reshard: resume_method='dcp' or 'user' "
                "(the name-keyed method keeps FSDP1's flat shards in a file per rank)"
            )
        if config.precision.dtype != "fp32" or config.layout.offload:
            raise ValueError(
                "resume_layout runs in fp32 without offload: another layout's mixed precision has "
                "another reference (FSDP1 and FSDP2 cast differently)"
            )
        if LAYOUTS[self.layout] == (config.engine, config.layout):
            raise ValueError(f"resume_layout={self.layout!r} is the layout the row saves in; leave it None")

    def id_parts(self) -> list[str]:
        """``["resume@3", "dcp"]``, ``["resume@3", "dcp", "into_fully_shard_keep"]`` (``-k into``
        selects them); none without a resume."""
        if self.at is None:
            return []
        parts = [f"resume@{self.at}", WORDS[self.method]]  # type: ignore[index]
        if self.layout is not None:
            parts.append(f"into_{self.layout}")
        return parts

    def to_world_size(self) -> str:
        """``"to2"`` after the id's ``w4`` when the row resumes at world size 2; ``""`` otherwise."""
        return "" if self.world_size is None else f"to{self.world_size}"

    def reference_key(self) -> tuple[object, ...]:
        """A resume row's forward RNG runs on (``ranks/restart/resume.py``), and its reference
        changes world size with it."""
        return (self.at is not None, self.world_size)


def landing(config: ParityConfig) -> ParityConfig:
    """The configuration a resharded row's second half runs as: the same row at the world size it
    resumes at (whose reference is that world size's twin: its own reduce layout and divide
    factors)."""
    return config.with_(
        world_size=config.resume.world_size, resume=dataclasses.replace(config.resume, world_size=None)
    )


def into(config: ParityConfig) -> ParityConfig:
    """The configuration the candidate comes back in: its own, or in its resume's layout."""
    if config.resume.layout is None:
        return config
    engine, layout = LAYOUTS[config.resume.layout]
    return config.with_(engine=engine, layout=layout, resume=dataclasses.replace(config.resume, layout=None))
