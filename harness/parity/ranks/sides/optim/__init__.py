"""How a side's optimizer is made and stepped (rank side): the matrix's optimizers by name
(``optimizers``), and a fused optimizer's step on the reference taken over the candidate's
shards (``step_pieces``)."""
