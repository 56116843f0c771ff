"""When a peer's ``AttachedMemory.detach()`` and ``SharedBlock.release()`` give memory back,
without a GPU (Mesa's lavapipe on CI; the owner and its peer in one process): at once when no
NumPy array made from it is alive, whatever else refers to the object, and when the last one is
gone otherwise (the exact rule of python/src/exports.rs, which ``Block.free()`` follows too);
every shape of the call, the end of a ``with`` block, ``Peer.close()``, collection, threads.

What the owner sees is read after a round trip on the peer's connection (an attach the owner
refuses): the owner handles a connection's messages in order, so by then it has handled every
detach and release sent before, and ``ShareServer.peers()`` counts what the peer still holds.
"""

import gc
from typing import Any, Callable, Dict, Tuple

import numpy as np
import pytest

import vkgdr
from conftest import run_in_thread, wait_event

BLOCK = 256


@pytest.fixture()
def device() -> vkgdr.VulkanDevice:
    try:
        return vkgdr.VulkanDevice()
    except vkgdr.VkgdrError as e:
        pytest.fail(
            f"these tests need a Vulkan device with VK_KHR_external_memory_fd and there is none "
            f"({e}): install the Vulkan loader and Mesa's lavapipe (apt-get install libvulkan1 "
            f"mesa-vulkan-drivers; scripts/test does it) or run on an NVIDIA machine"
        )


class Owner:
    """A ``ShareServer`` sharing raw memory ``"m"`` and a pool ``"p"``, and one ``Peer`` of it
    with the pool attached."""

    def __init__(self, device: vkgdr.VulkanDevice, sock: str) -> None:
        self.memory = device.alloc(4096)
        self.pool = device.pool(thread_cache=0)
        self.server = vkgdr.ShareServer(device, sock)
        self.server.share_memory("m", self.memory)
        self.server.share_pool("p", self.pool, 1 << 20)
        self.peer = vkgdr.Peer(sock, timeout=5)
        self.attached_pool = self.peer.attach_pool("p")

    def held(self) -> Tuple[int, int]:
        """``(attachments, blocks)`` the owner counts for the peer, after a round trip."""
        with pytest.raises(vkgdr.ShareError):
            self.peer.attach_memory("no such region")
        [p] = self.server.peers()
        return p["attachments"], p["blocks"]

    def close(self) -> None:
        self.peer.close()
        self.server.close()


@pytest.fixture()
def owner(device, sock) -> Any:
    o = Owner(device, sock)
    yield o
    o.close()


def attach_memory(o: Owner) -> Any:
    return o.peer.attach_memory("m")


def request_block(o: Owner) -> Any:
    return o.attached_pool.request(BLOCK)


#: The two attachments whose memory NumPy arrays can use: how to make one, and how to end it.
KINDS: Dict[str, Tuple[Callable[[Owner], Any], str]] = {
    "memory": (attach_memory, "detach"),
    "block": (request_block, "release"),
}

#: Every shape of the ending call; `end` is the method's name.
SHAPES: Dict[str, Callable[[Any, str], None]] = {
    "method": lambda x, end: getattr(x, end)(),
    "empty keywords": lambda x, end: getattr(x, end)(**{}),
    "bound first": lambda x, end: (lambda f: f())(getattr(x, end)),
    "through the class": lambda x, end: getattr(type(x), end)(x),
    "in a list": lambda x, end: getattr([x, x][1], end)(),
    "with block": lambda x, end: ended_by_with(x),
}


def ended_by_with(x: Any) -> None:
    with x as same:
        assert same is x


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_without_a_live_array_the_end_is_at_once(owner, kind, shape) -> None:
    make, end = KINDS[kind]
    before = owner.held()
    x = make(owner)
    np.asarray(x)[:] = 1  # exported, but the array is gone
    x.view(np.uint32)[0] = 2
    interface = x.__array_interface__
    del interface  # so is the interface's own array
    others = [x, x]  # references that are not views keep nothing
    assert owner.held() != before
    SHAPES[shape](x, end)
    assert owner.held() == before, "given back at once"
    SHAPES[shape](x, end)  # twice: nothing more
    assert owner.held() == before
    del others


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_live_array_keeps_the_memory_until_it_is_gone(owner, kind, shape) -> None:
    make, end = KINDS[kind]
    before = owner.held()
    x = make(owner)
    view = x.view(np.uint32)
    SHAPES[shape](x, end)
    with pytest.raises(vkgdr.VkgdrError, match="detached|released"):
        x.write(b"x")
    with pytest.raises(vkgdr.VkgdrError, match="detached|released"):
        np.asarray(x)  # no new export once it ended
    kept = owner.held()
    assert kept != before, "kept for the array"
    view[:] = 0x01020304  # still mapped
    del x
    gc.collect()
    assert owner.held() == kept, "the array holds the memory, not the object"
    assert int(view[3]) == 0x01020304
    del view
    assert owner.held() == before, "the last array gone: given back"


@pytest.mark.parametrize("kind", KINDS)
def test_every_numpy_export_path_is_counted(owner, kind) -> None:
    """``np.asarray``, ``view()``, a slice, a ``memoryview``, the interface's ``data``: each keeps
    the memory alone, and the last of them to go gives it back."""
    make, end = KINDS[kind]
    before = owner.held()
    exporters: Dict[str, Callable[[Any], Any]] = {
        "asarray": np.asarray,
        "typed view": lambda x: x.view(np.uint16, (4, 8)),
        "slice": lambda x: np.asarray(x)[16:32],
        "memoryview": lambda x: memoryview(np.asarray(x))[8:24],
        "interface data": lambda x: x.__array_interface__["data"],
        "view of a view": lambda x: np.asarray(x).view(np.uint32).reshape(-1, 4)[1:],
    }
    for name, export in exporters.items():
        x = make(owner)
        kept = export(x)
        getattr(x, end)()
        assert owner.held() != before, f"{name}: kept"
        assert len(kept) > 0
        del kept
        assert owner.held() == before, f"{name}: given back when its export went"
        del x


def test_the_owner_gets_what_a_view_wrote_after_release(owner) -> None:
    b = owner.attached_pool.request(BLOCK)
    token = b.token
    view = np.asarray(b)
    b.release()
    view[:] = 0x5A
    owner.held()  # the release, had it been sent, is handled by now
    assert owner.server.take_returned(token) is None, "not given back while the view lives"
    del view
    returned = wait_event(owner.server, "released", timeout=5, token=token)
    assert owner.server.take_returned(returned.token).read() == b"\x5a" * BLOCK


def test_closing_the_peer_ends_what_it_attached_by_the_same_rule(owner) -> None:
    before = owner.held()
    viewed = attach_memory(owner)
    plain = attach_memory(owner)
    np.asarray(plain)[:] = 3  # an export, gone
    view = np.asarray(viewed)
    block_view = np.asarray(request_block(owner))  # the object is gone at once: only the view
    blocks_before = before[1]
    assert owner.held()[1] == blocks_before + 1
    owner.peer.close()
    assert viewed.is_detached and plain.is_detached
    view[:] = 4  # still mapped for the views
    block_view[:] = 5
    while True:  # the connection lasts while the views hold what it attached
        e = owner.server.next_event(timeout=0.3)
        if e is None:
            break
        assert e.kind != "gone", "the peer's connection closed under its views"
    [p] = owner.server.peers()
    # The viewed memory, the viewed block, and the pool, whose attachment lasts while a block of
    # it is held; not the memory without a view.
    assert (p["attachments"], p["blocks"]) == (2, 1)
    del view, block_view
    gc.collect()
    wait_event(owner.server, "gone", timeout=5)
    assert owner.memory.read(0, 1) == b"\x04"


def test_an_attachment_collected_with_a_live_array_waits_for_it(owner) -> None:
    before = owner.held()
    view = attach_memory(owner).view(np.uint8)  # the object is collected at once
    gc.collect()
    assert owner.held() != before, "the array holds the mapping"
    view[:] = 6
    del view
    assert owner.held() == before, "detached with the last array"
    assert owner.memory.read(0, 2) == b"\x06\x06"


def test_an_end_on_another_thread_sees_the_arrays_of_this_one(owner) -> None:
    before = owner.held()
    box = [attach_memory(owner), request_block(owner)]
    views = [np.asarray(x) for x in box]
    run_in_thread(lambda: [box.pop().release(), box.pop().detach()])
    assert owner.held() != before
    for v in views:
        v[:] = 7
    del views, v
    assert owner.held() == before
