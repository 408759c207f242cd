"""Triton tile kernels for the ``symm`` lowering (flag-signalling GEMMs) live here.

The ``p2p`` lowering needs no generated code; the kernels arrive with the ``symm`` lowering.
"""
