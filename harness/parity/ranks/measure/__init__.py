"""How the sides are measured, where the data lives (rank side): each rank's pieces of the
candidate (``local``), the step-by-step check against the reference (``stepcheck``), distances and
ULPs (``distance``, ``ulp``: the judge reads the same numbers), the expected gap to float32
(``gap``) and the op-level localization probe (``ops``). Reads the engines of ``sides``; never the
loop above it (``train``, ``entry``, ``localize``).
"""
