"""The built-in workloads: the toys of the embedded matrix (``toys``), a Llama-style decoder
(``llama``), a convolutional net with normalization and dropout (``convnet``) and a residual MLP
whose rows split unevenly across ranks (``uneven``). Each module's
factories return :class:`~harness.parity.Workload` objects, registered by name in
``harness.parity.workload.registry.BUILTIN``."""
