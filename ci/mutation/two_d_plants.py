"""Plants in what keeps the 2-D rows true: HSDP's two-stage mirror, the TP twin's split matmuls,
and whose batch a rank of a TP group trains (``harness/parity/ranks/sides/tp/``,
``reduce_layout.py``, ``plan/two_d.py``).

Why: each of these, loosened, turns a correct 2-D candidate red (a twin that sums TP's partial
products in another order, ranks of a TP group fed different batches) or lets a planted HSDP
divide-factor bug through (a reference whose replicas are summed as the bug's are). The tests
``make test`` runs of ``suites/parity/test_two_d.py`` (its correct TP row and its HSDP plant)
catch each; the rest of that module is the ``two_d`` tier.

The divide factors of each reference kind are planted over the wrong group too: the float32
reference under TP over the world, the low-precision twin under HSDP over the shard group, and the
mirrored reduction's ``AVG`` counted over one group. ``make test``'s 2-D rows (bf16 under TP, an
fp32 HSDP plant) do not see those, so each is caught by a unit test with its collectives and
meshes stood in for (``test_divide_factors.py``, ``test_reduce_layout.py``).
"""

from __future__ import annotations

from ci.mutation.edits import Edit, Plant

_TWO_D = "suites/parity/test_two_d.py"
_FACTORS = (
    "suites/parity/test_divide_factors.py::"
    "test_each_reference_divides_over_its_candidates_data_parallel_group_on_a_2d_mesh"
)
_AVG = (
    "suites/parity/test_reduce_layout.py::"
    "test_fsdp2_averages_in_its_collectives_exactly_where_its_factor_is_its_data_parallel_size"
)
_MIRRORED = "            engine, torch.float32, self.config.mesh.data_parallel_size(self.config.world_size)\n"
_TWIN = "            self.config.mesh.data_parallel_size(self.config.world_size),\n"
_SIZE = "    size = dist.get_world_size(shard) * (dist.get_world_size(replicate) if replicate is not None else 1)\n"


def _edit(file: str, old: str, new: str) -> Edit:
    return Edit(file=file, old=old, new=new, package="harness/parity")


TWO_D_PLANTS: tuple[Plant, ...] = (
    Plant(
        name="tp_twin_hands_on_plain_logits",
        bug="the TP twin hands its loss whole plain logits where the candidate's head keeps them a "
        "vocabulary-sharded DTensor: torch's parallel cross-entropy rounds otherwise than one softmax",
        edits=(
            _edit(
                "ranks/sides/tp/mirror.py",
                '    if getattr(style, "use_local_output", True):\n',
                "    if True:  # planted\n",
            ),
        ),
        tests=(f"{_TWO_D}::test_a_correct_2d_row_passes_bitwise_at_world_size_4",),
    ),
    Plant(
        name="parity_tp_twin_unsplit",
        bug="the reference of a TP candidate computes its TP'd linears unsplit: one matmul sums the "
        "partial products in another order, and a correct candidate fails by rounding",
        edits=(
            _edit(
                "ranks/sides/tp/mirror.py",
                "        kind = _kind(name, module, style, parts)\n",
                '        kind = "layout"  # planted\n',
            ),
        ),
        tests=(_TWO_D,),
    ),
    Plant(
        name="parity_tp_twin_sums_ranks_together",
        bug="under a sequence-parallel plan the twin lets autograd add every TP rank's partial input "
        "gradients in one sum, where each rank sums its own and the reduce-scatter sums the ranks'",
        edits=(
            _edit(
                "ranks/sides/tp/mirror.py",
                '        return "replicated" if gathered else "layout"\n',
                '        return "layout"  # planted\n',
            ),
        ),
        tests=(_TWO_D,),
    ),
    Plant(
        name="parity_tp_batch_per_rank",
        bug="every rank trains its own batch under TP, where a TP group shares its data-parallel "
        "group's: the TP'd modules sum partial products of different inputs",
        edits=(
            _edit(
                "plan/config/mesh.py",
                "        return rank // self.tp if self.tp is not None else rank\n",
                "        return rank  # planted\n",
            ),
        ),
        tests=(_TWO_D,),
    ),
    Plant(
        name="parity_hsdp_reference_sums_replicas",
        bug="the reference of an HSDP candidate sums across the replicas where FSDP2 averages, so a "
        "candidate with FSDP's divide factor (pytorch#155903) matches it",
        edits=(
            _edit(
                "ranks/sides/reduce_layout.py",
                "        dist.all_reduce(out, op=op, group=replicate)\n",
                "        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=replicate)  # planted\n",
            ),
        ),
        tests=(_TWO_D,),
    ),
    Plant(
        name="parity_tp_float32_reference_divides_by_the_world",
        bug="the float32 reference of a TP candidate takes its divide factor over the whole world, not "
        "its dp group: every gradient halved at tp 2 (the low-precision twin still right)",
        edits=(
            _edit(
                "ranks/sides/references.py",
                _MIRRORED,
                "            engine, torch.float32, self.config.world_size  # planted\n",
            ),
        ),
        tests=(f"{_FACTORS}[tp2-fp32]",),
    ),
    Plant(
        name="parity_hsdp_twin_divides_by_the_shard_group",
        bug="the low-precision twin of an HSDP candidate takes its divide factor over the shard group "
        "(FSDP's own bug, pytorch#155903), so a candidate with that bug matches it",
        edits=(
            _edit(
                "ranks/sides/references.py",
                _TWIN,
                "            self.config.mesh.data_parallel_size(self.config.world_size)"
                " // (self.config.mesh.hsdp or 1),  # planted\n",
            ),
        ),
        tests=(f"{_FACTORS}[hsdp2x2-bf16]", f"{_FACTORS}[hsdp4x1-fp16]"),
    ),
    Plant(
        name="parity_hsdp_averages_over_the_shard_group_only",
        bug="the mirrored reduction counts an HSDP candidate's data-parallel ranks in the shard group "
        "only, so it sums and divides where FSDP2 averages in each collective (other roundings on NCCL)",
        edits=(
            _edit(
                "ranks/sides/reduce_layout.py", _SIZE, "    size = dist.get_world_size(shard)  # planted\n"
            ),
        ),
        tests=(f"{_AVG}[hsdp2x2]", f"{_AVG}[hsdp4x1]"),
    ),
    Plant(
        name="parity_tp_averages_over_the_world",
        bug="the mirrored reduction counts a TP candidate's data-parallel ranks over the whole world, so "
        "it sums and divides where FSDP2 averages over dp (other roundings on NCCL)",
        edits=(
            _edit("ranks/sides/reduce_layout.py", _SIZE, "    size = dist.get_world_size()  # planted\n"),
        ),
        tests=(f"{_AVG}[tp2]",),
    ),
)
"""The 2-D plants, in the order ``make mutation`` runs them."""
