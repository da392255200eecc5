"""``parity.png``: how far each candidate is from its reference, not curves on top of each other.

Why distance: in a parity run the candidates' loss curves lie exactly on their references', so a
picture of curves shows nothing, least of all what diverged. This one shows:

* **the heatmap** (left): one row per configuration that ran (grouped by suite, failing rows
  labelled in red), one column per step, coloured by the largest distance in ULPs of anything
  compared at that step (white: bitwise; darker: farther, on a log scale); a failing check
  marks its cell with a red ``x``;
* **per failing configuration** (right, the first few): its error per step (largest relative
  error, log scale) against the profile's tolerance, and the error of each module at the
  localized step in execution order (forward outputs, then output gradients), the first module
  that left the tolerance in red and named;
* **the loss scale** where it says something: the distinct scale trajectories of configurations
  that skipped steps (each drawn once, with how many configurations share it; ``x`` marks a
  skipped step; a candidate that left its reference's trajectory in red).

Needs matplotlib (``pip install shardscale[report]``).
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

from harness.parity.judge.result import ParityResult
from harness.parity.plan import profiles
from harness.parity.plan.config import SUITES
from harness.parity.report import spread
from harness.parity.report.render import splits

MAX_DETAILED = 4
"""Failing configurations drawn in detail (the heatmap shows them all)."""
_FLOOR = 1e-12
"""Where zero errors sit on log axes."""


def _ran(results: list[ParityResult]) -> list[ParityResult]:
    rows = [r for r in results if r.distances]
    return sorted(rows, key=lambda r: SUITES.index(r.config.suite))


LABELLED_ALL = 60
"""Up to this many rows the heatmap names every one; past it, only those it shows something of."""


def labelled_rows(rows: list[ParityResult]) -> list[int]:
    """The heatmap's rows that carry their configuration's id: every one of a small matrix; of a
    larger one, those broken or not bitwise at some step. Why: the others are white rows, and 213
    ids at 3.5 points were unreadable and two thirds of the figure's drawing time (2 s)."""
    if len(rows) <= LABELLED_ALL:
        return list(range(len(rows)))
    return [i for i, r in enumerate(rows) if r.broken or any(d.max_ulp > 0 for d in r.distances)]


def _heatmap(ax: Any, rows: list[ParityResult]) -> Any:
    import numpy as np

    steps = max(len(r.distances) for r in rows)
    grid = np.full((len(rows), steps), np.nan)
    for i, r in enumerate(rows):
        for d in r.distances:
            grid[i, d.step] = math.log2(d.max_ulp + 1) if math.isfinite(d.max_ulp) else 64.0
    cmap = _colormap()
    # 0 (bitwise) lies under vmin and is drawn white; 1 ulp is log2(2) = 1.
    image = ax.imshow(
        grid,
        aspect="auto",
        cmap=cmap,
        vmin=0.5,
        vmax=max(8.0, float(np.nanmax(grid))),
        interpolation="nearest",
    )
    for i, r in enumerate(rows):
        for d in r.distances:
            if d.failed:
                ax.plot(d.step, i, "x", color="red", markersize=4, markeredgewidth=1.2)
    labelled = labelled_rows(rows)
    ax.set_yticks(labelled)
    ax.set_yticklabels(
        [rows[i].config.id for i in labelled], fontsize=3.5 if len(labelled) > LABELLED_ALL else 6
    )
    for tick, i in zip(ax.get_yticklabels(), labelled, strict=True):
        if rows[i].broken:
            tick.set_color("red")
            tick.set_fontweight("bold")
    if len(labelled) < len(rows):
        ax.set_ylabel(
            f"{len(rows)} configurations in parity.md's order; named: the {len(labelled)} not bitwise at some step",
            fontsize=7,
        )
    ax.set_xticks(range(steps))
    ax.set_xlabel("step", fontsize=8)
    ax.xaxis.set_ticks_position("top")
    ax.xaxis.set_label_position("top")
    _suite_labels(ax, rows, steps)
    return image


def _suite_labels(ax: Any, rows: list[ParityResult], steps: int) -> None:
    """Group separators, and each suite's name upright beside its band (never into the colour
    bar), moved just clear of its neighbours' where the band is shorter than the name
    (``spread``): it then starts at its band's edge, the separators show which band it names."""
    bands, start = [], 0
    for suite in SUITES:
        count = sum(1 for r in rows if r.config.suite == suite)
        if count:
            if start:
                ax.axhline(start - 0.5, color="black", linewidth=0.8)
            bands.append((suite, start + count / 2 - 0.5))
            start += count
    figure = ax.get_figure()
    points_per_row = ax.get_position().height * figure.get_figheight() * 72 / max(len(rows), 1)
    extents = [(len(suite) * 0.6 * 6 + 4) / points_per_row for suite, _ in bands]  # 6-point text
    placed = spread.spread([c for _, c in bands], extents, -0.5, len(rows) - 0.5)
    for (suite, _), at in zip(bands, placed, strict=True):
        ax.text(steps - 0.45, at, suite, va="center", ha="left", rotation=90, fontsize=6)


def _colormap() -> Any:
    import matplotlib

    # grey: a step the configuration did not record; white: bitwise (under the scale's minimum)
    return matplotlib.colormaps["magma_r"].with_extremes(bad="#dddddd", under="white")


def _error_per_step(ax: Any, r: ParityResult) -> None:
    steps = [d.step for d in r.distances]
    errors = [max(d.max_rel, _FLOOR) if math.isfinite(d.max_rel) else 1e3 for d in r.distances]
    ax.plot(steps, errors, color="black", linewidth=1, marker=".")
    failed = [(d.step, e) for d, e in zip(r.distances, errors, strict=True) if d.failed]
    ax.plot(
        [s for s, _ in failed], [e for _, e in failed], "o", color="red", markersize=5, label="check failed"
    )
    profile = profiles.get(r.profile)
    if profile.rtol > 0:
        ax.axhline(
            profile.rtol, color="tab:blue", linestyle="--", linewidth=1, label=f"rtol {profile.rtol:g}"
        )
    else:
        ax.text(
            0.02,
            0.95,
            "profile exact: any difference fails",
            transform=ax.transAxes,
            fontsize=6,
            va="top",
            color="tab:blue",
        )
    ax.set_yscale("log")
    ax.set_ylim(_FLOOR / 2, max(10.0, max(errors) * 2))
    ax.set_xlabel("step", fontsize=7)
    ax.set_ylabel("max rel error", fontsize=7)
    ax.set_title(panel_title(r), fontsize=7, color="red")
    ax.legend(fontsize=6, loc="lower right")


def panel_title(r: ParityResult) -> str:
    """A broken row's panel title: its id, and on a second line the known causes that matched, so
    the figure alone says whether a red row is rounding (``reduce_order``) or a sharding mistake."""
    expected = " (expected)" if r.expected_failure else ""
    if not r.causes:
        return r.config.id + expected
    return f"{r.config.id}{expected}\nknown cause: {', '.join(cause.name for cause in r.causes)}"


def _modules(ax: Any, r: ParityResult) -> None:
    found = r.localization
    if found is None or found.error or not found.modules:
        ax.axis("off")
        ax.text(
            0.5,
            0.5,
            found.describe() if found else "not localized",
            ha="center",
            va="center",
            fontsize=6,
            wrap=True,
        )
        return
    along = found.along()
    values = [max(m.max_rel, _FLOOR) if math.isfinite(m.max_rel) else 1e3 for m in along]
    colours = ["tab:blue" if m.phase == "forward" else "tab:orange" for m in along]
    if found.first is not None:
        index = along.index(found.first)
        colours[index] = "red"
        ax.annotate(
            f"{found.first.display_name} ({found.first.phase})",
            (index, values[index]),
            xytext=(0, 6),
            textcoords="offset points",
            fontsize=6,
            color="red",
            ha="center",
        )
    ax.bar(range(len(along)), values, color=colours, width=0.8)
    ax.set_yscale("log")
    ax.set_ylim(_FLOOR / 2, max(10.0, max(values) * 4))
    labels = [f"{m.display_name}{'' if m.phase == 'forward' else ' (grad)'}" for m in along]
    ax.set_xticks(range(len(along)))
    ax.set_xticklabels(labels, rotation=90, fontsize=4 if len(along) > 30 else 5)
    rank = along[0].rank if along else 0
    ax.set_title(f"step {found.step}, rank {rank}: per module (blue forward, orange backward)", fontsize=7)
    ax.set_ylabel("max rel error", fontsize=7)


def _scale_trajectories(ax: Any, rows: list[ParityResult]) -> None:
    trajectories: dict[tuple[Any, ...], list[ParityResult]] = {}
    broken = []
    for r in rows:
        candidate, reference = r.curves.get("candidate"), r.curves.get("reference")
        if candidate is None or not any(candidate.skipped):
            continue
        if reference is not None and (candidate.scale, candidate.skipped) != (
            reference.scale,
            reference.skipped,
        ):
            broken.append(r)
            continue
        trajectories.setdefault((candidate.scale, candidate.skipped), []).append(r)
    if not trajectories and not broken:
        ax.axis("off")
        ax.text(0.5, 0.5, "no configuration skipped a step", ha="center", va="center", fontsize=7)
        return
    for index, ((scale, skipped), members) in enumerate(trajectories.items()):
        colour = _PALETTE[index % len(_PALETTE)]
        _scale_line(ax, scale, skipped, color=colour, label=f"{len(members)} x {members[0].config.suite}")
    for r in broken[:MAX_DETAILED]:
        reference, candidate = r.curves["reference"], r.curves["candidate"]
        _scale_line(
            ax,
            reference.scale,
            reference.skipped,
            color="black",
            label=f"{r.config.id}: reference",
            dashed=True,
        )
        _scale_line(
            ax, candidate.scale, candidate.skipped, color="red", label=f"{r.config.id}: candidate (broken)"
        )
    ax.set_xlabel("step", fontsize=7)
    ax.set_ylabel("log2 scale (x: skipped)", fontsize=7)
    ax.set_title(
        "loss scale of configurations that skipped steps (identical trajectories drawn once)", fontsize=7
    )
    ax.legend(fontsize=5, loc="best")


_PALETTE = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
)
"""Trajectories that held their reference: no red, which marks the broken."""


def _scale_line(
    ax: Any,
    scale: tuple[float, ...],
    skipped: tuple[bool, ...],
    *,
    color: Any,
    label: str,
    dashed: bool = False,
) -> None:
    values = [math.log2(s) if s > 0 and math.isfinite(s) else math.nan for s in scale]
    (line,) = ax.step(
        range(len(values)),
        values,
        where="post",
        linewidth=1.2,
        color=color,
        label=label,
        linestyle="--" if dashed else "-",
    )
    marks = [i for i, flag in enumerate(skipped) if flag]
    ax.plot(marks, [values[i] for i in marks], "x", color=line.get_color(), markersize=5)


def _drift(ax: Any, rows: list[ParityResult]) -> None:
    """Rows the staged check decided, with ``--drift``: each one's straight-through drift (solid)
    beside the drift of its reference against itself summing in another order (dashed). A solid
    line on or under its dashed twin is drift of the ordinary kind."""
    for colour, r in zip(_PALETTE, rows, strict=False):
        own = [math.log2(d.max_ulp + 1) if math.isfinite(d.max_ulp) else math.nan for d in r.distances]
        alone = [math.log2(u + 1) if math.isfinite(u) else math.nan for u in r.staged.reordering_drift]  # type: ignore[union-attr]
        ax.plot(range(len(own)), own, color=colour, linewidth=1.2, marker=".", label=f"{r.config.id}")
        ax.plot(range(len(alone)), alone, color=colour, linewidth=1, linestyle="--")
    ax.set_xlabel("step", fontsize=7)
    ax.set_ylabel("log2(ulp distance + 1)", fontsize=7)
    ax.set_title(
        "decided by the staged check: straight-through drift (solid) vs the reference against itself "
        "summing in another order (dashed)",
        fontsize=7,
    )
    ax.legend(fontsize=5, loc="upper left")


def ground_truth_line(results: list[ParityResult]) -> str:
    """The ground truth under the title (``--ground-truth``): the heatmap compares every row with a
    twin that splits the data as it does, so a split unlike the whole batch shows only here."""
    found = splits(results)
    if not found:
        return ""
    failed = [v for v in found if v.status == "fail"]
    if not failed:
        return f"\nground truth: {len(found)} split(s), each trains like the whole batch (float64)"
    named = ", ".join(
        f"{v.name} at step {v.step} ({v.cause.name if v.cause else 'no known cause'})" for v in failed[:3]
    )
    return f"\nground truth: {len(failed)} of {len(found)} split(s) train UNLIKE the whole batch: {named}"


def import_in_background() -> None:
    """Import matplotlib (its Agg backend) on a daemon thread while the rows run: the controller
    mostly waits on its ranks then, and the figure at the end starts drawing at once (the import
    is a second of a ``make parity``). Nothing is drawn here; a failed import is met again, and
    said, when the figure is written."""

    def load() -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401 - imported for later
        except Exception:  # noqa: BLE001 - render_png's own import reports it
            return

    threading.Thread(target=load, name="parity-plot-import", daemon=True).start()


def render_png(results: list[ParityResult], path: str | Path) -> bool:
    """Write the figure to ``path``; False (and nothing written) when no configuration ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _ran(results)
    if not rows:
        return False
    failing = [r for r in rows if r.broken and r.distances][:MAX_DETAILED]
    drifted = [r for r in rows if r.staged is not None and r.staged.reordering_drift and not r.broken]
    detail_rows = 1 + len(failing) + (1 if drifted else 0)
    height = max(6.0, 1.5 + 0.07 * len(rows), 2.6 * detail_rows)
    fig = plt.figure(figsize=(15, height))
    grid = fig.add_gridspec(detail_rows, 3, width_ratios=[1.25, 1, 1.4], wspace=0.35, hspace=0.9)
    heat = fig.add_subplot(grid[:, 0])
    image = _heatmap(heat, rows)
    colorbar = fig.colorbar(image, ax=heat, fraction=0.04, pad=0.12)
    colorbar.set_label("log2(ulp distance + 1) at that step (white: bitwise)", fontsize=7)
    colorbar.ax.tick_params(labelsize=6)
    _scale_trajectories(fig.add_subplot(grid[0, 1:]), rows)
    for index, r in enumerate(failing, start=1):
        _error_per_step(fig.add_subplot(grid[index, 1]), r)
        _modules(fig.add_subplot(grid[index, 2]), r)
    if drifted:
        _drift(fig.add_subplot(grid[detail_rows - 1, 1:]), drifted[: len(_PALETTE)])
    broken = sum(1 for r in rows if r.broken)
    expected = sum(1 for r in rows if r.broken and r.expected_failure)
    known = f" ({expected} expected: known defects, each row's reason in parity.md)" if expected else ""
    fig.suptitle(
        f"shardscale parity: {len(rows)} configurations, {broken} broken{known} "
        "(heatmap: distance to the reference per step, red x = a check failed)" + ground_truth_line(results),
        fontsize=10,
        color="red" if any(v.status == "fail" for v in splits(results)) else "black",
        y=1.0 + (0.4 / height if splits(results) else 0.0),  # the second line clears the axes
    )
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return True
