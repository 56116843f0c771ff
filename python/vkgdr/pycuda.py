"""vkgdr with PyCUDA: :class:`Memory`, usable as the ``gpudata`` of a ``pycuda.gpuarray.GPUArray``.

Importable when PyCUDA is installed (as in vkgdr 0.1).
"""

from typing import Any

import pycuda.driver

from . import RawMemory, Vkgdr, VkgdrError, _refuse_copies


# Refused here as well as on RawMemory: PyCUDA's base comes first in the method order.
@_refuse_copies
class Memory(pycuda.driver.PointerHolderBase, RawMemory):
    """Memory in the current PyCUDA context, freed with that context pushed.

    ``Memory(owner, size, flags=0)`` allocates like :class:`vkgdr.RawMemory`, which it is (and a
    ``pycuda.driver.PointerHolderBase``, as in vkgdr 0.1): ``np.asarray(mem)``, ``len(mem)``,
    ``device_ptr``, ``is_coherent``, ``non_coherent_atom_size``, ``flush``, ``invalidate``,
    ``free``; ``get_pointer()`` is what PyCUDA passes to kernels.

    It keeps a reference to the context that was current at allocation and pushes it to free the
    memory, so the context is not garbage collected first; destroying the context explicitly
    before the memory is freed is an error (as in vkgdr 0.1).

    Views keep the memory, as for :class:`vkgdr.RawMemory`: once it was exported (through
    ``__array_interface__``, ``__cuda_array_interface__`` or ``get_pointer``, which PyCUDA's
    ``GPUArray`` and kernel calls use), ``free()`` releases it at once only when nothing but the
    caller's variables refers to this object; otherwise the object is marked freed and the
    memory is released when the object is collected, i.e. when the last ``GPUArray`` or NumPy
    view over it is gone.

    Raises
    ------
    VkgdrError
        if no CUDA context is current, or the allocation fails
    """

    #: The context current at allocation, until the memory is handed back.
    _context: Any = None

    def __init__(self, owner: Vkgdr, size: int, flags: int = 0) -> None:
        context = pycuda.driver.Context.get_current()
        if context is None:
            raise VkgdrError("no current CUDA context")
        self._context = context
        RawMemory.__init__(self, owner, size, flags)
        pycuda.driver.PointerHolderBase.__init__(self)

    def get_pointer(self) -> int:  # PointerHolderBase interface
        """The device pointer (what PyCUDA passes to kernels); views may exist from here on."""
        return self._memory().exported_device_ptr()

    def _release_begin(self) -> None:
        context = self._context
        if context is not None:
            context.push()

    def _release_end(self) -> None:
        context = self._context
        if context is None:
            return
        # A static method, called through the object: at interpreter exit the module's globals
        # may be gone.
        context.pop()
        memory = self._impl
        if memory is None or memory.is_released:
            self._context = None  # handed back: the context may go

    def __del__(self) -> None:
        # No view is left (each holds this object): memory kept for views goes back now, with
        # the context pushed; never-freed memory too, as in vkgdr 0.1.
        memory = self._impl
        if memory is None or memory.is_released:
            return
        self._release_begin()
        try:
            memory.release()
        finally:
            self._release_end()
