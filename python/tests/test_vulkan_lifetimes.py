"""What ``free()`` does with views still alive, without a GPU (Mesa's lavapipe on CI): pool blocks
over real exported Vulkan memory go back at once when no export of them is alive (whatever else
refers to the object), and when the last NumPy array, memoryview or DLPack export is gone
otherwise (the exact rule of python/src/exports.rs); every shape of the call; stream arguments. The same rule for ``vkgdr.RawMemory``
and ``vkgdr.pycuda.Memory`` over stand-in memory is in test_vulkan_compat.py, and with CuPy and
PyCUDA on the GPU (test_gpu_compat.py, test_gpu_coexistence.py)."""

import ctypes
import gc

import numpy as np
import pytest

import vkgdr
from conftest import run_in_thread, run_workers, vulkan_pool


@pytest.fixture()
def pool() -> vkgdr.Pool:
    # No thread cache: a block given back shows in bytes_in_use at once either way, and the
    # host address it had is not handed out again behind a test's back.
    return vulkan_pool(chunk_size=1 << 20, thread_cache=0)


def in_use(pool: vkgdr.Pool) -> int:
    return pool.stats()["bytes_in_use"]


def test_a_block_without_views_goes_back_at_once(pool) -> None:
    b = pool.alloc(100)
    np.asarray(b)[:] = 1  # exported, but the array is gone
    assert in_use(pool) == 100
    b.free()
    assert in_use(pool) == 0
    assert b.is_freed and len(b) == 100 and "freed" in repr(b)
    for use in (
        lambda: b.host_ptr,
        lambda: b.device_ptr,
        lambda: b.is_dedicated,
        lambda: np.asarray(b),
        lambda: b.view(np.uint8),
        lambda: b.read(),
        lambda: b.write(b"x"),
        lambda: b.flush(),
        lambda: b.invalidate(),
        lambda: b.__dlpack__(),
    ):
        with pytest.raises(vkgdr.VkgdrError, match="the block has been freed"):
            use()
    b.free()  # twice: nothing happens
    assert in_use(pool) == 0


def test_a_block_never_exported_goes_back_at_once_whatever_refers_to_it(pool) -> None:
    blocks = [pool.alloc(100) for _ in range(3)]
    for b in blocks:
        b.write(b"abc")
        b.free()  # the list and the loop variable refer to it: no view can exist though
    assert in_use(pool) == 0


def test_numpy_views_keep_a_freed_block_until_they_are_gone(pool) -> None:
    b = pool.alloc(4096)
    whole = np.asarray(b)
    typed = b.view(np.uint32, (16, 64))
    part = whole[100:200]
    b.free()
    assert b.is_freed and in_use(pool) == 4096, "freed with views: kept"
    whole[:] = 7  # the CPU writes memory that is still the block's, not someone else's
    typed[3, 5] = 0xDEADBEEF
    assert part[0] == 7
    other = pool.alloc(4096)  # cannot be handed the same memory
    np.asarray(other)[:] = 1
    assert whole[50] == 7 and typed[3, 5] == 0xDEADBEEF
    del whole, typed
    gc.collect()
    assert in_use(pool) == 8192, "a slice still holds the block"
    del part, b  # the object goes with the last view (and the caller's own variable)
    gc.collect()
    assert in_use(pool) == 4096, "the last view gone: the block went back"
    del other


def test_a_dlpack_export_keeps_a_freed_block(pool) -> None:
    b = pool.alloc(256)
    b.write(b"\x05" * 256)
    x = np.from_dlpack(b)  # holds the block's state, not the Python object
    b.free()
    assert in_use(pool) == 256
    assert int(x.sum()) == 5 * 256
    del b
    gc.collect()
    assert in_use(pool) == 256, "the export holds the block without its object"
    del x
    gc.collect()
    assert in_use(pool) == 0
    c = pool.alloc(64)
    capsule = c.__dlpack__()  # never consumed
    c.free()
    assert in_use(pool) == 64
    del c
    gc.collect()
    assert in_use(pool) == 64, "the capsule holds the block"
    del capsule
    gc.collect()
    assert in_use(pool) == 0
    d = pool.alloc(64)
    del_export = np.from_dlpack(d)
    del del_export
    gc.collect()
    d.free()  # the export came and went: back at once
    assert in_use(pool) == 0


def test_references_that_are_not_views_do_not_keep_a_block(pool) -> None:
    held = [pool.alloc(100)]
    np.asarray(held[0])[:] = 3
    for b in held:
        b.free()  # the list and the loop variable refer to it, no array does: back at once
    assert in_use(pool) == 0


def test_a_temporary_receiver_with_a_view_is_not_mistaken_for_a_variable(pool) -> None:
    holder = {"b": pool.alloc(100)}
    view = np.asarray(holder["b"])
    holder.pop("b").free()  # the only references: the call's and the view's
    assert in_use(pool) == 100
    view[:] = 9
    del view
    gc.collect()
    assert in_use(pool) == 0
    holder = {"b": pool.alloc(100)}
    np.asarray(holder["b"])[:] = 1
    holder.pop("b").free()  # no view: back at once
    assert in_use(pool) == 0


def test_arrays_hold_the_memory_not_the_block_object(pool) -> None:
    b = pool.alloc(64)
    view = b.view(np.uint32)
    assert not isinstance(view.base, vkgdr.Block)
    b.free()
    del b
    gc.collect()
    assert in_use(pool) == 64, "the object is gone, the array keeps the memory"
    view[:] = 0xA5A5A5A5
    assert int(view[15]) == 0xA5A5A5A5
    del view
    gc.collect()
    assert in_use(pool) == 0


def test_a_memoryview_keeps_a_freed_block(pool) -> None:
    b = pool.alloc(256)
    b.write(bytes(range(256)))
    mv = memoryview(np.asarray(b))
    part = mv[16:32]  # shares the exporter's buffer, not `mv`
    del mv
    b.free()
    assert in_use(pool) == 256
    assert bytes(part) == bytes(range(16, 32))
    part.release()
    del part
    gc.collect()
    assert in_use(pool) == 0


def test_an_interface_read_and_dropped_is_no_view(pool) -> None:
    b = pool.alloc(64)
    interface = b.__array_interface__  # its data array can reach the bytes: an export
    assert hasattr(b, "__array_interface__")
    b.free()
    assert in_use(pool) == 64
    del interface
    gc.collect()
    assert in_use(pool) == 0


def test_call_shapes(pool) -> None:
    def exported(b):
        np.asarray(b)[:] = 1  # an export, gone again
        return b

    shapes = {
        "method": lambda b: b.free(),
        "keyword": lambda b: b.free(after=None),
        "empty keywords": lambda b: b.free(**{}),
        "bound first": lambda b: (lambda f: f())(b.free),
        "through the class": lambda b: vkgdr.Block.free(b),
        "in a list": lambda b: [b, b][1].free(),
    }
    for name, free in shapes.items():
        b = exported(pool.alloc(100))
        c = b  # a second name, a closure and a list hold it as well: none is a view
        free(b)
        assert in_use(pool) == 0, name
        view_of = exported(pool.alloc(100))
        view = np.asarray(view_of)
        free(view_of)
        assert in_use(pool) == 100, name
        del view
        gc.collect()
        assert in_use(pool) == 0, name
        del c

    def in_a_generator():
        b = pool.alloc(100)
        np.asarray(b)[:] = 1
        b.free()
        yield in_use(pool)

    assert next(in_a_generator()) == 0


def test_module_level_code() -> None:
    pool = vulkan_pool(chunk_size=1 << 20, thread_cache=0)
    names = {"pool": pool, "np": np, "in_use": in_use}
    exec(
        "b = pool.alloc(100)\n"
        "np.asarray(b)[:] = 1\n"
        "b.free()\n"
        "at_once = in_use(pool)\n"
        "c = pool.alloc(100)\n"
        "view = np.asarray(c)\n"
        "c.free()\n"
        "kept = in_use(pool)\n"
        "del view, c\n"
        "after = in_use(pool)\n",
        names,
    )
    assert (names["at_once"], names["kept"], names["after"]) == (0, 100, 0)


def test_a_free_from_another_thread_sees_the_views_of_this_one(pool) -> None:
    box = [pool.alloc(128)]
    view = np.asarray(box[0])
    run_in_thread(lambda: box.pop().free())  # the thread held the only reference but the view's
    assert in_use(pool) == 128
    view[:] = 1
    del view
    gc.collect()
    assert in_use(pool) == 0
    box = [pool.alloc(128)]
    np.asarray(box[0])[:] = 1
    run_in_thread(lambda: box.pop().free())
    assert in_use(pool) == 0


def test_threads_free_blocks_with_views_concurrently() -> None:
    pool = vulkan_pool(chunk_size=1 << 20, shards=4, thread_cache=0)

    def worker(t: int) -> None:
        for i in range(500):
            b = pool.alloc(1 + (i * 37) % 300, 16)
            view = np.asarray(b)
            view[:] = t
            if i % 2:
                b.free()  # the view is alive: kept
                assert np.all(view == t), "a freed block with a view was handed out again"
                view[:] = t
            else:
                del view
                b.free()  # back at once

    run_workers(worker)
    gc.collect()
    assert in_use(pool) == 0


class CupyLike:
    def __init__(self, ptr):
        self.ptr = ptr


class TorchLike:
    cuda_stream = 0x1234


class PycudaLike:
    handle = 0x5678


class NumbaLike:
    handle = ctypes.c_void_p(0x9ABC)


class NullNumbaLike:
    handle = ctypes.c_void_p(None)


class Protocol:
    def __cuda_stream__(self):
        return (0, 0x4321)


@pytest.mark.parametrize(
    "stream",
    [
        vkgdr.RawStream(0x1000),
        CupyLike(0x2000),
        TorchLike(),
        PycudaLike(),
        NumbaLike(),
        Protocol(),
    ],
    ids=["raw", "cupy", "torch", "pycuda", "numba", "protocol"],
)
def test_stream_arguments_are_read_before_anything_changes(stream, pool) -> None:
    b = pool.alloc(64)
    # A Vulkan-only block has no CUDA side: a real stream is refused, and the block stays.
    with pytest.raises(vkgdr.InvalidArgumentError, match="Vulkan-only"):
        b.free(after=stream)
    assert not b.is_freed and in_use(pool) == 64


@pytest.mark.parametrize(
    "bad", [True, "stream", 1.5, CupyLike("x"), CupyLike(-1), object()], ids=repr
)
def test_what_is_not_a_stream_is_an_invalid_argument(bad, pool) -> None:
    b = pool.alloc(64)
    with pytest.raises(vkgdr.InvalidArgumentError, match="expected a CUDA stream"):
        b.free(after=bad)
    assert not b.is_freed


@pytest.mark.parametrize(
    "null", [vkgdr.RawStream(0), CupyLike(0), NullNumbaLike()], ids=["raw", "cupy", "numba"]
)
def test_the_null_stream_is_the_default_release(null, pool) -> None:
    b = pool.alloc(64)
    b.free(after=null)
    assert b.is_freed and in_use(pool) == 0
