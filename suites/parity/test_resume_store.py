"""Each checkpoint method of a resume row restores every field it saves
(``ranks/restart/resume_store.py``): the weights, the optimizer's state tensors and step counts,
every hyperparameter of its param groups, and the scaler's state, into a fresh engine, optimizer
and scaler, under FSDP1 (flat shards) and FSDP2 (DTensors).

Why a round trip of its own: a resume row (``test_resume.py``) fails only where a lost field
changes the steps after the load, and the fresh optimizer is made with the hyperparameters of the
one that was saved, so a method that drops ``param_groups`` passes every row whose learning rate no
scheduler moved, and one that drops ``betas`` or ``weight_decay`` passes them all. Here each field
is moved away from a fresh one's before the save, and compared after the load. (The loop's own
state, the RNG and the schedulers, is saved beside the checkpoint by ``resume.Loop`` whatever the
method: ``test_resume.py``'s rows check it. The ``user`` method is the workload's own code.)
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from harness.parity.plan.config import ParityConfig

_FSDP1 = {"engine": "fsdp1", "sharding": "full_shard", "use_orig_params": False}
_FSDP2 = {"engine": "fsdp2", "reshard_after_forward": True}
_CASES = {
    f"{method}-{engine}": (method, ParityConfig.from_flat(optimizer="adam", **fields, precision="fp16"))
    for method in ("dcp", "sharded_optimizer")
    for engine, fields in (("fsdp1", _FSDP1), ("fsdp2", _FSDP2))
}
_MOVED = {"lr": 0.0123, "betas": (0.5, 0.75), "eps": 1e-3, "weight_decay": 0.25}
"""Every hyperparameter of the saved optimizer's groups, away from a fresh optimizer's."""
_SCALER = {"scale": 2.0**9, "_growth_tracker": 3}
"""The saved scaler's state, away from a fresh scaler's."""


def _state(engine: Any, optimizer: Any, scaler: Any) -> dict[str, Any]:
    """This rank's state as the resume audit takes it, with each param group's hyperparameters and
    the scaler's whole ``state_dict`` beside it."""
    from harness.parity.ranks.restart import resume_state

    taken = resume_state.snapshot(engine, optimizer, scaler, SimpleNamespace(rng=None, schedulers=[]))
    taken["param_groups"] = [
        {key: value for key, value in group.items() if key not in ("params", "param_names")}
        for group in optimizer.param_groups
    ]
    taken["scaler_state"] = scaler.state_dict()
    return taken


def _differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    from harness.parity.ranks.restart import resume_state

    found = [f"{group} {name}" for group, names in resume_state.audit(saved, now).items() for name in names]
    for index, (was, got) in enumerate(zip(saved["param_groups"], now["param_groups"], strict=True)):
        found += [f"param_groups[{index}] {key}" for key in was if key not in got or got[key] != was[key]]
    found += [
        f"scaler {key}"
        for key, value in saved["scaler_state"].items()
        if now["scaler_state"].get(key) != value
    ]
    return found


def _round_trip(cases: dict[str, tuple[str, ParityConfig]], base: str) -> dict[str, dict[str, Any]]:
    """On every rank, per case: one step, the hyperparameters and the scaler's state moved, a save
    through the case's method, a fresh engine (new random weights), optimizer and scaler, a load;
    what differs from what was saved, and what the save held."""
    import torch.distributed as dist

    from harness.parity.ranks import train
    from harness.parity.ranks.restart import resume_state, resume_store
    from harness.parity.ranks.sides import roles
    from harness.rank import context

    device = context.current().device
    out = {}
    for name, (method, config) in cases.items():
        engine = roles.build(config, "candidate", device)
        optimizer = engine.make_optimizer(engine.param_groups(1)[0])
        scaler = train.make_scaler(config, "candidate", device)
        loss, _ = engine.losses(0, float(scaler.get_scale()))
        scaler.scale(loss).backward()
        engine.after_backward()
        scaler.step(optimizer)
        scaler.update()
        for group in optimizer.param_groups:
            group.update(_MOVED)
        scaler.load_state_dict({**scaler.state_dict(), **_SCALER})
        saved = _state(engine, optimizer, scaler)
        store = resume_store.method(method, config.workload)
        folder = os.path.join(base, name)
        os.makedirs(folder, exist_ok=True)
        store.save(folder, engine.wrapped, optimizer, scaler)
        dist.barrier()
        fresh = roles.build(config, "candidate", device)
        resume_state.scramble(fresh, config.seed + 1)
        fresh_optimizer = fresh.make_optimizer(fresh.param_groups(1)[0])
        fresh_scaler = train.make_scaler(config, "candidate", device)
        store.load(folder, fresh.wrapped, fresh_optimizer, fresh_scaler)
        out[name] = {
            "differs": _differences(saved, _state(fresh, fresh_optimizer, fresh_scaler)),
            "saved": sorted({key for values in saved["optimizer"].values() for key in values}),
        }
        dist.barrier()
    return out


@pytest.fixture(scope="module")
def round_trips(module_ranks, tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    """``{case: [rank 0's, rank 1's]}`` of :func:`_round_trip`, every case in one rank call."""
    base = str(tmp_path_factory.mktemp("resume-store"))
    per_rank = module_ranks.run(_round_trip, _CASES, base, world_size=2)
    return {name: [rank[name] for rank in per_rank] for name in _CASES}


@pytest.mark.parametrize("case", list(_CASES))
def test_a_resume_method_restores_every_field_it_saved(round_trips, case):
    for rank, found in enumerate(round_trips[case]):
        assert found["saved"] == ["exp_avg", "exp_avg_sq", "step"], (rank, found["saved"])  # else moot
        assert found["differs"] == [], f"{case}, rank {rank}: not restored: {found['differs']}"
