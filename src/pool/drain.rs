//! Draining a pool's device releases: the records of its release feed redeemed and the blocks
//! whose tokens came freed to their shards, by whichever thread gets there first: an allocation
//! on the pool's slow path (so a block released on the device is allocatable as soon as an
//! allocation needs it, with no thread hop), [`Pool::drain_device_releases`](super::Pool), or
//! the pool's drain thread, which keeps the lanes from filling (a full lane makes the kernel's
//! release wait) while nothing allocates.
//!
//! The drain thread rests (a condition variable, no polling) while no block is lent; while some
//! are, it drains and naps between drains that found nothing, from [`NAP_MIN`] doubling to
//! [`NAP_MAX`]. It ends once the last pool handle is gone and every lent block came back; until
//! then it keeps the pool state (and so the feed's lanes, which a kernel may still write)
//! alive.

use std::sync::Arc;
use std::time::Duration;

use super::block::free_lent;
use super::inner::PoolInner;

/// The drain thread's nap after a drain that found something.
const NAP_MIN: Duration = Duration::from_micros(20);
/// Its longest nap while blocks are lent and nothing arrives.
const NAP_MAX: Duration = Duration::from_millis(1);

/// Drains once (up to a batch of records) and frees the blocks given back; returns the blocks
/// freed. With `wait` false, passes when another thread is draining.
pub(super) fn drain(inner: &PoolInner, wait: bool) -> usize {
    let mut out = Vec::new();
    let (_, in_hand) = inner.lent.drain(&mut out, wait);
    // Outside the table's lock: a free takes its shard's lock.
    free_lent(&mut out);
    in_hand.len()
}

/// Drains until a drain takes nothing; returns the blocks freed.
pub(super) fn drain_all(inner: &PoolInner) -> usize {
    let mut freed = 0;
    // One list for every batch: a batch of records carries thousands of tokens.
    let mut out = Vec::new();
    loop {
        let (taken, in_hand) = inner.lent.drain(&mut out, true);
        freed += in_hand.len();
        free_lent(&mut out);
        drop(in_hand);
        if taken == 0 {
            return freed;
        }
    }
}

/// [`drain_all`], then waits until the blocks other threads' drains took are freed too: on
/// return every block whose token arrived before the call is back in its shard (the public
/// drain, trim and reclaim).
pub(super) fn drain_settled(inner: &PoolInner) -> usize {
    let freed = drain_all(inner);
    inner.lent.wait_for_frees();
    freed
}

/// Starts the pool's drain thread; `false` if the system refused a thread (blocks then come
/// back on allocations and explicit drains only).
pub(super) fn spawn(inner: &Arc<PoolInner>) -> bool {
    let for_thread = inner.clone();
    let spawned = std::thread::Builder::new()
        .name("vkgdr-pool-drain".into())
        .spawn(move || run(&for_thread));
    match spawned {
        Ok(handle) => {
            // Joined when the pool closes with nothing lent (`Pool`'s drop).
            *inner.lent.thread.lock() = Some(handle);
            true
        }
        Err(_) => false,
    }
}

/// Closes the pool's table (its last handle is gone) and, when nothing is lent, waits for the
/// drain thread's end (at once: it only takes the feed out). With blocks lent, the thread goes
/// on until their tokens came.
pub(super) fn close(inner: &PoolInner) {
    inner.lent.close();
    if inner.lent.outstanding() == 0 {
        let handle = inner.lent.thread.lock().take();
        if let Some(handle) = handle {
            let _ = handle.join();
        }
    }
}

fn run(inner: &PoolInner) {
    let mut nap = NAP_MIN;
    loop {
        inner.lent.wait_for_work();
        let freed = drain_all(inner);
        if let Some(feed) = inner.lent.take_feed_if_done() {
            drop(feed);
            return;
        }
        if freed > 0 {
            nap = NAP_MIN;
        } else {
            std::thread::sleep(nap);
            nap = (nap * 2).min(NAP_MAX);
        }
    }
}
