"""The cause ``torch.compile`` invites: a candidate compiled against a reference that was not
compiled the same way (``compile_changes_numerics``).

Why a family of its own: compiling changes the numbers by itself (inductor's generated kernels fuse
ops and round otherwise than eager ones), and that difference is not sharding's. The reference is
the candidate's unsharded twin and keeps compile for that reason (``--compile``'s rows compile both
sides alike, docs/architecture.md, section 4.2); a row whose reference ran eager, or compiled with
another backend, mixes compile's own difference into sharding's, and this cause says so.
"""

from __future__ import annotations

from harness.parity.judge.evidence import Cause, Evidence, KnownCause

_DIFFERS = {"loss": "losses", "grad": "gradients", "param": "parameters", "optim_state": "optimizer state"}


def compile_changes_numerics(e: Evidence) -> Cause | None:
    """``compile_changes_numerics``: the candidate ran compiled modules that its reference did not
    run the same way (the records read them off the modules, ``ranks/sides/compiled.py``), and the
    losses, gradients or what follows differ."""
    if e.candidate.compiled is None or e.candidate.compiled == e.reference.compiled:
        return None
    differs = [words for what, words in _DIFFERS.items() if what in e.failed]
    if not differs:
        return None
    twin = "ran eager" if e.reference.compiled is None else f"ran {e.reference.compiled} compiled"
    return Cause(
        name="compile_changes_numerics",
        evidence=(
            f"at step {e.candidate.step} the {' and '.join(differs[:2])} differ; the candidate ran "
            f"{e.candidate.compiled} compiled and its reference {twin}"
        ),
        explanation=(
            "torch.compile changes the numbers by itself: inductor's generated kernels fuse ops and "
            "round otherwise than eager kernels, so a compiled model drifts from its eager twin in "
            "the last bits without any sharding. Compare against a twin compiled the same way (the "
            "same modules, the same backend: --compile's rows do), where what remains is sharding's; "
            "aot_eager traces the graph but keeps eager's rounding"
        ),
        reference="docs/architecture.md, section 4.2; torchtitan's compile numerics tests use aot_eager",
    )


CAUSES: tuple[KnownCause, ...] = (
    KnownCause(
        name="compile_changes_numerics",
        premise=(
            "the records naming compiled modules on the candidate that its reference did not run the "
            "same way, and the first difference measured from a common state in the loss or the "
            "local gradients (what compiled kernels compute)"
        ),
        blames=frozenset({"loss", "local", "gradients"}),
        pattern=compile_changes_numerics,
    ),
)
"""The compiled rows' causes."""
