"""No Python call sequence may crash the interpreter, checked without a GPU (Mesa's lavapipe on
CI): a bare int is no CUDA stream (an int that names none crashed the CUDA driver in a release
fenced on it), raw handles pass only as ``vkgdr.RawStream``, and no object of the package can be
copied or pickled (a copy of a ``RawMemory`` was a second owner of one allocation). Pool blocks
are real exported Vulkan memory; ``RawMemory`` stands on a block, as in test_vulkan_compat.py.
What needs CUDA (a real ``RawMemory``, rings, a context-less thread) is in test_gpu_hostile.py.
"""

import copy
import gc
import pickle
from typing import Any, Callable, List

import numpy as np
import pytest

import vkgdr
from conftest import FakeContext, import_pycuda_shim, vulkan_pool
from vkgdr import _vkgdr

#: What the stand-in allocation ignores: there is no device to open without a GPU.
OWNER = object()


@pytest.fixture()
def pool() -> vkgdr.Pool:
    return vulkan_pool(chunk_size=1 << 20, thread_cache=0)


def in_use(pool: vkgdr.Pool) -> int:
    return pool.stats()["bytes_in_use"]


@pytest.fixture()
def releases(monkeypatch, pool) -> List[Any]:
    """Makes ``vkgdr.RawMemory`` allocate blocks of ``pool`` (see test_vulkan_compat.py); the
    list records each release: ``"default"``, ``"now"`` or the ``after=`` handle."""
    done: List[Any] = []
    monkeypatch.setattr(
        vkgdr,
        "_RawMemory",
        lambda owner, size, flags=0: _vkgdr._RawMemory._over_pool(pool, size, done.append),
    )
    return done


# --- Streams -------------------------------------------------------------------------------------


def bare_ints() -> List[Any]:
    return [12345, 0, 1, -1, 2**64, np.int64(12345), np.uint64(0)]


def assert_bare_int_refused(free: Callable[[], None], value: Any) -> None:
    with pytest.raises(TypeError) as e:
        free()
    assert type(e.value) is TypeError, "a TypeError, not an InvalidArgumentError"
    text = str(e.value)
    assert text.startswith(f"free(after=...) takes a CUDA stream object, not the int {value}:")
    assert "an int that names no live stream crashes the CUDA driver" in text
    assert "vkgdr.RawStream(handle)" in text and "__cuda_stream__" in text


@pytest.mark.parametrize("value", bare_ints(), ids=repr)
def test_a_bare_int_is_no_stream_for_a_block(value, pool) -> None:
    b = pool.alloc(64)
    assert_bare_int_refused(lambda: b.free(after=value), value)
    assert not b.is_freed and in_use(pool) == 64, "the refused call changed nothing"
    b.free()
    assert in_use(pool) == 0


@pytest.mark.parametrize("value", bare_ints(), ids=repr)
def test_a_bare_int_is_no_stream_for_raw_memory(value, releases) -> None:
    mem = vkgdr.RawMemory(OWNER, 64)
    view = np.asarray(mem)  # the release would wait for it: the argument is refused anyway
    assert_bare_int_refused(lambda: mem.free(after=value), value)
    assert_bare_int_refused(lambda: vkgdr.RawMemory.free(mem, after=value), value)
    assert not mem.is_freed and releases == []
    del view
    mem.free(after=vkgdr.RawStream(12345))  # the stand-in never uses the handle
    assert releases == [12345]


def test_a_raw_stream_is_the_explicit_way_to_pass_a_handle(releases) -> None:
    raw = vkgdr.RawStream(0x7F00_0000_1000)
    assert raw.handle == 0x7F00_0000_1000 and repr(raw) == "vkgdr.RawStream(0x7f0000001000)"
    assert vkgdr.RawStream(np.uint64(5)).handle == 5
    assert vkgdr.RawStream(2**64 - 1).handle == 2**64 - 1
    mem = vkgdr.RawMemory(OWNER, 64)
    mem.free(after=raw)
    assert releases == [0x7F00_0000_1000]
    # RawStream(0) is the legacy default stream, the fence of a plain free().
    vkgdr.RawMemory(OWNER, 64).free(after=vkgdr.RawStream(0))
    assert releases == [0x7F00_0000_1000, "default"]


@pytest.mark.parametrize(
    "handle, error, words",
    [
        (-1, vkgdr.InvalidArgumentError, "an unsigned pointer-sized int; -1 is not one"),
        (2**64, vkgdr.InvalidArgumentError, "is not one"),
        (True, TypeError, "not a bool"),
        ("0x1000", TypeError, "not str"),
        (1.0, TypeError, "not float"),
        (vkgdr.RawStream(1), TypeError, "not RawStream"),
    ],
    ids=["negative", "too-large", "bool", "str", "float", "raw-stream"],
)
def test_a_raw_stream_takes_only_an_int_handle(handle, error, words) -> None:
    with pytest.raises(error, match="RawStream takes") as e:
        vkgdr.RawStream(handle)
    assert words in str(e.value)


def test_a_raw_stream_on_a_vulkan_only_block_is_refused_like_any_stream(pool) -> None:
    b = pool.alloc(64)
    with pytest.raises(vkgdr.InvalidArgumentError, match="Vulkan-only"):
        b.free(after=vkgdr.RawStream(0x1000))
    assert not b.is_freed
    b.free(after=vkgdr.RawStream(0))  # the legacy stream: the plain release
    assert in_use(pool) == 0


# --- Copies and pickles --------------------------------------------------------------------------


def handle_classes() -> List[type]:
    """Every class the extension defines (exceptions aside), and vkgdr 0.1's two Python ones."""
    found = [
        cls
        for cls in vars(_vkgdr).values()
        if isinstance(cls, type) and not issubclass(cls, BaseException)
    ]
    return found + [vkgdr.Vkgdr, vkgdr.RawMemory]


def test_every_class_refuses_copies_and_pickles_the_same_way() -> None:
    classes = handle_classes()
    names = {cls.__name__ for cls in classes}
    # What the package exports is among them (exceptions and the IntEnum aside).
    for name in vkgdr.__all__:
        value = getattr(vkgdr, name)
        if isinstance(value, type) and not issubclass(value, (BaseException, vkgdr.OpenFlags)):
            assert name in names, name
    assert {"Pool", "Block", "DeviceRing", "RingDeviceView", "RingProducer", "RawStream"} <= names
    assert {"_Vkgdr", "_RawMemory", "_FreeMethod", "_BoundFree", "Vkgdr", "RawMemory"} <= names
    for cls in classes:
        for method in ("__copy__", "__deepcopy__", "__reduce__", "__reduce_ex__"):
            assert getattr(cls, method) is vkgdr._no_copies, (cls, method)


def assert_uncopyable(obj: Any, name: str) -> None:
    expected = f"cannot copy or pickle a {name}: it is a handle to GPU memory or driver state"
    attempts: List[Callable[[], Any]] = [
        lambda: copy.copy(obj),
        lambda: copy.deepcopy(obj),
        lambda: copy.deepcopy({"inside": [obj]}),
    ]
    protocols = range(pickle.HIGHEST_PROTOCOL + 1)
    attempts += [lambda p=p: pickle.dumps(obj, protocol=p) for p in protocols]
    for attempt in attempts:
        with pytest.raises(TypeError) as e:
            attempt()
        assert type(e.value) is TypeError
        assert str(e.value).startswith(expected), str(e.value)


def test_live_objects_refuse_copies_and_pickles(pool, releases) -> None:
    block = pool.alloc(64)
    mem = vkgdr.RawMemory(OWNER, 64)
    for obj, name in [
        (pool, "vkgdr.Pool"),
        (block, "vkgdr.Block"),
        (vkgdr.RawStream(0x1000), "vkgdr.RawStream"),
        (mem, "vkgdr.RawMemory"),
        (mem._impl, "vkgdr._vkgdr._RawMemory"),
        (mem.free, "vkgdr._vkgdr._BoundFree"),
        (vkgdr.RawMemory.__dict__["free"], "vkgdr._vkgdr._FreeMethod"),
        (vkgdr.Vkgdr.__new__(vkgdr.Vkgdr), "vkgdr.Vkgdr"),  # opening one needs a GPU
    ]:
        assert_uncopyable(obj, name)
    # The refused copies took nothing: the memory is freed once, and still usable until then.
    np.asarray(mem).view(np.uint8)[:] = 7
    gc.collect()
    assert releases == []
    mem.free()
    assert releases == ["default"]
    block.free()
    assert in_use(pool) == 0


class Labelled(vkgdr.RawMemory):
    def __init__(self, owner: Any, n: int, label: str) -> None:
        super().__init__(owner, n)
        self.label = label


def test_derived_classes_refuse_copies_too(monkeypatch, releases) -> None:
    mem = Labelled(OWNER, 64, "gains")
    assert_uncopyable(mem, f"{__name__}.Labelled")
    FakeContext.current, FakeContext.pushes, FakeContext.pops = FakeContext(), 0, 0
    shim = import_pycuda_shim(monkeypatch, FakeContext)
    pycuda_mem = shim.Memory(OWNER, 64)
    assert_uncopyable(pycuda_mem, "vkgdr.pycuda.Memory")
    mem.free()
    pycuda_mem.free()
    assert releases == ["default", "default"]


def test_exceptions_are_values_and_copy_as_python_s_own() -> None:
    for cls in (vkgdr.VkgdrError, vkgdr.InvalidArgumentError, vkgdr.OutOfDeviceMemoryError):
        e = cls("cuCtxGetDevice failed (CUDA_ERROR_INVALID_CONTEXT)")
        assert str(copy.copy(e)) == str(e)
        again = pickle.loads(pickle.dumps(e))
        assert type(again) is cls and str(again) == str(e)
    flag = vkgdr.OpenFlags.REQUIRE_COHERENT_BIT
    assert copy.deepcopy(flag) is flag and pickle.loads(pickle.dumps(flag)) is flag
