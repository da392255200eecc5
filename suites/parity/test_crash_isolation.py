"""One configuration's crash costs one configuration: when a rank dies in the middle of a batch
(here rank 1 calls ``os.abort()`` under FSDP2 only, as a C++ abort or the OOM killer would end
it), the runner runs the batch's configurations again on fresh ranks, and only the one that kills
the rank is an ``error`` row, naming the rank, the signal and where each rank was."""

import pytest

from harness.parity.doors import runner
from harness.parity.plan.config import Fault, Layout, ParityConfig
from suites.parity.support import ranks_executor

# A rank killed mid-batch and the batch run again on fresh ranks (half a minute on two cores): `make e2e`.
pytestmark = pytest.mark.e2e

WORKLOAD = "fixtures.user_workloads:aborts_under_fsdp2"
KILLER = ParityConfig(engine="fsdp2", workload=WORKLOAD, layout=Layout(reshard_after_forward=True))
CONFIGS = [
    ParityConfig(
        engine="fsdp1", workload=WORKLOAD, layout=Layout(sharding="full_shard", use_orig_params=True)
    ),
    ParityConfig(
        engine="fsdp1", workload=WORKLOAD, layout=Layout(sharding="shard_grad_op", use_orig_params=False)
    ),
    KILLER,
    ParityConfig(
        engine="fsdp1", workload=WORKLOAD, layout=Layout(sharding="no_shard", use_orig_params=False)
    ),
    ParityConfig(engine="ddp", workload=WORKLOAD, suite="forced_inf", faults=(Fault(step=2, rank=1),)),
]


@pytest.fixture(scope="module")
def outcomes(module_ranks) -> dict[str, runner.Outcome]:
    found = runner.run(CONFIGS, ranks_executor(module_ranks), batch_size=len(CONFIGS), localize=False)
    return {outcome.result.config.id: outcome for outcome in found}


def test_every_other_configuration_of_the_batch_passes(outcomes):
    statuses = {config_id: outcome.result.status for config_id, outcome in outcomes.items()}
    assert statuses == {config.id: "error" if config is KILLER else "pass" for config in CONFIGS}


def test_the_killers_row_names_the_rank_the_signal_and_where_each_rank_was(outcomes):
    reason = outcomes[KILLER.id].result.reason
    assert "rank 1 died with signal SIGABRT" in reason, reason
    assert "rank 1 in fixtures/user_workloads.py _abort_under_fsdp2" in reason, reason
    assert "rank 0 in harness/" in reason, reason
