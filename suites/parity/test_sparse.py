"""Sparse-gradient unscaling: DDP with ``nn.Embedding(sparse=True)`` against one process training on
every rank's batch with the same scaler. Batches repeat indices (sparse gradients with duplicates);
at ``OVERFLOW_STEP`` every duplicate is finite but their sum is not, in the run's own dtype.
"""

import pytest
import torch

import harness
from harness.parity.plan.matrices import default as matrix
from harness.parity.ranks import train
from harness.parity.workload import registry
from harness.parity.workload.builtin.toys import SparseEmbedding
from suites.parity.support import describe, unaffected_by_expected_failures

KEEP_TENSORS = True  # the tests read every step's parameters and gradients
CONFIGS = matrix.sparse(world_size=2)


def test_ddp_with_a_sparse_embedding_matches_one_process(parity_config, outcome):
    assert outcome.result.status == "pass", describe(outcome)


def test_duplicates_that_overflow_only_when_summed_skip_the_step_everywhere(parity_config, outcome):
    step = registry.OVERFLOW_STEP
    for run in (outcome.reference, outcome.candidate):
        flags = run.steps[step].skipped
        assert all(f == (True,) for f in flags), f"{run.role} at step {step}: {flags}"
    clean = [s.step for s in outcome.candidate.steps if s.step != step]
    assert not any(outcome.candidate.steps[s].skipped_anywhere() for s in clean)


def _expected_embedding_grad(config, step):
    """The unscaled gradient worked out by hand: each occurrence of an index adds
    ``coefficient * projection / world_size``; every term is a power of two, so it is exact."""
    model = SparseEmbedding()
    expected = torch.zeros(model.vocab, model.width, dtype=torch.float64)
    for rank in range(config.world_size):
        batch = registry.make_batch(registry.get("embedding"), config.seed, rank, step)
        for index in batch["indices"].tolist():
            expected[index] += batch["coefficient"] * model.projection.double() / config.world_size
    return expected


@unaffected_by_expected_failures  # torch's scaler unscales clean steps exactly too
def test_unscaled_sparse_gradients_are_exact(parity_config, outcome):
    for record in outcome.candidate.steps:
        if record.step == registry.OVERFLOW_STEP:
            continue
        got = record.grads["embed.weight"].double()
        assert torch.equal(got, _expected_embedding_grad(parity_config, record.step)), f"step {record.step}"


def _single_process_run(config):
    run, _ = train.run(config, "reference", harness.current().device)
    assert run.error is None, run.error
    return [list(step.skipped) for step in run.steps]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.precision.dtype)
def test_one_process_with_uncoalesced_duplicates_detects_the_overflow(ranks, config):
    """The single-process path alone (no DDP: gloo cannot all-reduce fp16 sparse gradients), so
    every dtype, fp16 included, is checked on the CPU."""
    for rank, skipped in enumerate(ranks.run(_single_process_run, config, world_size=2)):
        assert skipped[registry.OVERFLOW_STEP] == [True], f"rank {rank}: {skipped}"
        assert sum(flag == [True] for flag in skipped) == 1, f"rank {rank}: {skipped}"


@unaffected_by_expected_failures
def test_every_rank_states_its_own_module_buffers_every_step(parity_config, outcome):
    """The fixed projection is a buffer: each rank sends its own, so a rank whose buffers drift
    (FSDP does not broadcast them, DDP does) shows as a buffer divergence on that rank."""
    for run in (outcome.reference, outcome.candidate):
        for step in run.steps:
            stated = sorted(step.shapes("buffer"))
            assert stated == [f"projection [rank {r}]" for r in range(parity_config.world_size)]


def test_the_single_process_reference_multiplies_each_ranks_rows_in_that_ranks_own_shape():
    """The one-process reference looks every rank's rows up at once (a gather: exact in any shape),
    but its matmuls must take the operands a rank's own forward takes (one rank's rows, a fresh
    tensor): over every rank's rows at once a CPU may pick another kernel path and round the last
    bit otherwise, so the verdict would hold on some machines only (AVX-512 MKL, ATen's scalar
    kernels). Checked by the operands' shapes, which no CPU changes; ``make kernels`` checks the
    verdicts themselves where the kernels do differ."""
    from torch.overrides import TorchFunctionMode

    class Operands(TorchFunctionMode):
        """The shape and storage offset of each matmul's left operand."""

        def __init__(self) -> None:
            super().__init__()
            self.seen: set[tuple[tuple[int, ...], int]] = set()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("matmul", "__matmul__"):
                self.seen.add((tuple(args[0].shape), args[0].storage_offset()))
            return func(*args, **(kwargs or {}))

    workload = registry.get("embedding")
    model = workload.model()
    batches = [registry.make_batch(workload, 0, rank, 0) for rank in range(2)]
    with Operands() as own:
        workload.loss(model, batches[1])
    with Operands() as joint:
        workload.losses(model, batches)
    assert own.seen and joint.seen == own.seen, (joint.seen, own.seen)
