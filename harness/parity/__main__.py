"""``python -m harness.parity`` (``make parity``): run the parity matrix and write the reports.

Without ``--workload`` it runs the embedded default matrix; ``--workload my_workloads:resmlp`` (or
a registered name) runs that workload's matrix (``workload_matrix.for_workload``). The workload's
module is found on ``sys.path``: the current folder, ``PYTHONPATH``, installed packages.

Exit status: 0 when every configuration that ran held its tolerance, 1 when any broke it (each is
named), 2 for bad arguments, a workload that cannot be used (the message names the fix) or ranks
that could not be started.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __name__ == "__main__":  # the ranks' forkserver imports while this process imports (below)
    from harness.parity.doors import early

    early.start(sys.argv[1:])
from harness.parity.doors import cli, lanes, launched, runner  # noqa: E402
from harness.parity.judge.result import ParityResult
from harness.parity.plan.config import BACKENDS, SCALERS, unsupported_reason
from harness.parity.plan.recipe import RECIPES
from harness.parity.plan.select import ExpressionError, select
from harness.parity.ranks import requests
from harness.parity.report import render


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m harness.parity",
        description="Does FSDP train exactly like DDP under loss scaling, and does every rank skip the same steps?",
    )
    parser.add_argument(
        "--backend", choices=BACKENDS, default="gloo", help="gloo (CPU) or nccl (a GPU per rank)"
    )
    parser.add_argument(
        "--world-size",
        type=int,
        default=launched.world_size() if launched.launched() else 2,
        help="ranks per configuration (default 2; HYBRID_SHARD needs >= 4); under torchrun, the launched world size",
    )
    parser.add_argument(
        "--scaler",
        choices=SCALERS,
        default="ours",
        help="the candidate's scaler: ours or torch's ShardedGradScaler",
    )
    parser.add_argument(
        "-k",
        dest="expression",
        default="",
        help="select configurations, pytest-style: -k 'fsdp2 and not bf16'",
    )
    parser.add_argument(
        "--out", default="reports", help="folder for parity.json, parity.md and parity.png (default reports)"
    )
    parser.add_argument("--list", action="store_true", help="print the selected configuration ids and exit")
    parser.add_argument("--batch-size", type=int, default=8, help="configurations per rank call (default 8)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="groups of ranks that run configurations at once, each with its own models in memory "
        "(default on gloo: 2 when every model has at most 1M parameters, whose ranks mostly wait on "
        "collectives, as the embedded matrix's; else 1)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds allowed per configuration (default 60; 600 with --compile, whose first step compiles)",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not write parity.png")
    parser.add_argument(
        "--drift",
        action="store_true",
        help="for each row the staged check decides, also train its reference twice straight through "
        "(once summing the ranks in another order) and show the drift a reordering alone produces "
        "beside the row's own, in parity.md and parity.png (two more reference runs per such row)",
    )
    parser.add_argument(
        "--ground-truth",
        action="store_true",
        help="also check that each split (data-parallel ranks x microbatches, the loss's "
        "normalization) computes the whole global batch's gradient, in float64 on one process: a "
        "stage of its own in the reports, and exit status 1 when a split trains unlike the whole batch",
    )
    parser.add_argument(
        "--workload",
        action="append",
        default=[],
        metavar="NAME|MODULE:FUNCTION",
        help="check this workload instead of the embedded matrix: a factory returning a "
        "harness.parity.Workload (e.g. my_workloads:resmlp, found from the current folder and "
        "PYTHONPATH) or a registered name (--list shows them); repeatable",
    )
    parser.add_argument(
        "--recipe",
        choices=RECIPES,
        default=None,
        help="the precision recipe your --workload trains with (its matrix runs it under every engine, "
        "plus the standard rows); replaces the workload's own recipe",
    )
    parser.add_argument(
        "--clip",
        type=float,
        default=None,
        metavar="NORM",
        help="the max norm your --workload clips at after unscale_ (clip_grad_norm_, path unscale_clip): "
        "its matrix runs it under every engine layout, with the total norm compared every step",
    )
    parser.add_argument(
        "--accumulate",
        type=int,
        default=None,
        metavar="K",
        help="the microbatches per optimizer step your --workload accumulates: its matrix runs them "
        "under every engine layout, syncing every microbatch and only the last (or --sync's)",
    )
    parser.add_argument(
        "--sync", choices=("every", "last"), default=None,
        help="with --accumulate: reduce every microbatch, or only the last (no_sync)",
    )  # fmt: skip
    parser.add_argument(
        "--checkpoint",
        action="store_true",
        help="your --workload checkpoints its units' activations (RNG state preserved): its matrix "
        "runs that under every engine layout, on both sides",
    )
    parser.add_argument(
        "--resume-at",
        type=int,
        default=None,
        metavar="K",
        help="resume rows for your --workload: the candidate saves after K steps, loads into a fresh "
        "model and trains on, against a run straight through (with its own save/load if it declares them)",
    )
    parser.add_argument(
        "--tp",
        type=int,
        default=None,
        metavar="N",
        help="run your --workload's 2-D matrix instead (needs --world-size 4 or more): FSDP2 + tensor "
        "parallelism of degree N over its tp_plan, and HSDP (replicate x shard)",
    )
    parser.add_argument(
        "--pp",
        type=int,
        default=None,
        metavar="N",
        help="run your --workload's pipeline rows instead: its model cut into stages at its pp_split, "
        "FSDP2 over the --world-size / N ranks of each stage, torch's schedules (--world-size 2 or more)",
    )
    parser.add_argument(
        "--schedule",
        default=None,
        metavar="NAME",
        help="with --pp: one schedule (gpipe, 1f1b, interleaved1f1b, looped_bfs, interleaved_zb, zbv, "
        "dualpipev); default: every one",
    )
    parser.add_argument(
        "--microbatches", type=int, default=4, metavar="M",
        help="with --pp: microbatches per step (default 4; must divide the batch)",
    )  # fmt: skip
    parser.add_argument(
        "--mesh",
        default=None,
        metavar="NAME=SIZE,...",
        help="the DeviceMesh a --workload's own parallelize function receives, named and sized as your "
        "code reads it (dp=2,tp=2; sizes multiply to --world-size); default: one dimension dp",
    )
    parser.add_argument(
        "--reshard",
        action="store_true",
        help="the resharded resume rows instead of the embedded matrix: saved at world size 4 and "
        "loaded at 2, and 2 -> 4 (two rank calls each, so --world-size does not apply; not under torchrun)",
    )
    parser.add_argument(
        "--compile",
        default=None,
        metavar="MODE",
        help="the compiled rows instead of the embedded matrix (of the MLP, or of each --workload): "
        "every engine and its DDP twin compiled the same way, MODE 'block' (each innermost FSDP unit, "
        "module.compile()) or 'whole' (the model)",
    )
    parser.add_argument(
        "--compile-backend",
        default=None,
        metavar="BACKEND",
        help="with --compile: the torch.compile backend, 'inductor' (default) or 'aot_eager' "
        "(traced, run by eager kernels: fast to compile)",
    )
    parser.add_argument(
        "--compile-twin",
        default=None,
        metavar="TWIN",
        help="with --compile: the reference, 'compiled' as its candidate (default: a difference is "
        "sharding's) or 'eager' (compile's own difference shows, named compile_changes_numerics)",
    )
    options = parser.parse_args(argv)
    cli.check_compile(parser, options)
    if options.deadline is None:
        options.deadline = 600.0 if options.compile else 60.0
    if options.reshard and (options.workload or launched.launched()):
        parser.error(
            "--reshard runs the embedded resharded rows on the rank pool: not with --workload or torchrun"
        )
    options.units = {}
    loop = [name for name in ("accumulate", "sync") if getattr(options, name) is not None]
    loop += ["checkpoint"] if options.checkpoint else []
    loop += ["resume-at"] if options.resume_at is not None else []
    if loop and not options.workload:
        rows = {
            "resume-at": "-k resume",
            "accumulate": "-k 'accumulate=2'",
            "sync": "-k 'sync=last'",
            "checkpoint": "-k 'ckpt or ckpt_norng'",
        }
        parser.error(
            f"--{loop[0]} declares the loop of a --workload's matrix; the embedded matrix's rows of "
            f"it are {rows[loop[0]]}"
        )
    if options.accumulate is not None and options.accumulate < 2:
        parser.error(f"--accumulate must be >= 2 microbatches, got {options.accumulate}")
    if options.clip is not None and not options.workload:
        parser.error(
            "--clip declares the max norm of a --workload's matrix; the embedded matrix's clipping "
            "rows are -k unscale_clip"
        )
    if options.clip is not None and not options.clip > 0:
        parser.error(f"--clip must be a max norm > 0, got {options.clip}")
    if options.recipe is not None and not options.workload:
        parser.error(
            "--recipe declares the recipe of a --workload's matrix; the embedded matrix's rows of one "
            f"recipe are -k recipe={options.recipe}"
        )
    if options.mesh is not None:
        from harness.parity.plan.config import Mesh

        try:
            Mesh.parse(options.mesh)
        except ValueError as error:
            parser.error(str(error))
        if not options.workload:
            parser.error("--mesh is the mesh of your --workload's parallelize function: name the workload")
    if options.tp is not None and not options.workload:
        parser.error(
            "--tp runs a --workload's 2-D matrix (FSDP2 + TP, HSDP); e.g. --workload llama --world-size 4 --tp 2"
        )
    if options.tp is not None and (
        options.tp < 1 or options.world_size < 4 or options.world_size % options.tp
    ):
        parser.error(
            f"--tp {options.tp} needs a 2-D mesh: --world-size 4 or more that --tp divides "
            f"(got --world-size {options.world_size}); e.g. --world-size 4 --tp 2"
        )
    cli.check_pipeline(parser, options)
    if options.world_size < 1:
        parser.error(f"--world-size must be >= 1, got {options.world_size}")
    if launched.launched() and options.world_size != launched.world_size():
        parser.error(
            f"--world-size {options.world_size} under torchrun, which launched {launched.world_size()} "
            "processes; leave --world-size out (configurations run at the launched world size)"
        )
    if options.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {options.batch_size}")
    if options.jobs is not None and options.jobs < 1:
        parser.error(f"--jobs must be >= 1 group of ranks, got {options.jobs}; e.g. --jobs 1")
    if not options.deadline > 0:
        parser.error(f"--deadline must be > 0 seconds, got {options.deadline}")
    try:  # read again on every rank, which inherit this environment
        requests.keep_budget()
    except ValueError as error:
        parser.error(str(error))
    if os.getcwd() not in sys.path:  # the ranks get this sys.path: the workload imports there too
        sys.path.insert(0, os.getcwd())
    try:
        options.configs = select(cli.configs_for(options), options.expression)
    except ExpressionError as error:
        parser.error(str(error))
    if not options.configs:
        parser.error(f"-k {options.expression!r} selects no configuration; see --list for the ids")
    return options


def _gpus(backend: str) -> int:
    if backend != "nccl":
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _progress(update: runner.Progress) -> None:
    result = update.outcome.result
    width = len(str(update.total))
    print(
        f"[{update.done:>{width}}/{update.total}] {render.label(result):<5} {result.config.id:<60} "
        f"{result.time_s:5.2f}s  elapsed {update.elapsed_s:5.1f}s, ETA {update.eta_s:5.1f}s",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    in_torchrun = launched.launched()
    quiet = in_torchrun and int(os.environ["RANK"]) != 0  # under torchrun, global rank 0 speaks
    try:
        options = parse_args(argv)
    except cli.BadWorkload as error:
        if not quiet:
            print(f"parity: {error}", file=sys.stderr)
        return 2
    gpus = _gpus(options.backend)
    if options.list:
        if not quiet:
            for config in options.configs:
                reason = unsupported_reason(config, gpus=gpus)
                print(config.id + (f"  (not here: {reason})" if reason else ""))
            for name, chosen in options.units.items():
                print(f"units of {name}: {chosen}")
            for name, declared in getattr(options, "recipes", {}).items():
                print(f"recipe of {name}: {declared} (under every engine layout)")
            for name, loop in getattr(options, "loops", {}).items():
                print(f"loop of {name}: {loop} (under every engine layout)")
            for name, plan in getattr(options, "tp_plans", {}).items():
                print(f"tp plan of {name}: {plan}")
            print("\n".join(cli.list_workloads()))
        return 0
    import torch

    if not quiet:
        print(
            f"parity: {len(options.configs)} configurations, {options.backend}, {cli.world_sizes(options)}"
            + (" (torchrun)" if in_torchrun else "")
            + f", scaler {options.scaler}, torch {torch.__version__}",
            flush=True,
        )
    started = time.monotonic()
    cli.import_plotting(options, in_torchrun)

    def finish(results: list[ParityResult]) -> int:
        return cli.write_reports(
            options, results, time.monotonic() - started, launcher="torchrun" if in_torchrun else "pool"
        )

    if in_torchrun:
        return launched.run(
            options.configs,
            backend=options.backend,
            deadline_per_config_s=options.deadline,
            batch_size=options.batch_size,
            gpus=gpus,
            on_progress=_progress,
            finish=finish,
            drift=options.drift,
            ground_truth=options.ground_truth,
        )
    from harness.controller.pool import PoolError, RankPool

    pools = [RankPool(preload=(requests.RANK_MODULE,)) for _ in range(lanes.jobs(options))]
    executors = [runner.pool_executor(pool, deadline_per_config_s=options.deadline) for pool in pools]
    try:
        outcomes = runner.run(
            options.configs,
            executors[0],
            parallel=executors[1:],
            gpus=gpus,
            batch_size=options.batch_size,
            keep_records=False,
            on_progress=_progress,
            drift=options.drift,
            ground_truth=options.ground_truth,
        )
    except PoolError as error:
        print(f"parity: the ranks could not be started: {error}", file=sys.stderr)
        return 2
    finally:
        for pool in pools:
            pool.close()
    return finish([outcome.result for outcome in outcomes])


def _main_to_a_pipe() -> int:
    """:func:`main`, quiet when its reader goes away (``--list | head``): the rest of the output is
    simply not wanted, which is not an error of the run."""
    try:
        return main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


if __name__ == "__main__":
    cli.exit_now(_main_to_a_pipe())
