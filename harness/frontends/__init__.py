"""The ways in: the pytest plugin and its session (``plugin``, ``session``),
``DistributedTestCase`` (``testcase``, with its controller and rank halves and the configuration
it reads), torchrun mode and the tensor asserts. May import the controller, the rank side and the
shared types.
"""
