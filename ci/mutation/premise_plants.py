"""Plants that loosen the premise a known cause stands on (``harness/parity/judge/causes/``): a
cause named where the evidence refutes what it claims.

Why every cause: "summation order" printed on a real forward bug is the most expensive sentence a
report can hold, and each cause is a claim of the same kind (the reduction, the clip, the update,
a dtype, a lost piece of state). A cause that blames a stage loses its premise when its ``blames``
is emptied (it then claims nothing and is named whatever was measured); a rounding cause when its
``rounding`` flag is dropped; a cause that stands on a fact of the records when its pattern stops
checking that fact. Each plant names the hand-made-record tests that kill it
(``suites/parity/test_cause_premises.py``: no ranks, seconds); the ones in what the judge measures
(the common state, the staged check's finding, the re-anchored localization) also run the
diagnosis matrix's sample, whose planted bugs must be named at their place.
"""

from __future__ import annotations

from ci.mutation.edits import Edit, Plant

_PREMISES = "suites/parity/test_cause_premises.py"
_CAUSES = "suites/parity/test_causes.py"
_DIAGNOSIS = "suites/parity/test_diagnosis.py"


def _edit(file: str, old: str, new: str) -> Edit:
    return Edit(file=file, old=old, new=new, package="harness/parity")


_BLAMING = (
    ("forward_differs", "forward.py", '{"loss", "local"}'),
    ("clip_norm_sharded", "loop.py", '{"clip"}'),
    ("clip_unscale_order", "loop.py", '{"clip"}'),
    ("accumulation_dtype", "loop.py", '{"local", "gradients"}'),
    ("checkpoint_rng", "loop.py", '{"local", "gradients"}'),
    ("compile_changes_numerics", "compiled.py", '{"loss", "local", "gradients"}'),
    ("divide_factor", "reduction.py", '{"reduction", "gradients"}'),
    ("reduced_in_lower_dtype", "reduction.py", '{"reduction", "gradients"}'),
    ("reduction_differs", "reduction.py", '{"reduction"}'),
    ("optimizer_only", "update.py", '{"update"}'),
    ("buffers_only", "update.py", '{"buffer"}'),
    ("tp_grad_not_reduced", "two_d.py", '{"gradients", "reduction", "local"}', "grad_not_reduced"),
    ("tp_partial_not_reduced", "two_d.py", '{"loss", "local"}', "partial_not_reduced"),
)
"""Each cause that blames a stage: its family's module and its ``blames`` (and its pattern's
name where it is not the cause's)."""


def _dropped_blame(name: str, module: str, stages: str, pattern: str = "") -> Plant:
    pattern = pattern or name
    return Plant(
        name=f"premise_{name}_blames_nothing",
        bug=f"{name} claims nothing about where the difference began, so it is named whatever stage "
        "was measured first, or when nothing was measured from a common state",
        edits=(
            _edit(
                f"judge/causes/{module}",
                f"        blames=frozenset({stages}),\n        pattern={pattern},\n",
                f"        blames=frozenset(),  # planted\n        pattern={pattern},\n",
            ),
        ),
        tests=(_PREMISES,),
    )


_FACTS = (
    (
        "skip_desync",
        "update.py",
        "    if len(set(flags)) <= 1 and not decisions:\n        return None\n",
        "the ranks' skip decisions that agree",
    ),
    (
        "dtype_differs",
        "forward.py",
        "    return _dtype_cause(found, e.candidate.step) if found else None\n",
        "no dtype that differs",
    ),
    ("loss_dtype_differs", "forward.py", "    if want == got:\n        return None\n", "losses of one dtype"),
    (
        "autocast_differs",
        "forward.py",
        "    if dtype_differences(e.reference, e.candidate):\n        return None",
        "a parameter in another dtype (dtype_differs's)",
    ),
    (
        "resume_state_lost",
        "resume.py",
        "    if not lost:\n        return None\n",
        "an audit that found nothing lost",
    ),
    (
        "resume_weights_late",
        "resume.py",
        "    if not stale:\n        return None\n",
        "weights in place at the forward",
    ),
    (
        "tp_plan_incomplete",
        "two_d.py",
        "    if found is None:\n        return None\n",
        "an error that is no shape mismatch",
    ),
)
"""Each cause that stands on a fact of the records: the check of that fact in its pattern."""


def _fact_unchecked(name: str, module: str, check: str, despite: str) -> Plant:
    first, _, rest = check.partition("\n")
    loosened = "    if False:  # planted\n" + rest if first.lstrip().startswith("if ") else None
    if loosened is None:  # the dtype cause: named with or without a dtype that differs
        loosened = "    return _dtype_cause(found or ['planted'], e.candidate.step)\n"
    return Plant(
        name=f"premise_{name}_fact_unchecked",
        bug=f"{name} is named despite {despite}: its pattern no longer checks the fact it stands on",
        edits=(_edit(f"judge/causes/{module}", check, loosened),),
        tests=(_PREMISES,),
    )


PREMISE_PLANTS: tuple[Plant, ...] = (
    *(_dropped_blame(*entry) for entry in _BLAMING),
    *(_fact_unchecked(*entry) for entry in _FACTS),
    Plant(
        name="premise_reduce_order_not_rounding",
        bug="summation order is named on a row the staged check found differing in another stage (a "
        "real forward bug explained as rounding)",
        edits=(
            _edit(
                "judge/causes/rounding.py",
                "        rounding=True,\n        also=_summed_otherwise,\n",
                "        rounding=False,  # planted\n        also=_summed_otherwise,\n",
            ),
        ),
        tests=(_PREMISES,),
    ),
    Plant(
        name="premise_reduce_order_on_a_mirrored_reduction",
        bug="summation order is named where every reduced element was bitwise the mirror's",
        edits=(
            _edit(
                "judge/causes/rounding.py",
                "        also=_summed_otherwise,\n",
                "        also=None,  # planted\n",
            ),
        ),
        tests=(_PREMISES,),
    ),
    Plant(
        name="premise_noise_gradient_not_rounding",
        bug="a noise gradient is named on a row the staged check did not clear",
        edits=(
            _edit(
                "judge/causes/rounding.py",
                "premise=_HELD, rounding=True, pattern=noise_gradient)",
                "premise=_HELD, rounding=False, pattern=noise_gradient)  # planted",
            ),
        ),
        tests=(_PREMISES,),
    ),
    Plant(
        name="premise_common_state_ignores_drift",
        bug="a step is taken to begin from a common state although the straight runs had already "
        "drifted apart: a loss that drift moved is blamed on the forward",
        edits=(
            _edit(
                "judge/measured.py",
                "    drifted = [s for s, bitwise in bitwise_steps if s < step and not bitwise]\n",
                "    drifted: list[int] = []  # planted\n",
            ),
        ),
        tests=(_CAUSES, _PREMISES),
    ),
    Plant(
        name="premise_staged_finding_ignored",
        bug="a row the staged check judged is explained from the straight runs alone, where drift "
        "hides where the difference began",
        edits=(
            _edit(
                "judge/result.py",
                "    if found is not None and not found.error:\n        return measured.from_staged(",
                "    if False:  # planted\n        return measured.from_staged(",
            ),
        ),
        tests=(_PREMISES,),
    ),
    Plant(
        name="localization_never_reanchored",
        bug="a failed row is localized by replaying both sides straight through: after a few steps of "
        "drift (a reduction summed in another order) the first module drift moved is named, not the planted one",
        edits=(
            _edit(
                "doors/runner.py",
                '    if staged.unjudged(verdict.config) is None:\n        return step, True, ""\n',
                '    if False:  # planted\n        return step, True, ""\n',
            ),
        ),
        tests=(_DIAGNOSIS,),
    ),
)
"""Every premise plant, run after the engine's."""
