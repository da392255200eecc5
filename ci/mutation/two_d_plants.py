"""Plants in what keeps the 2-D rows true: HSDP's two-stage mirror, the TP twin's split matmuls,
and whose batch a rank of a TP group trains (``harness/parity/ranks/sides/tensor_parallel.py``,
``reduce_layout.py``, ``plan/two_d.py``).

Why: each of these, loosened, turns a correct 2-D candidate red (a twin that sums TP's partial
products in another order, ranks of a TP group fed different batches) or lets a planted HSDP
divide-factor bug through (a reference whose replicas are summed as the bug's are). The tests
``make test`` runs of ``suites/parity/test_two_d.py`` (its correct TP row and its HSDP plant)
catch each; the rest of that module is the ``two_d`` tier.
"""

from __future__ import annotations

from ci.mutation.edits import Edit, Plant

_TWO_D = "suites/parity/test_two_d.py"


def _edit(file: str, old: str, new: str) -> Edit:
    return Edit(file=file, old=old, new=new, package="harness/parity")


TWO_D_PLANTS: tuple[Plant, ...] = (
    Plant(
        name="parity_tp_twin_unsplit",
        bug="the reference of a TP candidate computes its TP'd linears unsplit: one matmul sums the "
        "partial products in another order, and a correct candidate fails by rounding",
        edits=(
            _edit(
                "ranks/sides/tensor_parallel.py",
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
                "ranks/sides/tensor_parallel.py",
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
)
"""The 2-D plants, in the order ``make mutation`` runs them."""
