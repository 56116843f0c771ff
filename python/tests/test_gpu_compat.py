"""vkgdr 0.1's own tests, on a GPU: its flow for the three flag settings on the primary context
(CuPy's) and on a ``cuCtxCreate`` context (what PyCUDA's ``make_default_context`` makes), its three
error cases with their result names, explicit frees, and ``vkgdr.pycuda.Memory`` on a stand-in
PyCUDA whose contexts are real driver contexts."""

import concurrent.futures
import gc

import numpy as np
import pytest

import vkgdr
from conftest import double_kernel, driver_double_kernel, import_pycuda_shim, run_in_thread

FLAGS = [0, vkgdr.OpenFlags.REQUIRE_COHERENT_BIT, vkgdr.OpenFlags.FORCE_NON_COHERENT_BIT]
FLAG_IDS = ["default", "require-coherent", "force-non-coherent"]


def release(cuda, ctx: int) -> None:
    """Pops ``ctx`` if it is current, then destroys it."""
    if cuda.ctx_get_current() == ctx:
        cuda.ctx_pop()
    cuda.ctx_destroy(ctx)


def basic_flow(make_memory, flags: int, launch_double, synchronize) -> None:
    """vkgdr 0.1's test_basic: host write through NumPy, flush, a kernel doubles the bytes,
    invalidate, compare."""
    n = 4097
    g = vkgdr.Vkgdr.open_current_context(flags)
    mem = make_memory(g, n)
    try:
        basic_checks(mem, n, flags, launch_double, synchronize)
    finally:
        mem.free()  # before the caller destroys its context, even when a check failed
    mem.free()  # safe twice
    with pytest.raises(vkgdr.VkgdrError, match="freed"):
        mem.device_ptr


def basic_checks(mem, n: int, flags: int, launch_double, synchronize) -> None:
    assert len(mem) == n
    if flags == vkgdr.OpenFlags.FORCE_NON_COHERENT_BIT:
        assert not mem.is_coherent
        assert mem.non_coherent_atom_size > 1
    elif flags == vkgdr.OpenFlags.REQUIRE_COHERENT_BIT:
        assert mem.is_coherent
        assert mem.non_coherent_atom_size == 1
    assert mem.non_coherent_atom_size > 0

    array = np.asarray(mem).view(np.uint8)
    assert array.shape == (n,)
    in_data = np.random.default_rng(seed=1).integers(1, 128, (n,), np.uint8)
    array[:] = in_data
    mem.flush(0, n)
    launch_double(mem.device_ptr, n)
    synchronize()
    mem.invalidate(0, n)
    np.testing.assert_array_equal(in_data * 2, array)


@pytest.mark.parametrize("flags", FLAGS, ids=FLAG_IDS)
def test_basic_primary_context(cupy, flags) -> None:
    basic_flow(
        vkgdr.RawMemory,
        flags,
        double_kernel(cupy, "primary"),
        cupy.cuda.runtime.deviceSynchronize,
    )


@pytest.mark.parametrize("flags", FLAGS, ids=FLAG_IDS)
def test_basic_created_context(cuda, cupy, flags) -> None:
    def body() -> None:
        ctx = cuda.ctx_create(0)
        try:
            assert cuda.ctx_get_current() == ctx
            with driver_double_kernel(cuda) as launch_double:
                basic_flow(vkgdr.RawMemory, flags, launch_double, cuda.ctx_synchronize)
            assert cuda.ctx_get_current() == ctx
        finally:
            release(cuda, ctx)

    run_in_thread(body)


def test_memory_is_usable_through_the_cuda_array_interface(cupy) -> None:
    g = vkgdr.Vkgdr.open_current_context()
    mem = vkgdr.RawMemory(g, 1000)
    np.asarray(mem).view(np.uint8)[:] = 21
    mem.flush(0, 1000)
    d = cupy.asarray(mem)
    assert d.data.ptr == mem.device_ptr and d.dtype == np.uint8 and d.shape == (1000,)
    d *= 2
    cupy.cuda.runtime.deviceSynchronize()
    assert np.all(np.asarray(mem).view(np.uint8) == 42)
    mem.free()


def test_open_invalid_device(cuda) -> None:
    with pytest.raises(vkgdr.VkgdrError, match="CUDA_ERROR_INVALID_DEVICE") as e:
        vkgdr.Vkgdr(-1)
    assert str(e.value) == "cuDeviceGetUuid failed (CUDA_ERROR_INVALID_DEVICE)"
    assert e.value.result_name == "CUDA_ERROR_INVALID_DEVICE"


def test_no_current_context(cuda) -> None:
    # A fresh thread has no current context.
    with pytest.raises(vkgdr.VkgdrError, match="CUDA_ERROR_INVALID_CONTEXT"):
        run_in_thread(vkgdr.Vkgdr.open_current_context)


def test_out_of_memory(cupy) -> None:
    g = vkgdr.Vkgdr.open_current_context()
    with pytest.raises(vkgdr.VkgdrError, match="VK_ERROR_OUT_OF_DEVICE_MEMORY") as e:
        vkgdr.RawMemory(g, 10**15)
    assert isinstance(e.value, vkgdr.OutOfDeviceMemoryError)


def test_alloc_without_context(cupy) -> None:
    g = vkgdr.Vkgdr.open_current_context()
    with pytest.raises(vkgdr.VkgdrError, match="CUDA_ERROR_INVALID_CONTEXT"):
        run_in_thread(lambda: vkgdr.RawMemory(g, 123))


def test_explicit_free_and_flags_must_be_zero(cupy) -> None:
    g = vkgdr.Vkgdr.open_current_context()
    mem = vkgdr.RawMemory(g, 4097)
    mem.free()
    with pytest.raises(vkgdr.InvalidArgumentError, match="flags must be 0"):
        vkgdr.RawMemory(g, 16, 1)


def test_open_by_device_creates_no_context(cuda, cupy) -> None:
    """vkgdr 0.1's Vkgdr(device) makes no context; RawMemory goes into the current one."""

    def body() -> int:
        g = vkgdr.Vkgdr(0)
        assert cuda.ctx_get_current() is None
        assert g.device == 0 and len(g.uuid) == 16 and g.name
        ctx = cuda.ctx_create(0)
        try:
            mem = vkgdr.RawMemory(g, 64)
            np.asarray(mem).view(np.uint8)[:] = 1
            mem.free()
        finally:
            release(cuda, ctx)
        return 0

    run_in_thread(body)


def test_memory_freed_from_another_thread_pushes_its_context(cuda, cupy) -> None:
    """RawMemory remembers its (created) context and frees itself in it from any thread."""
    ctx = run_in_thread(lambda: cuda.ctx_create(0))
    try:

        def alloc():
            cuda.ctx_push(ctx)
            try:
                g = vkgdr.Vkgdr.open_current_context()
                return g, vkgdr.RawMemory(g, 4096)
            finally:
                cuda.ctx_pop()

        g, mem = run_in_thread(alloc)
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            ex.submit(mem.free).result()  # no context current on that thread
        del g
    finally:
        cuda.ctx_destroy(ctx)


class DriverContext:
    """Stands in for pycuda.driver.Context over a real driver context."""

    cuda = None

    def __init__(self, handle: int) -> None:
        self.handle = handle

    @classmethod
    def get_current(cls):
        h = cls.cuda.ctx_get_current()
        return cls(h) if h else None

    def push(self) -> None:
        self.cuda.ctx_push(self.handle)

    @staticmethod
    def pop() -> None:
        DriverContext.cuda.ctx_pop()


@pytest.fixture()
def pycuda_stand_in(cuda, monkeypatch):
    """vkgdr.pycuda imported against a stand-in pycuda.driver whose contexts are real ones."""
    DriverContext.cuda = cuda
    return import_pycuda_shim(monkeypatch, DriverContext)


@pytest.mark.parametrize("flags", FLAGS, ids=FLAG_IDS)
def test_pycuda_memory_on_a_created_context(cuda, cupy, pycuda_stand_in, flags) -> None:
    def body() -> None:
        ctx = cuda.ctx_create(0)
        try:
            with driver_double_kernel(cuda) as launch_double:
                basic_flow(pycuda_stand_in.Memory, flags, launch_double, cuda.ctx_synchronize)
            g = vkgdr.Vkgdr.open_current_context()
            mem = pycuda_stand_in.Memory(g, 100)
            assert mem.get_pointer() == mem.device_ptr
            cuda.ctx_pop()  # free() pushes the memory's own context
            assert cuda.ctx_get_current() is None
            mem.free()
            assert cuda.ctx_get_current() is None
            cuda.ctx_push(ctx)
            with pytest.raises(vkgdr.VkgdrError, match="VK_ERROR_OUT_OF_DEVICE_MEMORY"):
                pycuda_stand_in.Memory(g, 10**15)
        finally:
            release(cuda, ctx)

    run_in_thread(body)


# --- free() never hands back memory a view still uses --------------------------------------


def test_a_numpy_view_keeps_freed_memory_until_it_is_gone(cupy) -> None:
    """vkgdr 0.1 crashes on ``a = np.asarray(mem); mem.free(); a[0] = 1``: here the memory waits
    for the view (and VRAM shows it)."""
    g = vkgdr.Vkgdr.open_current_context()
    size = 64 << 20
    mem = vkgdr.RawMemory(g, size)
    view = np.asarray(mem).view(np.uint8)
    view[:] = 5
    mem.free()
    assert mem.is_freed and "views" in repr(mem)
    with pytest.raises(vkgdr.VkgdrError, match="freed"):
        mem.device_ptr
    with pytest.raises(vkgdr.VkgdrError, match="freed"):
        np.asarray(mem)
    view[0] = 1  # the memory is still the allocation's: no crash, no one else's bytes
    assert view[0] == 1 and view[size - 1] == 5
    held = cupy.cuda.runtime.memGetInfo()[0]
    del view, mem
    gc.collect()
    assert g.wait_for_releases(10)
    freed = cupy.cuda.runtime.memGetInfo()[0]
    assert freed - held >= size // 2, f"the memory went back with its view: {held} -> {freed}"


def test_a_cupy_array_keeps_freed_memory_and_kernels_on_it_work(cupy) -> None:
    import vkgdr.cupy as vcp

    g = vkgdr.Vkgdr.open_current_context()
    mem = vkgdr.RawMemory(g, 4096)
    np.asarray(mem).view(np.uint8)[:] = 21
    mem.flush(0, 4096)
    d = cupy.asarray(mem)  # through the CUDA array interface: the array holds `mem`
    typed = vcp.asarray(mem, np.uint32)
    mem.free()
    assert mem.is_freed
    d *= 2  # a kernel on memory freed while the array lives: still the allocation's
    cupy.cuda.runtime.deviceSynchronize()
    assert int(d.sum()) == 42 * 4096
    assert int(typed[0]) == 0x2A2A2A2A
    del d, typed, mem
    gc.collect()
    assert g.wait_for_releases(10)


def test_free_without_views_is_at_once_every_way(cupy) -> None:
    g = vkgdr.Vkgdr.open_current_context()
    stream = cupy.cuda.Stream(non_blocking=True)
    for how in ({}, {"now": True}, {"after": stream}, {"after": stream.ptr}, {"after": 0}):
        mem = vkgdr.RawMemory(g, 2 << 20)  # mapped on its own
        np.asarray(mem).view(np.uint8)[:] = 1  # exported, but the array is gone
        small = vkgdr.RawMemory(g, 1000)  # carved from a shared granule
        small.free(**how)
        mem.free(**how)
        assert mem.is_freed and repr(mem).endswith("freed>"), how
    stream.synchronize()
    assert g.wait_for_releases(10)
    with pytest.raises(vkgdr.InvalidArgumentError, match="not both"):
        vkgdr.RawMemory(g, 64).free(after=stream, now=True)
    with pytest.raises(vkgdr.InvalidArgumentError, match="expected a CUDA stream"):
        vkgdr.RawMemory(g, 64).free(after="default")
    torch = pytest.importorskip("torch")
    torch_stream = torch.cuda.Stream()
    assert torch_stream.cuda_stream != 0
    mem = vkgdr.RawMemory(g, 4096)
    mem.free(after=torch_stream)  # a PyTorch stream (.cuda_stream)
    torch_stream.synchronize()
    assert g.wait_for_releases(10)


def test_pycuda_memory_with_a_view_is_released_when_the_view_goes(cuda, cupy, pycuda_stand_in):
    def body() -> None:
        ctx = cuda.ctx_create(0)
        try:
            g = vkgdr.Vkgdr.open_current_context()
            mem = pycuda_stand_in.Memory(g, 4096)
            view = np.asarray(mem).view(np.uint8)  # its base is the Memory object
            view[:] = 3
            mem.flush(0, 4096)
            ptr = mem.get_pointer()
            mem.free()
            with pytest.raises(vkgdr.VkgdrError, match="freed"):
                mem.get_pointer()
            with driver_double_kernel(cuda) as launch_double:
                launch_double(ptr, 4096)  # the view still holds the memory
                cuda.ctx_synchronize()
            assert np.all(view == 6)
            cuda.ctx_pop()
            del view, mem  # released now, with its context pushed by the wrapper
            gc.collect()
            assert cuda.ctx_get_current() is None
            cuda.ctx_push(ctx)
            assert g.wait_for_releases(10)
        finally:
            release(cuda, ctx)

    run_in_thread(body)
