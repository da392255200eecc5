"""Stage 3, the rank side, in two rooms and the loop over them: ``sides/`` (how each side trains:
engines, the twin and its mirrored reduction, optimizers, accumulation, checkpointing, resume,
records), ``measure/`` (how the sides are measured: local pieces, the step check, distances, ULPs,
the fp32 gap, the op probe), and here the training loop (``train``), the batch loop the pool calls
(``entry``) and the module-level localization (``localize``). Imports ``plan``, ``workload`` and the
harness's rank modules (``harness.rank``); never the controller.
"""
