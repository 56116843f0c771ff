"""Shared fixtures: GPU detection, a ctypes view of the CUDA driver, CuPy kernels.

GPU tests skip themselves (with the reason) where there is no NVIDIA GPU, CUDA driver or CuPy.
With ``VKGDR_REQUIRE_GPU=1`` (set by ``scripts/gpu-check``) a missing GPU or CuPy is an error
instead, so a broken GPU machine cannot pass by skipping.
"""

import contextlib
import ctypes
import importlib
import itertools
import multiprocessing
import os
import pathlib
import selectors
import subprocess
import sys
import tempfile
import threading
import time
import types
from typing import Any, Callable, Iterator, Optional

import pytest

REQUIRE_GPU = os.environ.get("VKGDR_REQUIRE_GPU") == "1"


def _find_kernels() -> Optional[pathlib.Path]:
    env = os.environ.get("VKGDR_KERNELS_DIR")
    if env:
        return pathlib.Path(env)
    here = pathlib.Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "kernels" / "ring.ptx").is_file():
            return parent / "kernels"
    return None


KERNELS_DIR = _find_kernels()


class CudaDriver:
    """The few driver calls the tests make themselves (contexts), through ctypes."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check("cuInit", self.lib.cuInit(0))

    def check(self, call: str, result: int) -> None:
        if result != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(result, ctypes.byref(name))
            raise RuntimeError(f"{call} failed ({(name.value or b'?').decode()})")

    def device_count(self) -> int:
        n = ctypes.c_int()
        self.check("cuDeviceGetCount", self.lib.cuDeviceGetCount(ctypes.byref(n)))
        return n.value

    def ctx_create(self, ordinal: int = 0) -> int:
        """A new (non-primary) context, made current: what PyCUDA's make_default_context does."""
        dev = ctypes.c_int()
        self.check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), ordinal))
        ctx = ctypes.c_void_p()
        if hasattr(self.lib, "cuCtxCreate_v2"):
            self.check("cuCtxCreate_v2", self.lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
        else:  # CUDA 13 headers name only the _v4 entry point (NULL params: a plain context)
            self.check("cuCtxCreate_v4", self.lib.cuCtxCreate_v4(ctypes.byref(ctx), None, 0, dev))
        return ctx.value

    def ctx_destroy(self, ctx: int) -> None:
        self.check("cuCtxDestroy_v2", self.lib.cuCtxDestroy_v2(ctypes.c_void_p(ctx)))

    def ctx_get_current(self) -> Optional[int]:
        ctx = ctypes.c_void_p()
        self.check("cuCtxGetCurrent", self.lib.cuCtxGetCurrent(ctypes.byref(ctx)))
        return ctx.value

    def ctx_push(self, ctx: int) -> None:
        self.check("cuCtxPushCurrent_v2", self.lib.cuCtxPushCurrent_v2(ctypes.c_void_p(ctx)))

    def ctx_pop(self) -> int:
        ctx = ctypes.c_void_p()
        self.check("cuCtxPopCurrent_v2", self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctx)))
        return ctx.value

    def ctx_synchronize(self) -> None:
        self.check("cuCtxSynchronize", self.lib.cuCtxSynchronize())

    def load_function(self, ptx: pathlib.Path, name: str) -> "tuple[int, int]":
        """Loads a PTX module into the current context; returns (module, function)."""
        module = ctypes.c_void_p()
        image = ctypes.c_char_p(ptx.read_bytes() + b"\0")
        self.check("cuModuleLoadData", self.lib.cuModuleLoadData(ctypes.byref(module), image))
        fn = ctypes.c_void_p()
        self.check(
            "cuModuleGetFunction",
            self.lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()),
        )
        return module.value, fn.value

    def module_unload(self, module: int) -> None:
        self.check("cuModuleUnload", self.lib.cuModuleUnload(ctypes.c_void_p(module)))

    def launch(self, fn: int, threads: int, *args: "ctypes._SimpleCData") -> None:
        """Launches ``fn`` over ``threads`` threads (blocks of 256) on the null stream."""
        params = (ctypes.c_void_p * len(args))(
            *[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args]
        )
        blocks = (threads + 255) // 256
        self.check(
            "cuLaunchKernel",
            self.lib.cuLaunchKernel(
                ctypes.c_void_p(fn), blocks, 1, 1, 256, 1, 1, 0, None, params, None
            ),
        )


@contextlib.contextmanager
def driver_double_kernel(cuda: CudaDriver) -> Iterator[Callable[[int, int], None]]:
    """``double_bytes`` from kernels/mapping.ptx, loaded through the driver API into the current
    context and unloaded before the caller destroys that context. For contexts the tests create:
    CuPy caches modules per device, and its cached modules would outlive such a context."""
    if KERNELS_DIR is None:
        pytest.fail("kernels/mapping.ptx not found (set VKGDR_KERNELS_DIR)")
    module, fn = cuda.load_function(KERNELS_DIR / "mapping.ptx", "double_bytes")
    try:
        yield lambda ptr, n: cuda.launch(fn, n, ctypes.c_uint64(ptr), ctypes.c_uint32(n))
    finally:
        cuda.module_unload(module)


# Threads per block of the checking kernels of kernels/ring.cu (RING_THREADS there).
CHECK_THREADS = 512


def launch_check_lanes(cuda, view, stream) -> int:
    """ring_check_lanes(vkgdr_ring_view) on ``stream``: one block of CHECK_THREADS per lane, the
    64-byte view passed by value as one kernel parameter (through the driver API, loaded into
    the current context, device 0's primary one). Returns the module, to unload once the kernel
    has exited."""
    if KERNELS_DIR is None:
        pytest.fail("kernels/ring.ptx not found: set VKGDR_KERNELS_DIR")
    module, fn = cuda.load_function(KERNELS_DIR / "ring.ptx", "ring_check_lanes")
    arg = ctypes.create_string_buffer(view.to_bytes(), 64)
    params = (ctypes.c_void_p * 1)(ctypes.cast(arg, ctypes.c_void_p))
    cuda.check(
        "cuLaunchKernel",
        cuda.lib.cuLaunchKernel(
            ctypes.c_void_p(fn),
            view.lanes, 1, 1, CHECK_THREADS, 1, 1, 0,
            ctypes.c_void_p(stream.ptr), params, None,
        ),
    )
    return module


def _probe_gpu() -> "tuple[Optional[CudaDriver], str]":
    try:
        driver = CudaDriver()
    except OSError as e:
        return None, f"no CUDA driver ({e})"
    except RuntimeError as e:
        return None, f"CUDA driver unusable: {e}"
    if driver.device_count() == 0:
        return None, "no CUDA device"
    return driver, ""


_DRIVER, _NO_GPU_REASON = _probe_gpu()


def has_cuda_driver() -> bool:
    """Whether libcuda.so.1 loads here (the CI tests of 'no driver' errors need it absent)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.fixture(scope="session")
def cuda() -> CudaDriver:
    """The CUDA driver; skips (or fails with VKGDR_REQUIRE_GPU=1) without a GPU."""
    if _DRIVER is None:
        if REQUIRE_GPU:
            pytest.fail(f"VKGDR_REQUIRE_GPU=1 but {_NO_GPU_REASON}")
        pytest.skip(f"needs an NVIDIA GPU: {_NO_GPU_REASON}")
    return _DRIVER


@pytest.fixture(scope="session")
def cupy(cuda: CudaDriver) -> Any:
    """CuPy with device 0's primary context initialised and current on the main thread."""
    try:
        import cupy
    except ImportError as e:
        if REQUIRE_GPU:
            pytest.fail(f"VKGDR_REQUIRE_GPU=1 but CuPy is missing: {e}")
        pytest.skip(f"needs CuPy: {e}")
    cupy.cuda.runtime.setDevice(0)
    cupy.cuda.runtime.deviceSynchronize()  # creates the primary context and makes it current
    return cupy


DOUBLE_SOURCE = r"""
extern "C" __global__ void double_it(unsigned char *data, int n)
{
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n)
        data[idx] *= 2;
}
"""


def double_kernel(cupy: Any, tag: str = "") -> Callable[[int, int], None]:
    """A CuPy kernel doubling ``n`` bytes at a device pointer, loaded in the current context.

    ``tag`` makes the source unique: CuPy caches modules per device, not per context, so a
    kernel for another context needs source of its own.
    """
    import numpy as np

    kernel = cupy.RawKernel(DOUBLE_SOURCE + f"// context {tag}\n", "double_it")

    def launch(ptr: int, n: int) -> None:
        kernel(((n + 255) // 256,), (256,), (np.uint64(ptr), np.int32(n)))

    return launch


def tag_base(tag: int) -> int:
    """Byte 0 of a block tagged ``tag``: the top byte of ``tag * 2654435761`` (mod 2**32), which
    every bit of the tag moves (``tag_base`` in kernels/mapping.cu)."""
    return ((tag * 2654435761) & 0xFFFFFFFF) >> 24


def tag_bytes(tag: int, n: int) -> Any:
    """What ``check_tagged_blocks`` (kernels/mapping.cu) expects of a block tagged ``tag``: byte j
    is ``(tag_base(tag) + j) & 0xff``, as a NumPy ``uint8`` array of ``n`` bytes."""
    import numpy as np

    return ((np.arange(n, dtype=np.uint64) + np.uint64(tag_base(tag))) & np.uint64(0xFF)).astype(
        np.uint8
    )


def run_in_thread(fn: Callable[[], Any]) -> Any:
    """Runs ``fn`` on a fresh thread (no current CUDA context there) and returns its result or
    raises its exception."""
    box: dict = {}

    def body() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: B902 - re-raised in the caller
            box["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("result")


def run_workers(worker: Callable[[int], Any], n: int = 4) -> None:
    """Runs ``worker(0)`` to ``worker(n - 1)`` on ``n`` threads at once, waits for them all, and
    fails with every exception they raised."""
    errors: list = []

    def body(t: int) -> None:
        try:
            worker(t)
        except BaseException as e:  # noqa: B902 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def vulkan_pool(**config: Any) -> Any:
    """``vkgdr.Pool.vulkan_only(**config)``, or a failure that says how to get a Vulkan device:
    the tests without a GPU run on Mesa's lavapipe."""
    import vkgdr

    try:
        return vkgdr.Pool.vulkan_only(**config)
    except vkgdr.VkgdrError as e:
        pytest.fail(
            f"these tests need a Vulkan device with VK_KHR_external_memory_fd and there is none "
            f"({e}): install the Vulkan loader and Mesa's lavapipe (apt-get install libvulkan1 "
            f"mesa-vulkan-drivers; scripts/test does it) or run on an NVIDIA machine"
        )


def import_pycuda_shim(monkeypatch: Any, context_class: type) -> Any:
    """Imports vkgdr.pycuda against a stand-in ``pycuda.driver`` whose ``Context`` is
    ``context_class`` (for the shim's own logic without a GPU, and for the GPU tests where PyCUDA
    cannot be imported); undone at the test's end."""
    pycuda = types.ModuleType("pycuda")
    driver = types.ModuleType("pycuda.driver")
    driver.PointerHolderBase = type("PointerHolderBase", (), {"__init__": lambda self: None})
    driver.Context = context_class
    pycuda.driver = driver
    monkeypatch.setitem(sys.modules, "pycuda", pycuda)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    monkeypatch.delitem(sys.modules, "vkgdr.pycuda", raising=False)
    shim = importlib.import_module("vkgdr.pycuda")
    monkeypatch.setitem(sys.modules, "vkgdr.pycuda", shim)
    return shim


class FakeContext:
    """Stands in for pycuda.driver.Context in the PyCUDA tests that run without PyCUDA; counts
    pushes and pops (reset them in the fixture that uses it)."""

    current = None
    pushes = 0
    pops = 0

    @classmethod
    def get_current(cls):
        return cls.current

    def push(self) -> None:
        FakeContext.pushes += 1

    @staticmethod
    def pop() -> None:
        FakeContext.pops += 1


# --- Sharing with other processes (test_vulkan_share.py, test_gpu_share.py) ---------------------

CHILDREN = pathlib.Path(__file__).with_name("share_children.py")
#: A child's environment: no CUDA library to be found (a peer must not need one).
NO_CUDA = {"VKGDR_CUDA_LIBRARY": "/nonexistent/libcuda.so.1"}
_sockets = itertools.count()


@pytest.fixture()
def sock() -> Any:
    """A socket path of the test's own (short: a Unix socket path has at most 107 bytes)."""
    path = os.path.join(tempfile.gettempdir(), f"vkgdr-py-{os.getpid()}-{next(_sockets)}.sock")
    yield path
    if os.path.exists(path):
        os.unlink(path)


def spawn_peer(role: str, path: str, *args: Any) -> subprocess.Popen:
    """share_children.py ROLE PATH ARGS in a new process with no CUDA library to be found."""
    return subprocess.Popen(
        [sys.executable, str(CHILDREN), role, path, *map(str, args)],
        env={**os.environ, **NO_CUDA},
        stdout=subprocess.PIPE,
        text=True,
    )


def finish(child: subprocess.Popen, timeout: float = 120) -> str:
    """Waits for ``child`` (killing it on a hang) and checks that its checks passed."""
    try:
        out, _ = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail(f"a child hung for {timeout} s")
    assert child.returncode == 0, f"the child's checks failed (exit {child.returncode}): {out}"
    return out


def read_line(child: subprocess.Popen, word: str, timeout: float = 60) -> str:
    """Reads ``child``'s output up to a line that starts with ``word``, and returns it."""
    assert child.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(child.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                child.kill()
                pytest.fail(f"no {word} from the child within {timeout} s")
            line = child.stdout.readline()
            if not line:
                pytest.fail(f"the child ended before saying {word} (exit {child.wait()})")
            if line.startswith(word):
                return line


def wait_event(server: Any, kind: str, timeout: float = 30, **fields: Any) -> Any:
    """The next event of ``kind`` (a ``vkgdr.ShareEvent`` of ``server``) whose attributes have the
    values of ``fields``."""
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        e = server.next_event(timeout=max(0.0, deadline - time.monotonic()))
        if e is None:
            pytest.fail(f"no {kind} event {fields} within {timeout} s; saw {seen}")
        if e.kind == kind and all(getattr(e, k) == v for k, v in fields.items()):
            return e
        seen.append(e)


def run_process(method: str, target: Any, *args: Any, timeout: float = 120) -> None:
    """Runs ``target(*args)`` in a ``multiprocessing`` process started by ``method`` and checks
    that it exited 0."""
    p = multiprocessing.get_context(method).Process(target=target, args=args)
    p.start()
    p.join(timeout)
    if p.exitcode is None:
        p.kill()
        p.join()
        pytest.fail(f"a {method} child hung for {timeout} s")
    assert p.exitcode == 0, f"the {method} child's checks failed (exit {p.exitcode})"
