"""DeviceRing on a GPU: records pushed from Python threads are consumed and verified by the
persistent consumers of kernels/ring.cu (its PTX, loaded through CuPy), across many wraps; lanes
with a RingProducer each, large records carried by the copy engine, checked by ring_check_lanes;
the producers' lifetime, closing and context manager."""

import gc
import threading

import numpy as np
import pytest

import vkgdr
from conftest import CHECK_THREADS, KERNELS_DIR, launch_check_lanes, run_workers
from ring_records import (
    RESULT_CHECKSUM_SUM,
    RESULT_ERRORS,
    RESULT_NEXT_SEQ,
    RESULT_POS,
    RESULT_RECORDS,
    sealed_payload,
)


@pytest.fixture(scope="module")
def ring_module(cupy):
    if KERNELS_DIR is None:
        pytest.fail("kernels/ring.ptx not found: set VKGDR_KERNELS_DIR")
    return cupy.RawModule(path=str(KERNELS_DIR / "ring.ptx"))


@pytest.mark.parametrize("mirrored", [False, True], ids=["padded", "mirrored"])
def test_persistent_consumer_verifies_records_from_python_threads(cupy, ring_module, mirrored):
    gpu = vkgdr.Vkgdr(0)
    capacity = (2 << 20) if mirrored else (64 << 10)
    ring = vkgdr.DeviceRing(gpu, capacity, mirrored=mirrored)
    view = ring.device_view
    assert view.capacity == capacity and view.mirrored == mirrored
    assert ring.head == 0 and ring.results() == [0] * 8
    kernel = ring_module.get_function(
        "ring_consume_persistent_mirrored" if mirrored else "ring_consume_persistent"
    )
    stream = cupy.cuda.Stream(non_blocking=True)
    args = tuple(np.uint64(a) for a in view.kernel_args())
    kernel((1,), (CHECK_THREADS,), args, stream=stream)
    ring.watch_consumer(stream)  # dropping the ring now keeps its memory until the kernel exits
    assert view.ring is ring, "the view keeps its ring alive"

    # One producer thread at a time owns the sequence numbers it predicts: pushes are serialised
    # by a lock, so record k carries seq k, while the pushes themselves come from four threads.
    lock = threading.Lock()
    state = {"seq": 0, "sum": 0, "bytes": 0}
    rng = np.random.default_rng(5)
    bodies = [rng.integers(0, 256, int(n), dtype=np.uint8) for n in rng.integers(0, 3000, 4000)]

    def producer(part: int) -> None:
        for body in bodies[part::4]:
            with lock:
                payload, s = sealed_payload(state["seq"], body)
                seq = ring.push(payload, timeout=30)
                assert seq == state["seq"]
                state["seq"] += 1
                state["sum"] = (state["sum"] + s) % (1 << 64)
                state["bytes"] += len(payload)

    try:
        run_workers(producer)
    finally:
        ring.stop()  # the kernel must exit before the ring is freed
        stream.synchronize()
    assert state["bytes"] > 4 * capacity or mirrored, "the ring should have wrapped many times"
    res = ring.results()
    assert res[RESULT_ERRORS] == 0, res
    assert res[RESULT_RECORDS] == len(bodies)
    assert res[RESULT_NEXT_SEQ] == len(bodies)
    assert res[RESULT_CHECKSUM_SUM] == state["sum"]
    assert res[RESULT_POS] == ring.published == ring.head


def test_ring_errors(cupy) -> None:
    gpu = vkgdr.Vkgdr(0)
    with pytest.raises(vkgdr.InvalidArgumentError, match="power of two"):
        vkgdr.DeviceRing(gpu, 5000)
    ring = vkgdr.DeviceRing(gpu, 4096)
    with pytest.raises(vkgdr.InvalidArgumentError):
        ring.push(b"")
    with pytest.raises(vkgdr.InvalidArgumentError, match="exceeds the maximum"):
        ring.push(b"x" * (ring.max_record + 1))
    # No consumer runs: the ring fills, and a push that may not wait says so.
    pushed = 0
    with pytest.raises(vkgdr.RingFullError):
        for _ in range(1000):
            ring.push(b"y" * 100, timeout=0)
            pushed += 1
    assert 0 < pushed < 4096 // 100
    with pytest.raises(vkgdr.RingFullError):
        ring.push(b"y" * 100, timeout=0.05)


def lane_record_len(k: int, salt: int) -> int:
    """Every fifth record 8 KiB or more (the copy engine's, from the default 4096 bytes), the
    others 16 bytes to ~1 KiB (the BAR's)."""
    if k % 5 == 0:
        return 8192 + (k * 7919 + salt) % 57000
    return 16 + (k * 131 + salt) % 1000


def test_lanes_with_producers_and_the_copy_engine_verified_by_the_kernel(cupy, cuda):
    gpu = vkgdr.Vkgdr(0)
    ring = vkgdr.DeviceRing(gpu, 1 << 20, lanes=2, copy_engine=4096)
    assert ring.lanes == 2
    view = ring.device_view
    assert view.lanes == 2 and view.lane_data != 0 and len(view.to_bytes()) == 64
    stream = cupy.cuda.Stream(non_blocking=True)
    module = launch_check_lanes(cuda, view, stream)
    ring.watch_consumer(stream)

    producers = [ring.producer(), ring.producer()]
    assert sorted(p.lane for p in producers) == [0, 1]
    with pytest.raises(vkgdr.VkgdrError, match="every one of the ring's 2 lanes has a producer"):
        ring.producer()
    records = 1500
    state = {}

    def produce(t: int) -> None:
        rng = np.random.default_rng(t)
        with producers[t] as p:
            assert p.next_seq == 0, "a new lane numbers from 0"
            # Writes gather up to 1 MiB, so large records meet the copy engine's 64 KiB rule.
            p.set_flush_policy(1 << 20)
            total, large, k = 0, 0, 0
            while k < records:
                mode = k % 7
                n = 1 if mode < 3 else min(4, records - k)
                batch = []
                for j in range(n):
                    size = lane_record_len(k + j, 17 * t + 3)
                    large += size >= 8192
                    body = rng.integers(0, 256, size - 16, dtype=np.uint8)
                    payload, s = sealed_payload(k + j, body)
                    total = (total + s) % (1 << 64)
                    batch.append(payload)
                if mode == 0:
                    assert p.push(batch[0], timeout=30) == k
                elif mode < 3:
                    assert p.write(bytearray(batch[0]), timeout=30) == k  # any bytes-like
                else:
                    assert p.push_batch(batch, timeout=30) == n
                k += n
            p.flush()
            assert p.next_seq == records
            state[p.lane] = (total, large)
        assert producers[t].closed

    try:
        run_workers(produce, 2)
        with ring.producer() as again:  # the lanes are free again
            assert again.next_seq == records
    finally:
        ring.stop()
        stream.synchronize()
        cuda.module_unload(module)
    for lane, (total, large) in state.items():
        assert large > records // 10
        res = ring.results_of(lane)
        assert res[RESULT_ERRORS] == 0, (lane, res)
        assert res[RESULT_RECORDS] == records
        assert res[RESULT_NEXT_SEQ] == records
        assert res[RESULT_CHECKSUM_SUM] == total
        assert res[RESULT_POS] == ring.head_of(lane)
    assert sorted(state) == [0, 1]
    stats = ring.copy_engine_stats()
    assert stats["unavailable"] is None, stats
    assert stats["lanes_ready"] == 2, stats
    assert stats["copies"] > 0 and stats["bytes"] > 0, stats
    assert stats["fallbacks"] == 0, stats


def test_producer_lifetime_closing_and_context_manager(cupy):
    gpu = vkgdr.Vkgdr(0)
    ring = vkgdr.DeviceRing(gpu, 4096, copy_engine=None)  # no consumer runs: nothing is read
    assert ring.lanes == 1
    p = ring.producer()
    assert (p.lane, p.next_seq, p.closed) == (0, 0, False)
    assert p.ring is ring
    with pytest.raises(vkgdr.VkgdrError, match="every one of the ring's 1 lanes"):
        ring.producer()
    assert p.push(b"x" * 32) == 0
    assert p.write(b"y" * 32) == 1
    assert ring.published == 48, "write waits for the flush policy"
    p.flush()
    assert ring.published == 96  # two records of 16-byte header + 32 bytes
    with pytest.raises(vkgdr.InvalidArgumentError):
        p.push(b"")
    with pytest.raises(vkgdr.InvalidArgumentError, match="exceeds the maximum"):
        p.push(b"x" * (ring.max_record + 1))
    p.close()
    p.close()  # closing twice does nothing
    assert p.closed
    for call in (lambda: p.push(b"z"), lambda: p.flush(), lambda: p.next_seq):
        with pytest.raises(vkgdr.VkgdrError, match="closed"):
            call()

    with ring.producer() as q:  # the lane is free again; numbering goes on
        assert q.next_seq == 2
        assert q.push_batch([b"a" * 16, memoryview(b"b" * 16)]) == 2
    assert q.closed and ring.published == 96 + 64

    # The ring fills (no consumer): waits that may not wait say so; a batch publishes the
    # records that fit before the one that did not.
    q = ring.producer()
    before = q.next_seq
    with pytest.raises(vkgdr.RingFullError):
        q.push_batch([b"c" * 1000] * 8, timeout=0)
    assert 0 < q.next_seq - before < 8
    assert ring.published > 96 + 64 + 1000 * (q.next_seq - before)
    with pytest.raises(vkgdr.RingFullError):
        q.push(b"d" * 1000, timeout=0.02)
    with pytest.raises(vkgdr.RingFullError):
        q.write(b"d" * 1000, timeout=0)

    # The producer keeps the ring alive.
    del ring
    gc.collect()
    assert q.ring.lanes == 1
    q.close()
    assert q.ring.copy_engine_stats() == {
        "lanes_ready": 0,
        "copies": 0,
        "bytes": 0,
        "fallbacks": 0,
        "stream_tails": 0,
        "unavailable": None,
    }


def test_the_default_ring_stages_large_batches_on_its_second_lane(cupy) -> None:
    """copy_engine=None (the default): lane 0 keeps 1 KiB records on the BAR (it stages only
    records of 8 KiB and more), lane 1 stages them once a batch has 64 KiB pending; both take a
    staging copy when claimed. copy_engine=0 keeps both on the BAR. No consumer runs: nothing is
    read, the records only have to fit."""
    gpu = vkgdr.Vkgdr(0)
    batch = [bytes([k % 251]) * 1008 for k in range(100)]  # 1 KiB with the header, 100 KiB in all
    for copy_engine, staging_lanes in ((None, 2), (0, 0)):
        ring = vkgdr.DeviceRing(gpu, 1 << 20, lanes=8, copy_engine=copy_engine)
        producers = [ring.producer() for _ in range(2)]
        assert [p.lane for p in producers] == [0, 1]
        for p in producers:
            assert p.push_batch(batch) == 100
            p.close()
        stats = ring.copy_engine_stats()
        assert stats["unavailable"] is None and stats["fallbacks"] == 0, stats
        assert stats["lanes_ready"] == staging_lanes, (copy_engine, stats)
        assert (stats["copies"] > 0) == (staging_lanes > 0), (copy_engine, stats)
        assert ring.published == 100 * 1024  # lane 0's records
        del producers, ring


def test_a_producer_told_stage_after_0_stages_lone_large_records(cupy) -> None:
    """stage_after: a producer starts at 64 KiB, so a lone 4 KiB record takes the BAR; set to 0,
    the next one is staged for the copy engine. Values that are not byte counts raise. No
    consumer runs: nothing is read, the records only have to fit."""
    gpu = vkgdr.Vkgdr(0)
    ring = vkgdr.DeviceRing(gpu, 1 << 20, copy_engine=4096)
    record = b"x" * 4080  # 4 KiB with the header
    with ring.producer() as p:
        assert p.stage_after == 64 << 10
        assert p.push(record) == 0
        assert ring.copy_engine_stats()["copies"] == 0, "at the default: the BAR"
        p.stage_after = 0
        assert p.stage_after == 0
        assert p.push(record) == 1
        stats = ring.copy_engine_stats()
        assert (stats["copies"], stats["bytes"], stats["fallbacks"]) == (1, 4096, 0), stats
        for bad in (-1, 1 << 64, 1.5, "0", None):
            with pytest.raises(vkgdr.InvalidArgumentError, match="stage_after"):
                p.stage_after = bad
        assert p.stage_after == 0
        with pytest.raises(AttributeError):
            del p.stage_after
    with pytest.raises(vkgdr.VkgdrError, match="closed"):
        p.stage_after = 0
    with pytest.raises(vkgdr.VkgdrError, match="closed"):
        p.stage_after
    assert ring.published == 2 * 4096


def test_ring_options_errors(cupy) -> None:
    gpu = vkgdr.Vkgdr(0)
    with pytest.raises(vkgdr.InvalidArgumentError, match="1 to 64 lanes, not 0"):
        vkgdr.DeviceRing(gpu, 4096, lanes=0)
    with pytest.raises(vkgdr.InvalidArgumentError, match="1 to 64 lanes, not 65"):
        vkgdr.DeviceRing(gpu, 4096, lanes=65)
    with pytest.raises(vkgdr.InvalidArgumentError, match="copy_engine -1"):
        vkgdr.DeviceRing(gpu, 4096, copy_engine=-1)
    with pytest.raises(vkgdr.InvalidArgumentError, match="copy_engine_split=True needs"):
        vkgdr.DeviceRing(gpu, 4096, copy_engine_split=True)
    with pytest.raises(vkgdr.InvalidArgumentError, match="leave copy_engine_split out"):
        vkgdr.DeviceRing(gpu, 4096, copy_engine=4096, copy_engine_split=True, shareable=True)
    split = vkgdr.DeviceRing(gpu, 4096, lanes=8, copy_engine=1024, copy_engine_split=True)
    assert split.lanes == 8 and not split.is_shareable
    producers = [split.producer() for _ in range(3)]  # lane 0 keeps the BAR, lanes 1 and 2 stage
    assert [p.lane for p in producers] == [0, 1, 2]
    for p in producers:
        assert p.push(b"x" * 32) == 0
        p.close()
    stats = split.copy_engine_stats()
    assert stats["unavailable"] is None and stats["lanes_ready"] == 3, stats
    del split, producers
    ring = vkgdr.DeviceRing(gpu, 4096, lanes=3, copy_engine=0)
    assert ring.lanes == ring.device_view.lanes == 3
    assert ring.head_of(2) == 0 and ring.results_of(2) == [0] * 8
    with pytest.raises(vkgdr.InvalidArgumentError, match="lane 3 does not exist"):
        ring.head_of(3)
    with pytest.raises(vkgdr.InvalidArgumentError, match="lane 3 does not exist"):
        ring.results_of(3)
