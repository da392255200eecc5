"""Plants in the staged check (``harness/parity/ranks/staged.py``, ``ranks/measure/bound.py``,
``judge/staged.py``): each loosens one stage so that a planted bug whose straight row is not
bitwise would be let through, or breaks the anchor so that a legitimate reordering fails.

Why: the staged check decides every row whose straight comparison is not bitwise, so a stage that
checks nothing turns a real bug green. Each plant is caught by the world-size-4 tests of
``suites/parity/test_world_size.py`` (every planted bug fails, at the stage that names it) or
``suites/parity/test_staged.py`` (a reordered reduction passes), which ``make test`` runs.
"""

from __future__ import annotations

from ci.mutation.edits import Edit, Plant

_TESTS = ("suites/parity/test_world_size.py", "suites/parity/test_staged.py")


def _edit(file: str, old: str, new: str) -> Edit:
    return Edit(file=file, old=old, new=new, package="harness/parity")


STAGED_PLANTS: tuple[Plant, ...] = (
    Plant(
        name="parity_staged_bound_a_million_times_wider",
        bug="the order-free bound of the reduction is a million times wider: a rank left out, a divide "
        "factor off by one rank and a reduction in bfloat16 all pass as 'another order'",
        edits=(
            _edit(
                "ranks/measure/bound.py",
                "    ratio = torch.where(",
                "    allowed = allowed * 1e6  # planted\n    ratio = torch.where(",
            ),
        ),
        tests=_TESTS,
    ),
    Plant(
        name="parity_staged_local_stage_unchecked",
        bug="the staged check never compares the losses and local gradients: a block that computes "
        "0.5 % otherwise under FSDP2 is only judged by the (bf16-wide) reduction bound",
        edits=(
            _edit(
                "judge/staged.py",
                "    cand_loss, ref_loss = step.loss\n",
                "    return 0  # planted\n    cand_loss, ref_loss = step.loss\n",
            ),
        ),
        tests=_TESTS,
    ),
    Plant(
        name="parity_staged_reference_keeps_its_own_reduction",
        bug="the anchored reference steps with its own (mirrored) reduced gradients instead of the "
        "candidate's: a candidate that sums in another order fails its update stage",
        edits=(
            _edit(
                "ranks/staged.py", "    anchor.adopt_grads(ref.engine, reduced)\n", "    pass  # planted\n"
            ),
        ),
        tests=_TESTS,
    ),
    Plant(
        name="parity_staged_clip_norm_unchecked",
        bug="the staged check never compares the candidate's clip norm with the reference's measure of "
        "the same gradients, and the reference clips by the candidate's: a scale unscaled twice passes",
        edits=(_edit("judge/staged.py", "        cand_norm, own = clip\n", "        continue  # planted\n"),),
        tests=_TESTS,
    ),
    Plant(
        name="parity_staged_buffers_unchecked",
        bug="the staged check never compares each rank's buffers after the step: a running statistic "
        "that moves otherwise when wrapped passes (the anchor then copies the candidate's over)",
        edits=(
            _edit(
                "judge/staged.py",
                "    for name, buffer in step.buffers.items():\n",
                "    for name, buffer in {}.items():  # planted\n",
            ),
        ),
        tests=_TESTS,
    ),
    Plant(
        name="parity_staged_one_reduction_per_step",
        bug="the staged check bounds an accumulation that reduces every microbatch as if it reduced "
        "once: the sum of the reductions against the first microbatch's mean, a correct row fails",
        edits=(
            _edit(
                "ranks/staged.py",
                '    reductions = config.loop.accumulate if config.loop.accumulate > 1 and config.loop.sync == "every" else 1\n',
                "    reductions = 1  # planted\n",
            ),
        ),
        tests=_TESTS,
    ),
    Plant(
        name="parity_staged_never_anchors",
        bug="the reference is never re-anchored to the candidate's state: a reordering's last bits "
        "compound through the steps as in the straight comparison",
        edits=(
            _edit(
                "ranks/staged.py",
                "    anchor.hold(ref.engine, ref.optimizers, ref.scaler, held, cand.scaler)\n",
                "    pass  # planted\n",
            ),
        ),
        tests=_TESTS,
    ),
)
