"""``make bench`` (``python -m ci.bench``): what the scaler, the harness and the parity engine cost,
each as ratios against PyTorch measured in the same run.

Five parts, one module each: ``scaler_overhead`` (our scalers against torch's and against the
native check-and-unscale kernel, the floor no scaler can beat), ``harness_overhead`` (a trivial
2-rank test under the warm pool against ``MultiProcessTestCase``) and ``parity_wall`` (the parity
matrix on warm ranks against one spawn per configuration), ``cost_curve`` (one configuration of a
Llama at growing sizes and world sizes against one process training the whole batch and against
the same training on the same ranks, time and peak memory, per process, with the floor no check
on those ranks can go below; its models in
``cost_workloads``, each side a process of its own in ``cost_sides``), ``diagnosis``
(planted bugs with a known place: how often the report names the place and the cause; an accuracy,
not a ratio). Each part's ``measure()`` returns
JSON-ready numbers and its ``render()`` prints them, so the table can be printed again from the
JSON (``ci.gate --bench`` does) on another machine than the one that measured it.

``bench.json`` (``"schema": "shardscale.bench"``, ``"version": 1``)::

    {"schema", "version", "created", "torch", "python", "platform", "cpus",
     "parts": {"scaler" | "harness" | "parity" | "cost" | "diagnosis": {...that part's measure()...} | {"error": "..."}}}

Timing is information, never a verdict: nothing here gates CI.
"""

from __future__ import annotations

from typing import Any

SCHEMA = "shardscale.bench"
VERSION = 1
PARTS = ("scaler", "harness", "parity", "cost", "diagnosis")
_TITLES = {
    "scaler": "scaler overhead",
    "harness": "harness overhead",
    "parity": "parity matrix wall time",
    "cost": "cost curve",
    "diagnosis": "diagnosis accuracy",
}


def render_part(name: str, measured: dict[str, Any]) -> str:
    """One part's table, or the error that stopped it."""
    if "error" in measured:
        return f"{_TITLES[name]}: not measured: {measured['error']}"
    if name == "scaler":
        from ci.bench import scaler_overhead

        return scaler_overhead.render(measured)
    if name == "harness":
        from ci.bench import harness_overhead

        return harness_overhead.render(measured)
    if name == "cost":
        from ci.bench import cost_curve

        return cost_curve.render(measured)
    if name == "diagnosis":
        from ci.bench import diagnosis

        return diagnosis.render(measured)
    from ci.bench import parity_wall

    return parity_wall.render(measured)


def render(data: dict[str, Any]) -> str:
    """Every measured part of a ``bench.json`` document, as ``make bench`` prints them."""
    if data.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} document (schema {data.get('schema')!r})")
    header = (
        f"bench: torch {data.get('torch', '?')}, {data.get('cpus', '?')} CPUs, {data.get('created', '?')}"
    )
    parts = [render_part(name, data["parts"][name]) for name in PARTS if name in data["parts"]]
    return "\n\n".join([header, *parts])
