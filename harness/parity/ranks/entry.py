"""The rank side of the parity engine: many configurations in one rank call, on the warm group.

Why batched: a configuration costs well under a second on an existing process group, but seconds
when ranks are spawned for it, so the controller sends a list of configurations and every rank
runs them in the same order. References are cached (many candidates share one: same workload,
precision, optimizer, path and faults), and each configuration is isolated: if any rank's run
failed, the failing rank leaves the group (so peers waiting in a collective with it get an error
instead of hanging), the ranks agree through the case's store, and every rank re-creates the
group before the next configuration.

Import target for the pool: ``harness.parity.ranks.entry:run_batch``.
"""

from __future__ import annotations

import warnings
from typing import Any

from harness.parity.plan.config import ParityConfig
from harness.parity.ranks import gap, gather, train
from harness.rank import context
from harness.rank.subtests import agree, all_ranks, leave_group

_references: dict[tuple[Any, ...], tuple[dict[str, Any], str]] = {}


def _reference(config: ParityConfig, device: Any) -> tuple[dict[str, Any], str, bool]:
    """``(rank run, description, whether it came from the cache)``."""
    key = (context.group_generation(), *config.reference_key())
    cached = _references.get(key)
    if cached is not None:
        return (*cached, True)
    run, description = train.run(config, "reference", device)
    if run["error"] is None:
        _references[key] = (run, description)
    return run, description, False


def forget() -> None:
    """Drop what was cached for the default group (after it was re-created)."""
    _references.clear()
    gather.forget_meshes()


def everywhere(key: str, ok: bool) -> bool:
    """Whether ``ok`` holds on every rank (agreed through the store); a rank where it does not
    first leaves the group, so that peers blocked in a collective with it get an error at once."""
    ctx = context.current()
    if ctx.world_size == 1:
        return ok
    if not ok:
        leave_group()
    return all_ranks(ctx, key, ok=ok)


def run_one(config: ParityConfig, index: int = 0) -> dict[str, Any]:
    """Reference and candidate runs of ``config`` (the ``index``-th of its batch) on this rank
    (never raises). Whether the candidate and the float32 twin run is agreed first: one rank's
    error must not send it into collectives its peers skip (docs/architecture.md, section 4.5)."""
    device = context.current().device
    reference, reference_description, reused = _reference(config, device)
    reference_ok = everywhere(f"parity{index}/reference", reference["error"] is None)
    candidate, candidate_description = (
        train.run(config, "candidate", device, share_with=reference)
        if reference_ok
        else (None, "not run: the reference failed")
    )
    candidate_ok = reference_ok and everywhere(f"parity{index}/candidate", candidate["error"] is None)
    fp32_gap = None
    if config.precision != "fp32" and config.reference == "ddp" and candidate_ok:
        # The expected mixed-precision gap: the same workload, optimizer and data in float32
        # (cached like any reference: the fp32 configurations of the matrix share it), measured
        # here so that only numbers travel.
        fp32_run, _, _ = _reference(config.with_(precision="fp32", mixed=None), device)
        fp32_gap = gap.of_rank_runs(reference, fp32_run) if fp32_run["error"] is None else None
    return {
        "id": config.id,
        "fp32_gap": fp32_gap,
        "reference": reference,
        "reference_description": reference_description,
        "reference_reused": reused,
        "candidate": candidate,
        "candidate_description": candidate_description,
    }


def run_batch(configs: list[ParityConfig]) -> list[dict[str, Any]]:
    """Run every configuration of ``configs`` in order; one result dict per configuration.

    torch's deprecation notices (``FutureWarning``: NO_SHARD, ``all_gather_into_tensor``) are
    silenced here: the matrix exercises those APIs on purpose, once per configuration.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return _run_batch(configs)


def _run_batch(configs: list[ParityConfig]) -> list[dict[str, Any]]:
    ctx = context.current()
    results = []
    for index, config in enumerate(configs):
        if config.world_size != ctx.world_size or config.backend != ctx.backend:
            raise ValueError(
                f"configuration {config.id} needs {config.backend} world size {config.world_size}, "
                f"but this batch runs on {ctx.backend} world size {ctx.world_size}"
            )
        result = run_one(config, index)
        failed = result["reference"]["error"] or (result["candidate"] or {}).get("error")
        if failed and ctx.world_size > 1:
            leave_group()  # unblock peers still waiting in a collective with this rank
        if ctx.world_size > 1 and not agree(ctx, f"parity{index}", ok=not failed):
            forget()
        results.append(result)
    return results
