//! Writes into GPU memory from the CPU and proves it arrived with `cuMemcpyDtoH`.
//!
//! Run on a machine with an NVIDIA GPU: `cargo run --release --example hello`.

use std::process::ExitCode;
use std::time::Instant;

use vkgdr::{Gpu, Mapping};

fn main() -> ExitCode {
    // Print the error's message (it names the driver result and the fix), not its Debug form.
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hello: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> vkgdr::Result<()> {
    let t = Instant::now();
    let gpu = Gpu::open(0)?;
    println!("opened {} in {:?}: {:?}", gpu.name(), t.elapsed(), gpu);

    let t = Instant::now();
    let mut mem = gpu.alloc(1 << 20)?;
    println!(
        "allocated {} bytes in {:?}: host {:p}, device {:#x}, coherent {}",
        mem.size(),
        t.elapsed(),
        mem.host_ptr(),
        mem.device_ptr(),
        mem.is_coherent()
    );

    let message = b"hello from the CPU, through the BAR";
    let t = Instant::now();
    mem.write(0, message)?;
    println!("wrote {} bytes in {:?}", message.len(), t.elapsed());

    let mut back = vec![0u8; message.len()];
    // SAFETY: the range is inside `mem`, which outlives the call.
    unsafe { gpu.memcpy_dtoh(&mut back, mem.device_ptr())? };
    println!(
        "cuMemcpyDtoH read back: {:?}",
        String::from_utf8_lossy(&back)
    );
    assert_eq!(&back, message);
    Ok(())
}
