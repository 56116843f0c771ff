//! The mapping layer on a real NVIDIA GPU: CPU writes seen by CUDA, CUDA writes seen by the CPU, a
//! PTX kernel reading host-written data, both open paths, forced non-coherent mode, exhausting the
//! BAR. Ignored on machines without a GPU (they report "ignored", never "passed").

mod common;

use common::*;
use vkgdr::cuda_objects::Module;
use vkgdr::{Error, Gpu, Mapping, OpenOptions, SpareLimits};

fn words(size: u64, seed: u32) -> Vec<u32> {
    (0..size / 4).map(|i| pattern(i, seed)).collect()
}

fn round_trip_sizes(force_non_coherent: bool) {
    let gpu = open(force_non_coherent);
    assert_eq!(gpu.is_non_coherent(), force_non_coherent);
    for (k, size) in [4u64 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30]
        .into_iter()
        .enumerate()
    {
        let mut mem = gpu.alloc(size).unwrap();
        assert_eq!(mem.size(), size);
        // CPU writes -> cuMemcpyDtoH checks every word.
        let w = words(size, k as u32 * 7 + 1);
        mem.write_pod(0, &w).unwrap();
        let mut back = vec![0u8; size as usize];
        // SAFETY: the range is exactly `mem`, alive for the call.
        unsafe { gpu.memcpy_dtoh(&mut back, mem.device_ptr()).unwrap() };
        let back: &[u32] = bytemuck::cast_slice(&back);
        let bad = back.iter().zip(&w).filter(|(a, b)| a != b).count();
        assert_eq!(bad, 0, "{size} bytes: {bad} words differ after CPU write");
        // cuMemsetD32 -> the CPU reads every word through the mapping.
        let value = 0xC0DE_0000 | k as u32;
        // SAFETY: the range is exactly `mem`.
        unsafe {
            gpu.memset_d32(mem.device_ptr(), value, (size / 4) as usize)
                .unwrap()
        };
        let mut seen = vec![0u32; (size / 4) as usize];
        mem.read_pod(0, &mut seen).unwrap();
        let bad = seen.iter().filter(|&&v| v != value).count();
        assert_eq!(bad, 0, "{size} bytes: {bad} words differ after cuMemsetD32");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn sizes_4k_to_1g_round_trip_coherent() {
    round_trip_sizes(false);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn sizes_4k_to_1g_round_trip_forced_non_coherent() {
    round_trip_sizes(true);
}

fn kernel_reads_host_writes(force_non_coherent: bool) {
    let gpu = open(force_non_coherent);
    let module = Module::load_ptx(&gpu, MAPPING_PTX).unwrap();
    let n: u64 = 1 << 20;
    let mut input = gpu.alloc(n * 4).unwrap();
    let mut output = gpu.alloc(n * 4).unwrap();
    let mut errors = gpu.alloc(8).unwrap();
    let seed = 0x5EED;
    input.write_pod(0, &words(n * 4, seed)).unwrap();
    output.fill(0, n * 4, 0).unwrap();
    // Runs check_and_transform over the n words with `seed`; returns how many words it rejected.
    let check = |errors: &mut vkgdr::RawMemory, seed: u32| -> u64 {
        errors.write_pod(0, &[0u64]).unwrap();
        let (mut pin, mut pout, mut perr) =
            (input.device_ptr(), output.device_ptr(), errors.device_ptr());
        let (mut nn, mut s) = (n, seed);
        launch(
            &gpu,
            &module,
            "check_and_transform",
            256,
            256,
            &mut [
                arg(&mut pin),
                arg(&mut pout),
                arg(&mut nn),
                arg(&mut s),
                arg(&mut perr),
            ],
        );
        let mut e = [0u64];
        errors.read_pod(0, &mut e).unwrap();
        e[0]
    };
    let bad = check(&mut errors, seed);
    assert_eq!(bad, 0, "kernel saw {bad} wrong words");
    let mut out = vec![0u32; n as usize];
    output.read_pod(0, &mut out).unwrap();
    for (i, v) in out.iter().enumerate() {
        assert_eq!(
            *v,
            pattern(i as u64, seed).wrapping_mul(3).wrapping_add(1),
            "word {i}"
        );
    }
    // A wrong seed makes the kernel report every word: the check can fail.
    assert_eq!(check(&mut errors, seed ^ 1), n);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn ptx_kernel_reads_host_writes_coherent() {
    kernel_reads_host_writes(false);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn ptx_kernel_reads_host_writes_forced_non_coherent() {
    kernel_reads_host_writes(true);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn open_by_ordinal_and_by_current_context() {
    let gpu = Gpu::open(0).unwrap();
    // Unknown ordinals are the driver's answer, with its result name.
    for bad in [99, -1] {
        let e = Gpu::open(bad).unwrap_err();
        assert_eq!(e.result_name(), Some("CUDA_ERROR_INVALID_DEVICE"), "{e}");
    }
    // No context current on a fresh thread: the driver's CUDA_ERROR_INVALID_CONTEXT.
    std::thread::spawn(|| {
        let e = Gpu::open_current_context(OpenOptions::new()).unwrap_err();
        assert_eq!(e.result_name(), Some("CUDA_ERROR_INVALID_CONTEXT"), "{e}");
    })
    .join()
    .unwrap();
    let by_ctx = {
        let _bound = gpu.bind().unwrap();
        Gpu::open_current_context(OpenOptions::new()).unwrap()
    };
    assert_eq!(by_ctx.cu_context().unwrap(), gpu.cu_context().unwrap());
    assert_eq!(by_ctx.uuid(), gpu.uuid());
    // Memory from one handle is usable by the other's kernels (same context).
    let mut mem = by_ctx.alloc(4096).unwrap();
    mem.write(0, b"current context").unwrap();
    let mut back = [0u8; 15];
    // SAFETY: inside `mem`.
    unsafe { gpu.memcpy_dtoh(&mut back, mem.device_ptr()).unwrap() };
    assert_eq!(&back, b"current context");
    drop(gpu);
    // The handle opened on the current context retained the primary context: still usable.
    let mut mem2 = by_ctx.alloc(4096).unwrap();
    mem2.write(0, &[1, 2, 3]).unwrap();
    let unchecked = {
        let _bound = by_ctx.bind().unwrap();
        // SAFETY: the context is the primary context retained by `by_ctx`, which outlives this.
        unsafe { Gpu::open_current_context_unchecked(OpenOptions::new()).unwrap() }
    };
    assert_eq!(
        unchecked.cu_context().unwrap(),
        by_ctx.cu_context().unwrap()
    );
    drop(unchecked);
    drop(mem);
    drop(mem2);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn bad_inputs_on_the_gpu() {
    let gpu = Gpu::open(0).unwrap();
    assert!(matches!(gpu.alloc(0), Err(Error::InvalidArgument(_))));
    let e = gpu.alloc(1_000_000_000_000_000).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let mut mem = gpu.alloc(4096).unwrap();
    assert!(matches!(
        mem.write(4096, &[1]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(mem.flush(1, 4096), Err(Error::InvalidArgument(_))));
    // Still usable.
    mem.write(4095, &[9]).unwrap();
    assert_eq!(mem.read_vec(4095, 1).unwrap(), vec![9]);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn one_handle_shared_by_threads() {
    let gpu = Gpu::open(0).unwrap();
    std::thread::scope(|s| {
        for t in 0..8u32 {
            let gpu = &gpu;
            s.spawn(move || {
                for i in 0..20u32 {
                    let mut mem = gpu.alloc(64 << 10).unwrap();
                    let w = words(64 << 10, t * 1000 + i);
                    mem.write_pod(0, &w).unwrap();
                    let mut back = vec![0u8; 64 << 10];
                    // SAFETY: inside `mem`.
                    unsafe { gpu.memcpy_dtoh(&mut back, mem.device_ptr()).unwrap() };
                    assert_eq!(bytemuck::cast_slice::<u8, u32>(&back), &w[..]);
                }
            });
        }
    });
}

/// vkgdr 0.1's model: a handle that owns no context, allocations imported into whatever context
/// is current (the C and Python tests cover `cuCtxCreate` contexts), sizes as asked for, and
/// memory that frees itself from a thread with no context current.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn allocations_in_the_current_context() {
    let owner = Gpu::open(0).unwrap();
    let lazy = Gpu::open_cu_device(owner.cu_device(), OpenOptions::new()).unwrap();
    // No context current here: the driver's answer, and nothing retained.
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: fails before anything is imported.
            let e = unsafe { lazy.alloc_in_current_context(4097) }.unwrap_err();
            assert_eq!(e.result_name(), Some("CUDA_ERROR_INVALID_CONTEXT"), "{e}");
        });
    });
    let mut mem = {
        let _bound = owner.bind().unwrap();
        // SAFETY: the primary context is retained by `owner`, which outlives `mem`.
        unsafe { lazy.alloc_in_current_context(4097) }.unwrap()
    };
    assert_eq!(mem.size(), 4097);
    assert_eq!(mem.len(), 4097);
    assert!(mem.allocation_size() >= 4097);
    assert!(matches!(
        mem.write(4097, &[1]),
        Err(Error::InvalidArgument(_))
    ));
    mem.write(4090, b"current").unwrap();
    mem.flush(0, 4097).unwrap();
    let mut back = [0u8; 7];
    // SAFETY: inside `mem`.
    unsafe {
        owner
            .memcpy_dtoh(&mut back, mem.device_ptr() + 4090)
            .unwrap()
    };
    assert_eq!(&back, b"current");
    // Freed from a thread with no context current: it makes its own context current again.
    std::thread::spawn(move || drop(mem)).join().unwrap();
}

/// The size of the Vulkan heap the handle's BAR allocations come from.
fn bar_heap(gpu: &Gpu) -> u64 {
    let vulkan = gpu.vulkan();
    vulkan.device_info().heap_size(vulkan.memory_type())
}

/// The spare mappings a handle holds now: (count, bytes).
fn spares(gpu: &Gpu) -> (u64, u64) {
    let item = gpu.retained();
    let item = item
        .get(vkgdr::retained::names::SPARE_MAPPINGS)
        .expect("listed");
    (item.count, item.bytes)
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn a_freed_mapping_comes_back_for_its_own_size_only_and_never_once_exported() {
    let gpu = open(false);
    settle(&gpu);
    gpu.trim();
    assert_eq!(spares(&gpu), (0, 0));
    let mut first = gpu.alloc(2 << 20).unwrap();
    let at = first.device_ptr();
    first.write(0, b"first owner").unwrap();
    drop(first);
    settle(&gpu);
    assert_eq!(spares(&gpu), (1, 2 << 20), "kept once its release passed");
    // Another size maps memory of its own.
    let other = gpu.alloc(4 << 20).unwrap();
    assert_ne!(other.device_ptr(), at);
    assert_eq!(spares(&gpu).0, 1);
    // Its own size takes it, its first 16 bytes zero as in any new allocation.
    let again = gpu.alloc(2 << 20).unwrap();
    assert_eq!(again.device_ptr(), at, "the spare was not reused");
    assert_eq!(again.read_vec(0, 11).unwrap(), vec![0u8; 11]);
    assert_eq!(spares(&gpu), (0, 0));
    // An exported mapping may still be mapped in another process: never handed out again.
    drop(again.export_fd().unwrap());
    drop(again);
    drop(other);
    settle(&gpu);
    assert_eq!(spares(&gpu), (1, 4 << 20), "only the unexported one kept");
    // Above the handle's limit nothing is kept.
    let limits = gpu.spare_limits();
    assert_eq!(limits, SpareLimits::for_heap(bar_heap(&gpu)));
    drop(gpu.alloc(limits.each + 4096).unwrap());
    settle(&gpu);
    assert_eq!(spares(&gpu), (1, 4 << 20));
    assert!(gpu.trim() >= 1);
    assert_eq!(spares(&gpu), (0, 0), "trim gives the spares back");
    let mut fresh = gpu.alloc(4 << 20).unwrap();
    fresh.write(0, b"still works").unwrap();
    assert_eq!(fresh.read_vec(0, 11).unwrap(), b"still works");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn new_spare_limits_give_back_what_they_no_longer_hold() {
    const MIB: u64 = 1 << 20;
    let limits = |each, total| SpareLimits { each, total };
    let none = Gpu::open_with(0, OpenOptions::new().spare_limits(SpareLimits::NONE)).unwrap();
    assert_eq!(none.spare_limits(), SpareLimits::NONE);
    drop(none.alloc(4 * MIB).unwrap());
    settle(&none);
    assert_eq!(spares(&none), (0, 0), "no limits keep nothing");

    let gpu = open(false);
    settle(&gpu);
    gpu.trim();
    assert_eq!(gpu.set_spare_limits(limits(8 * MIB, 16 * MIB)), 0);
    drop(gpu.alloc(4 * MIB).unwrap());
    drop(gpu.alloc(8 * MIB).unwrap());
    drop(gpu.alloc(8 * MIB + 4096).unwrap());
    settle(&gpu);
    assert_eq!(spares(&gpu), (2, 12 * MIB), "the two within the limits");
    // Larger than a spare may now be goes back at once; the rest stays and is taken.
    assert_eq!(gpu.set_spare_limits(limits(6 * MIB, 16 * MIB)), 1);
    assert_eq!(spares(&gpu), (1, 4 * MIB));
    let mut again = gpu.alloc(4 * MIB).unwrap();
    assert_eq!(spares(&gpu), (0, 0), "the kept mapping was taken");
    again.write(0, b"kept").unwrap();
    assert_eq!(again.read_vec(0, 4).unwrap(), b"kept");
    drop(again);
    settle(&gpu);
    assert_eq!(gpu.set_spare_limits(SpareLimits::NONE), 1);
    assert_eq!(spares(&gpu), (0, 0));
}
