"""Sharing with other processes, without a GPU (Mesa's lavapipe on CI): an owner with a
``vkgdr.VulkanDevice`` shares raw memory, pool blocks and the lanes of a ``CheckingRing`` over
a Unix socket; real child processes (``subprocess``, and ``multiprocessing`` with the spawn and
fork start methods; share_children.py) attach them with no CUDA, write, give back, are
revoked, are killed in the middle of a stream. Then the calls no program should make: none may
crash the interpreter. test_gpu_share.py does the same with a GPU owner and kernels.
"""

import copy
import gc
import multiprocessing
import os
import pickle
import signal
import stat
import time
from typing import Any

import numpy as np
import pytest

import share_children
import vkgdr
from conftest import NO_CUDA, finish, read_line, run_process, spawn_peer, wait_event
from ring_records import RESULT_CHECKSUM_SUM, RESULT_ERRORS, RESULT_NEXT_SEQ, RESULT_RECORDS
from share_children import pattern


def vulkan_device(**options: Any) -> vkgdr.VulkanDevice:
    try:
        return vkgdr.VulkanDevice(**options)
    except vkgdr.VkgdrError as e:
        pytest.fail(
            f"these tests need a Vulkan device with VK_KHR_external_memory_fd and there is none "
            f"({e}): install the Vulkan loader and Mesa's lavapipe (apt-get install libvulkan1 "
            f"mesa-vulkan-drivers; scripts/test does it) or run on an NVIDIA machine"
        )


@pytest.fixture()
def device() -> vkgdr.VulkanDevice:
    return vulkan_device()


@pytest.fixture()
def server(device, sock) -> Any:
    with vkgdr.ShareServer(device, sock) as s:
        yield s


# --- Raw memory ---------------------------------------------------------------------------------


@pytest.mark.parametrize("non_coherent", [False, True], ids=["coherent", "non-coherent"])
def test_a_peer_process_without_cuda_writes_memory_the_owner_reads(sock, non_coherent) -> None:
    device = vulkan_device(force_non_coherent=non_coherent)
    with vkgdr.ShareServer(device, sock) as server:
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600, "the socket file's mode"
        mem = device.alloc(64 << 10)
        assert len(mem) == 64 << 10 and mem.is_coherent == (not non_coherent)
        mem.write(pattern(64 << 10, 1))
        server.share_memory("m", mem)
        child = spawn_peer("memory", sock, 2, 1)
        connected = wait_event(server, "connected")
        assert connected.pid == child.pid and connected.uid == os.geteuid()
        wait_event(server, "attached", peer=connected.peer, region="m")
        assert [p["pid"] for p in server.peers()] == [child.pid]
        finish(child)
        gone = wait_event(server, "gone", peer=connected.peer)
        assert gone.pid == child.pid
        mem.invalidate()
        assert mem.read() == pattern(64 << 10, 2), "the peer's bytes, read by the owner"
        assert np.asarray(mem).view("<u4")[0] == np.frombuffer(pattern(4, 2), "<u4")[0]
        assert server.peers() == []
        stats = server.stats()
        assert (stats["connected"], stats["gone"], stats["peers"]) == (1, 1, 0), stats
    assert not os.path.exists(sock), "close() removes the socket file"


@pytest.mark.parametrize("method", ["spawn", "fork"])
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")
def test_multiprocessing_children_attach_anew(device, server, sock, method, monkeypatch) -> None:
    mem = device.alloc(8192)
    mem.write(pattern(8192, 1))
    server.share_memory("m", mem)
    if method == "spawn":
        # A spawned child starts afresh: it must not even find a CUDA library.
        for k, v in NO_CUDA.items():
            monkeypatch.setenv(k, v)
    if method == "spawn":
        run_process(method, share_children.memory_writer, sock, "2", "1", "no")
        assert mem.read() == pattern(8192, 2)
        wait_event(server, "gone")
    else:
        # A forked child is refused the driver its parent opened, and the parent keeps it.
        run_process(method, share_children.fork_refused, sock)
        assert mem.read() == pattern(8192, 1)
        assert vkgdr.VulkanDevice().alloc(4096) is not None


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")
def test_a_forked_child_cannot_use_the_parents_objects(device, server, sock) -> None:
    """Mappings are not inherited (MADV_DONTFORK), nor threads, and a connection is the
    parent's: every object of the parent raises in a forked child, and its collection there
    leaks instead of detaching the parent's attachment or removing the parent's socket."""
    mem = device.alloc(8192)
    mem.write(pattern(8192, 1))
    server.share_memory("m", mem)
    peer = vkgdr.Peer(sock)
    mine = peer.attach_memory("m")
    objects = [server, mine, peer, mem, device]
    run_process("fork", share_children.inherited, sock, objects)
    # The parent's own are untouched: its attachment works, its server serves.
    assert mine.read(0, 8) == pattern(8, 1), "the forked child wrote nothing"
    mine.write(b"\xff" * 4)
    assert mem.read(0, 4) == b"\xff" * 4
    assert os.path.exists(sock)
    assert len(server.peers()) == 1, "the parent's peer is still connected"
    peer.close()
    wait_event(server, "gone")


# --- Pool blocks --------------------------------------------------------------------------------


def test_a_peer_fills_blocks_it_asked_for_and_answers_one_sent(device, server, sock) -> None:
    pool = device.pool(chunk_size=1 << 20, thread_cache=0)
    server.share_pool("frames", pool, 1 << 20)
    child = spawn_peer("pool", sock)
    peer = wait_event(server, "attached", region="frames").peer
    tokens = [wait_event(server, "released", peer=peer).token for _ in range(3)]
    for k, (token, size) in enumerate(zip(tokens, [100, 4096, 70_000])):
        b = server.take_returned(token)
        assert isinstance(b, vkgdr.Block) and len(b) == size
        n = size & ~3
        assert b.read(0, n) == pattern(n, 10 + k), f"block {k} as the peer wrote it"
        assert server.take_returned(token) is None, "taken once"
    refused = wait_event(server, "request_refused", peer=peer)
    assert "quota" in refused.why
    read_line(child, "REQUESTED")

    # A block sent unasked: the Block object is spent; the peer's answer comes back.
    b = pool.alloc(512)
    b.write(pattern(512, 77))
    token = server.send_block(peer, "frames", b)
    assert b.is_sent and b.is_freed and repr(b) == "<vkgdr.Block 512 bytes, sent>"
    for use in (lambda: b.write(b"x"), b.read, lambda: b.host_ptr, lambda: np.asarray(b)):
        with pytest.raises(vkgdr.VkgdrError, match="sent to another process"):
            use()
    b.free()  # the object is spent: nothing to free
    with pytest.raises(vkgdr.VkgdrError, match="sent to another process"):
        server.send_block(peer, "frames", b)
    wait_event(server, "released", peer=peer, token=token)
    back = server.take_returned(token)
    assert back.read(0, 512) == pattern(512, 78), "the peer's answer in the owner's block"
    finish(child)
    wait_event(server, "gone", peer=peer)
    del back
    assert pool.stats()["bytes_in_use"] == 0, "every block went back to the pool"


def test_blocks_whose_memory_was_exported_are_not_sent(device, server, sock) -> None:
    pool = device.pool(thread_cache=0)
    server.share_pool("p", pool, 1 << 20)
    peer = vkgdr.Peer(sock)
    attached = peer.attach_pool("p")
    who = wait_event(server, "attached", region="p").peer
    for export in (np.asarray, lambda b: b.view(np.float32), lambda b: b.__dlpack__()):
        b = pool.alloc(256)
        export(b)
        with pytest.raises(vkgdr.InvalidArgumentError, match="its memory was exported"):
            server.send_block(who, "p", b)
        assert not b.is_sent and not b.is_freed, "a refused send changes nothing"
        b.write(b"still mine")
        b.free()
    b = pool.alloc(256)
    with pytest.raises(vkgdr.ShareError, match="no peer 12345"):
        server.send_block(12345, "p", b)
    assert not b.is_sent, "a send to no peer changes nothing"
    with pytest.raises(TypeError, match="takes a vkgdr.Block"):
        server.send_block(who, "p", bytearray(8))
    with pytest.raises(vkgdr.ShareError, match='has not attached a pool "nope"'):
        server.send_block(who, "nope", b)
    assert b.is_sent, "the library took it: it went back to its pool"
    b = pool.alloc(256)
    b.write(b"abc")
    token = server.send_block(who, "p", b)
    got = attached.next_block(timeout=10)
    assert got.token == token and got.read(0, 3) == b"abc"
    attached.detach()  # the attachment lasts while the block is held
    got.write(b"xyz")
    got.release()
    wait_event(server, "released", token=token)
    assert server.take_returned(token).read(0, 3) == b"xyz"
    wait_event(server, "detached", peer=who)
    peer.close()


# --- Ring lanes, consumed by a CPU thread of the owner -------------------------------------------


def test_lanes_fed_by_producer_processes_reach_the_consumer_checked(device, server, sock) -> None:
    ring = device.checking_ring(64 << 10, lanes=3)
    assert (ring.lanes, ring.capacity) == (3, 64 << 10)
    server.share_ring("in", ring)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    # The producers keep their lanes until the fourth one has been refused: one done early would
    # otherwise give its lane back first.
    hold = ctx.Event()
    os.environ.update(NO_CUDA)
    try:
        producers = [
            ctx.Process(
                target=share_children.lane_producer, args=(sock, "1500", str(t), out, hold)
            )
            for t in range(3)
        ]
        for p in producers:
            p.start()
    finally:
        for k in NO_CUDA:
            del os.environ[k]
    for _ in range(3):
        wait_event(server, "attached", timeout=60, region="in")
    # Every lane is lent: a fourth producer is refused by name.
    with vkgdr.Peer(sock) as extra:
        with pytest.raises(vkgdr.ShareError, match="busy") as e:
            extra.attach_lane("in")
        assert e.value.reason == "busy"
    hold.set()
    done = [out.get(timeout=120) for _ in producers]
    for p in producers:
        p.join(60)
        assert p.exitcode == 0
    ring.stop()
    assert sorted(d["lane"] for d in done) == [0, 1, 2]
    for d in done:
        res = ring.results_of(d["lane"])
        assert res[RESULT_ERRORS] == 0, (d, res)
        assert res[RESULT_RECORDS] == d["records"] == 1500
        assert res[RESULT_NEXT_SEQ] == 1500
        assert res[RESULT_CHECKSUM_SUM] == d["sum"]
        assert ring.head_of(d["lane"]) == ring.published_of(d["lane"])


def test_a_producer_killed_mid_stream_is_gone_and_its_lane_goes_on(device, server, sock) -> None:
    ring = device.checking_ring(64 << 10, lanes=1)
    server.share_ring("in", ring)
    victim = spawn_peer("stream", sock)
    assert read_line(victim, "STREAMING").split() == ["STREAMING", "0"]
    peer = wait_event(server, "attached", region="in").peer
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert wait_event(server, "gone", peer=peer).pid == victim.pid
    # The lane is back at the victim's last accepted record; an heir numbers on from there.
    t = time.monotonic()
    while ring.is_lent(0):
        assert time.monotonic() - t < 10, "the lane did not come back"
        time.sleep(0.01)
    heir = spawn_peer("produce", sock, 300)
    words = read_line(heir, "PUSHED").split()
    finish(heir)
    lane, start, records = int(words[1]), int(words[2]), int(words[3])
    assert (lane, records) == (0, 300) and start >= 200, words
    ring.stop()
    res = ring.results_of(0)
    assert res[RESULT_ERRORS] == 0, res
    assert res[RESULT_RECORDS] == res[RESULT_NEXT_SEQ] == start + 300, res


# --- Revocation ---------------------------------------------------------------------------------


def test_revocation_reaches_the_peer_and_refuses_its_writes(device, server, sock) -> None:
    pool = device.pool(thread_cache=0)
    mem = device.alloc(4096)
    mem.write(bytes(64))
    server.share_memory("m", mem)
    server.share_pool("p", pool, 1 << 20)
    child = spawn_peer("revoked", sock)
    peer = wait_event(server, "attached", region="p").peer
    b = pool.alloc(64)
    b.write(bytes(64))
    token = server.send_block(peer, "p", b)
    read_line(child, "WROTE")
    server.revoke_block(peer, token)
    server.revoke(peer)
    read_line(child, "REFUSED")
    finish(child)
    assert mem.read(0, 64) == b"\x01" * 64, "the write before the revocation, and none after"
    wait_event(server, "gone", peer=peer)
    assert server.take_returned(token) is None, "a revoked block goes back to its pool"
    assert pool.stats()["bytes_in_use"] == 0
    with pytest.raises(vkgdr.ShareError, match="no peer"):
        server.revoke(peer)


# --- In one process: views, detaching, events ----------------------------------------------------


def test_detaching_waits_for_the_views_of_the_memory(device, server, sock) -> None:
    mem = device.alloc(4096)
    server.share_memory("m", mem)
    with vkgdr.attach(sock) as peer:
        assert peer.owner == (os.getpid(), os.geteuid(), os.getegid())
        m = peer.attach_memory("m")
        assert (m.name, m.size, len(m), m.is_detached) == ("m", 4096, 4096, False)
        view = m.view(np.uint32)
        view[:] = 7
        m.detach()  # a view is alive: the mapping stays for it
        assert m.is_detached
        with pytest.raises(vkgdr.VkgdrError, match="AttachedMemory is detached"):
            m.write(b"x")
        view[1] = 8  # still mapped
        assert server.next_event(timeout=0.2).kind == "connected"
        assert server.next_event(timeout=0.2).kind == "attached"
        assert server.next_event(timeout=0.2) is None, "not detached while the view lives"
        del view, m
        gc.collect()
        wait_event(server, "detached", timeout=5)
        assert mem.view(np.uint32)[:2].tolist() == [7, 8]
        # Without a view, detaching is at once (the views made before are gone); twice changes
        # nothing.
        m = peer.attach_memory("m")
        np.asarray(m)[0] = 9
        m.detach()
        wait_event(server, "detached", timeout=5)
        m.detach()
        assert mem.read(0, 1) == b"\x09"
        # So is releasing a shared block.
        pool = device.pool(thread_cache=0)
        server.share_pool("p", pool, 1 << 20)
        b = peer.attach_pool("p").request(64)
        b.view(np.uint8)[:] = 5
        b.release()
        token = wait_event(server, "released", timeout=5).token
        assert server.take_returned(token).read() == b"\x05" * 64
    wait_event(server, "gone", timeout=5)


def test_closing_the_peer_detaches_what_it_attached(device, server, sock) -> None:
    server.share_memory("m", device.alloc(4096))
    pool = device.pool(thread_cache=0)
    server.share_pool("p", pool, 1 << 16)
    ring = device.checking_ring(4096)
    server.share_ring("r", ring)
    peer = vkgdr.Peer(sock, timeout=5)
    m, p, lane = peer.attach_memory("m"), peer.attach_pool("p"), peer.attach_lane("r")
    b = p.request(100)
    token = b.token
    view = np.asarray(b)
    peer.close()
    peer.close()  # twice: nothing more
    assert peer.closed and m.is_detached and p.is_detached and lane.is_detached
    assert b.is_released, "released, the memory kept for its view"
    for use in (
        lambda: m.write(b"x"),
        lambda: m.read(),
        lambda: p.request(10),
        lambda: lane.push(b"x" * 16),
        lambda: b.read(),
        lambda: peer.attach_memory("m"),
        lambda: peer.poll(),
    ):
        with pytest.raises(vkgdr.VkgdrError, match="closed|detached|released"):
            use()
    view[:] = 1  # still mapped for the view
    del view, b
    gc.collect()
    wait_event(server, "gone", timeout=5)
    # Given back once the view went, with what the view wrote.
    [(_, returned, block)] = server.drain_returned()
    assert returned == token and block.read() == b"\x01" * 100
    del block
    assert pool.stats()["bytes_in_use"] == 0
    ring.stop()


def test_lane_pushes_and_their_errors(device, server, sock) -> None:
    ring = device.checking_ring(4096, lanes=1)
    server.share_ring("r", ring)
    with vkgdr.attach(sock) as peer:
        lane = peer.attach_lane("r")
        assert (lane.lane, lane.capacity, lane.start, lane.next_seq) == (0, 4096, (0, 0), 0)
        assert lane.max_record > 0 and not lane.is_stopped and lane.stop_reason is None
        with pytest.raises(vkgdr.InvalidArgumentError):
            lane.push(b"")
        with pytest.raises(vkgdr.InvalidArgumentError):
            lane.push(b"x" * (lane.max_record + 1))
        with pytest.raises(vkgdr.InvalidArgumentError, match="timeout -1"):
            lane.push(b"x" * 16, timeout=-1)
        ring.stop()  # the consumer is gone: the lane stops, and pushes say why
        t = time.monotonic()
        while not lane.is_stopped:
            assert time.monotonic() - t < 5
            time.sleep(0.01)
        assert "consumer is gone" in lane.stop_reason
        with pytest.raises((vkgdr.ShareError, vkgdr.RingFullError)):
            for k in range(1000):  # fills what is left, then stops
                lane.push(b"y" * 100, timeout=1)


def test_threads_using_attachments_while_the_peer_closes(device, server, sock) -> None:
    """Pushes, writes and reads from several threads, and the Peer closed under them: each call
    either works or raises, and nothing waits for ever."""
    import threading

    ring = device.checking_ring(64 << 10, lanes=1)
    server.share_ring("r", ring)
    server.share_memory("m", device.alloc(1 << 20))
    peer = vkgdr.Peer(sock)
    lane, m = peer.attach_lane("r"), peer.attach_memory("m")
    outcomes: "list[str]" = []
    started = threading.Barrier(5)

    # Each thread goes on until the close stops it (a fixed count can end before the close on a
    # fast machine); one the close never stops ends at the deadline with no error, which fails.
    deadline = time.monotonic() + 30

    def pushes(batch: bool) -> None:
        started.wait()
        try:
            while time.monotonic() < deadline:
                if batch:
                    lane.push_batch([b"b" * 40] * 8, timeout=10)
                else:
                    lane.push(b"p" * 200, timeout=10)
        except vkgdr.VkgdrError as e:
            outcomes.append(type(e).__name__)

    def copies(size: int) -> None:
        started.wait()
        try:
            while time.monotonic() < deadline:
                m.write(b"w" * size)
                m.read(0, size)
        except vkgdr.VkgdrError as e:
            outcomes.append(type(e).__name__)

    threads = [
        threading.Thread(target=pushes, args=(False,)),
        threading.Thread(target=pushes, args=(True,)),
        threading.Thread(target=copies, args=(100,)),
        threading.Thread(target=copies, args=(256 << 10,)),  # copies without the GIL
    ]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.3)
    peer.close()
    for t in threads:
        t.join(40)
        assert not t.is_alive(), "a call waited for ever"
    assert len(outcomes) == 4 and set(outcomes) == {"VkgdrError"}, outcomes
    wait_event(server, "gone", timeout=10)
    ring.stop()
    assert ring.results_of(0)[RESULT_ERRORS] > 0, "the junk records were checked (and refused)"


def test_events_peers_and_stats(device, server, sock) -> None:
    server.share_memory("m", device.alloc(4096))
    assert server.stats() == {
        "connected": 0, "refused": 0, "gone": 0, "misbehaved": 0, "lane_faults": 0, "peers": 0,
    }
    peer = vkgdr.Peer(sock)
    m = peer.attach_memory("m")
    e = wait_event(server, "connected")
    assert (e.pid, e.uid, e.region, e.token) == (os.getpid(), os.geteuid(), None, None)
    assert repr(e) == f"<vkgdr.ShareEvent connected peer={e.peer} pid={e.pid} uid={e.uid}>"
    a = wait_event(server, "attached")
    assert (a.peer, a.region) == (e.peer, "m") and a.attachment >= 1
    [info] = server.peers()
    assert info == {
        "peer": e.peer, "pid": os.getpid(), "uid": os.geteuid(), "gid": os.getegid(),
        "attachments": 1, "blocks": 0, "block_bytes": 0,
    }
    with pytest.raises(vkgdr.ShareError, match="no_such_region|nothing is shared") as err:
        peer.attach_memory("nope")
    assert err.value.reason == "no_such_region"
    assert "nope" in str(err.value)
    assert wait_event(server, "request_refused").why.startswith("no such region")
    del m
    gc.collect()
    wait_event(server, "detached", peer=e.peer, attachment=a.attachment)
    peer.close()
    wait_event(server, "gone", peer=e.peer)
    assert server.next_event(timeout=0) is None
    assert server.stats()["gone"] == 1


def test_the_peer_policy_and_the_socket_mode(device, sock) -> None:
    me = os.geteuid()
    with vkgdr.ShareServer(device, sock, peers=[me + 1], socket_mode=0o660) as server:
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o660
        server.share_memory("m", device.alloc(4096))
        peer = vkgdr.Peer(sock, timeout=5)
        with pytest.raises(vkgdr.ShareError) as e:
            peer.attach_memory("m")
        assert e.value.reason in ("not_allowed", "disconnected"), e.value
        refused = wait_event(server, "refused")
        assert (refused.pid, refused.uid) == (os.getpid(), me) and str(me + 1) in refused.why
        assert server.stats()["refused"] == 1
    for peers in ("anyone", "", [-1], [me, "root"]):
        with pytest.raises(vkgdr.InvalidArgumentError, match="peers"):
            vkgdr.ShareServer(device, sock, peers=peers)
    with pytest.raises(TypeError, match="peers takes"):
        vkgdr.ShareServer(device, sock, peers=3.5)
    with pytest.raises(vkgdr.InvalidArgumentError, match="socket_mode"):
        vkgdr.ShareServer(device, sock, socket_mode=0o4777)
    vkgdr.ShareServer(device, sock, peers="any").close()


# --- Hostile calls ------------------------------------------------------------------------------


def test_bad_names_and_kinds_are_refused_by_name(device, server, sock) -> None:
    mem = device.alloc(4096)
    for name in ("", "a\0b", "x" * 300):
        with pytest.raises(vkgdr.InvalidArgumentError, match="bad region name"):
            server.share_memory(name, mem)
    server.share_memory("m", mem)
    with pytest.raises(vkgdr.ShareError, match='already shared') as e:
        server.share_memory("m", mem)
    assert e.value.reason == "name_taken"
    with pytest.raises(TypeError, match="takes a vkgdr.RawMemory or a vkgdr.VulkanMemory"):
        server.share_memory("b", b"bytes")
    with pytest.raises(TypeError, match="takes a vkgdr.DeviceRing or a vkgdr.CheckingRing"):
        server.share_ring("r", mem)
    with pytest.raises(TypeError):
        server.share_pool("p", mem, 10)
    other = vulkan_device(force_non_coherent=True)
    with pytest.raises(vkgdr.InvalidArgumentError, match="non-coherent"):
        server.share_memory("nc", other.alloc(4096))
    with pytest.raises(vkgdr.InvalidArgumentError, match="non-coherent"):
        server.share_pool("nc", other.pool(), 1 << 20)
    with pytest.raises(TypeError, match="vkgdr.Vkgdr or a vkgdr.VulkanDevice, not object"):
        vkgdr.ShareServer(object(), sock + "x")
    with pytest.raises(vkgdr.VkgdrError, match="bind failed \\(EADDRINUSE\\)"):
        vkgdr.ShareServer(device, sock)  # a live server listens there
    assert os.path.exists(sock), "and it still does"
    assert server.unshare("m") and not server.unshare("m")
    server.share_memory("m", mem)
    server.share_pool("p", device.pool(), 4096)
    with vkgdr.Peer(sock, timeout=5) as peer:
        wrong = [("p", peer.attach_memory), ("m", peer.attach_pool), ("m", peer.attach_lane)]
        for name, attach in wrong:
            with pytest.raises(vkgdr.ShareError, match=f"{name!r}|\"{name}\" is not"):
                attach(name)
        for name in ("", "a\0b"):
            with pytest.raises(vkgdr.VkgdrError):
                peer.attach_memory(name)
    with pytest.raises(vkgdr.ShareError, match="cannot connect") as e:
        vkgdr.Peer(sock + ".none")
    assert e.value.call == "connect" and e.value.result_name == "ENOENT"
    with pytest.raises(vkgdr.InvalidArgumentError, match="timeout"):
        vkgdr.Peer(sock, timeout=0)


def test_use_after_close_and_objects_outliving_the_server(device, sock) -> None:
    server = vkgdr.ShareServer(device, sock)
    mem = device.alloc(4096)
    server.share_memory("m", mem)
    pool = device.pool(thread_cache=0)
    server.share_pool("p", pool, 1 << 20)
    ring = device.checking_ring(4096)
    server.share_ring("r", ring)
    peer = vkgdr.Peer(sock, timeout=2)
    m, p, lane = peer.attach_memory("m"), peer.attach_pool("p"), peer.attach_lane("r")
    b = p.request(64)
    lane.push(b"z" * 16)
    server.close()
    server.close()  # twice: nothing more
    assert server.closed and not os.path.exists(sock) and "closed" in repr(server)
    for use in (
        server.stats,
        server.peers,
        lambda: server.next_event(timeout=0),
        lambda: server.share_memory("x", mem),
        lambda: server.take_returned(1),
        lambda: server.revoke(1),
        lambda: server.send_block(1, "p", pool.alloc(8)),
    ):
        with pytest.raises(vkgdr.VkgdrError, match="the ShareServer is closed"):
            use()
    # What the peer mapped stays mapped: its memory is its own until it lets go.
    m.write(b"after")
    assert m.read(0, 5) == b"after" and mem.read(0, 5) == b"after"
    b.write(b"block")
    with pytest.raises(vkgdr.ShareError) as e:
        p.request(64)
    assert e.value.reason == "disconnected"
    with pytest.raises((vkgdr.ShareError, vkgdr.RingFullError)):
        for _ in range(1000):
            lane.push(b"z" * 100, timeout=0.2)
    with pytest.raises(vkgdr.ShareError, match="hung up"):
        peer.poll()
    b.release()
    b.release()
    m.detach()
    lane.detach()
    p.detach()
    peer.close()
    ring.stop()
    ring.stop()
    del m, p, lane, b, peer
    gc.collect()
    assert pool.stats()["bytes_in_use"] == 0


def test_timeouts_and_waits(device, server, sock) -> None:
    pool = device.pool()
    server.share_pool("p", pool, 1 << 20)
    with pytest.raises(vkgdr.InvalidArgumentError, match="timeout -1"):
        server.next_event(timeout=-1)
    t = time.monotonic()
    assert server.next_event(timeout=0.1) is None
    assert 0.05 < time.monotonic() - t < 5
    with vkgdr.attach(sock) as peer:
        p = peer.attach_pool("p")
        t = time.monotonic()
        assert p.next_block(timeout=0.1) is None
        assert time.monotonic() - t < 5
        with pytest.raises(vkgdr.InvalidArgumentError, match="timeout NaN"):
            p.next_block(timeout=float("nan"))
        # Refused here: the owner would take the request for a broken peer's.
        with pytest.raises(vkgdr.InvalidArgumentError, match="alignment"):
            p.request(64, 3)
        with pytest.raises(vkgdr.InvalidArgumentError, match="size is zero"):
            p.request(0)
        assert p.request(64).size == 64, "still connected"


def test_new_objects_refuse_copies_and_pickles(device, server, sock) -> None:
    from test_vulkan_hostile import assert_uncopyable

    mem = device.alloc(4096)
    server.share_memory("m", mem)
    pool = device.pool()
    server.share_pool("p", pool, 1 << 20)
    ring = device.checking_ring(4096)
    server.share_ring("r", ring)
    with vkgdr.attach(sock) as peer:
        p = peer.attach_pool("p")
        objects = [
            (server, "vkgdr.ShareServer"),
            (server.next_event(timeout=5), "vkgdr.ShareEvent"),
            (peer, "vkgdr.Peer"),
            (peer.attach_memory("m"), "vkgdr.AttachedMemory"),
            (p, "vkgdr.AttachedPool"),
            (p.request(64), "vkgdr.SharedBlock"),
            (peer.attach_lane("r"), "vkgdr.AttachedLane"),
            (device, "vkgdr.VulkanDevice"),
            (mem, "vkgdr.VulkanMemory"),
            (ring, "vkgdr.CheckingRing"),
        ]
        for obj, name in objects:
            assert_uncopyable(obj, name)
    e = vkgdr.ShareError("x")
    assert e.reason is None and isinstance(e, vkgdr.VkgdrError)
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is vkgdr.ShareError and copy.copy(e).args == ("x",)
    ring.stop()
