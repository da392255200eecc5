"""``parity.png``: loss curves and scale trajectories of every candidate against its reference.

One column per panel group (FSDP vs DDP in fp32, fp16 and bf16, then the forced-inf, sparse and
CPU-offload suites); the top row is rank 0's loss, the bottom row the loss scale (log2) after each
step. The reference is drawn thick and dashed in black; candidates thin, in red when they broke
their tolerance. Lines of a passing candidate lie on top of the reference, so what stands out is
exactly what diverged. Needs matplotlib (``pip install shardscale[report]``).
"""

from __future__ import annotations

import math
from pathlib import Path

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


def render_png(results: list[ParityResult], path: str | Path) -> bool:
    """Write the figure to ``path``; False (and nothing written) when no configuration ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _panels(results)
    if not panels:
        return False
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 6.5), squeeze=False)
    for column, (title, rows) in enumerate(panels):
        loss_ax, scale_ax = axes[0][column], axes[1][column]
        broken = sum(1 for r in rows if r.broken)
        loss_ax.set_title(f"{title}\n{len(rows)} runs, {broken} broken", fontsize=9)
        drawn_references: set[tuple[object, ...]] = set()
        for r in sorted(rows, key=lambda r: r.broken):  # broken ones last, on top
            colour = "tab:red" if r.broken else "tab:blue"
            for role in ("candidate", "reference"):
                curves = r.curves[role]
                if role == "reference":
                    key = r.config.reference_key()
                    if key in drawn_references:
                        continue
                    drawn_references.add(key)
                style = {"color": "black", "linestyle": "--", "linewidth": 1.8, "alpha": 0.6}
                if role == "candidate":
                    style = {"color": colour, "linewidth": 0.8, "alpha": 0.5}
                steps = range(len(curves.loss))
                losses = [
                    loss[0] if math.isfinite(loss[0]) and loss[0] > 0 else math.nan for loss in curves.loss
                ]
                loss_ax.plot(steps, losses, **style)
                scales = [math.log2(s) if s > 0 and math.isfinite(s) else math.nan for s in curves.scale]
                scale_ax.step(steps, scales, where="post", **style)
        loss_ax.set_ylabel("loss (rank 0)", fontsize=8)
        loss_ax.set_yscale("log")
        scale_ax.set_ylabel("log2 scale after update", fontsize=8)
        scale_ax.set_xlabel("step", fontsize=8)
        for ax in (loss_ax, scale_ax):
            ax.tick_params(labelsize=7)
    fig.suptitle(
        "shardscale parity: reference (black, dashed) vs candidates (blue; red = broke its tolerance)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
