"""Reference models, written the way users write them: what the demo, the examples, the tests and the
benchmarks compile. They use the backend's public API only; nothing in the backend imports them.

- :mod:`.tp`: tensor-/sequence-parallel blocks (functional collectives, c10d, DTensor).
- :mod:`.moe`: an expert-parallel MoE layer (capacity and dropless routing, three expert forms).
- :mod:`.llama`, :mod:`.mixtral`: Llama-style and Mixtral-style decoders.
"""

from .tp import TPBlock, TPMlpAllReduce, TPSwiGLUMlp, build_dtensor_block

__all__ = ["TPBlock", "TPMlpAllReduce", "TPSwiGLUMlp", "build_dtensor_block"]
