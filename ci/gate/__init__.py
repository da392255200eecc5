"""The CI regression gate (``python -m ci.gate``, ``make gate``).

On every change, or on a torch upgrade, it says "parity and scaling still hold" or names exactly
what regressed. One run:

1. checks the machine (the GPUs ``--gpu`` needs, ranks that start: :mod:`ci.gate.preflight`);
2. runs the tier's suites in one pytest session (:mod:`ci.gate.suites`), which writes the JUnit
   XML (each parity test with its configuration's metrics as properties) and, through
   :mod:`ci.gate.pytest_plugin`, the parity reports of the configurations it trained;
3. compares each configuration's per-step loss, grad-norm and scale curves with the golden
   baselines of this backend and torch version (:mod:`ci.gate.baselines`, :mod:`ci.gate.curves`);
   another torch version's baselines (the nearest) make every difference *drift*, not a regression;
4. writes ``gate.json`` and ``baselines.xml`` and prints the summary last (:mod:`ci.gate.verdict`).

Exit status: 0 all hold, 1 regression, 2 usage or infrastructure error (see :mod:`ci.gate.cli`).
"""
