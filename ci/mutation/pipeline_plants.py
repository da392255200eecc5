"""Plants in the pipeline engine: the classic PP bugs written into the candidate
(``harness/parity/ranks/sides/pipeline/candidate.py``), and its twin and step check loosened.

Why: each candidate plant is one of the bugs users hit under pipeline parallelism (a tie never
summed across stages, a loss not divided by the microbatch count or divided twice, a stage's
parameters left out of its optimizer, a last stage scoring other microbatches than the first fed);
the engine with the bug in it must turn the correct pipeline rows ``make test`` runs red. The
twin's and the check's plants (the microbatches back-propagated in one order for every schedule,
a stage's shards compared by rank 0's group only) must turn a row red or let a planted bug through,
caught by the ``pipeline`` tier's rows and plants. The plants in a user's pipeline (its stages'
units read on one rank only, a tie across stages let through, its facts unread by the causes)
each turn a test of ``suites/parity/test_user_pipeline.py`` red.
"""

from __future__ import annotations

from ci.mutation.edits import Edit, Plant

_PIPELINE = "suites/parity/test_pipeline.py"
_CORRECT = f"{_PIPELINE}::test_a_correct_pipeline_row_passes_bitwise"
_PLANTED = f"{_PIPELINE}::test_a_planted_pipeline_bug_fails_at_step_0_and_is_named"
_CANDIDATE = "ranks/sides/pipeline/candidate.py"
_USER = "ranks/sides/user/pipeline.py"
_USER_TESTS = "suites/parity/test_user_pipeline.py"


def _edit(file: str, old: str, new: str) -> Edit:
    return Edit(file=file, old=old, new=new, package="harness/parity")


PIPELINE_PLANTS: tuple[Plant, ...] = (
    Plant(
        name="pp_tie_not_summed",
        bug="the candidate never sums a tied parameter's copies across the stages that hold them",
        edits=(_edit(_CANDIDATE, "        sum_ties(self, self.pp_group)\n", "        pass  # planted\n"),),
        tests=(_CORRECT,),
    ),
    Plant(
        name="pp_loss_not_divided_by_microbatches",
        bug="the candidate's schedule does not divide the summed gradients by the microbatch count",
        edits=(
            _edit(
                _CANDIDATE, "            scale_grads=True,\n", "            scale_grads=False,  # planted\n"
            ),
        ),
        tests=(_CORRECT,),
    ),
    Plant(
        name="pp_loss_divided_twice",
        bug="the candidate's loss function divides by the microbatch count and the schedule again",
        edits=(
            _edit(
                _CANDIDATE,
                "        return self._scaler.scale(loss)\n",
                "        return self._scaler.scale(loss / self.config.mesh.microbatches)  # planted\n",
            ),
        ),
        tests=(_CORRECT,),
    ),
    Plant(
        name="pp_stage_norms_out_of_the_optimizer",
        bug="the candidate's optimizers leave out every norm of every stage",
        edits=(
            _edit(
                _CANDIDATE,
                "        return [(n, p) for n, p in self.named_parameters_whole() if p.requires_grad]\n",
                '        return [(n, p) for n, p in self.named_parameters_whole() if p.requires_grad and "norm" not in n]  # planted\n',
            ),
        ),
        tests=(_CORRECT,),
    ),
    Plant(
        name="pp_last_stage_targets_reordered",
        bug="the last stage scores the batch's rows in reverse order: other targets than its microbatches'",
        edits=(
            _edit(
                _CANDIDATE,
                "target=target if last else None",
                "target=target.flip(0) if last else None  # planted\n",
            ),
        ),
        tests=(_CORRECT,),
    ),
    Plant(
        name="pp_twin_ascending_for_every_schedule",
        bug="the twin back-propagates the microbatches first first under every schedule, LoopedBFS too",
        edits=(
            _edit(
                "ranks/sides/stages.py",
                "    return order[::-1] if schedule in DESCENDING else order\n",
                "    return order  # planted\n",
            ),
        ),
        tests=(_CORRECT,),
    ),
    Plant(
        name="pp_stage_shards_compared_by_rank_zero_only",
        bug="a stage's shards are compared only where rank 0's group holds them: the last stage's never",
        edits=(
            _edit(
                "ranks/measure/local.py",
                "    owner = own[0] if own is not None else zero_group\n",
                "    owner = zero_group  # planted: own ignored\n",
            ),
        ),
        tests=(_PLANTED,),
    ),
    Plant(
        name="pp_user_stages_not_gathered",
        bug="the twin of a user's pipeline reads the units of its own rank's stages only",
        edits=(
            _edit(
                _USER,
                "    dist.all_gather_object(every, mine)\n",
                "    every = [mine]  # planted: never gathered\n",
            ),
        ),
        tests=(f"{_USER_TESTS}::test_a_correct_pipeline_function_passes_bitwise_and_says_what_it_built",),
    ),
    Plant(
        name="pp_user_tie_split_allowed",
        bug="a user's pipeline with a tie cut into two stages is trained instead of refused",
        edits=(_edit(_USER, "        if len(where) > 1:\n", "        if False:  # planted\n"),),
        tests=(f"{_USER_TESTS}::test_what_the_twin_cannot_mirror_is_an_error_naming_the_way_out",),
    ),
    Plant(
        name="pp_user_facts_unread",
        bug="the pipeline causes read the configuration only, never the pipeline a user's function built",
        edits=(
            _edit(
                "judge/causes/pipeline.py",
                "    return e.facts.pipeline if e.facts is not None else None\n",
                "    return None  # planted\n",
            ),
        ),
        tests=(
            f"{_USER_TESTS}::test_a_schedule_that_does_not_divide_by_the_microbatches_fails_at_step_0_named",
        ),
    ),
    Plant(
        name="pp_user_compiles_not_gathered",
        bug="the stages' compiled modules are not merged: the whole twin runs them eager",
        edits=(
            _edit(
                "ranks/sides/user/pipeline.py",
                '        compiled=tuple(c for part in stages for c in part["compiled"]),\n',
                "        compiled=(),  # planted\n",
            ),
        ),
        tests=(f"{_USER_TESTS}::test_every_stages_compiled_modules_reach_the_whole_twin",),
    ),
    Plant(
        name="pp_split_backward_summed_per_microbatch",
        bug="the twin moves every microbatch into the reduce dtype, where a split backward sums some in bf16 first",
        edits=(
            _edit(
                "ranks/sides/pipeline/twin.py",
                "        moves = self.piping.moves\n",
                "        moves = None  # planted\n",
            ),
        ),
        tests=(
            f"{_CORRECT}[fsdp2-pp2-zbv-mb4-keep-bf16-reduce32-adamw-llama-w2]",
            f"{_USER_TESTS}::test_a_zero_bubble_pipeline_reducing_in_float32_passes_bitwise",
        ),
    ),
    Plant(
        name="pp_split_backward_first_stage_waits",
        bug="the first stage's weight half taken for a split one (it is a full backward: moved each time)",
        edits=(
            _edit(
                "ranks/sides/pipeline/halves.py",
                '        elif kind == "W" and stage != 0:\n',
                '        elif kind == "W":  # planted\n',
            ),
        ),
        tests=(
            "suites/parity/test_pipeline_plan.py::"
            "test_a_split_backward_moves_its_sums_into_the_reduce_dtype_where_fsdp2s_hook_runs",
        ),
    ),
    Plant(
        name="pp_split_backward_reference_shared",
        bug="a split-backward row reducing in float32 shares the reference of another schedule's row",
        edits=(
            Edit(
                file="plan/config/mesh.py",
                old="self.schedule if split else None)",
                new="None)  # planted",
                package="harness/parity",
            ),
        ),
        tests=(
            "suites/parity/test_pipeline_plan.py::"
            "test_a_split_backward_row_reducing_in_float32_gets_a_reference_of_its_own_schedule",
        ),
    ),
    Plant(
        name="pp_stage_inputs_blamed_for_compile",
        bug="a step-0 loss difference against an eager twin of a compiled pipeline blamed on the stages' data",
        edits=(
            _edit(
                "judge/causes/pipeline.py",
                "    if e.candidate.compiled != e.reference.compiled:",
                "    if False:  # planted",
            ),
        ),
        tests=(
            "suites/parity/test_cause_premises.py::"
            "test_a_step_0_loss_difference_against_an_eager_twin_of_a_compiled_pipeline_is_compiles",
        ),
    ),
)
"""The pipeline's plants."""
