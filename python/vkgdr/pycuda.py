"""vkgdr with PyCUDA: :class:`Memory`, usable as the ``gpudata`` of a ``pycuda.gpuarray.GPUArray``.

Importable when PyCUDA is installed (as in vkgdr 0.1).
"""

from typing import Any, Dict, Optional

import pycuda.driver

from . import RawMemory, Vkgdr, VkgdrError


class Memory(pycuda.driver.PointerHolderBase):
    """Memory in the current PyCUDA context, freed with that context pushed.

    ``Memory(owner, size, flags=0)`` allocates like :class:`vkgdr.RawMemory` (which it holds in
    :attr:`raw` rather than inheriting from it, since PyCUDA's base class is a Boost.Python type)
    and offers the same attributes: ``np.asarray(mem)``, ``len(mem)``, ``device_ptr``,
    ``is_coherent``, ``non_coherent_atom_size``, ``flush``, ``invalidate``, ``free``.

    It keeps a reference to the context that was current at allocation and pushes it to free the
    memory, so the context is not garbage collected first; destroying the context explicitly
    before the memory is freed is an error (as in vkgdr 0.1).

    Raises
    ------
    VkgdrError
        if no CUDA context is current, or the allocation fails
    """

    def __init__(self, owner: Vkgdr, size: int, flags: int = 0) -> None:
        super().__init__()
        self.raw: Optional[RawMemory] = None  # so that free() works if allocation fails
        self._context = pycuda.driver.Context.get_current()
        if self._context is None:
            raise VkgdrError("no current CUDA context")
        self.raw = RawMemory(owner, size, flags)
        self._size = size

    def get_pointer(self) -> int:  # PointerHolderBase interface
        """The device pointer (what PyCUDA passes to kernels)."""
        return self.device_ptr

    def _live(self) -> RawMemory:
        if self.raw is None:
            raise VkgdrError("the memory has been freed")
        return self.raw

    @property
    def __array_interface__(self) -> Dict[str, Any]:  # noqa: D105
        return self._live().__array_interface__

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:  # noqa: D105
        return self._live().__cuda_array_interface__

    @property
    def device_ptr(self) -> int:
        """The CUDA device pointer."""
        return self._live().device_ptr

    def __len__(self) -> int:
        return self._size

    @property
    def is_coherent(self) -> bool:
        """Whether host writes need no flush."""
        return self._live().is_coherent

    @property
    def non_coherent_atom_size(self) -> int:
        """The granularity of flush and invalidate (1 on coherent memory)."""
        return self._live().non_coherent_atom_size

    def flush(self, offset: int, size: int) -> None:
        """Make host writes in ``[offset, offset + size)`` visible to the device."""
        self._live().flush(offset, size)

    def invalidate(self, offset: int, size: int) -> None:
        """Make device writes in ``[offset, offset + size)`` visible to the host."""
        self._live().invalidate(offset, size)

    def free(self) -> None:
        """Free the memory with its context pushed. Safe to call twice."""
        context, raw = self._context, self.raw
        if context is None or raw is None:
            return
        context.push()
        try:
            raw.free()
            self.raw = None
            self._context = None
        finally:
            context.pop()

    def __del__(self) -> None:
        self.free()
