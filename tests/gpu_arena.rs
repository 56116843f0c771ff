//! The VMM arena on the GPU: grow to 8+ chunks with a kernel reading every word across all chunk
//! boundaries after each step; shrink and regrow at the same addresses; 1,000 grow/shrink cycles
//! leave fds and `cuMemGetInfo` where they were; bad inputs are errors. Own binary (fd counts).

mod common;

use common::*;
use vkgdr::cuda_objects::Module;
use vkgdr::{Arena, Error, Mapping, MemorySide};

const CHUNK: u64 = 32 << 20;

/// "BAR1 Memory Usage / Used" from `nvidia-smi -q -d MEMORY`, in MiB (None without nvidia-smi).
fn bar1_used_mib() -> Option<u64> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["-q", "-d", "MEMORY"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let bar1 = text.split("BAR1 Memory Usage").nth(1)?;
    let used = bar1.lines().find(|l| l.trim_start().starts_with("Used"))?;
    used.split(':')
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn fill(arena: &mut Arena, from: u64, to: u64, seed: u32) {
    let words: Vec<u32> = (from / 4..to / 4).map(|i| pattern(i, seed)).collect();
    arena.write(from, bytemuck::cast_slice(&words)).unwrap();
}

fn mismatches(
    gpu: &vkgdr::Gpu,
    module: &Module,
    arena: &Arena,
    seed: u32,
    errors: &mut vkgdr::RawMemory,
) -> u64 {
    errors.write_pod(0, &[0u64]).unwrap();
    let (mut p, mut n, mut first, mut s, mut e) = (
        arena.device_ptr(),
        arena.len() / 4,
        0u64,
        seed,
        errors.device_ptr(),
    );
    launch(
        gpu,
        module,
        "count_mismatches",
        512,
        256,
        &mut [
            arg(&mut p),
            arg(&mut n),
            arg(&mut first),
            arg(&mut s),
            arg(&mut e),
        ],
    );
    let mut v = [0u64];
    errors.read_pod(0, &mut v).unwrap();
    v[0]
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn grow_read_across_boundaries_shrink_regrow_cycle() {
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, MAPPING_PTX).unwrap();
    let mut errors = gpu.alloc(8).unwrap();

    assert!(matches!(
        Arena::new(&gpu, 1 << 30, 3 << 20),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        Arena::new(&gpu, (1 << 30) + (32 << 20) + 1, CHUNK),
        Err(Error::InvalidArgument(_))
    ));

    let mut arena = Arena::new(&gpu, 1 << 40, CHUNK).unwrap(); // 1 TiB of address space
    let base = arena.device_ptr();
    let seed = 0xA11C;
    for k in 1..=8u64 {
        let before = arena.len();
        assert_eq!(arena.grow().unwrap(), k * CHUNK);
        assert_eq!(arena.device_ptr(), base, "growing moved the arena");
        let now = arena.len();
        fill(&mut arena, before, now, seed);
        assert_eq!(
            mismatches(&gpu, &module, &arena, seed, &mut errors),
            0,
            "after growing to {k} chunks"
        );
    }
    // A write straddling a chunk boundary is contiguous for the GPU.
    let at = 3 * CHUNK - 6;
    arena.write(at, b"straddle!!!!").unwrap();
    let mut back = [0u8; 12];
    // SAFETY: inside the mapped arena.
    unsafe { gpu.memcpy_dtoh(&mut back, base + at).unwrap() };
    assert_eq!(&back, b"straddle!!!!");
    let mut via_host = [0u8; 12];
    arena.read(at, &mut via_host).unwrap();
    assert_eq!(&via_host, b"straddle!!!!");
    fill(&mut arena, at - 2, at + 14, seed);
    // The check can fail: a wrong seed is seen everywhere.
    assert_eq!(
        mismatches(&gpu, &module, &arena, seed ^ 1, &mut errors),
        arena.len() / 4
    );

    assert_eq!(arena.shrink(3).unwrap(), 5 * CHUNK);
    assert!(arena.host_ptr(5 * CHUNK).is_none());
    for _ in 0..3 {
        arena.grow().unwrap();
    }
    assert_eq!(arena.device_ptr(), base);
    fill(&mut arena, 5 * CHUNK, 8 * CHUNK, seed);
    assert_eq!(
        mismatches(&gpu, &module, &arena, seed, &mut errors),
        0,
        "after shrink and regrow"
    );

    // Growth past the reservation is the arena's "out of memory" and leaves it intact.
    let mut small = Arena::new(&gpu, 2 * CHUNK, CHUNK).unwrap();
    small.grow().unwrap();
    small.grow().unwrap();
    assert!(matches!(
        small.grow(),
        Err(Error::OutOfDeviceMemory {
            side: MemorySide::Limit,
            ..
        })
    ));
    assert_eq!(small.len(), 2 * CHUNK);
    drop(small);
    drop(arena);
    settle(&gpu);

    let fds = open_fds();
    let (free, _) = gpu.mem_info().unwrap();
    let bar1 = bar1_used_mib();
    let mut arena = Arena::new(&gpu, 64 * CHUNK, CHUNK).unwrap();
    for i in 0..1000 {
        arena.grow().unwrap();
        if i % 2 == 1 {
            arena.shrink(2).unwrap();
        }
    }
    drop(arena);
    settle(&gpu);
    assert_eq!(open_fds(), fds, "fds leaked by 1,000 grow/shrink cycles");
    assert_eq!(
        gpu.mem_info().unwrap().0,
        free,
        "device memory leaked by grow/shrink cycles"
    );
    let bar1_after = bar1_used_mib();
    println!("BAR1 used: {bar1:?} MiB before, {bar1_after:?} MiB after 1,000 grow/shrink cycles");
    assert_eq!(bar1_after, bar1, "BAR1 use changed");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn mirror_makes_the_wrap_contiguous_for_the_gpu() {
    let gpu = open(false);
    let mut arena = Arena::new(&gpu, 4 * CHUNK, CHUNK).unwrap();
    assert!(
        matches!(arena.map_mirror(), Err(Error::InvalidArgument(_))),
        "empty arena"
    );
    arena.grow().unwrap();
    arena.grow().unwrap();
    let len = arena.len();
    arena.write(len - 8, b"ABCDEFGH").unwrap();
    arena.write(0, b"12345678").unwrap();
    arena.map_mirror().unwrap();
    assert!(arena.is_mirrored());
    assert!(matches!(arena.grow(), Err(Error::InvalidArgument(_))));
    assert!(matches!(arena.shrink(1), Err(Error::InvalidArgument(_))));
    // The copy engine reads across the end of the mapped range straight into chunk 0.
    let mut across = [0u8; 16];
    // SAFETY: [base + len - 8, base + len + 8) is mapped: the last chunk, then the mirror.
    unsafe {
        gpu.memcpy_dtoh(&mut across, arena.device_ptr() + len - 8)
            .unwrap()
    };
    assert_eq!(&across, b"ABCDEFGH12345678");
    // A write through the mirror's address lands in chunk 0.
    // SAFETY: the mirror is mapped, 8 bytes.
    unsafe {
        gpu.memcpy_htod(arena.device_ptr() + len + 8, b"mirrored")
            .unwrap()
    };
    let mut host = [0u8; 8];
    arena.read(8, &mut host).unwrap();
    assert_eq!(&host, b"mirrored");
    arena.unmap_mirror().unwrap();
    assert_eq!(arena.grow().unwrap(), 3 * CHUNK);
}
