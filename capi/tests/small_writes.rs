//! The C library's writes take the library's write path: a small `vkgdr_block_write` runs on the
//! calling thread and never starts the global copy pool, as `Mapping::write` does from Rust; a
//! large one splits over it. One test in its own binary, so no other test starts the pool
//! first. Runs on any Vulkan device with exportable host-visible memory (lavapipe on CI).

use std::ffi::c_void;

use vkgdr::copy::{CopyPool, DEFAULT_PARALLEL_THRESHOLD};
use vkgdr_capi::device::{vkgdr_close, vkgdr_open_vulkan};
use vkgdr_capi::pool::{
    vkgdr_block_free, vkgdr_block_read, vkgdr_block_write, vkgdr_pool_alloc, vkgdr_pool_create,
    vkgdr_pool_destroy,
};
use vkgdr_capi::VKGDR_SUCCESS;

#[test]
fn small_block_writes_start_no_copy_pool_and_large_ones_use_it() {
    // SAFETY: the C calling convention only; -1 is the first suitable device.
    let g = unsafe { vkgdr_open_vulkan(-1, 0) };
    if g.is_null() {
        eprintln!("skipped: no Vulkan device with exportable host-visible memory here");
        return;
    }
    // SAFETY: `g` is live; NULL asks for the default configuration.
    let pool = unsafe { vkgdr_pool_create(g, std::ptr::null()) };
    assert!(!pool.is_null());
    let large = DEFAULT_PARALLEL_THRESHOLD;
    // SAFETY: `pool` is live.
    let (small_block, large_block) = unsafe {
        (
            vkgdr_pool_alloc(pool, 8, 8),
            vkgdr_pool_alloc(pool, large, 64),
        )
    };
    assert!(!small_block.is_null() && !large_block.is_null());

    let word = 0x0123_4567_89ab_cdef_u64.to_le_bytes();
    // SAFETY: 8 readable bytes into a live 8-byte block, used by this thread only.
    let wrote = unsafe { vkgdr_block_write(small_block, 0, word.as_ptr().cast::<c_void>(), 8) };
    assert_eq!(wrote, VKGDR_SUCCESS);
    let mut back = [0u8; 8];
    // SAFETY: 8 writable bytes out of the live block.
    let read = unsafe { vkgdr_block_read(small_block, 0, back.as_mut_ptr().cast::<c_void>(), 8) };
    assert_eq!((read, back), (VKGDR_SUCCESS, word));
    assert!(
        CopyPool::global_if_started().is_none(),
        "an 8-byte vkgdr_block_write started the global copy pool"
    );

    let data: Vec<u8> = (0..large).map(|i| (i % 251) as u8).collect();
    // SAFETY: `large` readable bytes into a live block of that size, used by this thread only.
    let wrote = unsafe { vkgdr_block_write(large_block, 0, data.as_ptr().cast::<c_void>(), large) };
    assert_eq!(wrote, VKGDR_SUCCESS);
    assert!(
        CopyPool::global_if_started().is_some(),
        "a large vkgdr_block_write splits over the global copy pool"
    );
    let mut back = vec![0u8; large];
    // SAFETY: `large` writable bytes out of the live block.
    let read =
        unsafe { vkgdr_block_read(large_block, 0, back.as_mut_ptr().cast::<c_void>(), large) };
    assert_eq!(read, VKGDR_SUCCESS);
    assert!(back == data, "the large block reads back what was written");

    // SAFETY: the handles are live and used by nothing else.
    unsafe {
        vkgdr_block_free(small_block);
        vkgdr_block_free(large_block);
        vkgdr_pool_destroy(pool);
        vkgdr_close(g);
    }
}
