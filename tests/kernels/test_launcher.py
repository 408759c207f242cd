"""``codegen.launcher``: inside ``preloading()`` a launch compiles and loads the kernel variant
(Triton's ``warmup`` + ``_init_handles``) and launches nothing; outside it launches."""

import pytest

from overlap_backend.codegen import launcher
from overlap_backend.spec import knobs


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


class FakeJitKernel:
    """What the fast path reads of a Triton ``JITFunction``: ``params`` and ``signature``; ``kernel[grid]``
    returns a compiled kernel whose ``run`` (the launcher) records its arguments."""

    def __init__(self):
        import inspect

        def fn(x_ptr, n, flag_ptr, epoch, BM: "tl.constexpr" = 64, HAS_B: "tl.constexpr" = False):  # noqa: F821
            pass

        self.signature = inspect.signature(fn)
        self.params = [type("P", (), {"name": n})() for n in self.signature.parameters]
        self.slow, self.fast = [], []
        kernel = self

        class Compiled:
            function, packed_metadata = "fn-handle", "meta"

            def run(self, *a):
                kernel.fast.append(a)

        self.compiled = Compiled()

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.slow.append((grid, args, kwargs)) or self.compiled


@pytest.fixture
def fast_path(monkeypatch):
    """The fast path on, as on a GPU without profiler hooks: stream 1234, no variant seen yet."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(launcher, "_current_stream", lambda: 1234)
    monkeypatch.setattr(launcher, "_launch_hooks", lambda: False)
    monkeypatch.setattr(launcher, "_fast_launches", {})
    return monkeypatch


def test_fast_launch_calls_the_compiled_launcher_with_every_parameter_in_order(fast_path):
    k = FakeJitKernel()
    x = __import__("torch").zeros(8)
    launcher.launch(k, (4,), x, 7, x, 3, HAS_B=True, num_warps=8)  # first: Triton's path
    assert len(k.slow) == 1 and not k.fast
    launcher.launch(k, (6, 2), x, 9, x, 5, HAS_B=True, num_warps=8)  # same variant: the launcher directly
    assert len(k.slow) == 1
    assert k.fast == [(6, 2, 1, 1234, "fn-handle", "meta", None, None, None, x, 9, x, 5, 64, True)]
    launcher.launch(k, (4,), x, 1, x, 5, HAS_B=True, num_warps=8)  # n == 1: Triton specialises it, a new variant
    launcher.launch(k, (4,), x, 9, x, 5, HAS_B=True, num_warps=4)  # another compile option: a new variant
    launcher.launch(k, (4,), x, 9, x, 5, HAS_B=False, num_warps=8)  # another constexpr: a new variant
    assert len(k.slow) == 4 and len(k.fast) == 1
    with knobs.codegen.patch(FAST_LAUNCH=False):
        launcher.launch(k, (4,), x, 9, x, 5, HAS_B=True, num_warps=8)
    assert len(k.slow) == 5 and len(k.fast) == 1


def test_fast_launch_falls_back_where_triton_differs(fast_path):
    monkeypatch = fast_path
    k = FakeJitKernel()
    del type(k.compiled).packed_metadata  # another Triton: no fast path, Triton's launch every time
    for n in (7, 9):
        launcher.launch(k, (4,), None, n, None, 3)
    assert len(k.slow) == 2 and not k.fast
    monkeypatch.setattr(launcher, "_launch_hooks", lambda: True)  # a profiler's launch hooks: Triton's path
    k2 = FakeJitKernel()
    for n in (7, 9):
        launcher.launch(k2, (4,), None, n, None, 3)
    assert len(k2.slow) == 2 and not k2.fast


def test_launch_hooks_are_unset_until_a_profiler_adds_one():
    """Triton's launch hooks: an empty hook chain (Triton >= 3.5) or None (older) counts as unset."""
    from triton import knobs

    assert not launcher._launch_hooks()
    hook = knobs.runtime.launch_enter_hook
    if hasattr(hook, "add"):
        f = lambda *a: None  # noqa: E731
        hook.add(f)
        try:
            assert launcher._launch_hooks()
        finally:
            hook.remove(f)
        assert not launcher._launch_hooks()


HOPPER = type("Props", (), {"shared_memory_per_multiprocessor": 233472, "regs_per_multiprocessor": 65536,
                            "max_threads_per_multi_processor": 2048})()


@pytest.mark.parametrize("shared,regs,warps,expect", [
    (160 * 1024, 168, 8, 1),   # a 3-stage 128x256 tile with its TMA store buffer: one per SM
    (97 * 1024, 168, 4, 2),    # a 2-stage 128x128 tile: two fit by shared memory and by registers
    (48 * 1024, 255, 8, 1),    # 255 registers x 256 threads take all 64 Ki registers
    (48 * 1024, 128, 4, 4),    # shared memory: 233472 // (48 KiB + 1 KiB) = 4
    (0, 32, 4, 16),            # threads: 2048 // 128
    (300 * 1024, 32, 4, 1),    # more than an SM has: still one (the launch would fail, not the grid)
])
def test_resident_per_sm_counts_shared_memory_registers_and_threads(shared, regs, warps, expect):
    assert launcher.resident_per_sm(shared, regs, warps, HOPPER) == expect


def test_a_persistent_grid_holds_as_many_ctas_as_the_sms_do(monkeypatch):
    """``Persistent(tiles, sms, per_sm)``: min(tiles, sms x min(per_sm, resident CTAs of the compiled variant));
    the variant is compiled and measured once, and per_sm 1 compiles nothing up front."""
    import torch

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(launcher, "_launch_hooks", lambda: True)  # Triton's own launch path (records the grid)
    monkeypatch.setattr(launcher, "_resident_cache", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: HOPPER)
    k = FakeKernel()

    class Compiled:
        n_regs = 128
        metadata = type("M", (), {"shared": 48 * 1024, "num_warps": 4})()

        def _init_handles(self):
            k.calls.append(("load",))

    k.warmup = lambda *args, grid, **kwargs: k.calls.append(("warmup", grid)) or Compiled()

    def grid_of(p, BM=64):
        launcher.launch(k, p, FakeTensor(4096), 7, BM=BM)
        return k.calls[-1][1]

    assert grid_of(launcher.Persistent(1000, 10)) == (10,) and k.calls[0][0] == "launch"  # per_sm 1: nothing compiled
    assert grid_of(launcher.Persistent(5, 10, 1)) == (5,)
    assert grid_of(launcher.Persistent(1000, 10, 2)) == (20,)
    assert [c[0] for c in k.calls[-3:]] == ["warmup", "load", "launch"]
    assert grid_of(launcher.Persistent(1000, 10, 8)) == (40,)  # 4 resident (48 KiB each): the cap
    assert grid_of(launcher.Persistent(25, 10, 8)) == (25,)
    assert sum(c[0] == "warmup" for c in k.calls) == 1, "measured once per variant"
    assert grid_of(launcher.Persistent(1000, 10, 8), BM=128) == (40,)  # another variant: measured again
    assert sum(c[0] == "warmup" for c in k.calls) == 2
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert grid_of(launcher.Persistent(1000, 10, 8)) == (10,)  # the interpreter runs one program per SM
