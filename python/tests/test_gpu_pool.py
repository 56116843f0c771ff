"""The pool on a GPU: 100,000 blocks written from NumPy and checked by a CuPy kernel; CuPy,
PyTorch and Numba use blocks' device memory with no copy; a block outlives its pool; the
non-coherent path (flush, invalidate) with a kernel in between."""

import gc

import numpy as np
import pytest

import vkgdr
from conftest import double_kernel

CHECK_SOURCE = r"""
extern "C" __global__ void check_blocks(const unsigned long long* ptrs, const unsigned int* lens,
                                        unsigned int n, unsigned long long* mismatches)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const unsigned char* p = (const unsigned char*)ptrs[i];
    unsigned long long bad = 0;
    for (unsigned int j = 0; j < lens[i]; ++j)
        if (p[j] != (unsigned char)((i * 131u + j) & 0xFFu))
            ++bad;
    if (bad)
        atomicAdd(mismatches, bad);
}
"""


def pattern(tag: int, n: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint64) + tag * 131) & 0xFF).astype(np.uint8)


@pytest.fixture(scope="module")
def gpu(cupy) -> vkgdr.Vkgdr:
    return vkgdr.Vkgdr(0)


def test_100k_blocks_written_from_numpy_are_checked_by_a_kernel(cupy, gpu) -> None:
    n = 100_000
    pool = vkgdr.Pool(gpu)
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 257, n)
    aligns = 1 << rng.integers(0, 9, n)
    blocks = []
    for i in range(n):
        b = pool.alloc(int(sizes[i]), int(aligns[i]))
        assert b.device_ptr % int(aligns[i]) == 0
        np.asarray(b)[:] = pattern(i, len(b))
        blocks.append(b)
    pool.flush()  # on coherent memory a store fence: NumPy writes need no more
    ptrs = cupy.asarray(np.array([b.device_ptr for b in blocks], dtype=np.uint64))
    lens = cupy.asarray(sizes.astype(np.uint32))
    mismatches = cupy.zeros(1, dtype=np.uint64)
    check = cupy.RawKernel(CHECK_SOURCE, "check_blocks")
    check(((n + 255) // 256,), (256,), (ptrs, lens, np.uint32(n), mismatches))
    assert int(mismatches.get()[0]) == 0
    stats = pool.stats()
    print(f"100000 blocks: {stats}")
    assert stats["bytes_in_use"] == int(sizes.sum())
    # Device ranges are disjoint.
    order = sorted(range(n), key=lambda i: blocks[i].device_ptr)
    for a, b in zip(order, order[1:]):
        assert blocks[a].device_ptr + len(blocks[a]) <= blocks[b].device_ptr


def test_cupy_asarray_sees_host_writes_without_a_copy(cupy, gpu) -> None:
    block = vkgdr.Pool(gpu).alloc(4096)
    d = cupy.asarray(block)
    assert d.data.ptr == block.device_ptr and d.dtype == np.uint8 and d.shape == (4096,)
    for value in (7, 9):
        np.asarray(block)[:] = value  # after the array was made: only a view can see it
        block.flush()  # a store fence on coherent memory
        assert int(d.sum()) == value * 4096
    d2 = cupy.from_dlpack(block)
    assert d2.data.ptr == block.device_ptr


def test_torch_from_dlpack_sees_host_writes_without_a_copy(cupy, gpu) -> None:
    torch = pytest.importorskip("torch")
    block = vkgdr.Pool(gpu).alloc(1024 * 4)
    t = torch.from_dlpack(block)  # DLPack 1.x capsule when torch asks for it
    legacy = torch.utils.dlpack.from_dlpack(block.__dlpack__())  # a DLPack 0.x capsule
    for tensor in (t, legacy):
        assert tensor.device.type == "cuda" and tensor.device.index == 0
        assert tensor.data_ptr() == block.device_ptr
        assert tensor.dtype == torch.uint8 and tensor.shape == (4096,)
    for value in (1.5, -2.0):
        block.view(np.float32)[:] = value
        block.flush()
        assert torch.all(t.view(torch.float32) == value).item()
        assert torch.all(legacy.view(torch.float32) == value).item()
    # The tensor keeps the block alive after every Python reference to it is gone.
    ptr = block.device_ptr
    del block
    gc.collect()
    t.view(torch.float32).mul_(2)
    torch.cuda.synchronize()
    assert t.data_ptr() == ptr and torch.all(t.view(torch.float32) == -4.0).item()


def test_vkgdr_cupy_typed_arrays(cupy, gpu) -> None:
    import vkgdr.cupy as vcp

    block = vkgdr.Pool(gpu).alloc(64 * 8)
    a = vcp.asarray(block, np.float64, (8, 8))
    assert a.shape == (8, 8) and a.dtype == np.float64 and a.data.ptr == block.device_ptr
    block.view(np.float64)[:] = np.arange(64)
    block.flush()
    np.testing.assert_array_equal(a.get().ravel(), np.arange(64))
    with pytest.raises(ValueError):
        vcp.asarray(block, np.float64, (9, 8))


def test_numba_uses_the_cuda_array_interface(cupy, gpu) -> None:
    numba_cuda = pytest.importorskip("numba.cuda")
    block = vkgdr.Pool(gpu).alloc(256)
    np.asarray(block)[:] = np.arange(256, dtype=np.uint8)
    block.flush()
    d = numba_cuda.as_cuda_array(block)
    assert d.__cuda_array_interface__["data"][0] == block.device_ptr
    np.testing.assert_array_equal(d.copy_to_host(), np.arange(256, dtype=np.uint8))


def test_block_outlives_its_pool(cupy, gpu) -> None:
    pool = vkgdr.Pool(gpu, chunk_size=2 << 20)
    block = pool.alloc(4097)
    del pool
    gc.collect()
    host = np.asarray(block)
    host[:] = np.arange(4097) % 100
    block.flush()
    double_kernel(cupy, "pool")(block.device_ptr, len(block))
    cupy.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(host, (np.arange(4097) % 100) * 2)


@pytest.mark.parametrize("thread_cache", [0, 16])
def test_non_coherent_blocks_flush_and_invalidate(cupy, thread_cache) -> None:
    g = vkgdr.Vkgdr(0, vkgdr.OpenFlags.FORCE_NON_COHERENT_BIT)
    pool = vkgdr.Pool(g, thread_cache=thread_cache)
    assert not pool.is_coherent
    double = double_kernel(cupy, "non-coherent")
    blocks = [pool.alloc(100 + i, 16) for i in range(64)]
    for i, b in enumerate(blocks):
        assert not b.is_coherent
        np.asarray(b)[:] = (i + np.arange(len(b))) % 120
        b.flush()
    for b in blocks:
        double(b.device_ptr, len(b))
    cupy.cuda.runtime.deviceSynchronize()
    for i, b in enumerate(blocks):
        b.invalidate()
        np.testing.assert_array_equal(np.asarray(b), ((i + np.arange(len(b))) % 120) * 2)
    # Writes through Block.write are recorded and flushed by Pool.flush.
    blocks[0].write(b"\x05" * 100)
    pool.flush()
    double(blocks[0].device_ptr, 100)
    cupy.cuda.runtime.deviceSynchronize()
    assert blocks[0].read(0, 100) == b"\x0a" * 100


def test_pool_exhaustion_is_out_of_device_memory(cupy, gpu) -> None:
    pool = vkgdr.Pool(gpu, max_bytes=32 << 20)
    with pytest.raises(vkgdr.OutOfDeviceMemoryError):
        pool.alloc(64 << 20)
    with pytest.raises(vkgdr.OutOfDeviceMemoryError, match="VK_ERROR_OUT_OF_DEVICE_MEMORY"):
        vkgdr.Pool(gpu).alloc(10**15)
    assert pool.alloc(1024).device_ptr


def test_a_freed_block_waits_for_its_views_exports_and_stream(cupy, gpu) -> None:
    pool = vkgdr.Pool(gpu, thread_cache=0)
    block = pool.alloc(4096)
    np.asarray(block)[:] = 3
    block.flush()
    d = cupy.asarray(block)  # the CUDA array interface: holds the block object
    x = cupy.from_dlpack(block)  # DLPack: holds the block's state, not the object
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        d *= 2  # a kernel on a non-blocking stream
    block.free(after=stream)
    assert block.is_freed and pool.stats()["bytes_in_use"] == 4096
    with pytest.raises(vkgdr.VkgdrError, match="freed"):
        block.device_ptr
    stream.synchronize()
    assert int(x.sum()) == 6 * 4096
    del d, block
    gc.collect()
    assert pool.stats()["bytes_in_use"] == 4096, "the DLPack export still holds it"
    del x
    gc.collect()
    assert gpu.wait_for_releases(10)
    assert pool.stats()["bytes_in_use"] == 0
    with pytest.raises(vkgdr.InvalidArgumentError, match="expected a CUDA stream"):
        pool.alloc(64).free(after=3.5)


def test_free_is_exact_for_each_export_of_a_block(cupy, gpu) -> None:
    """NumPy arrays and DLPack tensors count as exports while they live and not after; a CUDA
    array interface consumer (CuPy, PyTorch) holds the block object, which pins the memory until
    the object is collected (python/src/exports.rs)."""
    pool = vkgdr.Pool(gpu, thread_cache=0)

    def in_use() -> int:
        return pool.stats()["bytes_in_use"]

    torch = pytest.importorskip("torch")
    for export in (
        lambda b: cupy.from_dlpack(b),
        lambda b: torch.from_dlpack(b),
        lambda b: np.asarray(b),
        lambda b: memoryview(np.asarray(b)),
    ):
        kept = pool.alloc(256)
        view = export(kept)
        kept.free()
        assert in_use() == 256, "a live export keeps the block"
        del view
        gc.collect()
        assert gpu.wait_for_releases(10) and in_use() == 0, "the export gone: back"
        again = pool.alloc(256)
        dropped = export(again)
        del dropped
        gc.collect()
        again.free()  # the object is still referenced: no export is, back at once
        assert gpu.wait_for_releases(10) and in_use() == 0
    for consumer in (cupy.asarray, lambda b: torch.as_tensor(b, device="cuda")):
        block = pool.alloc(256)
        d = consumer(block)
        d[:] = 5
        block.free()
        del d
        gc.collect()
        assert in_use() == 256, "the object still lives, and such a consumer holds the object"
        del block
        gc.collect()
        assert gpu.wait_for_releases(10) and in_use() == 0
