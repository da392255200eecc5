"""Plants in what keeps the verdict true past two ranks: the reference's mirrored reduction
(``harness/parity/ranks/sides/reduce_layout.py``), the references it keeps apart, and the reduction's
known causes.

Why: each of these, loosened, gives a correct candidate a FAIL at world size 4 (a reference that
sums in another order) or a red row no name (a cause never matched); none of it shows at world
size 2, where any order gives the same bits, so every plant here is caught by the world-size-4
tests of ``suites/parity/test_world_size.py``, which ``make test`` runs (the hand accumulation's
divide factor over HYBRID_SHARD's shard group: a unit test of its factors).
"""

from __future__ import annotations

from ci.mutation.edits import Edit, Plant

_WORLD_SIZE = "suites/parity/test_world_size.py"
_HAND = "suites/parity/test_divide_factors.py::test_the_hand_accumulation_divides_over_every_rank_of_its_candidate"


def _edit(file: str, old: str, new: str) -> Edit:
    return Edit(file=file, old=old, new=new, package="harness/parity")


WORLD_SIZE_PLANTS: tuple[Plant, ...] = (
    Plant(
        name="parity_canary_toleranced_on_nccl",
        bug="the wiring canary, whose sums are exact in any order, falls back to a tolerance on NCCL",
        edits=(
            _edit("plan/profiles.py", "    if _exact_sums(config.workload):\n", "    if False:  # planted\n"),
        ),
        tests=("suites/parity/test_canary.py",),
    ),
    Plant(
        name="parity_reference_reduces_one_flat_buffer",
        bug="the reference all-reduces one flat buffer of every gradient, as DDP does, whatever its "
        "candidate's layout: from 3 ranks on each element is summed in another order",
        edits=(
            _edit(
                "ranks/sides/reduce_layout.py",
                '    if config.engine not in ("fsdp1", "fsdp2"):\n',
                "    if True:  # planted\n",
            ),
        ),
        tests=(_WORLD_SIZE,),
    ),
    Plant(
        name="parity_reference_ignores_alignment",
        bug="the reference lays out FSDP1's flat gradient without use_orig_params' alignment padding",
        edits=(
            _edit(
                "ranks/sides/reduce_layout.py",
                "if config.layout.use_orig_params else 0",
                "if False else 0  # planted",
            ),
        ),
        tests=(_WORLD_SIZE,),
    ),
    Plant(
        name="parity_reference_hybrid_in_one_stage",
        bug="the reference reduces a HYBRID_SHARD candidate's gradients in one reduce-scatter over every "
        "rank instead of its shard group's reduce-scatter and the replicate group's all-reduce",
        edits=(
            _edit(
                "ranks/sides/reduce_layout.py",
                'hybrid=config.layout.sharding == "hybrid_shard",',
                "hybrid=False,  # planted",
            ),
        ),
        tests=(_WORLD_SIZE,),
    ),
    Plant(
        name="parity_layouts_share_one_reference",
        bug="configurations whose candidates lay out their gradients differently share one reference run",
        edits=(
            _edit(
                "plan/config/__init__.py",
                '        if self.reference != "ddp" or (self.world_size <= 2 and not self.fused):\n',
                "        if True:  # planted\n",
            ),
        ),
        tests=(
            _WORLD_SIZE,
            # a fused optimizer's reference steps the candidate's shards: its layout counts at 2 ranks too
            "suites/parity/test_fused_optimizer.py::test_a_fused_adam_row_passes_bitwise_straight_through",
        ),
    ),
    Plant(
        name="parity_resume_reference_keeps_its_first_layout",
        bug="the reference of a resume row that comes back in another layout keeps mirroring the "
        "layout it saved in",
        edits=(
            _edit(
                "ranks/sides/references.py",
                "        if config.resume.layout is not None:\n            resumed = ",
                "        if False:  # planted\n            resumed = ",
            ),
        ),
        tests=(_WORLD_SIZE,),
    ),
    Plant(
        name="parity_reduction_cause_silent",
        bug="gradients that differ where every module matched on every rank are never named reduction_differs",
        edits=(
            _edit(
                "judge/causes/reduction.py",
                "        pattern=reduction_differs,\n",
                "        pattern=lambda e: None,  # planted\n",
            ),
        ),
        tests=(_WORLD_SIZE,),
    ),
    Plant(
        name="parity_lower_dtype_cause_silent",
        bug="a reduction in bfloat16 where the policy says float32 is never named",
        edits=(
            _edit(
                "judge/causes/reduction.py",
                "        pattern=reduced_in_lower_dtype,\n",
                "        pattern=lambda e: None,  # planted\n",
            ),
        ),
        tests=(_WORLD_SIZE,),
    ),
    Plant(
        name="parity_hand_accumulation_divides_by_the_shard_group",
        bug="the reference's hand accumulation of a HYBRID_SHARD candidate takes its divide factors over "
        "the shard group (2 of 4 ranks), not both mesh dimensions: its gradients are twice the candidate's",
        edits=(
            _edit(
                "ranks/sides/accumulate.py",
                "self.factors = twin.divide_factors(config.engine, self.reduce, engine.data_parallel_size)",
                "self.factors = twin.divide_factors(config.engine, self.reduce, engine.data_parallel_size // 2 "
                'if config.layout.sharding == "hybrid_shard" else engine.data_parallel_size)  # planted',
            ),
        ),
        tests=(f"{_HAND}[fsdp1-hybrid_shard]",),
    ),
)
"""The plants of the world-size verdict, run after the engine's."""
