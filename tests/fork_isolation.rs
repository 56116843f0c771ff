//! Fork isolation on lavapipe (CI): a forked child cannot reach this process's mapped memory,
//! and an `exec`'d one inherits no exported fd. Vulkan-only memory and a pool over it, checked by
//! the CPU in the parent; tests/gpu_isolation.rs does the same for CUDA-imported memory, pool and
//! arena chunks and rings, checked by DMA. Its own test binary: it forks and counts fds.

use std::os::fd::AsRawFd;

use vkgdr::vulkan::{DeviceSelector, VulkanContext};
use vkgdr::{Mapping, Pool, PoolConfig};

mod common;
use common::{child_stores, children_fault_storing_into, fds_of_spawned_child, ChildEnd};

/// A child that stores through an inherited pointer into a mapping faults, and the parent's
/// bytes stay as they were (first and last byte of the mapping).
fn assert_isolated(what: &str, mapping: &mut impl Mapping) {
    children_fault_storing_into(what, mapping);
    let len = mapping.len();
    assert!(
        mapping
            .read_vec(0, len as usize)
            .unwrap()
            .iter()
            .all(|&b| b == 0x5a),
        "{what}: the parent's bytes changed"
    );
}

#[test]
fn forked_children_cannot_reach_vulkan_memory() {
    for force in [false, true] {
        let ctx = common::vulkan(force);
        let mut mem = ctx.allocate(64 << 10).unwrap();
        assert_isolated("Vulkan memory", &mut mem);
    }
}

#[test]
fn forked_children_cannot_reach_pool_blocks() {
    let ctx = common::vulkan(false);
    let cfg = PoolConfig {
        chunk_size: 1 << 20,
        dedicated_threshold: 256 << 10,
        shards: 1,
        ..Default::default()
    };
    let pool = Pool::new(ctx, cfg).unwrap();
    let mut shared = pool.alloc(4096, 64).unwrap();
    let mut dedicated = pool.alloc(512 << 10, 64).unwrap();
    assert!(dedicated.is_dedicated());
    assert_isolated("pool block", &mut shared);
    assert_isolated("dedicated block", &mut dedicated);
}

/// The method can tell: memory a child shares with its parent (a `MAP_SHARED` mapping, what an
/// exported allocation is) shows the child's store in the parent, and private memory is copied
/// on write. Without `MADV_DONTFORK` the tests above would see the first case, or a child that
/// exits normally.
#[test]
fn the_fork_check_sees_shared_memory() {
    // SAFETY: a fresh anonymous shared mapping of one page, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let p = p.cast::<u8>();
    assert_eq!(child_stores(p, 0xee), ChildEnd::Exited(0));
    // SAFETY: inside the live mapping; the child has exited.
    assert_eq!(
        unsafe { p.read_volatile() },
        0xee,
        "the child's store shows"
    );
    // SAFETY: ours, unmapped once.
    unsafe { libc::munmap(p.cast(), 4096) };

    let mut private = Box::new(0u8);
    assert_eq!(child_stores(&mut *private, 0xee), ChildEnd::Exited(0));
    assert_eq!(*private, 0, "copied on write");
}

/// Exported fds carry `FD_CLOEXEC`, and a spawned program holds none of them. (The child's fds
/// are compared by what they refer to, not counted: the other tests of this binary open files
/// of their own meanwhile, such as the Vulkan loader's, which a count would see.)
/// A child forked after its parent opened the Vulkan driver is refused the driver, by name: with
/// NVIDIA's driver its `vkCreateDevice` lost the device, and then so did its parent's.
#[test]
fn a_forked_child_is_refused_the_vulkan_driver_its_parent_opened() {
    let _ctx = common::vulkan(false);
    let end = common::in_child(|| {
        let e = VulkanContext::new(DeviceSelector::FirstSuitable, Default::default()).unwrap_err();
        assert!(
            matches!(&e, vkgdr::Error::Unsupported(m) if m.contains("forked") && m.contains("spawn")),
            "{e}"
        );
    });
    assert_eq!(end, ChildEnd::Exited(0), "the child's check");
    // The parent's own driver is untouched: it opens another device.
    VulkanContext::new(DeviceSelector::FirstSuitable, Default::default()).unwrap();
}

#[test]
fn exported_fds_are_close_on_exec() {
    let ctx = common::vulkan(false);
    let mem = ctx.allocate(64 << 10).unwrap();
    let fds: Vec<_> = (0..8).map(|_| mem.export_fd().unwrap()).collect();
    let mut exported = Vec::new();
    for fd in &fds {
        // SAFETY: F_GETFD on a live fd we own.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        assert!(flags >= 0 && flags & libc::FD_CLOEXEC != 0, "fd {fd:?}");
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        exported.push(link.to_string_lossy().into_owned());
    }
    let child = fds_of_spawned_child();
    let inherited = child.iter().filter(|t| exported.contains(t)).count();
    assert_eq!(
        inherited, 0,
        "a spawned program holds {inherited} exported fds: {child:?}"
    );
}
