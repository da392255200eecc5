"""``parity.md`` and the terminal's closing table (pure renderers: results in, text out).

Why apart from ``render.py`` (``parity.json``): the JSON is a versioned schema other tools read,
the Markdown a page people read; each changes for its own reasons. ``parity.md`` has one row per
configuration (grouped by suite), then the divergences of every broken configuration (with where
it began, the known causes named and those ruled out) and the reasons of the skipped ones.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from harness.parity.judge.result import ParityResult
from harness.parity.plan import profiles
from harness.parity.plan.config import SUITES, ParityConfig
from harness.parity.ranks.measure.distance import format_ulp
from harness.parity.ranks.sides.user.found import READ_FROM_TORCH
from harness.parity.report.render import label, splits, summary

_DETAIL_LINES = 30
"""How much of an error's or crash's full text parity.md shows (parity.json keeps all of it)."""
_SUITE_TITLES = {
    "fsdp_vs_ddp": "FSDP vs DDP",
    "forced_inf": "Forced-inf step skipping",
    "sparse": "Sparse-gradient unscaling",
    "cpu_offload": "CPU offload",
}


def _loop_words(config: ParityConfig) -> str:
    """The loop a row ran beyond the plain step, beside its optimizer: `` (unscale_clip 0.05, acc2
    synclast, ckpt)``; empty for a plain row."""
    words = []
    if config.loop.path != "plain":
        words.append(config.loop.path + ("" if config.loop.clip == 1.0 else f" {config.loop.clip:g}"))
    if config.loop.accumulate > 1:
        words.append(f"acc{config.loop.accumulate}" + (" synclast" if config.loop.sync == "last" else ""))
    if config.loop.checkpoint is not None:
        words.append("ckpt" if config.loop.checkpoint == "replay" else "ckpt without RNG replay")
    if config.compile.mode is not None:
        words.append(f"compiled {config.compile.mode}, {config.compile.backend}")
    return f" ({', '.join(words)})" if words else ""


def drift_line(result: ParityResult) -> str:
    """The straight-through drift of a staged row beside a reordering's alone (``--drift``)."""
    own = ", ".join(format_ulp(d.max_ulp) for d in result.distances)
    alone = ", ".join(format_ulp(u) for u in result.staged.reordering_drift)  # type: ignore[union-attr]
    return (
        f"drift by step, straight through (the largest distance of any tensor): this row {own}; "
        f"the reference against itself summing in another order {alone}"
    )


def compiled_lines(results: list[ParityResult], run: dict[str, Any]) -> list[str]:
    """The compiled rows' section: what compiling cost each side of each row, and where inductor's
    cache is (empty when no row compiled)."""
    rows = [r for r in results if r.config.compile.mode is not None and r.status != "skip"]
    if not rows:
        return []
    lines = [
        "",
        "## Compiled",
        "",
        "Both sides compiled the same modules with the same backend. What compiling cost each side: "
        "its first step's time beyond the median of its later steps, on its slowest rank (a reference "
        "shared with an earlier row, or graphs already compiled in the rank or read from inductor's "
        "cache, cost less)"
        + (f"; inductor's cache: `{run['compile_cache']}`" if run.get("compile_cache") else "")
        + ".",
        "",
    ]
    for r in rows:
        costs = ", ".join(f"{role} {seconds:.2f}s" for role, seconds in r.compile_s.items()) or "not measured"
        lines.append(f"- `{r.config.id}`: {costs}")
    return lines


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    return f"{value:.2g}" if math.isfinite(value) else str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _measured_cell(result: ParityResult) -> str:
    """What a pass measured, and for mixed precision the reference's own gap to float32:
    ``bitwise; bf16 vs fp32: loss rel 3e-03, params rel 1e-02``."""
    cells = [result.closeness] if result.closeness else []
    if result.expected_gap is not None:
        cells.append(f"{result.config.recipe_name} vs fp32: {result.expected_gap.describe()}")
    return "; ".join(cells) or "-"


def _first_cell(result: ParityResult) -> str:
    """The first diverging step, and its first diverging module when localized."""
    step = result.first_diverging_step
    if step is None:
        return "-"
    found = result.localization
    if found is None or found.error:
        return str(step)
    if found.first is None:
        return f"{step} (no module: after backward)"
    return f"{step} ({found.first.display_name}, {found.first.phase}, rank {found.first.rank})"


def _row(result: ParityResult) -> str:
    c = result.config
    sharding = c.layout.sharding or (
        "reshard" if c.layout.reshard_after_forward else "keep" if c.engine == "fsdp2" else "-"
    )
    if c.engine == "fsdp1":
        sharding += " orig" if c.layout.use_orig_params else " flat"
    worst = "-"
    if result.worst is not None:
        w = result.worst
        worst = (
            f"{w.kind} {w.name} @{w.step}: abs {_fmt(w.max_abs)}, rel {_fmt(w.max_rel)}, "
            f"{format_ulp(w.max_ulp)}"
        )
    ran = result.status not in ("skip", "error")
    cells = [
        f"`{c.id}`",
        c.engine,
        sharding,
        c.recipe_name,
        c.optimizer + _loop_words(c),
        "cpu" if c.layout.offload else "-",
        label(result),
        _measured_cell(result),
        result.profile,
        _fmt(result.max_loss_diff) if ran else "-",
        _first_cell(result),
        worst,
        ",".join(map(str, result.skipped_steps)) or "-",
        f"{result.time_s:.2f}s" if ran else "-",
    ]
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


_HEADER = (
    "| configuration | engine | sharding | recipe | optimizer | offload | status | measured | profile "
    "| max loss diff | first diverging step | worst tensor | skipped steps | time |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def your_parallelization(results: list[ParityResult]) -> list[str]:
    """A section per user function and mesh: what the engine read off the modules it returned
    (what the twin mirrored, what it dropped, what it refused), from the first row that ran it."""
    seen: dict[tuple[str, str], ParityResult] = {}
    for r in results:
        if r.config.engine == "user" and r.candidate:
            seen.setdefault((r.config.workload, r.config.mesh.words()), r)
    lines: list[str] = []
    for (_, mesh), r in seen.items():
        head, _, read = r.candidate.partition(READ_FROM_TORCH)
        lines += ["", f"## Your parallelization: {head.split(' on mesh ')[0]} on mesh `{mesh}`", ""]
        lines += [f"- {line}" for line in read.split("; ") if line]
        lines += [f"- the reference: {r.reference}"]
    return lines


_PER_WORKLOAD = (
    ("units", "FSDP units"),
    (
        "tp_plans",
        "Tensor-parallel plans (the reference computes each TP'd linear split as the plan splits it, so "
        "those modules are judged `exact` too)",
    ),
    (
        "pipelines",
        "Pipeline stages (each runs torch's schedule over its microbatches; the reference, the whole model, "
        "back-propagates them in the order the stages add them)",
    ),
)
"""``(run key, the line's words)`` of what a run says of each workload."""


def render_markdown(results: list[ParityResult], run: dict[str, Any]) -> str:
    """``parity.md``: run line, summary, one table per suite, divergences, skip reasons."""
    counts = summary(results)
    lines = [
        "# Parity report",
        "",
        f"{run.get('backend', '?')}, world size {run.get('world_size', '?')}, scaler {run.get('scaler', '?')}, "
        f"torch {run.get('torch', '?')}" + (f", filter `-k {run['filter']}`" if run.get("filter") else ""),
        "",
        ", ".join(f"{counts[k]} {k}" for k in ("pass", "fail", "crash", "error", "skip") if counts[k])
        + f" of {counts['total']}"
        + (f" (expected failures: {counts['expected_failures']})" if counts["expected_failures"] else ""),
        "",
        "Measured (passing configurations): "
        + (", ".join(f"{n} {k}" for k, n in counts["closeness"].items()) or "none")
        + ". `bitwise`: every value equal; `≤ N ulp`: at most N units in the last place apart; "
        "`staged`: not bitwise straight through, and every step held from a common state (local "
        "gradients bitwise, each reduced element within the order-free bound, the update bitwise); "
        "`toleranced`: farther apart, within the profile's rtol/atol.",
        "",
        "Profiles: "
        + "; ".join(f"`{n}` {p.describe()}" for n, p in profiles.PROFILES.items())
        + ". Every profile but `exact` is a fallback tolerance (clipping under FSDP; NCCL): a pass under it says how close, not that sharding changed nothing.",
    ]
    ran = Counter(r.config.recipe_name for r in results)
    lines += [
        "",
        "Recipes (how the precision is applied; each row's is in its `recipe` column): "
        + ", ".join(f"`{name}` {count}" for name, count in ran.items())
        + "."
        + "".join(
            f" `{name}` declares `{declared}`." for name, declared in (run.get("recipes") or {}).items()
        )
        + "".join(f" `{name}` trains with {loop}." for name, loop in (run.get("loops") or {}).items()),
    ]
    for key, title in _PER_WORKLOAD:  # what the run read off each workload, a line each
        if run.get(key):
            lines += [
                "",
                f"{title}: " + "; ".join(f"`{name}` {what}" for name, what in run[key].items()) + ".",
            ]
    lines += your_parallelization(results)
    for suite in SUITES:
        rows = [r for r in results if r.config.suite == suite]
        if rows:
            lines += ["", f"## {_SUITE_TITLES[suite]}", "", _HEADER, *(_row(r) for r in rows)]
    broken = [r for r in results if r.broken]
    if broken:
        lines += ["", "## Divergences", ""]
        for r in broken:
            expected = f" (expected: {r.expected_failure})" if r.expected_failure else ""
            lines.append(f"- `{r.config.id}` {label(r)}{expected}:")
            shown = [d.message for d in r.divergences[:5]] or [r.reason]
            lines.append(f"  - {shown[0]}")
            # Under the first divergence: where it starts, and what it likely means.
            if r.localization is not None:
                lines.append(f"    - {r.localization.describe()}")
            if r.staged is not None:
                lines.append(f"    - {r.staged.summary()}")
            lines += [f"    - {cause.describe()}" for cause in r.causes]
            lines += [f"    - {ruled.describe()}" for ruled in r.ruled_out]
            lines += [f"  - {message}" for message in shown[1:]]
            if len(r.divergences) > 5:
                lines.append(f"  - ... and {len(r.divergences) - 5} more")
            if r.detail:
                tail = r.detail.rstrip().splitlines()[-_DETAIL_LINES:]
                lines += ["", "  ```", *(f"  {line}" for line in tail), "  ```"]
    staged = [r for r in results if r.staged is not None and not r.broken]
    if staged:
        lines += [
            "",
            "## Decided by the staged check",
            "",
            "Not bitwise straight through (another order of summation, a norm summed otherwise); judged step by step from a common state instead. The straight-through "
            "distances in the table are the drift that leaves.",
            "",
        ]
        for r in staged:
            lines.append(f"- `{r.config.id}`: {r.staged.summary()}")  # type: ignore[union-attr]
            if r.staged.reordering_drift:  # type: ignore[union-attr]
                lines.append(f"  - {drift_line(r)}")
    lines += compiled_lines(results, run)
    lines += semantics_section(results)
    skipped = [r for r in results if r.status == "skip"]
    if skipped:
        lines += ["", "## Not run here", ""]
        reasons = Counter(r.reason for r in skipped)
        lines += [f"- {count} configuration(s): {reason}" for reason, count in reasons.items()]
    return "\n".join(lines) + "\n"


def semantics_section(results: list[ParityResult]) -> list[str]:
    """``--ground-truth``: does each split compute the whole batch's gradient (one line a split,
    its cause and what was ruled out under a failed one)."""
    found = splits(results)
    if not found:
        return []
    lines = [
        "",
        "## Semantics: the whole batch on one device (float64)",
        "",
        "Each step's gradient as the rows' setup splits the global batch (data-parallel ranks, "
        "microbatches, the loss's normalization, DDP's average), against the whole batch's, in "
        "float64 on one process: a difference past the bound is what the training means, never "
        "rounding. The verdicts above compare each row with a twin that splits the data the same "
        "way, so they cannot see this.",
        "",
    ]
    for verdict in found:
        split = f" ({verdict.split})" if verdict.split else ""
        lines.append(f"- `{verdict.name}`{split} **{verdict.status}**: {verdict.says()}")
        if verdict.cause is not None:
            lines.append(f"  - {verdict.cause.describe()}")
        lines += [f"  - {ruled.describe()}" for ruled in verdict.ruled_out]
    lines.append("")
    lines.append(f"Stage time: {sum(v.duration_s for v in found):.2f}s for {len(found)} split(s).")
    return lines


def render_summary(results: list[ParityResult]) -> str:
    """The terminal's closing table: one line per suite, then each broken configuration."""
    header = f"{'suite':<12} {'total':>5} {'pass':>5} {'fail':>5} {'crash':>5} {'error':>5} {'skip':>5} {'xfail':>5}"
    lines = [header, "-" * len(header)]
    for suite in SUITES:
        rows = [r for r in results if r.config.suite == suite]
        if not rows:
            continue
        c = summary(rows)
        lines.append(
            f"{suite:<12} {c['total']:>5} {c['pass']:>5} {c['fail']:>5} {c['crash']:>5} "
            f"{c['error']:>5} {c['skip']:>5} {c['expected_failures']:>5}"
        )
    for r in results:
        if r.broken:
            expected = " [expected]" if r.expected_failure else ""
            lines.append(f"{label(r)} {r.config.id}{expected}: {r.reason}")
    for verdict in splits(results):
        lines.append(f"ground truth {verdict.line()}")
    return "\n".join(lines)
