"""The pool over real exported Vulkan memory, no CUDA (Mesa's lavapipe on CI, the NVIDIA driver
on the GPU machine): blocks, views, DLPack on the host, flush/invalidate, limits, errors, threads,
lifetimes."""

import gc
import threading

import numpy as np
import pytest

import vkgdr
from conftest import run_in_thread, run_workers, vulkan_pool


@pytest.fixture(params=[False, True], ids=["default", "force-non-coherent"])
def pool(request) -> vkgdr.Pool:
    return vulkan_pool(
        force_non_coherent=request.param, chunk_size=1 << 20, dedicated_threshold=256 << 10
    )


def pattern(tag: int, n: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint32) + tag * 131) & 0xFF).astype(np.uint8)


def test_blocks_are_disjoint_aligned_and_hold_what_numpy_wrote(pool) -> None:
    rng = np.random.default_rng(7)
    blocks = []
    for tag in range(2000):
        size = int(rng.integers(1, 600))
        align = 1 << int(rng.integers(0, 13))
        b = pool.alloc(size, align)
        assert len(b) == b.size == size
        assert b.host_ptr % min(align, 4096) == 0
        assert b.device_ptr is None
        np.asarray(b)[:] = pattern(tag, size)
        b.flush()
        blocks.append((b, tag))
    for b, tag in blocks:
        b.invalidate()
        np.testing.assert_array_equal(np.asarray(b), pattern(tag, len(b)))
        assert b.read() == pattern(tag, len(b)).tobytes()
    ranges = sorted((b.host_ptr, b.host_ptr + len(b)) for b, _ in blocks)
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:])), "blocks overlap"
    stats = pool.stats()
    asked = sum(len(b) for b, _ in blocks)
    if pool.is_coherent:
        assert stats["bytes_in_use"] == asked
    else:  # non-coherent blocks own whole atoms (64 bytes here and on NVIDIA's driver)
        assert asked < stats["bytes_in_use"] <= sum(-(-len(b) // 256) * 256 for b, _ in blocks)
    assert stats["chunks"] >= 1 and stats["shards"] >= 1
    # How other threads reach the thread caches, as vkgdr info shows it: on by default.
    assert stats["thread_cache_handshake"] in ("membarrier", "fence")
    assert vkgdr.Pool.vulkan_only(thread_cache=0).stats()["thread_cache_handshake"] is None


def test_typed_views(pool) -> None:
    b = pool.alloc(64 * 4, 64)
    v = b.view(np.float32, (8, 8))
    assert v.shape == (8, 8) and v.dtype == np.float32
    v[:] = np.arange(64, dtype=np.float32).reshape(8, 8)
    assert v.__array_interface__["data"][0] == b.host_ptr  # a view, not a copy
    np.testing.assert_array_equal(b.view(np.float32), np.arange(64, dtype=np.float32))
    assert b.view(np.uint64, 4).shape == (4,)  # a prefix
    assert b.view().dtype == np.uint8 and len(b.view()) == 256
    with pytest.raises(vkgdr.InvalidArgumentError, match="needs 512 bytes"):
        b.view(np.float64, (8, 8))
    odd = pool.alloc(10)
    with pytest.raises(ValueError, match="give a shape"):
        odd.view(np.uint32)


def test_write_and_read_take_any_bytes_like(pool) -> None:
    b = pool.alloc(64)
    b.write(b"\x01\x02\x03")
    b.write(bytearray(b"\x04\x05"), 3)
    b.write(memoryview(b"\x06"), 5)
    b.write(np.array([7, 8], dtype=np.uint8), 6)
    b.write(np.array([0x0A0B0C0D], dtype=np.uint32), 8)
    pool.flush()
    assert b.read(0, 12) == bytes([1, 2, 3, 4, 5, 6, 7, 8, 0x0D, 0x0C, 0x0B, 0x0A])
    assert b.read(62) == b.read()[62:]
    with pytest.raises(vkgdr.InvalidArgumentError):
        b.write(b"x" * 65)
    with pytest.raises(vkgdr.InvalidArgumentError):
        b.write(b"xy", 63)
    with pytest.raises(vkgdr.InvalidArgumentError):
        b.read(60, 5)
    with pytest.raises(TypeError, match="bytes-like"):
        b.write(12)


def test_flush_and_invalidate_check_their_ranges(pool) -> None:
    b = pool.alloc(100)
    b.flush(0, 100)
    b.invalidate(99, 1)
    b.flush(100, 0)
    for bad in ((0, 101), (101, None), (50, 51)):
        with pytest.raises(vkgdr.InvalidArgumentError):
            b.flush(*bad)
        with pytest.raises(vkgdr.InvalidArgumentError):
            b.invalidate(*bad)


def test_coherence_is_reported(pool) -> None:
    b = pool.alloc(8)
    assert b.is_coherent == pool.is_coherent
    assert pool.has_device_memory is False


def test_a_block_is_released_on_the_device_only_through_a_release_feed(pool) -> None:
    # A Vulkan-only pool has no device -> host ring to drain (those need CUDA): a block is
    # refused, and stays the caller's, as it was.
    block = pool.alloc(64)
    block.write(b"kept")
    with pytest.raises(vkgdr.VkgdrError, match="the pool has no release feed"):
        block.release_on_device()
    assert not block.is_released_on_device and not block.is_freed
    assert block.read(0, 4) == b"kept"
    assert pool.lent_blocks == 0 and pool.drain_device_releases() == 0
    assert pool.reclaim_device_releases() == 0
    assert pool.stats()["device_releases"] == {
        "lent": 0, "issued": 0, "redeemed": 0, "revoked": 0, "forged": 0, "stale": 0,
        "repeated": 0, "ignored_records": 0, "lane_error": None,
    }
    with pytest.raises(TypeError, match="set_release_feed takes a vkgdr.DeviceToHostRing, not"):
        pool.set_release_feed(object())
    # A block whose memory was exported is refused before the pool is asked.
    np.asarray(block)[0] = 1
    with pytest.raises(vkgdr.InvalidArgumentError, match="its memory was exported"):
        block.release_on_device()
    block.free()
    with pytest.raises(vkgdr.VkgdrError, match="the block has been freed"):
        block.release_on_device()


def test_a_batch_is_released_on_the_device_only_through_a_release_feed(pool) -> None:
    # The batch form checks every block before lending any, and a refused batch leaves every
    # block the caller's, as it was.
    blocks = [pool.alloc(64) for _ in range(3)]
    blocks[1].write(b"kept")
    assert pool.release_many_on_device([]) == []
    with pytest.raises(vkgdr.VkgdrError, match="0 of 3 blocks lent; the rest not: the pool "
                       "has no release feed") as refused:
        pool.release_many_on_device(blocks)
    assert refused.value.tokens == []
    assert not any(b.is_released_on_device or b.is_freed for b in blocks)
    assert blocks[1].read(0, 4) == b"kept"
    with pytest.raises(TypeError, match=r"blocks\[1\] is int"):
        pool.release_many_on_device([blocks[0], 5])
    with pytest.raises(vkgdr.InvalidArgumentError, match=r"blocks\[2\] is given twice"):
        pool.release_many_on_device([blocks[0], blocks[1], blocks[0]])
    np.asarray(blocks[2])[0] = 1
    with pytest.raises(vkgdr.InvalidArgumentError, match="its memory was exported"):
        pool.release_many_on_device(blocks)
    assert not any(b.is_released_on_device or b.is_freed for b in blocks)
    blocks[0].free()
    with pytest.raises(vkgdr.VkgdrError, match="the block has been freed"):
        pool.release_many_on_device(blocks[:2])
    assert blocks[1].read(0, 4) == b"kept" and not blocks[1].is_freed
    assert pool.lent_blocks == 0 and pool.stats()["device_releases"]["issued"] == 0


def test_block_outlives_its_pool() -> None:
    pool = vulkan_pool(chunk_size=1 << 20)
    b = pool.alloc(4096, 4096)
    view = b.view(np.uint32)
    del pool
    gc.collect()
    view[:] = 0xDEADBEEF
    b.flush()
    assert b.read(0, 4) == bytes.fromhex("efbeadde")


def test_views_keep_their_block_alive() -> None:
    pool = vulkan_pool(chunk_size=1 << 20)
    view = pool.alloc(256).view(np.uint8)
    gc.collect()
    assert pool.stats()["bytes_in_use"] == 256
    view[:] = 3
    del view
    gc.collect()
    assert pool.stats()["bytes_in_use"] == 0


def test_dlpack_exports_the_host_mapping_without_a_copy() -> None:
    pool = vulkan_pool(chunk_size=1 << 20)
    b = pool.alloc(128)
    assert b.__dlpack_device__() == (vkgdr.DLPACK_DEVICE_CPU, 0)
    x = np.from_dlpack(b)
    assert x.dtype == np.uint8 and x.shape == (128,)
    assert x.__array_interface__["data"][0] == b.host_ptr
    # Older NumPy (all of 1.x: Python 3.8's newest is 1.24) imports every DLPack tensor read-only;
    # newer NumPy honours the versioned capsule's read-only flag, which a block leaves clear.
    # Either way the array must be the block's own bytes: a write on one side shows on the other,
    # which a copy would not do.
    if x.flags.writeable:
        x[:] = 9
        assert b.read(0, 4) == b"\t\t\t\t"
    else:
        b.write(bytes([9]) * 128)
    assert x.tolist() == [9] * 128
    b.write(b"\x05", 127)  # a later write into the block shows through the array already made
    assert int(x[127]) == 5
    # The tensor keeps the block alive after every Python reference to it is gone.
    del b
    gc.collect()
    assert pool.stats()["bytes_in_use"] == 128
    assert int(x.sum()) == 9 * 127 + 5
    del x
    gc.collect()
    assert pool.stats()["bytes_in_use"] == 0


@pytest.mark.parametrize("max_version", [None, (0, 8), (1, 0), (1, 3)])
def test_dlpack_capsules_legacy_and_versioned(max_version) -> None:
    pool = vulkan_pool(chunk_size=1 << 20)
    b = pool.alloc(64)
    capsule = b.__dlpack__(max_version=max_version)
    versioned = max_version is not None and max_version[0] >= 1
    assert ('"dltensor_versioned"' if versioned else '"dltensor"') in repr(capsule)
    del b
    gc.collect()
    assert pool.stats()["bytes_in_use"] == 64, "an unconsumed capsule keeps the block"
    del capsule  # never consumed: the capsule's destructor deletes the tensor
    gc.collect()
    assert pool.stats()["bytes_in_use"] == 0


def test_dlpack_refuses_copies_and_other_devices() -> None:
    b = vulkan_pool(chunk_size=1 << 20).alloc(64)
    with pytest.raises(BufferError):
        b.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        b.__dlpack__(dl_device=(vkgdr.DLPACK_DEVICE_CUDA, 0))
    assert "dltensor" in repr(b.__dlpack__(dl_device=(vkgdr.DLPACK_DEVICE_CPU, 0), copy=False))


def test_vulkan_only_blocks_have_no_cuda_array_interface() -> None:
    b = vulkan_pool(chunk_size=1 << 20).alloc(64)
    assert not hasattr(b, "__cuda_array_interface__")


def test_bad_requests_are_invalid_arguments() -> None:
    pool = vulkan_pool(chunk_size=1 << 20)
    with pytest.raises(vkgdr.InvalidArgumentError, match="size is zero"):
        pool.alloc(0)
    with pytest.raises(vkgdr.InvalidArgumentError, match="not a power of two"):
        pool.alloc(16, 3)
    with pytest.raises(vkgdr.InvalidArgumentError, match="exceeds the pool's maximum"):
        pool.alloc(16, 1 << 20)
    with pytest.raises(OverflowError):
        pool.alloc(-1)
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError too
        vkgdr.Pool.vulkan_only(shards=0)
    with pytest.raises(vkgdr.InvalidArgumentError, match="max_chunk_size"):
        vkgdr.Pool.vulkan_only(chunk_size=1 << 20, max_chunk_size=64 << 10)
    with pytest.raises(TypeError, match="unexpected pool option 'chunk'") as e:
        vkgdr.Pool.vulkan_only(chunk=1 << 20)
    # Every setting the library lists for the faces is a keyword, named in this order.
    assert str(e.value).endswith(
        "(known: chunk_size, max_chunk_size, dedicated_threshold, max_bytes, shards, "
        "keep_empty_chunks, thread_cache, thread_cache_bytes, max_align)"
    )
    with pytest.raises(TypeError):
        vkgdr.Pool.vulkan_only(chunk_size="big")


def test_options_left_out_or_none_keep_their_defaults() -> None:
    pool = vulkan_pool(chunk_size=None, shards=None, max_bytes=None)
    assert pool.alloc(16).size == 16
    big_first_chunk = vulkan_pool(chunk_size=512 << 20, shards=1)  # raises the chunk cap too
    assert big_first_chunk.alloc(16).size == 16
    assert big_first_chunk.stats()["bytes_reserved"] == 512 << 20


def test_limits_and_exhaustion_are_out_of_memory_errors() -> None:
    pool = vulkan_pool(chunk_size=1 << 20, max_bytes=1 << 20, dedicated_threshold=512 << 10)
    pool.alloc(1000)
    with pytest.raises(vkgdr.OutOfDeviceMemoryError, match="pool limit") as e:
        pool.alloc(600 << 10)  # a dedicated chunk beyond max_bytes
    assert e.value.result_name is None  # a configured limit, not the driver
    huge = vulkan_pool(chunk_size=1 << 20)
    with pytest.raises(vkgdr.OutOfDeviceMemoryError, match="VK_ERROR_OUT_OF_DEVICE_MEMORY") as e:
        huge.alloc(10**15)
    assert e.value.result_name == "VK_ERROR_OUT_OF_DEVICE_MEMORY"
    assert e.value.call == "vkAllocateMemory"
    assert str(e.value) == "vkAllocateMemory failed (VK_ERROR_OUT_OF_DEVICE_MEMORY)"


def test_trim_returns_empty_chunks() -> None:
    pool = vulkan_pool(chunk_size=1 << 20, keep_empty_chunks=1, shards=1)
    blocks = [pool.alloc(64 << 10) for _ in range(40)]  # more than one chunk
    assert pool.stats()["chunks"] >= 2
    del blocks
    gc.collect()
    assert pool.trim() >= 1
    assert pool.stats()["chunks"] == 0 and pool.stats()["bytes_reserved"] == 0


def test_dedicated_blocks() -> None:
    pool = vulkan_pool(chunk_size=1 << 20, dedicated_threshold=256 << 10)
    big = pool.alloc(300 << 10)
    assert big.is_dedicated and pool.stats()["dedicated_chunks"] == 1
    big.view(np.uint64)[:] = 5
    assert big.read(len(big) - 8) == (5).to_bytes(8, "little")
    del big
    gc.collect()
    assert pool.stats()["dedicated_chunks"] == 0


def test_ranges_to_the_end_are_checked_by_the_library() -> None:
    pool = vulkan_pool(chunk_size=1 << 20)
    b = pool.alloc(100)
    b.write(b"\x07" * 100)
    assert b.read(90) == b"\x07" * 10 and b.read(100) == b""
    with pytest.raises(vkgdr.InvalidArgumentError, match="offset 101 is past the end of the 100"):
        b.read(101)
    with pytest.raises(vkgdr.InvalidArgumentError, match="range 90[+]11 is outside the 100-byte"):
        b.flush(90, 11)
    with pytest.raises(vkgdr.InvalidArgumentError, match="range 99[+]2 is outside the 100-byte"):
        b.write(b"ab", 99)


def test_thread_cache_reuses_blocks() -> None:
    pool = vulkan_pool(chunk_size=1 << 20, thread_cache=8)
    a = pool.alloc(256, 16)
    p = a.host_ptr
    del a
    assert pool.alloc(250, 16).host_ptr == p
    with pytest.raises(vkgdr.InvalidArgumentError, match="thread_cache"):
        vkgdr.Pool.vulkan_only(thread_cache=10**6)


def test_thread_cache_is_on_by_default_and_any_thread_can_trim_it() -> None:
    pool = vulkan_pool(chunk_size=1 << 20)
    a = pool.alloc(256, 16)
    p = a.host_ptr
    del a
    gc.collect()
    stats = pool.stats()
    assert (stats["bytes_in_use"], stats["bytes_cached"], stats["blocks_cached"]) == (0, 256, 1)
    b = pool.alloc(250, 16)
    assert b.host_ptr == p, "reused from this thread's cache"
    del b
    gc.collect()
    # Another thread trims: this (idle) thread's cached block comes back too.
    run_in_thread(pool.trim)
    assert pool.stats()["bytes_cached"] == 0 and pool.stats()["chunks"] == 0
    off = vulkan_pool(chunk_size=1 << 20, thread_cache=0)
    off.alloc(64)  # the block is dropped at once
    gc.collect()
    assert off.stats()["bytes_cached"] == 0 and off.stats()["bytes_allocated"] == 0


def test_a_threads_cached_blocks_are_back_when_join_returns() -> None:
    """A thread's freed blocks wait in its cache; CPython's join() returns before the native
    thread exits (where the library's own per-thread teardown runs), so the package hands them
    back when CPython clears the thread's state, before join() returns."""
    pool = vulkan_pool(chunk_size=1 << 20)

    def worker(t: int) -> None:
        blocks = [pool.alloc(64 + 16 * (i % 8), 16) for i in range(64)]
        del blocks  # into this thread's cache
        assert pool.stats()["blocks_cached"] > 0, "the thread cache kept nothing"

    for _ in range(20):
        run_workers(worker)
        s = pool.stats()
        assert (s["blocks_cached"], s["bytes_cached"], s["bytes_in_use"]) == (0, 0, 0), s


def test_threads_allocate_concurrently() -> None:
    pool = vulkan_pool(chunk_size=1 << 20, shards=4)
    kept = []
    lock = threading.Lock()

    def worker(t: int) -> None:
        mine = []
        for i in range(2000):
            b = pool.alloc(1 + (i * 37) % 300, 16)
            np.asarray(b)[:] = t
            mine.append(b)
            if i % 3 == 0:
                mine.pop(0)
        for b in mine:
            assert np.all(np.asarray(b) == t), "another thread wrote into this block"
        with lock:
            kept.extend(mine)

    run_workers(worker)
    assert pool.stats()["bytes_in_use"] == sum(len(b) for b in kept)
