"""What a parity check costs as the model and the world grow, against the training it checks
(issue 40: the cost must grow like training's, not faster).

One FSDP2 fp32 configuration (``reshard_after_forward=True``, SGD with momentum, ``STEPS`` steps,
gloo ranks) of a Hugging Face ``LlamaForCausalLM`` (``cost_workloads.py``: 1M to 300M parameters),
and the row of a user's own ``parallelize`` function, each against two plain runs of the same
steps measured in the same run (``cost_sides.py``, each side a fresh process):

* **single**: one process training the whole batch (every rank's batch at each step): what the
  steps cost a user on one device, what a check is held to;
* **plain**: the same ranks training DDP then FSDP2 (or the user's function) with nothing of the
  tool: what running the reference's and the candidate's training costs by itself;
* **floor** (built-in rows): the same, but the twin's part is each rank's forward, backward and
  step on the bare model, nothing broadcast or reduced: what no check on these ranks can go
  below, so a time ratio is read against the floor's own (on 2 cores the candidate's gloo
  collectives alone can put the floor near 2x one process).

The model-size curve runs at 2 ranks over ``sizes``; the world-size curve runs the first size over
``world_sizes``. Each row also keeps every process's warm and peak resident memory, which the
profile table splits into what torch and the libraries hold, what the training holds and what the
check holds beyond it. Ratios are information, never a verdict.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from ci.bench.cost_sides import SIDE_TIMEOUT_S
from ci.bench.cost_workloads import DEFAULT_SIZES, STEPS

DEFAULT_WORLD_SIZES = (2, 4, 8)
_GB = 1024**3


def _side(side: str, size: str, world_size: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "ci.bench.cost_sides", side, size, str(world_size)],
        capture_output=True,
        text=True,
        timeout=SIDE_TIMEOUT_S,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        return {"side": side, "size": size, "error": f"exit {done.returncode}: {tail}"}
    return json.loads(lines[-1])


def _measured(side: dict[str, Any]) -> bool:
    return "error" not in side and side.get("status") == "pass"


def row(size: str, world_size: int, function: bool) -> dict[str, Any]:
    """The sides of one row (the floor for a built-in row) and the ratios tool / plain and tool /
    single (time, memory), where the single, plain and tool sides were measured; the floor's time
    over the single side's where it was too."""
    suffix = "_fn" if function else ""
    names = ("single", "plain", "tool") if function else ("single", "floor", "plain", "tool")
    sides = {name: _side(name + suffix, size, world_size) for name in names}
    found: dict[str, Any] = {"size": size, "world_size": world_size, "steps": STEPS, "function": function}
    found.update(sides)
    return ratios(found)


def ratios(found: dict[str, Any]) -> dict[str, Any]:
    """``found`` (a row's sides) with its ratios, where the sides they divide were measured."""
    if all(_measured(found[name]) for name in ("single", "plain", "tool")):
        tool = found["tool"]
        for against, prefix in (("plain", ""), ("single", "single_")):
            found[prefix + "time_ratio"] = tool["wall_s"] / found[against]["wall_s"]
            found[prefix + "memory_ratio"] = tool["peak_bytes"] / found[against]["peak_bytes"]
        if "floor" in found and _measured(found["floor"]):
            found["floor_time_ratio"] = found["floor"]["wall_s"] / found["single"]["wall_s"]
    return found


def measure(
    sizes: tuple[str, ...] = DEFAULT_SIZES, world_sizes: tuple[int, ...] = DEFAULT_WORLD_SIZES
) -> dict[str, Any]:
    """Every row: the built-in FSDP2 row at 2 ranks for each of ``sizes``, then the first size at
    each other of ``world_sizes``, then a user's function's row at 2 ranks for each size."""
    plan = [(size, 2, False) for size in sizes]
    plan += [(sizes[0], ws, False) for ws in world_sizes if ws != 2]
    plan += [(size, 2, True) for size in sizes]
    return {
        "model": "HF LlamaForCausalLM",
        "configuration": "fsdp2 fp32, gloo ranks",
        "rows": [row(size, ws, function) for size, ws, function in plan],
    }


def _figures(found: dict[str, Any]) -> str:
    single, plain, tool = found["single"], found["plain"], found["tool"]
    measured = "floor_time_ratio" in found
    floor_s = f"{found['floor']['wall_s']:8.1f}" if measured else f"{'-':>8}"
    floor = f"{found['floor_time_ratio']:6.1f}x" if measured else f"{'-':>7}"
    return (
        f"{single['wall_s']:8.1f} {floor_s} {plain['wall_s']:8.1f} {tool['wall_s']:8.1f} "
        f"{found['single_time_ratio']:6.1f}x {floor} {found['time_ratio']:6.1f}x "
        f"{single['peak_bytes'] / _GB:7.2f} {plain['peak_bytes'] / _GB:7.2f} {tool['peak_bytes'] / _GB:7.2f} "
        f"{found['single_memory_ratio']:6.1f}x {found['memory_ratio']:6.1f}x  {tool['status']}"
    )


def render(m: dict[str, Any]) -> str:
    """The curve as a table (a side that failed shows its error), then the per-process profile."""
    lines = [
        f"cost curve: {m['model']}, one {m['configuration']} configuration, {STEPS} steps, against one",
        "process training the whole batch (single) and the same training on the same ranks (plain);",
        "floor: the candidate's training and its twin's own arithmetic, nothing exchanged for the twin",
        "(no check on these ranks takes less); (floor): its time over single's",
        "-" * 125,
        f"{'size':>5} {'ranks':>5}  {'single s':>8} {'floor s':>8} {'plain s':>8} {'tool s':>8} {'x single':>7} {'(floor)':>7} {'x plain':>7} "
        f"{'single GB':>7} {'plain GB':>7} {'tool GB':>7} {'x single':>7} {'x plain':>7}  tool",
    ]
    for found in m["rows"]:
        if found.get("function") and not any(r.get("function") for r in m["rows"][: m["rows"].index(found)]):
            lines.append(
                "a user's parallelize function (AC + fully_shard per layer, bf16/fp32 reduce, AdamW):"
            )
        where = f"{found['size']:>5} {found.get('world_size', 2):>5}"
        if "single_time_ratio" not in found:
            broken = next(
                found[name]
                for name in ("single", "plain", "tool")
                if name in found and not _measured(found[name])
            )  # a floor side that failed leaves its column empty, the row measured
            why = broken.get("error") or f"{broken['status']}: {broken.get('detail', '')}"
            lines.append(f"{where}  not measured: the {broken['side']} side {why}")
            continue
        lines.append(f"{where}  {_figures(found)}")
    lines.append("memory: every process's peak resident set, summed; time: warm pool, its start excluded")
    lines += profile(m)
    return "\n".join(lines)


def profile(m: dict[str, Any]) -> list[str]:
    """Per process of the largest measured built-in row at 2 ranks and of the one at the most
    ranks: what torch and the libraries hold (warm), what the training adds (plain peak - warm)
    and what the check adds beyond it (tool peak - plain peak), in GB."""
    built_in = [r for r in m["rows"] if not r.get("function") and "single_time_ratio" in r]
    if not built_in:
        return []
    at_two = [r for r in built_in if r.get("world_size", 2) == 2]
    chosen = [at_two[-1]] if at_two else []
    widest = max(built_in, key=lambda r: r.get("world_size", 2))
    if widest.get("world_size", 2) > 2:
        chosen.append(widest)
    lines = ["", "where the memory goes, per process (GB): torch and libraries | training | the check's own"]
    for found in chosen:
        plain, tool = found["plain"].get("processes", []), found["tool"].get("processes", [])
        lines.append(
            f"  {found['size']} at {found.get('world_size', 2)} ranks (one process alone: "
            f"{found['single']['peak_bytes'] / _GB:.2f} peak)"
        )
        for p, t in zip(plain, tool, strict=False):
            warm = t.get("warm_bytes", 0)
            lines.append(
                f"    {t['process']:>10}: {warm / _GB:5.2f} | {(p['peak_bytes'] - p.get('warm_bytes', 0)) / _GB:5.2f}"
                f" | {(t['peak_bytes'] - p['peak_bytes']) / _GB:+5.2f}   peak {t['peak_bytes'] / _GB:5.2f}"
            )
    return lines
