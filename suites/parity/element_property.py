"""The property "every element of every kind is judged", its cases and its check (controller side).

Why a module of its own: ``test_every_element_judged.py`` runs it twice, a fixed sample in
``make test`` and a drawn one in ``make property``, and both must ask exactly the same thing.

A *case* is a configuration of the ``edges`` workload (``fixtures/edge_workload.py``: uneven rows
at world sizes 2 and 4, several parameters per FSDP unit, a buffer per unit), a step, a kind
(gradient, parameter, each optimizer state key, buffer, loss, clip norm) and one element. Its
element is drawn from the *edges* of the candidate's layout most of the time: the first and last
element of each rank's piece of the tensor (which is also the element next to a flat shard's
padding, the last row of an uneven FSDP2 split, and each side of the boundary between two
parameters inside an FSDP1 flat shard), read off torch's layout on the ranks
(``fixtures.parity_perturb.layouts``). The case is run three times on the ranks: as shipped (its
row must pass: the premise), with the element moved by one ulp, and moved by a large amount
(``fixtures.parity_perturb``). :func:`check` then asks the verdict what the bound says it must be.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
from hypothesis import strategies as st

from fixtures import parity_perturb
from fixtures.parity_perturb import Perturbation
from harness.parity.judge import clip_norm
from harness.parity.judge import result as results
from harness.parity.judge.result import ParityResult
from harness.parity.plan import profiles
from harness.parity.plan.config import FSDP1_SHARDING, ParityConfig, unsupported_reason
from harness.parity.ranks.measure import distance
from harness.parity.ranks.measure.record import RunRecord
from harness.parity.report import render

WORKLOAD = "fixtures.edge_workload:edges"
STEPS = 3
WORLD_SIZES = (2, 4)
ENGINE_LAYOUTS: tuple[dict[str, Any], ...] = (
    {"engine": "ddp"},
    *(
        {"engine": "fsdp1", "sharding": s, "use_orig_params": o}
        for s in FSDP1_SHARDING
        for o in (False, True)
    ),
    *(
        {"engine": "fsdp2", "reshard_after_forward": r, "offload": o}
        for r in (True, False)
        for o in (False, True)
    ),
)
"""DDP; FSDP1 under every sharding strategy, flat and ``use_orig_params``; FSDP2 resharding or
keeping after forward, with and without ``CPUOffloadPolicy``."""
OPTIMIZERS = ("sgd", "adam", "adam_fused")
PRECISIONS = ("fp32", "bf16")
"""fp16 is left out: at the matrix's initial scale its first steps overflow, and a step whose
gradients are inf has no element to move by one ulp. A DDP candidate trains in float32 only (as in
the matrix: its low-precision twin is a reference, not a candidate)."""
PATHS = ("plain", "unscale_clip")


def config(
    *,
    world_size: int = 2,
    optimizer: str = "sgd",
    precision: str = "fp32",
    path: str = "plain",
    **layout: Any,
) -> ParityConfig:
    """A configuration of the ``edges`` workload (``layout``: one of :data:`ENGINE_LAYOUTS`)."""
    return ParityConfig.from_flat(
        workload=WORKLOAD,
        steps=STEPS,
        world_size=world_size,
        optimizer=optimizer,
        **layout,
        precision=precision,
        path=path,
    )


# -- the layout ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Tensor:
    """One tensor of a candidate: its element count and its edges (label, flat index)."""

    numel: int
    edges: tuple[tuple[str, int], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    """Every tensor of one configuration's candidate by kind and judge's name."""

    tensors: dict[str, dict[str, Tensor]]

    @classmethod
    def merged(cls, per_rank: list[dict[str, Any]]) -> Layout:
        """From every rank's ``parity_perturb.layouts`` entry (rank order)."""
        tensors: dict[str, dict[str, Tensor]] = {}
        for kind in ("grad", "param", "optim_state"):
            names = sorted({name for rank in per_rank for name in rank[kind]})
            tensors[kind] = {}
            for name in names:
                numel = max(rank[kind][name][0] for rank in per_rank if name in rank[kind])
                edges = [
                    (f"{end} of rank {r}'s piece", start + (0 if end == "first" else count - 1))
                    for r, rank in enumerate(per_rank)
                    for start, count in (rank[kind].get(name, (0, []))[1])
                    for end in ("first", "last")
                ]
                tensors[kind][name] = Tensor(numel, tuple(dict.fromkeys(edges)))
        buffers = per_rank[0]["buffer"]
        tensors["buffer"] = {
            name: Tensor(numel, (("first", 0), ("last", numel - 1)))
            for name, numel in sorted(buffers.items())
        }
        return cls(tensors)

    def edge(self, kind: str, name: str, label: str) -> int:
        """The flat index of the edge called ``label`` (``"last of rank 1's piece"``)."""
        for found, index in self.tensors[kind][name].edges:
            if found == label:
                return index
        raise ValueError(f"{kind} {name} has no edge {label!r}: {self.tensors[kind][name].edges}")


def layouts(ranks: Any, configs: Iterable[ParityConfig]) -> dict[str, Layout]:
    """The layout of each configuration's candidate, by id (one rank call per world size)."""
    out: dict[str, Layout] = {}
    by_world: dict[int, list[ParityConfig]] = {}
    for found in configs:
        by_world.setdefault(found.world_size, []).append(found)
    for world_size, group in sorted(by_world.items()):
        per_rank = ranks.run(parity_perturb.layouts, group, world_size=world_size, deadline=300)
        for index, found in enumerate(group):
            out[found.id] = Layout.merged([rank[index] for rank in per_rank])
    return out


# -- cases --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """One element of one kind of one configuration's candidate, at one step."""

    config: ParityConfig
    kind: str
    step: int
    name: str = ""
    index: int = 0
    rank: int = 0
    where: str = ""
    """How the element was chosen (an edge's label, or ``drawn``): said in failure messages."""

    def perturbation(self, size: str) -> Perturbation:
        return Perturbation(
            kind=self.kind, step=self.step, name=self.name, index=self.index, rank=self.rank, size=size
        )

    def __str__(self) -> str:
        what = f"{self.kind} {self.name}[{self.index}]" if self.name else self.kind
        return f"{self.config.id} step {self.step}: {what} ({self.where or 'drawn'}) rank {self.rank}"


def runnable(found: ParityConfig) -> bool:
    return unsupported_reason(found, gpus=0) is None


@st.composite
def configs(draw: st.DrawFn) -> ParityConfig:
    """Any runnable configuration of the ``edges`` workload on gloo (the world size first, then a
    layout that runs at it: HYBRID_SHARD needs four ranks)."""
    world_size = draw(st.sampled_from(WORLD_SIZES))
    layouts = [layout for layout in ENGINE_LAYOUTS if runnable(config(world_size=world_size, **layout))]
    layout = draw(st.sampled_from(layouts))
    precision = "fp32" if layout["engine"] == "ddp" else draw(st.sampled_from(PRECISIONS))
    optimizer, path = draw(st.sampled_from(OPTIMIZERS)), draw(st.sampled_from(PATHS))
    found = config(world_size=world_size, optimizer=optimizer, precision=precision, path=path, **layout)
    assert runnable(found), found.id
    return found


def cases(found: ParityConfig, layout: Layout) -> st.SearchStrategy[Case]:
    """A case of ``found``: any kind it records, any tensor of that kind, and an element that is
    one of the tensor's edges most of the time (any element otherwise)."""
    kinds = [kind for kind in ("grad", "param", "optim_state", "buffer") if layout.tensors[kind]]
    kinds += ["loss"] + (["clip_norm"] if found.loop.path == "unscale_clip" else [])

    @st.composite
    def draw_case(draw: st.DrawFn) -> Case:
        kind = draw(st.sampled_from(kinds))
        step = draw(st.integers(0, found.steps - 1))
        rank = draw(st.integers(0, found.world_size - 1))
        if kind in ("loss", "clip_norm"):
            return Case(config=found, kind=kind, step=step, rank=rank)
        name = draw(st.sampled_from(sorted(layout.tensors[kind])))
        tensor = layout.tensors[kind][name]
        if draw(st.integers(0, 3)) > 0:
            where, index = draw(st.sampled_from(tensor.edges))
        else:
            where, index = "drawn", draw(st.integers(0, tensor.numel - 1))
        return Case(config=found, kind=kind, step=step, name=name, index=index, rank=rank, where=where)

    return draw_case()


# -- running and judging ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Judged:
    """One run of a case's configuration, as the judge saw it."""

    perturbation: Perturbation | None
    result: ParityResult
    candidate: RunRecord | None
    probes: tuple[dict[str, Any], ...]
    """What the ranks moved (``parity_perturb._probes``), every rank's."""


def run(ranks: Any, entries: list[tuple[ParityConfig, Perturbation | None]]) -> list[Judged]:
    """Each entry trained on the ranks (one rank call per world size) and judged, in order."""
    judged: dict[int, Judged] = {}
    by_world: dict[int, list[int]] = {}
    for index, (found, _) in enumerate(entries):
        by_world.setdefault(found.world_size, []).append(index)
    for world_size, indices in sorted(by_world.items()):
        batch = [entries[i] for i in indices]
        per_rank = ranks.run(parity_perturb.run_batch, batch, world_size=world_size, deadline=600)
        for position, index in enumerate(indices):
            parts = [rank[position] for rank in per_rank]
            verdict, _, candidate = results.judge(entries[index][0], [part.row for part in parts])
            probes = tuple(probe for part in parts for probe in part.probes)
            judged[index] = Judged(
                perturbation=entries[index][1], result=verdict, candidate=candidate, probes=probes
            )
    return [judged[i] for i in range(len(entries))]


def must_fail(p: Perturbation, probe: dict[str, Any], profile: profiles.ToleranceProfile) -> bool:
    """Whether the bound says the moved element lies outside the row's tolerance: the judge's own
    measure (``distance.tensor_diff``; the loss in float64, as the judge compares it; a clip norm
    under ``clip_norm.agrees``) applied to the reference's value and the moved one."""
    reference, after = probe["reference"], probe["after"]
    if p.kind == "clip_norm":
        return not clip_norm.agrees(reference, after, profile)
    dtype = torch.float64 if p.kind == "loss" else getattr(torch, probe["dtype"])
    diff = distance.tensor_diff(
        torch.tensor([reference], dtype=dtype),
        torch.tensor([after], dtype=dtype),
        profile,
        step=0,
        kind="",
        name="",
    )
    return diff.mismatched > 0


def _names_it(message: str, p: Perturbation) -> bool:
    if p.kind == "loss":
        return f"{p.judge_name} loss " in message
    if p.kind == "clip_norm":
        return message.split(", ", 1)[1].startswith("clip norm") and f"{p.judge_name} " in message
    return f", {p.kind} {p.judge_name}: " in message


def check(judged: Judged, case: Case) -> None:
    """Assert what the verdict on a moved element must be, read off the row as the report writes
    it (``parity.json``): failed at that step, its first divergence of that kind, one of them
    naming that tensor, and the ranks' count of mismatched elements exactly one; or, inside the
    bound, nothing named and nothing counted."""
    p = judged.perturbation
    assert p is not None
    result = judged.result
    profile = profiles.get(result.profile)  # the bound the verdict was given under, whatever it is
    assert judged.probes, f"{case}: the element was found on no rank: nothing was moved"
    for probe in judged.probes:
        assert probe["after"] != probe["before"], f"{case}: {probe} did not move"
    expected = {must_fail(p, probe, profile) for probe in judged.probes}
    assert len(expected) == 1, f"{case}: the copies of the element disagree: {judged.probes}"
    fails = expected.pop()
    if p.size == "large" or (profile.bitwise and p.kind != "clip_norm"):
        assert fails, f"{case}: the test's own bound lets a {p.size} move pass under {profile.name}"
    report = render.result_to_json(result)  # the row as parity.json writes it
    divergences = report["divergences"]
    named = [
        d for d in divergences if (d["step"], d["what"]) == (p.step, p.kind) and _names_it(d["message"], p)
    ]
    said = "\n".join(d["message"] for d in divergences[:6]) or "(no divergence)"
    if fails:
        assert report["status"] == "fail", f"{case}, {p.size}: the row passed\n{said}"
        assert report["first_diverging_step"] == p.step and divergences[0]["what"] == p.kind, (
            f"{case}, {p.size}: the row's first divergence is not this {p.kind} at step {p.step}\n{said}"
        )
        assert named, f"{case}, {p.size}: no divergence names {p.kind} {p.judge_name}\n{said}"
    else:
        assert not named, f"{case}, {p.size}: within the bound of {profile.name}, yet named\n{said}"
    if p.kind in parity_perturb.TENSOR_KINDS and judged.candidate is not None:
        diffs = (judged.candidate.steps[p.step].diffs or {}).get(p.kind, {})
        measured = diffs.get(p.judge_name)
        mismatched = 0 if measured is None else measured.mismatched
        assert mismatched == int(fails), (
            f"{case}, {p.size}: the ranks counted {mismatched} mismatched elements of "
            f"{p.kind} {p.judge_name}, not {int(fails)}"
        )
