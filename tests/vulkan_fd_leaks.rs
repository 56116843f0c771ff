//! Alloc/export/free cycles leave no fd behind. Its own test binary: counting the process's open fds
//! is only meaningful when no other test runs beside it.

mod common;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn thousand_alloc_free_cycles_leak_no_fds() {
    let ctx = common::vulkan(false);
    // Warm up once so lazily opened driver files are not counted.
    drop(ctx.allocate(65536).unwrap().export_fd().unwrap());
    let before = open_fds();
    for i in 0..1000u64 {
        let mem = ctx.allocate(4096 * (1 + i % 16)).unwrap();
        let fd = mem.export_fd().unwrap();
        drop(fd);
        drop(mem);
    }
    assert_eq!(open_fds(), before);
}
