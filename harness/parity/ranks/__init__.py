"""Stage 3, the rank side: the batch loop the pool calls (``entry``), engines, the training loop,
optimizers, FSDP1 flat-parameter and gather helpers, the record, distances and ULPs, the
localization probes (module and op level) and the fp32 gap. Imports ``plan``, ``workload`` and the
harness's rank modules (``harness.rank``); never the controller.
"""
