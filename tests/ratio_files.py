"""A kernel-ratio file of a test's own (``spec/kernel_ratios.py``), read as the file of a GPU named ``GPU``."""

from __future__ import annotations

import json

import pytest

from overlap_backend.spec import kernel_ratios, knobs

GPU = "Test GPU 80GB"


def entry(kernel, ws, M, K, N, ratio, fused=False, gpu=GPU, dtype="bfloat16") -> dict:
    return {"gpu": gpu, "kernel": kernel, "dtype": dtype, "ws": ws, "M": M, "K": K, "N": N, "fused": fused,
            "ratio": ratio}


@pytest.fixture
def ratios(tmp_path, monkeypatch):
    """The file and this GPU's name; yields a function that writes the entries."""
    path = tmp_path / "kernel_ratios.json"
    monkeypatch.setattr(kernel_ratios, "gpu_name", lambda: GPU)

    def write(*entries):
        path.write_text(json.dumps(kernel_ratios.document(list(entries))))
        kernel_ratios.forget()  # the file changed under the same knobs

    with knobs.symm.patch(KERNEL_RATIOS_FILE=str(path)):
        yield write
