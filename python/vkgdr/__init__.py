"""CPU access to NVIDIA GPU memory through the BAR, without a kernel module.

A drop-in for vkgdr 0.1 (``Vkgdr``, ``RawMemory``, ``OpenFlags``, ``VkgdrError``,
``vkgdr.pycuda.Memory``: same names and behaviour), plus a pool of small blocks (``Pool``,
``Block``) usable from NumPy, CuPy, PyTorch and Numba without copies, ring buffers that
stream records to a running kernel (``DeviceRing``, with ``RingProducer`` for one thread's own
lane) and from kernels to Python threads (``DeviceToHostRing``, a ``LaneConsumer`` per lane),
and sharing them with other processes of the host (``ShareServer`` in the owner;
``Peer``, or ``attach(path)``, in processes that need no CUDA).

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
import os
from typing import Any, Dict, NoReturn, Optional, Tuple, Type, TypeVar, Union

from . import _vkgdr
from ._vkgdr import (
    DLPACK_DEVICE_CPU,
    DLPACK_DEVICE_CUDA,
    OPEN_CURRENT_CONTEXT_BIT,
    OPEN_FORCE_NON_COHERENT_BIT,
    OPEN_REQUIRE_COHERENT_BIT,
    AttachedLane,
    AttachedMemory,
    AttachedPool,
    Block,
    CheckingRing,
    DeviceRing,
    DeviceToHostRing,
    DeviceToHostView,
    InvalidArgumentError,
    LaneConsumer,
    LaneRecord,
    LibraryNotFoundError,
    OutOfDeviceMemoryError,
    Peer,
    Pool,
    RawStream,
    ReleaseTimes,
    RingDeviceView,
    RingFullError,
    RingProducer,
    ShareError,
    ShareEvent,
    SharedBlock,
    ShareServer,
    SlowRelease,
    VkgdrError,
    VulkanDevice,
    VulkanMemory,
    _FreeMethod,
    _RawMemory,
    _Vkgdr,
    __version__,
)

__all__ = [
    "AttachedLane",
    "AttachedMemory",
    "AttachedPool",
    "Block",
    "CheckingRing",
    "DeviceRing",
    "DeviceToHostRing",
    "DeviceToHostView",
    "InvalidArgumentError",
    "LaneConsumer",
    "LaneRecord",
    "LibraryNotFoundError",
    "OpenFlags",
    "OutOfDeviceMemoryError",
    "Peer",
    "Pool",
    "RawMemory",
    "RawStream",
    "ReleaseTimes",
    "RingDeviceView",
    "RingFullError",
    "RingProducer",
    "ShareError",
    "ShareEvent",
    "ShareServer",
    "SharedBlock",
    "SlowRelease",
    "Vkgdr",
    "VkgdrError",
    "VulkanDevice",
    "VulkanMemory",
    "attach",
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


def _no_copies(self: Any, *args: Any) -> NoReturn:
    """``copy.copy``, ``copy.deepcopy`` and pickling of a vkgdr object: refused."""
    cls = type(self)
    raise TypeError(
        f"cannot copy or pickle a {cls.__module__}.{cls.__qualname__}: it is a handle to GPU "
        f"memory or driver state, which exists once and only in this process (share the object "
        f"itself instead)"
    )


def _refuse_copies(cls: type) -> type:
    """Makes ``copy.copy``, ``copy.deepcopy`` and ``pickle`` of ``cls``'s objects raise
    ``TypeError``, the same for every class of this package: each is a handle to GPU memory or
    driver state, which a copy would alias (a second owner of one allocation) and a pickle cannot
    carry to another process. Returns ``cls``, so it serves as a class decorator."""
    for name in ("__copy__", "__deepcopy__", "__reduce__", "__reduce_ex__"):
        setattr(cls, name, _no_copies)
    return cls


# Every class of the extension module (exceptions aside: they are values, copied and pickled as
# Python's own are).
for _cls in vars(_vkgdr).values():
    if isinstance(_cls, type) and not issubclass(_cls, BaseException):
        _refuse_copies(_cls)
del _cls

# A child forked from this process (os.fork, multiprocessing's fork start method) inherits the
# sharing objects but not their mappings, threads or connections: they refuse to be used there,
# and leak instead of detaching the parent's (python/src/fork.rs). The hook tells them apart.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_vkgdr._after_fork_in_child)


def attach(path: "Union[str, os.PathLike[str]]", *, timeout: float = 10.0) -> Peer:
    """Connects to the ``ShareServer`` listening at ``path``: ``Peer(path, timeout=timeout)``.

    Needs no CUDA (neither CuPy nor PyTorch nor ``libcuda.so.1``): the memory it attaches is
    mapped through a Vulkan device of this process, opened by the GPU's UUID.

    >>> with vkgdr.attach("/tmp/frames.sock") as peer:          # doctest: +SKIP
    ...     params = peer.attach_memory("params")
    ...     params.write(bytes([1, 2, 3, 4]))  # lands in the owner's GPU memory
    """
    return Peer(path, timeout=timeout)


# Vkgdr and RawMemory are plain Python classes, as in vkgdr 0.1, so that programs can derive
# classes from them whose __init__ takes other arguments (and calls this one), and combine them
# with other bases (vkgdr.pycuda.Memory is a PyCUDA PointerHolderBase too). Each holds the
# extension's object in `_impl`; the class attribute None stands for "__init__ has not run".

_V = TypeVar("_V", bound="Vkgdr")


@_refuse_copies
class Vkgdr:
    """Handle to a CUDA device opened for BAR mappings (vkgdr 0.1's ``Vkgdr``).

    ``Vkgdr(device, flags=0)``: ``device`` is a CUDA device handle (``CUdevice``, the ordinal
    for every device the driver shows) and no CUDA context is created. With
    :data:`OpenFlags.CURRENT_CONTEXT_BIT` the device is ignored and the calling thread's current
    context is used: it must stay alive as long as this handle and its memory (as in vkgdr 0.1).
    ``flags`` combines :class:`OpenFlags`; other bits are ignored, as vkgdr 0.1 ignores them.

    Classes derived from it may take other ``__init__`` arguments; their ``__init__`` must call
    ``Vkgdr.__init__`` (``super().__init__(device, flags)``) before the handle is used.
    ``copy.copy``, ``copy.deepcopy`` and pickling raise ``TypeError``, as for every class here.

    Raises
    ------
    VkgdrError
        if the device cannot be opened (``"<call> failed (<RESULT_NAME>)"``)
    """

    _impl: Optional[_Vkgdr] = None

    def __init__(self, device: int, flags: int = 0) -> None:
        self._impl = _Vkgdr(device, flags)

    @classmethod
    def open_current_context(cls: Type[_V], flags: int = 0) -> _V:
        """Opens the device of the calling thread's current CUDA context (any context, PyCUDA's
        ``make_default_context()`` included): ``cls(0, flags | OpenFlags.CURRENT_CONTEXT_BIT)``."""
        return cls(0, flags | OpenFlags.CURRENT_CONTEXT_BIT)

    def _handle(self) -> _Vkgdr:
        handle = self._impl
        if handle is None:
            raise VkgdrError(
                f"this {type(self).__name__} has no open device: the __init__ of a class "
                f"derived from vkgdr.Vkgdr must call vkgdr.Vkgdr.__init__"
            )
        return handle

    @property
    def name(self) -> str:
        """The device's name, as CUDA reports it."""
        return self._handle().name

    @property
    def uuid(self) -> bytes:
        """The 16-byte device UUID shared by CUDA and Vulkan."""
        return self._handle().uuid

    @property
    def device(self) -> int:
        """The ``CUdevice`` handle (the CUDA device ordinal)."""
        return self._handle().device

    @property
    def is_coherent(self) -> bool:
        """Whether memory of this handle needs no flush or invalidate."""
        return self._handle().is_coherent

    def pending_releases(self) -> int:
        """Releases of memory allocated through this handle (raw memory, pools, rings) that
        still wait for GPU work queued before them; that memory still counts as in use. Frees
        never wait for a running kernel: memory goes back once the work queued before the free
        on the legacy default stream (every blocking stream's too), or on the stream named with
        ``free(after=stream)``, has completed."""
        return self._handle().pending_releases()

    def release_times(self) -> ReleaseTimes:
        """How the releases of this handle's memory went (a :class:`ReleaseTimes`): how many
        wait now (``waiting``, as :meth:`pending_releases` counts), the one that has waited
        longest of those (``oldest_waiting``, a :class:`SlowRelease` with ``seconds`` and
        ``what`` was released, or None), and the slowest so far (``longest_wait`` for GPU work,
        ``longest_turn``, ``longest_drop``). A release that waits for seconds names a kernel that
        does not end on the stream it waits for."""
        return self._handle().release_times()

    def wait_for_releases(self, timeout: float = 30.0) -> bool:
        """Waits up to ``timeout`` seconds (without holding the GIL) until no release of this
        handle's memory is pending; returns whether none is left. Only a kernel still running on
        the legacy or a blocking stream, or on a stream named in ``free(after=...)``, keeps one
        waiting. For tests and orderly shutdown."""
        return self._handle().wait_for_releases(timeout)

    def trim(self) -> int:
        """Gives back to the driver what the handle keeps for later raw allocations: the empty
        shared granule small ones are carved from, and the mappings larger freed ones left for
        the next allocation of their size (``spare_limits``); returns how many went back. Free
        VRAM counts them again afterwards (``wait_for_releases`` first, for frees whose release
        still waits for GPU work)."""
        return self._handle().trim()

    @property
    def spare_limits(self) -> Tuple[int, int]:
        """``(each, total)``: a freed ``RawMemory`` above 1 MiB and of up to ``each`` bytes
        (rounded up to 4 KiB) leaves its mapping for the next allocation of its size, which then
        calls no driver, ``total`` bytes in all; as CuPy's memory pool and PyTorch's caching
        allocator keep freed blocks. By default ``each`` is 1/1024 of the device's BAR heap,
        32–256 MiB (64 MiB on an H100, 128 MiB on an H200), and ``total`` twice that. ``trim()``
        gives them back; ``set_spare_limits`` changes them."""
        return self._handle().spare_limits

    def set_spare_limits(self, each: int, total: int) -> int:
        """Keeps the mappings freed ``RawMemory`` leave within new limits from now on: up to
        ``each`` bytes each, ``total`` in all (0 keeps none: every free gives its memory back
        to the driver, as in vkgdr 0.1). Those kept beyond the new limits go back to the driver
        now; returns how many. A negative limit raises ``OverflowError``."""
        return self._handle().set_spare_limits(each, total)

    def __repr__(self) -> str:
        cls = type(self)
        state = "not opened" if self._impl is None else self._impl.describe()
        return f"<{cls.__module__}.{cls.__qualname__} {state}>"


@_refuse_copies
class RawMemory:
    """One raw allocation in the calling thread's current CUDA context (vkgdr 0.1's
    ``RawMemory``).

    ``RawMemory(owner, size, flags=0)``: ``size`` bytes (``len()`` reports exactly that) with a
    host mapping (``np.asarray(mem)`` is a writable view of ``|V1`` items,
    ``__array_interface__``) and a device pointer (``device_ptr``,
    ``__cuda_array_interface__``). ``owner`` is a :class:`Vkgdr` of the current context's
    device; ``flags`` is ignored (vkgdr 0.1 defines none). The context current at allocation
    must stay alive until the memory is released (see below: with views alive at ``free()``,
    until the last is gone); the release needs no current context.

    Classes derived from it may take other ``__init__`` arguments and add bases (as
    :class:`vkgdr.pycuda.Memory` does); their ``__init__`` must call ``RawMemory.__init__``
    (``super().__init__(owner, size, flags)``) before the memory is used.

    ``free(*, after=None, now=False)`` frees it (safe to call twice; collecting the object frees
    it too). It never waits for a kernel: the memory goes back once the GPU work queued before
    the free on the legacy default stream, and so on every blocking stream (the default of CUDA
    C, CuPy, PyTorch and PyCUDA), has completed. ``after=stream`` waits for the work queued on
    that stream instead (a CuPy, PyTorch, PyCUDA or Numba stream object, or one with
    ``__cuda_stream__``, which is kept alive until then; or a raw ``CUstream`` handle wrapped as
    :class:`RawStream`): use it for memory a kernel on a non-blocking stream may still use.
    ``now=True`` releases without waiting for any GPU work, for callers who know none uses the
    memory. A bare int raises ``TypeError`` (an int that names no stream would crash the CUDA
    driver): a ``RawStream``'s handle is the program's promise that it names a live stream of
    this memory's device; where the driver lacks stream memory operations (an event then fences
    the release), the stream's context must stay alive until the memory is released, as in C.

    **Views keep the memory.** Once ``__array_interface__`` or ``__cuda_array_interface__`` has
    been read (``np.asarray(mem)``, ``cupy.asarray(mem)``, Numba, PyTorch), ``free()`` releases
    the memory at once only if nothing but the caller's variables refers to the object. If
    something else does (a view, whose ``base`` or owner is this object, or any other
    reference), the object is marked freed at once (its attributes raise ``VkgdrError``, as
    after any free) and the memory is released when the object is deallocated, i.e. when the
    last view (and the caller's last reference) is gone, fenced then on the stream named by
    ``after`` (which must still be alive: objects are kept, ``RawStream`` handles are the
    caller's) or on the legacy stream (``now=True`` then gets that default fence). Views
    therefore never touch memory that was handed back, and kernels launched through them before
    the release on a blocking stream, or on the ``after`` stream, are waited for. Memory whose interfaces were
    never read is released at once, as in vkgdr 0.1. A ``free()`` of a derived class that calls
    this one (``super().free()``) is counted from inside that method, and a call through the class
    (``RawMemory.free(mem)``) conservatively: exported memory may then wait until the object is
    collected. Addresses taken as integers (``host_ptr``, ``device_ptr``,
    the interfaces' ``data``) are the caller's to stop using, as in C. (Pool blocks count their
    views exactly instead; vkgdr 0.1's interfaces cannot: NumPy, given 0.1's tuple ``data``, and
    CuPy, Numba, PyTorch and PyCUDA all hold this object itself, so only its reference count
    shows a view. The package's README says more.)

    ``copy.copy``, ``copy.deepcopy`` and pickling raise ``TypeError``: a copy would be a second
    owner of the same allocation.

    ``shareable=True`` (beyond vkgdr 0.1) makes an allocation of its own, in ``owner``'s context
    rather than the current one (none need be current), which :meth:`ShareServer.share_memory`
    shares with other processes: a small allocation made without it is carved out of a granule
    other allocations share, and a peer that mapped it would reach them too. It is rounded up to
    the VMM granularity (2 MiB on the H100).

    Raises
    ------
    VkgdrError
        if the allocation fails (``OutOfDeviceMemoryError`` when BAR memory is exhausted), or no
        CUDA context is current on the calling thread (the message says how to make one current;
        ``result_name`` is ``CUDA_ERROR_INVALID_CONTEXT``)
    TypeError
        if ``owner`` is not a :class:`Vkgdr`
    """

    _impl: Optional[_RawMemory] = None

    def __init__(
        self, owner: Vkgdr, size: int, flags: int = 0, *, shareable: bool = False
    ) -> None:
        if self._impl is not None:
            raise VkgdrError(f"this {type(self).__name__} is allocated already")
        if shareable:
            self._impl = _RawMemory(owner, size, flags, shareable=True)
        else:
            self._impl = _RawMemory(owner, size, flags)

    def _memory(self) -> _RawMemory:
        memory = self._impl
        if memory is None:
            raise VkgdrError(
                f"this {type(self).__name__} has no memory: the __init__ of a class derived "
                f"from vkgdr.RawMemory must call vkgdr.RawMemory.__init__"
            )
        return memory

    #: ``free(*, after=None, now=False)``: frees the memory without waiting for the GPU (see the
    #: class docs: ``after`` names the stream whose queued work the release waits for,
    #: ``now=True`` waits for none, and memory that views may still use is released when the last
    #: one is gone). Safe to call twice; a second call changes nothing. Written in the extension,
    #: as a descriptor: its bound object holds the receiver exactly once whatever the shape of the
    #: call (``mem.free()``, ``mem.free(**kw)``, ``f = mem.free; f()``), which the reference count
    #: that finds views relies on.
    free = _FreeMethod()

    def _release_begin(self) -> None:
        """Called by ``free()`` before it may hand the memory back: a hook for derived classes
        (vkgdr.pycuda.Memory pushes its CUDA context)."""

    def _release_end(self) -> None:
        """Called by ``free()`` after what :meth:`_release_begin` preceded, even when that
        raised."""

    @property
    def is_freed(self) -> bool:
        """Whether ``free()`` was called (the memory may still wait for its views)."""
        return self._memory().is_freed

    @property
    def device_ptr(self) -> int:
        """The CUDA device pointer (``CUdeviceptr``) of the first byte."""
        return self._memory().device_ptr

    @property
    def host_ptr(self) -> int:
        """The host address of the first byte."""
        return self._memory().host_ptr

    def __len__(self) -> int:
        """The size in bytes, as allocated."""
        return len(self._memory())

    @property
    def is_coherent(self) -> bool:
        """Whether host writes are visible to the device without ``flush`` (and device writes
        to the host without ``invalidate``)."""
        return self._memory().is_coherent

    @property
    def non_coherent_atom_size(self) -> int:
        """The granularity of ``flush`` and ``invalidate`` (1 on coherent memory)."""
        return self._memory().non_coherent_atom_size

    def flush(self, offset: int, size: int) -> None:
        """Makes host writes in ``[offset, offset + size)`` visible to the device (rounded out
        to whole atoms inside the allocation; on coherent memory only a store fence)."""
        self._memory().flush(offset, size)

    def invalidate(self, offset: int, size: int) -> None:
        """Makes device writes in ``[offset, offset + size)`` visible to host reads."""
        self._memory().invalidate(offset, size)

    @property
    def __array_interface__(self) -> Dict[str, Any]:
        """NumPy's array interface: ``size`` writable bytes of type ``|V1`` (as vkgdr 0.1).
        Views made from it keep the memory (see the class docs)."""
        return self._memory().__array_interface__

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """The CUDA array interface (v3): ``size`` bytes of ``uint8`` at ``device_ptr``. Arrays
        made from it keep the memory (see the class docs)."""
        return self._memory().__cuda_array_interface__

    def __repr__(self) -> str:
        cls = type(self)
        state = "not allocated" if self._impl is None else self._impl.describe()
        return f"<{cls.__module__}.{cls.__qualname__} {state}>"
