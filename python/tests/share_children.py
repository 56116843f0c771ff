"""The peers of the sharing tests: what a child process does, as functions that
``multiprocessing`` runs (spawn and fork) and as a script that ``subprocess`` runs:

    python share_children.py ROLE SOCKET [ARG ...]

Each exits 0 once its checks passed (an ``AssertionError`` or any exception exits 1 with its
traceback). Lines on stdout (flushed) tell the owner where the child is. This module imports
vkgdr and the ring records only, never the tests' configuration: a child must not load CUDA,
and ``check_no_cuda`` says whether it did.
"""

import sys
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

import vkgdr
from ring_records import sealed_payload


def say(*words: Any) -> None:
    print(*words, flush=True)


def check_no_cuda() -> None:
    """The child has not loaded the CUDA driver (nor CuPy or PyTorch): a peer needs Vulkan
    alone."""
    with open("/proc/self/maps") as f:
        maps = f.read()
    assert "libcuda" not in maps, "a peer loaded libcuda"
    for module in ("cupy", "torch"):
        assert module not in sys.modules, f"a peer imported {module}"


def pattern(n: int, seed: int) -> bytes:
    """``n`` bytes (a multiple of 4) of little-endian words ``i * 2654435761 + seed``."""
    i = np.arange(n // 4, dtype=np.uint64)
    return ((i * np.uint64(2654435761) + np.uint64(seed)) & np.uint64(0xFFFFFFFF)).astype(
        "<u4"
    ).tobytes()


# --- Raw memory ---------------------------------------------------------------------------------


def memory_writer(path: str, seed: str = "2", expect: str = "1", cuda: str = "no") -> None:
    """Attaches "m", checks the owner's bytes (``expect``'s pattern), writes its own (``seed``'s)
    with ``write`` and the first word through a NumPy view, and checks that a write past the end
    is refused."""
    if cuda == "no":
        check_no_cuda()
    with vkgdr.attach(path) as peer:
        m = peer.attach_memory("m")
        n = len(m)
        assert m.read() == pattern(n, int(expect)), "the owner's bytes, read by the peer"
        assert m.is_revoked is False
        mine = pattern(n, int(seed))
        m.write(mine[4:], 4)
        view = m.view(np.uint32)
        view[0] = np.frombuffer(mine[:4], "<u4")[0]
        m.flush()
        try:
            m.write(b"1234", n - 3)
        except vkgdr.InvalidArgumentError:
            pass
        else:
            raise AssertionError("a write past the end was not refused")
        del view
        if cuda == "no":
            check_no_cuda()
    say("WROTE")


# --- Pool blocks --------------------------------------------------------------------------------


def pool_filler(path: str) -> None:
    """Asks for three blocks and fills each with its tag; one past the quota is refused; then
    answers the block the owner sends: reads its tag (77), writes ours (78)."""
    check_no_cuda()
    peer = vkgdr.Peer(path, timeout=10)
    pool = peer.attach_pool("frames")
    assert pool.quota == 1 << 20
    for k, size in enumerate([100, 4096, 70_000]):
        b = pool.request(size, 256)
        assert len(b) == size and b.host_ptr % 256 == 0
        b.write(pattern(size & ~3, 10 + k))
        b.release()
        b.release()  # twice: nothing more
        assert b.is_released
    try:
        pool.request(2 << 20)
    except vkgdr.ShareError as e:
        assert e.reason == "quota", e
    else:
        raise AssertionError("a request past the quota was not refused")
    say("REQUESTED")
    b = pool.next_block(timeout=30)
    assert b is not None, "no block from the owner"
    assert b.read(0, 512) == pattern(512, 77), "the owner's tag in its block"
    b.write(pattern(512, 78))
    b.release()
    assert pool.next_block(timeout=0) is None
    peer.close()
    say("ANSWERED")


# --- Revocation ---------------------------------------------------------------------------------


def revoked(path: str) -> None:
    """Writes memory and a block, says so, then waits for the owner's revocations: writes are
    refused from then on."""
    peer = vkgdr.attach(path)
    m = peer.attach_memory("m")
    pool = peer.attach_pool("p")
    b = pool.next_block(timeout=30)
    assert b is not None
    m.write(b"\x01" * 64)
    b.write(b"\x02" * 64)
    say("WROTE")
    t = time.monotonic()
    while not (m.is_revoked and b.is_revoked and pool.is_revoked):
        assert time.monotonic() - t < 20, "no revocation arrived"
        time.sleep(0.005)
    for write in (lambda: m.write(b"\x03" * 64), lambda: b.write(b"\x03" * 64)):
        try:
            write()
        except vkgdr.ShareError as e:
            assert e.reason == "revoked", e
            assert "revoked" in str(e)
        else:
            raise AssertionError("a write after the revocation was not refused")
    # The owner hung up after revoking: asking for more says so.
    try:
        pool.request(64)
    except vkgdr.ShareError as e:
        assert e.reason in ("revoked", "disconnected"), e
    else:
        raise AssertionError("a request after the revocation was not refused")
    say("REFUSED")


# --- Ring lanes ---------------------------------------------------------------------------------


def record_body(k: int, salt: int) -> np.ndarray:
    """Record ``k``'s body: 8 to ~1 KiB bytes, every fifth 4 to 12 KiB."""
    size = 4096 + (k * 7919 + salt) % 8192 if k % 5 == 0 else 8 + (k * 131 + salt) % 1000
    return np.random.default_rng(k * 7 + salt).integers(0, 256, size, dtype=np.uint8)


def produce(lane: vkgdr.AttachedLane, records: int, salt: int) -> Dict[str, int]:
    """Pushes ``records`` sealed records, one at a time and in batches, numbered on from the
    lane's start; returns what the consumer should count."""
    start_seq = lane.start[1]
    assert lane.next_seq == start_seq
    total, k = 0, 0
    while k < records:
        n = 1 if k % 3 else min(8, records - k)
        batch = []
        for j in range(n):
            payload, s = sealed_payload(start_seq + k + j, record_body(k + j, salt))
            total = (total + s) % (1 << 64)
            batch.append(payload)
        if n == 1:
            assert lane.push(batch[0], timeout=60) == start_seq + k
        else:
            assert lane.push_batch(batch, timeout=60) == n
        k += n
    assert lane.next_seq == start_seq + records
    # Until the owner has passed everything on, so that the counts are exact.
    t = time.monotonic()
    while lane.accepted[0] < lane.published:
        assert time.monotonic() - t < 60, "the owner never accepted the tail"
        time.sleep(0.001)
    assert lane.accepted == (lane.published, start_seq + records)
    return {"lane": lane.lane, "start": start_seq, "records": records, "sum": total}


def lane_producer(
    path: str, records: str = "2000", salt: str = "0", out: Any = None, hold: Any = None
) -> None:
    """Attaches a lane of "in", pushes ``records`` records, and reports what it pushed (a line
    ``PUSHED lane start records sum``, and into the queue ``out`` when given). With ``hold`` (a
    ``multiprocessing`` event) it keeps its lane until the event is set."""
    check_no_cuda()
    with vkgdr.attach(path) as peer:
        lane = peer.attach_lane("in")
        done = produce(lane, int(records), int(salt))
        if hold is not None and not hold.wait(120):
            raise RuntimeError("the test never let the lane go")
        lane.detach()
    say("PUSHED", done["lane"], done["start"], done["records"], done["sum"])
    if out is not None:
        out.put(done)


def lane_streamer(path: str) -> None:
    """Attaches a lane of "in" and pushes records until killed: says ``STREAMING`` once 200
    are in."""
    peer = vkgdr.attach(path)
    lane = peer.attach_lane("in")
    seq = lane.start[1]
    k = 0
    while True:
        payload, _ = sealed_payload(seq + k, record_body(k, 5))
        lane.push(payload, timeout=60)
        k += 1
        if k == 200:
            say("STREAMING", lane.lane)


# --- Objects inherited through fork --------------------------------------------------------------


def inherited(path: str, objects: List[Any]) -> None:
    """In a child forked from the owner: none of the parent's objects can be used (each raises
    ``VkgdrError``, naming fork); a peer made here attaches and writes."""
    for obj in objects:
        uses: List[Callable[[], Any]] = []
        if isinstance(obj, vkgdr.ShareServer):
            uses = [obj.stats, lambda: obj.next_event(timeout=0), obj.close]
        elif isinstance(obj, vkgdr.AttachedMemory):
            uses = [lambda: obj.write(b"x"), obj.read, lambda: obj.is_revoked, obj.detach]
        elif isinstance(obj, vkgdr.Peer):
            uses = [lambda: obj.attach_memory("m"), obj.poll, obj.close]
        elif isinstance(obj, vkgdr.VulkanMemory):
            uses = [lambda: obj.write(b"x"), obj.read, lambda: obj.__array_interface__]
        elif isinstance(obj, vkgdr.VulkanDevice):
            uses = [lambda: obj.alloc(4096), obj.pool]
        for use in uses:
            try:
                use()
            except vkgdr.VkgdrError as e:
                assert "inherited through fork" in str(e), e
            else:
                raise AssertionError(f"{obj!r}: a use in a forked child was not refused")
    fork_refused(path)


def fork_refused(path: str) -> None:
    """In a child forked after its parent opened the Vulkan driver: attaching is refused by
    name (the driver's calls in a forked child break the parent's devices), before any of them."""
    try:
        with vkgdr.attach(path) as peer:
            peer.attach_memory("m")
    except vkgdr.VkgdrError as e:
        assert "forked" in str(e) and "spawn" in str(e), e
    else:
        raise AssertionError("a forked child was let open the Vulkan driver")


# --- The script ----------------------------------------------------------------------------------

ROLES: Dict[str, Callable[..., None]] = {
    "memory": memory_writer,
    "pool": pool_filler,
    "revoked": revoked,
    "produce": lane_producer,
    "stream": lane_streamer,
}


def main(argv: Optional[List[str]] = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    ROLES[args[0]](*args[1:])


if __name__ == "__main__":
    main()
