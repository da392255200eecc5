"""Stage 6, the front doors: the controller's runner over an executor (``runner``), torchrun
(``launched``), the ``@parity_test`` decorator (``testing``) and its pytest plugin
(``pytest_plugin``). The top stage: may import every stage below and the harness's controller.
"""
