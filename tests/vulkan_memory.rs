//! The Vulkan half on a real driver (lavapipe on CI, NVIDIA on the GPU machine): exportable
//! allocations, fds, map/write/read round trips, flush/invalidate, bad inputs, no leaks.

use vkgdr::range::RangeError;
use vkgdr::vulkan::{DeviceSelector, MemoryOptions, VulkanContext};
use vkgdr::{Error, InvalidArgument, Mapping};

mod common;
use common::vulkan_context as context;

#[test]
fn exports_allocations_of_several_sizes() {
    let ctx = context(MemoryOptions::default());
    for size in [1u64, 4096, 4097, 65536, 1 << 20, 16 << 20, 64 << 20] {
        let mem = ctx.allocate(size).unwrap();
        assert!(
            mem.size() >= size && mem.size() % 4096 == 0,
            "size {size} -> {}",
            mem.size()
        );
        let fd = mem.export_fd().unwrap();
        use std::os::fd::AsRawFd;
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert!(
            !link.as_os_str().is_empty(),
            "exported fd {} is not open",
            fd.as_raw_fd()
        );
    }
}

#[test]
fn write_read_round_trip() {
    for force in [false, true] {
        let ctx = context(MemoryOptions {
            force_non_coherent: force,
            ..Default::default()
        });
        assert_eq!(
            ctx.is_non_coherent(),
            force || !ctx.memory_type().is_coherent()
        );
        let mut mem = ctx.allocate(1 << 20).unwrap();
        let data: Vec<u8> = (0..(1u32 << 20))
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        mem.write(0, &data).unwrap();
        assert_eq!(mem.read_vec(0, data.len()).unwrap(), data);
        // Unaligned sub-ranges.
        mem.write(12345, b"hello").unwrap();
        assert_eq!(mem.read_vec(12340, 15).unwrap()[5..10], *b"hello");
        let words: Vec<u32> = (0..1000).collect();
        mem.write_pod(4096, &words).unwrap();
        let mut back = vec![0u32; 1000];
        mem.read_pod(4096, &mut back).unwrap();
        assert_eq!(back, words);
        mem.fill(0, 64, 0xAB).unwrap();
        assert!(mem.read_vec(0, 64).unwrap().iter().all(|&b| b == 0xAB));
        // Raw-pointer users flush and invalidate themselves; odd ranges are rounded internally.
        mem.flush(3, 70).unwrap();
        mem.invalidate(mem.size() - 1, 1).unwrap();
        mem.flush(0, mem.size()).unwrap();
    }
}

#[test]
fn bad_inputs_give_their_errors() {
    let ctx = context(MemoryOptions::default());
    assert!(matches!(ctx.allocate(0), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        ctx.allocate(u64::MAX),
        Err(Error::InvalidArgument(_))
    ));
    // 10^15 bytes: larger than any device; an out-of-memory error, not a crash.
    match ctx.allocate(1_000_000_000_000_000) {
        Err(e) => assert!(e.is_out_of_memory(), "{e}"),
        Ok(_) => panic!("a petabyte allocation succeeded"),
    }
    let mut mem = ctx.allocate(4096).unwrap();
    assert!(matches!(
        mem.write(4090, &[0; 7]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        mem.write(u64::MAX, &[0; 2]),
        Err(Error::InvalidArgument(_))
    ));
    let mut buf = [0u8; 2];
    assert!(matches!(
        mem.read(4095, &mut buf),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(mem.flush(0, 4097), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        mem.invalidate(4096, 1),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        mem.write_pod(1, &[1u32]),
        Err(Error::InvalidArgument(_))
    ));
    // The allocation is still intact after the rejected calls.
    mem.write(4090, &[7; 6]).unwrap();
    assert_eq!(mem.read_vec(4090, 6).unwrap(), vec![7; 6]);
}

/// The batched flush and invalidate are public and safe, so every range is checked
/// (with checked maths) before any reaches `vkFlushMappedMemoryRanges`; one bad range fails the
/// whole batch, in coherent and forced non-coherent mode alike.
#[test]
fn batched_flush_and_invalidate_check_every_range() {
    for force in [false, true] {
        let ctx = context(MemoryOptions {
            force_non_coherent: force,
            ..Default::default()
        });
        let mem = ctx.allocate(8192).unwrap();
        let good = [(0u64, 1u64), (100, 28), (8191, 1), (4096, 0)];
        mem.flush_ranges(good.iter().copied()).unwrap();
        mem.invalidate_ranges(good.iter().copied()).unwrap();
        for bad in [
            (8192, 1),
            (0, 8193),
            (u64::MAX, 2),
            (1, u64::MAX),
            (9000, 0),
        ] {
            let batch = [(0, 64), bad];
            for result in [
                mem.flush_ranges(batch.iter().copied()),
                mem.invalidate_ranges(batch.iter().copied()),
            ] {
                match result {
                    Err(Error::InvalidArgument(InvalidArgument::Range(
                        RangeError::OutOfBounds { offset, len, size },
                    ))) => assert_eq!((offset, len, size), (bad.0, bad.1, 8192)),
                    other => panic!("force {force}, range {bad:?}: {other:?}"),
                }
            }
        }
    }
}

#[test]
fn require_coherent_and_selectors() {
    let ctx = context(MemoryOptions {
        require_coherent: true,
        ..Default::default()
    });
    assert!(ctx.memory_type().is_coherent());
    let uuid = ctx.device_info().uuid;
    let again = VulkanContext::new(DeviceSelector::Uuid(uuid), MemoryOptions::default()).unwrap();
    assert_eq!(again.device_info().uuid, uuid);
    match VulkanContext::new(DeviceSelector::Uuid([0xEE; 16]), MemoryOptions::default()) {
        Err(Error::NoMatchingDevice(msg)) => assert!(msg.contains("present"), "{msg}"),
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        VulkanContext::new(DeviceSelector::Index(1_000), MemoryOptions::default()),
        Err(Error::NoMatchingDevice(_))
    ));
}

#[test]
fn memory_is_shared_across_threads() {
    let ctx = context(MemoryOptions::default());
    let handles: Vec<_> = (0..4u8)
        .map(|t| {
            let ctx = ctx.clone();
            std::thread::spawn(move || {
                for _ in 0..50 {
                    let mut m = ctx.allocate(8192).unwrap();
                    m.fill(0, 8192, t).unwrap();
                    assert!(m.read_vec(0, 8192).unwrap().iter().all(|&b| b == t));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn missing_cuda_is_an_error_value() {
    // On CI there is no libcuda: the error must be LibraryNotFound, never a panic. On the GPU
    // machine the driver loads.
    match vkgdr::cuda::Driver::get() {
        Ok(d) => assert!(d.version().unwrap() > 0),
        Err(Error::LibraryNotFound { name, .. }) => assert_eq!(name, "libcuda.so.1"),
        Err(e) => panic!("unexpected error {e}"),
    }
    if vkgdr::cuda::Driver::get().is_err() {
        assert!(matches!(
            vkgdr::Gpu::open(0),
            Err(Error::LibraryNotFound { .. })
        ));
    }
}

/// One process opens and drops many contexts one after another (a test suite, a Python program
/// making pools): NVIDIA's driver failed `vkCreateInstance` after about 30 such cycles until the
/// contexts shared one instance for the process (on lavapipe this only checks the cycles work).
#[test]
fn a_process_opens_and_drops_a_hundred_contexts() {
    for i in 0..100 {
        let ctx = common::vulkan(i % 2 == 1);
        let mut mem = ctx
            .allocate(4096)
            .unwrap_or_else(|e| panic!("context {i}: {e}"));
        vkgdr::Mapping::write(&mut mem, 0, &[i as u8; 64]).unwrap();
        assert_eq!(
            vkgdr::Mapping::read_vec(&mem, 0, 64).unwrap(),
            [i as u8; 64]
        );
        drop(mem.export_fd().unwrap());
    }
}
