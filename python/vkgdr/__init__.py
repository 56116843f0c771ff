"""CPU access to NVIDIA GPU memory through the BAR, without a kernel module.

A drop-in for vkgdr 0.1 (``Vkgdr``, ``RawMemory``, ``OpenFlags``, ``VkgdrError``,
``vkgdr.pycuda.Memory``: same names and behaviour), plus a pool of small blocks (``Pool``,
``Block``) usable from NumPy, CuPy, PyTorch and Numba without copies, and ring buffers that
stream records to a running kernel (``DeviceRing``).

Memory is allocated through Vulkan as ``DEVICE_LOCAL | HOST_VISIBLE``, exported and imported into
CUDA, so the same bytes have a host mapping (a CPU store lands in GPU memory in ~0.1 µs) and a
device pointer kernels use. Host writes are seen by kernels launched after them (after
``flush()`` on non-coherent memory).

>>> import numpy as np, vkgdr
>>> pool = vkgdr.Pool(vkgdr.Vkgdr(0))                      # doctest: +SKIP
>>> block = pool.alloc(1024)                                # doctest: +SKIP
>>> block.view(np.float32)[:] = 1.0   # written straight into GPU memory   # doctest: +SKIP
"""

import enum

from ._vkgdr import (
    DLPACK_DEVICE_CPU,
    DLPACK_DEVICE_CUDA,
    OPEN_CURRENT_CONTEXT_BIT,
    OPEN_FORCE_NON_COHERENT_BIT,
    OPEN_REQUIRE_COHERENT_BIT,
    Block,
    DeviceRing,
    InvalidArgumentError,
    LibraryNotFoundError,
    OutOfDeviceMemoryError,
    Pool,
    RawMemory,
    RingDeviceView,
    RingFullError,
    Vkgdr,
    VkgdrError,
    __version__,
)

__all__ = [
    "Block",
    "DeviceRing",
    "InvalidArgumentError",
    "LibraryNotFoundError",
    "OpenFlags",
    "OutOfDeviceMemoryError",
    "Pool",
    "RawMemory",
    "RingDeviceView",
    "RingFullError",
    "Vkgdr",
    "VkgdrError",
    "DLPACK_DEVICE_CPU",
    "DLPACK_DEVICE_CUDA",
    "__version__",
]


class OpenFlags(enum.IntEnum):
    """Flags for :class:`Vkgdr` (the values of vkgdr 0.1)."""

    #: Ignore the given device and use the calling thread's current CUDA context instead.
    CURRENT_CONTEXT_BIT = OPEN_CURRENT_CONTEXT_BIT
    #: Treat the memory as non-coherent even if it is coherent (for debugging only).
    FORCE_NON_COHERENT_BIT = OPEN_FORCE_NON_COHERENT_BIT
    #: Fail unless the memory is guaranteed to be coherent.
    REQUIRE_COHERENT_BIT = OPEN_REQUIRE_COHERENT_BIT
