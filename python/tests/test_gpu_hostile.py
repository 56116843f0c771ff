"""No Python call sequence may crash the interpreter, on a GPU (the part test_vulkan_hostile.py
cannot reach without CUDA): ``RawMemory`` on a thread with no current CUDA context raises an
error that names vkgdr 0.1's rule and the ways to satisfy it (and those ways work); a bare int
is refused as a stream by every call that takes one (``free(after=12345)`` crashed the process
inside the driver), while a real stream's handle passes as ``vkgdr.RawStream``; and the objects
only a GPU makes refuse copies and pickles as every other does."""

import copy
import gc
import pickle
from typing import Any, Callable, List

import numpy as np
import pytest

import vkgdr
from conftest import run_in_thread

NO_CONTEXT_START = (
    "RawMemory needs a current CUDA context on the calling thread (vkgdr 0.1's rule: the memory "
    "is allocated in that context), and this thread has none. Make one current first"
)
NO_CONTEXT_END = ". cuCtxGetDevice failed (CUDA_ERROR_INVALID_CONTEXT)"


# --- A thread with no current context ----------------------------------------------------------


@pytest.mark.parametrize("opened", ["device", "current-context"])
def test_raw_memory_on_a_thread_without_a_context_says_what_is_missing(cupy, opened) -> None:
    # vkgdr 0.1's rule holds for both kinds of handle: the calling thread's context is used.
    g = vkgdr.Vkgdr(0) if opened == "device" else vkgdr.Vkgdr.open_current_context()
    with pytest.raises(vkgdr.VkgdrError) as e:
        run_in_thread(lambda: vkgdr.RawMemory(g, 65536))
    assert type(e.value) is vkgdr.VkgdrError, "vkgdr 0.1's class, not a subclass"
    text = str(e.value)
    assert text.startswith(NO_CONTEXT_START), text
    for fix in ("cupy.cuda.runtime.setDevice(n)", "torch.cuda.synchronize(n)", "ctx.push()"):
        assert fix in text, fix
    assert "allocate from a vkgdr.Pool(vkgdr.Vkgdr(n)), which needs none" in text
    assert text.endswith(NO_CONTEXT_END), text
    assert e.value.call == "cuCtxGetDevice"
    assert e.value.result_name == "CUDA_ERROR_INVALID_CONTEXT"
    assert g.pending_releases() == 0


def test_the_fixes_the_message_names_work(cuda, cupy) -> None:
    g = vkgdr.Vkgdr(0)
    primary = cuda.ctx_get_current()  # the cupy fixture made device 0's primary one current
    assert primary is not None

    def allocate_after(make_current: Callable[[], None], undo: Callable[[], Any] = lambda: None):
        def body() -> int:
            assert cuda.ctx_get_current() is None, "a fresh thread has no context"
            make_current()
            try:
                mem = vkgdr.RawMemory(g, 65536)
                np.asarray(mem).view(np.uint8)[:] = 1
                size = len(mem)
                mem.free()
                return size
            finally:
                undo()

        assert run_in_thread(body) == 65536

    allocate_after(lambda: cupy.cuda.runtime.setDevice(0))
    allocate_after(lambda: cuda.ctx_push(primary), cuda.ctx_pop)  # what PyCUDA's ctx.push() does

    def pool_without_a_context() -> int:
        assert cuda.ctx_get_current() is None
        pool = vkgdr.Pool(vkgdr.Vkgdr(0))
        block = pool.alloc(64)
        block.view(np.uint8)[:] = 2
        size = len(block)
        block.free()
        return size

    assert run_in_thread(pool_without_a_context) == 64
    torch = pytest.importorskip("torch")
    allocate_after(lambda: torch.cuda.synchronize(0))
    assert g.wait_for_releases(10)


# --- Streams -------------------------------------------------------------------------------------


def assert_bare_int_refused(call: Callable[[], Any], param: str, value: int) -> None:
    with pytest.raises(TypeError) as e:
        call()
    assert type(e.value) is TypeError
    text = str(e.value)
    assert text.startswith(f"{param} takes a CUDA stream object, not the int {value}:"), text
    assert "vkgdr.RawStream(handle)" in text


def test_a_bare_int_is_refused_and_a_raw_stream_works_for_raw_memory(cupy) -> None:
    g = vkgdr.Vkgdr.open_current_context()
    stream = cupy.cuda.Stream(non_blocking=True)
    mem = vkgdr.RawMemory(g, 65536)
    for value in (12345, 0, stream.ptr):  # no int passes, not even one that names a stream
        assert_bare_int_refused(lambda v=value: mem.free(after=v), "free(after=...)", value)
    assert not mem.is_freed
    np.asarray(mem).view(np.uint8)[:] = 3  # still usable
    mem.free(after=vkgdr.RawStream(stream.ptr))  # the handle of a live stream, explicitly
    assert mem.is_freed
    stream.synchronize()
    assert g.wait_for_releases(10)


def test_a_bare_int_is_refused_and_a_raw_stream_works_for_a_block(cupy) -> None:
    g = vkgdr.Vkgdr(0)
    pool = vkgdr.Pool(g, thread_cache=0)
    stream = cupy.cuda.Stream(non_blocking=True)
    block = pool.alloc(64)
    # The reviewer's call: it killed the process with SIGSEGV inside the CUDA driver.
    assert_bare_int_refused(lambda: block.free(after=12345), "free(after=...)", 12345)
    assert_bare_int_refused(lambda: block.free(after=0), "free(after=...)", 0)
    assert not block.is_freed and pool.stats()["bytes_in_use"] == 64
    block.free(after=vkgdr.RawStream(stream.ptr))
    stream.synchronize()
    assert g.wait_for_releases(10)
    assert pool.stats()["bytes_in_use"] == 0


def test_a_bare_int_is_refused_and_a_raw_stream_works_for_a_ring_consumer(cupy) -> None:
    g = vkgdr.Vkgdr(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    ring = vkgdr.DeviceRing(g, 64 << 10)
    for value in (12345, 0):
        watch = lambda v=value: ring.watch_consumer(v)  # noqa: E731
        assert_bare_int_refused(watch, "watch_consumer(stream)", value)
    # No consumer runs: the event recorded on the stream completes at once, as if it had exited.
    ring.watch_consumer(vkgdr.RawStream(stream.ptr))
    stream.synchronize()
    del ring
    gc.collect()
    assert g.wait_for_releases(10)


# --- Copies and pickles --------------------------------------------------------------------------


def assert_uncopyable(obj: Any, name: str) -> None:
    expected = f"cannot copy or pickle a {name}: it is a handle to GPU memory or driver state"
    attempts: List[Callable[[], Any]] = [
        lambda: copy.copy(obj),
        lambda: copy.deepcopy(obj),
        lambda: pickle.dumps(obj),
        lambda: pickle.dumps(obj, protocol=0),
    ]
    for attempt in attempts:
        with pytest.raises(TypeError) as e:
            attempt()
        assert type(e.value) is TypeError
        assert str(e.value).startswith(expected), str(e.value)


def test_gpu_objects_refuse_copies_and_pickles(cupy) -> None:
    g = vkgdr.Vkgdr.open_current_context()
    mem = vkgdr.RawMemory(g, 65536)
    ring = vkgdr.DeviceRing(g, 64 << 10)
    producer = ring.producer()
    for obj, name in [
        (g, "vkgdr.Vkgdr"),
        (g._impl, "vkgdr._vkgdr._Vkgdr"),
        (mem, "vkgdr.RawMemory"),  # copy.copy gave a second RawMemory over the same allocation
        (mem._impl, "vkgdr._vkgdr._RawMemory"),
        (ring, "vkgdr.DeviceRing"),
        (ring.device_view, "vkgdr.RingDeviceView"),
        (producer, "vkgdr.RingProducer"),
    ]:
        assert_uncopyable(obj, name)
    # Nothing was duplicated: the memory is still usable and goes back once.
    np.asarray(mem).view(np.uint8)[:] = 4
    mem.free()
    producer.close()
    del producer, ring
    gc.collect()
    assert g.wait_for_releases(10)
    assert g.pending_releases() == 0
