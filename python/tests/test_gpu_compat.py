"""vkgdr 0.1's own tests, on a GPU: its flow for the three flag settings on the primary context
(CuPy's) and on a ``cuCtxCreate`` context (what PyCUDA's ``make_default_context`` makes), its three
error cases with their result names, explicit frees, and ``vkgdr.pycuda.Memory`` on a stand-in
PyCUDA whose contexts are real driver contexts."""

import concurrent.futures

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
