"""The cost curve as a picture (``make bench`` writes ``bench_cost.png`` beside ``bench.json``).

Why a picture: the question the curve answers is whether a check's cost grows like training's as
the model grows, and two lines (time, memory) of ratios against a plain run, per kind of row, show
at a glance whether they stay flat or climb. Each panel draws the ratio tool / plain at each
measured size, one line for the built-in FSDP2 row and one for a user's own ``parallelize``
function's row, with the plain run at 1x as the floor; a size whose side failed is left out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_KINDS = {
    False: "built-in FSDP2 row vs plain DDP + FSDP2 loops",
    True: "your parallelize function's row vs a plain run of it",
}


def series(measured: dict[str, Any]) -> dict[bool, dict[str, list[Any]]]:
    """``{function?: {"sizes": [...], "time": [...], "memory": [...]}}`` from the cost part's rows
    (only the rows where both sides were measured)."""
    out: dict[bool, dict[str, list[Any]]] = {}
    for row in measured.get("rows", []):
        if "time_ratio" not in row:
            continue
        found = out.setdefault(bool(row.get("function")), {"sizes": [], "time": [], "memory": []})
        found["sizes"].append(row["size"])
        found["time"].append(row["time_ratio"])
        found["memory"].append(row["memory_ratio"])
    return out


def render_png(measured: dict[str, Any], path: Path) -> bool:
    """Draw the cost part of a ``bench.json`` into ``path``; False when nothing was measured."""
    lines = series(measured)
    if not lines:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys(size for found in lines.values() for size in found["sizes"]))
    figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    for axis, key, title in (
        (axes[0], "time", "wall time"),
        (axes[1], "memory", "peak memory, all processes"),
    ):
        for function, found in sorted(lines.items()):
            xs = [sizes.index(size) for size in found["sizes"]]
            axis.plot(xs, found[key], marker="o", label=_KINDS[function])
            for x, y in zip(xs, found[key], strict=True):  # the higher point's label above, else below
                others = [
                    o[key][o["sizes"].index(sizes[x])]
                    for f, o in lines.items()
                    if f != function and sizes[x] in o["sizes"]
                ]
                offset = (0, 7) if all(y >= other for other in others) else (0, -14)
                axis.annotate(f"{y:.1f}x", (x, y), textcoords="offset points", xytext=offset, ha="center")
        axis.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        axis.set_xticks(range(len(sizes)), sizes)
        axis.set_xlabel("parameters (HF Llama)")
        axis.set_ylabel("check / plain run")
        axis.set_title(title)
        axis.set_ylim(bottom=0)
    axes[0].legend(loc="lower left", fontsize=8)
    ranks = str(measured.get("configuration", "")).rpartition(", ")[2]
    figure.suptitle(
        f"what a check costs against the run it checks ({ranks}, 6 steps), measured in the same run"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
