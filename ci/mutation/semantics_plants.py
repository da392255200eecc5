"""Plants in the ground truth (``harness/parity/ranks/truth/``, ``judge/semantics.py``,
``judge/causes/semantics.py``) and in what a ``num_items`` loss trains (``workload/items.py``).

Why: the stage is the one check that sees a bug DDP shares, so a stage that compares the split
with itself, forgives a real difference as rounding, lets a repeated sample into the whole batch or
shows the pieces the wrong process passes every plant of ``fixtures/semantic_workloads.py``; and
an engine that forgets to scale a ``num_items`` loss trains a gradient ``ranks x microbatches``
times too small on both sides alike, which no parity row can see. Each plant names the tests that
kill it (``suites/parity/test_semantics.py``, in-process, seconds; the runs on the pool for the
engine's scaling).
"""

from __future__ import annotations

from ci.mutation.edits import Edit, Plant

_STAGE = "suites/parity/test_semantics.py"
_CAUSES = "suites/parity/test_semantic_causes.py"
_RUNS = "suites/parity/test_semantics_runs.py"


def _edit(file: str, old: str, new: str) -> Edit:
    return Edit(file=file, old=old, new=new, package="harness/parity")


SEMANTICS_PLANTS: tuple[Plant, ...] = (
    Plant(
        name="truth_bound_forgives_meaning",
        bug="the ground truth's bound is a percent, not float64's rounding: a per-microbatch mean "
        "over uneven counts (4e-2) passes as rounding",
        edits=(_edit("ranks/truth/gradients.py", "BOUND = 1e-9\n", "BOUND = 5e-2  # planted\n"),),
        tests=(_STAGE,),
    ),
    Plant(
        name="truth_whole_batch_keeps_repeats",
        bug="the whole batch keeps the samples a sampler repeated: the padded split equals it",
        edits=(
            _edit(
                "ranks/truth/pieces.py",
                "def whole_batch(pieces: list[Piece], drop_repeats: bool = True) -> Whole:",
                "def whole_batch(pieces: list[Piece], drop_repeats: bool = False) -> Whole:  # planted",
            ),
        ),
        tests=(
            f"{_STAGE}::test_a_sampler_that_repeats_a_sample_to_even_out_the_ranks_is_named_sampler_padding",
        ),
    ),
    Plant(
        name="truth_whole_batch_sees_the_split_world",
        bug="the whole batch's loss runs as one rank of the split's world, not as one process: a loss "
        "dividing by the world size divides the whole batch too, and passes",
        edits=(
            _edit(
                "ranks/truth/stage.py",
                "    with pieces.as_process(0, 1):\n        if step == 0",
                "    with pieces.as_process(0, split.ranks):  # planted\n        if step == 0",
            ),
        ),
        tests=(
            f"{_STAGE}::test_a_loss_divided_by_the_world_size_on_top_of_the_average_is_named_microbatch_scaling",
        ),
    ),
    Plant(
        name="truth_split_weighs_pieces_as_one",
        bug="the split sums its pieces' gradients without the engine's 1 / ranks x microbatches: every "
        "mean-loss split is off by that factor, the correct variants fail",
        edits=(
            _edit(
                "ranks/truth/stage.py",
                "    split_gradient = _weighed(own, split.factor)\n",
                "    split_gradient = _weighed(own, 1.0)  # planted\n",
            ),
        ),
        tests=(f"{_STAGE}::test_the_built_in_workloads_train_like_the_whole_batch",),
    ),
    Plant(
        name="truth_sampler_premise_dropped",
        bug="sampler_padding is named whenever a sample repeats, even where the split differs from "
        "the batch as served too",
        edits=(
            _edit(
                "judge/causes/semantics.py",
                "    if step.as_served is not None and step.as_served <= BOUND:\n        return None\n",
                "    if True:  # planted\n        return None\n",
            ),
        ),
        tests=(_CAUSES,),
    ),
    Plant(
        name="truth_normalization_premise_dropped",
        bug="loss_normalization is named where a module's outputs already differ on the pieces",
        edits=(
            _edit(
                "judge/causes/semantics.py",
                "    if step.module is None:\n        return None\n    name, kind, distance = step.module\n",
                "    if True:  # planted\n        return None\n    name, kind, distance = step.module\n",
            ),
        ),
        tests=(_CAUSES,),
    ),
    Plant(
        name="truth_syncbatchnorm_per_piece",
        bug="the stage's SyncBatchNorm normalizes each piece by its own statistics: the whole batch's "
        "statistics, which SyncBatchNorm's all-reduce gives, are not what the split computes",
        edits=(
            _edit(
                "ranks/truth/lockstep.py",
                "        together = meeting.inputs[calls]  # type: ignore[assignment]\n",
                "        together = [x]  # planted\n",
            ),
        ),
        tests=(f"{_STAGE}::test_syncbatchnorm_over_every_ranks_share_passes",),
    ),
    Plant(
        name="num_items_loss_not_scaled",
        bug="a loss that takes num_items is not multiplied by ranks x microbatches: the engine's "
        "division and DDP's average shrink each share, on both sides alike",
        edits=(
            _edit(
                "workload/items.py",
                "    return float(microbatches * ranks)\n",
                "    return 1.0  # planted\n",
            ),
        ),
        tests=(f"{_RUNS}::test_a_loss_that_takes_num_items_trains_the_whole_batchs_gradient_on_the_ranks",),
    ),
)
