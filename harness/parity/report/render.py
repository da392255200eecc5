"""The parity report as JSON and Markdown (pure renderers: results in, text out).

``parity.json`` (``"schema": "shardscale.parity"``, ``"version": 2``)::

    {
      "schema": "shardscale.parity", "version": 2,
      "run": {"backend", "world_size", "scaler", "filter", "torch", "created", "wall_s",
              "units": {workload name: the FSDP units chosen, in words},
              "recipes": {workload name: the recipe it declares},
              "loops": {workload name: the loop it declares, in words},
              "tp_plans": {workload name: its tensor-parallel plan, in words (``--tp``)},
              "pipelines": {workload name: its pipeline stages, in words (``--pp``)},
              "compile_cache": inductor's cache folder, when a row compiled (``--compile``)},
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
            "worst_ratio", "reordered", "update_max_ulp", "reordering_drift",
            "findings": [{"step", "stage", "what", "detail", "rank"}]},
                                                       # rows whose straight comparison was not bitwise
        "skipped_steps", "reference_skipped_steps", "counters", "time_s",
        "compile_s": {"reference" | "candidate": seconds},   # compiled rows: the first step's extra time
        "reference", "candidate",                      # what ran, in words
        "divergences": [{"step", "what", "message"}],
        "curves": {"reference" | "candidate": {"loss": [[by rank] by step], "scale", "grad_norm", "skipped"}},
        "semantics": null | the name of the row's split in "semantics" below
      }],
      "semantics": [{                                  # --ground-truth: one per split, judge/semantics.py
        "name", "status": "pass" | "fail" | "skip" | "error", "split", "step", "distance",
        "rounding", "bound", "steps", "cause", "cause_text", "ruled_out": [{"name", "why"}],
        "module", "reason", "seconds"}]
    }

``summary`` then also holds ``"semantics": {"pass", "fail", "skip", "error"}`` (the splits' counts).

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

SCHEMA = "shardscale.parity"
VERSION = 2


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
        **({"semantics": _semantics_counts(results)} if splits(results) else {}),
    }


def splits(results: list[ParityResult]) -> list[Any]:
    """Each ground-truth verdict once (``judge/semantics.Semantics``), in the rows' order."""
    found = {}
    for result in results:
        if result.semantics is not None:
            found.setdefault(result.semantics.name, result.semantics)
    return list(found.values())


def _semantics_counts(results: list[ParityResult]) -> dict[str, int]:
    counts = Counter(found.status for found in splits(results))
    return {status: counts.get(status, 0) for status in ("pass", "fail", "skip", "error")}


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
        "compile_s": {role: round(seconds, 4) for role, seconds in result.compile_s.items()},
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
        "semantics": result.semantics.name if result.semantics is not None else None,
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
        **({"semantics": [found.to_json() for found in splits(results)]} if splits(results) else {}),
    }
