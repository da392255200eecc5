"""The controller side of the harness: the warm rank pool (``pool``), its per-rank handles
(``rank_handle``), one case's run (``case_run``), the reaper and the rendezvous store. Talks to
ranks only through ``harness.protocol``; never imports ``harness.rank`` (the pool names the rank's
entry point to start it, the one crossing the import contract allows).
"""
