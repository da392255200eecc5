"""The gate's verdict as people and machines read it: the closing summary, ``gate.json`` and the
baselines' JUnit XML (pure renderers: what the run found in, text out).

The summary is the last thing the gate prints, so a CI log ends with the answer: each regression
as configuration, metric, first diverging step, expected vs got; each failed test with the first
line of why; then drift (a torch version without baselines of its own) apart from regressions.
"""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from collections import Counter
from typing import Any

from ci.gate.baselines import Choice, version_text
from ci.gate.curves import Comparison, Finding
from ci.gate.suites import Tally

SCHEMA = "shardscale.gate"
VERSION = 1
EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 2
SHOWN = 25
"""Lines per section of the summary; the rest are counted (every one is in gate.json)."""


PARITY_LABELS = ("pass", "FAIL", "CRASH", "ERROR", "skip", "xfail", "XPASS")
"""As parity.md labels a configuration: ``xfail``/``XPASS`` where a failure is expected (torch's
scaler where it is wrong), the status otherwise (upper case: broke its tolerance)."""


def parity_counts(report: dict[str, Any]) -> dict[str, int]:
    """``{"total": n, label: count}`` over a parity.json document's configurations."""
    labels: Counter[str] = Counter()
    for config in report.get("configs", []):
        broken = config["status"] in ("fail", "crash", "error")
        if config.get("expected_failure"):
            label = "xfail" if broken else ("skip" if config["status"] == "skip" else "XPASS")
        else:
            label = config["status"].upper() if broken else config["status"]
        labels[label] += 1
    return {"total": sum(labels.values()), **labels}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """Everything one gate run found."""

    tier: str
    backend: str
    torch: str
    tests: Tally | None = None
    """``None`` with ``--from-report`` (no tests ran)."""
    parity: dict[str, int] | None = None
    """Configurations by label (:func:`parity_counts`; ``None`` when none was selected)."""
    comparison: Comparison | None = None
    choice: Choice | None = None
    fail_on_drift: bool = False
    updated: str = ""
    """The baseline file ``--update-baselines`` wrote."""
    not_recorded: tuple[str, ...] = ()
    """Configurations ``--update-baselines`` left out because they broke."""
    infrastructure: str = ""
    """Why the run could not judge the code (exit 2), if it could not."""
    out: str = ""
    """The folder of junit.xml and the parity reports."""

    @property
    def drift(self) -> tuple[Finding, ...]:
        return self.comparison.of_kind("drift") if self.comparison else ()

    @property
    def curve_failures(self) -> tuple[Finding, ...]:
        if self.comparison is None:
            return ()
        return self.comparison.failing + (self.drift if self.fail_on_drift else ())

    @property
    def exit_code(self) -> int:
        if self.infrastructure:
            return EXIT_USAGE
        if (self.tests is not None and self.tests.failed) or self.curve_failures:
            return EXIT_REGRESSION
        return EXIT_OK


def _capped(lines: list[str], what: str) -> list[str]:
    if len(lines) <= SHOWN:
        return lines
    return lines[:SHOWN] + [f"  ... and {len(lines) - SHOWN} more {what} (all of them in gate.json)"]


def _finding_line(label: str, finding: Finding) -> str:
    return f"  {label:<8} {finding.configuration}  {finding.describe()}"


def render_summary(verdict: Verdict) -> str:
    """The closing summary (see the module docstring)."""
    rule = "=" * 30 + " shardscale gate " + "=" * 30
    lines = [rule, f"tier      {verdict.tier} ({verdict.backend}), torch {verdict.torch}"]
    if verdict.tests is not None:
        lines.append(f"tests     {verdict.tests.describe()}   {verdict.out}/junit.xml")
    if verdict.parity is not None:
        p = verdict.parity
        counts = ", ".join(f"{p[k]} {k}" for k in PARITY_LABELS if p.get(k))
        lines.append(f"parity    {p['total']} configuration(s): {counts}   {verdict.out}/parity.md")
    if verdict.comparison is not None and verdict.choice is not None:
        kinds = Counter(f.kind for f in verdict.comparison.findings)
        words = {
            "regression": "curve(s) regressed",
            "drift": "curve(s) drifted",
            "missing": "configuration(s) without a baseline",
            "not_run": "baselined configuration(s) not run",
            "unused": "baseline(s) no longer in the tier",
        }
        found = ", ".join(f"{n} {words[k]}" for k, n in sorted(kinds.items())) or "all within tolerance"
        lines.append(
            f"curves    {len(verdict.comparison.compared)} compared with {verdict.choice.describe()}: {found}"
        )
    if verdict.updated:
        lines.append(f"updated   {verdict.updated}")
        if verdict.not_recorded:
            lines.append(f"          not recorded (they broke): {', '.join(verdict.not_recorded)}")
    failing = []
    if verdict.tests is not None:
        failing += [f"  FAILED   {f.test}: {f.message}" for f in verdict.tests.failures]
    labels = {"regression": "CURVE", "missing": "MISSING", "not_run": "NOT RUN", "drift": "DRIFT"}
    failing += _capped(
        [_finding_line(labels[f.kind], f) for f in verdict.curve_failures if f.kind != "drift"], "curves"
    )
    if failing:
        lines += ["", "regressions:", *_capped(failing, "failures")]
    if verdict.drift and verdict.choice is not None:
        consequence = "failing the gate (--fail-on-drift)" if verdict.fail_on_drift else "not a failure"
        lines += [
            "",
            f"drift (torch {version_text(verdict.choice.running)} against the baselines of torch "
            f"{version_text(verdict.choice.version)}; {consequence}; record this version's with "
            "--update-baselines):",
            *_capped([_finding_line("DRIFT", f) for f in verdict.drift], "drifting curves"),
        ]
    notes = verdict.comparison.of_kind("unused") if verdict.comparison else ()
    if notes:
        lines += ["", *_capped([_finding_line("note", f) for f in notes], "notes")]
    lines.append("")
    if verdict.infrastructure:
        lines.append(f"gate: ERROR (exit 2): {verdict.infrastructure}")
    elif verdict.exit_code == EXIT_REGRESSION:
        why = []
        if verdict.tests is not None and verdict.tests.failed:
            why.append(f"{verdict.tests.failed} test(s) failed")
        if verdict.curve_failures:
            why.append(f"{len(verdict.curve_failures)} curve finding(s)")
        lines.append(f"gate: FAIL (exit 1): {', '.join(why)}")
    else:
        drift = f" ({len(verdict.drift)} drifting curve(s) reported above)" if verdict.drift else ""
        lines.append(f"gate: PASS (exit 0): parity and scaling hold{drift}")
    return "\n".join(lines)


def to_json(verdict: Verdict) -> dict[str, Any]:
    """``gate.json``: the verdict in full (every finding, every failed test)."""
    choice = verdict.choice
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "exit_code": verdict.exit_code,
        "tier": verdict.tier,
        "backend": verdict.backend,
        "torch": verdict.torch,
        "infrastructure": verdict.infrastructure,
        "baseline": None
        if choice is None
        else {"path": str(choice.path), "torch": version_text(choice.version), "exact": choice.exact},
        "tests": None
        if verdict.tests is None
        else {
            "passed": verdict.tests.passed,
            "failed": verdict.tests.failed,
            "skipped": verdict.tests.skipped,
            "xfailed": verdict.tests.xfailed,
            "failures": [dataclasses.asdict(f) for f in verdict.tests.failures],
        },
        "parity": verdict.parity,
        "curves": None
        if verdict.comparison is None
        else {
            "compared": list(verdict.comparison.compared),
            "findings": [f.to_json() for f in verdict.comparison.findings],
        },
        "updated": verdict.updated or None,
        "not_recorded": list(verdict.not_recorded),
    }


def render_junit(verdict: Verdict) -> str:
    """``baselines.xml``: one test case per compared configuration, failing on a curve finding
    (drift fails only with ``--fail-on-drift``), so CI dashboards list them next to the tests."""
    comparison = verdict.comparison
    suite = ET.Element("testsuite", name="shardscale-gate-baselines")
    by_config: dict[str, list[Finding]] = {}
    for finding in comparison.findings if comparison else ():
        by_config.setdefault(finding.configuration, []).append(finding)
    names = list(dict.fromkeys([*(comparison.compared if comparison else ()), *by_config]))
    failures = 0
    for name in names:
        case = ET.SubElement(suite, "testcase", classname="baselines", name=name)
        found = by_config.get(name, [])
        failing = [f for f in found if f.fails or (f.kind == "drift" and verdict.fail_on_drift)]
        if failing:
            failures += 1
            failure = ET.SubElement(case, "failure", message=f"{failing[0].kind}: {failing[0].describe()}")
            failure.text = "\n".join(f"{f.kind}: {f.describe()}" for f in failing)
        others = [f for f in found if f not in failing]
        if others:
            properties = ET.SubElement(case, "properties")
            for f in others:
                ET.SubElement(properties, "property", name=f"gate.{f.kind}", value=f.describe())
    suite.set("tests", str(len(names)))
    suite.set("failures", str(failures))
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode") + "\n"
