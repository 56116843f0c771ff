//! Two GPUs (the two-H200 machine): each device opened by ordinal and by UUID, a pool per device
//! with a BAR budget, blocks of each checked by a kernel on its own device, isolation (rewriting
//! one device's blocks never shows on the other), and the BAR figures of both.
//!
//! On a machine with one GPU this test cannot run: `cargo test` reports it ignored with the reason,
//! and `scripts/gpu-check run` skips it by name (`--skip two_gpus`) and says so.

mod common;

use common::*;
use vkgdr::cuda::Driver;
use vkgdr::cuda_objects::Module;
use vkgdr::vulkan::format_uuid;
use vkgdr::{Block, Gpu, Mapping, Pool, PoolConfig};

const BLOCKS: usize = 2000;

/// One device's side: its pool, its module, its tagged blocks and the kernel's argument blocks.
struct Side {
    gpu: Gpu,
    module: Module,
    pool: Pool,
    blocks: Vec<Block>,
    ptrs: Block,
    lens: Block,
    tags: Block,
    bad: Block,
}

impl Side {
    fn new(gpu: Gpu) -> Side {
        let module = Module::load_ptx(&gpu, MAPPING_PTX).expect("load PTX");
        let config = PoolConfig::default()
            .with_bar_budget(&gpu, 0.5)
            .expect("a budget of half the estimate");
        assert!(config.max_bytes > 64 << 20, "budget {}", config.max_bytes);
        let pool = Pool::new(gpu.clone(), config).expect("pool");
        let n = BLOCKS as u64;
        let ptrs = pool.alloc(8 * n, 8).unwrap();
        let lens = pool.alloc(4 * n, 4).unwrap();
        let tags = pool.alloc(4 * n, 4).unwrap();
        let bad = pool.alloc(8, 8).unwrap();
        let blocks = (0..BLOCKS)
            .map(|k| pool.alloc(1 + (k as u64 * 37) % 200, 8).unwrap())
            .collect();
        Side {
            gpu,
            module,
            pool,
            blocks,
            ptrs,
            lens,
            tags,
            bad,
        }
    }

    /// Writes tag `base + k` into block k and the tag table the kernel checks against.
    fn write_tags(&mut self, base: u32) {
        let mut ptrs = Vec::new();
        let mut lens = Vec::new();
        let mut tags = Vec::new();
        for (k, b) in self.blocks.iter_mut().enumerate() {
            let tag = base + k as u32;
            b.write(0, &tag_bytes(tag, b.size() as usize)).unwrap();
            ptrs.push(b.device_ptr().expect("CUDA chunks have device pointers"));
            lens.push(b.size() as u32);
            tags.push(tag);
        }
        self.ptrs.write_pod(0, &ptrs).unwrap();
        self.lens.write_pod(0, &lens).unwrap();
        self.tags.write_pod(0, &tags).unwrap();
        self.pool.flush().unwrap();
    }

    /// Runs `check_tagged_blocks` on this device against the tag table written last with
    /// `expect_base`: the number of blocks whose bytes differ.
    fn bad_blocks(&mut self, expect_base: u32) -> u64 {
        let tags: Vec<u32> = (0..BLOCKS as u32).map(|k| expect_base + k).collect();
        self.tags.write_pod(0, &tags).unwrap();
        self.bad.write_pod(0, &[0u64]).unwrap();
        self.pool.flush().unwrap();
        launch_check_tagged_blocks(
            &self.gpu,
            &self.module,
            64,
            self.ptrs.device_ptr().unwrap(),
            self.lens.device_ptr().unwrap(),
            self.tags.device_ptr().unwrap(),
            BLOCKS as u64,
            self.bad.device_ptr().unwrap(),
        );
        let mut bad = [0u64];
        self.bad.read_pod(0, &mut bad).unwrap();
        bad[0]
    }
}

fn print_bar(label: &str, gpu: &Gpu) -> vkgdr::BarInfo {
    let bar = gpu.bar_info().expect("BAR figures");
    match &bar.bar1 {
        Ok(b) => println!(
            "{label} {}: BAR1 used {} MiB of {} MiB; estimate {} MiB mappable ({})",
            gpu.name(),
            b.used >> 20,
            b.total >> 20,
            bar.estimate.bytes >> 20,
            bar.estimate.basis
        ),
        Err(why) => println!(
            "{label} {}: no BAR1 figures ({why}); estimate {} MiB mappable",
            gpu.name(),
            bar.estimate.bytes >> 20
        ),
    }
    assert!(bar.vram_total > 0);
    assert!(bar.estimate.bytes > 0, "nothing mappable? {bar:?}");
    if let Ok(b) = &bar.bar1 {
        assert!(b.total > 0 && b.used <= b.total, "{b:?}");
    }
    bar
}

#[test]
#[ignore = "needs two NVIDIA GPUs: run with --include-ignored on a two-GPU machine (scripts/gpu-check skips it on one GPU)"]
fn two_gpus_pools_kernels_isolation_and_bar_figures() {
    let driver = Driver::get().expect("the CUDA driver");
    let n = driver.device_count().expect("device count");
    assert!(
        n >= 2,
        "this test needs two GPUs and this machine has {n}: run it on the two-GPU machine, or skip \
         it with --skip two_gpus (scripts/gpu-check does)"
    );

    // Open by ordinal and by UUID (both spellings): the same devices.
    let gpus: Vec<Gpu> = (0..2)
        .map(|i| Gpu::open(i).expect("open by ordinal"))
        .collect();
    assert_ne!(gpus[0].uuid(), gpus[1].uuid(), "two devices, two UUIDs");
    for gpu in &gpus {
        let uuid = format_uuid(&gpu.uuid());
        for text in [uuid.clone(), format!("GPU-{uuid}")] {
            let by_uuid = Gpu::open_uuid(&text).expect("open by UUID");
            assert_eq!(by_uuid.cu_device(), gpu.cu_device(), "{text}");
            assert_eq!(by_uuid.uuid(), gpu.uuid());
            assert_eq!(by_uuid.vulkan().device_info().uuid, gpu.uuid());
        }
        println!(
            "CUDA device {} = GPU-{uuid} ({}) -> Vulkan [{}] {}",
            gpu.cu_device(),
            gpu.name(),
            gpu.vulkan().device_info().index,
            gpu.vulkan().device_info().name
        );
    }
    let missing = Gpu::open_uuid("GPU-00000000-0000-0000-0000-000000000000").unwrap_err();
    assert!(
        matches!(missing, vkgdr::Error::NoMatchingDevice(_)),
        "{missing}"
    );

    let before: Vec<vkgdr::BarInfo> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| print_bar(&format!("device {i} before"), g))
        .collect();

    let mut sides: Vec<Side> = gpus.into_iter().map(Side::new).collect();
    sides[0].write_tags(0x1000_0000);
    sides[1].write_tags(0x2000_0000);
    assert_eq!(sides[0].bad_blocks(0x1000_0000), 0, "device 0's kernel");
    assert_eq!(sides[1].bad_blocks(0x2000_0000), 0, "device 1's kernel");
    // The kernel notices wrong tags (so the zeros above mean something).
    assert_eq!(sides[1].bad_blocks(0x1000_0000), BLOCKS as u64);

    // Isolation: rewriting every block of device 0 leaves device 1's bytes as they were.
    sides[0].write_tags(0x3000_0000);
    assert_eq!(sides[0].bad_blocks(0x3000_0000), 0);
    assert_eq!(
        sides[1].bad_blocks(0x2000_0000),
        0,
        "a write to device 0 showed up on device 1"
    );
    sides[1].write_tags(0x4000_0000);
    assert_eq!(
        sides[0].bad_blocks(0x3000_0000),
        0,
        "a write to device 1 showed up on device 0"
    );

    for (i, side) in sides.iter().enumerate() {
        let after = print_bar(&format!("device {i} with its pool"), &side.gpu);
        let reserved = side.pool.stats().bytes_reserved;
        println!(
            "device {i}: pool holds {} MiB; estimate {} -> {} MiB",
            reserved >> 20,
            before[i].estimate.bytes >> 20,
            after.estimate.bytes >> 20
        );
        assert!(reserved > 0);
    }
}
