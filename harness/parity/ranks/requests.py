"""What the runner sends a rank for one configuration: the configuration and what the rest of the
run needs of it (rank side's input, on the wire).

Why: a rank keeps a finished reference's full tensors (every step's parameters, gradients and
optimizer state) only so that later configurations with the same reference can read them; only
the runner, which holds the whole run, knows whether one will. Kept for nobody, they cost memory
in proportion to model size x steps and buy nothing.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from harness.parity.plan.config import ParityConfig

RANK_MODULE = "harness.parity.ranks.entry"
"""The module every rank call of the engine imports (``doors/runner.RANK_TARGET``'s): the
forkserver imports it once for the ranks (``doors/early.py``, ``RankPool(preload=...)``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """A configuration as the runner sends it, with what the rest of the run needs of it: whether
    a later configuration shares its reference (``reference_reused``) or its float32 twin
    (``twin_reused``). A reference nobody reads again is compared as it trains, a step at a time,
    and never kept: keeping its full tensors would cost memory (every step's parameters,
    gradients and optimizer state) and buy nothing. A bare :class:`ParityConfig` (a caller that
    does not know the rest of the run) keeps whatever fits ``entry.keep_budget``."""

    config: ParityConfig
    reference_reused: bool
    twin_reused: bool


def requests(configs: list[ParityConfig]) -> list[Request]:
    """Each of ``configs`` as a :class:`Request`, in order: a reference is kept only while a
    later configuration of ``configs`` reads it (the runner's whole run at one world size)."""
    later: set[tuple[Any, ...]] = set()
    found: list[Request] = []
    for config in reversed(configs):
        found.append(Request(config, config.reference_key() in later, twin_key(config) in later))
        later.add(config.reference_key())
        if (twin := twin_config(config)) is not None:
            later.add(twin.reference_key())
    return found[::-1]


def twin_config(config: ParityConfig) -> ParityConfig | None:
    """The float32 twin a mixed-precision DDP-referenced configuration is measured against (its
    expected gap, :mod:`~harness.parity.ranks.measure.gap`); ``None`` when it has none."""
    if config.precision.dtype != "fp32" and config.reference == "ddp":
        return config.with_(precision="fp32", mixed=None)
    return None


def twin_key(config: ParityConfig) -> tuple[Any, ...] | None:
    """The reference key of :func:`twin_config` (``None``: no twin)."""
    twin = twin_config(config)
    return twin.reference_key() if twin is not None else None


KEEP_ENV = "SHARDSCALE_PARITY_KEEP_MB"
"""How many MiB of a reference's full tensors each rank keeps (default 512): a reference that fits
is kept and shared by every candidate of the batch that has the same reference; a larger one is
compared with the candidate as both run, a step at a time, and trained again for each candidate.
Read by the ranks (``entry.py``) and checked first by the CLI, here: it imports no rank-side code."""


def keep_budget() -> int:
    """:data:`KEEP_ENV` in bytes (a clear error when it is not a number of MiB)."""
    text = os.environ.get(KEEP_ENV, "512")
    try:
        mib = float(text)
    except ValueError:
        raise ValueError(f"{KEEP_ENV} must be a number of MiB (e.g. {KEEP_ENV}=512), got {text!r}") from None
    if mib < 0:
        raise ValueError(f"{KEEP_ENV} must be >= 0 MiB, got {text!r}")
    return int(mib * 2**20)
