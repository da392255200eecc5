"""``python -m ci.bench [--json PATH] [--only PART ...] [--cost-sizes 1M,10M,50M] [--cost-world-sizes 2,4,8]``:
run the benchmarks, print their tables and optionally write them as JSON (schema in :mod:`ci.bench`).

Exit status: 0 when every part was measured, 1 when a part failed (the others still run and are
printed; the failure is in the JSON as ``{"error": ...}``), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import traceback
from pathlib import Path
from typing import Any

from ci.bench import PARTS, SCHEMA, VERSION, render_part


def _measure(
    name: str, cost_sizes: tuple[str, ...], cost_world_sizes: tuple[int, ...] = (2,)
) -> dict[str, Any]:
    if name == "scaler":
        from ci.bench import scaler_overhead

        return scaler_overhead.measure_all()
    if name == "harness":
        from ci.bench import harness_overhead

        return harness_overhead.measure()
    if name == "cost":
        from ci.bench import cost_curve

        return cost_curve.measure(cost_sizes, cost_world_sizes)
    if name == "diagnosis":
        from ci.bench import diagnosis

        return diagnosis.measure()
    from ci.bench import parity_wall

    return parity_wall.measure()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="also write the tables as JSON to this file")
    parser.add_argument(
        "--only",
        action="append",
        choices=PARTS,
        default=None,
        help="measure only this part (repeatable; default: all)",
    )
    parser.add_argument(
        "--cost-sizes",
        default="1M,10M",
        help="model sizes of the cost curve, comma-separated, of 1M, 10M, 50M, 185M, 300M (default "
        "1M,10M; 50M takes minutes on 2 cores, 185M and 300M need 8 and 15 GB)",
    )
    parser.add_argument(
        "--cost-world-sizes",
        default="2,4,8",
        help="gloo ranks of the cost curve's world-size rows, comma-separated (default 2,4,8; each "
        "runs the first of --cost-sizes)",
    )
    options = parser.parse_args(argv)
    if options.json is not None and options.json.is_dir():
        parser.error(
            f"--json {options.json} is a folder; give a file name, e.g. {options.json / 'bench.json'}"
        )
    from ci.bench.cost_workloads import SIZES

    cost_sizes = tuple(size for size in options.cost_sizes.split(",") if size)
    if not cost_sizes or any(size not in SIZES for size in cost_sizes):
        parser.error(
            f"--cost-sizes {options.cost_sizes!r}: give sizes of {', '.join(SIZES)}, e.g. 1M,10M,50M"
        )
    try:
        cost_world_sizes = tuple(int(ws) for ws in options.cost_world_sizes.split(",") if ws)
    except ValueError:
        cost_world_sizes = ()
    if not cost_world_sizes or min(cost_world_sizes) < 2:
        parser.error(
            f"--cost-world-sizes {options.cost_world_sizes!r}: give rank counts of 2 or more, e.g. 2,4,8"
        )
    import torch

    data: dict[str, Any] = {
        "schema": SCHEMA,
        "version": VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "parts": {},
    }
    failed = []
    for name in options.only or PARTS:
        try:
            data["parts"][name] = _measure(name, cost_sizes, cost_world_sizes)
        except Exception as error:  # noqa: BLE001 - one failed part must not hide the others
            traceback.print_exc()
            data["parts"][name] = {"error": f"{type(error).__name__}: {error}"}
            failed.append(name)
        print(render_part(name, data["parts"][name]), end="\n\n", flush=True)
    if options.json is not None:
        options.json.parent.mkdir(parents=True, exist_ok=True)
        options.json.write_text(json.dumps(data, indent=1) + "\n")
        print(f"bench: wrote {options.json}")
        cost = data["parts"].get("cost", {})
        if "error" not in cost and cost:
            from ci.bench.cost_plot import render_png

            picture = options.json.with_name("bench_cost.png")
            if render_png(cost, picture):
                print(f"bench: wrote {picture}")
    if failed:
        print(f"bench: {', '.join(failed)} could not be measured (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
