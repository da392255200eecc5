"""Stage 1, the workload: the ``Workload`` type (``spec``), resolving factories, names and entry
points (``registry``), the checks a workload must pass before it runs (``checks``), and the built-in
workloads (``builtin/``). Imports nothing of the engine's other stages.
"""
