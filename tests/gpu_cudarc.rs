//! cudarc interop on the GPU: a `Gpu` in cudarc's context (and cudarc's context of a `Gpu`), pool
//! blocks and raw memory as views in cudarc kernel launches and copies, flushes ordered before the
//! GPU work in forced non-coherent mode, and a ring's device view as a cudarc kernel argument.

#![cfg(feature = "cudarc")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use vkgdr::cudarc::CudarcMemory;
use vkgdr::ring::layout::{self, seal_test_payload};
use vkgdr::ring::DeviceRing;
use vkgdr::{Gpu, Mapping, OpenOptions, Pool, PoolConfig};

const RING_PTX: &str = include_str!("../kernels/ring.ptx");

/// Stops the persistent consumer and waits for it, whatever happens.
struct StopOnDrop<'a>(&'a DeviceRing, &'a CudaStream);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop();
        let _ = self.1.synchronize();
    }
}

fn cudarc_gpu(force_non_coherent: bool) -> (Arc<CudaContext>, Arc<CudaStream>, Gpu) {
    let ctx = CudaContext::new(0).expect("cudarc context");
    let stream = ctx.new_stream().expect("cudarc stream");
    let gpu = Gpu::from_cudarc(
        &ctx,
        OpenOptions::new().force_non_coherent(force_non_coherent),
    )
    .expect("Gpu::from_cudarc");
    (ctx, stream, gpu)
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn one_context_both_ways() {
    let (ctx, _stream, gpu) = cudarc_gpu(false);
    assert_eq!(gpu.cu_context().unwrap(), ctx.cu_ctx().cast());
    assert_eq!(gpu.cu_device(), ctx.cu_device());
    // The Gpu keeps cudarc's context alive: it still allocates and copies after the Arc is gone.
    drop(ctx);
    let mut mem = gpu.alloc(4096).unwrap();
    mem.write(0, b"still alive").unwrap();
    let mut back = [0u8; 11];
    // SAFETY: the range is inside `mem`, alive for the call.
    unsafe { gpu.memcpy_dtoh(&mut back, mem.device_ptr()).unwrap() };
    assert_eq!(&back, b"still alive");

    // The other way: the cudarc context of a Gpu on the primary context is that context.
    let primary = Gpu::open(0).unwrap();
    let ctx = primary.to_cudarc().unwrap();
    assert_eq!(ctx.cu_ctx().cast(), primary.cu_context().unwrap());
}

/// Runs `check_and_transform(input, output, n, seed, errors)` through cudarc on the views' stream
/// and returns the kernel's error count.
fn check_and_transform<I: CudarcMemory, O: CudarcMemory>(
    stream: &Arc<CudaStream>,
    check: &CudaFunction,
    input: &I,
    output: &mut O,
    seed: u32,
    errors: &mut CudaSlice<u64>,
) -> u64 {
    let n = (input.len() / 4).min(output.len() / 4);
    {
        let in_view = input.cuda_view::<u32>(stream).unwrap();
        let mut out_view = output.cuda_view_mut::<u32>(stream).unwrap();
        stream.memset_zeros(errors).unwrap();
        let mut launch = stream.launch_builder(check);
        launch
            .arg(&in_view)
            .arg(&mut out_view)
            .arg(&n)
            .arg(&seed)
            .arg(&mut *errors);
        // SAFETY: check_and_transform(const u32*, u32*, u64, u32, u64*): these arguments in
        // order; both views cover n words and outlive the kernel (they wait on drop).
        unsafe {
            launch
                .launch(LaunchConfig::for_num_elems(n as u32))
                .unwrap()
        };
    }
    stream.clone_dtoh(errors).unwrap()[0]
}

/// A cudarc kernel checks a block and a raw allocation the CPU wrote and writes results into a
/// block; cudarc copies read them too.
fn kernel_reads_what_the_cpu_wrote(force_non_coherent: bool) {
    let (ctx, stream, gpu) = cudarc_gpu(force_non_coherent);
    let module = ctx.load_module(Ptx::from_src(MAPPING_PTX)).unwrap();
    let check = module.load_function("check_and_transform").unwrap();
    let pool = Pool::new(gpu.clone(), PoolConfig::default()).unwrap();
    let n = 50_000u64;
    let seed = 0xC0DA_u32;
    let words: Vec<u32> = (0..n).map(|i| pattern(i, seed)).collect();
    let mut block = pool.alloc(4 * n, 256).unwrap();
    let mut raw = gpu.alloc(4 * n).unwrap();
    let mut out = pool.alloc(4 * n, 256).unwrap();
    block.write_pod(0, &words).unwrap();
    raw.write_pod(0, &words).unwrap();
    if force_non_coherent {
        assert!(block.has_pending_writes(), "safe writes wait for a flush");
    }
    let mut errors = stream.alloc_zeros::<u64>(1).unwrap();
    for name in ["block", "raw"] {
        let t = Instant::now();
        let bad = if name == "block" {
            check_and_transform(&stream, &check, &block, &mut out, seed, &mut errors)
        } else {
            check_and_transform(&stream, &check, &raw, &mut out, seed, &mut errors)
        };
        println!(
            "cudarc kernel on {name} (non-coherent {force_non_coherent}): {n} words in {:?}, {bad} wrong",
            t.elapsed()
        );
        assert_eq!(bad, 0, "{name}: the kernel saw words the CPU did not write");
        // A cudarc copy reads the BAR memory through a view as well.
        let copied = if name == "block" {
            stream.clone_dtoh(&block.cuda_view::<u32>(&stream).unwrap())
        } else {
            stream.clone_dtoh(&raw.cuda_view::<u32>(&stream).unwrap())
        };
        assert_eq!(copied.unwrap(), words, "{name}: cudarc's copy");
        let mut back = vec![0u32; n as usize];
        out.read_pod(0, &mut back).unwrap();
        for (i, (&b, &w)) in back.iter().zip(&words).enumerate() {
            assert_eq!(
                b,
                w.wrapping_mul(3).wrapping_add(1),
                "{name}: result word {i}"
            );
        }
        out.fill(0, 4 * n, 0).unwrap();
    }
    if force_non_coherent {
        assert!(!block.has_pending_writes(), "the view flushed the block");
    }
    // The check can fail: a word the kernel does not expect is counted.
    block.write_pod(4 * 777, &[!words[777]]).unwrap();
    let bad = check_and_transform(&stream, &check, &block, &mut out, seed, &mut errors);
    assert_eq!(bad, 1);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn cudarc_kernel_reads_blocks_and_raw_memory() {
    kernel_reads_what_the_cpu_wrote(false);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn cudarc_kernel_reads_blocks_and_raw_memory_forced_non_coherent() {
    kernel_reads_what_the_cpu_wrote(true);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn cudarc_copies_into_a_writable_view() {
    let (_ctx, stream, gpu) = cudarc_gpu(true);
    let pool = Pool::new(gpu, PoolConfig::default()).unwrap();
    let mut block = pool.alloc(4096, 64).unwrap();
    block.fill(0, 4096, 0xEE).unwrap();
    let values: Vec<u64> = (0..512).map(|i| i * 0x0101_0101).collect();
    {
        let mut view = block.cuda_view_mut::<u64>(&stream).unwrap();
        assert_eq!(view.len(), 512);
        stream.memcpy_htod(&values, &mut view).unwrap();
        view.finish().unwrap();
    }
    // The view waited for the copy; the read invalidates first.
    let mut back = vec![0u64; 512];
    block.read_pod(0, &mut back).unwrap();
    assert_eq!(back, values);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn cudarc_launches_a_ring_consumer_with_the_ring_view() {
    let (ctx, stream, gpu) = cudarc_gpu(false);
    let module = ctx.load_module(Ptx::from_src(RING_PTX)).unwrap();
    let consumer = module.load_function("ring_consume_persistent").unwrap();
    let ring = DeviceRing::new(&gpu, 1 << 16).unwrap();
    // If an assertion fails below, still stop the kernel before the ring is freed under it.
    let _stop = StopOnDrop(&ring, &stream);
    let view = ring.device_view();
    let mut launch = stream.launch_builder(&consumer);
    launch.arg(&view);
    // SAFETY: ring_consume_persistent takes (data, capacity, tail, stop, head_out, result), the
    // six words `&RingDeviceView` pushes; the ring outlives the kernel (stopped and synchronised
    // below before it drops).
    unsafe {
        launch
            .launch(LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (vkgdr::ring::layout::CHECK_THREADS, 1, 1),
                shared_mem_bytes: 0,
            })
            .unwrap()
    };
    let records = 20_000u64;
    let mut sum = 0u64;
    let mut body = vec![0u8; 256];
    for i in 0..records {
        let len = 16 + (i % 240) as usize;
        let mut r = ring
            .reserve(len as u32, Some(Duration::from_secs(30)))
            .unwrap();
        body[16..len].fill(i as u8);
        sum = sum.wrapping_add(seal_test_payload(&mut body[..len], r.seq()).unwrap());
        r.write(0, &body[..len]).unwrap();
        r.commit();
    }
    ring.stop();
    stream.synchronize().unwrap();
    let res = ring.results();
    println!(
        "cudarc-launched ring consumer: {} records, {} errors",
        res[layout::RESULT_RECORDS],
        res[layout::RESULT_ERRORS]
    );
    assert_eq!(res[layout::RESULT_ERRORS], 0);
    assert_eq!(res[layout::RESULT_RECORDS], records);
    assert_eq!(res[layout::RESULT_CHECKSUM_SUM], sum);
}
