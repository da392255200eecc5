"""Run many configurations inside the ranks and report every failing one (rank side).

Why: one process group serves many small configurations (0.05 s each instead of seconds for a
fresh spawn), but a plain loop stops at the first failure and may leave the group out of step.
``run_subtests`` runs *all* configurations; after each one the ranks agree through the case's
store whether it passed everywhere, and if not, every rank re-creates the process group so the
next configuration starts clean. At the end it raises one ``AssertionError`` listing each failing
configuration by its parameters, with the rank's traceback.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

from harness.rank import context


class SubtestFailures(AssertionError):
    """Some configurations failed; the message lists each by its parameters."""


def _describe(config: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in config.items())


def run_subtests(
    configs: Iterable[Mapping[str, Any]], body: Callable[..., Any], *, agree_timeout_s: float = 60.0
) -> None:
    """Call ``body(**config)`` for every config; raise :class:`SubtestFailures` naming the failing ones.

    Inside a rank (pool or torchrun) every configuration is followed by an agreement step, so all
    ranks run the same configurations in step. Outside a rank the configurations just run in turn.
    """
    configs = list(configs)
    for config in configs:
        if not isinstance(config, Mapping):
            raise TypeError(f"each subtest configuration must be a mapping of parameters, got {config!r}")
    ctx = context.current() if context.in_rank() else None
    failures: list[str] = []
    for index, config in enumerate(configs):
        error = None
        try:
            body(**config)
        except Exception:  # noqa: BLE001 - a failing configuration is recorded, the others still run
            error = traceback.format_exc()
            if ctx is not None and ctx.world_size > 1:
                leave_group()  # unblock peers that wait in a collective with us
        if error is not None:  # inside a rank, every line of the final report gets its [rank N] there
            failures.append(f"subtest {index} ({_describe(config)}) failed:\n{error.rstrip()}")
        if ctx is not None and ctx.world_size > 1:
            agree(ctx, f"subtest{index}", ok=error is None, timeout_s=agree_timeout_s)
    if failures:
        where = f" on rank {ctx.rank}" if ctx is not None else ""
        raise SubtestFailures(
            f"{len(failures)} of {len(configs)} subtests failed{where}:\n" + "\n".join(failures)
        )


def leave_group() -> None:
    """Destroy this rank's default process group, so peers blocked in a collective with it get an
    error at once instead of waiting for the collective timeout."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def agree(ctx: context.RankContext, key: str, *, ok: bool, timeout_s: float = 60.0) -> bool:
    """Publish whether this rank's part under ``key`` went well and wait for every rank's answer.

    Returns True when every rank was fine. Otherwise every rank re-creates the default process group
    (a rank that failed may have left it) and False is returned, the same on every rank. ``key``
    must be unique within the running case.
    """
    if all_ranks(ctx, key, ok=ok, timeout_s=timeout_s):
        return True
    ctx.reset_group(key)
    return False


def all_ranks(ctx: context.RankContext, key: str, *, ok: bool, timeout_s: float = 60.0) -> bool:
    """Whether ``ok`` holds on every rank, the same answer on every rank, through the case's store
    (not the process group, which a failed rank may have left); the group is left as it is.

    Why: a branch that decides whether a rank runs collectives (run the candidate after the
    reference, measure a gap after the candidate) must take the same value on every rank, so a
    value that differs between ranks is agreed first. ``key`` must be unique within the case."""
    store = ctx.store
    store.set(f"{key}/rank{ctx.rank}", b"1" if ok else b"0")
    keys = [f"{key}/rank{r}" for r in range(ctx.world_size)]
    store.wait(keys, timedelta(seconds=timeout_s))
    return all(store.get(k) == b"1" for k in keys)
