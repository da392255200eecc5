"""The user's own parallelization (rank side): their ``parallelize`` function as the candidate
(``candidate.py``), what it did read from torch's state (``discover.py``, ``found.py``), and its
unsharded twin (``reference.py``)."""
