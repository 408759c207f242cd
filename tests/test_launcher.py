"""``codegen.launcher``: inside ``preloading()`` a launch compiles and loads the kernel variant
(Triton's ``warmup`` + ``_init_handles``) and launches nothing; outside it launches."""

from overlap_backend.codegen import launcher


class FakeKernel:
    def __init__(self):
        self.calls = []

    def warmup(self, *args, grid, **kwargs):
        self.calls.append(("warmup", grid, args, kwargs))
        kernel = self

        class Compiled:
            def _init_handles(self):
                kernel.calls.append(("load",))

        return Compiled()

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append(("launch", grid, args, kwargs))


def test_preloading_compiles_and_loads_without_launching(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    k = FakeKernel()
    with launcher.preloading():
        launcher.launch(k, (4,), 1, 2, BM=64)
        with launcher.preloading():  # nested: still preloading, and restored on exit
            launcher.launch(k, (4,), 3)
        launcher.launch(k, (4,), 32)
    assert [c[0] for c in k.calls] == ["warmup", "load", "warmup", "load", "warmup", "load"]
    assert k.calls[0] == ("warmup", (4,), (1, 2), {"BM": 64})
    launcher.launch(k, (2,), 7, BM=32)
    assert k.calls[-1] == ("launch", (2,), (7,), {"BM": 32})


def test_preloading_is_a_no_op_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    k = FakeKernel()
    with launcher.preloading():
        launcher.launch(k, (4,), 1)
    assert k.calls == []
    launcher.launch(k, (1,), 2)
    assert k.calls == [("launch", (1,), (2,), {})]


class FakeTensor:
    def __init__(self, ptr, dtype="bf16"):
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self):
        return self.ptr


def test_a_preloaded_variant_is_not_preloaded_again(monkeypatch):
    """Preloading costs a launch's host time: once per variant, classified at least as finely as
    Triton specialises (pointer dtype and 16-byte alignment, ints 0 / 1 / multiples of 16 / 64-bit,
    constexprs)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(launcher, "_preloaded", set())
    k = FakeKernel()

    def preload(*args, **kwargs):
        n = len(k.calls)
        with launcher.preloading():
            launcher.launch(k, (4,), *args, **kwargs)
        return [c[0] for c in k.calls[n:]]

    assert preload(FakeTensor(4096), 7, BM=64) == ["warmup", "load"]
    assert preload(FakeTensor(8192), 9, BM=64) == []  # same classes: another address, another odd int
    assert preload(FakeTensor(4104), 7, BM=64) == ["warmup", "load"]  # 8-byte aligned only
    assert preload(FakeTensor(4096, "fp16"), 7, BM=64) == ["warmup", "load"]
    assert preload(FakeTensor(4096), 1, BM=64) == ["warmup", "load"]  # Triton specialises 1
    assert preload(FakeTensor(4096), 48, BM=64) == ["warmup", "load"]  # ... and multiples of 16
    assert preload(FakeTensor(4096), 2**33, BM=64) == ["warmup", "load"]  # ... and 64-bit ints
    assert preload(FakeTensor(4096), 7, BM=128) == ["warmup", "load"]  # constexprs
    assert preload(FakeTensor(4096), None, BM=64) == ["warmup", "load"]
    assert preload(FakeTensor(4096), 7, BM=64) == []
