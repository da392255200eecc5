"""Tensor parallelism: the FSDP2 + TP candidate (``candidate.py``) and its twin's split arithmetic (``mirror.py``)."""
