"""Type stubs of the extension module vkgdr._vkgdr (re-exported by vkgdr)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, TypeVar, Union

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
    """A bad argument (size, range, alignment, flags)."""

_V = TypeVar("_V", bound="Vkgdr")

class Vkgdr:
    """A CUDA device opened for BAR mappings (vkgdr 0.1's handle)."""

    def __init__(self, device: int, flags: int = 0) -> None: ...
    @classmethod
    def open_current_context(cls: Type[_V], flags: int = 0) -> _V: ...
    @property
    def name(self) -> str: ...
    @property
    def uuid(self) -> bytes: ...
    @property
    def device(self) -> int: ...
    @property
    def is_coherent(self) -> bool: ...

class RawMemory:
    """One allocation in the current CUDA context (vkgdr 0.1's RawMemory)."""

    def __init__(self, owner: Vkgdr, size: int, flags: int = 0) -> None: ...
    def free(self) -> None: ...
    @property
    def device_ptr(self) -> int: ...
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

class Pool:
    """Many small aligned blocks carved out of a few BAR-mapped chunks."""

    def __init__(
        self,
        owner: Vkgdr,
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
    def stats(self) -> Dict[str, int]: ...
    @property
    def is_coherent(self) -> bool: ...
    @property
    def has_device_memory(self) -> bool: ...

class Block:
    """A block of pool memory, freed when it and every view of it are gone."""

    def __len__(self) -> int: ...
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
    """The device addresses a ring consumer kernel takes."""

    data: int
    capacity: int
    tail: int
    stop: int
    head: int
    result: int
    mirrored: bool
    def kernel_args(self) -> Tuple[int, int, int, int, int, int]: ...

class DeviceRing:
    """A ring buffer in BAR-mapped GPU memory feeding a running kernel."""

    def __init__(self, owner: Vkgdr, capacity: int, *, mirrored: bool = False) -> None: ...
    def push(self, data: Any, timeout: Optional[float] = None) -> int: ...
    @property
    def device_view(self) -> RingDeviceView: ...
    @property
    def head(self) -> int: ...
    def results(self) -> List[int]: ...
    def stop(self) -> None: ...
    @property
    def capacity(self) -> int: ...
    @property
    def max_record(self) -> int: ...
    @property
    def published(self) -> int: ...
    @property
    def free_space(self) -> int: ...
