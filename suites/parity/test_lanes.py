"""One world's rows on several groups of ranks at once (``doors/lanes.py``), without ranks: the
executors are fakes, as in ``test_runner.py``."""

import argparse
import threading

import pytest

from harness.parity.doors import lanes, runner
from harness.parity.plan.config import Fault, Layout, ParityConfig, Precision
from harness.parity.ranks import requests

_FAMILY = [  # one FSDP2 fp32 SGD reference, and the float32 twin of the fp16 row's
    ParityConfig(engine="fsdp2", layout=Layout(reshard_after_forward=True)),
    ParityConfig(engine="fsdp2", layout=Layout(reshard_after_forward=False)),
    ParityConfig(
        engine="fsdp2", layout=Layout(reshard_after_forward=True), precision=Precision(dtype="fp16")
    ),
]
_OTHERS = [ParityConfig(engine="ddp", optimizer="adam"), ParityConfig(engine="ddp", optimizer="sgd")]


def test_the_family_shares_one_reference_as_the_tests_assume():
    first, fsdp2, fp16 = _FAMILY
    assert first.reference_key() == fsdp2.reference_key() == requests.twin_key(fp16)
    assert first.reference_key() != _OTHERS[0].reference_key()


def _unrelated(count: int) -> list[ParityConfig]:
    """``count`` rows that share no reference: each poisons another step."""
    return [ParityConfig(engine="ddp", steps=count, faults=(Fault(step=step),)) for step in range(count)]


def _deals(dealer: lanes.Dealer) -> list[list[ParityConfig]]:
    found = []
    while dealt := dealer.take():
        found.append(dealt)
    return found


def test_rows_that_share_a_reference_or_a_twin_are_dealt_together():
    mixed = [_FAMILY[0], *_OTHERS, *_FAMILY[1:]]
    deals = _deals(lanes.Dealer(mixed, 1, lanes=2))
    assert deals[0] == _FAMILY  # the largest family first, whole, in the given order
    assert sorted(map(len, deals)) == [1, 1, 3]


def test_a_deal_is_whole_families_up_to_the_rows_asked_in_the_given_order():
    others = _unrelated(20)
    given = [*others, *_FAMILY]
    deals = _deals(lanes.Dealer(given, 4, lanes=2))
    assert deals[0] == [others[0], *_FAMILY]  # the family of 3, then one of 1 to reach 4
    assert sorted(config.id for deal in deals for config in deal) == sorted(c.id for c in given)
    for deal in deals:
        assert deal == sorted(deal, key=given.index)


def test_deals_shrink_as_the_rows_run_out():
    """A share of what is left per lane: the last rows go one at a time, to whichever lane is free."""
    configs = _unrelated(40)
    assert [len(deal) for deal in _deals(lanes.Dealer(configs, 8, lanes=2))] == [
        8, 8, 6, 5, 4, 3, 2, 1, 1, 1, 1,
    ]  # fmt: skip


def test_one_lane_takes_every_row_at_once_in_the_given_order():
    configs = [*_OTHERS, *_FAMILY]
    assert _deals(lanes.Dealer(configs, 1, lanes=1)) == [configs]


def test_no_more_lanes_run_than_there_are_families():
    assert lanes.Dealer([*_FAMILY, _OTHERS[0]], 8, lanes=4).lanes == 2
    alone = lanes.Dealer(_FAMILY, 1, lanes=2)  # one family: one lane, every row at once
    assert alone.lanes == 1 and _deals(alone) == [_FAMILY]


def test_a_deal_of_no_rows_is_refused():
    with pytest.raises(ValueError, match="rows must be >= 1 configuration a deal, got 0"):
        lanes.Dealer(_OTHERS, 0, lanes=2)


def test_the_lanes_take_rows_as_they_are_free():
    """A lane whose rank calls are slow takes fewer rows: the other takes the rest as it is free.
    Both lanes' first calls meet first: neither may take every row in its first deal."""
    configs = _unrelated(30)
    taken: dict[str, set[str]] = {"slow": set(), "fast": set()}
    first_calls = threading.Barrier(2, timeout=10)

    def executor(name, pause_s):
        def execute(batch, backend, world_size):  # a failed batch runs again a row at a time
            if not taken[name]:
                first_calls.wait()
            taken[name] |= {request.config.id for request in batch}
            threading.Event().wait(pause_s)
            raise runner.BatchFailed(f"not run by {name}")

        return execute

    outcomes = runner.run(configs, executor("slow", 0.2), parallel=[executor("fast", 0.0)], batch_size=2)
    assert len(outcomes) == 30 and not taken["slow"] & taken["fast"]
    assert taken["slow"] | taken["fast"] == {config.id for config in configs}
    assert len(taken["fast"]) > len(taken["slow"])


def test_the_lanes_run_at_the_same_time():
    """Each lane's executor waits at a barrier for the other's: run one after the other, they
    would time out there."""
    meeting = threading.Barrier(2, timeout=30)
    seen = []

    def execute(batch, backend, world_size):
        meeting.wait()
        seen.append(len(batch))
        return []

    lanes.run([[_OTHERS[0]], [_OTHERS[1]]], [execute, execute], lambda lane, run: run(lane, "gloo", 2))
    assert seen == [1, 1]


def test_an_error_in_one_lane_is_raised_and_the_other_stops_at_its_next_rank_call():
    calls = []
    started = threading.Event()

    def broken(batch, backend, world_size):
        started.wait(30)
        raise KeyError("a bug in the judge")

    def healthy(batch, backend, world_size):
        calls.append(len(batch))
        started.set()
        threading.Event().wait(0.5)  # the other lane fails meanwhile
        return []

    def work(lane, execute):
        for config in lane:
            execute([config], "gloo", 2)

    with pytest.raises(KeyError, match="a bug in the judge"):
        lanes.run([[_OTHERS[0]] * 50, [_OTHERS[1]]], [healthy, broken], work)
    assert len(calls) < 50


def test_fewer_executors_than_lanes_are_refused():
    with pytest.raises(ValueError, match="2 lanes need as many executors, got 1"):
        lanes.run([[_OTHERS[0]], [_OTHERS[1]]], [runner.pool_executor], lambda lane, run: None)


def test_the_runner_gives_every_row_its_verdict_across_lanes():
    configs = [*_FAMILY, *_OTHERS]
    seen: dict[str, list[str]] = {"a": [], "b": []}

    def executor(name):
        def execute(batch, backend, world_size):
            seen[name] += [request.config.id for request in batch]
            raise runner.BatchFailed(f"not run by {name}")

        return execute

    progress = []
    outcomes = runner.run(configs, executor("a"), parallel=[executor("b")], on_progress=progress.append)
    assert [o.result.config for o in outcomes] == configs
    assert all(o.result.status == "error" for o in outcomes)
    assert set(seen["a"]) | set(seen["b"]) == {config.id for config in configs}
    assert not set(seen["a"]) & set(seen["b"])  # each row in one lane (its retries there too)
    assert sorted(p.done for p in progress) == list(range(1, len(configs) + 1))


def test_the_ground_truth_runs_on_the_second_group_while_the_first_runs_rows():
    """The stage's rank call goes to the second group, whose rows wait for it; the first group
    starts its rows at once; every row still carries the stage's verdict (an error here)."""
    from harness.parity.doors import ground_truths

    calls: list[tuple[str, str]] = []
    first_rows_sent = threading.Event()

    def executor(name):
        def execute(batch, backend, world_size, target=runner.RANK_TARGET):
            kind = "truth" if target == ground_truths.TARGET else "rows"
            calls.append((name, kind))
            if kind == "truth":
                assert first_rows_sent.wait(10), "the first group's rows waited for the ground truth"
            elif name == "a":
                first_rows_sent.set()
            raise runner.BatchFailed(f"not run by {name}")

        return execute

    configs = [*_FAMILY, *_OTHERS]
    outcomes = runner.run(configs, executor("a"), parallel=[executor("b")], ground_truth=True)
    assert calls.count(("b", "truth")) == 1 and ("a", "truth") not in calls
    assert [kind for name, kind in calls if name == "b"][0] == "truth"
    assert all(o.result.semantics is not None and o.result.semantics.status == "error" for o in outcomes)


def _options(**given):
    defaults = {"jobs": None, "workload": [], "compile": None, "backend": "gloo", "parameters": {}}
    return argparse.Namespace(**{**defaults, **given})


_SMALL = {"workload": ["my_models:tiny"], "parameters": {"tiny": lanes.SMALL_MODEL}}
_LARGE = {"workload": ["my_models:tiny", "my_models:llama"], "parameters": {"tiny": 10, "llama": 10_000_000}}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, 2),
        (_SMALL, 2),
        (_LARGE, 1),
        ({"workload": ["my_models:llama"]}, 1),  # its size unknown
        ({"compile": "block"}, 1),
        ({"backend": "nccl"}, 1),
        ({**_LARGE, "jobs": 3}, 3),
    ],
)
def test_the_cli_runs_two_groups_of_ranks_only_for_small_models_on_gloo(given, expected):
    assert lanes.jobs(_options(**given)) == expected
