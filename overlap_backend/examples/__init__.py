"""Programs built on the backend's public API: the demo (``python -m overlap_backend.examples.demo``),
a training loop and a serving loop over the reference models."""
