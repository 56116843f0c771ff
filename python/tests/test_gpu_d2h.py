"""DeviceToHostRing on a GPU: d2h_produce_test of kernels/ring_d2h.ptx publishes records from
8 blocks of 64 threads into 4 lanes while 4 Python threads take them, one LaneConsumer each,
checking every record (its lane's order, kind, length and the words its thread wrote in that
round); a lane closed under a waiting kernel ends the kernel's wait; and misuse of rings,
consumers and views raises, never crashes."""

import ctypes
import gc
import struct
import threading
import time

import numpy as np
import pytest

import vkgdr
from conftest import KERNELS_DIR, run_workers

LANES, BLOCKS, THREADS, ROUNDS, LEN = 4, 8, 64, 200, 64
PER_LANE = BLOCKS // LANES * THREADS * ROUNDS
#: Statuses of ring_d2h.cuh, as the kernel counts them in result[1 + status].
D2H_CLOSED = 1


@pytest.fixture()
def produce(cuda, cupy):
    """launch(view, blocks, threads, rounds, length, result, stream): d2h_produce_test through the
    driver API (the view is a 48-byte struct passed by value), loaded into the current context
    (device 0's primary one, CuPy's) and unloaded at the end."""
    if KERNELS_DIR is None:
        pytest.fail("kernels/ring_d2h.ptx not found: set VKGDR_KERNELS_DIR")
    module, fn = cuda.load_function(KERNELS_DIR / "ring_d2h.ptx", "d2h_produce_test")

    def launch(view, blocks, threads, rounds, length, result, stream):
        arg = ctypes.create_string_buffer(view.to_bytes(), 48)
        values = [ctypes.c_uint32(rounds), ctypes.c_uint32(length), ctypes.c_uint64(result.data.ptr)]
        params = (ctypes.c_void_p * 4)(
            ctypes.cast(arg, ctypes.c_void_p),
            *[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values],
        )
        cuda.check(
            "cuLaunchKernel",
            cuda.lib.cuLaunchKernel(
                ctypes.c_void_p(fn), blocks, 1, 1, threads, 1, 1, 0,
                ctypes.c_void_p(stream.ptr), params, None,
            ),
        )

    yield launch
    cuda.ctx_synchronize()
    cuda.module_unload(module)


def wait_done(stream, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not stream.done:
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


@pytest.mark.parametrize(
    "slot_format, stride, max_payload, code",
    [("committed", 128, 112, 0), ("tagged", 256, 120, 1)],
)
def test_a_kernels_records_arrive_in_order_in_every_lane(
    cupy, produce, slot_format, stride, max_payload, code
):
    gpu = vkgdr.Vkgdr(0)
    ring = vkgdr.DeviceToHostRing(
        gpu, 1024, stride, lanes=LANES, spin_limit=1 << 22, format=slot_format
    )
    assert (ring.lanes, ring.slots, ring.stride, ring.max_payload, ring.format) == (
        LANES, 1024, stride, max_payload, slot_format,
    )
    view = ring.device_view
    fields = struct.unpack("<QQQIIIIII", view.to_bytes())
    assert fields == (
        view.slots, view.control, view.device, 1024, stride, LANES, 1 << 22, code, 0,
    ), "to_bytes is vkgdr_d2h_view's layout"
    assert view.format == code
    assert view.device == view.control + 128 * LANES and view.ring is ring
    consumers = [ring.consumer(lane) for lane in range(LANES)]
    result = cupy.zeros(5, dtype=cupy.uint64)
    stream = cupy.cuda.Stream(non_blocking=True)
    problems = [[] for _ in range(LANES)]
    counts = [0] * LANES

    def consume(lane: int) -> None:
        next_round = {}
        for rec in consumers[lane]:  # ends once the ring is finished and the lane empty
            if rec.seq != counts[lane] or rec.kind != 1 or len(rec.payload) != LEN:
                problems[lane].append((rec.seq, counts[lane], rec.kind, len(rec.payload)))
                counts[lane] += 1
                continue
            counts[lane] += 1
            w = np.frombuffer(rec.payload, dtype="<u8")
            thread, rnd = int(w[0]) >> 32, int(w[0]) & 0xFFFFFFFF
            if (thread // THREADS) % LANES != lane or next_round.get(thread, 0) != rnd:
                problems[lane].append(("thread, round", thread, rnd))
            next_round[thread] = rnd + 1
            if not (w == w[0] + np.arange(LEN // 8, dtype=np.uint64)).all():
                problems[lane].append(("payload", rec.seq))
        missing = [t for t, r in next_round.items() if r != ROUNDS]
        if len(next_round) != BLOCKS // LANES * THREADS or missing:
            problems[lane].append(("threads", len(next_round), missing[:4]))

    workers = [threading.Thread(target=consume, args=(lane,)) for lane in range(LANES)]
    for w in workers:
        w.start()
    try:
        produce(view, BLOCKS, THREADS, ROUNDS, LEN, result, stream)
        assert wait_done(stream, 120), "the producing kernel did not finish"
    finally:
        ring.finish()  # the consumers' iterators end once their lanes are empty
        for w in workers:
            w.join(120)
    assert not any(w.is_alive() for w in workers), "a consumer did not end"
    assert problems == [[]] * LANES
    assert counts == [PER_LANE] * LANES
    assert result.get().tolist() == [0] * 5, "the kernel was refused"
    for lane, c in enumerate(consumers):
        assert c.ended and c.next_seq == PER_LANE and c.lane == lane and c.ring is ring
        assert ring.lane_stats(lane) == {"reserved": PER_LANE, "taken": PER_LANE, "gave_up": 0}
        c.close()


def test_closing_a_lane_ends_a_waiting_kernel_and_the_next_consumer_resumes(cupy, produce):
    gpu = vkgdr.Vkgdr(0)
    # A spin budget of minutes: only the close can end the kernel's wait in time.
    ring = vkgdr.DeviceToHostRing(gpu, 32, 64, spin_limit=1 << 30)
    result = cupy.zeros(5, dtype=cupy.uint64)
    stream = cupy.cuda.Stream(non_blocking=True)
    # One warp, 10 rounds of 32 records into 32 slots: it fills the lane and waits for room.
    produce(ring.device_view, 1, 32, 10, 48, result, stream)
    with ring.consumer(0) as first:
        for seq in range(5):
            rec = first.next(timeout=30)
            assert rec is not None and (rec.seq, len(rec.payload)) == (seq, 48)
        # A take leaves the head one record behind until the consumer's next call.
        assert ring.lane_stats(0)["taken"] == 4
        first.publish_head()
        assert ring.lane_stats(0)["taken"] == 5
    assert first.closed
    assert wait_done(stream, 60), "the kernel still waits for room after the close"
    refused = result.get().tolist()
    assert refused[0] == 32 and refused[1 + D2H_CLOSED] == 32, refused
    stats = ring.lane_stats(0)
    assert (stats["reserved"], stats["taken"]) == (32, 5) and stats["gave_up"] >= 1, stats
    with pytest.raises(vkgdr.VkgdrError, match="the LaneConsumer is closed"):
        first.next(timeout=0)
    with pytest.raises(vkgdr.VkgdrError, match="the LaneConsumer is closed"):
        first.publish_head()

    ring.finish()
    again = ring.consumer(0)
    assert again.next_seq == 5, "a new consumer resumes where the last one stopped"
    assert [r.seq for r in again] == list(range(5, 32))
    assert again.ended and again.next(timeout=0) is None
    ring.restart()
    assert not ring.is_finished and not again.ended
    assert again.try_next() is None and again.next(timeout=0.01) is None


def test_misuse_raises_and_never_crashes(cupy):
    gpu = vkgdr.Vkgdr(0)
    with pytest.raises(vkgdr.InvalidArgumentError, match="powers of two"):
        vkgdr.DeviceToHostRing(gpu, 1000, 64)
    with pytest.raises(vkgdr.InvalidArgumentError, match="1 to 1024 lanes, not 0"):
        vkgdr.DeviceToHostRing(gpu, 64, 64, lanes=0)
    ring = vkgdr.DeviceToHostRing(gpu, 64, 64, lanes=2)
    with pytest.raises(vkgdr.InvalidArgumentError, match="lane 2 does not exist"):
        ring.consumer(2)
    with pytest.raises(vkgdr.InvalidArgumentError, match="lane 9 does not exist"):
        ring.lane_stats(9)
    c = ring.consumer(0)
    with pytest.raises(vkgdr.VkgdrError, match="lane 0 has a consumer already"):
        ring.consumer(0)
    for bad in (-1.0, float("nan"), float("-inf")):
        with pytest.raises(vkgdr.InvalidArgumentError, match="is not >= 0"):
            c.next(timeout=bad)
    assert c.try_next() is None and c.next(timeout=0.01) is None and not c.ended

    # One thread at a time: a second one is refused at once, not made to wait.
    started = threading.Event()
    outcome = []

    def waiter() -> None:
        started.set()
        outcome.append(c.next(timeout=1.0))

    th = threading.Thread(target=waiter)
    th.start()
    started.wait()
    time.sleep(0.2)
    with pytest.raises(vkgdr.VkgdrError, match="in use by another thread"):
        c.try_next()
    th.join()
    assert outcome == [None]

    # The view and the consumer keep the ring alive; closed consumers refuse every call.
    view, other = ring.device_view, ring.consumer(1)
    del ring
    gc.collect()
    assert view.ring.lanes == 2 and other.ring is view.ring and len(view.to_bytes()) == 48
    c.close()
    c.close()  # twice: nothing
    for call in (c.try_next, c.next, lambda: next(iter(c)), lambda: c.next_seq, lambda: c.ended):
        with pytest.raises(vkgdr.VkgdrError, match="the LaneConsumer is closed"):
            call()
    assert c.closed and "closed" in repr(c)
    # Closing the ring under a live consumer: records still taken as before (none here).
    view.ring.close()
    assert other.try_next() is None
    other.close()
    view.ring.consumer(0).close()  # the lanes are free again


def test_consumers_of_every_lane_from_threads_at_once(cupy):
    # Many threads opening, polling and closing consumers of a few lanes: each lane has one
    # consumer at a time, and every refusal is a VkgdrError.
    ring = vkgdr.DeviceToHostRing(vkgdr.Vkgdr(0), 64, 64, lanes=3)
    refusals = []

    def churn(part: int) -> None:
        for k in range(200):
            try:
                with ring.consumer((part + k) % 3) as c:
                    assert c.try_next() is None
            except vkgdr.VkgdrError as e:
                assert "has a consumer already" in str(e), e
                refusals.append(e)

    run_workers(churn)
    for lane in range(3):
        ring.consumer(lane).close()


@pytest.mark.parametrize("slot_format", ["committed", "tagged"])
def test_blocks_released_by_a_kernel_come_back_to_the_pool(cuda, cupy, slot_format):
    # A pool whose release feed is a two-lane ring lends 300 blocks; d2h_release_test sends
    # their tokens back through vkgdr_release_token and the pool gets every block back; the
    # same (now spent) tokens once more free nothing.
    if KERNELS_DIR is None:
        pytest.fail("kernels/ring_d2h.ptx not found: set VKGDR_KERNELS_DIR")
    gpu = vkgdr.Vkgdr(0)
    pool = vkgdr.Pool(gpu)
    ring = vkgdr.DeviceToHostRing(gpu, 64, 64, lanes=2, format=slot_format)
    pool.set_release_feed(ring)
    # Once per pool: a second ring is refused (its lanes stay free for consumers), and the same
    # ring again is refused at its lanes, which are the pool's now.
    other = vkgdr.DeviceToHostRing(gpu, 64, 64, lanes=1)
    with pytest.raises(vkgdr.VkgdrError, match="the pool has a release feed already"):
        pool.set_release_feed(other)
    other.consumer(0)
    with pytest.raises(vkgdr.VkgdrError, match="lane 0 has a consumer already"):
        pool.set_release_feed(ring)
    with pytest.raises(vkgdr.VkgdrError, match="lane 0 has a consumer already"):
        ring.consumer(0)  # the feed's lanes are the pool's
    blocks = [pool.alloc(64 + i) for i in range(300)]
    pointers = {b.device_ptr for b in blocks}
    tokens = [b.release_on_device() for b in blocks]
    assert len(set(tokens)) == 300 and pool.lent_blocks == 300
    assert all(b.is_released_on_device for b in blocks)
    with pytest.raises(vkgdr.VkgdrError, match="released on the device"):
        blocks[0].write(b"x")
    with pytest.raises(vkgdr.VkgdrError, match="released on the device"):
        blocks[0].release_on_device()
    view = ring.device_view
    module, fn = cuda.load_function(KERNELS_DIR / "ring_d2h.ptx", "d2h_release_test")
    try:
        dtokens = cupy.asarray(np.array(tokens, dtype=np.uint64))
        result = cupy.zeros(5, dtype=cupy.uint64)
        for attempt in range(2):
            result[:] = 0
            arg = ctypes.create_string_buffer(view.to_bytes(), 48)
            values = [
                ctypes.c_uint64(dtokens.data.ptr),
                ctypes.c_uint32(len(tokens)),
                ctypes.c_uint64(result.data.ptr),
            ]
            params = (ctypes.c_void_p * 4)(
                ctypes.cast(arg, ctypes.c_void_p),
                *[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values],
            )
            cupy.cuda.Device().synchronize()
            cuda.check(
                "cuLaunchKernel",
                cuda.lib.cuLaunchKernel(
                    ctypes.c_void_p(fn), 5, 1, 1, 64, 1, 1, 0, None, params, None
                ),
            )
            cuda.ctx_synchronize()
            assert result.get().tolist() == [0] * 5, f"launch {attempt}: refused"
            # The pool's thread drains while blocks are lent; this drains the spent tokens too.
            end = time.monotonic() + 30
            while time.monotonic() < end:
                pool.drain_device_releases()
                releases = pool.stats()["device_releases"]
                refused = releases["stale"] + releases["repeated"]
                if releases["lent"] == 0 and refused >= 300 * attempt:
                    break
                time.sleep(0.001)
            assert pool.lent_blocks == 0, f"launch {attempt}: blocks still lent"
            assert releases["issued"] == releases["redeemed"] == 300, releases
            # The second launch's tokens were spent: each one refused, none freeing anything.
            assert releases["stale"] + releases["repeated"] == 300 * attempt, releases
            assert releases["forged"] == 0 and releases["lane_error"] is None, releases
    finally:
        cuda.module_unload(module)
    # The blocks are the pool's again: allocations of the same sizes reuse their memory.
    again = [pool.alloc(64 + i) for i in range(300)]
    assert {b.device_ptr for b in again} & pointers, "no block came back"
    assert pool.reclaim_device_releases() == 0
