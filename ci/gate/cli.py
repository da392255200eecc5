"""``python -m ci.gate`` (``make gate``): run a tier, compare its curves with the golden baselines,
say in the last lines whether parity and scaling still hold.

Exit status: 0 every test passed and every curve matches its baseline (drift from another torch
version is reported, and fails only with ``--fail-on-drift``); 1 a regression: a test failed, a
curve left its baseline's tolerance, a configuration that ran has no baseline, or one that has a
baseline did not run; 2 usage or infrastructure: bad arguments, no baselines for this backend, no
GPUs where ``--gpu`` requires them, ranks that cannot start, a pytest session that stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ci.gate import baselines, curves, process, suites
from ci.gate.verdict import EXIT_USAGE, Verdict, parity_counts, render_junit, render_summary, to_json

ROOT = Path(__file__).resolve().parents[2]
"""The project checkout the gate belongs to (its tests, its baselines)."""
DEFAULT_BASELINES = ROOT / "ci" / "baselines"
_OUTPUTS = ("junit.xml", "parity.json", "parity.md", "parity.png", "gate.json", "baselines.xml", "bench.json")


class UsageError(Exception):
    """Bad arguments or a machine that cannot run the tier (exit 2); the message says the fix."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ci.gate",
        description="The CI regression gate: a tier's suites with JUnit XML and parity reports, and "
        "each parity configuration's loss, grad-norm and scale curves against golden baselines.",
        epilog="exit status: 0 all hold; 1 regression; 2 usage or infrastructure error",
    )
    parser.add_argument(
        "tests",
        nargs="*",
        default=list(suites.DEFAULT_TESTS),
        help="test paths or node ids, as pytest takes them (default: suites, the whole tier)",
    )
    parser.add_argument("-k", dest="keyword", default="", help="a pytest -k expression narrowing the run")
    parser.add_argument(
        "--gpu", action="store_true", help="the GPU tier (NCCL, -m gpu) instead of the CPU tier"
    )
    parser.add_argument(
        "--require-gpus",
        type=int,
        default=None,
        metavar="N",
        help="with --gpu: GPUs this machine must have (default 2); fewer is exit 2",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("reports/gate"), help="output folder (default reports/gate)"
    )
    parser.add_argument(
        "--baselines",
        type=Path,
        default=DEFAULT_BASELINES,
        help="the baselines folder (default: ci/baselines of this checkout)",
    )
    parser.add_argument(
        "--update-baselines",
        action="store_true",
        help="rewrite this torch version's baselines from this run (configurations that broke are left out)",
    )
    parser.add_argument(
        "--fail-on-drift",
        action="store_true",
        help="exit 1 when curves differ from the nearest torch version's baselines (drift) too",
    )
    parser.add_argument(
        "--bench", action="store_true", help="also run make bench's benchmarks, print them, write bench.json"
    )
    parser.add_argument("--no-plot", action="store_true", help="do not draw parity.png")
    parser.add_argument(
        "--from-report",
        type=Path,
        default=None,
        metavar="PARITY_JSON",
        help="compare an existing parity.json (from make parity or an earlier gate) instead of running tests",
    )
    options = parser.parse_args(argv)
    if options.require_gpus is not None and not options.gpu:
        parser.error("--require-gpus applies to the GPU tier only; add --gpu")
    if options.require_gpus is None:
        options.require_gpus = 2
    if options.require_gpus < 1:
        parser.error(f"--require-gpus must be >= 1, got {options.require_gpus}")
    if options.from_report is not None:
        if not options.from_report.is_file():
            parser.error(
                f"--from-report {options.from_report}: no such file; run make parity or the gate first"
            )
        if options.tests != list(suites.DEFAULT_TESTS) or options.keyword or options.bench:
            parser.error("--from-report compares a report; it takes no test selection, -k or --bench")
    if options.out.exists() and not options.out.is_dir():
        parser.error(f"--out {options.out} is a file; give a folder")
    options.whole_tier = options.tests == list(suites.DEFAULT_TESTS) and not options.keyword
    return options


def _choice(
    options: argparse.Namespace, backend: str, running: tuple[int, int, int]
) -> baselines.Choice | None:
    choice = baselines.choose(options.baselines, backend, running)
    if choice is None and not options.update_baselines:
        raise UsageError(
            f"no baselines for backend {backend} under {options.baselines / backend}: record them on a machine "
            "of this kind with python -m ci.gate --update-baselines (make gate GATE_ARGS=--update-baselines)"
        )
    return choice


def _run_tier(options: argparse.Namespace, tier: suites.Tier) -> tuple[suites.Tally, str]:
    """Run the tier's pytest session; its tally, and why it could not judge the code (or "")."""
    from ci.gate import preflight

    problem = preflight.check_ranks(tier.backend, min(2, options.require_gpus) if options.gpu else 2)
    if problem:
        raise UsageError(problem)
    command = suites.pytest_command(
        tier,
        tests=options.tests,
        keyword=options.keyword,
        out=options.out.resolve(),
        plot=not options.no_plot,
        require_gpus=options.require_gpus if options.gpu else 0,
    )
    print("gate: " + " ".join(command[1:]), flush=True)
    code = process.call(command, cwd=ROOT)
    junit = options.out / "junit.xml"
    if not junit.exists():
        raise UsageError(f"pytest stopped with exit status {code} before writing {junit}")
    tally = suites.read_junit(junit)
    if code == suites.PYTEST_NO_TESTS:
        raise UsageError(f"the selection ran no test: {' '.join(options.tests)} -k {options.keyword!r}")
    if code == suites.PYTEST_FAILED and not tally.failed:
        return tally, f"pytest exited 1, but {junit} records no failed test: see the output above"
    if code in (suites.PYTEST_OK, suites.PYTEST_FAILED):
        return tally, ""
    if code == suites.PYTEST_INTERRUPTED and any(f.collection for f in tally.failures):
        return tally, ""  # the code under test failed to import: a regression, not the machine
    return tally, f"pytest stopped with exit status {code} (interrupted, internal or usage error)"


def _as_expected(config: dict[str, Any]) -> bool:
    broken = config["status"] in ("fail", "crash", "error")
    return broken == bool(config["expected_failure"])


def _update(
    options: argparse.Namespace,
    report: dict[str, Any],
    backend: str,
    running: tuple[int, int, int],
    *,
    whole_tier: bool,
) -> tuple[str, tuple[str, ...]]:
    """Rewrite this torch version's baselines from ``report``; the file, and what broke (left out)."""
    path = baselines.path_for(options.baselines, backend, running)
    old = baselines.read(path) if path.exists() else {}
    configs = [c for c in report.get("configs", []) if c["config"]["backend"] == backend]
    keep = frozenset(c["id"] for c in configs if _as_expected(c))
    broken = tuple(c["id"] for c in configs if not _as_expected(c) and curves.points_of(c) is not None)
    new = curves.updated(old, {"configs": configs}, keep=keep, whole_tier=whole_tier)
    baselines.write(path, new, backend=backend, version=running)
    return str(path), broken


def _bench(out: Path) -> None:
    """Run the benchmarks and print their table; timing never changes the gate's verdict."""
    from ci.bench import render

    path = out / "bench.json"
    print("gate: python -m ci.bench --json " + str(path), flush=True)
    process.call([sys.executable, "-m", "ci.bench", "--json", str(path.resolve())], cwd=ROOT)
    if path.exists():
        print("\n" + render(json.loads(path.read_text())), flush=True)
    else:
        print("gate: the benchmarks wrote no bench.json (see above); timing never gates", flush=True)


def run(options: argparse.Namespace) -> Verdict:
    import torch

    tier = suites.GPU if options.gpu else suites.CPU
    out: Path = options.out
    report_path = options.from_report or out / "parity.json"
    if options.from_report is not None:
        report = json.loads(options.from_report.read_text())
        if report.get("schema") != "shardscale.parity":
            raise UsageError(
                f"--from-report {options.from_report} is not a parity.json (schema shardscale.parity)"
            )
        torch_text = str(report["run"]["torch"])
        backend = report["run"]["backend"] if isinstance(report["run"]["backend"], str) else tier.backend
    else:
        torch_text, backend = torch.__version__, tier.backend
    running = baselines.torch_version(torch_text)
    if options.gpu:
        from ci.gate import preflight

        have = preflight.gpus()
        if have < options.require_gpus:
            raise UsageError(
                f"--gpu requires {options.require_gpus} CUDA GPUs (--require-gpus), this machine has {have}"
            )
    choice = _choice(options, backend, running)
    tally, problem = None, ""
    if options.from_report is None:
        out.mkdir(parents=True, exist_ok=True)
        for name in _OUTPUTS:  # never read what an earlier run left behind
            (out / name).unlink(missing_ok=True)
        tally, problem = _run_tier(options, tier)
        report = json.loads(report_path.read_text()) if report_path.exists() else None
    whole_tier = options.whole_tier and options.from_report is None
    updated, not_recorded = "", ()
    if options.update_baselines and report is not None and not problem:
        updated, not_recorded = _update(options, report, backend, running, whole_tier=whole_tier)
        choice = baselines.choose(options.baselines, backend, running)
    comparison = None
    if report is not None and choice is not None and not problem:
        comparison = curves.compare(
            report,
            baselines.read(choice.path),
            drift=not choice.exact,
            whole_tier=whole_tier,
            backend=backend,
        )
    return Verdict(
        tier=tier.name if options.from_report is None else f"report {options.from_report}",
        backend=backend,
        torch=torch_text,
        tests=tally,
        parity=parity_counts(report) if report is not None else None,
        comparison=comparison,
        choice=choice,
        fail_on_drift=options.fail_on_drift,
        updated=updated,
        not_recorded=not_recorded,
        infrastructure=problem,
        out=str(out if options.from_report is None else options.from_report.parent),
    )


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    options = parse_args(argv)
    try:
        verdict = run(options)
    except (UsageError, baselines.BaselineError) as error:
        print(f"gate: ERROR (exit 2): {error}", file=sys.stderr)
        return EXIT_USAGE
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "gate.json").write_text(json.dumps(to_json(verdict), indent=1) + "\n")
    (options.out / "baselines.xml").write_text(render_junit(verdict))
    if options.bench:
        _bench(options.out)
    print("\n" + render_summary(verdict), flush=True)
    return verdict.exit_code


if __name__ == "__main__":
    sys.exit(main())
