"""Every element of every kind is judged: one element moved anywhere turns its row red, named.

Why a property: the comparison runs on the ranks, each rank measuring its own pieces of the
candidate against the same elements of its reference, and the judge merges their distances. The
tests of the *mapping* show that the pieces cover every element once; only a moved element shows
that a *difference* there is seen: a rank that stops comparing one kind of state, or one element
at the edge of its piece (where padding, uneven chunks and the boundary between two parameters of
a flat shard lie), leaves every other test green. So one element of the candidate's real data is
moved on the ranks (``fixtures/parity_perturb.py``) by one ulp and, separately, by a large amount,
and the verdict must fail at that step, naming that tensor and kind, wherever the row's bound says
the move is outside it (``element_property.check``; a bitwise row always, a toleranced one as its
profile says, a large move always). The bound is asked of the profile and distance modules, not
assumed: which rows are bitwise is theirs to say.

Two tiers run the same check: a fixed sample here (``make test``), one case per kind and per kind
of edge, that kills the mutation check's plants of this class; and a drawn sample in its own tier
(``-m property``, ``make property``), with hypothesis drawing the layout, world size, optimizer,
precision, path, step, kind, tensor and element.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from fixtures.parity_perturb import SIZES
from harness.parity.plan.config import ParityConfig
from suites.parity import element_property as prop
from suites.parity.element_property import Case, Judged

FSDP1_FLAT = {"engine": "fsdp1", "sharding": "full_shard", "use_orig_params": False}
FSDP1_ORIG = {"engine": "fsdp1", "sharding": "full_shard", "use_orig_params": True}
FSDP2 = {"engine": "fsdp2", "reshard_after_forward": True}
DDP = {"engine": "ddp"}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Pick:
    """A fixed case, its element named by an edge of the layout (``"last of rank 1's piece"``)."""

    config: ParityConfig
    kind: str
    step: int
    name: str = ""
    edge: str = ""
    rank: int = 0

    def case(self, layouts: dict[str, prop.Layout]) -> Case:
        if self.kind in ("loss", "clip_norm"):
            return Case(config=self.config, kind=self.kind, step=self.step, rank=self.rank, where="recorded")
        index = layouts[self.config.id].edge(self.kind, self.name, self.edge)
        return Case(
            config=self.config,
            kind=self.kind,
            step=self.step,
            name=self.name,
            index=index,
            rank=self.rank,
            where=self.edge,
        )

    def __str__(self) -> str:
        what = self.name or f"rank{self.rank}"
        edge = (self.edge or "value").replace(" ", "_").replace("'", "")
        return f"{self.config.id}-{self.kind}-{what}-{edge}-s{self.step}"


FIXED = (
    # the boundary of two ranks' shards inside one parameter of an FSDP1 flat parameter
    Pick(
        config=prop.config(**FSDP1_FLAT),
        kind="grad",
        name="blocks.0.fc1.weight",
        edge="last of rank 0's piece",
        step=1,
    ),
    Pick(
        config=prop.config(**FSDP1_FLAT),
        kind="grad",
        name="blocks.0.fc1.weight",
        edge="first of rank 1's piece",
        step=0,
    ),
    Pick(config=prop.config(**FSDP1_FLAT), kind="buffer", name="blocks.0.gain", edge="first", step=0, rank=0),
    Pick(
        config=prop.config(optimizer="adam", **FSDP1_ORIG),
        kind="optim_state",
        name="blocks.1.fc2.weight:exp_avg_sq",
        edge="first of rank 1's piece",
        step=2,
    ),
    Pick(
        config=prop.config(optimizer="adam", engine="fsdp1", sharding="shard_grad_op", use_orig_params=False),
        kind="optim_state",
        name="blocks.0.norm.weight:step",
        edge="first of rank 0's piece",
        step=0,
    ),
    Pick(
        config=prop.config(engine="fsdp1", sharding="no_shard", use_orig_params=True),
        kind="param",
        name="head.weight",
        edge="last of rank 0's piece",
        step=1,
    ),
    # the last row of FSDP2's uneven dim-0 split (the head's 3 rows: 2 + 1), next to its padding
    Pick(config=prop.config(**FSDP2), kind="grad", name="head.weight", edge="last of rank 1's piece", step=0),
    Pick(
        config=prop.config(optimizer="adam", engine="fsdp2", reshard_after_forward=False, offload=True),
        kind="param",
        name="inp.weight",
        edge="first of rank 1's piece",
        step=2,
    ),
    Pick(config=prop.config(**FSDP2), kind="loss", step=2, rank=1),
    Pick(
        config=prop.config(optimizer="adam", **DDP),
        kind="buffer",
        name="blocks.1.gain",
        edge="last",
        step=1,
        rank=1,
    ),
    Pick(
        config=prop.config(optimizer="adam", **DDP),
        kind="optim_state",
        name="head.bias:exp_avg",
        edge="last of rank 0's piece",
        step=1,
    ),
    Pick(config=prop.config(path="unscale_clip", **DDP), kind="clip_norm", step=1, rank=1),
    # a toleranced row (a fused optimizer): one ulp is inside the bound, a large move is not
    Pick(
        config=prop.config(optimizer="adam_fused", **FSDP1_FLAT),
        kind="grad",
        name="blocks.0.fc2.bias",
        edge="last of rank 1's piece",
        step=1,
    ),
    Pick(
        config=prop.config(world_size=4, engine="fsdp1", sharding="hybrid_shard", use_orig_params=False),
        kind="grad",
        name="blocks.1.fc1.weight",
        edge="last of rank 1's piece",
        step=1,
    ),
    # four ranks, the head's 3 rows: 1 + 1 + 1 + 0 (rank 3 holds an empty shard)
    Pick(
        config=prop.config(world_size=4, **FSDP2),
        kind="param",
        name="head.bias",
        edge="last of rank 2's piece",
        step=2,
    ),
    Pick(
        config=prop.config(world_size=4, optimizer="adam", **FSDP1_ORIG),
        kind="optim_state",
        name="blocks.0.fc2.bias:exp_avg",
        edge="last of rank 3's piece",
        step=1,
    ),
)
"""One case per kind and per kind of edge, at world sizes 2 and 4 (``make test``)."""


@pytest.fixture(scope="module")
def fixed(module_ranks) -> dict[str, Any]:
    """Every fixed case run as shipped (once per configuration) and moved both ways, in one rank
    call per world size: ``{"baseline": {id: Judged}, (pick, size): (Case, Judged)}``."""
    configs = {pick.config.id: pick.config for pick in FIXED}
    layouts = prop.layouts(module_ranks, configs.values())
    cases = [(pick, pick.case(layouts)) for pick in FIXED]
    entries = [(found, None) for found in configs.values()]
    entries += [(case.config, case.perturbation(size)) for _, case in cases for size in SIZES]
    judged = prop.run(module_ranks, entries)
    out: dict[Any, Any] = {"baseline": dict(zip(configs, judged[: len(configs)], strict=True))}
    moved = iter(judged[len(configs) :])
    for pick, case in cases:
        for size in SIZES:
            out[(pick, size)] = (case, next(moved))
    return out


def test_every_row_of_the_fixed_sample_passes_as_shipped(fixed):
    """The premise: unmoved, each sampled row holds its profile, so a red row is the move's."""
    for found in fixed["baseline"].values():
        assert found.result.status == "pass", f"{found.result.config.id}: {found.result.reason}"
        assert not found.probes


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("pick", FIXED, ids=str)
def test_a_moved_element_turns_its_row_red_where_the_bound_says_and_is_named(fixed, pick, size):
    """One element of the candidate moved on the ranks: the verdict the bound asks for."""
    case, judged = fixed[(pick, size)]
    prop.check(judged, case)


# -- the drawn sample (make property) -----------------------------------------------------------
_layouts: dict[str, prop.Layout] = {}
_baselines: dict[str, Judged] = {}


def _layout(ranks: Any, found: ParityConfig) -> prop.Layout:
    if found.id not in _layouts:
        _layouts.update(prop.layouts(ranks, [found]))
    return _layouts[found.id]


@pytest.mark.property
@settings(
    max_examples=100,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),  # no explain: it reruns a failure ~150 times
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_any_moved_element_of_any_kind_turns_its_row_red_where_the_bound_says(module_ranks, data):
    """Drawn: a layout, world size, optimizer, precision and path, then a step, a kind, a tensor
    and an element (an edge of its pieces most of the time), moved by one ulp and by a large
    amount; the row must pass unmoved and give the verdict the bound asks for."""
    found = data.draw(prop.configs(), label="config")
    case = data.draw(prop.cases(found, _layout(module_ranks, found)), label="case")
    event(f"kind {case.kind}")  # --hypothesis-show-statistics: what the sample covered
    event(f"world size {found.world_size}, {found.engine}")
    if case.kind not in ("loss", "clip_norm"):
        event("element at an edge" if case.where != "drawn" else "element anywhere")
    entries: list[Any] = [] if found.id in _baselines else [(found, None)]
    entries += [(found, case.perturbation(size)) for size in SIZES]
    judged = prop.run(module_ranks, entries)
    if found.id not in _baselines:
        _baselines[found.id] = judged.pop(0)
    baseline = _baselines[found.id].result
    assert baseline.status == "pass", f"{found.id} fails unmoved: {baseline.reason}"
    for moved in judged:
        prop.check(moved, case)
