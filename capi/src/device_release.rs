//! Blocks released on the device (`vkgdr_block_release_on_device`,
//! `vkgdr_pool_release_many_on_device`, `vkgdr_pool_*_release*`), a thin layer over
//! [`vkgdr::Block::release_on_device`], [`vkgdr::Pool::release_many_on_device`] and the pool's
//! release feed: a kernel
//! gives a block back with `vkgdr_release_token` (`include/vkgdr/ring_d2h.cuh`) through a device
//! → host ring whose lanes the pool drains, so no stream boundary is needed (a persistent kernel
//! has none).

use std::ffi::c_int;

use crate::d2h::{d2h_ring, vkgdr_d2h_ring_t};
use crate::error::{guard, Failure};
use crate::handles::Tag;
use crate::pool::{pool, vkgdr_block_t, vkgdr_pool_t, BLOCKS};
use crate::{lookup, register, Handle, VKGDR_ERROR, VKGDR_SUCCESS};

/// Gives `ring`'s lanes to `pool` as its release feed: the records of `vkgdr_release_token`
/// that kernels publish into them bring released blocks back. Once per pool; the pool then
/// drains the lanes itself (on a thread of its own, on allocations and on
/// `vkgdr_pool_drain_device_releases`), so they are not the C caller's to take from any more
/// (`vkgdr_d2h_ring_try_next` on them fails: the lane has a consumer). The pool keeps the
/// ring's memory alive as long as blocks are lent, also after `vkgdr_d2h_ring_destroy`.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR`: an invalid handle, a lane of the ring with a
/// consumer (close it first), a pool that has a feed already.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `pool` or `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_pool_set_release_feed(
    pool: vkgdr_pool_t,
    ring: vkgdr_d2h_ring_t,
) -> c_int {
    guard("vkgdr_pool_set_release_feed", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `pool` during the call.
        let p = unsafe { self::pool(pool) }?;
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { d2h_ring(ring) }?;
        let lanes = r.ring.consumers()?;
        p.set_release_feed(lanes)
            .map_err(|_| Failure::Api("the pool has a release feed already".into()))?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Lends `block` to a kernel: stores in `*token` the value the kernel passes to
/// `vkgdr_release_token` (`include/vkgdr/ring_d2h.cuh`) when it is done with the block. The
/// block goes back to its pool only when that token has come back through the pool's release
/// feed (`vkgdr_pool_set_release_feed`), so it is never handed out again while the kernel may
/// still use it. A token is single-use: a repeated, stale or forged one frees nothing.
///
/// Consumes the handle, also on error: a block that could not be lent (the pool has no release
/// feed, or has the most blocks lent it can hold) is freed at once.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR`: an invalid handle (nothing consumed), `token`
/// NULL (nothing consumed), the refusals above.
///
/// Thread safety: any thread.
///
/// # Safety
/// - `token` is NULL or writable.
/// - No other thread uses `block` during or after the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_block_release_on_device(
    block: vkgdr_block_t,
    token: *mut u64,
) -> c_int {
    guard("vkgdr_block_release_on_device", VKGDR_ERROR, || {
        if token.is_null() {
            return Err(Failure::Api("the token pointer is NULL".into()));
        }
        let b = BLOCKS
            .remove(block.token())
            .map_err(|why| Failure::handle(Tag::Block, why))?;
        // A refused block is dropped with the error: freed, as documented.
        let t = b
            .release_on_device()
            .map_err(|refused| Failure::Api(refused.to_string()))?;
        // SAFETY: non-NULL and writable (caller).
        unsafe { token.write(t.to_bits()) };
        Ok(VKGDR_SUCCESS)
    })
}

/// `vkgdr_block_release_on_device` for `count` blocks of `pool` at once, the pool's token table
/// locked once: lends `blocks[0..count)` in order and stores in `tokens[i]` the token of
/// `blocks[i]`. `*lent` gets how many were lent (always written once the pointers are checked):
/// `blocks[0..*lent)` are consumed (set to NULL) and `tokens[0..*lent)` written. A batch
/// refused part-way (the pool has no release feed, has the most blocks lent it can hold, or
/// `blocks[*lent]` is another pool's) returns `VKGDR_ERROR` with `*lent` lent; the blocks from
/// `blocks[*lent]` on are not lent and stay the caller's, each under a new handle written back
/// into `blocks` (the old ones are invalid; NULL only if the handle table is full).
///
/// Returns `VKGDR_SUCCESS` (every block lent; `count` 0 included), or `VKGDR_ERROR`: an invalid
/// pool handle, `lent` NULL, `blocks` or `tokens` NULL with `count` > 0, an invalid block
/// handle or one given twice (nothing consumed, `*lent` 0), the refusals above.
///
/// Thread safety: any thread.
///
/// # Safety
/// - `blocks` holds `count` handles and is writable; `tokens` has room for `count` values;
///   `lent` is NULL or writable.
/// - No other thread uses any of the blocks during or after the call, nor destroys `pool`
///   during it.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_pool_release_many_on_device(
    pool: vkgdr_pool_t,
    blocks: *mut vkgdr_block_t,
    count: usize,
    tokens: *mut u64,
    lent: *mut usize,
) -> c_int {
    guard("vkgdr_pool_release_many_on_device", VKGDR_ERROR, || {
        if lent.is_null() {
            return Err(Failure::Api("the lent pointer is NULL".into()));
        }
        // SAFETY: the caller does not destroy `pool` during the call.
        let p = unsafe { self::pool(pool) }?;
        // SAFETY: non-NULL and writable (caller).
        unsafe { lent.write(0) };
        if count == 0 {
            return Ok(VKGDR_SUCCESS);
        }
        if blocks.is_null() || tokens.is_null() {
            return Err(Failure::Api("the blocks or tokens pointer is NULL".into()));
        }
        // SAFETY: `blocks` holds `count` writable handles and `tokens` has room for `count`
        // values (caller); neither aliases the other or anything of ours.
        let (handles, out) = unsafe {
            (
                std::slice::from_raw_parts_mut(blocks, count),
                std::slice::from_raw_parts_mut(tokens, count),
            )
        };
        // Every handle checked before any is taken: a bad one consumes nothing.
        for (i, &h) in handles.iter().enumerate() {
            // SAFETY: no other thread frees the blocks during the call (caller).
            match unsafe { lookup(&BLOCKS, h) } {
                Ok(_) => {}
                Err(Failure::Api(why)) => return Err(Failure::Api(format!("blocks[{i}]: {why}"))),
                Err(e) => return Err(e),
            }
        }
        let mut taken = Vec::with_capacity(count);
        for (i, &h) in handles.iter().enumerate() {
            match BLOCKS.remove(h.token()) {
                Ok(b) => taken.push(b),
                Err(_) => {
                    // Checked live above, so given twice: the blocks taken so far go back.
                    for (h, b) in handles.iter_mut().zip(taken) {
                        *h = register(&BLOCKS, b).unwrap_or(std::ptr::null_mut());
                    }
                    return Err(Failure::Api(format!(
                        "blocks[{i}] is a handle given twice; nothing lent (blocks[0..{i}] \
                         have new handles)"
                    )));
                }
            }
        }
        let mut lent_tokens = Vec::with_capacity(count);
        let verdict = p.release_many_on_device(&mut taken, &mut lent_tokens);
        let n = lent_tokens.len();
        for ((o, t), h) in out.iter_mut().zip(&lent_tokens).zip(handles.iter_mut()) {
            *o = t.to_bits();
            *h = std::ptr::null_mut();
        }
        // The blocks not lent (all of `taken` now) go back to the caller, in order.
        for (h, b) in handles[n..].iter_mut().zip(taken) {
            *h = register(&BLOCKS, b).unwrap_or(std::ptr::null_mut());
        }
        // SAFETY: non-NULL and writable (caller).
        unsafe { lent.write(n) };
        match verdict {
            Ok(()) => Ok(VKGDR_SUCCESS),
            Err(why) => Err(Failure::Api(format!(
                "{n} of {count} blocks lent; blocks[{n}] and after not: {why}"
            ))),
        }
    })
}

/// Takes every device release that has arrived on the pool's release feed and frees the blocks
/// given back (the pool's own thread and its allocations do it too). On return every block whose
/// token arrived before the call is back in the pool, those another thread's drain took included.
/// Returns the number of blocks this call freed, or `SIZE_MAX` on error (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `pool` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_pool_drain_device_releases(pool: vkgdr_pool_t) -> usize {
    guard("vkgdr_pool_drain_device_releases", usize::MAX, || {
        // SAFETY: the caller does not destroy `pool` during the call.
        Ok(unsafe { self::pool(pool) }?.drain_device_releases())
    })
}

/// Blocks of `pool` lent to kernels now (released on the device and not back in the pool yet:
/// their tokens not arrived, or a drain freeing them at this moment), or `UINT64_MAX` on error
/// (an invalid handle). Once it reads 0, every block lent before is allocatable again.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `pool` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_pool_get_lent_blocks(pool: vkgdr_pool_t) -> u64 {
    guard("vkgdr_pool_get_lent_blocks", u64::MAX, || {
        // SAFETY: the caller does not destroy `pool` during the call.
        Ok(unsafe { self::pool(pool) }?.lent_blocks())
    })
}

/// Frees every block of `pool` lent to kernels without waiting for its token (their tokens are
/// stale from then on: they free nothing). For a host that knows its kernels are done (they
/// exited and their stream was synchronised), or that a kernel will never release (it failed).
/// Returns how many blocks were freed, or `SIZE_MAX` on error (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No kernel reads or writes any lent block of the pool whose token has not arrived: the
///   blocks are handed out again at once.
/// - No thread destroys `pool` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_pool_reclaim_device_releases(pool: vkgdr_pool_t) -> usize {
    guard("vkgdr_pool_reclaim_device_releases", usize::MAX, || {
        // SAFETY: the caller does not destroy `pool` during the call.
        let p = unsafe { self::pool(pool) }?;
        // SAFETY: no kernel uses a lent block any more (the caller's contract above).
        Ok(unsafe { p.reclaim_device_releases() })
    })
}
