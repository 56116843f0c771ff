"""The package without a GPU: imports, vkgdr 0.1's names, errors, the PyCUDA shim's own logic."""

import importlib
import os
import subprocess
import sys

import pytest

import vkgdr
from conftest import FakeContext, has_cuda_driver, import_pycuda_shim

no_driver = pytest.mark.skipif(
    has_cuda_driver(), reason="checks the errors of a machine without libcuda.so.1"
)


def test_vkgdr_0_1_names_and_values() -> None:
    assert vkgdr.OpenFlags.CURRENT_CONTEXT_BIT == 1
    assert vkgdr.OpenFlags.FORCE_NON_COHERENT_BIT == 2
    assert vkgdr.OpenFlags.REQUIRE_COHERENT_BIT == 4
    assert issubclass(vkgdr.OpenFlags, int)
    assert issubclass(vkgdr.VkgdrError, RuntimeError)
    for name in ("Vkgdr", "RawMemory", "Pool", "Block", "DeviceRing", "RingProducer", "RawStream"):
        assert getattr(vkgdr, name).__module__ == "vkgdr"
        assert getattr(vkgdr, name).__doc__, f"{name} has no docstring"
    assert vkgdr.__version__


def test_ring_producers_come_only_from_a_ring() -> None:
    # A producer owns a lane of a ring: there is nothing to make one from but ring.producer().
    with pytest.raises(TypeError):
        vkgdr.RingProducer()
    for name in ("push", "write", "push_batch", "flush", "close", "__enter__", "__exit__"):
        assert callable(getattr(vkgdr.RingProducer, name)), name
    for name in ("producer", "copy_engine_stats", "head_of", "results_of"):
        assert callable(getattr(vkgdr.DeviceRing, name)), name


def test_release_times_come_only_from_a_handle() -> None:
    # Figures of a device's releases (Vkgdr.release_times()): nothing to make one of.
    for cls in (vkgdr.ReleaseTimes, vkgdr.SlowRelease):
        assert cls.__module__ == "vkgdr" and cls.__doc__, cls
        assert cls.__name__ in vkgdr.__all__
        with pytest.raises(TypeError):
            cls()
    assert vkgdr.Vkgdr.release_times.__doc__


def test_device_to_host_consumers_come_only_from_a_ring() -> None:
    # A lane's consumer, its records and the view are handed out by a ring, never made.
    for cls in (vkgdr.LaneConsumer, vkgdr.LaneRecord, vkgdr.DeviceToHostView):
        with pytest.raises(TypeError):
            cls()
    for name in ("try_next", "next", "close", "__iter__", "__next__", "__enter__", "__exit__"):
        assert callable(getattr(vkgdr.LaneConsumer, name)), name
    for name in ("consumer", "finish", "restart", "close", "lane_stats"):
        assert callable(getattr(vkgdr.DeviceToHostRing, name)), name


@pytest.mark.parametrize(
    "slots, stride, lanes, error",
    [
        (1000, 64, 1, "lane shape of 1000 slots of 64 bytes"),
        (64, 16, 1, "powers of two"),
        (1, 64, 1, "powers of two"),
        (64, 1 << 17, 1, "powers of two"),
    ],
)
def test_a_device_to_host_ring_checks_its_shape_before_its_owner(slots, stride, lanes, error):
    # No device is needed to refuse a bad shape: the owner is not even looked at.
    with pytest.raises(vkgdr.InvalidArgumentError, match=error):
        vkgdr.DeviceToHostRing(object(), slots, stride, lanes=lanes)
    with pytest.raises(OverflowError):
        vkgdr.DeviceToHostRing(object(), -1, 64)
    with pytest.raises(vkgdr.InvalidArgumentError, match='format "fast": "committed" or "tagged"'):
        vkgdr.DeviceToHostRing(object(), 64, 64, format="fast")
    # A good shape gets as far as the owner.
    with pytest.raises(TypeError, match="the owner must be a vkgdr.Vkgdr, not object"):
        vkgdr.DeviceToHostRing(object(), 64, 64)
    with pytest.raises(TypeError, match="the owner must be a vkgdr.Vkgdr, not object"):
        vkgdr.DeviceToHostRing(object(), 64, 64, format="tagged")


def test_a_ring_checks_its_copy_engine_split_before_its_owner() -> None:
    # No device is needed to refuse a split without a record size or on a shareable ring.
    for record in (None, 0):
        with pytest.raises(vkgdr.InvalidArgumentError, match="copy_engine_split=True needs"):
            vkgdr.DeviceRing(object(), 4096, copy_engine=record, copy_engine_split=True)
    with pytest.raises(vkgdr.InvalidArgumentError, match="leave copy_engine_split out"):
        vkgdr.DeviceRing(object(), 4096, copy_engine=4096, copy_engine_split=True, shareable=True)
    with pytest.raises(vkgdr.InvalidArgumentError, match="leave copy_engine_split out"):
        vkgdr.DeviceRing(object(), 4096, copy_engine_split=True, shareable=True)
    with pytest.raises(vkgdr.InvalidArgumentError, match="copy_engine -1"):
        vkgdr.DeviceRing(object(), 4096, copy_engine=-1, copy_engine_split=True)
    assert issubclass(vkgdr.InvalidArgumentError, ValueError)
    # Keyword-only, as the other options.
    with pytest.raises(TypeError):
        vkgdr.DeviceRing(object(), 4096, False, 1, 4096, True)
    # A split with a record size gets as far as the owner.
    with pytest.raises(TypeError, match="the owner must be a vkgdr.Vkgdr, not object"):
        vkgdr.DeviceRing(object(), 4096, copy_engine=4096, copy_engine_split=True)
    with pytest.raises(TypeError, match="the owner must be a vkgdr.Vkgdr, not object"):
        vkgdr.DeviceRing(object(), 2 << 20, mirrored=True, copy_engine=1024, copy_engine_split=True)


def test_the_sharing_names() -> None:
    for name in (
        "ShareServer", "ShareEvent", "Peer", "AttachedMemory", "AttachedPool", "SharedBlock",
        "AttachedLane", "VulkanDevice", "VulkanMemory", "CheckingRing",
    ):
        cls = getattr(vkgdr, name)
        assert cls.__module__ == "vkgdr" and cls.__doc__, name
    # What a peer gets comes from a Peer (and a ShareEvent from a server): nothing to make one of.
    for cls in (vkgdr.AttachedMemory, vkgdr.AttachedPool, vkgdr.SharedBlock, vkgdr.AttachedLane):
        with pytest.raises(TypeError):
            cls()
    assert vkgdr.attach.__doc__ and "attach" in vkgdr.__all__


def test_importing_the_package_loads_no_cuda() -> None:
    """A peer imports vkgdr in a process that must not load CUDA: the driver is loaded when a
    device is opened, not before."""
    code = (
        "import vkgdr, sys; maps = open('/proc/self/maps').read(); "
        "sys.exit('libcuda' in maps)"
    )
    env = {**os.environ, "VKGDR_CUDA_LIBRARY": "/nonexistent/libcuda.so.1"}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


def test_error_hierarchy() -> None:
    for sub in (
        vkgdr.OutOfDeviceMemoryError,
        vkgdr.LibraryNotFoundError,
        vkgdr.RingFullError,
        vkgdr.InvalidArgumentError,
        vkgdr.ShareError,
    ):
        assert issubclass(sub, vkgdr.VkgdrError)
    assert issubclass(vkgdr.InvalidArgumentError, ValueError)


@pytest.mark.parametrize("flags", [8, 0x80000000, 0xFFFFFFF8], ids=hex)
def test_unknown_open_flag_bits_are_ignored_as_in_vkgdr_0_1(flags) -> None:
    """vkgdr 0.1 ignores open-flag bits it does not know: the call goes on to the driver. Without
    libcuda.so.1 it fails there, on the library and not on the flags; with a GPU it opens."""
    for open_it in (lambda: vkgdr.Vkgdr(0, flags), lambda: vkgdr.Vkgdr.open_current_context(flags)):
        try:
            g = open_it()
        except vkgdr.VkgdrError as e:
            assert not isinstance(e, vkgdr.InvalidArgumentError), e
            assert "flag" not in str(e).lower(), e
            if not has_cuda_driver():
                assert isinstance(e, vkgdr.LibraryNotFoundError), e
                assert "libcuda.so.1" in str(e)
        else:
            assert g.device == 0


@no_driver
@pytest.mark.parametrize(
    "open_it",
    [
        lambda: vkgdr.Vkgdr(0),
        lambda: vkgdr.Vkgdr(-1),
        lambda: vkgdr.Vkgdr.open_current_context(),
        lambda: vkgdr.Vkgdr.open_current_context(vkgdr.OpenFlags.REQUIRE_COHERENT_BIT),
    ],
)
def test_without_cuda_driver_the_error_names_the_library(open_it) -> None:
    with pytest.raises(vkgdr.LibraryNotFoundError, match=r"libcuda\.so\.1") as e:
        open_it()
    assert isinstance(e.value, vkgdr.VkgdrError)


def test_open_current_context_is_a_classmethod_for_subclasses() -> None:
    made = []

    class Mine(vkgdr.Vkgdr):
        def __new__(cls, device, flags=0):  # records the call instead of opening a device
            made.append((device, flags))
            return "made by Mine"

    assert Mine.open_current_context(vkgdr.OpenFlags.REQUIRE_COHERENT_BIT) == "made by Mine"
    assert made == [(0, vkgdr.OpenFlags.REQUIRE_COHERENT_BIT | vkgdr.OpenFlags.CURRENT_CONTEXT_BIT)]


# --- Classes derived from Vkgdr and RawMemory, as vkgdr 0.1's plain Python classes allow -------


def test_a_vkgdr_with_its_own_init_signature_reaches_the_driver() -> None:
    """``__new__`` takes the derived class's arguments; its ``__init__`` runs and opens the
    device through the base's. Without libcuda.so.1 that fails on the library, with a GPU it
    opens; never on the arguments."""
    seen = []

    class Named(vkgdr.Vkgdr):
        def __init__(self, label: str) -> None:
            seen.append(label)
            super().__init__(0, vkgdr.OpenFlags.REQUIRE_COHERENT_BIT)

    try:
        g = Named("correlator")
    except vkgdr.VkgdrError as e:
        assert not has_cuda_driver() and isinstance(e, vkgdr.LibraryNotFoundError), e
    else:
        assert isinstance(g, vkgdr.Vkgdr) and g.device == 0
    assert seen == ["correlator"]
    assert isinstance(Named.__new__(Named, "label"), vkgdr.Vkgdr)


class Labelled(vkgdr.RawMemory):
    made: list = []

    def __init__(self, owner, n: int, label: str) -> None:
        Labelled.made.append(label)
        self.label = label
        super().__init__(owner, n)


def test_a_raw_memory_with_its_own_init_signature_defines_and_constructs() -> None:
    """``__new__`` does not reject the derived class's arguments; its ``__init__`` runs, and
    the base's checks the owner (no device can be opened here to allocate with)."""
    Labelled.made.clear()
    mem = Labelled.__new__(Labelled, object(), 16, "gains")
    assert isinstance(mem, vkgdr.RawMemory) and type(mem) is Labelled
    assert repr(mem).endswith("Labelled not allocated>")
    with pytest.raises(TypeError, match="the owner must be a vkgdr.Vkgdr, not object"):
        Labelled(object(), 16, "delays")
    assert Labelled.made == ["delays"]


def test_the_classes_combine_with_a_native_base() -> None:
    """What vkgdr.pycuda.Memory does with PyCUDA's Boost.Python base: plain Python classes
    combine with a native one (a native vkgdr class could not: instance layouts conflict)."""
    for base in (vkgdr.RawMemory, vkgdr.Vkgdr):
        combined = type("Combined", (dict, base), {})
        assert issubclass(combined, base) and issubclass(combined, dict)
        assert combined.__new__(combined) == {}


def test_derived_classes_that_skip_the_base_init_say_so() -> None:
    class Unopened(vkgdr.Vkgdr):
        def __init__(self) -> None:
            pass

    class Unallocated(vkgdr.RawMemory):
        def __init__(self) -> None:
            pass

    g, mem = Unopened(), Unallocated()
    assert repr(g).endswith("Unopened not opened>")
    for use in (
        lambda: g.device,
        lambda: g.name,
        lambda: g.pending_releases(),
        g.release_times,
        g.trim,
    ):
        with pytest.raises(vkgdr.VkgdrError, match="must call vkgdr.Vkgdr.__init__"):
            use()
    for use in (lambda: mem.device_ptr, lambda: len(mem), lambda: mem.__array_interface__):
        with pytest.raises(vkgdr.VkgdrError, match="must call vkgdr.RawMemory.__init__"):
            use()
    mem.free()  # nothing to free
    for make in (
        lambda owner: vkgdr.RawMemory(owner, 16),
        vkgdr.Pool,
        lambda owner: vkgdr.DeviceRing(owner, 4096),
        lambda owner: vkgdr.DeviceToHostRing(owner, 64, 64),
    ):
        with pytest.raises(TypeError, match="has no open device"):
            make(g)
        with pytest.raises(TypeError, match="the owner must be a vkgdr.Vkgdr, not Unallocated"):
            make(mem)


@pytest.fixture()
def fake_pycuda(monkeypatch):
    FakeContext.current, FakeContext.pushes, FakeContext.pops = None, 0, 0
    return import_pycuda_shim(monkeypatch, FakeContext)


def test_pycuda_memory_is_a_raw_memory(fake_pycuda) -> None:
    assert issubclass(fake_pycuda.Memory, vkgdr.RawMemory)
    assert issubclass(fake_pycuda.Memory, fake_pycuda.pycuda.driver.PointerHolderBase)


def test_pycuda_memory_needs_a_current_context(fake_pycuda) -> None:
    with pytest.raises(vkgdr.VkgdrError, match="no current CUDA context"):
        fake_pycuda.Memory(object(), 16)


def test_pycuda_memory_rejects_an_owner_that_is_not_a_handle(fake_pycuda) -> None:
    FakeContext.current = FakeContext()
    with pytest.raises(TypeError):
        fake_pycuda.Memory(object(), 16)
    # The failed object frees nothing and pushes no context when collected.
    assert FakeContext.pushes == 0


def test_vkgdr_pycuda_needs_pycuda() -> None:
    if importlib.util.find_spec("pycuda") is not None:
        pytest.skip("PyCUDA is installed here")
    sys.modules.pop("vkgdr.pycuda", None)
    with pytest.raises(ImportError):
        importlib.import_module("vkgdr.pycuda")


def _stub_names(path: str):
    """The stub's module-level names and, per class, the members it declares."""
    import ast

    tree = ast.parse(open(path, encoding="utf-8").read())
    classes, names = {}, set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {
                n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            } | {
                n.target.id
                for n in node.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            }
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return classes, names


def test_the_stubs_match_the_module() -> None:
    """python/vkgdr/_vkgdr.pyi, installed beside the extension, declares every public class,
    function and constant of vkgdr._vkgdr and every public member of its classes, and nothing
    the module lacks (its private helper protocols aside)."""
    from vkgdr import _vkgdr

    stub = os.path.join(os.path.dirname(vkgdr.__file__), "_vkgdr.pyi")
    classes, names = _stub_names(stub)
    public = {n for n in dir(_vkgdr) if not n.startswith("_")}
    declared = {n for n in set(classes) | names if not n.startswith("_")}
    assert public - declared == set(), "in the module, not in the stub"
    assert declared - public == set(), "in the stub, not in the module"
    for name, members in classes.items():
        cls = getattr(_vkgdr, name, None)
        if cls is None:
            continue
        have = {n for n in dir(cls) if not n.startswith("_")}
        if issubclass(cls, BaseException):
            # Exceptions: BaseException's own members aside; `call` and `result_name` are set
            # on each instance.
            have -= set(dir(BaseException))
            members = members - {"call", "result_name"}
        declared_members = {n for n in members if not n.startswith("_")}
        assert have - declared_members == set(), f"{name}: members missing from the stub"
        assert declared_members - have == set(), f"{name}: stub members the class lacks"
