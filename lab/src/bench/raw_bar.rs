//! The machine's own BAR copies, with none of this library's code: plain loops of non-temporal
//! stores ending with `sfence` ([`store`]) and of streaming loads ([`load`]), on one thread or
//! split over a [`Gang`] of plain threads.
//!
//! `copybw` and `copylat` time them into and out of the same mapping as the library's copies, side
//! by side at every size, as `machine` rows: lent machines of one GPU model differ widely on BAR
//! stores (BENCHMARKS.md, 'Machines differ more than the code moved'), and a comparison judges each
//! library write's move against its raw row's (the registry's `machine_work`), so a slower BAR is
//! the machine's and slower copy code is still a regression. The plain read loops are shown beside
//! the library's reads, not anchored on: they scatter far more than the library's reads from run to
//! run.
//!
//! The loops are the simplest every x86-64 runs: 16-byte `movntdq` stores (SSE2) and 16-byte
//! `movntdqa` loads (SSE4.1, plain loads without it), 8-byte and single-byte accesses for a tail.
//! Elsewhere: volatile 8-byte accesses and full fences.

use std::sync::{Arc, Barrier, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Stores `src` at `dst` with non-temporal stores, then fences (`sfence`).
///
/// # Safety
///
/// `dst` is valid for writes of `src.len()` bytes, 16-byte aligned, and does not overlap `src`;
/// no other thread accesses that range during the call.
pub unsafe fn store(dst: *mut u8, src: &[u8]) {
    debug_assert!(dst.align_offset(16) == 0 || src.is_empty());
    let n = src.len();
    let s = src.as_ptr();
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128, _mm_stream_si64};
        while i + 16 <= n {
            // SAFETY: `i + 16 <= n`: in bounds of both; `dst + i` is 16-byte aligned (`dst` is,
            // `i` is a multiple of 16).
            unsafe {
                _mm_stream_si128(
                    dst.add(i).cast::<__m128i>(),
                    _mm_loadu_si128(s.add(i).cast::<__m128i>()),
                );
            }
            i += 16;
        }
        if i + 8 <= n {
            // SAFETY: in bounds; 8-byte aligned (a multiple of 16 from an aligned `dst`).
            unsafe {
                _mm_stream_si64(
                    dst.add(i).cast::<i64>(),
                    s.add(i).cast::<i64>().read_unaligned(),
                )
            };
            i += 8;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    while i + 8 <= n {
        // SAFETY: in bounds; 8-byte aligned (`dst` is 16-byte aligned, `i` a multiple of 8).
        unsafe {
            dst.add(i)
                .cast::<u64>()
                .write_volatile(s.add(i).cast::<u64>().read_unaligned())
        };
        i += 8;
    }
    while i < n {
        // SAFETY: `i < n`: in bounds of both.
        unsafe { dst.add(i).write_volatile(*s.add(i)) };
        i += 1;
    }
    // SAFETY: SSE, which `sfence` needs, is part of every x86-64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Loads `dst.len()` bytes at `src` into `dst` with streaming loads, after a full fence
/// (`mfence` on x86-64): loads from write-combined memory are weakly ordered, and without it they
/// could be served before this thread's earlier stores arrived.
///
/// # Safety
///
/// `src` is valid for reads of `dst.len()` bytes, 16-byte aligned, and does not overlap `dst`.
pub unsafe fn load(dst: &mut [u8], src: *const u8) {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.1") {
        // SAFETY: the caller's obligations; the CPU has SSE4.1 (checked above).
        return unsafe { load_streaming(dst, src) };
    }
    // SAFETY: the caller's obligations.
    unsafe { load_tail(dst, src, 0) }
}

/// `load` with 16-byte `movntdqa`.
///
/// # Safety
///
/// As [`load`]; the CPU has SSE4.1.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
unsafe fn load_streaming(dst: &mut [u8], src: *const u8) {
    use std::arch::x86_64::{__m128i, _mm_storeu_si128, _mm_stream_load_si128};
    debug_assert!(src.align_offset(16) == 0 || dst.is_empty());
    let n = dst.len();
    let d = dst.as_mut_ptr();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n`: in bounds of both; `src + i` is 16-byte aligned.
        unsafe {
            _mm_storeu_si128(
                d.add(i).cast(),
                _mm_stream_load_si128(src.add(i).cast::<__m128i>()),
            )
        };
        i += 16;
    }
    // SAFETY: the bytes from `i` on, as above.
    unsafe { load_tail(dst, src, i) }
}

/// Loads the bytes of `dst` from `from` on: 8 at a time, then one at a time.
///
/// # Safety
///
/// As [`load`] (`src + from` 8-byte aligned where 8 bytes remain).
unsafe fn load_tail(dst: &mut [u8], src: *const u8, from: usize) {
    let n = dst.len();
    let mut i = from;
    while i + 8 <= n {
        // SAFETY: in bounds; `src + i` is 8-byte aligned (an aligned `src`, `i` a multiple of 8).
        let v = unsafe { src.add(i).cast::<u64>().read_volatile() };
        dst[i..i + 8].copy_from_slice(&v.to_ne_bytes());
        i += 8;
    }
    while i < n {
        // SAFETY: `i < n`: in bounds.
        dst[i] = unsafe { src.add(i).read_volatile() };
        i += 1;
    }
}

/// One copy for a [`Gang`]: addresses as integers, so the job crosses threads.
#[derive(Debug, Clone, Copy, Default)]
struct Job {
    /// `store` (true) or `load`.
    write: bool,
    /// The mapping.
    mapping: usize,
    /// The host buffer.
    host: usize,
    /// Bytes.
    len: usize,
    /// The gang is being dropped.
    quit: bool,
}

impl Job {
    /// Copies part `i` of `n`: equal parts on 64-byte (WC line) boundaries, as a copy pool
    /// splits a copy.
    ///
    /// # Safety
    ///
    /// The job's ranges are valid and 16-byte aligned as [`store`] and [`load`] need, and no
    /// other part overlaps this one.
    unsafe fn part(&self, i: usize, n: usize) {
        let chunk = self.len.div_ceil(n).next_multiple_of(64);
        let lo = (i * chunk).min(self.len);
        let hi = (lo + chunk).min(self.len);
        let (mapping, host) = (self.mapping + lo, self.host + lo);
        // SAFETY: `lo..hi` lies in both ranges (the caller's) and starts on a 64-byte boundary.
        unsafe {
            if self.write {
                store(
                    mapping as *mut u8,
                    std::slice::from_raw_parts(host as *const u8, hi - lo),
                );
            } else {
                load(
                    std::slice::from_raw_parts_mut(host as *mut u8, hi - lo),
                    mapping as *const u8,
                );
            }
        }
    }
}

/// What the threads of a [`Gang`] share: the job and the barriers that start and end it.
struct Shared {
    job: Mutex<Job>,
    start: Barrier,
    end: Barrier,
}

/// `threads` plain threads (the caller and `threads - 1` spawned ones, parked on a barrier
/// between copies, as a copy pool's workers wait on a condition variable) that copy equal parts
/// of each copy with [`store`] or [`load`].
pub struct Gang {
    threads: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Gang {
    /// A gang of `threads` threads (at least one: the caller).
    pub fn new(threads: usize) -> Gang {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            job: Mutex::new(Job::default()),
            start: Barrier::new(threads),
            end: Barrier::new(threads),
        });
        let workers = (1..threads)
            .map(|i| {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || loop {
                    shared.start.wait();
                    let job = *shared.job.lock().unwrap_or_else(PoisonError::into_inner);
                    if job.quit {
                        break;
                    }
                    // SAFETY: `Gang::run`'s caller vouched for the job, and it waits at `end`
                    // until every part is done.
                    unsafe { job.part(i, threads) };
                    shared.end.wait();
                })
            })
            .collect();
        Gang {
            threads,
            shared,
            workers,
        }
    }

    /// Runs `job` on every thread and returns when all parts are done.
    ///
    /// # Safety
    ///
    /// As [`Job::part`] for the whole job.
    unsafe fn run(&self, job: Job) {
        if self.threads == 1 {
            // SAFETY: the caller's.
            return unsafe { job.part(0, 1) };
        }
        *self
            .shared
            .job
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = job;
        self.shared.start.wait();
        // SAFETY: the caller's.
        unsafe { job.part(0, self.threads) };
        self.shared.end.wait();
    }

    /// [`store`]s `src` at `dst`, split over the gang.
    ///
    /// # Safety
    ///
    /// As [`store`].
    pub unsafe fn store(&self, dst: *mut u8, src: &[u8]) {
        // SAFETY: the caller's.
        unsafe {
            self.run(Job {
                write: true,
                mapping: dst as usize,
                host: src.as_ptr() as usize,
                len: src.len(),
                quit: false,
            });
        }
    }

    /// [`load`]s `dst.len()` bytes at `src` into `dst`, split over the gang.
    ///
    /// # Safety
    ///
    /// As [`load`].
    pub unsafe fn load(&self, dst: &mut [u8], src: *const u8) {
        // SAFETY: the caller's.
        unsafe {
            self.run(Job {
                write: false,
                mapping: src as usize,
                host: dst.as_mut_ptr() as usize,
                len: dst.len(),
                quit: false,
            });
        }
    }
}

impl Drop for Gang {
    fn drop(&mut self) {
        if self.workers.is_empty() {
            return;
        }
        self.shared
            .job
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .quit = true;
        self.shared.start.wait();
        for w in self.workers.drain(..) {
            // A worker that panicked has nothing left to clean up.
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 16-byte-aligned host memory standing in for a mapping.
    fn aligned(len: usize) -> Vec<u128> {
        vec![0u128; len.div_ceil(16)]
    }

    #[test]
    fn raw_copies_move_every_byte_and_no_other() {
        for len in [0, 1, 7, 8, 9, 16, 24, 63, 64, 100, 4096, 65_536 + 40] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let mut map = aligned(len + 16);
            let m = map.as_mut_ptr().cast::<u8>();
            // SAFETY: `map` holds `len + 16` aligned bytes, distinct from `src`.
            unsafe { store(m, &src) };
            // SAFETY: as above.
            let stored = unsafe { std::slice::from_raw_parts(m, len + 16) };
            assert_eq!(&stored[..len], &src[..], "{len} bytes");
            assert!(stored[len..].iter().all(|&b| b == 0), "{len}: past the end");
            let mut back = vec![0u8; len];
            // SAFETY: as above, read.
            unsafe { load(&mut back, m) };
            assert_eq!(back, src);
        }
    }

    #[test]
    fn a_gang_splits_a_copy_and_each_part_lands() {
        for threads in [1, 2, 3, 8] {
            let gang = Gang::new(threads);
            for len in [64, 4096, 4096 + 48, 1 << 20] {
                let src: Vec<u8> = (0..len).map(|i| (i * 13 + threads) as u8).collect();
                let mut map = aligned(len);
                let m = map.as_mut_ptr().cast::<u8>();
                // SAFETY: `map` holds `len` aligned bytes, distinct from `src`.
                unsafe { gang.store(m, &src) };
                let mut back = vec![0u8; len];
                // SAFETY: as above, read.
                unsafe { gang.load(&mut back, m) };
                assert_eq!(back, src, "{threads} threads, {len} bytes");
            }
        }
    }
}
