"""vkgdr with PyCUDA: :class:`Memory`, usable as the ``gpudata`` of a ``pycuda.gpuarray.GPUArray``.

Importable when PyCUDA is installed (as in vkgdr 0.1).
"""

import sys
from typing import Any, Dict, Optional, Tuple

import pycuda.driver

from . import InvalidArgumentError, RawMemory, Vkgdr, VkgdrError
from ._vkgdr import _calibrate, _only_callers, _stream_handle


class _RefProbe:
    """What :meth:`Memory.free` sees of its receiver's references on entry, for the baseline."""

    def free(self, *, after: Any = None, now: bool = False) -> int:
        refs = sys.getrefcount(self)
        return refs


#: The receiver counts of ``Memory.free`` with one local variable (or one module-level name)
#: referring to the object and nothing else (see ``Memory.free``).
_BASELINE: Tuple[int, int] = _calibrate(_RefProbe)


class Memory(pycuda.driver.PointerHolderBase):
    """Memory in the current PyCUDA context, freed with that context pushed.

    ``Memory(owner, size, flags=0)`` allocates like :class:`vkgdr.RawMemory` (which it holds in
    :attr:`raw` rather than inheriting from it, since PyCUDA's base class is a Boost.Python type)
    and offers the same attributes: ``np.asarray(mem)``, ``len(mem)``, ``device_ptr``,
    ``is_coherent``, ``non_coherent_atom_size``, ``flush``, ``invalidate``, ``free``.

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

    def __init__(self, owner: Vkgdr, size: int, flags: int = 0) -> None:
        super().__init__()
        self.raw: Optional[RawMemory] = None  # so that free() works if allocation fails
        self._freed = False
        self._exported = False
        self._release_after: Any = None
        self._release_now = False
        self._context = pycuda.driver.Context.get_current()
        if self._context is None:
            raise VkgdrError("no current CUDA context")
        self.raw = RawMemory(owner, size, flags)
        self._size = size

    def get_pointer(self) -> int:  # PointerHolderBase interface
        """The device pointer (what PyCUDA passes to kernels)."""
        raw = self._live()
        self._exported = True
        return raw.device_ptr

    def _live(self) -> RawMemory:
        if self._freed or self.raw is None:
            raise VkgdrError("the memory has been freed")
        return self.raw

    @property
    def __array_interface__(self) -> Dict[str, Any]:  # noqa: D105
        raw = self._live()
        self._exported = True
        return raw.__array_interface__

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:  # noqa: D105
        raw = self._live()
        self._exported = True
        return raw.__cuda_array_interface__

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

    def free(self, *, after: Any = None, now: bool = False) -> None:
        """Free the memory with its context pushed, never waiting for the GPU. Safe to call twice.

        ``after`` (a CUDA stream: an int handle or a PyCUDA, CuPy, PyTorch stream object) and
        ``now`` are those of :meth:`vkgdr.RawMemory.free`. Memory that views may still use is
        released when this object is collected (see the class docs).
        """
        # First, before anything takes a reference (the same statement as _RefProbe.free).
        refs = sys.getrefcount(self)
        if after is not None and now:
            raise InvalidArgumentError("free() takes after= or now=True, not both")
        if after is not None:
            _stream_handle(after)  # a bad stream is an error now, not when the views are gone
        if self._freed or self.raw is None:
            return
        self._freed = True  # from here on no view can be made
        self._release_after, self._release_now = after, now
        if self._exported:
            try:
                alone = _only_callers(self, refs, _BASELINE, 1)
            except Exception:  # the caller's frame cannot be read: views may exist
                alone = False
            if not alone:
                return  # released by __del__, once the last view is gone
        self._release()

    def _release(self) -> None:
        """Hand the memory back now, with its context pushed."""
        context, raw = self._context, self.raw
        after, now = self._release_after, self._release_now
        if context is None or raw is None:
            return
        self.raw = None
        self._context = None
        self._release_after = None
        context.push()
        try:
            raw.free(after=after, now=now)
        finally:
            context.pop()

    def __del__(self) -> None:
        self._release()

