"""What a resume row may ask for, checked: the methods, the layouts it may come back in, the step.

Why apart from ``config.py``: a resume row is one more axis of a configuration with rules of its
own (a step inside the run, a method the workload supports, a layout change DCP can reshard), and
the configuration type stays a list of fields. Takes the configuration duck-typed, so the type's
module can import this one.
"""

from __future__ import annotations

from typing import Any

from harness.parity.workload import registry

METHODS = ("dcp", "sharded_optimizer", "user")
"""How a resume row checkpoints (``ranks/restart/resume_store.py``): ``dcp`` (torch.distributed.checkpoint's
``get_state_dict``/``set_state_dict``, sharded, to a folder), ``sharded_optimizer`` (the optimizer
through ``scaler.ShardedOptimizer``'s name-keyed state), ``user`` (the workload's ``save``/``load``)."""
WORDS = {"dcp": "dcp", "sharded_optimizer": "sopt", "user": "user"}
"""Each method's word in a configuration id (``resume@3-sopt``)."""

_NONE = {"sharding": None, "use_orig_params": None, "reshard_after_forward": None}
LAYOUTS: dict[str, dict[str, Any]] = {
    "fsdp_flat": {**_NONE, "engine": "fsdp1", "sharding": "full_shard", "use_orig_params": False},
    "fsdp_orig": {**_NONE, "engine": "fsdp1", "sharding": "full_shard", "use_orig_params": True},
    "fully_shard": {**_NONE, "engine": "fsdp2", "reshard_after_forward": True},
    "fully_shard_keep": {**_NONE, "engine": "fsdp2", "reshard_after_forward": False},
    "data_parallel": {**_NONE, "engine": "ddp"},
}
"""The layouts a resume row may come back in, as configuration fields (``...-into_fully_shard_keep``
in ids): FSDP1 FULL_SHARD with flat or original parameters, FSDP2 resharding after forward or
keeping, DDP. Named so that no id holds another engine's name (``-k`` matches substrings of ids:
``-k "not fsdp2"`` must keep a DDP row that resumes in FSDP2)."""


def check(config: Any) -> None:
    """Refuse a resume the engine cannot run, naming the field and the fix."""
    if config.resume_at is None:
        for field in ("resume_method", "resume_layout", "resume_world_size"):
            if getattr(config, field) is not None:
                raise ValueError(
                    f"{field}={getattr(config, field)!r} needs resume_at (the step to resume at)"
                )
        return
    if config.resume_method not in METHODS:
        raise ValueError(f"resume_method must be one of {METHODS}, got {config.resume_method!r}")
    if not 1 <= config.resume_at < config.steps:
        raise ValueError(
            f"resume_at must be a step between 1 and {config.steps - 1} (steps={config.steps}): the "
            f"candidate trains that many steps before it saves, got {config.resume_at}"
        )
    if config.reference != "ddp" or config.accumulate > 1 or config.path == "two_optimizers":
        raise ValueError("resume_at runs with reference='ddp', one optimizer and no gradient accumulation")
    if config.resume_method == "user" and registry.get(config.workload).save is None:
        raise ValueError(
            f"resume_method='user' needs a workload with save and load; {config.workload!r} has none "
            "(use resume_method='dcp')"
        )
    if config.resume_layout is not None:
        _check_layout(config)
    if config.resume_world_size is not None:
        _check_world_size(config)


def _check_world_size(config: Any) -> None:
    other = config.resume_world_size
    if not isinstance(other, int) or other < 1 or other == config.world_size:
        raise ValueError(
            f"resume_world_size must be a world size other than world_size={config.world_size} (the "
            f"one the row saves at), got {other!r}; leave it None to resume at the same world size"
        )
    if config.resume_layout is not None:
        raise ValueError(
            "resume_world_size and resume_layout change one thing each: resume at another world "
            "size or in another layout, not both in one row"
        )
    if config.resume_method == "sharded_optimizer" and config.engine != "fsdp2":
        raise ValueError(
            "resume_world_size with resume_method='sharded_optimizer' needs engine='fsdp2': the "
            "name-keyed method keeps FSDP1's flat shards in a file per rank, which no other world "
            "size can read (use resume_method='dcp')"
        )


def to_world_size(config: Any) -> str:
    """``"to2"`` after the id's ``w4`` when the row resumes at world size 2; ``""`` otherwise."""
    return "" if config.resume_world_size is None else f"to{config.resume_world_size}"


def landing(config: Any) -> Any:
    """The configuration a resharded row's second half runs as: the same row at the world size it
    resumes at (whose reference is that world size's twin: its own reduce layout and divide
    factors)."""
    return config.with_(world_size=config.resume_world_size, resume_world_size=None)


def _check_layout(config: Any) -> None:
    if config.resume_layout not in LAYOUTS:
        raise ValueError(f"resume_layout must be one of {tuple(LAYOUTS)}, got {config.resume_layout!r}")
    if config.resume_method == "sharded_optimizer":
        raise ValueError(
            "resume_layout needs a checkpoint DCP can reshard: resume_method='dcp' or 'user' "
            "(the name-keyed method keeps FSDP1's flat shards in a file per rank)"
        )
    if config.precision != "fp32" or config.offload:
        raise ValueError(
            "resume_layout runs in fp32 without offload: another layout's mixed precision has "
            "another reference (FSDP1 and FSDP2 cast differently)"
        )
    if into(config) == layout_fields(config):
        raise ValueError(
            f"resume_layout={config.resume_layout!r} is the layout the row saves in; leave it None"
        )


def layout_fields(config: Any) -> dict[str, Any]:
    """The configuration's own engine layout, as :data:`LAYOUTS` writes one."""
    return {key: getattr(config, key) for key in ("engine", *_NONE)}


def into(config: Any) -> dict[str, Any]:
    """The layout the candidate comes back in (its own when ``resume_layout`` is ``None``)."""
    return LAYOUTS[config.resume_layout] if config.resume_layout is not None else layout_fields(config)


def id_parts(config: Any) -> list[str]:
    """``["resume@3", "dcp"]``, ``["resume@3", "dcp", "into_fully_shard_keep"]`` (``-k into``
    selects them); none without a resume."""
    if config.resume_at is None:
        return []
    parts = [f"resume@{config.resume_at}", WORDS[config.resume_method]]
    if config.resume_layout is not None:
        parts.append(f"into_{config.resume_layout}")
    return parts
