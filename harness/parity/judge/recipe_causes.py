"""Known causes that a precision recipe breaks, read from the localization (controller side, pure).

Why apart from ``causes.py``: these patterns need what only a localization has, the dtype of each
module's output on both sides, so they are matched once the first diverging module is known
(``runner._with_localization``), not over the step records as the catalogue's are.

``autocast_differs``: the first diverging module's forward output has another dtype in the two
runs (float16 against float32, say) while every parameter and buffer has the same dtype in both.
Parameters and buffers are all a module's own state, so the dtype of what it computed from them
can only differ when something around the forward chose it: ``torch.autocast`` on one side only
(or to another dtype). Measured (``suites/parity/test_recipes.py``): an ``autocast-fp16`` row whose
reference runs without autocast fails at step 0 in the first ``Linear``, ``float32`` in the
reference and ``float16`` in the candidate; a ``mixed-bf16`` row fails where autocast upcasts (a
``LayerNorm``, a softmax) instead.
"""

from __future__ import annotations

from harness.parity.judge.causes import dtype_differences
from harness.parity.judge.evidence import Cause
from harness.parity.judge.pinpoint import ModuleDiff
from harness.parity.ranks.measure.record import RunRecord

_LOW = ("float16", "bfloat16")


def autocast_differs(
    reference: RunRecord, candidate: RunRecord, step: int, first: ModuleDiff
) -> Cause | None:
    """The ``autocast_differs`` cause when ``first`` (the first diverging module, at ``step``)
    shows its pattern, else ``None``."""
    if first.phase != "forward" or first.dtypes is None:
        return None
    want, got = first.dtypes
    if not ({want, got} & set(_LOW)):
        return None
    if step < min(len(reference.steps), len(candidate.steps)) and dtype_differences(
        reference.steps[step], candidate.steps[step]
    ):
        return None  # a parameter or buffer in another dtype explains it: dtype_differs
    return Cause(
        name="autocast_differs",
        evidence=(
            f"{first.display_name}'s forward output at step {step} is {got} in the candidate and {want} "
            "in the reference, while every parameter and buffer has the same dtype in both runs"
        ),
        explanation=(
            "One run's forward is under torch.autocast and the other's is not (or autocasts to "
            "another dtype): autocast computes this module's ops in low precision from float32 "
            "parameters, or upcasts them to float32. The reference of an autocast recipe must run "
            "its forward under the same torch.autocast as the candidate (its unsharded twin), and "
            "a training loop must enter autocast around the forward on every engine it compares"
        ),
        reference="torch.amp autocast; pytorch test_fully_shard_mixed_precision.py",
    )
