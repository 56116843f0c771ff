//! Unit tests of the copy module: level detection, errors, slice splitting and the pool.
//! The exhaustive length/alignment sweep lives in `tests/copy_exhaustive.rs`.

use std::collections::HashSet;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use super::pool::{self, slice_bounds, SLICE_ALIGN};
use super::simd::DETECTED;
use super::*;

fn random_bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

#[test]
fn detected_level_is_the_best_supported_and_cached() {
    let level = simd_level();
    assert!(level.is_supported());
    for better in SimdLevel::ALL.into_iter().filter(|l| *l > level) {
        assert!(
            !better.is_supported(),
            "{better} supported but {level} picked"
        );
    }
    assert_eq!(simd_level(), level);
    assert_eq!(
        SimdLevel::from_bits(DETECTED.load(Ordering::Relaxed)),
        Some(level)
    );
}

#[cfg(target_arch = "x86_64")]
#[test]
fn detection_matches_cpuid_features() {
    assert_eq!(
        SimdLevel::Avx512.is_supported(),
        is_x86_feature_detected!("avx512f")
    );
    assert_eq!(
        SimdLevel::Avx2.is_supported(),
        is_x86_feature_detected!("avx2")
    );
    assert_eq!(
        SimdLevel::Sse41.is_supported(),
        is_x86_feature_detected!("sse4.1")
    );
}

#[test]
fn level_names_order_and_bits() {
    let names: Vec<String> = SimdLevel::ALL.iter().map(|l| l.to_string()).collect();
    assert_eq!(names, ["scalar", "SSE4.1", "AVX2", "AVX-512"]);
    assert!(SimdLevel::ALL.windows(2).all(|w| w[0] < w[1]));
    for level in SimdLevel::ALL {
        assert_eq!(SimdLevel::from_bits(level.to_bits()), Some(level));
    }
    assert_eq!(SimdLevel::from_bits(0), None);
    assert_eq!(SimdLevel::from_bits(5), None);
}

#[test]
fn forced_level_errors_exactly_when_unsupported() {
    let src = [1u8, 2, 3, 4, 5];
    for level in SimdLevel::ALL {
        let mut dst = [0u8; 5];
        let mut back = [0u8; 5];
        // SAFETY: `dst` and `back` are distinct live buffers of the right length.
        let (w, r) = unsafe {
            (
                copy_to_mapping_with(level, dst.as_mut_ptr(), &src),
                copy_from_mapping_with(level, &mut back, dst.as_ptr()),
            )
        };
        if level.is_supported() {
            assert!(w.is_ok() && r.is_ok());
            assert_eq!((dst, back), (src, src));
        } else {
            println!("{level} unsupported here: checking the error path");
            assert!(matches!(w, Err(CopyError::Unsupported(l)) if l == level));
            assert!(matches!(r, Err(CopyError::Unsupported(l)) if l == level));
            assert_eq!((dst, back), ([0; 5], [0; 5]), "nothing copied on error");
        }
    }
}

/// A kernel picked once ([`WriteKernel`], as the rings' sinks keep one) writes exactly the
/// range, at every alignment, for every level it can be made for.
#[test]
fn picked_kernels_write_exactly_the_range() {
    let mut rng = StdRng::seed_from_u64(7);
    assert_eq!(WriteKernel::detected().level(), simd_level());
    for level in SimdLevel::ALL {
        let Ok(kernel) = WriteKernel::new(level) else {
            assert!(!level.is_supported(), "{level} is supported");
            continue;
        };
        assert_eq!(kernel.level(), level);
        for len in [0usize, 1, 15, 16, 17, 64, 255, 256, 300] {
            for start in 0..64 {
                let src = random_bytes(&mut rng, len);
                let mut dst = vec![0xEEu8; start + len + 64];
                // SAFETY: `dst[start..start + len]` is valid, distinct from `src` and not shared;
                // this thread reads it back (its own stores, fenced or not).
                unsafe { kernel.write_unfenced(dst.as_mut_ptr().add(start), &src) };
                assert!(
                    dst[..start].iter().all(|&b| b == 0xEE),
                    "{level} {start}+{len}"
                );
                assert_eq!(&dst[start..start + len], &src[..], "{level} {start}+{len}");
                assert!(
                    dst[start + len..].iter().all(|&b| b == 0xEE),
                    "{level} {start}+{len}"
                );
            }
        }
    }
}

#[test]
fn safe_helpers_reject_length_mismatch_without_copying() {
    let mut dst = [0u8; 4];
    let err = copy_to_slice_mapping(&mut dst, &[1, 2, 3]).unwrap_err();
    assert!(matches!(err, CopyError::LengthMismatch { dst: 4, src: 3 }));
    let err = copy_from_slice_mapping(&mut dst, &[1, 2, 3, 4, 5]).unwrap_err();
    assert!(matches!(err, CopyError::LengthMismatch { dst: 4, src: 5 }));
    assert_eq!(dst, [0; 4]);
    let pool = CopyPool::new(2);
    assert!(pool.write_slice(&mut dst, &[1]).is_err());
    assert!(pool.read_slice(&mut dst, &[1]).is_err());
    assert_eq!(dst, [0; 4]);
    assert_eq!(
        err.to_string(),
        "length mismatch: destination has 4 bytes, source has 5"
    );
}

#[test]
fn empty_copies_touch_nothing() {
    // A dangling (but non-null, aligned) pointer: any access would be UB / a fault under tools.
    let p = std::ptr::NonNull::<u64>::dangling().as_ptr().cast::<u8>();
    for level in SimdLevel::ALL.into_iter().filter(|l| l.is_supported()) {
        // SAFETY: zero-length copies access no memory, which is the documented contract.
        unsafe {
            copy_to_mapping_with(level, p, &[]).unwrap();
            copy_from_mapping_with(level, &mut [], p).unwrap();
        }
    }
}

#[test]
fn slice_bounds_cover_the_range_on_page_boundaries() {
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..2000 {
        let addr = rng.gen_range(0..1usize << 40);
        let len = match rng.gen_range(0..3) {
            0 => rng.gen_range(0..10_000),
            1 => rng.gen_range(0..1 << 20),
            _ => rng.gen_range(0..1 << 30),
        };
        let parts = rng.gen_range(1..=16);
        let mut expected_start = 0;
        for part in 0..parts {
            let (start, end) = slice_bounds(addr, len, parts, part);
            assert_eq!(start, expected_start, "gap or overlap at part {part}");
            assert!(start <= end && end <= len);
            if end != 0 && end != len {
                assert_eq!((addr + end) % SLICE_ALIGN, 0, "cut not on a page");
            }
            if len / parts > SLICE_ALIGN {
                assert!(end > start, "part {part} of {parts} empty for len {len}");
            }
            expected_start = end;
        }
        assert_eq!(expected_start, len, "parts do not reach the end");
    }
}

#[test]
fn threshold_decides_between_inline_and_split() {
    let pool = CopyPool::new(3);
    assert_eq!(pool.threads(), 3);
    assert_eq!(pool.parallel_threshold(), DEFAULT_PARALLEL_THRESHOLD);
    assert_eq!(pool.parts_for(DEFAULT_PARALLEL_THRESHOLD - 1), 1);
    assert_eq!(pool.parts_for(DEFAULT_PARALLEL_THRESHOLD), 3);
    pool.set_parallel_threshold(0);
    assert_eq!(pool.parts_for(1), 3);
    assert_eq!(pool.parts_for(0), 1);
    let pool = pool.with_parallel_threshold(100);
    assert_eq!(pool.parallel_threshold(), 100);
    assert_eq!(pool.parts_for(99), 1);
}

#[test]
fn parts_follow_the_part_size_within_bounds() {
    let pool = CopyPool::new(4).with_parallel_threshold(0);
    assert_eq!(pool.part_size(), DEFAULT_PART_SIZE);
    // At least one part per thread, about one per part size, at most 16 per thread.
    assert_eq!(pool.parts_for(4096), 4);
    assert_eq!(pool.parts_for(16 << 20), 8);
    assert_eq!(pool.parts_for((16 << 20) + 1), 9);
    assert_eq!(pool.parts_for(1 << 30), 4 * MAX_PARTS_PER_THREAD);
    pool.set_part_size(0);
    assert_eq!(pool.parts_for(1 << 30), 4, "0: one part per thread");
    let single = CopyPool::new(1).with_parallel_threshold(0);
    assert_eq!(single.parts_for(1 << 30), 1);
    // Many small parts still copy every byte exactly once.
    let pool = CopyPool::new(3)
        .with_part_size(8192)
        .with_parallel_threshold(0);
    let src: Vec<u8> = (0..(1 << 20) + 77).map(|i: u32| (i % 249) as u8).collect();
    let mut dst = vec![0u8; src.len() + 2];
    pool.write_slice(&mut dst[1..=src.len()], &src).unwrap();
    assert_eq!(&dst[1..=src.len()], &src[..]);
    assert_eq!((dst[0], dst[src.len() + 1]), (0, 0));
}

#[test]
fn host_copies_split_and_check_lengths() {
    let pool = CopyPool::new(4)
        .with_parallel_threshold(0)
        .with_part_size(4096);
    let src: Vec<u8> = (0..(3 << 20) + 5).map(|i: u32| (i * 13) as u8).collect();
    let mut dst = vec![0u8; src.len()];
    pool.copy(&mut dst, &src).unwrap();
    assert_eq!(dst, src);
    assert!(matches!(
        pool.copy(&mut dst[1..], &src),
        Err(CopyError::LengthMismatch { .. })
    ));
    pool.copy(&mut [], &[]).unwrap();
}

#[test]
fn absurd_thread_counts_are_errors_not_aborts() {
    for n in [MAX_THREADS + 1, 1 << 40, usize::MAX] {
        assert!(matches!(
            CopyPool::try_new(n),
            Err(CopyError::TooManyThreads { requested, max: MAX_THREADS }) if requested == n
        ));
    }
    let e = CopyPool::try_new(usize::MAX).unwrap_err();
    assert!(e.to_string().contains("exceeds the maximum of 1024"));
}

#[test]
fn global_thread_count_comes_from_the_environment_when_valid() {
    let default = thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    assert_eq!(pool::global_threads(None), default);
    assert_eq!(pool::global_threads(Some("12".into())), 12);
    assert_eq!(pool::global_threads(Some(" 3 ".into())), 3);
    for bad in ["0", "-1", "lots", "", "1025"] {
        assert_eq!(pool::global_threads(Some(bad.into())), default, "{bad:?}");
    }
}

#[test]
fn zeroed_vectors_are_fallible() {
    assert_eq!(try_zeroed_vec(0), Some(Vec::new()));
    let v = try_zeroed_vec(100_000).unwrap();
    assert!(v.len() == 100_000 && v.capacity() == 100_000 && v.iter().all(|&b| b == 0));
    // More than any allocator can give: `None`, not an abort.
    assert_eq!(try_zeroed_vec(usize::MAX), None);
    assert_eq!(try_zeroed_vec(1 << 62), None);
}

#[test]
fn zero_threads() {
    assert!(matches!(CopyPool::try_new(0), Err(CopyError::ZeroThreads)));
    let pool = CopyPool::new(0);
    assert_eq!(pool.threads(), 1);
    let src: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut dst = vec![0u8; src.len()];
    pool.write_slice(&mut dst, &src).unwrap();
    assert_eq!(dst, src);
}

#[test]
fn large_pool_copies_equal_plain_copies() {
    let mut rng = StdRng::seed_from_u64(1);
    let pool = CopyPool::new(4);
    // (length, mapping offset, host offset): odd lengths, offsets off every alignment.
    let cases = [
        ((1 << 20) + 1, 13, 0),
        ((3 << 20) + 4095, 4095, 7),
        ((16 << 20) - 3, 64, 1),
        ((64 << 20) - 7, 61, 33),
    ];
    for (len, moff, hoff) in cases {
        let src_buf = random_bytes(&mut rng, len + hoff);
        let src = &src_buf[hoff..];
        let mut mapping = vec![0xA5u8; len + moff + 64];
        pool.write_slice(&mut mapping[moff..moff + len], src)
            .unwrap();
        assert!(mapping[..moff].iter().all(|&b| b == 0xA5));
        assert!(mapping[moff + len..].iter().all(|&b| b == 0xA5));
        assert!(mapping[moff..moff + len] == *src, "write of {len} differs");

        let mut back_buf = vec![0x5Au8; len + hoff + 64];
        pool.read_slice(&mut back_buf[hoff..hoff + len], &mapping[moff..moff + len])
            .unwrap();
        assert!(back_buf[..hoff].iter().all(|&b| b == 0x5A));
        assert!(back_buf[hoff + len..].iter().all(|&b| b == 0x5A));
        assert!(back_buf[hoff..hoff + len] == *src, "read of {len} differs");
    }
}

#[test]
fn parts_run_concurrently_on_distinct_threads() {
    let pool = CopyPool::new(4);
    let barrier = Barrier::new(4);
    let ids = Mutex::new(HashSet::new());
    // Every part blocks until all four run at once: this completes only if the caller and the
    // three workers each run one part.
    pool.run_parts(4, &|_| {
        ids.lock().unwrap().insert(thread::current().id());
        barrier.wait();
    });
    let ids = ids.into_inner().unwrap();
    assert_eq!(ids.len(), 4);
    assert!(ids.contains(&thread::current().id()));
}

#[test]
fn every_part_runs_exactly_once() {
    let pool = CopyPool::new(3);
    for parts in [0, 1, 2, 3, 7, 64] {
        let counts: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
        pool.run_parts(parts, &|p| {
            counts[p].fetch_add(1, Ordering::Relaxed);
        });
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
    }
}

#[test]
fn a_panicking_part_is_resumed_on_the_caller_and_the_pool_survives() {
    let pool = CopyPool::new(3);
    for bad in [0, 2] {
        let ran = AtomicUsize::new(0);
        let result = panic::catch_unwind(AssertUnwindSafe(|| {
            pool.run_parts(6, &|p| {
                if p == bad {
                    panic!("part {p} failed");
                }
                ran.fetch_add(1, Ordering::Relaxed);
            });
        }));
        let payload = result.expect_err("the panic must reach the caller");
        assert_eq!(
            payload.downcast_ref::<String>().map(String::as_str),
            Some(format!("part {bad} failed").as_str())
        );
        assert_eq!(ran.load(Ordering::Relaxed), 5, "other parts still ran");
    }
    let src = vec![3u8; 2 << 20];
    let mut dst = vec![0u8; 2 << 20];
    pool.write_slice(&mut dst, &src).unwrap();
    assert_eq!(dst, src);
}

#[test]
fn many_callers_share_one_pool() {
    let pool = Arc::new(CopyPool::new(3).with_parallel_threshold(0));
    let callers: Vec<_> = (0..6u64)
        .map(|seed| {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(100 + seed);
                for _ in 0..25 {
                    let len = rng.gen_range(0..300_000);
                    let off = rng.gen_range(0..64);
                    let src = random_bytes(&mut rng, len);
                    let mut mapping = vec![0u8; len + off];
                    pool.write_slice(&mut mapping[off..], &src).unwrap();
                    assert!(mapping[off..] == src[..]);
                    let mut back = vec![0u8; len];
                    pool.read_slice(&mut back, &mapping[off..]).unwrap();
                    assert!(back == src);
                }
            })
        })
        .collect();
    for caller in callers {
        caller.join().unwrap();
    }
}

#[test]
fn drop_joins_the_workers() {
    let pool = CopyPool::new(4).with_parallel_threshold(0);
    let src = vec![9u8; 1 << 20];
    let mut dst = vec![0u8; 1 << 20];
    pool.write_slice(&mut dst, &src).unwrap();
    let shared = pool.shared_weak();
    assert_eq!(shared.strong_count(), 4, "handle + 3 workers");
    drop(pool);
    // Each worker holds a strong reference until its thread function returns, and `join`
    // returns only after that: no reference left means every worker has exited.
    assert_eq!(shared.strong_count(), 0);
}

#[test]
fn global_pool_is_shared_and_bounded() {
    let a = CopyPool::global();
    let b = CopyPool::global();
    assert!(std::ptr::eq(a, b));
    assert!((1..=8).contains(&a.threads()));
    let src: Vec<u8> = (0..(2 << 20) + 5).map(|i: u32| (i * 7) as u8).collect();
    let mut dst = vec![0u8; src.len()];
    a.write_slice(&mut dst, &src).unwrap();
    assert_eq!(dst, src);
}
