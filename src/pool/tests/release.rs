//! Device-side releases over host memory: the lent-block table against hostile records, and
//! the pool's rules for lent blocks (trim, drop, reclaim). Miri runs them (`pool::tests`).
use super::super::lent::*;
use crate::core::ring::d2h::{D2hError, LaneConsumer, LaneMemory, ReleaseToken, KIND_RELEASE};
use crate::core::ring::d2h::{DeviceLaneState, HostLane, LaneShape, ProducerModel};
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn lane() -> (Arc<HostLane>, LaneShape) {
    let shape = LaneShape::new(8, 64).unwrap();
    (Arc::new(HostLane::new(shape)), shape)
}

fn send(lane: &HostLane, device: &DeviceLaneState, shape: LaneShape, kind: u32, t: &[u64]) {
    let bytes: Vec<u8> = t.iter().flat_map(|t| t.to_le_bytes()).collect();
    ProducerModel::new(lane, device, shape, 10)
        .publish(kind, &bytes)
        .unwrap();
}

fn value(b: LentBlock) -> u32 {
    *b.downcast::<u32>().expect("a u32")
}

#[test]
fn a_block_comes_back_once_for_its_own_token_and_hostile_ones_are_counted() {
    let (l, shape) = lane();
    let device = DeviceLaneState::new();
    let lent = Lent::new(16);
    lent.set_feed(LaneConsumer::new(l.clone(), shape).unwrap())
        .map_err(|_| ())
        .unwrap();
    let a = lent.lend(Box::new(1u32)).map_err(|e| e.1).unwrap();
    let b = lent.lend(Box::new(2u32)).map_err(|e| e.1).unwrap();
    assert_eq!(lent.outstanding(), 2);
    let other = ReleaseToken::new(a.tag().wrapping_add(1).max(1), a.entry(), a.generation());
    send(
        &l,
        &device,
        shape,
        KIND_RELEASE,
        &[b.to_bits(), other.to_bits(), 0],
    );
    let mut out = Vec::new();
    let (taken, in_hand) = lent.drain(&mut out, true);
    assert_eq!((taken, in_hand.len()), (1, 1));
    // The block taken counts as lent until its drain has freed it.
    assert_eq!((lent.outstanding(), lent.lent_now()), (1, 2));
    assert_eq!(out.drain(..).map(value).collect::<Vec<_>>(), [2]);
    drop(in_hand);
    assert_eq!(lent.lent_now(), 1);
    send(&l, &device, shape, KIND_RELEASE, &[b.to_bits()]);
    send(&l, &device, shape, 7, &[a.to_bits()]);
    let mut torn = a.to_bits().to_le_bytes().to_vec();
    torn.pop();
    ProducerModel::new(&*l, &device, shape, 10)
        .publish(KIND_RELEASE, &torn)
        .unwrap();
    let _ = lent.drain(&mut out, true);
    assert!(out.is_empty(), "nothing freed by hostile records");
    let s = lent.stats();
    assert_eq!(
        (
            s.tokens.forged,
            s.tokens.repeated,
            s.foreign_records,
            s.malformed_records
        ),
        (2, 1, 1, 1)
    );
    assert_eq!((s.outstanding, s.refused()), (1, 5));
    send(&l, &device, shape, KIND_RELEASE, &[a.to_bits()]);
    let _ = lent.drain(&mut out, true);
    assert_eq!(out.drain(..).map(value).collect::<Vec<_>>(), [1]);
    assert_eq!(lent.outstanding(), 0);
}

#[test]
fn no_feed_closed_and_full_tables_give_the_block_back() {
    let lent = Lent::new(1);
    let (b, why) = lent.lend(Box::new(5u32)).unwrap_err();
    assert_eq!((value(b), why), (5, RefusedReason::NoFeed));
    let (l, shape) = lane();
    lent.set_feed(LaneConsumer::new(l.clone(), shape).unwrap())
        .map_err(|_| ())
        .unwrap();
    assert!(lent.set_feed(Vec::<LaneConsumer<HostLane>>::new()).is_err());
    lent.lend(Box::new(6u32)).map_err(|e| e.1).unwrap();
    let (b, why) = lent.lend(Box::new(7u32)).unwrap_err();
    assert_eq!((value(b), why), (7, RefusedReason::TableFull { max: 1 }));
    lent.close();
    let (_, why) = lent.lend(Box::new(8u32)).unwrap_err();
    assert_eq!(why, RefusedReason::Closed);
    assert!(lent.take_feed_if_done().is_none(), "a block is still lent");
    let mut out = Vec::new();
    assert_eq!(lent.revoke_all(&mut out).len(), 1);
    assert_eq!(value(out.pop().unwrap()), 6);
    assert!(lent.take_feed_if_done().is_some());
}

#[test]
fn a_broken_lane_is_kept_and_the_other_lanes_still_drain() {
    let (l0, shape) = lane();
    let (l1, _) = lane();
    let (d0, d1) = (DeviceLaneState::new(), DeviceLaneState::new());
    let lent = Lent::new(16);
    let feed = vec![
        LaneConsumer::new(l0.clone(), shape).unwrap(),
        LaneConsumer::new(l1.clone(), shape).unwrap(),
    ];
    lent.set_feed(feed).map_err(|_| ()).unwrap();
    let a = lent.lend(Box::new(1u32)).map_err(|e| e.1).unwrap();
    // Lane 0: a commit word from nowhere.
    l0.slot_words()[0].store(99, Ordering::Release);
    send(&l1, &d1, shape, KIND_RELEASE, &[a.to_bits()]);
    let _ = &d0;
    let mut out = Vec::new();
    let _ = lent.drain(&mut out, true);
    assert_eq!(out.drain(..).map(value).collect::<Vec<_>>(), [1]);
    assert!(matches!(
        lent.stats().lane_error,
        Some(D2hError::BadCommit { seq: 0, found: 99 })
    ));
}

// The pool's rules, end to end over host memory: a lane in plain memory and the producer
// model stand in for the kernel.

use super::super::{Pool, PoolConfig, RefusedReason as Why};
use super::CountingSource;
use crate::mapping::chunk::HostMemorySource;
use crate::mapping::Mapping;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

/// A pool of one shard without thread caches, so that where a freed block goes is certain.
fn pool_with(source: impl crate::mapping::chunk::ChunkSource + 'static) -> Pool {
    let cfg = PoolConfig {
        chunk_size: 64 << 10,
        max_chunk_size: 64 << 10,
        dedicated_threshold: 32 << 10,
        shards: 1,
        thread_cache: 0,
        ..Default::default()
    };
    Pool::new(source, cfg).unwrap()
}

/// A pool with a one-lane feed, and the lane's device side.
fn pool_and_lane(
    source: impl crate::mapping::chunk::ChunkSource + 'static,
) -> (Pool, Arc<HostLane>, DeviceLaneState, LaneShape) {
    let pool = pool_with(source);
    let (l, shape) = lane();
    pool.set_release_feed(LaneConsumer::new(l.clone(), shape).unwrap())
        .map_err(|_| ())
        .unwrap();
    (pool, l, DeviceLaneState::new(), shape)
}

/// Waits (boundedly) until `pool` has `n` blocks lent.
fn until_lent(pool: &Pool, n: u64) {
    let start = Instant::now();
    while pool.lent_blocks() != n && start.elapsed() < Duration::from_secs(10) {
        pool.drain_device_releases();
        std::thread::yield_now();
    }
    assert_eq!(pool.lent_blocks(), n);
}

#[test]
fn a_lent_block_is_reused_only_after_its_token_arrived() {
    let (pool, l, device, shape) = pool_and_lane(HostMemorySource);
    let mut a = pool.alloc(256, 64).unwrap();
    a.fill(0, 256, 0xA5).unwrap();
    let at = a.host_ptr();
    let token = a.release_on_device().unwrap();
    // Every allocation while it is lent lands elsewhere; the lent bytes stay as they were.
    let others: Vec<_> = (0..200).map(|_| pool.alloc(256, 64).unwrap()).collect();
    assert!(others.iter().all(|b| b.host_ptr() != at));
    // SAFETY: the lent block's bytes are still mapped (the block is in the table).
    let kept = unsafe { std::slice::from_raw_parts(at.cast_const(), 256) };
    assert!(kept.iter().all(|&x| x == 0xA5), "a lent block was written");
    assert_eq!(pool.stats().device_releases.outstanding, 1);
    drop(others);
    send(&l, &device, shape, KIND_RELEASE, &[token.to_bits()]);
    until_lent(&pool, 0);
    let again: Vec<_> = (0..201).map(|_| pool.alloc(256, 64).unwrap()).collect();
    assert!(again.iter().any(|b| b.host_ptr() == at));
    let s = pool.stats().device_releases;
    assert_eq!((s.tokens.issued, s.tokens.redeemed, s.refused()), (1, 1, 0));
}

#[test]
fn hostile_tokens_free_nothing_and_are_counted() {
    let (pool, l, device, shape) = pool_and_lane(HostMemorySource);
    let (other, ..) = pool_and_lane(HostMemorySource);
    let a = pool.alloc(64, 64).unwrap().release_on_device().unwrap();
    let b = pool.alloc(64, 64).unwrap().release_on_device().unwrap();
    let foreign = other.alloc(64, 64).unwrap().release_on_device().unwrap();
    let stale = ReleaseToken::new(a.tag(), a.entry(), a.generation() - 1);
    let ahead = ReleaseToken::new(a.tag(), a.entry(), a.generation() + 1);
    send(
        &l,
        &device,
        shape,
        KIND_RELEASE,
        &[foreign.to_bits(), stale.to_bits()],
    );
    send(
        &l,
        &device,
        shape,
        KIND_RELEASE,
        &[ahead.to_bits(), b.to_bits(), b.to_bits()],
    );
    until_lent(&pool, 1);
    let s = pool.stats().device_releases;
    // `stale` names generation 0 of a new entry: never issued, so forged.
    assert_eq!(
        (
            s.tokens.forged,
            s.tokens.stale,
            s.tokens.repeated,
            s.outstanding
        ),
        (3, 0, 1, 1)
    );
    assert_eq!(other.lent_blocks(), 1, "another pool's block stays lent");
    let report = pool.report().to_string();
    assert!(
        report.contains("1 blocks lent now, 1 given back; refused: 3 forged, 0 stale, 1 repeated"),
        "{report}"
    );
    // A token of `a`'s entry from before a reclaim is stale afterwards.
    // SAFETY: no kernel uses these blocks (the lane is the test's).
    assert_eq!(unsafe { pool.reclaim_device_releases() }, 1);
    send(&l, &device, shape, KIND_RELEASE, &[a.to_bits()]);
    pool.drain_device_releases();
    let s = pool.stats().device_releases;
    assert_eq!((s.tokens.stale, s.tokens.revoked, s.outstanding), (1, 1, 0));
    assert_eq!(pool.stats().bytes_in_use, 0);
    // SAFETY: as above.
    unsafe { other.reclaim_device_releases() };
}

#[test]
fn a_pool_without_a_feed_gives_the_block_back() {
    let pool = pool_with(HostMemorySource);
    let block = pool.alloc(64, 64).unwrap();
    let at = block.host_ptr();
    let refused = block.release_on_device().unwrap_err();
    assert_eq!(
        (refused.reason, refused.block.host_ptr()),
        (Why::NoFeed, at)
    );
    assert_eq!(pool.stats().bytes_in_use, 64);
    drop(refused);
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn trim_and_drop_keep_the_chunk_of_a_lent_block_until_its_token() {
    let live = Arc::new(AtomicUsize::new(0));
    let (pool, l, device, shape) = pool_and_lane(CountingSource(live.clone()));
    let token = pool.alloc(4096, 64).unwrap().release_on_device().unwrap();
    let big = pool.alloc(40 << 10, 64).unwrap(); // dedicated
    let big_token = big.release_on_device().unwrap();
    assert_eq!(live.load(Ordering::SeqCst), 2);
    assert_eq!(pool.trim(), 0, "the lent block's chunk is not empty");
    drop(pool);
    assert_eq!(
        live.load(Ordering::SeqCst),
        2,
        "lent blocks keep their chunks"
    );
    send(
        &l,
        &device,
        shape,
        KIND_RELEASE,
        &[token.to_bits(), big_token.to_bits()],
    );
    // The drain thread takes them after the pool's drop, and the chunks go with them.
    let start = Instant::now();
    while live.load(Ordering::SeqCst) != 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(live.load(Ordering::SeqCst), 0);
}

#[test]
fn a_closed_pool_lends_nothing() {
    let (pool, ..) = pool_and_lane(HostMemorySource);
    let keep = pool.alloc(64, 64).unwrap();
    drop(pool);
    let refused = keep.release_on_device().unwrap_err();
    assert_eq!(refused.reason, Why::Closed);
}

// The batch form: one lock for many blocks, refused part-way with the rest given back.

/// Host addresses, to tell blocks apart.
fn addrs(blocks: &[crate::pool::Block]) -> Vec<usize> {
    blocks.iter().map(|b| b.host_ptr() as usize).collect()
}

#[test]
fn a_batch_lends_every_block_in_order_and_each_comes_back_once() {
    let (pool, l, device, shape) = pool_and_lane(HostMemorySource);
    let mut blocks: Vec<_> = (0..5).map(|_| pool.alloc(64, 64).unwrap()).collect();
    let at = addrs(&blocks);
    // A token already there stays first: the batch's are pushed after it.
    let earlier = pool.alloc(64, 64).unwrap().release_on_device().unwrap();
    let mut tokens = vec![earlier];
    assert_eq!(
        pool.release_many_on_device(&mut blocks, &mut tokens),
        Ok(())
    );
    assert!(blocks.is_empty());
    assert_eq!(tokens.len(), 6);
    assert_eq!(tokens[0], earlier);
    assert_eq!(pool.lent_blocks(), 6);
    // Issued in order: consecutive fresh entries, generation 1.
    let entries: Vec<u32> = tokens.iter().map(|t| t.entry()).collect();
    assert_eq!(entries, [0, 1, 2, 3, 4, 5]);
    // Every token frees its own block once; sent twice, the repeats free nothing.
    let bits: Vec<u64> = tokens.iter().rev().map(|t| t.to_bits()).collect();
    send(&l, &device, shape, KIND_RELEASE, &bits);
    send(&l, &device, shape, KIND_RELEASE, &bits);
    until_lent(&pool, 0);
    pool.drain_device_releases();
    let s = pool.stats().device_releases;
    assert_eq!((s.tokens.issued, s.tokens.redeemed), (6, 6));
    assert_eq!(s.tokens.repeated, 6);
    assert_eq!(pool.stats().bytes_in_use, 0);
    // The blocks are allocatable again.
    let again: Vec<_> = (0..6).map(|_| pool.alloc(64, 64).unwrap()).collect();
    assert!(at.iter().all(|a| addrs(&again).contains(a)));
}

#[test]
fn a_batch_refused_part_way_gives_the_rest_back_in_order() {
    let (pool, l, device, shape) = pool_and_lane(HostMemorySource);
    pool.inner.lent.set_max_entries(3);
    let first = pool.alloc(64, 64).unwrap().release_on_device().unwrap();
    let mut blocks: Vec<_> = (0..4).map(|_| pool.alloc(64, 64).unwrap()).collect();
    let at = addrs(&blocks);
    let mut tokens = Vec::new();
    assert_eq!(
        pool.release_many_on_device(&mut blocks, &mut tokens),
        Err(Why::TableFull { max: 3 })
    );
    assert_eq!(tokens.len(), 2, "two entries were free");
    assert_eq!(
        addrs(&blocks),
        at[2..],
        "the refused block and the one after it"
    );
    assert_eq!(pool.lent_blocks(), 3);
    assert_eq!(pool.stats().bytes_in_use, 6 * 64 - 64);
    // The blocks given back are the caller's: writable, and freed when dropped.
    blocks[0].fill(0, 64, 1).unwrap();
    drop(blocks.pop());
    assert_eq!(pool.stats().bytes_in_use, 4 * 64);
    // Once tokens came back, the rest goes in a second batch.
    send(&l, &device, shape, KIND_RELEASE, &[first.to_bits()]);
    until_lent(&pool, 2);
    assert_eq!(
        pool.release_many_on_device(&mut blocks, &mut tokens),
        Ok(())
    );
    assert_eq!((tokens.len(), pool.lent_blocks()), (3, 3));
    let mut unique: Vec<_> = tokens.iter().map(|t| t.to_bits()).collect();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), 3, "no token issued twice");
    let bits: Vec<u64> = tokens.iter().map(|t| t.to_bits()).collect();
    send(&l, &device, shape, KIND_RELEASE, &bits);
    until_lent(&pool, 0);
    let s = pool.stats().device_releases;
    assert_eq!((s.tokens.issued, s.tokens.redeemed, s.refused()), (4, 4, 0));
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn a_batch_stops_at_another_pools_block() {
    let (pool, l, device, shape) = pool_and_lane(HostMemorySource);
    let (other, ..) = pool_and_lane(HostMemorySource);
    let mut blocks = vec![
        pool.alloc(64, 64).unwrap(),
        other.alloc(64, 64).unwrap(),
        pool.alloc(64, 64).unwrap(),
    ];
    let at = addrs(&blocks);
    let mut tokens = Vec::new();
    assert_eq!(
        pool.release_many_on_device(&mut blocks, &mut tokens),
        Err(Why::OtherPool)
    );
    assert_eq!((tokens.len(), addrs(&blocks)), (1, at[1..].to_vec()));
    assert_eq!((pool.lent_blocks(), other.lent_blocks()), (1, 0));
    assert_eq!(other.stats().bytes_in_use, 64);
    drop(blocks);
    assert_eq!(other.stats().bytes_in_use, 0);
    send(&l, &device, shape, KIND_RELEASE, &[tokens[0].to_bits()]);
    until_lent(&pool, 0);
    // The drain thread may have taken the token: its free follows the count by a moment.
    let start = Instant::now();
    while pool.stats().bytes_in_use != 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::yield_now();
    }
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn a_batch_without_a_feed_or_after_the_close_lends_nothing() {
    let pool = pool_with(HostMemorySource);
    let mut tokens = Vec::new();
    assert_eq!(
        pool.release_many_on_device(&mut Vec::new(), &mut tokens),
        Ok(()),
        "an empty batch"
    );
    let mut blocks: Vec<_> = (0..3).map(|_| pool.alloc(64, 64).unwrap()).collect();
    let at = addrs(&blocks);
    assert_eq!(
        pool.release_many_on_device(&mut blocks, &mut tokens),
        Err(Why::NoFeed)
    );
    assert_eq!((addrs(&blocks), tokens.len()), (at, 0));
    let (pool, ..) = pool_and_lane(HostMemorySource);
    let mut blocks = vec![pool.alloc(64, 64).unwrap()];
    // The last handle goes (the pool state is no handle): lend through the state itself.
    let inner = pool.inner.clone();
    drop(pool);
    assert_eq!(
        super::super::block::lend_many(&inner, &mut blocks, &mut tokens),
        Err(Why::Closed)
    );
    assert_eq!((blocks.len(), tokens.len()), (1, 0));
}

/// Blocks of three shards, some labeled, and a dedicated one, lent in one batch and given back
/// in an order that mixes them: a drain frees a run of one shard under one hold of its lock and
/// ends it at a block of another shard or with a label, and chunks left empty go back in the
/// middle of a run (`keep_empty_chunks = 0`). Then again with the pool dropped before the
/// tokens come (the drain thread frees them into shards whose pool is gone).
#[test]
fn a_drain_frees_mixed_runs_of_shards_labels_and_emptied_chunks() {
    for drop_pool_first in [false, true] {
        let live = Arc::new(AtomicUsize::new(0));
        let cfg = PoolConfig {
            chunk_size: 64 << 10,
            max_chunk_size: 64 << 10,
            dedicated_threshold: 32 << 10,
            shards: 3,
            thread_cache: 0,
            keep_empty_chunks: 0,
            ..Default::default()
        };
        let pool = Pool::new(CountingSource(live.clone()), cfg).unwrap();
        let shape = LaneShape::new(64, 512).unwrap();
        let l = Arc::new(HostLane::new(shape));
        let device = DeviceLaneState::new();
        pool.set_release_feed(LaneConsumer::new(l.clone(), shape).unwrap())
            .map_err(|_| ())
            .unwrap();
        // Three threads on three shards, three chunks of 256 blocks each (one under Miri).
        let per = if cfg!(miri) { 30 } else { 600 };
        let mut used = [false; 3];
        let mut per_thread: Vec<Vec<crate::pool::Block>> = Vec::new();
        for _ in 0..3 {
            let (shard, blocks) = super::on_a_thread_of_shard(
                3,
                |shard| !used[shard],
                || {
                    (0..per)
                        .map(|i| {
                            let mut b = pool.alloc(256, 64).unwrap();
                            if i % 17 == 5 {
                                b.set_label("lent");
                            }
                            b
                        })
                        .collect::<Vec<_>>()
                },
            );
            used[shard] = true;
            per_thread.push(blocks);
        }
        let before = live.load(Ordering::SeqCst);
        assert!(before >= if cfg!(miri) { 3 } else { 9 }, "{before} chunks");
        // Runs of 7, 3 and 11 blocks of each thread in turn, a dedicated block among them.
        let mut blocks = Vec::new();
        while per_thread.iter().any(|v| !v.is_empty()) {
            for (t, run) in [(0, 7), (1, 3), (2, 11)] {
                let v = &mut per_thread[t];
                let n = run.min(v.len());
                blocks.extend(v.drain(..n));
            }
            if blocks.len() == 21 {
                blocks.push(pool.alloc(40 << 10, 64).unwrap());
            }
        }
        let n = blocks.len();
        assert_eq!(n, 3 * per + 1);
        let mut tokens = Vec::new();
        pool.release_many_on_device(&mut blocks, &mut tokens)
            .unwrap();
        assert!(blocks.is_empty());
        let bits: Vec<u64> = tokens.iter().map(|t| t.to_bits()).collect();
        let pool = (!drop_pool_first).then_some(pool);
        for record in bits.chunks(shape.max_payload() as usize / 8) {
            send(&l, &device, shape, KIND_RELEASE, record);
        }
        let start = Instant::now();
        while live.load(Ordering::SeqCst) != 0 && start.elapsed() < Duration::from_secs(10) {
            if let Some(pool) = &pool {
                pool.drain_device_releases();
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(live.load(Ordering::SeqCst), 0, "every chunk went back");
        let Some(pool) = pool else { continue };
        let s = pool.stats();
        assert_eq!(
            (
                s.bytes_in_use,
                s.device_releases.tokens.redeemed,
                s.device_releases.outstanding
            ),
            (0, n as u64, 0)
        );
        assert!(
            pool.report().labels.is_empty(),
            "the labels went with their blocks"
        );
        // Every block allocatable again, none twice.
        let again: Vec<_> = (0..3 * per).map(|_| pool.alloc(256, 64).unwrap()).collect();
        let mut at = addrs(&again);
        at.sort_unstable();
        at.dedup();
        assert_eq!(at.len(), 3 * per);
    }
}

/// A block whose token a drain took counts as lent until that drain has freed it, and
/// `drain_device_releases` returns only once it is back: another thread's drain holds it here
/// (as the drain thread does for a moment) while this one drains and reads the counts. The feed
/// is set on the table directly, so no drain thread races the one here.
#[test]
fn a_block_taken_by_another_drain_counts_as_lent_until_it_is_freed() {
    let pool = pool_with(HostMemorySource);
    let (l, shape) = lane();
    let device = DeviceLaneState::new();
    pool.inner
        .lent
        .set_feed(LaneConsumer::new(l.clone(), shape).unwrap())
        .map_err(|_| ())
        .unwrap();
    let token = pool.alloc(64, 64).unwrap().release_on_device().unwrap();
    send(&l, &device, shape, KIND_RELEASE, &[token.to_bits()]);
    let (taken, counted) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
    std::thread::scope(|s| {
        let other = s.spawn(|| {
            let mut out = Vec::new();
            let (n, in_hand) = pool.inner.lent.drain(&mut out, true);
            assert_eq!((n, in_hand.len()), (1, 1));
            taken.wait();
            // Held until this thread's counts were read, then a moment more, so that the drain
            // below mostly finds the block still in hand and has to wait for it (a slower one,
            // as under Miri, finds it freed: the counts after it hold either way).
            counted.wait();
            std::thread::sleep(Duration::from_millis(50));
            super::super::block::free_lent(&mut out);
            drop(in_hand);
        });
        taken.wait();
        assert_eq!(pool.lent_blocks(), 1, "taken, not freed yet");
        assert_eq!(pool.stats().device_releases.outstanding, 1);
        counted.wait();
        assert_eq!(
            pool.drain_device_releases(),
            0,
            "nothing left for this drain"
        );
        assert_eq!(pool.lent_blocks(), 0);
        assert_eq!(pool.stats().bytes_in_use, 0, "back when the drain returns");
        other.join().unwrap();
    });
}
