"""Pipeline parallelism on both sides (rank side): the model cut into stages (``sides/stages.py``, which the engines and the reduction layouts read too), FSDP2 +
torch's schedule as the candidate (``candidate``), and its unsharded twin running the same
microbatches in the order the stages accumulate them (``twin``)."""
