"""Stage 2, the plan (what runs): ``ParityConfig`` and its axes (``config``), the embedded matrix
(``matrix``), a workload's own matrix (``workload_matrix``), ``-k`` selection (``select``) and the
tolerance profiles (``profiles``). Imports only ``workload``; pure data, no torch at import time.
"""
