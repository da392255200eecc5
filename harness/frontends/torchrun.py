"""Run the same distributed test bodies under ``torchrun`` (env:// rendezvous; the multi-node path).

Usage (on every node; ``--standalone`` for one machine)::

    torchrun --nproc-per-node 2 -m harness.frontends.torchrun suites/harness/test_distributed.py
    torchrun --nnodes 2 --node-rank 0 --master-addr HOST --master-port 29500 --nproc-per-node 8 \\
        -m harness.frontends.torchrun --backend nccl path/to/test_file.py::test_name

Why it exists: the warm pool lives on one host. For several hosts, torchrun starts the ranks and
this module runs, in every rank, each function of the given files that carries the ``distributed``
marker for this backend and world size (``parametrize`` marks are expanded; the ``rank`` and
``world_size`` arguments are filled in; other fixtures are not available and such tests are
reported as skipped). Outcomes are judged by the same rules as under pytest (``outcome.judge``):
ranks exchange them through the rendezvous store, rank 0 prints one line per test (with the reason
of a skip) and the failure text. A test's deadline and collective timeout are its marker's
(``--deadline`` is the default, as ``--dist-deadline`` under pytest); at the deadline the rank
dumps every thread's stack (``faulthandler``) and exits, which ends the run, so nothing hangs.

Exit codes follow pytest's: 0 every test passed or skipped, 1 a test failed, 4 a usage error (not
under torchrun, no such file, no such test; found before any process group is joined, and said
once, by rank 0), 5 no test declares this backend and world size.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import inspect
import os
import pickle
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness.outcome import RankResult, judge
from harness.protocol import Placeholder
from harness.rank import context, execute
from harness.spec import BACKENDS, MARKER, DistConfig, from_marker
from harness.torch_private import c10d

EXIT_FAILED, EXIT_USAGE, EXIT_NO_TESTS = 1, 4, 5
HOW_TO_RUN = (
    "harness.frontends.torchrun runs inside torchrun, which sets RANK and WORLD_SIZE for every rank; run e.g.\n"
    "  torchrun --standalone --nproc-per-node 2 -m harness.frontends.torchrun path/to/test_file.py"
)


class UsageError(ValueError):
    """A target that cannot be run (no such file or test); the message says which."""


def _marks(func: Any, name: str) -> list[Any]:
    return [m for m in getattr(func, "pytestmark", []) if m.name == name]


def _expand_parametrize(func: Any) -> list[tuple[str, dict[str, Any]]]:
    """``[(id, kwargs)]`` for the function's parametrize marks (cross product, pytest's id order)."""
    cases: list[tuple[str, dict[str, Any]]] = [("", {})]
    for mark in reversed(_marks(func, "parametrize")):
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        options = []
        for i, value in enumerate(mark.args[1]):
            values = getattr(value, "values", None)  # pytest.param(...)
            values = values if values is not None else value
            values = values if len(names) > 1 else (values[0] if hasattr(value, "values") else values)
            param_id = getattr(value, "id", None) or (str(values) if len(names) == 1 else f"{names[0]}{i}")
            options.append(
                (param_id, dict(zip(names, values, strict=True)) if len(names) > 1 else {names[0]: values})
            )
        cases = [
            ("-".join(p for p in (cid, oid) if p), {**ckw, **okw})
            for cid, ckw in cases
            for oid, okw in options
        ]
    return cases


def collect(
    target: str, backend: str, world_size: int
) -> tuple[list[tuple[str, str, dict[str, Any], DistConfig]], set[str]]:
    """The distributed tests of ``path.py[::name]``: ``([(name, module:qualname, kwargs, config)]
    that fit this backend and world size, {ids of every configuration the file declares})``.

    Raises :class:`UsageError` for a missing file or a test name the file does not define."""
    path_text, _, only = target.partition("::")
    path = Path(path_text)
    if not path.is_file():
        raise UsageError(f"no such file: {path_text}")
    if path.suffix != ".py":
        raise UsageError(f"not a Python file: {path_text} (give test_file.py, optionally ::test_name)")
    path = path.resolve()
    execute.add_sys_path((str(path.parent),))
    module = importlib.import_module(path.stem)
    only_name = only.split("[")[0]
    if only_name and not callable(getattr(module, only_name, None)):
        raise UsageError(f"no test named {only_name!r} in {path_text}")
    found = []
    declared: set[str] = set()
    for name, func in vars(module).items():
        if not name.startswith("test") or not callable(func) or (only_name and name != only_name):
            continue
        for mark in _marks(func, MARKER):
            for config in from_marker(mark.args, mark.kwargs):
                declared.add(config.id)
                if config.backend != backend or config.world_size != world_size:
                    continue
                for param_id, kwargs in _expand_parametrize(func):
                    suffix = "-".join(p for p in (param_id, config.id) if p)
                    found.append(
                        (f"{path.name}::{name}[{suffix}]", f"{module.__name__}:{name}", kwargs, config)
                    )
    return found, declared


def _run_one(
    name: str, target: str, kwargs: dict[str, Any], rank: int, world_size: int
) -> tuple[str, Any, str, str]:
    func = execute.resolve(target)
    missing = [
        p for p in inspect.signature(func).parameters if p not in kwargs and p not in ("rank", "world_size")
    ]
    if missing:
        return "skipped", None, f"needs pytest fixtures {missing}, which torchrun mode does not provide", ""
    full = {**kwargs}
    for placeholder in Placeholder:
        if placeholder.value in inspect.signature(func).parameters:
            full[placeholder.value] = placeholder
    return execute.call_case(target, (), full, rank=rank, world_size=world_size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.frontends.torchrun", description=__doc__.split("\n")[0]
    )
    parser.add_argument("targets", nargs="+", help="test files, optionally file.py::test_name")
    parser.add_argument("--backend", default="gloo", choices=BACKENDS)
    parser.add_argument(
        "--deadline",
        type=float,
        default=120.0,
        help="default per-test deadline in seconds (a marker's deadline= wins; collective timeout: half)",
    )
    options = parser.parse_args(argv)
    if not options.deadline > 0:
        parser.error(f"--deadline must be > 0 seconds, got {options.deadline}")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print(HOW_TO_RUN, file=sys.stderr)
        return EXIT_USAGE
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Find the tests before joining a group: a bad target ends every rank at once, said once.
    cases: list[tuple[str, str, dict[str, Any], DistConfig]] = []
    declared: set[str] = set()
    try:
        for target in options.targets:
            found, ids = collect(target, options.backend, world_size)
            cases += found
            declared |= ids
    except UsageError as exc:
        if rank == 0:
            print(f"harness.frontends.torchrun: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not cases:
        if rank == 0:
            print(
                f"harness.frontends.torchrun: no tests ran: no distributed test for {options.backend} with world size "
                f"{world_size} in {' '.join(options.targets)} (declared: {', '.join(sorted(declared)) or 'none'})",
                flush=True,
            )
        return EXIT_NO_TESTS
    return _run(cases, options.backend, options.deadline, rank, world_size)


def _run(
    cases: list[tuple[str, str, dict[str, Any], DistConfig]],
    backend: str,
    default_deadline: float,
    rank: int,
    world_size: int,
) -> int:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    collective = timedelta(seconds=default_deadline / 2)
    dist.init_process_group(backend, init_method="env://", timeout=collective)
    context.advance_group_generation()
    base_store = c10d.default_store()

    def reset_group(suffix: str) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        store = dist.PrefixStore(f"shardscale-reset/{suffix}/", base_store)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=collective)
        context.advance_group_generation()

    failed = 0
    counts = {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0}
    for index, (name, target, kwargs, config) in enumerate(cases):
        deadline, collective_s = config.timeouts(default_deadline)
        collective = timedelta(seconds=collective_s)
        c10d.set_timeout(collective)
        store = dist.PrefixStore(f"shardscale-case{index}/", base_store)
        context._set_current(
            context.RankContext(
                rank=rank,
                world_size=world_size,
                backend=backend,
                device=device,
                store=store,
                reset_group=reset_group,
                mode="torchrun",
            )
        )
        faulthandler.dump_traceback_later(deadline, exit=True)
        try:
            status, _, text, headline = _run_one(name, target, kwargs, rank, world_size)
        finally:
            faulthandler.cancel_dump_traceback_later()
            context._set_current(None)
        if status != "passed" and dist.is_initialized():
            dist.destroy_process_group()  # unblock peers waiting in a collective with this rank
        store.set(f"result/{rank}", pickle.dumps((status, text, headline)))
        keys = [f"result/{r}" for r in range(world_size)]
        store.wait(keys, timedelta(seconds=deadline))
        results = []
        for order, r in enumerate(range(world_size)):
            peer_status, peer_text, peer_headline = pickle.loads(store.get(f"result/{r}"))
            results.append(
                RankResult(rank=r, status=peer_status, text=peer_text, headline=peer_headline, order=order)
            )
        verdict = judge(results, world_size=world_size)
        counts[verdict.outcome] += 1
        if verdict.outcome == "failed":
            failed += 1
        if any(r.status != "passed" for r in results):
            reset_group(f"case{index}")
        if rank == 0:
            reason = f" ({verdict.message})" if verdict.outcome in ("skipped", "xfailed") else ""
            print(f"{name} {verdict.outcome.upper()}{reason}", flush=True)
            if verdict.outcome == "failed":
                print(verdict.message, flush=True)
    if rank == 0:
        summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
        print(f"harness.frontends.torchrun: {summary} (world size {world_size}, {backend})", flush=True)
    dist.destroy_process_group()
    return EXIT_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
