//! Exhaustive sweep of the copy kernels: every length 0..=4096, many source/destination
//! misalignments, every SIMD level the CPU has, both directions. Each copy must equal a plain
//! copy and leave every byte around the destination untouched. On Linux, a second sweep puts
//! the range right against inaccessible pages, so any access outside it faults.

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use vkgdr::copy::{
    copy_from_mapping, copy_from_mapping_with, copy_to_mapping, copy_to_mapping_with, simd_level,
    SimdLevel,
};

const MAX_LEN: usize = 4096;
/// Guard bytes on each side of the destination range (plus up to 63 bytes of misalignment).
const GUARD: usize = 128;
/// Value of every destination byte before a copy. Source bytes never take it, so a byte the
/// copy missed, or a byte written outside the range, is always detected.
const SENTINEL: u8 = 0xA5;
const BUF_LEN: usize = MAX_LEN + 2 * GUARD + 64;

/// The kernel under test: the run-time choice, or one forced level.
#[derive(Clone, Copy, Debug)]
enum Kernel {
    Detected,
    Forced(SimdLevel),
}

impl Kernel {
    /// Copies `src.len()` bytes into the "mapping" at `dst`.
    ///
    /// # Safety
    ///
    /// `dst` is valid for `src.len()` bytes and does not overlap `src`.
    unsafe fn write(self, dst: *mut u8, src: &[u8]) {
        match self {
            // SAFETY: forwarded from the caller.
            Kernel::Detected => unsafe { copy_to_mapping(dst, src) },
            // SAFETY: forwarded from the caller; only supported levels are constructed.
            Kernel::Forced(level) => unsafe { copy_to_mapping_with(level, dst, src).unwrap() },
        }
    }

    /// Copies `dst.len()` bytes from the "mapping" at `src`.
    ///
    /// # Safety
    ///
    /// `src` is valid for `dst.len()` bytes and does not overlap `dst`.
    unsafe fn read(self, dst: &mut [u8], src: *const u8) {
        match self {
            // SAFETY: forwarded from the caller.
            Kernel::Detected => unsafe { copy_from_mapping(dst, src) },
            // SAFETY: forwarded from the caller; only supported levels are constructed.
            Kernel::Forced(level) => unsafe { copy_from_mapping_with(level, dst, src).unwrap() },
        }
    }
}

/// The detected kernel plus every supported level; prints the levels it has to skip.
fn kernels() -> Vec<Kernel> {
    let mut kernels = vec![Kernel::Detected];
    for level in SimdLevel::ALL {
        if level.is_supported() {
            kernels.push(Kernel::Forced(level));
        } else {
            println!("skipping {level}: not supported by this CPU");
        }
    }
    println!("detected level: {}", simd_level());
    kernels
}

/// A byte buffer with a 64-byte aligned base index, so offsets from it set exact alignments.
struct Aligned {
    buf: Vec<u8>,
    base: usize,
}

impl Aligned {
    fn new(len: usize, fill: u8) -> Self {
        let buf = vec![fill; len + 64];
        let base = buf.as_ptr().align_offset(64);
        Aligned { buf, base }
    }

    fn slice(&self) -> &[u8] {
        &self.buf[self.base..]
    }

    fn slice_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.base..]
    }
}

/// Random bytes, none equal to [`SENTINEL`].
fn source_buffer(rng: &mut StdRng) -> Aligned {
    let mut src = Aligned::new(BUF_LEN, 0);
    rng.fill_bytes(src.slice_mut());
    for b in src.slice_mut() {
        if *b == SENTINEL {
            *b = !SENTINEL;
        }
    }
    src
}

/// Misalignment pairs (source, destination) within 64 bytes to test at `len`: fixed corner
/// cases plus random ones.
fn misalignments(rng: &mut StdRng) -> Vec<(usize, usize)> {
    let mut pairs = vec![(0, 0), (1, 0), (0, 1), (63, 63), (32, 17), (8, 56)];
    pairs.extend((0..10).map(|_| (rng.gen_range(0..64), rng.gen_range(0..64))));
    pairs
}

/// Asserts that `dst` holds `expected` at `start` and [`SENTINEL`] everywhere else, then
/// restores the sentinel over the copied range.
fn check_and_reset(dst: &mut [u8], start: usize, expected: &[u8], what: &dyn Fn() -> String) {
    let sentinels = [SENTINEL; BUF_LEN];
    let end = start + expected.len();
    assert!(
        dst[..start] == sentinels[..start],
        "{}: byte before the range written",
        what()
    );
    assert!(
        dst[start..end] == *expected,
        "{}: copied bytes differ",
        what()
    );
    assert!(
        dst[end..] == sentinels[..dst.len() - end],
        "{}: byte after the range written",
        what()
    );
    dst[start..end].fill(SENTINEL);
}

#[test]
fn every_length_and_alignment_writes_exactly_the_range() {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let src = source_buffer(&mut rng);
    let mut dst = Aligned::new(BUF_LEN, SENTINEL);
    let kernels = kernels();
    let mut copies = 0usize;
    for len in 0..=MAX_LEN {
        for (src_mis, dst_mis) in misalignments(&mut rng) {
            let s = &src.slice()[GUARD + src_mis..GUARD + src_mis + len];
            let start = GUARD + dst_mis;
            for &kernel in &kernels {
                let d = dst.slice_mut();
                // SAFETY: `start + len <= BUF_LEN` lies inside `dst`, a buffer distinct from
                // `src`.
                unsafe { kernel.write(d.as_mut_ptr().add(start), s) };
                let what = || format!("{kernel:?} write len {len} src+{src_mis} dst+{dst_mis}");
                check_and_reset(d, start, s, &what);
                copies += 1;
            }
        }
    }
    println!("{copies} writes checked");
}

#[test]
fn every_length_and_alignment_reads_exactly_the_range() {
    let mut rng = StdRng::seed_from_u64(0xfeed);
    let mapping = source_buffer(&mut rng);
    let mut dst = Aligned::new(BUF_LEN, SENTINEL);
    let kernels = kernels();
    let mut copies = 0usize;
    for len in 0..=MAX_LEN {
        for (map_mis, dst_mis) in misalignments(&mut rng) {
            let m = &mapping.slice()[GUARD + map_mis..GUARD + map_mis + len];
            let start = GUARD + dst_mis;
            for &kernel in &kernels {
                let d = dst.slice_mut();
                // SAFETY: `m` is a live slice of `len` bytes, distinct from `dst`.
                unsafe { kernel.read(&mut d[start..start + len], m.as_ptr()) };
                let what = || format!("{kernel:?} read len {len} map+{map_mis} dst+{dst_mis}");
                check_and_reset(d, start, m, &what);
                copies += 1;
            }
        }
    }
    println!("{copies} reads checked");
}

#[cfg(target_os = "linux")]
mod guard_pages {
    //! The mapping range is placed flush against a `PROT_NONE` page on either side, so a kernel
    //! reading or writing even one byte past either end faults and fails the test.

    use std::ffi::{c_int, c_long, c_void};

    use super::*;

    extern "C" {
        fn mmap(
            addr: *mut c_void,
            len: usize,
            prot: c_int,
            flags: c_int,
            fd: c_int,
            off: i64,
        ) -> *mut c_void;
        fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int;
        fn munmap(addr: *mut c_void, len: usize) -> c_int;
        fn sysconf(name: c_int) -> c_long;
    }

    const PROT_NONE: c_int = 0;
    const PROT_READ: c_int = 1;
    const PROT_WRITE: c_int = 2;
    const MAP_PRIVATE: c_int = 0x02;
    const MAP_ANONYMOUS: c_int = 0x20;
    const SC_PAGESIZE: c_int = 30;

    /// Anonymous memory laid out as `[no access][read/write: len bytes][no access]`.
    struct Fenced {
        base: *mut u8,
        page: usize,
        len: usize,
    }

    impl Fenced {
        fn new(min_len: usize) -> Self {
            // SAFETY: `sysconf` has no preconditions.
            let page = usize::try_from(unsafe { sysconf(SC_PAGESIZE) }).unwrap();
            let len = min_len.div_ceil(page) * page;
            let total = len + 2 * page;
            // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
            let base = unsafe {
                mmap(
                    std::ptr::null_mut(),
                    total,
                    PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(base as usize, usize::MAX, "mmap failed");
            let base = base.cast::<u8>();
            // SAFETY: both pages lie inside the mapping just created.
            unsafe {
                assert_eq!(mprotect(base.cast(), page, PROT_NONE), 0);
                assert_eq!(mprotect(base.add(page + len).cast(), page, PROT_NONE), 0);
            }
            Fenced { base, page, len }
        }

        /// The accessible range.
        fn start(&self) -> *mut u8 {
            // SAFETY: `page` bytes into the mapping.
            unsafe { self.base.add(self.page) }
        }

        fn slice(&self) -> &[u8] {
            // SAFETY: the accessible range is `len` bytes of readable, writable memory owned by
            // `self`; the shared borrow of `self` keeps it alive.
            unsafe { std::slice::from_raw_parts(self.start(), self.len) }
        }

        fn slice_mut(&mut self) -> &mut [u8] {
            // SAFETY: as in `slice`, exclusively borrowed.
            unsafe { std::slice::from_raw_parts_mut(self.start(), self.len) }
        }
    }

    impl Drop for Fenced {
        fn drop(&mut self) {
            // SAFETY: unmaps exactly the mapping created in `new`, no longer borrowed.
            unsafe { munmap(self.base.cast(), self.len + 2 * self.page) };
        }
    }

    #[test]
    fn copies_flush_against_inaccessible_pages_stay_inside() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut mapping = Fenced::new(MAX_LEN);
        rng.fill_bytes(mapping.slice_mut());
        let host: Vec<u8> = {
            let mut v = vec![0u8; MAX_LEN];
            rng.fill_bytes(&mut v);
            v
        };
        let mut out = vec![0u8; MAX_LEN];
        let n = mapping.len;
        for &kernel in &kernels() {
            for len in 0..=MAX_LEN {
                // Flush against the lower fence (aligned start) and the upper fence (aligned
                // end, every start alignment).
                for start in [0, n - len] {
                    let range = start..start + len;
                    // SAFETY: `range` lies inside the accessible part of `mapping`, which is
                    // distinct from `host` and `out`.
                    unsafe {
                        kernel.write(
                            mapping.slice_mut()[range.clone()].as_mut_ptr(),
                            &host[..len],
                        )
                    };
                    assert!(
                        mapping.slice()[range.clone()] == host[..len],
                        "{kernel:?} {len}"
                    );
                    // SAFETY: as above.
                    unsafe {
                        kernel.read(&mut out[..len], mapping.slice()[range.clone()].as_ptr())
                    };
                    assert!(
                        out[..len] == host[..len],
                        "{kernel:?} read {len} at {start}"
                    );
                    out[..len].fill(0);
                }
            }
        }
    }
}
