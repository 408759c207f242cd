"""Contracts shared by several layers, defined once, below every module that uses them: the on-disk
cache root, the tunables (:mod:`.knobs`) and the layouts the kernels and the runtime must agree on."""
