"""``python -m ci.kernels`` (``make kernels``): the parity matrix once per reachable CPU kernel
family, and the verdicts compared (``ci.kernels.verdicts``).

Exit status: 0 every configuration got the same verdict and loss-scale curve under every family,
and none broke; 1 a family broke a configuration or disagreed with another; 2 bad arguments, or a
run that wrote no report. Writes ``kernels.md`` and ``kernels.json``, and each family's parity
reports and log under ``--out/<family>/``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ci.gate import process
from ci.kernels import settings, verdicts

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ci.kernels",
        description="Run the parity matrix under each CPU kernel family this machine can reach "
        "(ATen, MKL and oneDNN held below the native ISA) and check every verdict is the same.",
        epilog="exit status: 0 same verdicts everywhere; 1 a family broke or disagreed; 2 usage or infrastructure",
    )
    parser.add_argument(
        "--settings",
        default=None,
        help=f"comma-separated families (default: all of {','.join(settings.BY_NAME)}); the first is "
        "the one the others are compared with",
    )
    parser.add_argument("-k", dest="expression", default="", help="python -m harness.parity's -k selection")
    parser.add_argument("--world-size", type=int, default=2, help="ranks per configuration (default 2)")
    parser.add_argument(
        "--workload",
        action="append",
        default=[],
        metavar="NAME|MODULE:FUNCTION",
        help="a workload's own matrix instead of the embedded one (every precision recipe included); repeatable",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("reports/kernels"), help="output folder (default reports/kernels)"
    )
    options = parser.parse_args(argv)
    try:
        names = (
            None
            if options.settings is None
            else [n.strip() for n in options.settings.split(",") if n.strip()]
        )
        options.chosen = settings.resolve(names)
    except ValueError as error:
        parser.error(str(error))
    if not options.chosen:
        parser.error("--settings names no family")
    if options.world_size < 1:
        parser.error(f"--world-size must be >= 1, got {options.world_size}")
    return options


def parity_command(options: argparse.Namespace, out: Path) -> list[str]:
    """The ``python -m harness.parity`` run of one family, its reports in ``out``."""
    command = [sys.executable, "-m", "harness.parity", "--out", str(out), "--no-plot"]
    command += ["--world-size", str(options.world_size)]
    for workload in options.workload:
        command += ["--workload", workload]
    if options.expression:
        command += ["-k", options.expression]
    return command


def _run_family(setting: settings.KernelSetting, options: argparse.Namespace) -> dict[str, Any]:
    env = settings.environment(setting)
    out = (options.out / setting.name).resolve()
    out.mkdir(parents=True, exist_ok=True)
    command = parity_command(options, out)
    started = time.monotonic()
    with open(out / "parity.log", "w") as log:
        code = process.call(command, cwd=ROOT, env=env, stdout=log)
    return {"env": dict(setting.env), "exit": code, "wall_s": time.monotonic() - started, "out": str(out)}


def main(argv: list[str] | None = None) -> int:
    process.terminate_on_sigterm()
    options = parse_args(argv)
    flags = settings.cpu_flags()
    runs: dict[str, dict[str, Any]] = {}
    reports: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for setting in options.chosen:
        reason = settings.unreachable_reason(setting, flags)
        aten = settings.aten_capability(settings.environment(setting))
        if reason is None and setting.aten is not None and aten != setting.aten:
            reason = f"ATen reports {aten} under {dict(setting.env)}, not {setting.aten}"
        if reason is not None:
            skipped[setting.name] = reason
            print(f"kernels: {setting.name}: not reachable: {reason}", flush=True)
            continue
        print(f"kernels: {setting.name} ({setting.description}; ATen {aten}) ...", flush=True)
        run = _run_family(setting, options)
        run["aten"] = aten
        report = Path(run["out"]) / "parity.json"
        if not report.is_file():
            print(
                f"kernels: {setting.name}: python -m harness.parity exited {run['exit']} without a report; "
                f"see {Path(run['out']) / 'parity.log'}",
                file=sys.stderr,
            )
            return 2
        runs[setting.name] = run
        reports[setting.name] = json.loads(report.read_text())
        print(f"kernels: {setting.name}: exit {run['exit']} in {run['wall_s']:.1f}s", flush=True)
    if not reports:
        print("kernels: no family is reachable on this machine", file=sys.stderr)
        return 2
    comparison = verdicts.compare(reports)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "kernels.md").write_text(verdicts.render_markdown(comparison, runs, skipped))
    document = {
        "runs": runs,
        "skipped": skipped,
        "counts": comparison.counts,
        "compared": comparison.compared,
        "spread": comparison.spread,
        "findings": [finding.line() for finding in comparison.findings],
    }
    (options.out / "kernels.json").write_text(json.dumps(document, indent=2) + "\n")
    for finding in comparison.findings[:50]:
        print(f"kernels: {finding.line()}")
    verdict = "same verdicts under" if comparison.holds else "DISAGREE across"
    print(
        f"kernels: {comparison.compared} configurations, {verdict} {', '.join(reports)}; "
        f"wrote {options.out / 'kernels.md'}",
        flush=True,
    )
    return 0 if comparison.holds else 1


if __name__ == "__main__":
    sys.exit(main())
