"""Two GPUs from Python, in one process (the two-H200 machine): a ``Vkgdr``, a pool and raw memory
on each device, written from NumPy with tags and word patterns of their own, checked by a kernel
on each device (``check_tagged_blocks`` and ``count_mismatches`` of kernels/mapping.ptx through
CuPy, each loaded for its own device), through CuPy views of the blocks and through the package's
own reads. Then isolation: rewriting one device's memory never shows on the other.

Every check is shown able to fail: each device's memory checked against the other's tags and
pattern is wrong everywhere; the other device's tags written into a few blocks are found, exactly
those, until restored; raw memory for one device with the other's context current is refused.
The rounds' tags are ``r << 28``: their first bytes (``tag_base``) differ by ``16 r``, so two
rounds differ in every byte of every block (checked on the CPU first).

On a machine with fewer than two GPUs every test here skips, saying so, even with
``VKGDR_REQUIRE_GPU=1``: one GPU is a machine these tests cannot run on, not a broken one.
``scripts/gpu-check`` lists them by name on its TWO-GPU line (a skip on two GPUs fails there).
"""

from typing import Any, Iterator, List

import numpy as np
import pytest

import vkgdr
from conftest import KERNELS_DIR, tag_bytes

BLOCKS = 500
#: Raw memory per device: 1 MiB and one word.
WORDS = (1 << 18) + 1
ROUNDS = [r << 28 for r in (1, 2, 3, 4)]
#: The blocks the aliasing controls overwrite with the other device's round.
ALIASED = (3, 250, BLOCKS - 1)


def block_size(k: int) -> int:
    return 1 + (k * 37) % 200


def pattern(n: int, seed: int) -> np.ndarray:
    """``pattern(i, seed)`` of kernels/mapping.cu for i < n: the low 32 bits of i * 2654435761,
    xor the seed."""
    i = np.arange(n, dtype=np.uint64)
    return ((i * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)).astype(np.uint32) ^ np.uint32(
        seed
    )


class Side:
    """One device: its ``Vkgdr``, pool, tagged blocks, raw memory and kernels."""

    def __init__(self, cupy: Any, index: int) -> None:
        assert KERNELS_DIR is not None, "kernels/mapping.ptx not found: set VKGDR_KERNELS_DIR"
        self.cupy, self.index = cupy, index
        with cupy.cuda.Device(index):
            cupy.cuda.runtime.deviceSynchronize()  # the primary context, made and current
            self.gpu = vkgdr.Vkgdr(index)
            self.pool = vkgdr.Pool(self.gpu)
            # Raw memory goes into the current context: this device's primary one.
            self.raw = vkgdr.RawMemory(self.gpu, WORDS * 4)
            module = cupy.RawModule(path=str(KERNELS_DIR / "mapping.ptx"))
            self.check = module.get_function("check_tagged_blocks")
            self.count = module.get_function("count_mismatches")
            self.blocks = [self.pool.alloc(block_size(k), 8) for k in range(BLOCKS)]
            self.ptrs = cupy.asarray(np.array([b.device_ptr for b in self.blocks], np.uint64))
            self.lens = cupy.asarray(np.array([len(b) for b in self.blocks], np.uint32))
        self.tags: List[int] = [0] * BLOCKS
        self.seed = 0

    def write_block(self, k: int, tag: int) -> None:
        np.asarray(self.blocks[k])[:] = tag_bytes(tag, block_size(k))
        self.tags[k] = tag

    def write_round(self, round_: int) -> None:
        for k in range(BLOCKS):
            self.write_block(k, round_ + k)
        self.pool.flush()

    def write_words(self, seed: int) -> None:
        np.asarray(self.raw).view(np.uint32)[:] = pattern(WORDS, seed)
        self.raw.flush(0, WORDS * 4)
        self.seed = seed

    def bad_blocks(self, expect: List[int]) -> int:
        """``check_tagged_blocks`` on this device with tag ``expect[k]`` expected of block k."""
        cupy = self.cupy
        self.pool.flush()
        with cupy.cuda.Device(self.index):
            tags = cupy.asarray(np.array(expect, np.uint32))
            bad = cupy.zeros(1, np.uint64)
            self.check((64,), (256,), (self.ptrs, self.lens, tags, np.uint64(BLOCKS), bad))
            return int(bad.get()[0])

    def bad_blocks_of_round(self, round_: int) -> int:
        return self.bad_blocks([round_ + k for k in range(BLOCKS)])

    def mismatched_words(self, seed: int) -> int:
        """``count_mismatches`` on this device: raw words that are not ``pattern(i, seed)``."""
        cupy = self.cupy
        with cupy.cuda.Device(self.index):
            errors = cupy.zeros(1, np.uint64)
            args = (
                np.uint64(self.raw.device_ptr),
                np.uint64(WORDS),
                np.uint64(0),
                np.uint32(seed),
                errors,
            )
            self.count((256,), (256,), args)
            return int(errors.get()[0])

    def cupy_mismatches(self) -> int:
        """Blocks whose CuPy view (on this device, no copy) differs from their tag's bytes."""
        cupy = self.cupy
        wrong = 0
        with cupy.cuda.Device(self.index):
            for k in range(0, BLOCKS, 7):
                view = cupy.asarray(self.blocks[k])
                assert view.data.ptr == self.blocks[k].device_ptr
                want = cupy.asarray(tag_bytes(self.tags[k], block_size(k)))
                wrong += int((view != want).any())
        return wrong

    def cpu_mismatches(self) -> int:
        """Blocks and raw words that the package's own reads find wrong."""
        wrong = sum(
            b.read() != tag_bytes(tag, len(b)).tobytes() for b, tag in zip(self.blocks, self.tags)
        )
        self.raw.invalidate(0, WORDS * 4)
        raw = np.asarray(self.raw).view(np.uint32)
        return int(wrong) + int((raw != pattern(WORDS, self.seed)).sum())

    def ranges(self) -> List["tuple[int, int]"]:
        return [(b.device_ptr, len(b)) for b in self.blocks] + [(self.raw.device_ptr, WORDS * 4)]

    def close(self) -> None:
        for b in self.blocks:
            b.free()
        self.raw.free()
        assert self.gpu.wait_for_releases(30), f"device {self.index}: releases still waiting"


@pytest.fixture(scope="module")
def sides(cuda, request) -> Iterator[List[Side]]:
    """Both devices' sides; skips (with the reason) on a machine with fewer than two GPUs."""
    n = cuda.device_count()
    if n < 2:
        pytest.skip(f"needs two GPUs: this machine has {n}")
    cupy = request.getfixturevalue("cupy")
    made = [Side(cupy, 0), Side(cupy, 1)]
    yield made
    for side in made:
        side.close()


def test_rounds_of_the_two_gpu_tests_differ_in_every_byte() -> None:
    """The premise, on any machine: the rounds write different bytes at every index of every
    block; and the check can fail (tags one inverse of 2654435761 apart nearly always collide)."""

    def differ_everywhere(a: int, b: int) -> bool:
        return all(
            (tag_bytes(a + k, block_size(k)) != tag_bytes(b + k, block_size(k))).all()
            for k in range(BLOCKS)
        )

    for i, a in enumerate(ROUNDS):
        for b in ROUNDS[i + 1 :]:
            assert differ_everywhere(a, b), (hex(a), hex(b))
    inverse = pow(2654435761, -1, 1 << 32)
    assert not differ_everywhere(ROUNDS[0], (ROUNDS[0] + inverse) & 0xFFFFFFFF)


def test_two_gpus_devices_and_addresses_are_distinct(sides) -> None:
    a, b = sides
    assert a.gpu.uuid != b.gpu.uuid, "two devices, two UUIDs"
    ranges = sorted((p, n, side.index) for side in sides for p, n in side.ranges())
    for (p, n, i), (q, _, j) in zip(ranges, ranges[1:]):
        assert p + n <= q, f"device {i}'s memory at {p:#x} overlaps device {j}'s at {q:#x}"


def test_two_gpus_raw_memory_in_the_other_devices_context_is_refused(sides, cupy) -> None:
    a, b = sides
    with cupy.cuda.Device(a.index):
        with pytest.raises(vkgdr.InvalidArgumentError, match="belongs to device"):
            vkgdr.RawMemory(b.gpu, 4096)


def test_two_gpus_kernels_isolation_and_negative_controls(sides) -> None:
    a, b = sides
    r1, r2, r3, r4 = ROUNDS
    # Raw memory: each device's kernel sees its own pattern, and the other's is wrong everywhere.
    a.write_words(0xC0DE0000)
    b.write_words(0xC0DE1111)
    assert a.mismatched_words(a.seed) == 0, "device 0's kernel on its raw memory"
    assert b.mismatched_words(b.seed) == 0, "device 1's kernel on its raw memory"
    assert b.mismatched_words(a.seed) == WORDS, "device 1's words, device 0's pattern"
    assert a.mismatched_words(b.seed) == WORDS, "device 0's words, device 1's pattern"

    # Pools: each device's kernel sees its own tags; the other's tag table fails every block.
    a.write_round(r1)
    b.write_round(r2)
    assert a.bad_blocks_of_round(r1) == 0, "device 0's kernel on its blocks"
    assert b.bad_blocks_of_round(r2) == 0, "device 1's kernel on its blocks"
    assert b.bad_blocks_of_round(r1) == BLOCKS, "device 1's blocks against device 0's tags"
    assert a.bad_blocks_of_round(r2) == BLOCKS, "device 0's blocks against device 1's tags"

    # Aliasing control: device 0's round in a few blocks of device 1, found exactly there.
    for k in ALIASED:
        b.write_block(k, r1 + k)
    b.pool.flush()
    assert b.bad_blocks_of_round(r2) == len(ALIASED), "device 0's bytes in device 1's blocks"
    expect = [r2 + k for k in range(BLOCKS)]
    for k in ALIASED:
        expect[k] = r1 + k
    assert b.bad_blocks(expect) == 0, "the aliased blocks are exactly those"
    assert b.cupy_mismatches() == 0
    for k in ALIASED:
        b.write_block(k, r2 + k)
    assert b.bad_blocks_of_round(r2) == 0, "device 1 restored"

    # Isolation: rewriting device 0 leaves device 1 as it was, and the other way round.
    a.write_words(0xC0DE2222)
    a.write_round(r3)
    assert a.bad_blocks_of_round(r3) == 0 and a.mismatched_words(a.seed) == 0
    assert a.bad_blocks_of_round(r1) == BLOCKS, "device 0's kernel still sees the old round"
    assert a.mismatched_words(0xC0DE0000) == WORDS, "device 0's kernel still sees old words"
    assert b.bad_blocks_of_round(r2) == 0, "a write to device 0 showed up on device 1"
    assert b.mismatched_words(b.seed) == 0, "a write to device 0 showed up on device 1"
    b.write_words(0xC0DE3333)
    b.write_round(r4)
    assert b.bad_blocks_of_round(r4) == 0 and b.mismatched_words(b.seed) == 0
    assert a.bad_blocks_of_round(r3) == 0, "a write to device 1 showed up on device 0"
    assert a.mismatched_words(a.seed) == 0, "a write to device 1 showed up on device 0"
    # The same control in this direction: device 1's round aliased into device 0.
    for k in ALIASED:
        a.write_block(k, r4 + k)
    assert a.bad_blocks_of_round(r3) == len(ALIASED), "device 1's bytes in device 0's blocks"
    for k in ALIASED:
        a.write_block(k, r3 + k)
    assert a.bad_blocks_of_round(r3) == 0, "device 0 restored"

    for side in sides:
        assert side.cupy_mismatches() == 0, f"device {side.index}: CuPy views"
        assert side.cpu_mismatches() == 0, f"device {side.index}: the package's reads"
    print(
        f"two devices: {BLOCKS} blocks and {WORDS} words each, 4 rounds, isolation and aliasing "
        f"checked by both kernels"
    )
