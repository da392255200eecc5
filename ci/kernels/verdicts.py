"""Compare the parity reports of one matrix run under several kernel families (pure: documents in,
findings out).

What must hold, configuration by configuration, across every family that ran:

* the same status (``pass``, ``skip``, ...) everywhere, and no ``fail``/``crash``/``error`` under
  any family unless the report marks it an expected failure (``--scaler torch`` rows);
* the candidate's loss-scale curve identical: the scale is discrete state (every backoff and
  growth), so a kernel family that moves it has changed a skip decision;
* its losses and gradient norms within the tolerance of the configuration's precision, the same
  tolerance the CI gate holds the golden curves to (``ci.gate.curves.tolerance_for``): baselines
  recorded on one machine must hold on another.

Within that tolerance losses and gradient norms may differ (other kernels round the last bit
differently); ``spread`` gives the largest relative difference per precision, the number behind
docs/ci.md's account of which figures are machine-independent ("Baselines, torch upgrades and drift").
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ci.gate.curves import tolerance_for, within

BROKEN = frozenset({"fail", "crash", "error"})
KINDS = ("broken", "status_differs", "scale_differs", "curve_differs", "missing")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """One way the families disagree, or one configuration that broke under a family."""

    kind: str
    configuration: str
    detail: str

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind

    def line(self) -> str:
        return f"{self.kind}: {self.configuration}: {self.detail}"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    counts: dict[str, dict[str, int]]
    """Statuses counted per family."""
    findings: list[Finding]
    spread: dict[str, float]
    """Largest relative difference of any loss or grad norm between two families, per precision."""
    compared: int
    """Configurations that ran (not skipped) under every family."""

    @property
    def holds(self) -> bool:
        return not self.findings


def _by_id(document: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {config["id"]: config for config in document["configs"]}


def _curve(config: Mapping[str, Any], metric: str) -> list[Any]:
    return (config.get("curves") or {}).get("candidate", {}).get(metric) or []


def _values(config: Mapping[str, Any]) -> list[float]:
    """The candidate's losses (every rank) then grad norms, as floats."""
    losses = [float(value) for step in _curve(config, "loss") for value in step]
    return losses + [float(value) for value in _curve(config, "grad_norm")]


def _relative(a: float, b: float) -> float:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def compare(reports: Mapping[str, Mapping[str, Any]]) -> Comparison:
    """Compare the parity reports of each family (``{family name: parity.json document}``); the
    first family is the one the others are held against."""
    if not reports:
        raise ValueError("compare needs at least one family's report")
    families = list(reports)
    configs = {family: _by_id(document) for family, document in reports.items()}
    counts = {family: dict(Counter(c["status"] for c in configs[family].values())) for family in families}
    findings: list[Finding] = []
    spread: dict[str, float] = {}
    compared = 0
    first = families[0]
    every_id = list(dict.fromkeys(i for family in families for i in configs[family]))
    for config_id in every_id:
        present = {family: configs[family].get(config_id) for family in families}
        absent = [family for family, config in present.items() if config is None]
        if absent:
            findings.append(
                Finding(kind="missing", configuration=config_id, detail=f"not in {', '.join(absent)}")
            )
            continue
        for family, config in present.items():
            if config["status"] in BROKEN and not config.get("expected_failure"):
                why = config.get("reason") or ""
                findings.append(
                    Finding(
                        kind="broken",
                        configuration=config_id,
                        detail=f"{config['status']} under {family}: {why}",
                    )
                )
        statuses = {family: config["status"] for family, config in present.items()}
        if len(set(statuses.values())) > 1:
            said = ", ".join(f"{family}={status}" for family, status in statuses.items())
            findings.append(Finding(kind="status_differs", configuration=config_id, detail=said))
            continue
        if statuses[first] == "skip":
            continue
        compared += 1
        reference = present[first]
        for family, config in present.items():
            if family == first:
                continue
            if _curve(config, "scale") != _curve(reference, "scale"):
                findings.append(
                    Finding(
                        kind="scale_differs",
                        configuration=config_id,
                        detail=f"{family}: {_curve(config, 'scale')} against {first}: {_curve(reference, 'scale')}",
                    )
                )
            precision = (reference.get("config") or {}).get("precision", "fp32")
            pairs = list(zip(_values(reference), _values(config), strict=False))
            worst = max((_relative(a, b) for a, b in pairs), default=0.0)
            spread[precision] = max(spread.get(precision, 0.0), worst)
            tolerance = tolerance_for(precision)
            outside = [(a, b) for a, b in pairs if not within(a, b, tolerance)]
            if outside:
                a, b = outside[0]
                findings.append(
                    Finding(
                        kind="curve_differs",
                        configuration=config_id,
                        detail=f"{family}: a loss or grad norm {b!r} against {first}'s {a!r}, outside "
                        f"{precision}'s tolerance ({tolerance.describe()}); {len(outside)} of {len(pairs)} values",
                    )
                )
    return Comparison(counts=counts, findings=findings, spread=spread, compared=compared)


def render_markdown(
    comparison: Comparison, runs: Mapping[str, Mapping[str, Any]], skipped: Mapping[str, str]
) -> str:
    """``kernels.md``: a row per family (what ATen reported, status counts, wall time), the
    findings, the measured spread, and the families this CPU could not reach."""
    statuses = ("pass", "fail", "crash", "error", "skip")
    lines = [
        "# Parity verdicts across CPU kernel families",
        "",
        "| family | environment | ATen capability | " + " | ".join(statuses) + " | wall s |",
        "|---|---|---|" + "---|" * len(statuses) + "---|",
    ]
    for family, run in runs.items():
        count = comparison.counts.get(family, {})
        env = " ".join(f"{k}={v}" for k, v in run["env"].items()) or "(none)"
        cells = " | ".join(str(count.get(status, 0)) for status in statuses)
        lines.append(f"| {family} | `{env}` | {run['aten']} | {cells} | {run['wall_s']:.1f} |")
    lines += ["", f"Configurations compared across every family: {comparison.compared}.", ""]
    if comparison.findings:
        lines += ["## Findings", ""] + [f"- {finding.line()}" for finding in comparison.findings] + [""]
    else:
        lines += [
            "Every configuration has the same verdict and the same loss-scale curve under every family.",
            "",
        ]
    if comparison.spread:
        lines += [
            "## What the kernels move (measured, within each precision's tolerance)",
            "",
            "| precision | largest relative difference of a loss or grad norm between families |",
            "|---|---|",
        ]
        lines += [f"| {precision} | {value:.2e} |" for precision, value in sorted(comparison.spread.items())]
        lines.append("")
    if skipped:
        lines += (
            ["## Not reachable here", ""] + [f"- {family}: {why}" for family, why in skipped.items()] + [""]
        )
    return "\n".join(lines)
