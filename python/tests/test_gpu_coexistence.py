"""A running kernel never stalls vkgdr from Python (docs/RELIABILITY.md).

A persistent kernel (``spin_until_stopped``, kernels/mapping.cu) spins on a non-blocking CuPy
stream of its own while eight Python threads churn pools (thread-cached, uncached, dedicated
blocks), make and free raw allocations every way (carved and mapped on their own, with and
without views alive), create and drop rings, and the main thread exhausts the BAR and recovers.
Everything finishes in bounded time with the kernel's heartbeat advancing throughout, every byte
read back is what was written, a kernel launched meanwhile on another stream finds every kept
block intact, and once the releases have settled free VRAM is back where it was. A watchdog
(faulthandler) turns a hang into a failure that prints every thread's stack.

Also: what a release waits for from Python (the stream ``free(after=...)`` names, a ring's
watched consumer) and what it does not (a kernel on a non-blocking stream, by default), and that
a ring collected while its consumer runs keeps its memory until the kernel has exited.

Loading a module and, under CUDA's lazy loading, the first launch of each kernel wait for running
kernels: every kernel used beside the persistent one is loaded and launched once before it
starts, and no CuPy kernel is compiled or launched meanwhile.
"""

import collections
import faulthandler
import gc
import random
import sys
import threading
import time
from typing import Any, Callable, List, Tuple

import numpy as np
import pytest

import vkgdr
from conftest import KERNELS_DIR, tag_bytes

#: How long the workers churn in the measured pass (a 3 s pass comes first).
CHURN = 15.0
#: The watchdog's limit for one test: a hang fails with every thread's stack.
LIMIT = 150.0
MIB = 1 << 20


@pytest.fixture(scope="module")
def mapping(cupy) -> Any:
    """kernels/mapping.ptx through CuPy (loaded at the first ``get_function``, which each test
    makes before its persistent kernel starts: loading waits for running kernels)."""
    if KERNELS_DIR is None:
        pytest.fail("kernels/mapping.ptx not found: set VKGDR_KERNELS_DIR")
    return cupy.RawModule(path=str(KERNELS_DIR / "mapping.ptx"))


@pytest.fixture()
def watchdog():
    faulthandler.dump_traceback_later(LIMIT, exit=True, file=sys.__stderr__)
    yield
    faulthandler.cancel_dump_traceback_later()


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.0002)


def launch_spin(cupy, mapping, stop_ptr: int, beats_ptr: int, stream) -> None:
    """spin_until_stopped(stop, beats) on ``stream``: until the u32 at ``stop`` is non-zero it
    counts, storing the count (even) at ``beats`` every 4096 steps; on exit it stores it odd."""
    fn = mapping.get_function("spin_until_stopped")
    fn((1,), (1,), (np.uint64(stop_ptr), np.uint64(beats_ptr)), stream=stream)


class Spinner:
    """spin_until_stopped on a non-blocking CuPy stream (its own unless one is given), its stop
    word and heartbeat in a RawMemory (allocated in the calling thread's current context, CuPy's
    primary one)."""

    def __init__(self, cupy, mapping, gpu: vkgdr.Vkgdr, stream: Any = None) -> None:
        self.cupy, self.mapping = cupy, mapping
        self.stream = stream if stream is not None else cupy.cuda.Stream(non_blocking=True)
        self.words = vkgdr.RawMemory(gpu, 4096)
        self.stop_word = np.asarray(self.words).view(np.uint32)[0:1]
        self.beat_word = np.asarray(self.words).view(np.uint64)[8:9]  # offset 64
        self.running = False

    def launch(self) -> None:
        """Launches the kernel (it starts once the work queued before it on the stream is done)."""
        self.stop_word[0] = 0
        self.beat_word[0] = 0
        self.words.flush(0, 128)
        ptr = self.words.device_ptr
        launch_spin(self.cupy, self.mapping, ptr, ptr + 64, self.stream)
        self.running = True

    def start(self) -> "Spinner":
        """Launches the kernel and waits for its first heartbeat."""
        self.launch()
        wait_until(lambda: self.beats() > 0, "the persistent kernel's first heartbeat")
        return self

    def beats(self) -> int:
        self.words.invalidate(64, 8)
        return int(self.beat_word[0])

    def is_alive(self) -> bool:
        """Whether the heartbeat advances (and is even: still running) within 2 s."""
        first = self.beats()
        start = time.monotonic()
        while time.monotonic() - start < 2.0:
            now = self.beats()
            if now != first and now % 2 == 0:
                return True
            time.sleep(0.0005)
        return False

    def signal_stop(self) -> None:
        """A plain store through the BAR: no driver call that could queue behind the kernel."""
        self.stop_word[0] = 1
        self.words.flush(0, 4)

    def stop(self) -> None:
        if not self.running:
            return
        self.signal_stop()
        wait_until(lambda: self.beats() % 2 == 1, "the persistent kernel's exit")
        self.stream.synchronize()
        self.running = False


def settle(gpu: vkgdr.Vkgdr) -> None:
    gc.collect()
    assert gpu.wait_for_releases(30), f"{gpu.pending_releases()} releases still waiting after 30 s"


class Pass:
    """What one churn pass shares between its threads."""

    def __init__(self, end: float) -> None:
        self.end = end
        self.lock = threading.Lock()
        self.ops = 0
        self.out_of_memory = 0
        self.exhaustions = 0
        self.errors: List[BaseException] = []
        self.kept: List[Tuple[vkgdr.Block, int]] = []

    def running(self) -> bool:
        return time.monotonic() < self.end

    def count(self, ops: int = 1, out_of_memory: int = 0) -> None:
        with self.lock:
            self.ops += ops
            self.out_of_memory += out_of_memory


def churn(state: Pass, op: Callable[[random.Random], None], seed: int) -> None:
    """Runs ``op`` until the pass ends, tolerating out-of-device-memory (the BAR is exhausted on
    purpose now and then); any other error fails the test."""
    rng = random.Random(seed)
    try:
        while state.running():
            try:
                op(rng)
                state.count()
            except vkgdr.OutOfDeviceMemoryError:
                state.count(0, 1)
                time.sleep(0.002)
    except BaseException as e:  # noqa: B902 - reported by the main thread
        state.errors.append(e)


def pool_churn(state: Pass, pool: vkgdr.Pool, worker: int, sizes: Tuple[int, int], side) -> None:
    live: collections.deque = collections.deque()
    tag = worker << 24

    def op(rng: random.Random) -> None:
        nonlocal tag
        n = rng.randrange(*sizes)
        b = pool.alloc(n, 16)
        tag += 1
        data = tag_bytes(tag, n)
        if rng.randrange(2):
            np.asarray(b)[:] = data
        else:
            b.write(data)
        b.flush()
        head = b.read(0, min(n, 256))
        assert head == data[: len(head)].tobytes(), f"worker {worker}: block read back"
        live.append((b, tag))
        if len(live) > 64:
            old, _ = live.popleft()
            how = rng.randrange(3)
            if how == 1:
                old.free()
            elif how == 2:
                old.free(after=side)  # an idle stream: passes at once, never waited for

    churn(state, op, worker)
    with state.lock:
        state.kept.extend(list(live)[:32])


def dedicated_churn(state: Pass, pool: vkgdr.Pool, side) -> None:
    def op(rng: random.Random) -> None:
        n = 8 * MIB + rng.randrange(16 * MIB)
        b = pool.alloc(n, 256)
        assert b.is_dedicated
        stamp = n.to_bytes(8, "little")
        b.write(stamp, n - 8)
        assert b.read(n - 8, 8) == stamp, "dedicated block read back"
        if rng.randrange(2):
            b.free(after=side)

    churn(state, op, 3)


def raw_churn(state: Pass, gpu: vkgdr.Vkgdr, cuda, context: int, worker: int, side) -> None:
    """Raw allocations of 4 KiB to 4 MiB (carved up to 1 MiB, mapped on their own above), freed
    every way, some with their NumPy view still alive."""
    cuda.ctx_push(context)  # RawMemory goes into the calling thread's current context

    def op(rng: random.Random) -> None:
        n = 4096 << rng.randrange(11)
        m = vkgdr.RawMemory(gpu, n)
        view = np.asarray(m).view(np.uint8)
        stamp = np.frombuffer(rng.getrandbits(64).to_bytes(8, "little"), np.uint8)
        view[n - 8 :] = stamp
        m.flush(n - 8, 8)
        m.invalidate(n - 8, 8)
        assert bytes(view[n - 8 :]) == stamp.tobytes(), f"worker {worker}: raw read back"
        how = rng.randrange(4)
        if how == 3:
            m.free()  # the view is alive: the memory waits for it
            assert m.is_freed
            view[0] = 1  # still the allocation's own memory
            del view
            return
        del view
        if how == 0:
            m.free()
        elif how == 1:
            m.free(now=True)
        else:
            m.free(after=side)

    try:
        churn(state, op, worker)
    finally:
        cuda.ctx_pop()


def cupy_view_churn(state: Pass, gpu: vkgdr.Vkgdr, cuda, context: int, cupy) -> None:
    """Raw memory seen by CuPy through the CUDA array interface, freed while the array lives."""
    cuda.ctx_push(context)

    def op(rng: random.Random) -> None:
        n = 4096 << rng.randrange(10)
        m = vkgdr.RawMemory(gpu, n)
        host = np.asarray(m).view(np.uint8)
        host[:8] = 7
        m.flush(0, 8)
        d = cupy.asarray(m)  # holds `m`: no kernel is launched
        assert d.data.ptr == m.device_ptr and d.shape == (n,)
        m.free()
        assert m.is_freed, "freed, waiting for the views"
        with pytest.raises(vkgdr.VkgdrError, match="freed"):
            m.device_ptr
        host[8:16] = 9
        assert int(host[15]) == 9
        del d, host, m

    try:
        churn(state, op, 7)
    finally:
        cuda.ctx_pop()


def ring_churn(state: Pass, gpu: vkgdr.Vkgdr) -> None:
    def op(rng: random.Random) -> None:
        mirrored = rng.randrange(4) == 0
        ring = vkgdr.DeviceRing(gpu, (2 * MIB) if mirrored else (64 << 10), mirrored=mirrored)
        for _ in range(rng.randrange(16)):
            ring.push(b"\x07" * 100, timeout=0)
        view = ring.device_view
        assert view.ring is ring
        del ring  # the view keeps it
        assert view.ring.capacity == view.capacity
        del view

    churn(state, op, 6)


def exhaust_the_bar(state: Pass, gpu: vkgdr.Vkgdr) -> None:
    """The main thread: 1 GiB raw allocations until the BAR is full, hold, free, allocate
    again."""
    round_ = 0
    while state.running():
        round_ += 1
        held = []
        while True:
            try:
                held.append(vkgdr.RawMemory(gpu, 1 << 30))
            except vkgdr.OutOfDeviceMemoryError as e:
                assert (e.result_name or "").startswith(
                    ("VK_ERROR_OUT_OF_DEVICE_MEMORY", "VK_ERROR_OUT_OF_HOST_MEMORY",
                     "CUDA_ERROR_OUT_OF_MEMORY")
                ), str(e)
                break
            assert len(held) < 200, "never ran out of BAR memory"
        state.exhaustions += 1
        time.sleep(0.2)
        n = len(held)
        held.clear()
        try:
            again = vkgdr.RawMemory(gpu, 1 << 30)
        except vkgdr.OutOfDeviceMemoryError as e:
            raise AssertionError(f"round {round_}: 1 GiB after freeing {n} GiB: {e}") from e
        again.free()
        time.sleep(0.3)


def check_kept_blocks(cupy, mapping, gpu: vkgdr.Vkgdr, kept) -> None:
    """check_tagged_blocks on another stream, beside the persistent kernel: every kept block
    still holds its tag's bytes."""
    n = len(kept)
    assert n > 0
    table = vkgdr.RawMemory(gpu, 16 * n + 8)
    raw = np.asarray(table).view(np.uint8)
    raw[: 8 * n] = np.array([b.device_ptr for b, _ in kept], np.uint64).view(np.uint8)
    raw[8 * n : 12 * n] = np.array([len(b) for b, _ in kept], np.uint32).view(np.uint8)
    raw[12 * n : 16 * n] = np.array([t for _, t in kept], np.uint32).view(np.uint8)
    raw[16 * n :] = 0
    table.flush(0, 16 * n + 8)
    base = table.device_ptr
    stream = cupy.cuda.Stream(non_blocking=True)
    check = mapping.get_function("check_tagged_blocks")
    args = (base, base + 8 * n, base + 12 * n, n, base + 16 * n)
    check((8,), (256,), tuple(np.uint64(a) for a in args), stream=stream)
    stream.synchronize()
    table.invalidate(16 * n, 8)
    bad = int(raw[16 * n :].view(np.uint64)[0])
    del raw
    table.free()
    assert bad == 0, f"{bad} of {n} kept blocks changed"


def churn_pass(cupy, mapping, cuda, gpu, spinner: Spinner, seconds: float) -> None:
    beats_start = spinner.beats()
    state = Pass(time.monotonic() + seconds)
    context = cuda.ctx_get_current()
    assert context, "CuPy's primary context is current on the main thread"
    cached = vkgdr.Pool(gpu)
    uncached = vkgdr.Pool(gpu, thread_cache=0)
    side = cupy.cuda.Stream(non_blocking=True)
    workers = [
        threading.Thread(target=pool_churn, args=(state, cached, 0, (16, 64 << 10), side)),
        threading.Thread(target=pool_churn, args=(state, cached, 1, (16, 64 << 10), side)),
        threading.Thread(target=pool_churn, args=(state, uncached, 2, (16, 4096), side)),
        threading.Thread(target=dedicated_churn, args=(state, cached, side)),
        threading.Thread(target=raw_churn, args=(state, gpu, cuda, context, 4, side)),
        threading.Thread(target=raw_churn, args=(state, gpu, cuda, context, 5, side)),
        threading.Thread(target=ring_churn, args=(state, gpu)),
        threading.Thread(target=cupy_view_churn, args=(state, gpu, cuda, context, cupy)),
    ]
    for w in workers:
        w.start()
    try:
        exhaust_the_bar(state, gpu)
    except BaseException as e:  # noqa: B902 - reported with the workers'
        state.errors.append(e)
    for w in workers:
        w.join()
    if state.errors:
        raise state.errors[0]
    assert spinner.is_alive(), "the persistent kernel stopped while vkgdr was used"
    beats_end = spinner.beats()
    print(
        f"coexistence: {state.ops} operations, {state.out_of_memory} out-of-memory answers, "
        f"{state.exhaustions} BAR exhaustions; heartbeat {beats_start} -> {beats_end}"
    )
    assert beats_end > beats_start
    assert state.exhaustions >= 1
    assert state.ops > 1000
    check_kept_blocks(cupy, mapping, gpu, state.kept)
    print(f"coexistence: {len(state.kept)} kept blocks checked by a kernel beside the spinner")
    state.kept.clear()
    del cached, uncached, side


def test_eight_threads_and_bar_exhaustion_beside_a_persistent_kernel(
    cuda, cupy, mapping, watchdog
) -> None:
    gpu = vkgdr.Vkgdr(0)
    # Every kernel launched beside the spinner, once before it starts (a first launch would
    # wait for it under lazy loading); check_tagged_blocks with a count of 0 does nothing.
    mapping.get_function("spin_until_stopped")
    check = mapping.get_function("check_tagged_blocks")
    check((1,), (1,), tuple(np.uint64(0) for _ in range(5)))
    cupy.cuda.runtime.deviceSynchronize()
    probe = vkgdr.RawMemory(gpu, 4096)
    cupy.asarray(probe)  # CuPy's path for arrays over the CUDA array interface, once
    probe.free()
    spinner = Spinner(cupy, mapping, gpu).start()
    try:
        # A short pass first: what the driver and CuPy set up once is not a leak.
        churn_pass(cupy, mapping, cuda, gpu, spinner, 3.0)
        settle(gpu)
        gpu.trim()
        free_before = cupy.cuda.runtime.memGetInfo()[0]
        churn_pass(cupy, mapping, cuda, gpu, spinner, CHURN)
        settle(gpu)
        gpu.trim()
        free_after = cupy.cuda.runtime.memGetInfo()[0]
        assert spinner.is_alive()
    finally:
        spinner.stop()
    print(f"coexistence: free VRAM {free_before} bytes before, {free_after} after")
    assert free_after == free_before, (
        f"device memory left behind: {(free_before - free_after) / MIB:.1f} MiB"
    )


def test_releases_wait_for_the_stream_they_name_and_rings_for_their_consumer(
    cupy, mapping, watchdog
) -> None:
    gpu = vkgdr.Vkgdr(0)
    mapping.get_function("spin_until_stopped")
    spinner = Spinner(cupy, mapping, gpu)
    pool = vkgdr.Pool(gpu, thread_cache=0)
    consumer = cupy.cuda.Stream(non_blocking=True)
    behind = Spinner(cupy, mapping, gpu, consumer)  # launched behind the ring's consumer
    ring = None
    view = None
    settle(gpu)
    spinner.start()
    try:
        # The default release does not wait for a kernel on a non-blocking stream...
        m = vkgdr.RawMemory(gpu, 4 * MIB)
        np.asarray(m).view(np.uint8)[:8] = 1
        m.free()
        assert gpu.wait_for_releases(2), "a default release waited for a non-blocking stream"
        # ... a release after its stream does, and the caller still does not wait.
        m = vkgdr.RawMemory(gpu, 4 * MIB)
        t = time.monotonic()
        m.free(after=spinner.stream)
        small = vkgdr.RawMemory(gpu, 64 << 10)
        small.free(after=vkgdr.RawStream(spinner.stream.ptr))  # the stream as a raw CUstream
        block = pool.alloc(4096)
        block.free(after=spinner.stream)
        assert time.monotonic() - t < 1.0, "a free waited"
        time.sleep(0.05)
        assert gpu.pending_releases() == 3, "the releases wait for the spinner's stream"
        assert pool.stats()["bytes_in_use"] == 4096, "the block is not handed out again yet"
        assert not gpu.wait_for_releases(0.1)
        # The three wait, the oldest named and for at least the 0.15 s slept and waited above.
        times = gpu.release_times()
        assert times.waiting == 3, times
        oldest = times.oldest_waiting
        assert oldest is not None and oldest.seconds >= 0.1 and oldest.what, times
        assert repr(times).startswith("<vkgdr.ReleaseTimes waiting=3 oldest_waiting="), times

        # A ring whose consumer runs: a kernel that beats into the ring's result words (pinned
        # host memory) until the ring's own stop word is set, and behind it on the same stream
        # a kernel stopped by us, so the stream passes the watched point only when we say.
        ring = vkgdr.DeviceRing(gpu, 64 << 10)
        view = ring.device_view
        launch_spin(cupy, mapping, view.stop, view.result, consumer)
        behind.launch()
        ring.watch_consumer(consumer)
        wait_until(lambda: ring.results()[0] > 0, "the ring's consumer's first heartbeat")
        ring = None
        gc.collect()
        # The view keeps the ring: the consumer still runs, beating into its memory.
        first = view.ring.results()[0]
        wait_until(lambda: view.ring.results()[0] != first, "the consumer's heartbeat")
        assert view.ring.results()[0] % 2 == 0, "the consumer exited while its ring lived"
        before = gpu.pending_releases()
        t = time.monotonic()
        view = None  # the ring goes: its drop sets the ring's stop word, and returns at once
        gc.collect()
        assert time.monotonic() - t < 1.0, "dropping the ring waited"
        # The consumer saw the ring's stop word and exited (its last heartbeat landed in the
        # ring's memory); the kernel behind it runs now, so the watched point is not passed.
        wait_until(lambda: behind.beats() > 0, "the kernel behind the ring's consumer")
        time.sleep(0.05)
        assert gpu.pending_releases() == before + 1, "the ring's memory waits for its consumer"
        assert spinner.is_alive()
        behind.stop()  # the stream passes the watched point; nothing faulted on it
        assert consumer.done
    finally:
        if view is not None:
            view.ring.stop()
        elif ring is not None:
            ring.stop()
        behind.signal_stop()
        spinner.stop()
        consumer.synchronize()
    assert gpu.wait_for_releases(10), f"{gpu.pending_releases()} releases still waiting"
    assert pool.stats()["bytes_in_use"] == 0, "the block went back once the stream passed"
    # None waits now; the spinner held its releases for more than the 0.15 s above.
    times = gpu.release_times()
    assert times.waiting == 0 and times.oldest_waiting is None, times
    longest = times.longest_wait
    assert longest is not None and longest.seconds >= 0.1 and longest.what, times
    # The reprs give the same figures in the library's one format: milliseconds and the type.
    shown = f"{longest.seconds * 1e3:.3f} ms ({longest.what})"
    assert repr(longest) == f"<vkgdr.SlowRelease {shown}>", repr(longest)
    assert f" longest_wait={shown}" in repr(times), repr(times)
    assert "oldest_waiting" not in repr(times), repr(times)
