//! The copy kernels, one pair (write, read) per [`SimdLevel`].
//!
//! Every kernel touches the mapping side only with naturally aligned accesses and touches each
//! byte of `[ptr, ptr + len)` exactly once, never a byte outside it:
//!
//! * head: pieces of 1, 2, 4, 8, (16, 32) bytes, taken in ascending order while the mapping
//!   pointer has that bit set, bring the pointer to the kernel's block width `W`;
//! * bulk: blocks of `W` bytes (4 per iteration, so several loads are in flight);
//! * tail: the remaining `len < W` bytes as pieces in descending order, each aligned because the
//!   pointer is aligned to `W` (or, when the head stopped early, to a power of two above `len`).
//!
//! The host side (the `&[u8]` source of a write, the `&mut [u8]` destination of a read) is
//! accessed with unaligned loads and stores, which cost nothing on host memory.

use core::ptr;

use super::simd::SimdLevel;

/// Advances the mapping pointer, the host pointer and the remaining length by `n` bytes.
macro_rules! advance {
    ($m:ident, $h:ident, $len:ident, $n:expr) => {{
        $m = $m.add($n);
        $h = $h.add($n);
        $len -= $n;
    }};
}

/// Head: aligns the mapping pointer `$m` with pieces of the listed sizes (ascending).
macro_rules! head {
    ($m:ident, $h:ident, $len:ident; $($n:literal => $op:ident),+) => {
        $(
            if $len >= $n && ($m as usize) & $n != 0 {
                $op($m, $h);
                advance!($m, $h, $len, $n);
            }
        )+
    };
}

/// Tail: copies the remaining `$len` bytes with pieces of the listed sizes (descending).
macro_rules! tail {
    ($m:ident, $h:ident, $len:ident; $($n:literal => $op:ident),+) => {
        $(
            if $len & $n != 0 {
                $op($m, $h);
                advance!($m, $h, $len, $n);
            }
        )+
        // The cursors now sit at the end of the range: everything was copied.
        debug_assert_eq!($len, 0);
        let _ = ($m, $h);
    };
}

// Scalar pieces, shared by all kernels. Volatile on the mapping side so that the compiler can
// neither merge, split nor re-widen them (or turn a loop of them into a `memcpy` call).

/// Stores 1 byte from `h` to `m`.
#[inline(always)]
unsafe fn w1(m: *mut u8, h: *const u8) {
    // SAFETY: the caller passes a valid mapping byte and a readable host byte.
    unsafe { ptr::write_volatile(m, ptr::read(h)) }
}

/// Stores 2 bytes from `h` to 2-aligned `m`.
#[inline(always)]
unsafe fn w2(m: *mut u8, h: *const u8) {
    // SAFETY: the caller passes 2 valid bytes on both sides and `m` 2-aligned; `h` is read
    // unaligned.
    unsafe { ptr::write_volatile(m.cast::<u16>(), ptr::read_unaligned(h.cast::<u16>())) }
}

/// Stores 4 bytes from `h` to 4-aligned `m`.
#[inline(always)]
unsafe fn w4(m: *mut u8, h: *const u8) {
    // SAFETY: as for `w2`, with 4 bytes and `m` 4-aligned.
    unsafe { ptr::write_volatile(m.cast::<u32>(), ptr::read_unaligned(h.cast::<u32>())) }
}

/// Stores 8 bytes from `h` to 8-aligned `m`.
#[inline(always)]
unsafe fn w8(m: *mut u8, h: *const u8) {
    // SAFETY: as for `w2`, with 8 bytes and `m` 8-aligned.
    unsafe { ptr::write_volatile(m.cast::<u64>(), ptr::read_unaligned(h.cast::<u64>())) }
}

/// Loads 1 byte from `m` into `h`.
#[inline(always)]
unsafe fn r1(m: *const u8, h: *mut u8) {
    // SAFETY: the caller passes a readable mapping byte and a writable host byte.
    unsafe { ptr::write(h, ptr::read_volatile(m)) }
}

/// Loads 2 bytes from 2-aligned `m` into `h`.
#[inline(always)]
unsafe fn r2(m: *const u8, h: *mut u8) {
    // SAFETY: the caller passes 2 valid bytes on both sides and `m` 2-aligned; `h` is written
    // unaligned.
    unsafe { ptr::write_unaligned(h.cast::<u16>(), ptr::read_volatile(m.cast::<u16>())) }
}

/// Loads 4 bytes from 4-aligned `m` into `h`.
#[inline(always)]
unsafe fn r4(m: *const u8, h: *mut u8) {
    // SAFETY: as for `r2`, with 4 bytes and `m` 4-aligned.
    unsafe { ptr::write_unaligned(h.cast::<u32>(), ptr::read_volatile(m.cast::<u32>())) }
}

/// Loads 8 bytes from 8-aligned `m` into `h`.
#[inline(always)]
unsafe fn r8(m: *const u8, h: *mut u8) {
    // SAFETY: as for `r2`, with 8 bytes and `m` 8-aligned.
    unsafe { ptr::write_unaligned(h.cast::<u64>(), ptr::read_volatile(m.cast::<u64>())) }
}

/// Orders the kernel's stores to the mapping before any later store of this thread (the
/// caller's "data ready" flag): write-combined stores are weakly ordered and sit in the WC
/// buffers until fenced. The crate's one definition lives in [`crate::core::sync`].
pub(super) use crate::core::sync::store_fence;

/// Orders the kernel's loads from the mapping after every earlier load and store of this thread
/// (typically the caller's poll of a "data ready" flag). Streaming loads and loads from WC
/// memory are weakly ordered, and a streaming-load buffer may still hold a line fetched by an
/// earlier call; Intel's SDM prescribes `mfence` before `movntdqa` to see other agents' writes.
#[inline(always)]
fn load_fence() {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `mfence` has no memory-safety preconditions (SSE2 is baseline on x86_64).
    unsafe {
        core::arch::x86_64::_mm_mfence()
    };
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
}

/// Portable write kernel: aligned 8-byte volatile stores, then [`store_fence`].
///
/// # Safety
///
/// * `m` is valid for writes of `len` bytes, `h` for reads of `len` bytes;
/// * the two ranges do not overlap.
pub(super) unsafe fn write_scalar(mut m: *mut u8, mut h: *const u8, mut len: usize, fence: bool) {
    // SAFETY: every piece and block stays inside `[m, m + len)` / `[h, h + len)` (see the module
    // docs: pieces are taken only while `len` covers them), and is aligned as the piece
    // functions require by construction of the head/tail order.
    unsafe {
        head!(m, h, len; 1 => w1, 2 => w2, 4 => w4);
        while len >= 32 {
            let a = ptr::read_unaligned(h.cast::<u64>());
            let b = ptr::read_unaligned(h.add(8).cast::<u64>());
            let c = ptr::read_unaligned(h.add(16).cast::<u64>());
            let d = ptr::read_unaligned(h.add(24).cast::<u64>());
            ptr::write_volatile(m.cast::<u64>(), a);
            ptr::write_volatile(m.add(8).cast::<u64>(), b);
            ptr::write_volatile(m.add(16).cast::<u64>(), c);
            ptr::write_volatile(m.add(24).cast::<u64>(), d);
            advance!(m, h, len, 32);
        }
        while len >= 8 {
            w8(m, h);
            advance!(m, h, len, 8);
        }
        tail!(m, h, len; 4 => w4, 2 => w2, 1 => w1);
    }
    if fence {
        store_fence();
    }
}

/// Portable read kernel: [`load_fence`], then aligned 8-byte volatile loads.
///
/// # Safety
///
/// * `m` is valid for reads of `len` bytes, `h` for writes of `len` bytes;
/// * the two ranges do not overlap.
pub(super) unsafe fn read_scalar(mut m: *const u8, mut h: *mut u8, mut len: usize) {
    load_fence();
    // SAFETY: as in `write_scalar`, with the roles of the two sides swapped.
    unsafe {
        head!(m, h, len; 1 => r1, 2 => r2, 4 => r4);
        while len >= 32 {
            let a = ptr::read_volatile(m.cast::<u64>());
            let b = ptr::read_volatile(m.add(8).cast::<u64>());
            let c = ptr::read_volatile(m.add(16).cast::<u64>());
            let d = ptr::read_volatile(m.add(24).cast::<u64>());
            ptr::write_unaligned(h.cast::<u64>(), a);
            ptr::write_unaligned(h.add(8).cast::<u64>(), b);
            ptr::write_unaligned(h.add(16).cast::<u64>(), c);
            ptr::write_unaligned(h.add(24).cast::<u64>(), d);
            advance!(m, h, len, 32);
        }
        while len >= 8 {
            r8(m, h);
            advance!(m, h, len, 8);
        }
        tail!(m, h, len; 4 => r4, 2 => r2, 1 => r1);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    use super::{load_fence, r1, r2, r4, r8, store_fence, w1, w2, w4, w8};

    /// Non-temporal 16-byte store from `h` to 16-aligned `m`.
    #[inline(always)]
    unsafe fn w16(m: *mut u8, h: *const u8) {
        // SAFETY: SSE2 is baseline on x86_64; the caller passes 16 valid bytes on both sides
        // and `m` 16-aligned.
        unsafe { _mm_stream_si128(m.cast(), _mm_loadu_si128(h.cast())) }
    }

    /// Non-temporal 32-byte store from `h` to 32-aligned `m`.
    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn w32(m: *mut u8, h: *const u8) {
        // SAFETY: the caller passes 32 valid bytes on both sides and `m` 32-aligned; AVX is
        // enabled on this function.
        unsafe { _mm256_stream_si256(m.cast(), _mm256_loadu_si256(h.cast())) }
    }

    /// Streaming 16-byte load (`movntdqa`) from 16-aligned `m` into `h`.
    #[inline]
    #[target_feature(enable = "sse4.1")]
    unsafe fn r16(m: *const u8, h: *mut u8) {
        // SAFETY: the caller passes 16 valid bytes on both sides and `m` 16-aligned.
        unsafe { _mm_storeu_si128(h.cast(), _mm_stream_load_si128(m.cast())) }
    }

    /// Streaming 32-byte load from 32-aligned `m` into `h`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn r32(m: *const u8, h: *mut u8) {
        // SAFETY: the caller passes 32 valid bytes on both sides and `m` 32-aligned.
        unsafe { _mm256_storeu_si256(h.cast(), _mm256_stream_load_si256(m.cast())) }
    }

    /// SSE2 write kernel: 16-byte non-temporal stores.
    ///
    /// # Safety
    ///
    /// As [`super::write_scalar`].
    pub(in super::super) unsafe fn write_sse(
        mut m: *mut u8,
        mut h: *const u8,
        mut len: usize,
        fence: bool,
    ) {
        // SAFETY: bounds and alignment as in `write_scalar`; bulk blocks are 16 bytes at a
        // 16-aligned `m` (the head aligned it) and only while `len` covers them.
        unsafe {
            head!(m, h, len; 1 => w1, 2 => w2, 4 => w4, 8 => w8);
            while len >= 64 {
                let a = _mm_loadu_si128(h.cast());
                let b = _mm_loadu_si128(h.add(16).cast());
                let c = _mm_loadu_si128(h.add(32).cast());
                let d = _mm_loadu_si128(h.add(48).cast());
                _mm_stream_si128(m.cast(), a);
                _mm_stream_si128(m.add(16).cast(), b);
                _mm_stream_si128(m.add(32).cast(), c);
                _mm_stream_si128(m.add(48).cast(), d);
                advance!(m, h, len, 64);
            }
            while len >= 16 {
                w16(m, h);
                advance!(m, h, len, 16);
            }
            tail!(m, h, len; 8 => w8, 4 => w4, 2 => w2, 1 => w1);
        }
        if fence {
            store_fence();
        }
    }

    /// AVX write kernel: 32-byte non-temporal stores.
    ///
    /// # Safety
    ///
    /// As [`super::write_scalar`]; the CPU supports AVX2.
    #[target_feature(enable = "avx2")]
    pub(in super::super) unsafe fn write_avx2(
        mut m: *mut u8,
        mut h: *const u8,
        mut len: usize,
        fence: bool,
    ) {
        // SAFETY: as in `write_sse`, with 32-byte blocks at a 32-aligned `m`; AVX is enabled.
        unsafe {
            head!(m, h, len; 1 => w1, 2 => w2, 4 => w4, 8 => w8, 16 => w16);
            while len >= 128 {
                let a = _mm256_loadu_si256(h.cast());
                let b = _mm256_loadu_si256(h.add(32).cast());
                let c = _mm256_loadu_si256(h.add(64).cast());
                let d = _mm256_loadu_si256(h.add(96).cast());
                _mm256_stream_si256(m.cast(), a);
                _mm256_stream_si256(m.add(32).cast(), b);
                _mm256_stream_si256(m.add(64).cast(), c);
                _mm256_stream_si256(m.add(96).cast(), d);
                advance!(m, h, len, 128);
            }
            while len >= 32 {
                w32(m, h);
                advance!(m, h, len, 32);
            }
            tail!(m, h, len; 16 => w16, 8 => w8, 4 => w4, 2 => w2, 1 => w1);
        }
        if fence {
            store_fence();
        }
    }

    /// AVX-512 write kernel: 64-byte non-temporal stores, one full WC line each.
    ///
    /// # Safety
    ///
    /// As [`super::write_scalar`]; the CPU supports AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(in super::super) unsafe fn write_avx512(
        mut m: *mut u8,
        mut h: *const u8,
        mut len: usize,
        fence: bool,
    ) {
        // SAFETY: as in `write_sse`, with 64-byte blocks at a 64-aligned `m`; AVX-512F (and so
        // AVX) is enabled.
        unsafe {
            head!(m, h, len; 1 => w1, 2 => w2, 4 => w4, 8 => w8, 16 => w16, 32 => w32);
            while len >= 256 {
                let a = _mm512_loadu_si512(h.cast());
                let b = _mm512_loadu_si512(h.add(64).cast());
                let c = _mm512_loadu_si512(h.add(128).cast());
                let d = _mm512_loadu_si512(h.add(192).cast());
                _mm512_stream_si512(m.cast(), a);
                _mm512_stream_si512(m.add(64).cast(), b);
                _mm512_stream_si512(m.add(128).cast(), c);
                _mm512_stream_si512(m.add(192).cast(), d);
                advance!(m, h, len, 256);
            }
            while len >= 64 {
                _mm512_stream_si512(m.cast(), _mm512_loadu_si512(h.cast()));
                advance!(m, h, len, 64);
            }
            tail!(m, h, len; 32 => w32, 16 => w16, 8 => w8, 4 => w4, 2 => w2, 1 => w1);
        }
        if fence {
            store_fence();
        }
    }

    /// SSE4.1 read kernel: 16-byte streaming loads (`movntdqa`).
    ///
    /// # Safety
    ///
    /// As [`super::read_scalar`]; the CPU supports SSE4.1.
    #[target_feature(enable = "sse4.1")]
    pub(in super::super) unsafe fn read_sse41(mut m: *const u8, mut h: *mut u8, mut len: usize) {
        load_fence();
        // SAFETY: bounds and alignment as in `read_scalar`; bulk blocks are 16 bytes at a
        // 16-aligned `m` and only while `len` covers them; SSE4.1 is enabled.
        unsafe {
            head!(m, h, len; 1 => r1, 2 => r2, 4 => r4, 8 => r8);
            while len >= 64 {
                let a = _mm_stream_load_si128(m.cast());
                let b = _mm_stream_load_si128(m.add(16).cast());
                let c = _mm_stream_load_si128(m.add(32).cast());
                let d = _mm_stream_load_si128(m.add(48).cast());
                _mm_storeu_si128(h.cast(), a);
                _mm_storeu_si128(h.add(16).cast(), b);
                _mm_storeu_si128(h.add(32).cast(), c);
                _mm_storeu_si128(h.add(48).cast(), d);
                advance!(m, h, len, 64);
            }
            while len >= 16 {
                r16(m, h);
                advance!(m, h, len, 16);
            }
            tail!(m, h, len; 8 => r8, 4 => r4, 2 => r2, 1 => r1);
        }
    }

    /// AVX2 read kernel: 32-byte streaming loads.
    ///
    /// # Safety
    ///
    /// As [`super::read_scalar`]; the CPU supports AVX2.
    #[target_feature(enable = "avx2")]
    pub(in super::super) unsafe fn read_avx2(mut m: *const u8, mut h: *mut u8, mut len: usize) {
        load_fence();
        // SAFETY: as in `read_sse41`, with 32-byte blocks at a 32-aligned `m`; AVX2 is enabled.
        unsafe {
            head!(m, h, len; 1 => r1, 2 => r2, 4 => r4, 8 => r8, 16 => r16);
            while len >= 128 {
                let a = _mm256_stream_load_si256(m.cast());
                let b = _mm256_stream_load_si256(m.add(32).cast());
                let c = _mm256_stream_load_si256(m.add(64).cast());
                let d = _mm256_stream_load_si256(m.add(96).cast());
                _mm256_storeu_si256(h.cast(), a);
                _mm256_storeu_si256(h.add(32).cast(), b);
                _mm256_storeu_si256(h.add(64).cast(), c);
                _mm256_storeu_si256(h.add(96).cast(), d);
                advance!(m, h, len, 128);
            }
            while len >= 32 {
                r32(m, h);
                advance!(m, h, len, 32);
            }
            tail!(m, h, len; 16 => r16, 8 => r8, 4 => r4, 2 => r2, 1 => r1);
        }
    }

    /// AVX-512 read kernel: 64-byte streaming loads, one full line each.
    ///
    /// # Safety
    ///
    /// As [`super::read_scalar`]; the CPU supports AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(in super::super) unsafe fn read_avx512(mut m: *const u8, mut h: *mut u8, mut len: usize) {
        load_fence();
        // SAFETY: as in `read_sse41`, with 64-byte blocks at a 64-aligned `m`; AVX-512F (and
        // so AVX2) is enabled.
        unsafe {
            head!(m, h, len; 1 => r1, 2 => r2, 4 => r4, 8 => r8, 16 => r16, 32 => r32);
            while len >= 256 {
                let a = _mm512_stream_load_si512(m.cast());
                let b = _mm512_stream_load_si512(m.add(64).cast());
                let c = _mm512_stream_load_si512(m.add(128).cast());
                let d = _mm512_stream_load_si512(m.add(192).cast());
                _mm512_storeu_si512(h.cast(), a);
                _mm512_storeu_si512(h.add(64).cast(), b);
                _mm512_storeu_si512(h.add(128).cast(), c);
                _mm512_storeu_si512(h.add(192).cast(), d);
                advance!(m, h, len, 256);
            }
            while len >= 64 {
                _mm512_storeu_si512(h.cast(), _mm512_stream_load_si512(m.cast()));
                advance!(m, h, len, 64);
            }
            tail!(m, h, len; 32 => r32, 16 => r16, 8 => r8, 4 => r4, 2 => r2, 1 => r1);
        }
    }
}

/// A write kernel as a function pointer: `(mapping, host, len, fence)`, with the obligations of
/// [`write`].
pub(super) type WriteFn = unsafe fn(*mut u8, *const u8, usize, bool);

/// The write kernel of `level`, for callers that pick it once and call it many times.
///
/// Calling the returned function has the obligations of [`write`] with this `level`: in
/// particular `level.is_supported()`.
pub(super) fn write_fn(level: SimdLevel) -> WriteFn {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => x86::write_avx512,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => x86::write_avx2,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Sse41 => x86::write_sse,
        _ => write_scalar,
    }
}

/// Copies `len` bytes from host memory `h` into the mapping at `m` with the kernel of `level`.
///
/// # Safety
///
/// * `m` is valid for writes of `len` bytes, `h` for reads of `len` bytes, and they do not
///   overlap;
/// * `level.is_supported()` (the CPU has the instructions the kernel uses).
#[inline]
pub(super) unsafe fn write(level: SimdLevel, m: *mut u8, h: *const u8, len: usize, fence: bool) {
    // SAFETY: the pointer obligations are the caller's; the CPU supports the chosen kernel's
    // instructions by the caller's `is_supported` obligation (and SSE4.1 wherever it supports
    // AVX2 or AVX-512).
    unsafe {
        match level {
            // Writes shorter than one wide vector take 16-byte stores: the first 256- or 512-bit
            // instruction after a while costs the core a warm-up of microseconds, which a
            // 35-byte write would pay for nothing (figures: BENCHMARKS.md, 'First write').
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 if len < 64 => x86::write_sse(m, h, len, fence),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 if len < 32 => x86::write_sse(m, h, len, fence),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => x86::write_avx512(m, h, len, fence),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => x86::write_avx2(m, h, len, fence),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Sse41 => x86::write_sse(m, h, len, fence),
            _ => write_scalar(m, h, len, fence),
        }
    }
}

/// Copies `len` bytes from the mapping at `m` into host memory `h` with the kernel of `level`.
///
/// # Safety
///
/// * `m` is valid for reads of `len` bytes, `h` for writes of `len` bytes, and they do not
///   overlap;
/// * `level.is_supported()`.
#[inline]
pub(super) unsafe fn read(level: SimdLevel, m: *const u8, h: *mut u8, len: usize) {
    // SAFETY: as in `write`.
    unsafe {
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => x86::read_avx512(m, h, len),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => x86::read_avx2(m, h, len),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Sse41 => x86::read_sse41(m, h, len),
            _ => read_scalar(m, h, len),
        }
    }
}
