"""The ground truth (rank side): each step's gradient in float64 on one process, on the whole
global batch and as the candidate's setup splits it (``pieces``: the data-parallel ranks'
batches and their microbatches, the engine's averaging; ``gradients``: the float64 model, the
gradients and what explains a difference; ``stage``: the stage itself and its rank call). Beside
``sides``, not below it: what it computes is what the training *means*, which no engine decides.
"""
