"""The workloads that look like what users train, in the default matrix: a Llama-style decoder
(RMSNorm, rotary embeddings, SwiGLU, tied embeddings; decoder layers as units) and a conv net with
GroupNorm and dropout, whose masks are drawn inside forward (the engine seeds torch's RNG per
``(seed, rank, step)`` before each forward, so DDP and FSDP drop the same units)."""

from harness.parity.plan.matrices import workload as workload_matrix
from suites.parity.support import describe

CONFIGS = workload_matrix.showcase(world_size=2)


def test_the_showcase_workloads_train_like_ddp(parity_config, outcome):
    assert outcome.result.status == "pass", describe(outcome)


def test_a_planted_fault_skips_the_same_steps_on_every_rank_as_the_reference(parity_config, outcome):
    if not parity_config.faults:
        return
    poisoned = {fault.step for fault in parity_config.faults}
    for run in (outcome.reference, outcome.candidate):
        skipped = {step.step for step in run.steps if step.skipped_anywhere()}
        assert skipped == poisoned, f"{run.role}: skipped {sorted(skipped)}, poisoned {sorted(poisoned)}"
