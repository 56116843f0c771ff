"""vkgdr 0.1's own tests, on a GPU: its flow for the three flag settings on the primary context
(CuPy's) and on a ``cuCtxCreate`` context (what PyCUDA's ``make_default_context`` makes), its three
error cases with their result names, explicit frees, ``vkgdr.pycuda.Memory`` on real PyCUDA (on a
stand-in PyCUDA whose contexts are real driver contexts where PyCUDA cannot be imported, saying
so), a ``GPUArray`` over that memory, and vkgdr 0.1's Python example run as its users run it."""

import concurrent.futures
import gc
import importlib
import os
import pathlib
import shutil
import subprocess
import sys
import warnings
from typing import Any, Optional

import numpy as np
import pytest

import vkgdr
from conftest import (
    KERNELS_DIR,
    REQUIRE_GPU,
    double_kernel,
    driver_double_kernel,
    import_pycuda_shim,
    run_in_thread,
)

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


def test_explicit_free_and_unknown_flags_are_ignored(cupy) -> None:
    """vkgdr 0.1 ignores allocation flags (it defines none) and open-flag bits it does not know."""
    g = vkgdr.Vkgdr.open_current_context()
    mem = vkgdr.RawMemory(g, 4097)
    mem.free()
    for flags in (1, 0x80000000):
        mem = vkgdr.RawMemory(g, 16, flags)
        assert len(mem) == 16
        mem.free()
    for flags in (8, 0xFFFFFFF8):
        assert vkgdr.Vkgdr(0, flags).device == 0
        assert vkgdr.Vkgdr.open_current_context(flags).device == 0


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


# --- Classes derived from Vkgdr and RawMemory, as vkgdr 0.1's plain Python classes allow -----


class TrackedGdr(vkgdr.Vkgdr):
    """A handle class of a program's own with vkgdr 0.1's signature: ``open_current_context``
    makes one of these."""

    opened: list = []

    def __init__(self, device: int, flags: int = 0) -> None:
        super().__init__(device, flags)
        TrackedGdr.opened.append(self)


class NamedGdr(vkgdr.Vkgdr):
    """A handle class whose ``__init__`` takes other arguments."""

    def __init__(self, label: str) -> None:
        self.label = label
        super().__init__(0)


class LabelledMemory(vkgdr.RawMemory):
    """A memory class whose ``__init__`` takes other arguments."""

    def __init__(self, owner: vkgdr.Vkgdr, n: int, label: str) -> None:
        self.label = label
        super().__init__(owner, n)


@pytest.mark.parametrize("flags", FLAGS, ids=FLAG_IDS)
def test_derived_classes_with_their_own_init_work_as_the_base(cupy, flags) -> None:
    """vkgdr 0.1's test_basic with a program's own classes for the handle and the memory, then
    a view keeping freed memory of the derived class, then a pool and a ring owned by derived
    handles."""
    g = TrackedGdr.open_current_context(flags)
    assert type(g) is TrackedGdr and g in TrackedGdr.opened and g.device == 0
    n = 4097
    mem = LabelledMemory(g, n, "gains")
    try:
        assert isinstance(mem, vkgdr.RawMemory) and mem.label == "gains"
        launch_double = double_kernel(cupy, "derived")
        basic_checks(mem, n, flags, launch_double, cupy.cuda.runtime.deviceSynchronize)
    finally:
        mem.free()
    assert mem.is_freed and repr(mem).endswith("freed>")

    size = 64 << 20
    big = LabelledMemory(g, size, "bulk")
    view = np.asarray(big).view(np.uint8)
    view[:] = 5
    big.free()
    assert big.is_freed and "views" in repr(big)
    with pytest.raises(vkgdr.VkgdrError, match="freed"):
        big.device_ptr
    view[0] = 1  # still the allocation's memory
    assert view[0] == 1 and view[size - 1] == 5
    held = cupy.cuda.runtime.memGetInfo()[0]
    del view, big
    gc.collect()
    assert g.wait_for_releases(10)
    g.trim()  # its mapping is kept for the next 64 MiB allocation where the limit allows
    freed = cupy.cuda.runtime.memGetInfo()[0]
    assert freed - held >= size // 2, f"the memory went back with its view: {held} -> {freed}"

    named = NamedGdr("pool owner")
    assert named.label == "pool owner" and named.device == 0 and len(named.uuid) == 16
    for owner in (g, named):
        block = vkgdr.Pool(owner).alloc(4096)
        d = cupy.asarray(block)
        np.asarray(block)[:] = 7
        block.flush()
        assert int(d.sum()) == 7 * 4096
        del d
        block.free()
        ring = vkgdr.DeviceRing(owner, 64 << 10)
        assert ring.capacity == 64 << 10 and ring.device_view.capacity == 64 << 10
        del ring


# --- vkgdr.pycuda: real PyCUDA where it imports, else a stand-in over real contexts ----------


def import_pycuda_driver() -> "tuple[Any, str]":
    """``pycuda.driver`` (initialised), or None and why it cannot be imported here."""
    try:
        import pycuda.driver as driver
    except (ImportError, OSError) as e:  # not installed, or its extension cannot load
        return None, f"import pycuda.driver failed: {e}"
    driver.init()
    return driver, ""


class RealPycuda:
    """vkgdr.pycuda against the installed PyCUDA; contexts made and switched by PyCUDA, whose
    ``Context.get_current()`` knows only the contexts on its own per-thread stack."""

    real = True

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        module = importlib.import_module("vkgdr.pycuda")
        if module.pycuda.driver is not driver:  # imported earlier against another pycuda
            del sys.modules["vkgdr.pycuda"]
            module = importlib.import_module("vkgdr.pycuda")
        assert module.pycuda.driver is driver
        self.module = module

    def create_context(self) -> Any:
        """What vkgdr 0.1's tests and ``pycuda.autoinit`` use: a new context, made current."""
        import pycuda.tools

        return pycuda.tools.make_default_context()

    @staticmethod
    def handle(ctx: Any) -> int:
        return ctx.handle

    def pop(self) -> None:
        self.driver.Context.pop()

    @staticmethod
    def push(ctx: Any) -> None:
        ctx.push()

    def release(self, ctx: Any) -> None:
        """Pops ``ctx`` while it is current, then destroys it. On the thread that made it, which
        PyCUDA requires; a thread ending with contexts on PyCUDA's stack aborts the process."""
        while True:
            current = self.driver.Context.get_current()
            if current is None or current.handle != ctx.handle:
                break
            self.driver.Context.pop()
        ctx.detach()


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


class StandInPycuda:
    """vkgdr.pycuda against a stand-in pycuda.driver whose contexts are real driver contexts,
    made and switched through the driver API."""

    real = False

    def __init__(self, cuda, module: Any) -> None:
        self.cuda = cuda
        self.module = module

    def create_context(self) -> int:
        return self.cuda.ctx_create(0)

    @staticmethod
    def handle(ctx: int) -> int:
        return ctx

    def pop(self) -> None:
        self.cuda.ctx_pop()

    def push(self, ctx: int) -> None:
        self.cuda.ctx_push(ctx)

    def release(self, ctx: int) -> None:
        release(self.cuda, ctx)


@pytest.fixture()
def pycuda_face(cuda, monkeypatch):
    """Real PyCUDA when ``import pycuda.driver`` works; otherwise the stand-in, with a warning
    that says so (pytest's warnings summary names the test)."""
    driver, why = import_pycuda_driver()
    if driver is not None:
        return RealPycuda(driver)
    warnings.warn(
        f"PyCUDA is not importable here ({why}): vkgdr.pycuda runs against a stand-in "
        f"pycuda.driver whose contexts are real driver contexts",
        stacklevel=1,
    )
    DriverContext.cuda = cuda
    return StandInPycuda(cuda, import_pycuda_shim(monkeypatch, DriverContext))


@pytest.fixture()
def real_pycuda(cuda) -> RealPycuda:
    """Real PyCUDA; skips without it (fails with VKGDR_REQUIRE_GPU=1: scripts/gpu-check installs
    it from the bundle, built by scripts/pycuda-wheel)."""
    driver, why = import_pycuda_driver()
    if driver is None:
        if REQUIRE_GPU:
            pytest.fail(f"VKGDR_REQUIRE_GPU=1 but PyCUDA is missing ({why})")
        pytest.skip(f"needs PyCUDA ({why}); no stand-in can run PyCUDA's GPUArray and compiler")
    return RealPycuda(driver)


@pytest.mark.parametrize("flags", FLAGS, ids=FLAG_IDS)
def test_pycuda_memory_on_a_created_context(cuda, cupy, pycuda_face, flags) -> None:
    face = pycuda_face

    def body() -> None:
        ctx = face.create_context()
        try:
            assert cuda.ctx_get_current() == face.handle(ctx)
            with driver_double_kernel(cuda) as launch_double:
                basic_flow(face.module.Memory, flags, launch_double, cuda.ctx_synchronize)
            g = vkgdr.Vkgdr.open_current_context()
            mem = face.module.Memory(g, 100)
            assert isinstance(mem, vkgdr.RawMemory), "vkgdr 0.1's Memory is a RawMemory"
            assert isinstance(mem, face.module.pycuda.driver.PointerHolderBase)
            assert mem.get_pointer() == mem.device_ptr
            face.pop()  # free() pushes the memory's own context
            assert cuda.ctx_get_current() is None
            mem.free()
            assert cuda.ctx_get_current() is None
            face.push(ctx)
            with pytest.raises(vkgdr.VkgdrError, match="VK_ERROR_OUT_OF_DEVICE_MEMORY"):
                face.module.Memory(g, 10**15)
        finally:
            face.release(ctx)

    run_in_thread(body)


def test_pycuda_memory_needs_a_pycuda_context(cuda, real_pycuda) -> None:
    """As in vkgdr 0.1: without a context of PyCUDA's current, ``Memory`` is an error."""

    def body() -> None:
        g = vkgdr.Vkgdr(0)
        with pytest.raises(vkgdr.VkgdrError, match="no current CUDA context"):
            real_pycuda.module.Memory(g, 123)

    run_in_thread(body)


def test_a_gpuarray_over_pycuda_memory_runs_kernels_and_keeps_it(cuda, real_pycuda) -> None:
    """vkgdr 0.1's test_basic with PyCUDA's own launch: the memory as the ``gpudata`` of a
    ``GPUArray`` passed to a kernel, read back through NumPy and by ``GPUArray.get``; then
    ``free()`` while the ``GPUArray`` lives leaves the memory to it until it goes."""
    if KERNELS_DIR is None:
        pytest.fail("kernels/mapping.ptx not found (set VKGDR_KERNELS_DIR)")
    face = real_pycuda
    drv = face.driver
    gpuarray = importlib.import_module("pycuda.gpuarray")
    ptx = (KERNELS_DIR / "mapping.ptx").read_bytes() + b"\0"  # the driver reads PTX to its NUL

    def body() -> None:
        ctx = face.create_context()
        try:
            module = drv.module_from_buffer(ptx)
            double_bytes = module.get_function("double_bytes")  # (uint8 *data, uint32 n)
            g = vkgdr.Vkgdr.open_current_context()
            n = 64 << 20
            mem = face.module.Memory(g, n)
            # Both bases, as in vkgdr 0.1: user code checking either finds it.
            assert isinstance(mem, vkgdr.RawMemory) and isinstance(mem, drv.PointerHolderBase)
            host = np.asarray(mem).view(np.uint8)
            host[:] = 21
            mem.flush(0, n)
            d = gpuarray.GPUArray(n, np.uint8, gpudata=mem)
            assert int(d.gpudata) == mem.device_ptr
            double_bytes(d, np.uint32(n), block=(256, 1, 1), grid=(n // 256, 1))
            drv.Context.synchronize()  # a launch without In/Out arguments does not wait
            mem.invalidate(0, n)
            assert int(np.count_nonzero(host != 42)) == 0
            assert int(np.count_nonzero(d.get() != 42)) == 0
            held = drv.mem_get_info()[0]
            del host
            mem.free()  # the GPUArray still holds the memory
            with pytest.raises(vkgdr.VkgdrError, match="freed"):
                mem.get_pointer()
            assert drv.mem_get_info()[0] - held < n // 2, "freed while a GPUArray held it"
            del d, mem
            gc.collect()
            assert g.wait_for_releases(10)
            g.trim()  # its mapping is kept for the next allocation of its size
            freed = drv.mem_get_info()[0]
            assert freed - held >= n // 2, f"not back with the GPUArray gone: {held} -> {freed}"
            del double_bytes, module  # unloaded while its context lives
            gc.collect()
        finally:
            face.release(ctx)

    run_in_thread(body)


# vkgdr 0.1's Python example (examples/vkgdr_example.py there), in the same steps: PyCUDA's
# default context from pycuda.autoinit, a kernel compiled by SourceModule (nvcc), three
# vkgdr.pycuda.Memory allocations seen by the host through np.array(..., copy=False) and by the
# kernel as GPUArrays, host writes flushed, the kernel writing one of them, the host reading it
# after invalidate. Unlike the example it waits for the kernel before reading (a launch without
# In/Out arguments returns at once) and checks every element rather than printing some. It leaves
# the memory to be freed at exit, as the example does. Its first argument is the watchdog's
# seconds: a hang dumps every thread's stack and exits.
EXAMPLE = r'''
import faulthandler
import sys

faulthandler.dump_traceback_later(float(sys.argv[1]), exit=True)

import numpy as np
import pycuda.autoinit
import pycuda.driver
import pycuda.gpuarray
from pycuda.compiler import SourceModule

import vkgdr.pycuda

module = SourceModule("""
__global__ void scale_add(const float *x, const float *y, float *out, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = a * x[i] + y[i];
}
""")
scale_add = module.get_function("scale_add")

n = 1 << 20
dtype = np.dtype(np.float32)
g = vkgdr.Vkgdr.open_current_context()
x = vkgdr.pycuda.Memory(g, n * dtype.itemsize)
y = vkgdr.pycuda.Memory(g, n * dtype.itemsize)
out = vkgdr.pycuda.Memory(g, n * dtype.itemsize)
h_x = np.array(x, copy=False).view(dtype)
h_y = np.array(y, copy=False).view(dtype)
h_out = np.array(out, copy=False).view(dtype)
d_x = pycuda.gpuarray.GPUArray(n, dtype, gpudata=x)
d_y = pycuda.gpuarray.GPUArray(n, dtype, gpudata=y)
d_out = pycuda.gpuarray.GPUArray(n, dtype, gpudata=out)
h_x[:] = np.arange(n, dtype=dtype)
h_y[:] = 17
h_out[:] = -1
for mem in (x, y, out):
    mem.flush(0, len(mem))

scale_add(d_x, d_y, d_out, np.float32(3), np.int32(n), block=(256, 1, 1), grid=(n // 256, 1))
pycuda.driver.Context.synchronize()
out.invalidate(0, len(out))
expected = np.float32(3) * np.arange(n, dtype=dtype) + np.float32(17)
np.testing.assert_array_equal(h_out, expected)
np.testing.assert_array_equal(d_out.get(), expected)
print(h_out[100000:][:5])
print("vkgdr example: ok")
'''


def find_nvcc() -> Optional[str]:
    """nvcc on the PATH, else in CUDA_HOME, CUDA_PATH or /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    return None


def test_vkgdr_0_1_python_example_runs_unchanged(cuda, real_pycuda, tmp_path) -> None:
    """The example in a fresh interpreter, as its users run it: ``pycuda.autoinit`` keeps its
    context current on the main thread until exit, which the other tests must not see."""
    nvcc = find_nvcc()
    if nvcc is None:
        if REQUIRE_GPU:
            pytest.fail("VKGDR_REQUIRE_GPU=1 but nvcc (PyCUDA's SourceModule needs it) is missing")
        pytest.skip("needs nvcc: PyCUDA's SourceModule compiles with it")
    script = tmp_path / "vkgdr_example.py"
    script.write_text(EXAMPLE)
    import pycuda

    # The packages this interpreter imports, first on the child's path; its cwd is tmp_path, so
    # no source folder named vkgdr (without the extension) can shadow the installed package.
    sites = [str(pathlib.Path(m.__file__).resolve().parent.parent) for m in (vkgdr, pycuda)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sites + [p for p in [env.get("PYTHONPATH")] if p])
    env["PATH"] = os.pathsep.join([os.path.dirname(nvcc), env.get("PATH", "")])
    cache = tmp_path / "pycuda-cache"  # PyCUDA writes its compiler cache there, not in $HOME
    cache.mkdir()
    env["PYCUDA_CACHE_DIR"] = str(cache)
    watchdog = 240
    try:
        done = subprocess.run(
            [sys.executable, str(script), str(watchdog)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=watchdog + 60,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the example hung past its own watchdog:\n{e.stdout}\n{e.stderr}")
    report = f"exit status {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 0, report
    assert "vkgdr example: ok" in done.stdout, report
    # Freed at exit, after pycuda.autoinit's atexit pop, as vkgdr 0.1's example leaves it: no
    # exception in a destructor, no PyCUDA clean-up complaint.
    for sign in ("Traceback", "Exception ignored", "PyCUDA ERROR", "PyCUDA WARNING"):
        assert sign not in done.stderr, report


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
    g.trim()  # its mapping is kept for the next 64 MiB allocation where the limit allows
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


def test_a_freed_allocation_keeps_its_mapping_for_its_size_up_to_the_limit(cupy) -> None:
    """A freed ``RawMemory`` of up to ``spare_limits[0]`` bytes leaves its mapping (and its
    VRAM) for the next allocation of its size, which takes the same device pointer; one past the
    limit goes back to the driver; ``trim()`` gives the kept ones back to free VRAM."""
    g = vkgdr.Vkgdr.open_current_context()
    each, total = g.spare_limits
    assert each >= 32 << 20 and each & (each - 1) == 0 and total == 2 * each, (each, total)
    assert g.wait_for_releases(10)
    g.trim()

    def free() -> int:
        return int(cupy.cuda.runtime.memGetInfo()[0])

    start = free()
    mem = vkgdr.RawMemory(g, each)
    at = mem.device_ptr
    mem.free()
    assert g.wait_for_releases(10)
    assert start - free() >= each // 2, "its VRAM went back instead of being kept"
    again = vkgdr.RawMemory(g, each)
    assert again.device_ptr == at, "the kept mapping was not taken"
    again.free()
    past = vkgdr.RawMemory(g, each + 4096)
    past.free()
    assert g.wait_for_releases(10)
    assert g.trim() == 1, "only the allocation within the limit is kept"
    assert abs(free() - start) < each // 2, f"VRAM not back after trim: {start} -> {free()}"


def test_spare_limits_can_be_changed_and_none_keeps_nothing(cupy) -> None:
    """``set_spare_limits`` gives back at once what the new limits no longer hold, and
    ``(0, 0)`` makes every free give its memory back, as vkgdr 0.1's do."""
    g = vkgdr.Vkgdr.open_current_context()
    default = g.spare_limits
    assert g.wait_for_releases(10)
    g.trim()
    try:
        assert g.set_spare_limits(8 << 20, 16 << 20) == 0
        assert g.spare_limits == (8 << 20, 16 << 20)
        for size in (4 << 20, 8 << 20, 8 << 20):  # the second 8 MiB takes the first's mapping
            vkgdr.RawMemory(g, size).free()
            assert g.wait_for_releases(10)
        assert g.set_spare_limits(6 << 20, 16 << 20) == 1, "the 8 MiB mapping goes back"
        assert g.set_spare_limits(0, 0) == 1, "and then the 4 MiB one"
        held = cupy.cuda.runtime.memGetInfo()[0]
        vkgdr.RawMemory(g, 4 << 20).free()
        assert g.wait_for_releases(10)
        assert g.trim() == 0, "a free keeps nothing with no limits"
        assert cupy.cuda.runtime.memGetInfo()[0] >= held - (1 << 20)
        with pytest.raises(OverflowError):
            g.set_spare_limits(-1, 0)
        assert g.spare_limits == (0, 0), "a refused call changes nothing"
    finally:
        g.set_spare_limits(*default)
    assert g.spare_limits == default


def test_free_without_views_is_at_once_every_way(cupy) -> None:
    g = vkgdr.Vkgdr.open_current_context()
    stream = cupy.cuda.Stream(non_blocking=True)
    raw, legacy = vkgdr.RawStream(stream.ptr), vkgdr.RawStream(0)
    for how in ({}, {"now": True}, {"after": stream}, {"after": raw}, {"after": legacy}):
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


def test_pycuda_memory_with_a_view_is_released_when_the_view_goes(cuda, cupy, pycuda_face):
    face = pycuda_face

    def body() -> None:
        ctx = face.create_context()
        try:
            g = vkgdr.Vkgdr.open_current_context()
            mem = face.module.Memory(g, 4096)
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
            face.pop()
            del view, mem  # released now, with its context pushed by the wrapper
            gc.collect()
            assert cuda.ctx_get_current() is None
            face.push(ctx)
            assert g.wait_for_releases(10)
        finally:
            face.release(ctx)

    run_in_thread(body)
