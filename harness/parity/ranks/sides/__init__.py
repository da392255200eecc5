"""How each side trains (rank side): the engines that wrap the model (DDP, FSDP1, FSDP2, the
references: the low-precision twin, DDP reducing as its FSDP candidate does, one process), the
twin's precision policy and its mirror of the candidate's gradient buffers (``reduce_layout``),
optimizers, accumulation, activation checkpointing, the schedulers and forward RNG policy every run
keeps beside its engine (``loop_state``), tensor parallelism's engine and twin, pipeline
parallelism's (``pipeline/``, over the model cut into stages: ``stages``), the FSDP1 flat-parameter
and gather helpers, and the record a step leaves. Below ``measure``: what
trains never depends on how it is measured.
"""
