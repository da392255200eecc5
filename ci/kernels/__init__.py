"""The kernel-family tier: the parity matrix must give the same verdicts whatever CPU kernels run.

Why: machines of one kind differ in CPU, and ATen, MKL and oneDNN pick their kernels by the CPU's
instruction set. A kernel for another ISA (or for another shape) may round the last bit
differently, so a bitwise claim measured on one machine can be false on the next. Any machine can
run *below* its own ISA, so this tier re-runs the matrix under every lower kernel family the
machine reaches and asks that each configuration gets the same verdict under all of them (and
that none fails). ``settings`` says which families there are, ``verdicts`` compares the reports
(pure), ``__main__`` (``make kernels``) runs ``python -m harness.parity`` once per family.
"""
