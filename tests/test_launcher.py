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
        launcher.launch(k, (4,), 5)
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
