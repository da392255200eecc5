"""The cost curve as a picture (``make bench`` writes ``bench_cost.png`` beside ``bench.json``).

Why a picture: the question the curve answers is whether a check's cost grows like training's as
the model and the world grow, and lines of ratios against plain runs show at a glance whether they
stay flat or climb. Top: against model size at 2 ranks; bottom: against the number of ranks. Left
time, right peak memory (every process summed). Each panel has a line for the check against one
process training the whole batch (``x single``: what a user compares with) and one against
the same training on the same ranks without the tool (``x plain``); the top panels also draw a
user's own ``parallelize`` function's row, and the time panels the floor over one process (the
candidate's training and its twin's arithmetic, nothing exchanged: no check on these ranks takes
less). The plain run is the dashed 1x; a row whose side failed
is left out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_LINES = {
    (False, "single_"): "built-in FSDP2 row vs one process",
    (False, ""): "built-in FSDP2 row vs the same ranks without the tool",
    (True, "single_"): "your parallelize function's row vs one process",
    (True, ""): "your parallelize function's row vs the same ranks without the tool",
    (False, "floor_"): "the floor vs one process: no check on these ranks takes less",
}
_COLOURS = {
    (False, "single_"): "tab:blue",
    (False, ""): "tab:orange",
    (False, "floor_"): "tab:green",
    (True, "single_"): "tab:red",
    (True, ""): "tab:purple",
}
"""One colour per line in every panel (the floor has no memory panel line to shift the others)."""


def series(measured: dict[str, Any], along: str = "size") -> dict[tuple[bool, str], dict[str, list[Any]]]:
    """``{(function?, "single_" or ""): {"at": [...], "time": [...], "memory": [...]}}`` of the rows
    where every side was measured, ``along`` model size (the rows at 2 ranks) or ``world_size``
    (the built-in rows of the first size)."""
    rows = [r for r in measured.get("rows", []) if "time_ratio" in r]
    if along == "size":
        rows = [r for r in rows if r.get("world_size", 2) == 2]
    else:
        first = next((r["size"] for r in rows), None)
        rows = sorted(
            (r for r in rows if not r.get("function") and r["size"] == first),
            key=lambda r: r.get("world_size", 2),
        )
    out: dict[tuple[bool, str], dict[str, list[Any]]] = {}
    for found in rows:
        for prefix in ("single_", "", "floor_"):
            if prefix + "time_ratio" not in found:
                continue
            line = out.setdefault((bool(found.get("function")), prefix), {"at": [], "time": [], "memory": []})
            line["at"].append(found["size"] if along == "size" else found.get("world_size", 2))
            line["time"].append(found[prefix + "time_ratio"])
            if prefix + "memory_ratio" in found:  # the floor is a time: its memory is the plain run's
                line["memory"].append(found[prefix + "memory_ratio"])
    return out


def _panel(
    axis: Any, lines: dict[tuple[bool, str], dict[str, list[Any]]], key: str, title: str, xlabel: str
) -> None:
    ticks = list(dict.fromkeys(at for line in lines.values() for at in line["at"]))
    for name, line in sorted(
        lines.items(), key=lambda item: (item[0][0], item[0][1] != "single_", item[0][1])
    ):
        if not line[key]:
            continue
        xs = [ticks.index(at) for at in line["at"]]
        style = {"single_": "-", "": ":", "floor_": "--"}[name[1]]
        axis.plot(xs, line[key], marker="o", linestyle=style, color=_COLOURS[name], label=_LINES[name])
        for x, y in zip(xs, line[key], strict=True):
            axis.annotate(
                f"{y:.1f}x", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8
            )
    axis.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axis.set_xticks(range(len(ticks)), [str(t) for t in ticks])
    axis.set_xlabel(xlabel)
    axis.set_ylabel("check / plain run")
    axis.set_title(title)
    axis.set_ylim(bottom=0)


def render_png(measured: dict[str, Any], path: Path) -> bool:
    """Draw the cost part of a ``bench.json`` into ``path``; False when nothing was measured."""
    by_size, by_world = series(measured, "size"), series(measured, "world_size")
    if not by_size and not by_world:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(by_size, "parameters (HF Llama), 2 ranks")] if by_size else []
    if len({at for line in by_world.values() for at in line["at"]}) > 1:
        first = next(r["size"] for r in measured["rows"] if "time_ratio" in r)
        panels.append((by_world, f"ranks (gloo), {first} parameters"))
    figure, axes = plt.subplots(len(panels), 2, figsize=(11, 4.2 * len(panels)), squeeze=False)
    for (lines, xlabel), row in zip(panels, axes, strict=True):
        _panel(row[0], lines, "time", "wall time", xlabel)
        _panel(row[1], lines, "memory", "peak memory, all processes", xlabel)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    figure.suptitle(
        f"what a check costs against the run it checks ({measured['rows'][0]['steps']} steps), measured in the same run"
    )
    figure.tight_layout(rect=(0, 0.11 / len(panels), 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
