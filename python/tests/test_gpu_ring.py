"""DeviceRing on a GPU: records pushed from Python threads are consumed and verified by the
persistent consumer of kernels/ring.cu (its PTX, loaded through CuPy), across many wraps."""

import threading

import numpy as np
import pytest

import vkgdr
from conftest import KERNELS_DIR, run_workers

MUL = np.uint64(0x9E3779B97F4A7C15)
RESULT_RECORDS, RESULT_CHECKSUM_SUM, RESULT_ERRORS, RESULT_NEXT_SEQ, RESULT_POS = range(5)


def checksum(body: np.ndarray) -> int:
    """layout::test_checksum: sum over i of mix(((i << 8) | body[i]) + 1), wrapping."""
    i = np.arange(len(body), dtype=np.uint64)
    x = ((i << np.uint64(8)) | body.astype(np.uint64)) + np.uint64(1)
    with np.errstate(over="ignore"):
        x = x * MUL
        x ^= x >> np.uint64(29)
        return int(x.sum(dtype=np.uint64))


def test_payload(seq: int, body: np.ndarray) -> "tuple[bytes, int]":
    """A test payload (seq, checksum of the body, body) and its checksum."""
    s = checksum(body)
    return seq.to_bytes(8, "little") + s.to_bytes(8, "little") + body.tobytes(), s


test_payload.__test__ = False  # a helper, not a test


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
    kernel((1,), (256,), args, stream=stream)  # the checking kernels need 256 threads
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
                payload, s = test_payload(state["seq"], body)
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
