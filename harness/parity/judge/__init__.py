"""Stage 4, the controller's verdict: comparing two records (``compare``), a configuration's
result (``result``), pinpointing the first divergence (``pinpoint``) and known causes
(``causes``). Pure: it reads records; imports ``ranks`` (for their types), ``plan`` and ``workload``.
"""
