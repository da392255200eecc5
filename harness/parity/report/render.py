"""The parity report as JSON and Markdown (pure renderers: results in, text out).

``parity.json`` (``"schema": "shardscale.parity"``, ``"version": 2``)::

    {
      "schema": "shardscale.parity", "version": 2,
      "run": {"backend", "world_size", "scaler", "filter", "torch", "created", "wall_s",
              "units": {workload name: the FSDP units chosen, in words},
              "recipes": {workload name: the recipe it declares},
              "loops": {workload name: the loop it declares, in words},
              "tp_plans": {workload name: its tensor-parallel plan, in words (``--tp``)}},
      "profiles": {"exact": {"rtol": 0.0, "atol": 0.0}, ...},
      "summary": {"total", "pass", "fail", "crash", "error", "skip", "expected_failures",
                  "closeness": {"bitwise" | "≤ N ulp" | "staged" | "toleranced": count}},
      "configs": [{
        "id", "suite", "config": {every ParityConfig field by its flat name (ParityConfig.flat); faults as ids; "policy": the
                                  candidate's mixed precision, every field, or null;
                                  "recipe_name": "fp32", "pure-bf16", "autocast-fp16", ...},
        "status": "pass" | "fail" | "crash" | "error" | "skip",
        "profile", "reason", "expected_failure",
        "detail",                                      # the full text behind an error or crash
        "max_loss_diff", "first_diverging_step",       # null when none
        "closeness": "bitwise" | "≤ N ulp" | "staged" | "toleranced" | "",   # what a pass measured
        "max_ulp",                                     # largest ULP distance compared anywhere
        "worst": {"step", "kind", "name", "max_abs", "max_rel", "mismatched", "numel", "max_ulp"} | null,
        "distances": [{"step", "max_ulp", "max_rel", "failed"}],      # per step, everything compared
        "at_first": [{...as worst...}],                # every loss/tensor at the first diverging step
        "causes": [{"name", "evidence", "explanation", "reference"}],  # known causes: pattern and premise hold
        "ruled_out": [{"name", "why"}],                # patterns that matched, premise refuted by the evidence
        "expected_gap": null | {"loss_max_abs", "loss_max_rel", "param_max_abs", "param_max_rel"},
                                                       # fp16/bf16: the reference against plain fp32
        "localization": null | {"step", "summary", "error", "time_s",  # failed configurations only
            "anchored", "approximate",                 # replayed from the candidate's state; why not exact
            "first": {"phase", "module", "rank", "order", "max_abs", "max_rel", "max_ulp",
                      "mismatched", "numel"} | null,
            "op": null | {"compared", "first", "index", "max_abs", "max_rel", "max_ulp", "missing", "extra"},
            "modules": [{...as first...}]},            # every module, every rank, forward then backward
        "staged": null | {"passed", "summary", "error", "steps", "local_elements", "reduced_elements",
            "worst_ratio", "reordered", "update_max_ulp", "update_fallback", "reordering_drift",
            "findings": [{"step", "stage", "what", "detail", "rank"}]},
                                                       # rows whose straight comparison was not bitwise
        "skipped_steps", "reference_skipped_steps", "counters", "time_s",
        "reference", "candidate",                      # what ran, in words
        "divergences": [{"step", "what", "message"}],
        "curves": {"reference" | "candidate": {"loss": [[by rank] by step], "scale", "grad_norm", "skipped"}}
      }]
    }

Non-finite numbers are written as the strings ``"inf"``, ``"-inf"`` and ``"nan"`` so the file is
strict JSON. ``parity.md`` has one row per configuration (grouped by suite), then the divergences
of every broken configuration and the reasons of the skipped ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any

from harness.parity.judge.result import ParityResult
from harness.parity.plan import profiles
from harness.parity.plan.config import SUITES, ParityConfig
from harness.parity.ranks.measure.distance import format_ulp

SCHEMA = "shardscale.parity"
_DETAIL_LINES = 30
"""How much of an error's or crash's full text parity.md shows (parity.json keeps all of it)."""
VERSION = 2
_SUITE_TITLES = {
    "fsdp_vs_ddp": "FSDP vs DDP",
    "forced_inf": "Forced-inf step skipping",
    "sparse": "Sparse-gradient unscaling",
    "cpu_offload": "CPU offload",
}


def _number(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _numbers(values: Any) -> Any:
    if isinstance(values, float):
        return _number(values)
    if isinstance(values, (list, tuple)):
        return [_numbers(v) for v in values]
    return values


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
    return f" ({', '.join(words)})" if words else ""


def label(result: ParityResult) -> str:
    """The status as the report shows it: ``xfail``/``XPASS`` for expected failures."""
    if result.expected_failure:
        return "xfail" if result.broken else ("skip" if result.status == "skip" else "XPASS")
    return {"pass": "pass", "skip": "skip"}.get(result.status, result.status.upper())


def summary(results: list[ParityResult]) -> dict[str, Any]:
    counts = Counter(r.status for r in results)
    return {
        "total": len(results),
        **{status: counts.get(status, 0) for status in ("pass", "fail", "crash", "error", "skip")},
        "expected_failures": sum(1 for r in results if r.expected_failure and r.broken),
        "closeness": closeness_counts(results),
    }


def _closeness_order(label_: str) -> tuple[int, float]:
    if label_ == "bitwise":
        return (0, 0.0)
    if label_ == "staged":
        return (2, 0.0)
    if label_ == "toleranced":
        return (3, 0.0)
    return (1, float(label_.split()[1]))


def closeness_counts(results: list[ParityResult]) -> dict[str, int]:
    """Passing configurations by what they measured: ``bitwise`` first, then ``≤ N ulp`` by N,
    then ``staged``, then ``toleranced``."""
    counts = Counter(r.closeness for r in results if r.closeness)
    return {key: counts[key] for key in sorted(counts, key=_closeness_order)}


def _diff_json(diff: Any) -> dict[str, Any]:
    return {key: _numbers(value) for key, value in dataclasses.asdict(diff).items()}


def _localization_json(result: ParityResult) -> dict[str, Any] | None:
    found = result.localization
    if found is None:
        return None
    return {
        "step": found.step,
        "summary": found.describe(),
        "error": found.error,
        "time_s": round(found.duration_s, 4),
        "anchored": found.anchored,
        "approximate": found.approximate,
        "first": None if found.first is None else _diff_json(found.first),
        "op": None if found.op is None else _diff_json(found.op),
        "modules": [_diff_json(m) for m in found.modules],
    }


def drift_line(result: ParityResult) -> str:
    """The straight-through drift of a staged row beside a reordering's alone (``--drift``)."""
    own = ", ".join(format_ulp(d.max_ulp) for d in result.distances)
    alone = ", ".join(format_ulp(u) for u in result.staged.reordering_drift)  # type: ignore[union-attr]
    return (
        f"drift by step, straight through (the largest distance of any tensor): this row {own}; "
        f"the reference against itself summing in another order {alone}"
    )


def _staged_json(result: ParityResult) -> dict[str, Any] | None:
    found = result.staged
    if found is None:
        return None
    fields = {f.name: getattr(found, f.name) for f in dataclasses.fields(found) if f.name != "findings"}
    return {
        **{
            key: _numbers(value) if isinstance(value, (float, tuple)) else value
            for key, value in fields.items()
        },
        "summary": found.summary(),
        "findings": [dataclasses.asdict(f) for f in found.findings],
    }


def result_to_json(result: ParityResult) -> dict[str, Any]:
    config = {name: value for name, value in result.config.flat().items() if name not in ("faults", "mixed")}
    config["faults"] = [fault.id for fault in result.config.faults]
    policy = result.config.policy
    config["policy"] = dataclasses.asdict(policy) if policy is not None else None
    config["recipe_name"] = result.config.recipe_name
    return {
        "id": result.config.id,
        "suite": result.config.suite,
        "config": config,
        "status": result.status,
        "profile": result.profile,
        "reason": result.reason,
        "expected_failure": result.expected_failure,
        "detail": result.detail,
        "max_loss_diff": _number(result.max_loss_diff),
        "first_diverging_step": result.first_diverging_step,
        "closeness": result.closeness,
        "max_ulp": _number(result.max_ulp),
        "worst": None if result.worst is None else _diff_json(result.worst),
        "distances": [_numbers(dataclasses.asdict(d)) for d in result.distances],
        "at_first": [_diff_json(d) for d in result.at_first],
        "causes": [dataclasses.asdict(c) for c in result.causes],
        "ruled_out": [dataclasses.asdict(c) for c in result.ruled_out],
        "expected_gap": None if result.expected_gap is None else _diff_json(result.expected_gap),
        "localization": _localization_json(result),
        "staged": _staged_json(result),
        "skipped_steps": list(result.skipped_steps),
        "reference_skipped_steps": list(result.reference_skipped_steps),
        "counters": list(result.counters),
        "time_s": round(result.time_s, 4),
        "reference": result.reference,
        "candidate": result.candidate,
        "divergences": [dataclasses.asdict(d) for d in result.divergences],
        "curves": {
            role: {
                "loss": _numbers(curves.loss),
                "scale": _numbers(curves.scale),
                "grad_norm": _numbers(curves.grad_norm),
                "skipped": list(curves.skipped),
            }
            for role, curves in result.curves.items()
        },
    }


def to_json(results: list[ParityResult], run: dict[str, Any]) -> dict[str, Any]:
    """The whole report as a JSON-ready dict (``run`` is the run's metadata, see the schema)."""
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "run": run,
        "profiles": {name: {"rtol": p.rtol, "atol": p.atol} for name, p in profiles.PROFILES.items()},
        "summary": summary(results),
        "configs": [result_to_json(r) for r in results],
    }


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
        "gradients bitwise, each reduced element within the order-free bound, the update bitwise or "
        "within a fused kernel's stated ulps); `toleranced`: farther apart, within the profile's rtol/atol.",
        "",
        "Profiles: "
        + "; ".join(f"`{n}` {p.describe()}" for n, p in profiles.PROFILES.items())
        + ". Every profile but `exact` is a fallback tolerance (fused optimizers and clipping under FSDP; "
        "NCCL): a pass under it says how close, not that sharding changed nothing.",
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
    if run.get("units"):
        lines += [
            "",
            "FSDP units: " + "; ".join(f"`{name}` {chosen}" for name, chosen in run["units"].items()) + ".",
        ]
    if run.get("tp_plans"):
        lines += [
            "",
            "Tensor-parallel plans (the reference computes each TP'd linear split as the plan splits it, "
            "so those modules are judged `exact` too): "
            + "; ".join(f"`{name}` {plan}" for name, plan in run["tp_plans"].items())
            + ".",
        ]
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
            "Not bitwise straight through (another order of summation, a fused kernel, a norm summed "
            "otherwise); judged step by step from a common state instead. The straight-through "
            "distances in the table are the drift that leaves.",
            "",
        ]
        for r in staged:
            lines.append(f"- `{r.config.id}`: {r.staged.summary()}")  # type: ignore[union-attr]
            if r.staged.reordering_drift:  # type: ignore[union-attr]
                lines.append(f"  - {drift_line(r)}")
    skipped = [r for r in results if r.status == "skip"]
    if skipped:
        lines += ["", "## Not run here", ""]
        reasons = Counter(r.reason for r in skipped)
        lines += [f"- {count} configuration(s): {reason}" for reason, count in reasons.items()]
    return "\n".join(lines) + "\n"


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
    return "\n".join(lines)
