"""Full (unsharded) tensors of a sharded run, as the record carries them (rank side): FSDP2's
DTensors and FSDP1's flat parameters gathered whole (``gather``, ``flat``), and the candidate's
tensors that equal the reference's sent once (``reuse``).
"""
