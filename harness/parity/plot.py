"""``parity.png``: loss curves and scale trajectories of every candidate against its reference.

One panel per group (FSDP vs DDP in fp32, fp16 and bf16, then the forced-inf, sparse and
CPU-offload suites), three to a row; each panel is rank 0's loss over the steps that were not
skipped (symlog: sparse losses can be negative), above the loss scale (log2) after each step with
the skipped steps marked. The reference is drawn thick and dashed in black; candidates thin, in red when they broke
their tolerance. Lines of a passing candidate lie on top of the reference, so what stands out is
exactly what diverged. Needs matplotlib (``pip install shardscale[report]``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from harness.parity.result import ParityResult


def _panels(results: list[ParityResult]) -> list[tuple[str, list[ParityResult]]]:
    ran = [r for r in results if r.curves]
    panels = []
    for precision in ("fp32", "fp16", "bf16"):
        rows = [r for r in ran if r.config.suite == "fsdp_vs_ddp" and r.config.precision == precision]
        if rows:
            panels.append((f"FSDP vs DDP, {precision}", rows))
    for suite, title in (
        ("forced_inf", "forced inf/NaN"),
        ("sparse", "sparse"),
        ("cpu_offload", "CPU offload"),
    ):
        rows = [r for r in ran if r.config.suite == suite]
        if rows:
            panels.append((title, rows))
    return panels


def _draw(loss_ax: Any, scale_ax: Any, title: str, rows: list[ParityResult]) -> None:
    broken = sum(1 for r in rows if r.broken)
    loss_ax.set_title(f"{title}: {len(rows)} runs, {broken} broken", fontsize=9)
    drawn_references: set[tuple[object, ...]] = set()
    for r in sorted(rows, key=lambda r: r.broken):  # broken ones last, on top
        for role in ("candidate", "reference"):
            if role == "reference":
                key = r.config.reference_key()
                if key in drawn_references:
                    continue
                drawn_references.add(key)
                style = {"color": "black", "linestyle": "--", "linewidth": 1.8, "alpha": 0.6}
            else:
                style = {"color": "tab:red" if r.broken else "tab:blue", "linewidth": 0.8, "alpha": 0.5}
            curves = r.curves[role]
            steps = range(len(curves.loss))
            # A skipped step's loss (often huge: it overflowed) would flatten the trained ones.
            losses = [
                math.nan if skipped or not math.isfinite(loss[0]) else loss[0]
                for loss, skipped in zip(curves.loss, curves.skipped, strict=True)
            ]
            loss_ax.plot(steps, losses, marker=".", markersize=3, **style)
            scales = [math.log2(s) if s > 0 and math.isfinite(s) else math.nan for s in curves.scale]
            scale_ax.step(steps, scales, where="post", **style)
            skipped_steps = [i for i, skipped in enumerate(curves.skipped) if skipped]
            scale_ax.plot(
                skipped_steps, [scales[i] for i in skipped_steps], "x", color=style["color"], markersize=4
            )
    loss_ax.set_yscale("symlog", linthresh=1e-3)
    loss_ax.set_ylabel("loss, rank 0", fontsize=8)
    scale_ax.set_ylabel("log2 scale (x: skipped)", fontsize=8)
    scale_ax.set_xlabel("step", fontsize=8)
    for ax in (loss_ax, scale_ax):
        ax.tick_params(labelsize=7)


def render_png(results: list[ParityResult], path: str | Path, *, columns: int = 3) -> bool:
    """Write the figure to ``path``; False (and nothing written) when no configuration ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _panels(results)
    if not panels:
        return False
    columns = min(columns, len(panels))
    groups = -(-len(panels) // columns)
    fig, axes = plt.subplots(2 * groups, columns, figsize=(4.6 * columns, 4.4 * groups), squeeze=False)
    for index, (title, rows) in enumerate(panels):
        row, column = divmod(index, columns)
        _draw(axes[2 * row][column], axes[2 * row + 1][column], title, rows)
    for index in range(len(panels), groups * columns):
        row, column = divmod(index, columns)
        axes[2 * row][column].axis("off")
        axes[2 * row + 1][column].axis("off")
    fig.suptitle(
        "shardscale parity: reference (black, dashed) vs candidates (blue; red = broke its tolerance)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
