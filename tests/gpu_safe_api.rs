//! The safe API and allocation reports on the GPU: a pinned buffer the GPU writes is read by
//! volatile and atomic loads with bounds checks; events and kernels refuse streams of another
//! context (two GPUs); raw allocations carry labels and `Gpu::allocations` lists every live one,
//! the library's own (pool chunks, rings) included; pool reports give chunks' device addresses.

mod common;

use common::*;
use vkgdr::cuda_objects::{Event, PinnedBuffer, Stream};
use vkgdr::ring::DeviceRing;
use vkgdr::{Error, Gpu, Pool, PoolConfig};

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn pinned_buffers_are_read_by_volatile_and_atomic_loads() {
    let gpu = open(false);
    let mut pinned = PinnedBuffer::new(&gpu, 4096).unwrap();
    pinned.fill(0x11);
    // The GPU writes the buffer through its device address.
    // SAFETY: 256 words inside the live 4096-byte pinned buffer, device-mapped.
    unsafe { gpu.memset_d32(pinned.device_ptr() + 1024, 0xa5a5_a5a5, 256) }.unwrap();
    assert_eq!(pinned.load_u64(1024).unwrap(), 0xa5a5_a5a5_a5a5_a5a5);
    let mut bytes = [0u8; 16];
    pinned.read(1016, &mut bytes).unwrap();
    assert_eq!(
        bytes,
        [
            0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0xa5, 0xa5, 0xa5, 0xa5, 0xa5, 0xa5,
            0xa5, 0xa5
        ]
    );
    pinned.write(4088, &7u64.to_le_bytes()).unwrap();
    assert_eq!(pinned.load_u64(4088).unwrap(), 7);
    // Out of range, misaligned: errors, nothing touched.
    for r in [
        pinned.load_u64(4089),
        pinned.load_u64(4),
        pinned.load_u64(usize::MAX),
    ] {
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    }
    assert!(matches!(
        pinned.read(4090, &mut bytes),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        pinned.write(usize::MAX, &[1]),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(pinned.load_u64(4088).unwrap(), 7);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn raw_allocations_are_listed_with_their_labels() {
    let gpu = open(false);
    let mut mine = gpu.alloc(1 << 20).unwrap();
    mine.set_label("gains");
    assert_eq!(mine.label(), Some("gains"));
    let unlabeled = gpu.alloc(4096).unwrap();
    let pool = Pool::new(gpu.clone(), PoolConfig::default()).unwrap();
    let block = pool.alloc_labeled(256, 64, "delays").unwrap();
    let ring = DeviceRing::new(&gpu, 64 << 10).unwrap();

    let listed = gpu.allocations();
    let label_of = |ptr: u64| {
        listed
            .iter()
            .find(|a| a.device_ptr == ptr)
            .map(|a| a.label.as_deref().map(str::to_owned))
    };
    assert_eq!(label_of(mine.device_ptr()), Some(Some("gains".into())));
    assert_eq!(label_of(unlabeled.device_ptr()), Some(None));
    let labels: Vec<_> = listed.iter().filter_map(|a| a.label.as_deref()).collect();
    for l in ["vkgdr pool chunk", "vkgdr ring data", "vkgdr ring control"] {
        assert!(labels.contains(&l), "{l} not in {labels:?}");
    }
    // The pool's report places the block in a chunk with a device address.
    let report = pool.report();
    let b = &report.blocks[0];
    let chunk = report.chunks.iter().find(|c| c.place == b.place).unwrap();
    assert_eq!(
        chunk.device_ptr.unwrap() + b.offset,
        block.device_ptr().unwrap()
    );
    println!("{report}");
    drop((mine, unlabeled, block, ring));
    drop(pool);
    assert_eq!(gpu.allocations(), [], "every allocation left the list");
}

/// An event or a kernel of one device used with a stream of the other: refused, not passed to
/// the driver.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn two_gpus_streams_of_another_context_are_refused() {
    let (a, b) = (Gpu::open(0).unwrap(), Gpu::open(1).unwrap());
    let event = Event::new(&a).unwrap();
    let foreign = Stream::new(&b).unwrap();
    assert!(matches!(
        event.record(&foreign),
        Err(Error::InvalidArgument(_))
    ));
    event.record(&Stream::new(&a).unwrap()).unwrap();
    let module = vkgdr::cuda_objects::Module::load_ptx(&a, MAPPING_PTX).unwrap();
    let f = module.function("sum_words").unwrap();
    // SAFETY: refused before any launch (the stream belongs to another context).
    let r = unsafe {
        f.launch(
            vkgdr::cuda_objects::LaunchConfig::linear(1, 1),
            Some(&foreign),
            &mut [],
        )
    };
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
}
