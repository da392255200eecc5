"""The runner judges every configuration, whatever happens to a batch, without ranks of its own."""

import pytest

from harness.parity.doors import runner
from harness.parity.plan.config import Layout, ParityConfig


def _never_called(batch, backend, world_size):
    raise AssertionError("nothing should run")


def test_configurations_that_cannot_run_here_are_skipped_without_starting_ranks():
    hybrid = ParityConfig(engine="fsdp1", layout=Layout(sharding="hybrid_shard", use_orig_params=False))
    (outcome,) = runner.run([hybrid], _never_called)
    assert outcome.result.status == "skip" and "world size >= 4" in outcome.result.reason


def test_a_batch_that_fails_on_the_ranks_makes_each_of_its_configurations_an_error():
    configs = [ParityConfig(engine="ddp"), ParityConfig(engine="ddp", optimizer="adam")]

    def failing(batch, backend, world_size):
        raise runner.BatchFailed("1 of 2 ranks did not pass; root cause: rank 1 died with exit code 3")

    outcomes = runner.run(configs, failing)
    assert [o.result.status for o in outcomes] == ["error", "error"]
    assert outcomes[0].result.reason.endswith("rank 1 died with exit code 3")


def test_batches_hold_one_world_size_each_and_progress_counts_every_configuration():
    configs = [
        ParityConfig(engine="ddp", world_size=w, optimizer=o)
        for w in (2, 4)
        for o in ("sgd", "adam", "adam_fused")
    ]
    seen, progress = [], []

    def record(batch, backend, world_size):
        seen.append((world_size, len(batch)))
        raise runner.BatchFailed("not run")

    runner.run(configs, record, batch_size=2, on_progress=progress.append)
    assert seen == [(2, 2), (2, 1), (2, 1), (2, 1), (4, 2), (4, 1), (4, 1), (4, 1)]
    assert [p.done for p in progress] == [1, 2, 3, 4, 5, 6] and progress[-1].total == 6
    assert [p.ran for p in progress] == [1, 2, 3, 4, 5, 6] and progress[-1].to_run == 6


def test_a_failed_batch_runs_again_one_configuration_at_a_time():
    """One configuration that kills a rank must not cost its batch-mates their verdicts: each runs
    again alone, and only a configuration that fails alone is an error."""
    configs = [ParityConfig(engine="ddp", optimizer=o) for o in ("sgd", "adam", "adam_fused")]
    seen = []

    def record(batch, backend, world_size):
        seen.append([request.config.optimizer for request in batch])
        raise runner.BatchFailed("not run")

    runner.run(configs, record, batch_size=3)
    assert seen == [["sgd", "adam", "adam_fused"], ["sgd"], ["adam"], ["adam_fused"]]


def test_a_batch_size_below_one_is_refused():
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        runner.run([], _never_called, batch_size=0)
