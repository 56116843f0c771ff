"""vkgdr with CuPy: typed CuPy arrays over vkgdr memory, with no copy.

``cupy.asarray(block)`` already works (the CUDA array interface) and gives a one-dimensional
``uint8`` array; :func:`asarray` gives any dtype and shape, and :func:`ring_kernel_args` turns a
ring's device view into kernel arguments. Importable when CuPy is installed.
"""

from typing import Any, Optional, Sequence, Tuple, Union

import cupy
import numpy as np

from . import Block, RawMemory, RingDeviceView, VkgdrError

_Memory = Union[Block, RawMemory, Any]


def asarray(
    memory: _Memory,
    dtype: Any = np.uint8,
    shape: Optional[Union[int, Sequence[int]]] = None,
) -> "cupy.ndarray":
    """A CuPy array of ``dtype`` and ``shape`` over the device memory of ``memory``.

    ``memory`` is a :class:`vkgdr.Block`, a :class:`vkgdr.RawMemory` or anything with
    ``__cuda_array_interface__`` or ``device_ptr``, and ``len()``. The array keeps ``memory``
    alive (and a ``free()`` of it meanwhile releases the memory only when the array is gone).
    ``shape`` defaults to as many elements as fit; it may describe a prefix of the memory, never
    more.
    """
    dtype = np.dtype(dtype)
    # Through the CUDA array interface where there is one: reading it tells vkgdr memory that an
    # array now uses it, so a later free() keeps the memory until the array is gone.
    interface = getattr(memory, "__cuda_array_interface__", None)
    ptr = interface["data"][0] if interface is not None else memory.device_ptr
    if ptr is None:
        raise VkgdrError("this memory has no device pointer (a Pool.vulkan_only block)")
    size = len(memory)
    if shape is None:
        if size % dtype.itemsize:
            raise ValueError(f"{size} bytes are not a whole number of {dtype} items; give a shape")
        shape = (size // dtype.itemsize,)
    elif isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(d) for d in shape)
    needed = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if needed > size:
        raise ValueError(f"shape {shape} of {dtype} needs {needed} bytes; the memory has {size}")
    dlpack_device = getattr(memory, "__dlpack_device__", None)
    device_id = dlpack_device()[1] if dlpack_device else cupy.cuda.runtime.getDevice()
    unowned = cupy.cuda.UnownedMemory(ptr, size, memory, device_id)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(unowned, 0))


def ring_kernel_args(view: RingDeviceView) -> Tuple[np.uint64, ...]:
    """``(data, capacity, tail, stop, head, result)`` as ``numpy.uint64`` for a CuPy
    ``RawKernel`` call of ``ring_consume_persistent`` (pointer parameters take 64-bit values)."""
    return tuple(np.uint64(a) for a in view.kernel_args())
