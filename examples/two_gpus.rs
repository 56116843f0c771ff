//! Opens every CUDA device (by ordinal and by UUID), shows which Vulkan device each was matched to
//! by UUID and its BAR figures, and proves that writes through one device's mapping never show up
//! in another's memory.
//!
//! On a one-GPU machine it says so and checks the single device. Run: `cargo run --example two_gpus`.

use vkgdr::{Gpu, Mapping};

fn main() -> std::process::ExitCode {
    // Print the error's message (it names the driver result and the fix), not its Debug form.
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("two_gpus: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> vkgdr::Result<()> {
    let driver = vkgdr::cuda::Driver::get()?;
    let n = driver.device_count()?;
    println!("{n} CUDA device(s)");
    let mut gpus = Vec::new();
    for i in 0..n {
        let gpu = Gpu::open(i)?;
        let v = gpu.vulkan().device_info();
        println!(
            "  CUDA {i}: {} uuid {} -> Vulkan [{}] {} uuid {}",
            gpu.name(),
            vkgdr::vulkan::format_uuid(&gpu.uuid()),
            v.index,
            v.name,
            v.uuid_string()
        );
        assert_eq!(gpu.uuid(), v.uuid, "matched by UUID");
        // The same device by its UUID, as `nvidia-smi -L` prints it.
        let uuid = format!("GPU-{}", vkgdr::vulkan::format_uuid(&gpu.uuid()));
        assert_eq!(Gpu::open_uuid(&uuid)?.cu_device(), gpu.cu_device());
        let bar = gpu.bar_info()?;
        for line in bar.to_string().lines() {
            println!("      {line}");
        }
        gpus.push(gpu);
    }
    let size = 1u64 << 20;
    let mut mems = Vec::new();
    for (i, gpu) in gpus.iter().enumerate() {
        let mut m = gpu.alloc(size)?;
        m.fill(0, size, 0xA0 + i as u8)?;
        mems.push(m);
    }
    // Each device's memory holds only its own pattern, read back by that device's copy engine.
    for (i, (gpu, m)) in gpus.iter().zip(&mems).enumerate() {
        let mut back = vec![0u8; size as usize];
        // SAFETY: the range is exactly `m`, alive for the call, on `gpu`'s context.
        unsafe { gpu.memcpy_dtoh(&mut back, m.device_ptr())? };
        let expect = 0xA0 + i as u8;
        let wrong = back.iter().filter(|&&b| b != expect).count();
        println!("  device {i}: {wrong} bytes differ from its own pattern {expect:#x}");
        assert_eq!(wrong, 0, "device {i} sees bytes it did not write");
    }
    if gpus.len() > 1 {
        // Distinct devices own distinct memory: the device pointers may even coincide, the bytes not.
        mems[0].fill(0, size, 0x11)?;
        let mut back = vec![0u8; size as usize];
        // SAFETY: as above, on device 1.
        unsafe { gpus[1].memcpy_dtoh(&mut back, mems[1].device_ptr())? };
        assert!(
            back.iter().all(|&b| b == 0xA1),
            "a write to device 0 showed up on device 1"
        );
        println!("  a rewrite of device 0's memory left device 1's untouched");
    } else {
        println!("  only one GPU here: the cross-device check needs two");
    }
    Ok(())
}
