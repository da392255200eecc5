"""Compare a parity report's curves with golden baselines (pure: documents in, findings out).

What is compared, per configuration that ran, step by step: the candidate's ``scale`` exactly (it
is discrete state: every backoff and growth), and its ``loss`` on every rank and ``grad_norm``
(the 2-norm of the unscaled gradients) within the tolerance of the configuration's *precision*
(``harness.parity.plan.profiles``: ``fp32``, ``bf16`` or ``fp16``). Not the configuration's own parity
profile: that one says how a sharded run may differ from its reference *on the same machine*,
where gloo at world size 2 is bit-exact; a baseline was recorded on another machine, whose CPU
kernels may round the last bit differently, and in low precision one rounding that flips is one
unit of bf16/fp16. A scaler bug moves these curves by far more. Non-finite values match only the
same non-finite value (``inf`` an ``inf`` of the same sign, ``nan`` a ``nan``).

fp16 curves get more room than the fp16 profile's rtol 1e-3 (:data:`FP16_CURVE`): a few training
steps in fp16 compound a few units of fp16 on another CPU's kernels. Measured by ``make kernels``
(the same run under ATen's scalar kernels against AVX-512 ones): the convnet's fp16 gradient norm at
step 4 moved by 2.2e-3 relative (about 4 fp16 units), outside rtol 1e-3; fp32 moved at most 8.8e-7
and bf16 2.8e-3, inside their profiles.

A finding names the configuration, the metric, the first step that differs and the expected and
actual values, the way ``pytest.approx`` reports a mismatch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from ci.gate.baselines import Curves, StepPoint
from harness.parity.plan import profiles

KINDS = ("regression", "drift", "missing", "not_run", "unused")
"""``regression``: a curve differs from this torch version's baseline; ``drift``: it differs from
another (the nearest) torch version's baseline; ``missing``: a configuration ran and has no
baseline; ``not_run``: a configuration has a baseline but did not run (in a run of the whole tier);
``unused``: the baseline file holds a configuration the tier no longer has (a note: the next
``--update-baselines`` drops it)."""
FAILING = frozenset({"regression", "missing", "not_run"})
"""Kinds that make the gate fail (``drift`` too, with ``--fail-on-drift``)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """One way a run's curves disagree with the baselines."""

    kind: str
    configuration: str
    metric: str = ""
    """``scale``, ``grad_norm``, ``loss[rank N]``, ``steps`` or ``ranks``; empty for missing/not_run."""
    step: int | None = None
    """The first step that differs."""
    expected: float | None = None
    got: float | None = None
    mismatched: int = 0
    """Steps that differ, of ``total``."""
    total: int = 0
    tolerance: str = ""
    detail: str = ""
    """Free text for missing / not_run / shape findings."""

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind

    @property
    def fails(self) -> bool:
        return self.kind in FAILING

    def describe(self) -> str:
        """One line: ``loss[rank 1] first differs at step 3 (2 of 6 steps): expected 2.30 ± 3e-06, got 2.41``."""
        if self.step is None:
            return f"{self.metric}: {self.detail}" if self.metric else self.detail
        assert self.expected is not None and self.got is not None
        diff = abs(self.got - self.expected)
        if math.isfinite(diff) and diff > 0:
            rel = diff / abs(self.expected) if self.expected else math.inf
            gap = f" (abs {diff:.3g}, rel {rel:.3g})"
        else:
            gap = ""
        return (
            f"{self.metric} first differs at step {self.step} ({self.mismatched} of {self.total} steps): "
            f"expected {self.expected!r}{self.tolerance}, got {self.got!r}{gap}"
        )

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key in ("expected", "got"):
            value = data[key]
            if isinstance(value, float) and not math.isfinite(value):
                data[key] = str(value)
        data["message"] = self.describe()
        return data


FP16_CURVE = profiles.ToleranceProfile(name="fp16-curve", rtol=1e-2, atol=1e-3)
"""fp16 loss and grad-norm curves against a baseline from another machine: about 10 units of fp16
(4.5x the largest drift measured across kernel families); a scaler bug moves them by far more."""


def tolerance_for(precision: str) -> profiles.ToleranceProfile:
    """The tolerance of a baseline's loss and grad-norm curves (see the module docstring)."""
    return {"fp32": profiles.FP32, "bf16": profiles.BF16, "fp16": FP16_CURVE}[precision]


def within(expected: float, got: float, tolerance: profiles.ToleranceProfile | None) -> bool:
    """Whether a curve value ``got`` matches ``expected`` (exactly when ``tolerance`` is ``None``;
    non-finite values only the same non-finite value). ``ci.kernels`` holds families to it too."""
    if not (math.isfinite(expected) and math.isfinite(got)):
        return (math.isnan(expected) and math.isnan(got)) or expected == got
    if tolerance is None:
        return expected == got
    return abs(got - expected) <= tolerance.atol + tolerance.rtol * abs(expected)


def _float(value: Any) -> float:
    """A number of parity.json (non-finite values are the strings "inf", "-inf", "nan")."""
    return float(value)


def points_of(config: Mapping[str, Any]) -> list[StepPoint] | None:
    """A parity.json configuration's candidate curves as baseline points; ``None`` when the
    candidate has no curves (skipped, or the reference could not run)."""
    curves = config.get("curves", {}).get("candidate")
    if not curves or not curves.get("scale"):
        return None
    return [
        StepPoint(
            step=step,
            scale=_float(scale),
            grad_norm=_float(grad_norm),
            loss=tuple(_float(value) for value in losses),
        )
        for step, (scale, grad_norm, losses) in enumerate(
            zip(curves["scale"], curves["grad_norm"], curves["loss"], strict=True)
        )
    ]


def _series(
    configuration: str,
    metric: str,
    expected: list[float],
    got: list[float],
    tolerance: profiles.ToleranceProfile | None,
    kind: str,
) -> Finding | None:
    differing = [
        step for step, (e, g) in enumerate(zip(expected, got, strict=True)) if not within(e, g, tolerance)
    ]
    if not differing:
        return None
    first = differing[0]
    bound = ""
    if tolerance is not None and math.isfinite(expected[first]):
        bound = f" ± {tolerance.atol + tolerance.rtol * abs(expected[first]):.2g}"
    return Finding(
        kind=kind,
        configuration=configuration,
        metric=metric,
        step=first,
        expected=expected[first],
        got=got[first],
        mismatched=len(differing),
        total=len(expected),
        tolerance=bound,
    )


def compare_one(
    configuration: str,
    precision: str,
    baseline: list[StepPoint],
    run: list[StepPoint],
    *,
    drift: bool = False,
) -> list[Finding]:
    """Every metric of one configuration that differs: scale first (exact), then each rank's loss,
    then the grad norm. ``drift`` labels the differences as drift (another torch's baseline)."""
    kind = "drift" if drift else "regression"
    if len(baseline) != len(run):
        return [
            Finding(
                kind=kind,
                configuration=configuration,
                metric="steps",
                detail=f"ran {len(run)} steps, the baseline has {len(baseline)}",
            )
        ]
    ranks = {len(point.loss) for point in baseline + run}
    if len(ranks) != 1:
        return [
            Finding(
                kind=kind,
                configuration=configuration,
                metric="ranks",
                detail=f"losses of {len(run[0].loss)} ranks, the baseline has {len(baseline[0].loss)}",
            )
        ]
    tolerance = tolerance_for(precision)
    series = [("scale", [p.scale for p in baseline], [p.scale for p in run], None)]
    for rank in range(len(run[0].loss)):
        series.append(
            (f"loss[rank {rank}]", [p.loss[rank] for p in baseline], [p.loss[rank] for p in run], tolerance)
        )
    series.append(("grad_norm", [p.grad_norm for p in baseline], [p.grad_norm for p in run], tolerance))
    findings = [_series(configuration, metric, e, g, tol, kind) for metric, e, g, tol in series]
    return [finding for finding in findings if finding is not None]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    """What :func:`compare` found."""

    compared: tuple[str, ...]
    """Configurations whose curves were compared with a baseline."""
    findings: tuple[Finding, ...]

    @property
    def failing(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.fails)

    def of_kind(self, kind: str) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.kind == kind)


def compare(
    report: Mapping[str, Any],
    baseline: Curves,
    *,
    drift: bool = False,
    whole_tier: bool = True,
    backend: str | None = None,
) -> Comparison:
    """Compare every configuration of a parity.json ``report`` (of ``backend``, when given) that has
    candidate curves with ``baseline``.

    ``whole_tier``: the report is a run of the whole tier (no ``-k``, no narrowed test selection),
    so a baselined configuration that did not run is a finding (``not_run`` if the report lists it
    as skipped or failed, ``unused`` if the tier no longer has it). Otherwise only what ran counts.
    """
    compared, findings = [], []
    listed: dict[str, Mapping[str, Any]] = {}
    for config in report.get("configs", []):
        if backend is not None and config["config"]["backend"] != backend:
            continue
        listed[config["id"]] = config
        points = points_of(config)
        if points is None:
            continue
        expected = baseline.get(config["id"])
        if expected is None:
            findings.append(
                Finding(
                    kind="missing",
                    configuration=config["id"],
                    detail="ran, but has no baseline: record it with python -m ci.gate --update-baselines",
                )
            )
            continue
        compared.append(config["id"])
        findings += compare_one(config["id"], config["config"]["precision"], expected, points, drift=drift)
    if whole_tier:
        for configuration in sorted(set(baseline) - set(compared)):
            config = listed.get(configuration)
            if config is None:
                findings.append(
                    Finding(
                        kind="unused",
                        configuration=configuration,
                        detail="has a baseline but is not in this tier any more; --update-baselines drops it",
                    )
                )
            elif points_of(config) is None:
                why = config.get("reason") or config["status"]
                findings.append(
                    Finding(
                        kind="not_run",
                        configuration=configuration,
                        detail=f"has a baseline but did not run ({config['status']}: {why})",
                    )
                )
    return Comparison(compared=tuple(compared), findings=tuple(findings))


def updated(baseline: Curves, report: Mapping[str, Any], *, keep: frozenset[str], whole_tier: bool) -> Curves:
    """The baselines after ``--update-baselines``: the curves of the configurations in ``keep``
    (those whose verdict was as expected) replace their entries; a run of the whole tier also drops
    entries of configurations it no longer has. A configuration that broke keeps its old entry."""
    result: Curves = {} if whole_tier else dict(baseline)
    if whole_tier:
        listed = {config["id"] for config in report.get("configs", [])}
        result.update({k: v for k, v in baseline.items() if k in listed})
    for config in report.get("configs", []):
        points = points_of(config)
        if points is not None and config["id"] in keep:
            result[config["id"]] = points
    return result
