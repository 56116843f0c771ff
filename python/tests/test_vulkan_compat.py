"""vkgdr 0.1's ``RawMemory`` and ``vkgdr.pycuda.Memory`` without a GPU: the Python classes over
stand-in memory, blocks of a Vulkan-only pool (Mesa's lavapipe on CI) that the extension's
``_RawMemory._over_pool`` puts where a raw allocation would be. What runs is the real
``RawMemory`` (Python half and extension) and the real ``free()`` rule; only the allocation and
the release are the pool's, and each release is recorded with how it was asked for: ``"default"``
(the legacy stream's fence), ``"now"``, or the ``after=`` stream's handle (given as
``vkgdr.RawStream``: the stand-in never uses it).

Covered: classes derived from ``RawMemory`` whose ``__init__`` takes other arguments, as vkgdr
0.1's plain Python class allows; ``free()`` with and without views, in every call shape the
reference counting must see through; ``vkgdr.pycuda.Memory`` being a ``RawMemory`` on a stand-in
PyCUDA, freed with its context pushed. The same on a GPU with real memory, CuPy and PyCUDA:
test_gpu_compat.py."""

import gc
from typing import Any, List

import numpy as np
import pytest

import vkgdr
from conftest import FakeContext, import_pycuda_shim, run_in_thread, run_workers, vulkan_pool
from vkgdr import _vkgdr

#: What the stand-in allocation ignores: there is no device to open without a GPU.
OWNER = object()


class StandIn:
    """Makes ``vkgdr.RawMemory`` allocate blocks of a Vulkan-only pool and records releases."""

    def __init__(self, pool: vkgdr.Pool) -> None:
        self.pool = pool
        self.releases: List[Any] = []
        self.context_depth = lambda: 0  # what each release also records (a pushed context)

    def allocate(self, owner: Any, size: int, flags: int = 0) -> Any:
        return _vkgdr._RawMemory._over_pool(self.pool, size, self.released)

    def released(self, how: Any) -> None:
        self.releases.append((how, self.context_depth()) if self.context_depth() else how)

    def in_use(self) -> int:
        return self.pool.stats()["bytes_in_use"]


@pytest.fixture()
def stand_in(monkeypatch) -> StandIn:
    s = StandIn(vulkan_pool(chunk_size=1 << 20, thread_cache=0))
    monkeypatch.setattr(vkgdr, "_RawMemory", s.allocate)
    return s


def write(mem: Any, value: int) -> None:
    """vkgdr 0.1 users' way: a NumPy view of the ``|V1`` interface as bytes (then gone)."""
    np.asarray(mem).view(np.uint8)[:] = value


# --- Classes derived from RawMemory ------------------------------------------------------------


class Labelled(vkgdr.RawMemory):
    """A derived class whose ``__init__`` takes other arguments (vkgdr 0.1's class allows it)."""

    def __init__(self, owner: Any, n: int, label: str) -> None:
        self.label = label
        super().__init__(owner, n)


class Explicit(vkgdr.RawMemory):
    """vkgdr 0.1's own style (its pycuda.Memory): the base's ``__init__`` called by name."""

    def __init__(self, label: str, owner: Any, size: int, flags: int = 0) -> None:
        vkgdr.RawMemory.__init__(self, owner, size, flags)
        self.label = label


class WithFree(vkgdr.RawMemory):
    """A derived class whose ``free()`` does more and calls the base's."""

    def __init__(self, owner: Any, n: int) -> None:
        super().__init__(owner, n)
        self.closed = False

    def free(self, *, after: Any = None, now: bool = False) -> None:  # type: ignore[override]
        self.closed = True
        super().free(after=after, now=now)


class Forgetful(vkgdr.RawMemory):
    """A derived class whose ``__init__`` never calls the base's."""

    def __init__(self, label: str) -> None:
        self.label = label


def test_a_derived_class_with_its_own_init_is_a_raw_memory(stand_in) -> None:
    for make in (lambda: Labelled(OWNER, 4097, "gains"), lambda: Explicit("delays", OWNER, 4097)):
        mem = make()
        assert isinstance(mem, vkgdr.RawMemory)
        assert mem.label in ("gains", "delays")
        assert len(mem) == 4097 and mem.is_coherent and mem.non_coherent_atom_size == 1
        array = np.asarray(mem)
        assert array.dtype == np.dtype("V1") and array.shape == (4097,)
        write(mem, 7)
        mem.flush(0, 4097)
        mem.invalidate(0, 4097)
        assert int(np.asarray(mem).view(np.uint8).sum()) == 7 * 4097
        assert repr(mem).startswith(f"<{__name__}.{type(mem).__qualname__} 4097 bytes at")
        del array
        mem.free()
        assert mem.is_freed and repr(mem).endswith("freed>")
        with pytest.raises(vkgdr.VkgdrError, match="the memory has been freed"):
            mem.host_ptr
    assert stand_in.releases == ["default", "default"] and stand_in.in_use() == 0


def test_a_view_keeps_the_memory_of_a_derived_class(stand_in) -> None:
    mem = Labelled(OWNER, 256, "phases")
    view = np.asarray(mem).view(np.uint8)
    mem.free(after=vkgdr.RawStream(0x3000))
    assert mem.is_freed and "views" in repr(mem)
    assert stand_in.releases == [] and stand_in.in_use() == 256
    view[:] = 5  # still the allocation's memory
    del mem
    gc.collect()
    assert stand_in.releases == [], "the view holds the object"
    assert view.base.base.label == "phases"  # what holds it: the derived object itself
    del view
    gc.collect()
    assert stand_in.releases == [0x3000] and stand_in.in_use() == 0


def test_a_derived_free_that_calls_the_base_is_counted_from_inside_it(stand_in) -> None:
    """The caller of the base's ``free()`` is the derived method: exported memory waits for the
    object to go (safe, later); never-exported memory goes at once, as always."""
    mem = WithFree(OWNER, 64)
    mem.free()
    assert mem.closed and stand_in.releases == ["default"]
    mem = WithFree(OWNER, 64)
    write(mem, 1)
    mem.free()
    assert mem.is_freed and stand_in.releases == ["default"]
    del mem
    gc.collect()
    assert stand_in.releases == ["default", "default"]


def test_a_derived_class_whose_init_skips_the_base_says_so(stand_in) -> None:
    mem = Forgetful("never allocated")
    assert isinstance(mem, vkgdr.RawMemory) and repr(mem).endswith("not allocated>")
    for use in (
        lambda: mem.device_ptr,
        lambda: len(mem),
        lambda: mem.is_freed,
        lambda: np.asarray(mem),
        lambda: mem.flush(0, 1),
    ):
        with pytest.raises(vkgdr.VkgdrError, match="must call vkgdr.RawMemory.__init__"):
            use()
    mem.free()  # nothing to free
    assert stand_in.releases == []


def test_an_object_holding_its_own_bound_free_is_collected(stand_in) -> None:
    class Closing(vkgdr.RawMemory):
        def __init__(self, owner: Any, n: int) -> None:
            super().__init__(owner, n)
            self.close = self.free  # a cycle through the bound method

    mem = Closing(OWNER, 64)
    write(mem, 1)
    assert mem.close.__self__ is mem and "bound method free of" in repr(mem.close)
    del mem
    gc.collect()
    assert stand_in.releases == ["default"] and stand_in.in_use() == 0
    mem = Closing(OWNER, 64)
    mem.close()
    assert stand_in.releases == ["default", "default"]


def test_free_through_the_class_needs_a_raw_memory() -> None:
    with pytest.raises(TypeError, match="free\\(\\) needs a vkgdr.RawMemory, not object"):
        vkgdr.RawMemory.free(object())


def test_init_twice_is_refused_and_keeps_the_memory(stand_in) -> None:
    mem = vkgdr.RawMemory(OWNER, 64)
    view = np.asarray(mem).view(np.uint8)
    with pytest.raises(vkgdr.VkgdrError, match="allocated already"):
        vkgdr.RawMemory.__init__(mem, OWNER, 64)
    view[:] = 1
    assert stand_in.in_use() == 64
    del view, mem
    gc.collect()
    assert stand_in.releases == ["default"] and stand_in.in_use() == 0


# --- free() on vkgdr.RawMemory -----------------------------------------------------------------


def test_free_without_views_hands_back_at_once_each_way(stand_in) -> None:
    for how, released in (
        ({}, "default"),
        ({"now": True}, "now"),
        ({"after": vkgdr.RawStream(0x1000)}, 0x1000),
        # The legacy stream: what every release waits for anyway.
        ({"after": vkgdr.RawStream(0)}, "default"),
        ({"after": None}, "default"),
    ):
        stand_in.releases.clear()
        mem = vkgdr.RawMemory(OWNER, 100)
        write(mem, 1)  # exported, the array is gone
        mem.free(**how)
        assert stand_in.releases == [released], how
        assert mem.is_freed and stand_in.in_use() == 0
        mem.free(**how)  # twice: nothing happens
        assert stand_in.releases == [released]


def test_free_with_views_waits_for_the_last(stand_in) -> None:
    mem = vkgdr.RawMemory(OWNER, 4096)
    whole = np.asarray(mem).view(np.uint8)
    part = whole[100:200]
    mem.free(now=True)  # with views: the default fence, when they are gone
    assert mem.is_freed and stand_in.releases == []
    for use in (
        lambda: mem.device_ptr,
        lambda: mem.host_ptr,
        lambda: np.asarray(mem),
        lambda: mem.__cuda_array_interface__,
        lambda: mem.flush(0, 1),
        lambda: mem.invalidate(0, 1),
    ):
        with pytest.raises(vkgdr.VkgdrError, match="the memory has been freed"):
            use()
    assert len(mem) == 4096
    whole[:] = 9
    del whole
    gc.collect()
    assert part[0] == 9 and stand_in.releases == []
    del part, mem
    gc.collect()
    assert stand_in.releases == ["default"] and stand_in.in_use() == 0


def test_a_cuda_array_interface_read_counts_as_a_view(stand_in) -> None:
    class Consumer:  # what CuPy's UnownedMemory does: keeps the object whose interface it read
        def __init__(self, obj: Any) -> None:
            self.ptr = obj.__cuda_array_interface__["data"][0]
            self.owner = obj

    mem = vkgdr.RawMemory(OWNER, 64)
    consumer = Consumer(mem)
    mem.free(after=vkgdr.RawStream(0x2000))
    assert stand_in.releases == []
    del mem, consumer
    gc.collect()
    assert stand_in.releases == [0x2000]


def test_argument_errors_come_first_and_change_nothing(stand_in) -> None:
    mem = vkgdr.RawMemory(OWNER, 64)
    view = np.asarray(mem)  # the release would wait for it: the arguments are checked anyway
    with pytest.raises(vkgdr.InvalidArgumentError, match="not both"):
        mem.free(after=vkgdr.RawStream(1), now=True)
    with pytest.raises(vkgdr.InvalidArgumentError, match="expected a CUDA stream"):
        mem.free(after="default")
    assert not mem.is_freed and stand_in.releases == []
    del view
    mem.free()
    assert stand_in.releases == ["default"]


def test_collected_without_free_is_handed_back(stand_in) -> None:
    mem = vkgdr.RawMemory(OWNER, 64)
    write(mem, 1)
    del mem
    gc.collect()
    assert stand_in.releases == ["default"] and stand_in.in_use() == 0


def test_memory_collected_while_an_exception_propagates_leaves_the_exception(stand_in) -> None:
    def fail(zero: int) -> list:
        return [vkgdr.RawMemory(OWNER, 64), 1 // zero]  # only the stack holds the memory

    with pytest.raises(ZeroDivisionError):
        fail(0)  # the memory goes while the exception unwinds the stack
    assert stand_in.releases == ["default"]


def test_references_that_are_not_views_keep_exported_memory_until_the_object_goes(
    stand_in,
) -> None:
    held = [vkgdr.RawMemory(OWNER, 100) for _ in range(2)]
    write(held[0], 3)
    for m in held:
        m.free()  # the list refers to them too: only the exported one might have a view
    assert stand_in.releases == ["default"]
    del m
    held.clear()
    gc.collect()
    assert stand_in.releases == ["default", "default"]


class ExportedDuringFree(vkgdr.RawMemory):
    """Exports in ``free()``'s window between its reference count and the extension's "freed"
    mark, as another thread may: ``_release_begin`` runs in that window."""

    def _release_begin(self) -> None:
        self._impl.__array_interface__  # a view that the count cannot include


def test_an_export_after_the_count_keeps_the_memory(stand_in) -> None:
    """What ``free()`` does when another thread exports between its reference count and the
    extension's "freed" mark: the count cannot include that view, so the memory waits."""
    mem = vkgdr.RawMemory(OWNER, 64)
    write(mem, 1)
    mem.free()
    assert stand_in.releases == ["default"], "without the export it goes at once"
    mem = ExportedDuringFree(OWNER, 64)
    write(mem, 1)
    mem.free()
    assert mem.is_freed and stand_in.releases == ["default"], "an export since the count: kept"
    del mem
    gc.collect()
    assert stand_in.releases == ["default", "default"]


def test_call_shapes(stand_in) -> None:
    """Each shape frees exported memory with no view left while its variable still refers to
    it: handed back at once, whatever the shape of the call."""
    in_use = stand_in.in_use

    def plain() -> int:
        m = vkgdr.RawMemory(OWNER, 100)
        write(m, 1)
        m.free()
        return in_use()

    def keyword_argument() -> int:
        m = vkgdr.RawMemory(OWNER, 100)
        write(m, 1)
        m.free(after=None)
        return in_use()

    def keywords_unpacked() -> int:
        m = vkgdr.RawMemory(OWNER, 100)
        write(m, 1)
        how: dict = {}
        m.free(**how)
        return in_use()

    def bound_method() -> int:
        m = vkgdr.RawMemory(OWNER, 100)
        write(m, 1)
        f = m.free
        f()
        return in_use()

    def through_the_class_unpacked() -> int:
        m = vkgdr.RawMemory(OWNER, 100)
        write(m, 1)
        vkgdr.RawMemory.free(m, **{"now": False})
        return in_use()

    def getattr_call() -> int:
        m = vkgdr.RawMemory(OWNER, 100)
        write(m, 1)
        getattr(m, "free")()
        return in_use()

    def two_names() -> int:
        m = vkgdr.RawMemory(OWNER, 100)
        n = m
        write(n, 1)
        m.free()
        return in_use()

    def in_a_closure() -> int:
        m = vkgdr.RawMemory(OWNER, 100)
        write(m, 1)

        def inner() -> Any:
            return m

        m.free()
        return in_use()

    def after_locals() -> int:  # a snapshot of the locals exists before the call
        m = vkgdr.RawMemory(OWNER, 100)
        write(m, 1)
        assert "m" in locals()
        m.free()
        return in_use()

    def derived() -> int:
        m = Labelled(OWNER, 100, "x")
        write(m, 1)
        m.free()
        return in_use()

    def in_a_generator():
        m = vkgdr.RawMemory(OWNER, 100)
        write(m, 1)
        m.free()
        yield in_use()

    shapes = (
        plain,
        keyword_argument,
        keywords_unpacked,
        bound_method,
        through_the_class_unpacked,
        getattr_call,
        two_names,
        in_a_closure,
        after_locals,
        derived,
    )
    for shape in shapes:
        assert shape() == 0, f"{shape.__name__}: kept though no view was left"
    assert next(in_a_generator()) == 0
    gc.collect()
    assert len(stand_in.releases) == len(shapes) + 1

    def through_the_class() -> int:
        # The call's arguments and (before Python 3.14) its stack both hold `m`, which the shapes
        # with `*`/`**` do not: counted against those, exported memory may wait for the object.
        m = vkgdr.RawMemory(OWNER, 100)
        write(m, 1)
        vkgdr.RawMemory.free(m)
        return in_use()

    assert through_the_class() in (0, 100)
    gc.collect()
    assert in_use() == 0

    def with_view_and_snapshot():
        m = vkgdr.RawMemory(OWNER, 100)
        a = np.asarray(m)
        assert "a" in locals()
        m.free()
        kept = in_use()
        del a, m  # gone before the function returns: nothing else may hold them
        return kept, in_use()

    assert with_view_and_snapshot() == (100, 0)

    def bound_method_with_view():
        m = vkgdr.RawMemory(OWNER, 100)
        f = m.free
        a = np.asarray(m)
        del m
        f()  # the bound method and the view hold it
        kept = in_use()
        del a, f
        return kept, in_use()

    assert bound_method_with_view() == (100, 0)

    def unpacked_with_view():
        m = vkgdr.RawMemory(OWNER, 100)
        a = np.asarray(m)
        m.free(**{"now": False})
        kept = in_use()
        del a, m
        return kept, in_use()

    assert unpacked_with_view() == (100, 0)

    def through_the_class_with_view():
        m = vkgdr.RawMemory(OWNER, 100)
        a = np.asarray(m)
        vkgdr.RawMemory.free(*(m,))
        kept = in_use()
        del a, m
        return kept, in_use()

    assert through_the_class_with_view() == (100, 0)

    holder = {"m": vkgdr.RawMemory(OWNER, 100)}
    view = np.asarray(holder["m"])
    holder.pop("m").free()  # a temporary receiver: the call's and the view's references only
    assert in_use() == 100
    del view
    gc.collect()
    assert in_use() == 0


def test_module_level_code(stand_in) -> None:
    names = {"vkgdr": vkgdr, "np": np, "in_use": stand_in.in_use, "OWNER": OWNER}
    exec(
        "m = vkgdr.RawMemory(OWNER, 100)\n"
        "np.asarray(m).view(np.uint8)[:] = 1\n"
        "m.free()\n"
        "at_once = in_use()\n"
        "n = vkgdr.RawMemory(OWNER, 100)\n"
        "view = np.asarray(n)\n"
        "n.free()\n"
        "kept = in_use()\n"
        "del view, n\n"
        "after = in_use()\n",
        names,
    )
    assert (names["at_once"], names["kept"], names["after"]) == (0, 100, 0)


def test_a_free_from_another_thread_sees_the_views_of_this_one(stand_in) -> None:
    box = [vkgdr.RawMemory(OWNER, 128)]
    view = np.asarray(box[0])
    run_in_thread(lambda: box.pop().free())  # the thread held the only reference but the view's
    assert stand_in.in_use() == 128
    del view
    gc.collect()
    assert stand_in.in_use() == 0
    box = [vkgdr.RawMemory(OWNER, 128)]
    write(box[0], 1)
    run_in_thread(lambda: box.pop().free())
    assert stand_in.in_use() == 0


def test_threads_free_memory_with_views_concurrently(stand_in) -> None:
    def worker(t: int) -> None:
        for i in range(300):
            m = vkgdr.RawMemory(OWNER, 1 + (i * 37) % 300)
            view = np.asarray(m).view(np.uint8)
            view[:] = t
            if i % 2:
                m.free()  # the view is alive: kept
                assert np.all(view == t), "freed memory with a view was handed out again"
                view[:] = t
            else:
                del view
                m.free()  # back at once

    run_workers(worker)
    gc.collect()
    assert stand_in.in_use() == 0 and len(stand_in.releases) == 4 * 300


# --- vkgdr.pycuda.Memory on a stand-in PyCUDA --------------------------------------------------


@pytest.fixture()
def shim(monkeypatch, stand_in) -> Any:
    FakeContext.current, FakeContext.pushes, FakeContext.pops = FakeContext(), 0, 0
    # Each release records how, and how many contexts were pushed then.
    stand_in.context_depth = lambda: FakeContext.pushes - FakeContext.pops
    return import_pycuda_shim(monkeypatch, FakeContext)


def test_pycuda_memory_is_a_raw_memory_and_a_pointer_holder(shim, stand_in) -> None:
    mem = shim.Memory(OWNER, 64)
    assert isinstance(mem, vkgdr.RawMemory)
    assert isinstance(mem, shim.pycuda.driver.PointerHolderBase)
    assert issubclass(shim.Memory, vkgdr.RawMemory)
    assert len(mem) == 64 and mem.get_pointer() == mem.device_ptr
    assert repr(mem).startswith("<vkgdr.pycuda.Memory 64 bytes at")
    mem.free()
    assert stand_in.releases == [("default", 1)]


def test_pycuda_memory_without_views_is_freed_at_once_in_its_context(shim, stand_in) -> None:
    mem = shim.Memory(OWNER, 64)
    write(mem, 1)  # exported, the array is gone
    mem.free()
    assert stand_in.releases == [("default", 1)], "freed once, with its context pushed"
    assert FakeContext.pushes == FakeContext.pops == 1
    with pytest.raises(vkgdr.VkgdrError, match="freed"):
        mem.device_ptr
    mem.free()
    del mem
    gc.collect()
    assert len(stand_in.releases) == 1 and FakeContext.pushes == 1, "the context was let go"


def test_pycuda_memory_with_views_is_freed_when_the_last_goes(shim, stand_in) -> None:
    mem = shim.Memory(OWNER, 64)
    view = np.asarray(mem).view(np.uint8)  # its base's base is the Memory object
    holder = {"gpudata": mem}  # what a GPUArray holds
    mem.get_pointer()
    mem.free(after=vkgdr.RawStream(0x2000))
    assert stand_in.releases == [], "kept for its views"
    with pytest.raises(vkgdr.VkgdrError, match="freed"):
        mem.get_pointer()  # PyCUDA cannot launch on it any more
    view[:] = 3
    del mem, view
    gc.collect()
    assert stand_in.releases == []
    del holder
    gc.collect()
    assert stand_in.releases == [(0x2000, 1)], "released with the stream asked for, in context"
    assert FakeContext.pushes == FakeContext.pops


def test_get_pointer_counts_as_an_export(shim, stand_in) -> None:
    mem = shim.Memory(OWNER, 64)
    holder = [mem]
    mem.get_pointer()
    mem.free()  # the list might be a GPUArray
    assert stand_in.releases == []
    holder.clear()
    del mem
    gc.collect()
    assert stand_in.releases == [("default", 1)]


def test_pycuda_memory_refuses_after_and_now_together_and_what_is_no_stream(shim, stand_in):
    mem = shim.Memory(OWNER, 64)
    with pytest.raises(vkgdr.InvalidArgumentError, match="not both"):
        mem.free(after=vkgdr.RawStream(1), now=True)
    view = np.asarray(mem)
    with pytest.raises(vkgdr.InvalidArgumentError, match="expected a CUDA stream"):
        mem.free(after="default")  # checked even though the release would wait for the view
    assert FakeContext.pushes == FakeContext.pops, "the context is popped after an error"
    del view
    mem.free(now=True)
    assert stand_in.releases == [("now", 1)]


def test_pycuda_memory_never_exported_is_freed_at_once_from_a_list(shim, stand_in) -> None:
    mems = [shim.Memory(OWNER, 16) for _ in range(3)]
    for m in mems:
        m.free()
    assert stand_in.releases == [("default", 1)] * 3


def test_pycuda_memory_collected_without_free_is_freed_in_its_context(shim, stand_in) -> None:
    mem = shim.Memory(OWNER, 16)
    write(mem, 1)
    del mem
    gc.collect()
    assert stand_in.releases == [("default", 1)]
    assert FakeContext.pushes == FakeContext.pops == 1


def test_a_class_derived_from_pycuda_memory(shim, stand_in) -> None:
    class Tagged(shim.Memory):
        def __init__(self, tag: str, owner: Any, size: int) -> None:
            super().__init__(owner, size)
            self.tag = tag

    mem = Tagged("t", OWNER, 32)
    assert isinstance(mem, vkgdr.RawMemory) and mem.tag == "t"
    view = np.asarray(mem)
    mem.free()
    assert stand_in.releases == []
    del view, mem
    gc.collect()
    assert stand_in.releases == [("default", 1)]
