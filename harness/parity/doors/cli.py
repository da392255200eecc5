"""What the CLI's arguments select, and what it writes: the matrix a run checks, the workloads it
can name, the reports.

Why apart from ``__main__.py``: the command line (parsing and validating it, running on a pool or
under torchrun) and what a run means (which configurations ``--workload`` and the flags select,
which files it writes) change for different reasons; each stays a module a reader can hold.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import sys
from pathlib import Path
from typing import NoReturn

from harness.parity.judge.result import ParityResult
from harness.parity.plan.config import ParityConfig, Scale, unique
from harness.parity.plan.config.axes import COMPILE_BACKENDS, COMPILE_MODES, COMPILE_TWINS
from harness.parity.plan.config.compile import cache_folder
from harness.parity.plan.config.mesh import SCHEDULES
from harness.parity.plan.matrices import compile as compile_matrix
from harness.parity.plan.matrices import default as matrix
from harness.parity.plan.matrices import pipeline as pipeline_matrix
from harness.parity.plan.matrices import resume as resume_matrix
from harness.parity.plan.matrices import two_d as two_d_matrix
from harness.parity.plan.matrices import workload as workload_matrix
from harness.parity.plan.matrices.declared import Declared
from harness.parity.ranks.sides import stages
from harness.parity.report import markdown, render
from harness.parity.workload import registry, tp_plan, units
from harness.parity.workload.spec import WorkloadError


class BadWorkload(Exception):
    """A ``--workload`` that cannot be used; printed as it is, exit status 2."""


def check_compile(parser: argparse.ArgumentParser, options: argparse.Namespace) -> None:
    """``--compile MODE [--compile-backend BACKEND]``, each value named in its error with the fix."""
    modes = [mode for mode in COMPILE_MODES if mode not in (None, "function")]
    if options.compile is not None and options.compile not in modes:
        parser.error(
            f"--compile must be one of {', '.join(modes)}, got {options.compile!r}; e.g. --compile block"
        )
    if options.compile_backend is not None and options.compile is None:
        parser.error(
            f"--compile-backend {options.compile_backend} needs --compile MODE; e.g. --compile block "
            f"--compile-backend {options.compile_backend}"
        )
    if options.compile_backend is not None and options.compile_backend not in COMPILE_BACKENDS:
        parser.error(
            f"--compile-backend must be one of {', '.join(COMPILE_BACKENDS)}, got "
            f"{options.compile_backend!r}; e.g. --compile-backend aot_eager"
        )
    if options.compile_twin is not None and options.compile is None and not options.workload:
        parser.error(
            f"--compile-twin {options.compile_twin} needs --compile MODE (e.g. --compile block), or a "
            "--workload with its own parallelize function"
        )
    if options.compile_twin is not None and options.compile_twin not in COMPILE_TWINS:
        parser.error(
            f"--compile-twin must be one of {', '.join(COMPILE_TWINS)}, got {options.compile_twin!r}; "
            "e.g. --compile-twin eager"
        )
    options.compile_backend = options.compile_backend or "inductor"
    options.compile_twin = options.compile_twin or "compiled"
    clashes = [flag for flag, on in (("--reshard", options.reshard), ("--tp", options.tp is not None)) if on]
    if options.compile is not None and clashes:
        parser.error(f"--compile runs the compiled rows; not with {clashes[0]} (their rows are not compiled)")


def check_pipeline(parser: argparse.ArgumentParser, options: argparse.Namespace) -> None:
    """``--pp N [--schedule NAME] [--microbatches M]``, each refused naming the fix."""
    if options.pp is None:
        if options.schedule is not None:
            parser.error(f"--schedule {options.schedule} needs --pp N; e.g. --pp 2 --schedule 1f1b")
        return
    if not options.workload:
        parser.error("--pp runs a --workload's pipeline rows; e.g. --workload llama --pp 2")
    if options.pp < 2 or options.world_size % options.pp:
        parser.error(
            f"--pp {options.pp} needs at least 2 stages and a --world-size it divides (got --world-size "
            f"{options.world_size}); e.g. --world-size 2 --pp 2, or --world-size 4 --pp 2 for dp 2 per stage"
        )
    if options.schedule is not None and options.schedule not in SCHEDULES:
        parser.error(f"--schedule must be one of {', '.join(SCHEDULES)}, got {options.schedule!r}")
    if options.microbatches < 1:
        parser.error(f"--microbatches must be >= 1, got {options.microbatches}")
    if options.tp is not None and options.world_size % (options.pp * options.tp):
        parser.error(
            f"--pp {options.pp} --tp {options.tp} needs a --world-size their product divides (pp x dp x tp), "
            f"got {options.world_size}; e.g. --world-size 8 --pp 2 --tp 2"
        )


def configs_for(options: argparse.Namespace) -> list[ParityConfig]:
    """The embedded matrix, or every ``--workload``'s (each checked first: :class:`BadWorkload`)."""
    where = {"world_size": options.world_size, "backend": options.backend}
    if options.reshard:
        resharded = matrix.reshard(backend=options.backend)
        return [c.with_(scaler=options.scaler) for c in resharded] if options.scaler != "ours" else resharded
    if getattr(options, "compile", None) is not None:
        return _compiled(options, where)
    if not options.workload:
        return matrix.default_matrix(**where, scaler=options.scaler)
    scale = Scale(scaler=options.scaler)
    asked = Declared(
        recipe=options.recipe,
        clip=options.clip,
        accumulate=options.accumulate,
        sync=options.sync,
        checkpoint=options.checkpoint,
        resume_at=options.resume_at,
    )
    options.recipes = {}
    options.loops = {}
    options.tp_plans = {}
    options.pipelines = {}
    options.parameters = {}
    """Per workload, its model's parameter count (``lanes.jobs`` reads it)."""
    configs = []
    for name in options.workload:
        try:
            if not options.list:
                from harness.parity.workload.checks import check

                check(registry.get(name))
            workload = registry.get(name)
            model = registry.build_model(workload, 0)  # once, on the controller
            options.units[workload.name] = units.describe(workload, model)
            options.parameters[workload.name] = sum(p.numel() for p in model.parameters())
            if getattr(options, "pp", None) is not None:
                stages.check_microbatches(workload, model, options.microbatches)
                schedules = (options.schedule,) if options.schedule else tuple(SCHEDULES)
                found = pipeline_matrix.rows(
                    name,
                    pp=options.pp,
                    schedules=schedules,
                    microbatches=options.microbatches,
                    tp=options.tp,
                    scale=scale,
                    **where,
                )
                if not found:
                    raise WorkloadError(
                        f"--pp needs a workload that can be cut into stages; {workload.name!r} has no pp_split "
                        "(give it Workload(pp_split='auto', pp_io=..., pp_loss=...))"
                    )
                configs += found
                options.pipelines[workload.name] = stages.describe(workload, model, options.pp, schedules)
                continue
            if options.tp is not None:
                # Checked here: no plan, an "auto" plan the model lacks or a key that matches
                # nothing exits 2 naming the fix.
                options.tp_plans[workload.name] = tp_plan.describe(workload, model)
                tp_plan.check_degree(workload, model, options.tp)
                configs += two_d_matrix.rows(name, tp=options.tp, scale=scale, **where)
                continue
            user = registry.get(name).parallelize is not None
            twin = getattr(options, "compile_twin", "compiled")
            if twin != "compiled" and not user:
                raise WorkloadError(
                    f"--compile-twin {twin} without --compile checks a workload's own parallelize "
                    f"function; {registry.get(name).name!r} has none (add --compile block)"
                )
            configs += workload_matrix.for_workload(
                name,
                scale=scale,
                declared=asked,
                mesh=getattr(options, "mesh", None),
                compile_twin=twin,
                **where,
            )
            declared = asked.over(name)
            loop = declared.loop_words()
            if loop is not None:
                options.loops[registry.get(name).name] = loop
            if declared.recipe is not None:
                options.recipes[registry.get(name).name] = declared.recipe
        except (WorkloadError, ValueError) as error:  # a --mesh the world cannot hold: ValueError
            raise BadWorkload(str(error)) from None
    return unique(configs)


def _compiled(options: argparse.Namespace, where: dict[str, object]) -> list[ParityConfig]:
    """``--compile MODE``: the compiled rows of the MLP, or of each ``--workload``."""
    configs = []
    for name in options.workload or ["mlp"]:
        try:
            configs += compile_matrix.rows(
                mode=options.compile,
                compile_backend=options.compile_backend,
                twin=options.compile_twin,
                workload=name,
                **where,  # type: ignore[arg-type]
            )
        except WorkloadError as error:
            raise BadWorkload(str(error)) from None
    if options.scaler != "ours":
        configs = [c.with_(scaler=options.scaler) for c in configs]
    return unique(configs)


def list_workloads() -> list[str]:
    """The lines ``--list`` ends with: every registered workload and where it comes from."""
    lines = ["", "workloads (--workload NAME, or --workload module:function for your own):"]
    for name, (spec, source) in sorted(registry.available().items()):
        lines.append(f"  {name:<14} {spec}  ({source})")
    return lines


def world_sizes(options: argparse.Namespace) -> str:
    """``world size 2``, or a resharded run's ``world sizes 4 -> 2, 2 -> 4``."""
    if options.reshard:
        return "world sizes " + ", ".join(f"{a} -> {b}" for a, b in resume_matrix.WORLD_SIZE_CHANGES)
    return f"world size {options.world_size}"


def import_plotting(options: argparse.Namespace, in_torchrun: bool) -> None:
    """Start importing matplotlib while the rows run, where this process will draw parity.png."""
    if not options.no_plot and not in_torchrun:
        from harness.parity.report import plot  # matplotlib only on the thread it starts

        plot.import_in_background()


def write_reports(
    options: argparse.Namespace, results: list[ParityResult], wall: float, *, launcher: str
) -> int:
    """Write the reports, print the summary; the exit status (1 when a configuration broke)."""
    import torch

    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    run = {
        "backend": options.backend,
        "world_size": world_sizes(options).split(" ", 2)[-1] if options.reshard else options.world_size,
        "scaler": options.scaler,
        "filter": options.expression,
        "workloads": options.workload,
        "units": options.units,
        "recipes": getattr(options, "recipes", {}),
        "loops": getattr(options, "loops", {}),
        "tp_plans": getattr(options, "tp_plans", {}),
        "pipelines": getattr(options, "pipelines", {}),
        **({"compile_cache": cache_folder()} if any(r.config.compile.compiled for r in results) else {}),
        "launcher": launcher,
        "torch": torch.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(wall, 2),
    }
    (out / "parity.json").write_text(json.dumps(render.to_json(results, run), indent=1) + "\n")
    (out / "parity.md").write_text(markdown.render_markdown(results, run))
    written = [out / "parity.json", out / "parity.md"]
    if not options.no_plot:
        try:
            from harness.parity.report.plot import render_png
        except ImportError:  # pragma: no cover - depends on the environment
            print(
                "parity: matplotlib is not installed, so parity.png is not written (pip install shardscale[report])"
            )
        else:
            if render_png(results, out / "parity.png"):
                written.append(out / "parity.png")
    print()
    print(markdown.render_summary(results))
    print(f"\nparity: {wall:.1f}s wall; wrote {', '.join(str(p) for p in written)}")
    broken = [r for r in results if r.broken]
    unlike = [found for found in render.splits(results) if not found.passed]
    expected = [r for r in results if r.broken and r.expected_failure]
    if expected:  # still broken (a setup of yours that runs them trains otherwise), but known
        print(
            f"parity: {len(expected)} of the broken are known defects (expected failures, each with its "
            "reason in parity.md)"
        )
    if broken:
        print(
            f"parity: {len(broken)} configuration(s) broke their tolerance: "
            + ", ".join(r.config.id for r in broken)
        )
    if unlike:
        print(
            f"parity: {len(unlike)} split(s) do not train like the whole batch (ground truth): "
            + ", ".join(found.name for found in unlike)
        )
    return 1 if broken or unlike else 0


def exit_now(code: int) -> NoReturn:
    """End the CLI's process with ``code`` once its exit handlers ran, skipping the interpreter's
    teardown. Why: with torch, matplotlib and the engine loaded, freeing every module's objects
    one by one takes 1.3 s here after the reports are written, and nothing of it is wanted: the
    output is flushed, the ranks and the pools are closed, and the exit handlers (``atexit``:
    logging, multiprocessing's) still run. Under a profiler or a tracer (``python -m cProfile``,
    a debugger), which writes its data after the module returns, it exits as usual."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # its reader left (``--list | head``), or it is closed
            pass
    os._exit(code)
