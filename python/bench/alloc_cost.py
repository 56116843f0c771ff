#!/usr/bin/env python3
"""Per-call cost from Python: pool alloc+free and 64-byte updates (this package), raw
allocation+free (this package and vkgdr 0.1).

Run once per package, each in its own process (both import as ``vkgdr``):

    PYTHONPATH=<dir with vkgdr-rs>  python3 alloc_cost.py
    PYTHONPATH=<dir with vkgdr 0.1> python3 alloc_cost.py

It detects which package it imported. Each line reads ``BENCH <package> <what>: <median> per
call (min <min>; <reps> runs of <n>)``. A benchmark, not a test: it asserts nothing about speed.
"""

import ctypes
import gc
import statistics
import sys
import time
from typing import Callable, List

import numpy as np

import vkgdr

OURS = hasattr(vkgdr, "Pool")
PACKAGE = "vkgdr-rs" if OURS else "vkgdr-0.1"


def make_primary_context_current() -> None:
    """RawMemory allocates in the current context: make device 0's primary context current (the
    one CuPy and PyTorch use), through the driver API so no framework is needed."""
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, dev = ctypes.c_void_p(), ctypes.c_int()
    for call, r in (
        ("cuInit", cuda.cuInit(0)),
        ("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0)),
        ("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)),
        ("cuCtxSetCurrent", cuda.cuCtxSetCurrent(ctx)),
    ):
        if r != 0:
            sys.exit(f"{call} failed ({r})")


def fmt(ns: float) -> str:
    return f"{ns / 1000:.2f} µs" if ns >= 1000 else f"{ns:.0f} ns"


def measure(what: str, body: Callable[[int], None], n: int, reps: int) -> None:
    """Times ``body(n)`` ``reps`` times (after one warm-up) and prints the per-call cost."""
    body(max(1, n // 10))
    per_call: List[float] = []
    gc.disable()
    try:
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            body(n)
            per_call.append((time.perf_counter_ns() - t0) / n)
    finally:
        gc.enable()
    print(
        f"BENCH {PACKAGE} {what}: {fmt(statistics.median(per_call))} per call "
        f"(min {fmt(min(per_call))}; {reps} runs of {n})",
        flush=True,
    )


def raw_alloc_free(g, size: int) -> Callable[[int], None]:
    def body(n: int) -> None:
        for _ in range(n):
            vkgdr.RawMemory(g, size).free()

    return body


def main() -> None:
    make_primary_context_current()
    g = vkgdr.Vkgdr.open_current_context()
    # 64 B and 64 KiB are carved out of shared granules; a larger size takes the mapping the
    # last free of its size left, up to the handle's limit (``spare_limits``: 1/1024 of the BAR
    # heap, 32-256 MiB; 128 MiB on an H200), and maps its own each time above it.
    if OURS:
        each, total = g.spare_limits
        print(f"BENCH {PACKAGE} spare mappings: up to {each >> 20} MiB each, {total >> 20} in all")
    for size in (64, 64 << 10, 2 << 20, 16 << 20, 64 << 20, 128 << 20, 256 << 20):
        n = 100 if size <= 64 << 20 else 30
        measure(f"RawMemory({size}) alloc+free", raw_alloc_free(g, size), n, 5)

    update = np.arange(64, dtype=np.uint8)
    mem = vkgdr.RawMemory(g, 4096)
    view = np.asarray(mem).view(np.uint8)[:64]

    def raw_update(n: int) -> None:
        for _ in range(n):
            view[:] = update

    measure("RawMemory 64-byte update (NumPy view assignment)", raw_update, 200_000, 5)
    mem.free()
    if not OURS:
        return

    gpu = vkgdr.Vkgdr(0)
    for cache in (0, 16):
        pool = vkgdr.Pool(gpu, thread_cache=cache)
        keep = [pool.alloc(64) for _ in range(1000)]  # a chunk is there and in use

        def alloc_free(n: int, pool=pool) -> None:
            alloc = pool.alloc
            for _ in range(n):
                alloc(64, 64)  # freed at once: the block object is dropped

        measure(f"Pool.alloc(64)+free, thread_cache={cache}", alloc_free, 200_000, 5)
        del keep

    pool = vkgdr.Pool(gpu)
    block = pool.alloc(64)
    block_view = block.view(np.uint8)
    payload = update.tobytes()

    def view_update(n: int) -> None:
        for _ in range(n):
            block_view[:] = update

    def write_update(n: int) -> None:
        write = block.write
        for _ in range(n):
            write(payload)

    def view_update_flush(n: int) -> None:
        flush = block.flush
        for _ in range(n):
            block_view[:] = update
            flush()

    measure("Block 64-byte update (NumPy view assignment)", view_update, 200_000, 5)
    measure("Block 64-byte update (Block.write(bytes))", write_update, 200_000, 5)
    measure("Block 64-byte update + Block.flush()", view_update_flush, 200_000, 5)


if __name__ == "__main__":
    print(f"{PACKAGE} from {vkgdr.__file__}", flush=True)
    main()
