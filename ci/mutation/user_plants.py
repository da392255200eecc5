"""Plants in the check of a user's own ``parallelize`` function (``harness/parity/ranks/sides/user/``,
``plan/matrices/user.py``).

Why: the engine reads what the function did and builds a twin from it, so a reader that misses a
checkpoint without RNG replay, a twin that forgets the units' precision policy, a report that hides
parameters no unit reduces, or rows that drop the planted infs each turn a user's bug into a silent
pass or an unnamed failure. Each plant names the tests that kill it
(``suites/parity/test_user_parallelize.py``: the warm pool at world size 2, seconds).
"""

from __future__ import annotations

from ci.mutation.edits import Edit, Plant

_TESTS = "suites/parity/test_user_parallelize.py"


def _edit(file: str, old: str, new: str) -> Edit:
    return Edit(file=file, old=old, new=new, package="harness/parity")


USER_PLANTS: tuple[Plant, ...] = (
    Plant(
        name="user_checkpoint_replay_assumed",
        bug="the reader takes every checkpoint_wrapper as replaying the RNG: a recompute without it "
        "fails unnamed (checkpoint_rng needs the candidate's no_replay)",
        edits=(
            Edit(
                file="checkpoint.py",
                old='keywords", {}).get("preserve_rng_state", True))',
                new='keywords", {}).get("preserve_rng_state", True)) or True  # planted',
                package="harness/torch_private",
            ),
        ),
        tests=(f"{_TESTS}::test_a_planted_function_fails_at_step_0_with_its_cause_named",),
    ),
    Plant(
        name="user_twin_forgets_the_policy",
        bug="the twin trains in float32 whatever policies the function's units have: a bf16 function "
        "fails as if it were wrong",
        edits=(
            _edit(
                "ranks/sides/user/reference.py",
                "    return found_policies[0] if found_policies else None",
                "    return None  # planted",
            ),
        ),
        tests=(f"{_TESTS}::test_a_correct_function_trains_bitwise_like_its_unsharded_twin",),
    ),
    Plant(
        name="user_one_policy_for_every_unit",
        bug="the twin reduces every unit's gradients in the first unit's reduce dtype: blocks that "
        "reduce in bf16 under a root reducing in float32 fail as if the function were wrong",
        edits=(
            _edit(
                "ranks/sides/user/policies.py",
                "    dtypes = [reduce_dtype(owner.get(name)) for name, _ in named_lows]",
                "    dtypes = [reduce_dtype(found.units[0]) for name, _ in named_lows]  # planted",
            ),
        ),
        tests=(f"{_TESTS}::test_a_correct_function_trains_bitwise_like_its_unsharded_twin",),
    ),
    Plant(
        name="user_never_reduced_hidden",
        bug="parameters no fully_shard unit and no DDP manage are not reported: a root left out "
        "fails with nothing in the report saying which parameters are never reduced",
        edits=(
            _edit(
                "ranks/sides/user/discover.py",
                "    if ddp is None and data_parallel > 1:",
                "    if False:  # planted",
            ),
        ),
        tests=(f"{_TESTS}::test_the_report_says_what_the_function_did_per_module",),
    ),
    Plant(
        name="user_split_tie_unseen",
        bug="the reader never compares the units' parameters with the model's ties: a tie the units "
        "hold apart fails unnamed",
        edits=(
            _edit(
                "ranks/sides/user/discover.py",
                "    holder = {name: unit.module for unit in units for name in unit.params}",
                "    holder: dict[str, str] = {}  # planted",
            ),
        ),
        tests=(f"{_TESTS}::test_a_planted_function_fails_at_step_0_with_its_cause_named",),
    ),
    Plant(
        name="user_crash_unexplained",
        bug="a candidate that raises on DTensors beside plain tensors is not read with the function's "
        "never-reduced parameters: the crash of a forgotten root goes unnamed",
        edits=(
            _edit(
                "judge/causes/function.py",
                "    if not never or not candidate_error or _MIXED not in candidate_error:",
                "    if True:  # planted",
            ),
        ),
        tests=(
            "suites/models/test_model_functions.py::test_the_function_without_its_root_is_named_never_reduced",
        ),
    ),
    Plant(
        name="user_twin_averages_over_two",
        bug="the twin averages its gradients over 2 ranks whatever the data-parallel size: every "
        "function looks right at world size 2 and wrong from 4 on",
        edits=(
            _edit(
                "ranks/sides/user/policies.py",
                'twin.divide_factors("user", dtype, data_parallel),',
                'twin.divide_factors("user", dtype, 2),  # planted',
            ),
        ),
        tests=(f"{_TESTS}::test_a_correct_function_is_bitwise_at_world_size_4",),
    ),
    Plant(
        name="user_rows_without_infs",
        bug="a function's rows plant no inf: whether every rank skips together is never checked",
        edits=(
            _edit("plan/matrices/user.py", "    for rank in (1, None):", "    for rank in ():  # planted"),
        ),
        tests=(f"{_TESTS}::test_a_workload_with_a_function_gets_its_setup_as_rows_not_the_matrix",),
    ),
)
