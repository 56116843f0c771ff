"""Sharing with a GPU owner (skips without a GPU, as the other GPU tests do): producer processes
(``multiprocessing``, spawned, with no CUDA) feed the lanes of a shareable ``DeviceRing`` whose
consumer is a persistent kernel, ``ring_check_lanes`` of kernels/ring.cu, which checks every
record; raw memory and pool blocks written by children are checked on the device with CuPy.
The processes, events and hostile calls without a GPU are in test_vulkan_share.py.
"""

import multiprocessing
import os

import numpy as np
import pytest

import share_children
import vkgdr
from conftest import NO_CUDA, finish, launch_check_lanes, run_process, spawn_peer, wait_event
from ring_records import (
    RESULT_CHECKSUM_SUM,
    RESULT_ERRORS,
    RESULT_NEXT_SEQ,
    RESULT_POS,
    RESULT_RECORDS,
)
from share_children import pattern


def test_producer_processes_feed_a_persistent_kernel_through_lanes(cupy, cuda, sock) -> None:
    gpu = vkgdr.Vkgdr(0)
    lanes, records = 3, 3000
    ring = vkgdr.DeviceRing(gpu, 1 << 20, lanes=lanes, shareable=True)
    assert ring.is_shareable and ring.lanes == lanes
    view = ring.device_view
    stream = cupy.cuda.Stream(non_blocking=True)
    module = launch_check_lanes(cuda, view, stream)
    ring.watch_consumer(stream)  # producers fail instead of waiting, should it exit
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    try:
        with vkgdr.ShareServer(gpu, sock) as server:
            server.share_ring("in", ring)
            os.environ.update(NO_CUDA)  # the spawned producers find no CUDA library
            try:
                producers = [
                    ctx.Process(
                        target=share_children.lane_producer,
                        args=(sock, str(records), str(t), out),
                    )
                    for t in range(lanes)
                ]
                for p in producers:
                    p.start()
            finally:
                for k in NO_CUDA:
                    del os.environ[k]
            done = [out.get(timeout=300) for _ in producers]
            for p in producers:
                p.join(60)
                assert p.exitcode == 0, "a producer's checks failed"
            for _ in producers:
                wait_event(server, "gone", timeout=30)
            assert server.stats()["lane_faults"] == 0
        # The server gave the lanes back to the ring; the kernel checks what was published.
    finally:
        ring.stop()
        stream.synchronize()
        cuda.module_unload(module)
    assert sorted(d["lane"] for d in done) == list(range(lanes))
    for d in done:
        res = ring.results_of(d["lane"])
        assert res[RESULT_ERRORS] == 0, (d, res)
        assert res[RESULT_RECORDS] == records, (d, res)
        assert res[RESULT_NEXT_SEQ] == records, (d, res)
        assert res[RESULT_CHECKSUM_SUM] == d["sum"], (d, res)
        assert res[RESULT_POS] == ring.head_of(d["lane"])


# Spawned only: a forked child is refused the driver (test_vulkan_share.py checks that).
@pytest.mark.parametrize("method", ["spawn"])
def test_raw_memory_written_by_a_child_is_read_by_the_device(cupy, sock, method, monkeypatch):
    gpu = vkgdr.Vkgdr(0)
    n = 1 << 20
    mem = vkgdr.RawMemory(gpu, n, shareable=True)
    np.asarray(mem).view(np.uint8)[:] = np.frombuffer(pattern(n, 1), np.uint8)
    mem.flush(0, n)
    with vkgdr.ShareServer(gpu, sock) as server:
        server.share_memory("m", mem)
        if method == "spawn":
            for k, v in NO_CUDA.items():
                monkeypatch.setenv(k, v)
        run_process(method, share_children.memory_writer, sock, "2", "1", "no")
        wait_event(server, "gone")
    # A kernel launched after the child's writes sees them in device memory.
    on_device = cupy.asarray(mem)
    expected = cupy.asarray(np.frombuffer(pattern(n, 2), np.uint8))
    assert bool((on_device == expected).all()), "the peer's bytes, read by the device"
    del on_device
    mem.free()


def test_pool_blocks_filled_by_a_child_are_read_by_the_device(cupy, sock) -> None:
    gpu = vkgdr.Vkgdr(0)
    pool = vkgdr.Pool(gpu, chunk_size=1 << 21, thread_cache=0)
    with vkgdr.ShareServer(gpu, sock) as server:
        server.share_pool("frames", pool, 1 << 20)
        child = spawn_peer("pool", sock)
        peer = wait_event(server, "attached", region="frames").peer
        tokens = [wait_event(server, "released", peer=peer).token for _ in range(3)]
        for k, (token, size) in enumerate(zip(tokens, [100, 4096, 70_000])):
            b = server.take_returned(token)
            assert b.device_ptr is not None, "a block of a GPU pool, with its device pointer"
            n = size & ~3
            on_device = cupy.asarray(b)[:n]
            expected = cupy.asarray(np.frombuffer(pattern(n, 10 + k), np.uint8))
            assert bool((on_device == expected).all()), f"block {k}, read by the device"
            del on_device
            b.free()
        b = pool.alloc(512)
        b.write(pattern(512, 77))
        token = server.send_block(peer, "frames", b)
        wait_event(server, "released", peer=peer, token=token)
        back = server.take_returned(token)
        assert bool((cupy.asarray(back)[:512] == cupy.asarray(
            np.frombuffer(pattern(512, 78), np.uint8))).all())
        finish(child)
    back.free()


def test_what_cannot_be_shared_is_refused_by_name(cupy, sock) -> None:
    gpu = vkgdr.Vkgdr(0)
    with pytest.raises(vkgdr.InvalidArgumentError, match="padded: mirrored=True"):
        vkgdr.DeviceRing(gpu, 2 << 20, mirrored=True, shareable=True)
    with pytest.raises(vkgdr.InvalidArgumentError, match="no copy-engine path"):
        vkgdr.DeviceRing(gpu, 4096, copy_engine=4096, shareable=True)
    with vkgdr.ShareServer(gpu, sock) as server:
        with pytest.raises(vkgdr.InvalidArgumentError, match="shareable=True"):
            server.share_ring("r", vkgdr.DeviceRing(gpu, 4096))
        small = vkgdr.RawMemory(gpu, 64)  # carved out of a granule other allocations share
        with pytest.raises(vkgdr.InvalidArgumentError, match="shareable=True"):
            server.share_memory("m", small)
        small.free()
        nc = vkgdr.Vkgdr(0, vkgdr.OpenFlags.FORCE_NON_COHERENT_BIT)
        with pytest.raises(vkgdr.InvalidArgumentError, match="non-coherent"):
            server.share_pool("p", vkgdr.Pool(nc), 1 << 20)
        ring = vkgdr.DeviceRing(gpu, 4096, lanes=2, shareable=True)
        server.share_ring("r", ring)
        with vkgdr.attach(sock) as peer:
            lane = peer.attach_lane("r")
            assert lane.start == (0, 0)
            # No consumer runs: the lane fills, and a push that may not wait says so.
            with pytest.raises(vkgdr.RingFullError):
                for k in range(1000):
                    lane.push(b"x" * 100, timeout=0)
            server.revoke(wait_event(server, "attached").peer)
            with pytest.raises(vkgdr.ShareError) as e:
                lane.push(b"x" * 100, timeout=5)
            assert e.value.reason in ("revoked", "disconnected"), e.value
        ring.stop()
