"""The rank side of the harness: the rank's main loop (``rank_main``), executing one case
(``execute``), the rank context, group calls, faults and subtests. Imports only ``harness.protocol``,
``harness.outcome`` and ``harness.spec`` of the harness; never the controller or a front end.
"""
