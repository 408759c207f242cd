"""The few CUDA driver/runtime calls the ``symm`` lowering makes, through cuda-python.

Imported lazily: machines without cuda-python (the CPU CI) never load it. Every call checks its
status and raises :class:`CudaError` naming the call. Pointers are plain ``int`` device addresses;
streams are ``torch.cuda.Stream`` objects (their ``cuda_stream`` handle is passed on).
"""

from __future__ import annotations

import ctypes
from functools import cache

import torch


class CudaError(RuntimeError):
    """A CUDA call made by the symm runtime failed."""


@cache
def _bindings():
    """(driver, runtime) modules: cuda-bindings >= 12.6 layout first, then the older cuda-python one."""
    try:
        from cuda.bindings import driver, runtime
    except ImportError:
        from cuda import cuda as driver, cudart as runtime  # type: ignore[no-redef]
    return driver, runtime


def import_error() -> str | None:
    """Why cuda-python cannot be used here (None when it can)."""
    try:
        _bindings()
    except ImportError as e:
        return f"cuda-python is not installed ({e}); pip install 'overlap_backend[cuda]'"
    return None


def _check(name: str, result):
    """Raise on a failed status; return the call's outputs (none, one, or a tuple)."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise CudaError(f"{name} failed: {_error_text(err)}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def _error_text(err) -> str:
    driver, runtime = _bindings()
    try:
        if isinstance(err, runtime.cudaError_t):
            text = runtime.cudaGetErrorString(err)[1]
        else:
            text = driver.cuGetErrorString(err)[1]
        text = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # noqa: BLE001 - the name below is enough
        text = ""
    return f"{getattr(err, 'name', err)} {text}".strip()


_handles: dict[int, object] = {}


def _stream_handle(stream: torch.cuda.Stream):
    # Building the binding's handle object costs more than the call it is for: keep one per stream.
    key = stream.cuda_stream
    handle = _handles.get(key)
    if handle is None:
        driver, _ = _bindings()
        handle = _handles[key] = driver.CUstream(key)
    return handle


# ---------------------------------------------------------------------------------------- memory
def malloc(nbytes: int) -> int:
    """A device allocation of its own (so that an IPC handle names exactly this buffer)."""
    _, runtime = _bindings()
    return int(_check("cudaMalloc", runtime.cudaMalloc(nbytes)))


def free(ptr: int) -> None:
    _, runtime = _bindings()
    _check("cudaFree", runtime.cudaFree(ptr))


def memset(ptr: int, value: int, nbytes: int) -> None:
    _, runtime = _bindings()
    _check("cudaMemset", runtime.cudaMemset(ptr, value, nbytes))


def ipc_handle(ptr: int) -> bytes:
    _, runtime = _bindings()
    handle = _check("cudaIpcGetMemHandle", runtime.cudaIpcGetMemHandle(ptr))
    return bytes(handle.reserved)


def ipc_open(handle: bytes) -> int:
    _, runtime = _bindings()
    h = runtime.cudaIpcMemHandle_t()
    h.reserved = handle
    flags = runtime.cudaIpcMemLazyEnablePeerAccess
    return int(_check("cudaIpcOpenMemHandle", runtime.cudaIpcOpenMemHandle(h, flags)))


def ipc_close(ptr: int) -> None:
    _, runtime = _bindings()
    _check("cudaIpcCloseMemHandle", runtime.cudaIpcCloseMemHandle(ptr))


def host_alloc_mapped(nbytes: int) -> int:
    """Pinned host memory the GPU can write and the host can read without a synchronisation."""
    _, runtime = _bindings()
    ptr = int(_check("cudaHostAlloc", runtime.cudaHostAlloc(nbytes, runtime.cudaHostAllocMapped)))
    ctypes.memset(ptr, 0, nbytes)
    return ptr


def host_free(ptr: int) -> None:
    _, runtime = _bindings()
    _check("cudaFreeHost", runtime.cudaFreeHost(ptr))


def can_access_peer(device: int, peer: int) -> bool:
    _, runtime = _bindings()
    return bool(_check("cudaDeviceCanAccessPeer", runtime.cudaDeviceCanAccessPeer(device, peer)))


# ------------------------------------------------------------------------------- stream operations
@cache
def _fast():
    """ctypes entry points of the three stream operations an op call makes most (one per band and
    peer): through cuda-python each costs several microseconds of host time in argument
    conversion and result wrapping (measured: ~18 per ``ag_mm`` call, a tenth of its host time),
    through ctypes about one. None where libcuda cannot be opened this way (cuda-python then)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    u64, u32, ptr = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_void_p

    def entry(names, argtypes):
        for name in names:  # the _v2 stream memory operations are what cuda.h maps the names to
            f = getattr(lib, name, None)
            if f is not None:
                f.argtypes, f.restype = argtypes, ctypes.c_int
                return name, f
        return None

    calls = (entry(["cuMemcpyAsync"], [u64, u64, ctypes.c_size_t, ptr]),
             entry(["cuStreamWriteValue32_v2", "cuStreamWriteValue32"], [ptr, u64, u32, u32]),
             entry(["cuStreamWaitValue32_v2", "cuStreamWaitValue32"], [ptr, u64, u32, u32]))
    return None if None in calls else calls


@cache
def _fast_more():
    """ctypes entry points of the other per-call operations: event record / stream wait on an event (a
    stream join without torch's Event objects: ~2.4 us for the pair against ~6 us for ``wait_stream`` on an
    H200 host) and the batched stream memory operation. None where libcuda cannot be opened this way."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    u32, ptr = ctypes.c_uint32, ctypes.c_void_p
    names = (("cuEventRecord",), ("cuStreamWaitEvent",), ("cuStreamBatchMemOp_v2", "cuStreamBatchMemOp"))
    types = ([ptr, ptr], [ptr, ptr, u32], [ptr, u32, ptr, u32])
    found = []
    for options, argtypes in zip(names, types):
        f = next((getattr(lib, n) for n in options if getattr(lib, n, None) is not None), None)
        if f is None:
            return None
        f.argtypes, f.restype = argtypes, ctypes.c_int
        found.append((options[0], f))
    return tuple(found)


def fast_path() -> bool:
    """Whether the ctypes entry points of every per-call operation are there (the op plans need them)."""
    return _fast() is not None and _fast_more() is not None


def event_create() -> int:
    """A CUDA event without timing (for stream joins), as a raw handle."""
    driver, _ = _bindings()
    ev = _check("cuEventCreate", driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING))
    return int(ev)


def join(dst: int, src: int, event: int) -> None:
    """Later work on stream ``dst`` waits for the work queued so far on stream ``src`` (raw handles),
    through ``event`` (re-recorded each time: a wait takes the record made before it)."""
    (rname, rec), (wname, wait), _ = _fast_more()
    _fast_check(rname, rec(event, src))
    _fast_check(wname, wait(dst, event, 0))


def wait_event(dst: int, event: int) -> None:
    """Later work on stream ``dst`` waits for ``event``'s last record (made by :func:`join`)."""
    name, wait = _fast_more()[1]
    _fast_check(name, wait(dst, event, 0))


class MemOp(ctypes.Structure):
    """``CUstreamBatchMemOpParams`` (a 48-byte union) as a wait or write of a 32-bit value."""

    _fields_ = [("operation", ctypes.c_uint32), ("_pad0", ctypes.c_uint32), ("address", ctypes.c_uint64),
                ("value", ctypes.c_uint64), ("flags", ctypes.c_uint32), ("_pad1", ctypes.c_uint32),
                ("alias", ctypes.c_uint64), ("_pad2", ctypes.c_uint64)]


assert ctypes.sizeof(MemOp) == 48
MEMOP_WAIT_VALUE_32, MEMOP_WRITE_VALUE_32 = 1, 2  # CUstreamBatchMemOpType


def memops(ops: list[tuple[int, int]]):
    """A reusable batch of stream memory operations: ``ops`` is a list of (kind, address) with kind
    ``MEMOP_WAIT_VALUE_32`` (wait until ``*address >= value``) or ``MEMOP_WRITE_VALUE_32`` (``*address =
    value`` after a memory barrier); the values are set per use (``batch[i].value = v``)."""
    batch = (MemOp * len(ops))()
    for op, (kind, addr) in zip(batch, ops):
        op.operation, op.address = kind, addr
    return batch


def run_memops(stream: int, batch) -> None:
    """Queue ``batch`` (:func:`memops`) on stream ``stream`` (a raw handle) with one driver call."""
    name, f = _fast_more()[2]
    _fast_check(name, f(stream, len(batch), batch, 0))


class RawStream:
    """A CUDA stream known by its raw handle: what the per-call operations need of a ``torch.cuda.Stream``
    (its ``cuda_stream``, ``wait_stream``), without building one per call (~6 us on an H200 host)."""

    __slots__ = ("cuda_stream", "_event")

    def __init__(self, handle: int):
        self.cuda_stream = handle
        self._event = None

    def wait_stream(self, other) -> None:
        if self._event is None:
            self._event = event_create()
        join(self.cuda_stream, other.cuda_stream, self._event)


_raw_streams: dict[int, RawStream] = {}


def current_stream(device_index: int) -> RawStream:
    """The calling thread's current stream on ``device_index`` (one object per stream handle)."""
    handle = torch._C._cuda_getCurrentRawStream(device_index)
    stream = _raw_streams.get(handle)
    if stream is None:
        stream = _raw_streams[handle] = RawStream(handle)
    return stream


_WRITE_VALUE_DEFAULT = 0  # CU_STREAM_WRITE_VALUE_DEFAULT
_WAIT_VALUE_GEQ = 0  # CU_STREAM_WAIT_VALUE_GEQ


def _fast_check(name: str, rc: int) -> None:
    if rc != 0:
        driver, _ = _bindings()
        raise CudaError(f"{name} failed: {_error_text(driver.CUresult(rc))}")


def memcpy_async(dst: int, src: int, nbytes: int, stream: torch.cuda.Stream) -> None:
    """Device-to-device copy (peer addresses included) on ``stream``: the copy engine does it."""
    fast = _fast()
    if fast is not None:
        name, f = fast[0]
        _fast_check(name, f(dst, src, nbytes, stream.cuda_stream))
        return
    driver, _ = _bindings()
    _check("cuMemcpyAsync", driver.cuMemcpyAsync(dst, src, nbytes, _stream_handle(stream)))


def memcpy2d_async(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int,
                   stream: torch.cuda.Stream) -> None:
    """``height`` rows of ``width`` bytes, ``src_pitch`` / ``dst_pitch`` bytes apart, device to device
    (peer addresses included) on ``stream``: the copy engine does it."""
    driver, _ = _bindings()
    p = driver.CUDA_MEMCPY2D()
    p.srcMemoryType = p.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.srcDevice, p.srcPitch, p.dstDevice, p.dstPitch = src, src_pitch, dst, dst_pitch
    p.WidthInBytes, p.Height = width, height
    _check("cuMemcpy2DAsync", driver.cuMemcpy2DAsync(p, _stream_handle(stream)))


def write_value32(addr: int, value: int, stream: torch.cuda.Stream) -> None:
    """``*addr = value`` once all earlier work on ``stream`` is done (with a memory barrier, so the
    data written before is visible to whoever sees the value)."""
    fast = _fast()
    if fast is not None:
        name, f = fast[1]
        _fast_check(name, f(stream.cuda_stream, addr, value, _WRITE_VALUE_DEFAULT))
        return
    driver, _ = _bindings()
    flags = driver.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
    _check("cuStreamWriteValue32", driver.cuStreamWriteValue32(_stream_handle(stream), addr, value, flags))


def make_primary_context_current(device_index: int) -> None:
    """Make ``device_index``'s primary context (the one torch uses) current on the calling thread.
    A thread that never made a runtime call has no current context, and driver calls there fail
    with CUDA_ERROR_INVALID_CONTEXT (the watchdog's thread: ``torch.cuda.device`` does not help when
    the thread's current device already is that index)."""
    driver, _ = _bindings()
    dev = _check("cuDeviceGet", driver.cuDeviceGet(device_index))
    ctx = _check("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(dev))
    _check("cuCtxSetCurrent", driver.cuCtxSetCurrent(ctx))


def stream_create_nonblocking():
    """A stream of our own that never waits for the legacy default stream (for the watchdog: it
    must run while other streams are blocked)."""
    driver, _ = _bindings()
    return _check("cuStreamCreate", driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))


def memset32_async(ptr: int, value: int, count: int, stream) -> None:
    """``count`` int32 words at ``ptr`` = ``value``, on ``stream`` (a handle from
    :func:`stream_create_nonblocking`)."""
    driver, _ = _bindings()
    _check("cuMemsetD32Async", driver.cuMemsetD32Async(ptr, value, count, stream))


def copy_async(dst: int, src: int, nbytes: int, stream) -> None:
    """``nbytes`` from ``src`` to ``dst`` (any memory the device can address, host-mapped included), on
    ``stream`` (a handle from :func:`stream_create_nonblocking`)."""
    driver, _ = _bindings()
    _check("cuMemcpyAsync", driver.cuMemcpyAsync(dst, src, nbytes, stream))


def stream_synchronize(stream) -> None:
    """Wait on the host until ``stream`` (a handle from :func:`stream_create_nonblocking`) is idle."""
    driver, _ = _bindings()
    _check("cuStreamSynchronize", driver.cuStreamSynchronize(stream))


def wait_value32(addr: int, value: int, stream: torch.cuda.Stream) -> None:
    """Later work on ``stream`` waits until ``(int32)(*addr - value) >= 0``."""
    fast = _fast()
    if fast is not None:
        name, f = fast[2]
        _fast_check(name, f(stream.cuda_stream, addr, value, _WAIT_VALUE_GEQ))
        return
    driver, _ = _bindings()
    flags = driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
    _check("cuStreamWaitValue32", driver.cuStreamWaitValue32(_stream_handle(stream), addr, value, flags))


class DevicePointer:
    """What Triton needs to take a raw address as a pointer argument."""

    def __init__(self, ptr: int, dtype: torch.dtype):
        self.ptr = ptr
        self.dtype = dtype

    def data_ptr(self) -> int:
        return self.ptr


class _CudaArray:
    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


def as_tensor(ptr: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor viewing ``nbytes`` at ``ptr`` (not owning it)."""
    return torch.as_tensor(_CudaArray(ptr, nbytes), device=device)
