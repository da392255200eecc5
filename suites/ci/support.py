"""Fabricated parity results and reports for the gate's tests: the real renderers
(``harness.parity.report.render.to_json``) on made-up curves, so no rank has to run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ci.gate import baselines, curves
from harness.parity.judge.result import Curves, ParityResult
from harness.parity.plan.config import Layout, ParityConfig, Precision

SGD = ParityConfig(engine="fsdp1", layout=Layout(sharding="full_shard", use_orig_params=False))
ADAM_BF16 = ParityConfig(
    engine="fsdp2",
    optimizer="adam",
    layout=Layout(reshard_after_forward=True),
    precision=Precision(dtype="bf16"),
)
LOSSES = ((2.5, 2.4), (2.25, 2.2), (2.0, 1.9), (1.75, 1.7))
SCALES = (65536.0, 65536.0, 131072.0, 131072.0)
NORMS = (1.5, 1.25, 1.0, 0.75)


def result(
    config: ParityConfig = SGD,
    *,
    losses: tuple[tuple[float, ...], ...] = LOSSES,
    scales: tuple[float, ...] = SCALES,
    norms: tuple[float, ...] = NORMS,
    status: str = "pass",
) -> ParityResult:
    """A verdict on ``config`` whose candidate (and reference) drew these curves."""
    drawn = Curves(loss=losses, scale=scales, grad_norm=norms, skipped=(False,) * len(scales))
    return ParityResult(
        config=config,
        status=status,
        profile="exact",
        curves={} if status == "skip" else {"reference": drawn, "candidate": drawn},
        reason="cannot run here" if status == "skip" else "",
    )


def report(*results: ParityResult, torch: str = "2.13.0") -> dict[str, Any]:
    """A parity.json document holding ``results``."""
    from harness.parity.report import render as renderer

    run = {"backend": "gloo", "world_size": 2, "scaler": "ours", "filter": "", "torch": torch, "wall_s": 1.0}
    return json.loads(json.dumps(renderer.to_json(list(results), run)))


def write_report(path: Path, *results: ParityResult, torch: str = "2.13.0") -> Path:
    path.write_text(json.dumps(report(*results, torch=torch)))
    return path


def write_baseline(root: Path, version: str, *results: ParityResult, backend: str = "gloo") -> Path:
    """A baselines folder with one file for torch ``version`` recording ``results``' candidate curves."""
    document = report(*results)
    recorded = {config["id"]: curves.points_of(config) for config in document["configs"]}
    path = baselines.path_for(root, backend, baselines.torch_version(version))
    baselines.write(path, recorded, backend=backend, version=baselines.torch_version(version))
    return path
