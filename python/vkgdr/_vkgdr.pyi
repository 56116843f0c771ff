"""Type stubs of the extension module vkgdr._vkgdr (re-exported by vkgdr).

Every class here refuses ``copy.copy``, ``copy.deepcopy`` and pickling with ``TypeError`` (they
are handles to GPU memory and driver state); the exceptions copy and pickle as Python's own do.
"""

import os
import pathlib
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
    overload,
)

__version__: str
OPEN_CURRENT_CONTEXT_BIT: int
OPEN_FORCE_NON_COHERENT_BIT: int
OPEN_REQUIRE_COHERENT_BIT: int
DLPACK_DEVICE_CPU: int
DLPACK_DEVICE_CUDA: int

class VkgdrError(RuntimeError):
    """Every vkgdr failure; driver failures read '<call> failed (<RESULT_NAME>)'."""

    call: Optional[str]
    result_name: Optional[str]

class OutOfDeviceMemoryError(VkgdrError):
    """BAR-mappable memory (or a pool's max_bytes) is exhausted."""

class LibraryNotFoundError(VkgdrError):
    """libcuda.so.1 or the Vulkan loader could not be loaded."""

class RingFullError(VkgdrError):
    """No room in the ring within the timeout."""

class InvalidArgumentError(VkgdrError, ValueError):
    """A bad argument (size, range, alignment, stream); unknown flag bits are ignored, as in 0.1."""

class ShareError(VkgdrError):
    """Sharing with another process failed: a refusal, a revocation, a hang-up, a timeout, or a
    message, descriptor or fd refused by name."""

    #: 'no_such_region', 'not_allowed', 'revoked', 'busy', 'out_of_memory', 'quota',
    #: 'bad_request', 'internal', 'disconnected', 'timeout', 'name_taken', or None.
    reason: Optional[str]

class _CupyStream(Protocol):
    ptr: int

class _TorchStream(Protocol):
    cuda_stream: int

class _PycudaStream(Protocol):
    handle: Any

class _CudaStreamProtocol(Protocol):
    def __cuda_stream__(self) -> Tuple[int, int]: ...

class RawStream:
    """A raw ``CUstream`` handle the program vouches for (0: the legacy default stream), for the
    arguments that take a CUDA stream and refuse a bare int. It must name a live stream of the
    device of the memory or ring it is passed for (a handle that names none crashes the process
    inside the CUDA driver); pass the stream object itself where there is one."""

    def __init__(self, handle: int) -> None: ...
    @property
    def handle(self) -> int: ...

#: A CUDA stream: a CuPy (``.ptr``), PyTorch (``.cuda_stream``), PyCUDA or Numba (``.handle``)
#: stream, an object with ``__cuda_stream__``, or a raw handle as ``RawStream(handle)``. A bare
#: int raises ``TypeError``.
_CudaStream = Union[RawStream, _CupyStream, _TorchStream, _PycudaStream, _CudaStreamProtocol]

class _Vkgdr:
    """Internal: the open device a ``vkgdr.Vkgdr`` holds."""

    def __init__(self, device: int, flags: int = 0) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def uuid(self) -> bytes: ...
    @property
    def device(self) -> int: ...
    @property
    def is_coherent(self) -> bool: ...
    def pending_releases(self) -> int: ...
    def release_times(self) -> "ReleaseTimes": ...
    def wait_for_releases(self, timeout: float = 30.0) -> bool: ...
    def trim(self) -> int: ...
    @property
    def spare_limits(self) -> Tuple[int, int]: ...
    def set_spare_limits(self, each: int, total: int) -> int: ...
    def describe(self) -> str: ...

class SlowRelease:
    """One release and how long it took, or has taken so far: ``seconds``, and ``what`` was
    released (the library's type name without module paths, e.g. ``"Backing"``)."""

    seconds: float
    what: str

class ReleaseTimes:
    """How the releases of a ``Vkgdr``'s memory went (``Vkgdr.release_times()``): ``waiting``
    now, the one that has waited longest of those, the drop under way that began first, and the
    slowest so far (each ``None`` when there is none)."""

    waiting: int
    oldest_waiting: Optional[SlowRelease]
    longest_dropping: Optional[SlowRelease]
    longest_wait: Optional[SlowRelease]
    longest_turn: Optional[SlowRelease]
    longest_drop: Optional[SlowRelease]

class _BoundFree:
    """Internal: ``free`` bound to a ``vkgdr.RawMemory``."""

    __self__: Any
    def __call__(self, *, after: Optional[_CudaStream] = None, now: bool = False) -> None:
        """Frees without waiting: after the work queued on the legacy stream (default), on
        ``after`` (a stream object, or ``RawStream(handle)``; a bare int raises ``TypeError``),
        or none (``now=True``); with live views, when the last one is gone."""

class _FreeMethod:
    """Internal: ``vkgdr.RawMemory.free``, a descriptor."""

    def __init__(self) -> None: ...
    @overload
    def __get__(self, obj: None, owner: Any = None) -> "_FreeMethod": ...
    @overload
    def __get__(self, obj: object, owner: Any = None) -> _BoundFree: ...
    def __call__(
        self, obj: Any, *, after: Optional[_CudaStream] = None, now: bool = False
    ) -> None: ...

class _HasHandle(Protocol):
    @property
    def _impl(self) -> Optional[_Vkgdr]: ...

#: What ``owner`` arguments take: a ``vkgdr.Vkgdr`` (of any derived class), or its ``_Vkgdr``.
_Owner = Union[_Vkgdr, _HasHandle]

class _RawMemory:
    """Internal: the raw allocation a ``vkgdr.RawMemory`` holds."""

    def __init__(
        self, owner: _Owner, size: int, flags: int = 0, *, shareable: bool = False
    ) -> None: ...
    @staticmethod
    def _over_pool(
        pool: "Pool", size: int, on_release: Callable[[Union[str, int]], Any]
    ) -> "_RawMemory":
        """Internal, for the tests without a GPU: a pool block standing in for an allocation."""
    def release(self) -> None: ...
    @property
    def exports(self) -> int: ...
    @property
    def is_freed(self) -> bool: ...
    @property
    def is_released(self) -> bool: ...
    @property
    def device_ptr(self) -> int: ...
    def exported_device_ptr(self) -> int: ...
    @property
    def host_ptr(self) -> int: ...
    def __len__(self) -> int: ...
    @property
    def is_coherent(self) -> bool: ...
    @property
    def non_coherent_atom_size(self) -> int: ...
    def flush(self, offset: int, size: int) -> None: ...
    def invalidate(self, offset: int, size: int) -> None: ...
    @property
    def __array_interface__(self) -> Dict[str, Any]: ...
    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]: ...
    def describe(self) -> str: ...

class Pool:
    """Many small aligned blocks carved out of a few BAR-mapped chunks."""

    def __init__(
        self,
        owner: _Owner,
        *,
        chunk_size: Optional[int] = None,
        max_chunk_size: Optional[int] = None,
        dedicated_threshold: Optional[int] = None,
        max_bytes: Optional[int] = None,
        shards: Optional[int] = None,
        keep_empty_chunks: Optional[int] = None,
        thread_cache: Optional[int] = None,
        thread_cache_bytes: Optional[int] = None,
        max_align: Optional[int] = None,
    ) -> None: ...
    @staticmethod
    def vulkan_only(
        *,
        device_index: Optional[int] = None,
        require_coherent: bool = False,
        force_non_coherent: bool = False,
        chunk_size: Optional[int] = None,
        max_chunk_size: Optional[int] = None,
        dedicated_threshold: Optional[int] = None,
        max_bytes: Optional[int] = None,
        shards: Optional[int] = None,
        keep_empty_chunks: Optional[int] = None,
        thread_cache: Optional[int] = None,
        thread_cache_bytes: Optional[int] = None,
        max_align: Optional[int] = None,
    ) -> "Pool": ...
    def alloc(self, size: int, align: int = 64) -> "Block": ...
    def flush(self) -> None: ...
    def trim(self) -> int: ...
    def stats(self) -> Dict[str, Any]: ...
    @property
    def is_coherent(self) -> bool: ...
    @property
    def has_device_memory(self) -> bool: ...
    def set_release_feed(self, ring: "DeviceToHostRing") -> None:
        """Gives the ring's lanes to the pool: kernels' ``vkgdr_release_token`` records bring
        blocks lent with ``Block.release_on_device()`` back."""
    def release_many_on_device(self, blocks: Sequence["Block"]) -> List[int]:
        """``Block.release_on_device()`` for many blocks, one lock: their tokens, in order.
        Refused part-way: ``VkgdrError`` whose ``tokens`` holds the tokens of the blocks lent
        before; the blocks from ``len(e.tokens)`` on are unchanged."""
    def drain_device_releases(self) -> int: ...
    @property
    def lent_blocks(self) -> int: ...
    def reclaim_device_releases(self) -> int:
        """Frees every lent block at once: only once no kernel uses them any more."""

class Block:
    """A block of pool memory, given back when it and every view of it are gone."""

    def __len__(self) -> int: ...
    def free(self, *, after: Optional[_CudaStream] = None) -> None:
        """Gives the block back (once no view or export is left, and ``after`` has passed: a
        stream object, or a raw handle as ``RawStream(handle)``; a bare int raises
        ``TypeError``)."""
    @property
    def is_freed(self) -> bool: ...
    @property
    def is_sent(self) -> bool:
        """Whether ``ShareServer.send_block`` handed it to another process (the object is
        spent)."""
    def release_on_device(self) -> int:
        """Lends the block to a kernel: the token it passes to ``vkgdr_release_token`` (the
        object is spent; the block returns when the token arrives through the pool's release
        feed)."""
    @property
    def is_released_on_device(self) -> bool: ...
    @property
    def size(self) -> int: ...
    @property
    def host_ptr(self) -> int: ...
    @property
    def device_ptr(self) -> Optional[int]: ...
    @property
    def is_dedicated(self) -> bool: ...
    @property
    def is_coherent(self) -> bool: ...
    @property
    def __array_interface__(self) -> Dict[str, Any]: ...
    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]: ...
    def view(self, dtype: Any = None, shape: Union[None, int, Sequence[int]] = None) -> Any:
        """A typed NumPy view (numpy.ndarray) of the host mapping."""
    def write(self, data: Any, offset: int = 0) -> None: ...
    def read(self, offset: int = 0, size: Optional[int] = None) -> bytes: ...
    def flush(self, offset: int = 0, size: Optional[int] = None) -> None: ...
    def invalidate(self, offset: int = 0, size: Optional[int] = None) -> None: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...

class RingDeviceView:
    """The device addresses a ring consumer kernel takes; keeps its ring alive."""

    ring: "DeviceRing"
    data: int
    capacity: int
    tail: int
    stop: int
    head: int
    result: int
    mirrored: bool
    lanes: int
    lane_data: int
    def kernel_args(self) -> Tuple[int, int, int, int, int, int]: ...
    def to_bytes(self) -> bytes:
        """The 64-byte ``vkgdr_ring_view`` of ``include/vkgdr/ring.cuh``, for kernels that take
        the view by value (``ring_check_lanes``)."""

class DeviceRing:
    """A ring buffer in BAR-mapped GPU memory feeding a running kernel."""

    def __init__(
        self,
        owner: _Owner,
        capacity: int,
        *,
        mirrored: bool = False,
        lanes: int = 1,
        copy_engine: Optional[int] = None,
        copy_engine_split: bool = False,
        shareable: bool = False,
    ) -> None:
        """``copy_engine``: the record size (16-byte header included) from which a producer's
        records take the copy engine, 0 for never, None (the default) to let the ring choose
        (a one-lane ring keeps the BAR; on more lanes, three in eight keep it and the others
        stage records of 1 KiB and more). ``copy_engine_split=True`` (with a positive
        ``copy_engine``, not with ``shareable=True``) keeps records below 8 KiB on the BAR on
        three lanes in eight (those whose index modulo 8 is 0, 3 or 6) and stages records of at
        least ``copy_engine`` bytes for the copy engine on the others."""
    def push(self, data: Any, timeout: Optional[float] = None) -> int: ...
    def producer(self) -> "RingProducer":
        """Claims a free lane for one thread; raises ``VkgdrError`` when every lane has a
        producer."""
    @property
    def device_view(self) -> RingDeviceView: ...
    @property
    def head(self) -> int: ...
    def results(self) -> List[int]: ...
    @property
    def lanes(self) -> int: ...
    def head_of(self, lane: int) -> int: ...
    def results_of(self, lane: int) -> List[int]: ...
    def copy_engine_stats(self) -> Dict[str, Any]:
        """``lanes_ready``, ``copies``, ``bytes``, ``fallbacks``, ``stream_tails`` (ints) and
        ``unavailable`` (why the copy engine could not be used, or None)."""
    def stop(self) -> None: ...
    def watch_consumer(self, stream: _CudaStream) -> None:
        """Registers the consumer just launched on ``stream`` (a stream object, or a raw handle
        as ``RawStream(handle)``; a bare int raises ``TypeError``): dropping the ring then stops
        it and keeps the ring's memory until it has exited."""
    @property
    def capacity(self) -> int: ...
    @property
    def max_record(self) -> int: ...
    @property
    def published(self) -> int: ...
    @property
    def free_space(self) -> int: ...
    @property
    def is_shareable(self) -> bool:
        """Made with ``shareable=True``: ``ShareServer.share_ring`` lends its lanes."""

class RingProducer:
    """The exclusive producer of one lane of a ``DeviceRing`` (``ring.producer()``); keeps the
    ring alive. For one thread at a time."""

    def push(self, data: Any, timeout: Optional[float] = None) -> int: ...
    def write(self, data: Any, timeout: Optional[float] = None) -> int: ...
    def push_batch(self, records: Iterable[Any], timeout: Optional[float] = None) -> int: ...
    def set_flush_policy(
        self, max_pending_bytes: int, max_delay: Optional[float] = None
    ) -> None: ...
    def flush(self) -> None: ...
    @property
    def stage_after(self) -> int: ...
    @stage_after.setter
    def stage_after(self, bytes: int) -> None: ...
    @property
    def next_seq(self) -> int: ...
    @property
    def lane(self) -> int: ...
    @property
    def ring(self) -> DeviceRing: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> "RingProducer": ...
    def __exit__(self, *exc: Any) -> bool: ...

# --- Device -> host rings ---------------------------------------------------------------------

class DeviceToHostView:
    """What a producing kernel takes: the fields of ``vkgdr_d2h_view``
    (``include/vkgdr/ring_d2h.cuh``); keeps its ring alive."""

    ring: "DeviceToHostRing"
    slots: int
    control: int
    device: int
    slots_per_lane: int
    stride: int
    lanes: int
    spin_limit: int
    format: int
    def to_bytes(self) -> bytes:
        """The 48 bytes of ``vkgdr_d2h_view``, for the kernel's by-value parameter."""

class DeviceToHostRing:
    """A ring whose records go from kernels (``ring_d2h.cuh``) to Python threads, one
    ``LaneConsumer`` per lane."""

    def __init__(
        self,
        owner: _Owner,
        slots: int,
        stride: int,
        *,
        lanes: int = 1,
        spin_limit: int = 1000000,
        format: str = "committed",
    ) -> None: ...
    def consumer(self, lane: int) -> "LaneConsumer":
        """The lane's consumer; raises ``VkgdrError`` while the lane has one."""
    @property
    def device_view(self) -> DeviceToHostView: ...
    @property
    def lanes(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def stride(self) -> int: ...
    @property
    def max_payload(self) -> int: ...
    @property
    def format(self) -> str: ...
    @property
    def spin_limit(self) -> int: ...
    def finish(self) -> None:
        """Declares the producing kernels finished (their stream was synchronised)."""
    def restart(self) -> None: ...
    @property
    def is_finished(self) -> bool: ...
    def close(self) -> None:
        """Closes every lane: waiting kernels give up with ``VKGDR_D2H_CLOSED``."""
    def lane_stats(self, lane: int) -> Dict[str, int]:
        """``reserved``, ``taken`` and ``gave_up`` of lane ``lane``."""

class LaneRecord:
    """One record taken from a lane."""

    seq: int
    kind: int
    payload: bytes

class LaneConsumer:
    """The consumer of one lane of a ``DeviceToHostRing`` (``ring.consumer(lane)``): an
    iterator of ``LaneRecord`` that ends once the ring is finished and the lane empty. For one
    thread at a time."""

    def try_next(self) -> Optional[LaneRecord]: ...
    def publish_head(self) -> None:
        """Hands the slots of every record taken back to the device now (else at the next
        call or close)."""
    def next(self, timeout: Optional[float] = None) -> Optional[LaneRecord]:
        """None when nothing came within ``timeout`` or the lane ended (``ended``)."""
    @property
    def ended(self) -> bool: ...
    def __iter__(self) -> "LaneConsumer": ...
    def __next__(self) -> LaneRecord: ...
    @property
    def next_seq(self) -> int: ...
    @property
    def lane(self) -> int: ...
    @property
    def ring(self) -> DeviceToHostRing: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> "LaneConsumer": ...
    def __exit__(self, *exc: Any) -> bool: ...

# --- Sharing with other processes ----------------------------------------------------------------

_Path = Union[str, "os.PathLike[str]"]

class VulkanDevice:
    """A Vulkan device opened with no CUDA: an owner of shared memory for CPU-only owners (and
    the sharing tests on Mesa's lavapipe)."""

    def __init__(
        self,
        *,
        device_index: Optional[int] = None,
        require_coherent: bool = False,
        force_non_coherent: bool = False,
    ) -> None: ...
    def alloc(self, size: int) -> "VulkanMemory": ...
    def pool(
        self,
        *,
        chunk_size: Optional[int] = None,
        max_chunk_size: Optional[int] = None,
        dedicated_threshold: Optional[int] = None,
        max_bytes: Optional[int] = None,
        shards: Optional[int] = None,
        keep_empty_chunks: Optional[int] = None,
        thread_cache: Optional[int] = None,
        thread_cache_bytes: Optional[int] = None,
        max_align: Optional[int] = None,
    ) -> Pool: ...
    def checking_ring(self, capacity: int, lanes: int = 1) -> "CheckingRing":
        """For tests and CPU-only owners: lanes consumed by a CPU thread that checks every
        record (sealed test payloads)."""
    @property
    def name(self) -> str: ...
    @property
    def uuid(self) -> bytes: ...
    @property
    def is_coherent(self) -> bool: ...

class VulkanMemory:
    """Host-mapped memory of a ``VulkanDevice`` (no device pointer); freed when it and its
    views are gone."""

    def __len__(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def host_ptr(self) -> int: ...
    @property
    def is_coherent(self) -> bool: ...
    @property
    def __array_interface__(self) -> Dict[str, Any]: ...
    def view(self, dtype: Any = None, shape: Union[None, int, Sequence[int]] = None) -> Any: ...
    def write(self, data: Any, offset: int = 0) -> None: ...
    def read(self, offset: int = 0, size: Optional[int] = None) -> bytes: ...
    def flush(self, offset: int = 0, size: Optional[int] = None) -> None: ...
    def invalidate(self, offset: int = 0, size: Optional[int] = None) -> None: ...

class CheckingRing:
    """For tests and CPU-only owners: a ring whose lanes remote producers fill and a CPU thread
    of this process consumes, checking every record as ``ring_check_lanes`` does."""

    @property
    def lanes(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    def head_of(self, lane: int) -> int: ...
    def published_of(self, lane: int) -> int: ...
    def is_lent(self, lane: int) -> bool: ...
    def results_of(self, lane: int) -> List[int]:
        """Records, checksum sum, errors, next sequence number, position, then zeros."""
    def stop(self) -> None: ...
    @property
    def is_stopped(self) -> bool: ...

class ShareEvent:
    """What happened between the owner and its peers; ``kind`` says what and which fields are
    set: 'connected', 'refused', 'attached', 'request_refused', 'detached', 'released',
    'lane_fault', 'misbehaved', 'gone'."""

    kind: str
    peer: Optional[int]
    pid: Optional[int]
    uid: Optional[int]
    region: Optional[str]
    attachment: Optional[int]
    token: Optional[int]
    lane: Optional[int]
    why: Optional[str]

class ShareServer:
    """The owner's side of sharing: a Unix socket peers connect to, and what is shared there
    by name."""

    def __init__(
        self,
        owner: Union[_Owner, VulkanDevice],
        path: _Path,
        *,
        peers: Union[str, Iterable[int], None] = None,
        socket_mode: int = 0o600,
        return_blocks: bool = True,
    ) -> None:
        """``peers``: "same-user" (default), "any", or the uids that may attach."""
    @property
    def path(self) -> "pathlib.Path": ...
    @property
    def closed(self) -> bool: ...
    def share_memory(self, name: str, memory: Any) -> None:
        """``memory``: a ``vkgdr.RawMemory`` made with ``shareable=True``, or a
        ``VulkanMemory``."""
    def share_pool(self, name: str, pool: Pool, quota: int) -> None: ...
    def share_ring(self, name: str, ring: Union[DeviceRing, CheckingRing]) -> None:
        """``ring``: a ``DeviceRing`` made with ``shareable=True``, or a ``CheckingRing``."""
    def unshare(self, name: str) -> bool: ...
    def send_block(self, peer: int, name: str, block: Block) -> int:
        """Hands ``block`` to ``peer`` (the object is spent); returns its token."""
    def take_returned(self, token: int) -> Optional[Block]: ...
    def drain_returned(self) -> List[Tuple[int, int, Block]]: ...
    def revoke_block(self, peer: int, token: int) -> None: ...
    def revoke(self, peer: int) -> None: ...
    def next_event(self, timeout: Optional[float] = None) -> Optional[ShareEvent]: ...
    def peers(self) -> List[Dict[str, int]]:
        """``peer``, ``pid``, ``uid``, ``gid``, ``attachments``, ``blocks``, ``block_bytes``."""
    def stats(self) -> Dict[str, int]:
        """``connected``, ``refused``, ``gone``, ``misbehaved``, ``lane_faults``, ``peers``."""
    def close(self) -> None: ...
    def __enter__(self) -> "ShareServer": ...
    def __exit__(self, *exc: Any) -> bool: ...

class Peer:
    """A connection to an owner's ``ShareServer``, made with no CUDA (``vkgdr.attach``)."""

    def __init__(self, path: _Path, *, timeout: float = 10.0) -> None: ...
    @property
    def path(self) -> "pathlib.Path": ...
    @property
    def timeout(self) -> float: ...
    @property
    def owner(self) -> Tuple[int, int, int]:
        """The owner's ``(pid, uid, gid)``."""
    @property
    def closed(self) -> bool: ...
    def attach_memory(self, name: str) -> "AttachedMemory": ...
    def attach_pool(self, name: str) -> "AttachedPool": ...
    def attach_lane(self, name: str) -> "AttachedLane": ...
    def poll(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Peer": ...
    def __exit__(self, *exc: Any) -> bool: ...

class AttachedMemory:
    """An owner's raw memory, mapped into this process; detached when it and its views go."""

    def __len__(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def host_ptr(self) -> int: ...
    @property
    def is_coherent(self) -> bool: ...
    @property
    def is_revoked(self) -> bool: ...
    @property
    def is_detached(self) -> bool: ...
    @property
    def __array_interface__(self) -> Dict[str, Any]: ...
    def view(self, dtype: Any = None, shape: Union[None, int, Sequence[int]] = None) -> Any: ...
    def write(self, data: Any, offset: int = 0) -> None: ...
    def read(self, offset: int = 0, size: Optional[int] = None) -> bytes: ...
    def flush(self, offset: int = 0, size: Optional[int] = None) -> None: ...
    def invalidate(self, offset: int = 0, size: Optional[int] = None) -> None: ...
    def detach(self) -> None: ...
    def __enter__(self) -> "AttachedMemory": ...
    def __exit__(self, *exc: Any) -> bool: ...

class AttachedPool:
    """An owner's pool: where shared blocks come from."""

    @property
    def quota(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def is_revoked(self) -> bool: ...
    @property
    def is_detached(self) -> bool: ...
    def request(self, size: int, align: int = 64) -> "SharedBlock": ...
    def next_block(self, timeout: Optional[float] = None) -> Optional["SharedBlock"]: ...
    def detach(self) -> None: ...
    def __enter__(self) -> "AttachedPool": ...
    def __exit__(self, *exc: Any) -> bool: ...

class SharedBlock:
    """A block of an owner's pool lent to this process; given back by ``release()``."""

    def __len__(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def token(self) -> int: ...
    @property
    def host_ptr(self) -> int: ...
    @property
    def is_coherent(self) -> bool: ...
    @property
    def is_revoked(self) -> bool: ...
    @property
    def is_released(self) -> bool: ...
    @property
    def __array_interface__(self) -> Dict[str, Any]: ...
    def view(self, dtype: Any = None, shape: Union[None, int, Sequence[int]] = None) -> Any: ...
    def write(self, data: Any, offset: int = 0) -> None: ...
    def read(self, offset: int = 0, size: Optional[int] = None) -> bytes: ...
    def flush(self, offset: int = 0, size: Optional[int] = None) -> None: ...
    def invalidate(self, offset: int = 0, size: Optional[int] = None) -> None: ...
    def release(self) -> None: ...
    def __enter__(self) -> "SharedBlock": ...
    def __exit__(self, *exc: Any) -> bool: ...

class AttachedLane:
    """A lane of an owner's ring, produced into by this process."""

    @property
    def lane(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def capacity(self) -> int: ...
    @property
    def max_record(self) -> int: ...
    @property
    def start(self) -> Tuple[int, int]:
        """``(tail, seq)`` where this producer started."""
    @property
    def next_seq(self) -> int: ...
    @property
    def accepted(self) -> Tuple[int, int]:
        """``(tail, seq)`` as far as the owner has passed records on."""
    @property
    def published(self) -> int: ...
    @property
    def head(self) -> int: ...
    @property
    def is_stopped(self) -> bool: ...
    @property
    def stop_reason(self) -> Optional[str]: ...
    @property
    def is_detached(self) -> bool: ...
    def push(self, data: Any, timeout: Optional[float] = None) -> int: ...
    def push_batch(self, records: Iterable[Any], timeout: Optional[float] = None) -> int: ...
    def detach(self) -> None: ...
    def __enter__(self) -> "AttachedLane": ...
    def __exit__(self, *exc: Any) -> bool: ...

def _after_fork_in_child() -> None:
    """Internal: run in every forked child (``os.register_at_fork``)."""

