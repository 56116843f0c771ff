//! vkgdr with cudarc: the CPU writes pool blocks through the BAR, a kernel launched through cudarc
//! (in the same context, on a cudarc stream) reads them and writes its results into another
//! block, and the CPU checks them.
//!
//! Run on a machine with an NVIDIA GPU: `cargo run --release --features cudarc --example cudarc`.

use std::process::ExitCode;
use std::time::Instant;

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use vkgdr::cudarc::CudarcMemory;
use vkgdr::{Gpu, Mapping, OpenOptions, Pool, PoolConfig};

/// kernels/mapping.cu, compiled to PTX (no NVRTC or nvcc needed at run time).
const MAPPING_PTX: &str = include_str!("../kernels/mapping.ptx");

/// The word the kernel expects at index `i` (`pattern` in kernels/mapping.cu).
fn pattern(i: u64, seed: u32) -> u32 {
    (i.wrapping_mul(2654435761) as u32) ^ seed
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    // vkgdr's loader first: without the driver it says so, where cudarc would panic.
    vkgdr::cuda::Driver::get()?;
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    let gpu = Gpu::from_cudarc(&ctx, OpenOptions::default())?;
    assert_eq!(gpu.cu_context()?, ctx.cu_ctx().cast(), "one context");
    println!("{} in cudarc's context {:p}", gpu.name(), ctx.cu_ctx());

    let pool = Pool::new(gpu.clone(), PoolConfig::default())?;
    let n: u64 = 1 << 16;
    let seed = 0x5eed_u32;
    let mut input = pool.alloc(4 * n, 256)?;
    let mut output = pool.alloc(4 * n, 256)?;
    let words: Vec<u32> = (0..n).map(|i| pattern(i, seed)).collect();
    let t = Instant::now();
    input.write_pod(0, &words)?;
    println!(
        "CPU wrote {} KiB through the BAR in {:?}",
        (4 * n) >> 10,
        t.elapsed()
    );

    let module = ctx.load_module(Ptx::from_src(MAPPING_PTX))?;
    let check = module.load_function("check_and_transform")?;
    let mut errors = stream.alloc_zeros::<u64>(1)?; // cudarc's own device memory, side by side
    let t = Instant::now();
    {
        let in_view = input.cuda_view::<u32>(&stream)?; // flushes the CPU's writes
        let mut out_view = output.cuda_view_mut::<u32>(&stream)?;
        let mut launch = stream.launch_builder(&check);
        launch
            .arg(&in_view)
            .arg(&mut out_view)
            .arg(&n)
            .arg(&seed)
            .arg(&mut errors);
        // SAFETY: check_and_transform(const u32*, u32*, u64, u32, u64*) gets exactly these
        // arguments; both views cover n words and wait for the stream when they drop, so the
        // blocks outlive the kernel.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n as u32))? };
        // The views drop here: the stream has finished with the blocks.
    }
    let bad = stream.clone_dtoh(&errors)?[0];
    println!(
        "cudarc kernel checked {n} words in {:?}: {bad} differ from what the CPU wrote",
        t.elapsed()
    );
    if bad != 0 {
        return Err(format!("the kernel saw {bad} wrong words").into());
    }
    let mut back = vec![0u32; n as usize];
    output.read_pod(0, &mut back)?;
    let wrong = (0..n as usize)
        .filter(|&i| back[i] != words[i].wrapping_mul(3).wrapping_add(1))
        .count();
    println!("CPU read the kernel's results back through the BAR: {wrong} wrong");
    if wrong != 0 {
        return Err(format!("{wrong} results differ").into());
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
