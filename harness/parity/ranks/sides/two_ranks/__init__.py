"""What the reference may do because its group is two ranks (rank side): sum in any order
(``order_free``: two addends, ``a + b`` is ``b + a``) and, on one host, exchange its large tensors
through memory the two share (``shared_pair``), each with the bits of the candidate's own
collectives.
"""
