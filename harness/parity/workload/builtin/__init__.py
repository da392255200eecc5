"""The built-in workloads: the toys of the embedded matrix (``toys``), a Llama-style decoder
(``llama``) and a convolutional net with normalization and dropout (``convnet``). Each module's
factories return :class:`~harness.parity.Workload` objects, registered by name in
``harness.parity.workload.registry.BUILTIN``."""
