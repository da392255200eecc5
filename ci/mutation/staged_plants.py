"""Plants in the staged check (``harness/parity/ranks/staged.py``, ``ranks/measure/bound.py``,
``judge/staged.py``): each loosens one stage so that a planted bug whose straight row is not
bitwise would be let through, or breaks the anchor so that a legitimate reordering fails.

Why: the staged check decides every row whose straight comparison is not bitwise, so a stage that
checks nothing turns a real bug green. Each plant is caught by the world-size-4 tests of
``suites/parity/test_world_size.py`` (every planted bug fails, at the stage that names it) or
``suites/parity/test_staged.py`` (a reordered reduction passes), which ``make test`` runs.

The rest each loosen a rule for one kind of row only, or drop one scalar of the scaler's state:
the local stage of FSDP1, of FSDP2, of an accumulation reducing every microbatch
(``sync="every"``; one reducing once, ``sync="last"``, is caught by ``test_accumulate.py``'s
bfloat16 twin row); a refused kind (TP) accepted; the growth tracker
or the scale left out of what the ranks record, of the judge's scale stage, or of the anchor. Each names the test of that kind alone (``test_staged.py``'s one-ulp rows and drifting
scalers at world size 2, ``test_staged_judge.py``, ``test_anchor.py``).
"""

from __future__ import annotations

from ci.mutation.edits import Edit, Plant

_TESTS = ("suites/parity/test_world_size.py", "suites/parity/test_staged.py")


def _edit(file: str, old: str, new: str) -> Edit:
    return Edit(file=file, old=old, new=new, package="harness/parity")


_STAGED = "suites/parity/test_staged.py"
_LOCAL = f"{_STAGED}::test_local_gradients_that_differ_fail_the_local_stage_in_every_kind_of_row"
_SCALARS = f"{_STAGED}::test_each_scalar_of_the_scalers_state_that_moved_otherwise_fails_the_scale_stage"
_WANTED = "suites/parity/test_staged_judge.py::test_which_rows_the_runner_sends_to_the_staged_check"
_JUDGED_SCALARS = (
    "suites/parity/test_staged_judge.py::test_each_scalar_of_the_scalers_state_is_compared_on_its_own"
)
_ANCHOR = (
    "suites/parity/test_anchor.py::test_anchoring_hands_the_reference_each_scalar_of_the_candidates_scaler"
)
_LOCAL_PAIR = "_compared(_stacked(entering), _stacked(cand_local))\n"


def _local_left_to(kind: str, condition: str) -> Plant:
    """The local stage of one kind of row compares the reference's local gradients with themselves."""
    return Plant(
        name=f"parity_staged_{kind.replace('-', '_')}_local_unchecked",
        bug=f"the local stage of {kind} rows compares the reference's local gradients with themselves, "
        "not with the candidate's captured ones: a compute mismatch there is left to the loss alone",
        edits=(
            _edit(
                "ranks/staged.py",
                _LOCAL_PAIR,
                f"_compared(_stacked(entering), _stacked(entering if {condition} else cand_local))  # planted\n",
            ),
        ),
        tests=(f"{_LOCAL}[{kind}]",),
    )


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
    _local_left_to("fsdp1", 'config.engine == "fsdp1"'),
    _local_left_to("fsdp2", 'config.engine == "fsdp2" and config.loop.accumulate == 1'),
    Plant(
        name="parity_staged_sync_every_last_microbatch_only",
        bug="an accumulation that reduces every microbatch (sync='every') has only its last microbatch's "
        "local gradients compared: a mismatch in the earlier ones passes",
        edits=(
            _edit(
                "ranks/staged.py",
                "    return {name: torch.stack(values) for name, values in grads.items()}\n",
                "    return {name: torch.stack(values[-1:]) for name, values in grads.items()}  # planted\n",
            ),
        ),
        tests=(
            f"{_STAGED}::test_an_accumulation_that_reduces_every_microbatch_compares_each_microbatchs_local_gradients",
        ),
    ),
    Plant(
        name="parity_staged_tp_rows_sent",
        bug="TP rows are sent to the staged check, whose local stage compares TP shards with the twin's "
        "whole gradients in another layout",
        edits=(
            _edit(
                "judge/staged.py",
                '    if config.mesh.tp is not None:\n        return "the staged check does not judge tensor-parallel rows',
                '    if False:  # planted: TP rows accepted\n        return "the staged check does not judge tensor-parallel rows',
            ),
        ),
        tests=(f"{_WANTED}[tp]",),
    ),
    Plant(
        name="parity_staged_tracker_unchecked",
        bug="the scale stage compares the scale but not the growth tracker: a scaler counting its growth "
        "interval otherwise passes until the step it grows",
        edits=(
            _edit(
                "judge/staged.py",
                '    pairs: tuple[tuple[str, tuple[float, float]], ...] = (("scale", head.scale), ("tracker", head.tracker))\n',
                '    pairs: tuple[tuple[str, tuple[float, float]], ...] = (("scale", head.scale),)  # planted\n',
            ),
        ),
        tests=(f"{_JUDGED_SCALARS}[tracker]", f"{_SCALARS}[tracker]"),
    ),
    Plant(
        name="parity_staged_tracker_not_recorded",
        bug="each rank records the candidate's growth tracker as both sides': the scale stage compares it "
        "with itself",
        edits=(
            _edit(
                "ranks/staged.py",
                "int(ref.scaler._get_growth_tracker())),\n",
                "int(cand.scaler._get_growth_tracker())),  # planted\n",
            ),
        ),
        tests=(f"{_SCALARS}[tracker]",),
    ),
    Plant(
        name="parity_staged_scale_not_recorded",
        bug="each rank records the candidate's scale as both sides': the scale stage compares it with itself",
        edits=(
            _edit(
                "ranks/staged.py",
                "        scale=(cand.scaler.get_scale(), ref.scaler.get_scale()),\n",
                "        scale=(cand.scaler.get_scale(), cand.scaler.get_scale()),  # planted\n",
            ),
        ),
        tests=(f"{_SCALARS}[scale]",),
    ),
    Plant(
        name="parity_anchor_tracker_left_out",
        bug="the anchor hands the reference the candidate's scale but leaves its own growth tracker: from a "
        "step where the two counted otherwise, the reference counts on from its own",
        edits=(
            _edit(
                "ranks/sides/anchor.py",
                "    found = candidate.state_dict()\n",
                '    found = {**candidate.state_dict(), "_growth_tracker": reference.state_dict()["_growth_tracker"]}'
                "  # planted\n",
            ),
        ),
        tests=(f"{_ANCHOR}[_growth_tracker]",),
    ),
    Plant(
        name="parity_anchor_scale_left_out",
        bug="the anchor hands the reference the candidate's growth tracker but leaves its own scale",
        edits=(
            _edit(
                "ranks/sides/anchor.py",
                "    found = candidate.state_dict()\n",
                '    found = {**candidate.state_dict(), "scale": reference.state_dict()["scale"]}  # planted\n',
            ),
        ),
        tests=(f"{_ANCHOR}[scale]",),
    ),
)
