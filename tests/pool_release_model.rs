//! Device-side releases against a model (proptest): a pool over host memory whose release feed
//! is two lanes in plain memory, with the core's producer model as the kernel. Random
//! allocations, host frees, lends (`Block::release_on_device`, and batches of
//! `Pool::release_many_on_device`, some with another pool's block that stops them), genuine releases on either lane,
//! hostile ones (forged, another pool's, repeated, stale after a reclaim, foreign and malformed
//! records), drains, trims and reclaims interleave, while the pool's drain thread drains too.
//!
//! Checked: a lent block is never handed out again before its token was sent (every new block
//! is disjoint from every lent one, and a lent block's stamp is intact when its kernel sends the
//! token); each genuine token frees its block once (the pool's counts match the model's);
//! every hostile token or record is refused and counted, and frees nothing; at the end every
//! block is back and the pool is empty.
// The loom feature swaps the core's atomics for loom's, which work only inside a model.
#![cfg(not(feature = "loom"))]

use std::sync::Arc;

use proptest::prelude::*;
use vkgdr::chunk::HostMemorySource;
use vkgdr::pool::RefusedReason;
use vkgdr::ring::core::d2h::{
    DeviceLaneState, HostLane, LaneConsumer, LaneShape, ProducerModel, Refusal, ReleaseToken,
    KIND_RELEASE,
};
use vkgdr::{Block, Mapping, Pool, PoolConfig};

#[derive(Debug, Clone)]
enum Op {
    /// Allocates a block of size class `c`.
    Alloc(u8),
    /// Drops live block `i` (modulo) on the host.
    Free(u8),
    /// Lends live block `i`.
    Lend(u8),
    /// Lends up to `n` live blocks from `i` on in one batch, another pool's block at `at`
    /// (modulo the batch's length + 1) when `foreign`: the batch stops there.
    LendMany { i: u8, n: u8, foreign: bool, at: u8 },
    /// The kernel of lent block `i` checks its stamp and sends its token on lane `l`.
    Release(u8, u8),
    /// A hostile token or record on lane `l`.
    Hostile(Hostile, u8),
    /// Drains every release that arrived.
    Drain,
    /// Trims the pool.
    Trim,
    /// Takes every lent block back (the kernels are done).
    Reclaim,
}

#[derive(Debug, Clone, Copy)]
enum Hostile {
    /// A token of this pool's tag for an entry never issued.
    Forged(u16),
    /// A token of another pool (one of its lent blocks).
    OtherPool,
    /// A token sent already.
    Repeat(u8),
    /// A token of a block reclaimed by the host.
    Stale(u8),
    /// A record of a kernel's own kind.
    Foreign,
    /// A release record whose length is not a multiple of 8.
    Malformed,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4).prop_map(Op::Alloc),
        1 => any::<u8>().prop_map(Op::Free),
        3 => any::<u8>().prop_map(Op::Lend),
        2 => (any::<u8>(), 0u8..6, any::<bool>(), any::<u8>())
            .prop_map(|(i, n, foreign, at)| Op::LendMany { i, n, foreign, at }),
        3 => (any::<u8>(), 0u8..2).prop_map(|(i, l)| Op::Release(i, l)),
        2 => (hostile(), 0u8..2).prop_map(|(h, l)| Op::Hostile(h, l)),
        1 => Just(Op::Drain),
        1 => Just(Op::Trim),
        1 => Just(Op::Reclaim),
    ]
}

fn hostile() -> impl Strategy<Value = Hostile> {
    prop_oneof![
        (1000u16..2000).prop_map(Hostile::Forged),
        Just(Hostile::OtherPool),
        any::<u8>().prop_map(Hostile::Repeat),
        any::<u8>().prop_map(Hostile::Stale),
        Just(Hostile::Foreign),
        Just(Hostile::Malformed),
    ]
}

const SIZES: [u64; 4] = [64, 200, 1024, 5000];
const SHAPE_SLOTS: u32 = 16;

/// A pool with a two-lane feed in host memory, and the lanes' device side.
struct Rig {
    pool: Pool,
    lanes: Vec<(Arc<HostLane>, DeviceLaneState)>,
    shape: LaneShape,
}

impl Rig {
    fn new() -> Rig {
        let cfg = PoolConfig {
            chunk_size: 64 << 10,
            max_chunk_size: 64 << 10,
            dedicated_threshold: 32 << 10,
            shards: 2,
            ..Default::default()
        };
        let pool = Pool::new(HostMemorySource, cfg).unwrap();
        let shape = LaneShape::new(SHAPE_SLOTS, 64).unwrap();
        let lanes: Vec<_> = (0..2)
            .map(|_| (Arc::new(HostLane::new(shape)), DeviceLaneState::new()))
            .collect();
        let feed: Vec<_> = lanes
            .iter()
            .map(|(l, _)| LaneConsumer::new(l.clone(), shape).unwrap())
            .collect();
        pool.set_release_feed(feed)
            .map_err(|_| "a feed already")
            .unwrap();
        Rig { pool, lanes, shape }
    }

    /// Publishes a record on lane `l` as a kernel would, waiting (draining) while it is full.
    fn publish(&self, l: u8, kind: u32, payload: &[u8]) {
        let (lane, device) = &self.lanes[l as usize % 2];
        for _ in 0..10_000 {
            match ProducerModel::new(&**lane, device, self.shape, 4).publish(kind, payload) {
                Ok(_) => return,
                Err(Refusal::Stalled) => {
                    self.pool.drain_device_releases();
                }
                Err(e) => panic!("publish: {e}"),
            }
        }
        panic!("lane {l} stayed full");
    }

    fn send(&self, l: u8, tokens: &[u64]) {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        self.publish(l, KIND_RELEASE, &bytes);
    }
}

/// A block lent and not released yet: its token, stamp and bytes.
struct Lent {
    token: ReleaseToken,
    stamp: u64,
    at: *const u8,
    len: u64,
}

fn stamp(block: &mut Block, id: u64) {
    block.write_pod(0, &[id]).unwrap();
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let rig = Rig::new();
    let other = Rig::new();
    let foreign_block = other.pool.alloc(64, 64).unwrap();
    let foreign = foreign_block.release_on_device().unwrap();
    let mut live: Vec<Block> = Vec::new();
    let mut lent: Vec<Lent> = Vec::new();
    let mut sent: Vec<u64> = Vec::new();
    let mut revoked: Vec<u64> = Vec::new();
    let (mut next_id, mut genuine, mut hostile_tokens, mut forged) = (1u64, 0u64, 0u64, 0u64);
    let (mut foreign_records, mut malformed, mut reclaimed) = (0u64, 0u64, 0u64);
    let tag = rig.pool_tag();
    genuine += 1;
    for op in ops {
        match op {
            Op::Alloc(c) => {
                let size = SIZES[c as usize];
                let mut b = rig.pool.alloc(size, 64).unwrap();
                let (start, end) = (b.host_ptr() as usize, b.host_ptr() as usize + size as usize);
                for l in &lent {
                    let (ls, le) = (l.at as usize, l.at as usize + l.len as usize);
                    prop_assert!(
                        end <= ls || le <= start,
                        "a new block overlaps lent block {}",
                        l.stamp
                    );
                }
                stamp(&mut b, next_id);
                next_id += 1;
                live.push(b);
            }
            Op::Free(i) if !live.is_empty() => {
                live.swap_remove(i as usize % live.len());
            }
            Op::Lend(i) if !live.is_empty() => {
                let b = live.swap_remove(i as usize % live.len());
                let mut id = [0u64];
                b.read_pod(0, &mut id).unwrap();
                let (at, len) = (b.host_ptr().cast_const(), b.size());
                let token = b.release_on_device().unwrap();
                lent.push(Lent {
                    token,
                    stamp: id[0],
                    at,
                    len,
                });
            }
            Op::LendMany { i, n, foreign, at } => {
                let mut batch = Vec::new();
                for _ in 0..n.min(live.len() as u8) {
                    batch.push(live.swap_remove(i as usize % live.len()));
                }
                let stop = foreign.then(|| at as usize % (batch.len() + 1));
                if let Some(k) = stop {
                    batch.insert(k, other.pool.alloc(64, 64).unwrap());
                }
                let before: Vec<(*const u8, u64, u64)> = batch
                    .iter()
                    .map(|b| {
                        let mut id = [0u64];
                        b.read_pod(0, &mut id).unwrap();
                        (b.host_ptr().cast_const(), b.size(), id[0])
                    })
                    .collect();
                let mut tokens = Vec::new();
                let verdict = rig.pool.release_many_on_device(&mut batch, &mut tokens);
                let lent_n = stop.unwrap_or(before.len());
                prop_assert_eq!(
                    verdict,
                    if stop.is_some() {
                        Err(RefusedReason::OtherPool)
                    } else {
                        Ok(())
                    }
                );
                prop_assert_eq!(tokens.len(), lent_n);
                // The refused block and those after it are back, in order, not lent.
                let back: Vec<*const u8> =
                    batch.iter().map(|b| b.host_ptr().cast_const()).collect();
                let expected: Vec<*const u8> = before[lent_n..].iter().map(|b| b.0).collect();
                prop_assert_eq!(back, expected);
                for (token, &(at, len, stamp)) in tokens.into_iter().zip(&before) {
                    lent.push(Lent {
                        token,
                        stamp,
                        at,
                        len,
                    });
                }
                if stop.is_some() {
                    drop(batch.remove(0)); // the other pool's block, freed to it
                }
                live.extend(batch);
                rig.pool.drain_device_releases();
                prop_assert_eq!(rig.pool.lent_blocks(), lent.len() as u64);
                prop_assert_eq!(other.pool.lent_blocks(), 1, "only its first block is lent");
            }
            Op::Release(i, l) if !lent.is_empty() => {
                let b = lent.swap_remove(i as usize % lent.len());
                // The kernel reads its block: nobody else has written it.
                // SAFETY: the block is lent, so its bytes are still mapped and its own.
                let now = unsafe { (b.at as *const u64).read_unaligned() };
                prop_assert_eq!(now, b.stamp, "a lent block was written before its release");
                rig.send(l, &[b.token.to_bits()]);
                sent.push(b.token.to_bits());
                genuine += 1;
            }
            Op::Hostile(h, l) => match h {
                Hostile::Forged(entry) => {
                    rig.send(l, &[ReleaseToken::new(tag, u32::from(entry), 1).to_bits()]);
                    (hostile_tokens, forged) = (hostile_tokens + 1, forged + 1);
                }
                Hostile::OtherPool => {
                    rig.send(l, &[foreign.to_bits()]);
                    (hostile_tokens, forged) = (hostile_tokens + 1, forged + 1);
                }
                Hostile::Repeat(i) if !sent.is_empty() => {
                    rig.send(l, &[sent[i as usize % sent.len()]]);
                    hostile_tokens += 1;
                }
                Hostile::Stale(i) if !revoked.is_empty() => {
                    rig.send(l, &[revoked[i as usize % revoked.len()]]);
                    hostile_tokens += 1;
                }
                Hostile::Foreign => {
                    rig.publish(l, 5, &7u64.to_le_bytes());
                    foreign_records += 1;
                }
                Hostile::Malformed => {
                    rig.publish(l, KIND_RELEASE, &[1, 2, 3]);
                    malformed += 1;
                }
                _ => {}
            },
            Op::Drain => {
                rig.pool.drain_device_releases();
                prop_assert_eq!(rig.pool.lent_blocks(), lent.len() as u64);
            }
            Op::Trim => {
                rig.pool.trim();
                prop_assert_eq!(rig.pool.lent_blocks(), lent.len() as u64);
            }
            Op::Reclaim => {
                // SAFETY: the model's kernels use no lent block after this point (their tokens
                // are only ever sent again as stale ones).
                let n = unsafe { rig.pool.reclaim_device_releases() };
                prop_assert_eq!(n, lent.len());
                reclaimed += n as u64;
                revoked.extend(lent.drain(..).map(|l| l.token.to_bits()));
            }
            _ => {}
        }
    }
    // Every kernel finishes.
    for b in std::mem::take(&mut lent) {
        rig.send(0, &[b.token.to_bits()]);
        genuine += 1;
    }
    rig.pool.drain_device_releases();
    let s = rig.pool.stats().device_releases;
    prop_assert_eq!(s.outstanding, 0);
    prop_assert_eq!(s.tokens.redeemed, genuine);
    prop_assert_eq!(s.tokens.revoked, reclaimed);
    prop_assert_eq!(s.tokens.refused(), hostile_tokens);
    prop_assert_eq!(s.tokens.forged, forged);
    prop_assert_eq!(
        (s.foreign_records, s.malformed_records),
        (foreign_records, malformed)
    );
    prop_assert!(s.lane_error.is_none());
    drop(live);
    prop_assert_eq!(rig.pool.stats().bytes_in_use, 0);
    prop_assert_eq!(
        other.pool.lent_blocks(),
        1,
        "another pool's block stays lent"
    );
    // SAFETY: no kernel uses it.
    unsafe { other.pool.reclaim_device_releases() };
    Ok(())
}

impl Rig {
    /// This pool's token tag (from a token of its own, taken back at once).
    fn pool_tag(&self) -> u16 {
        let token = self
            .pool
            .alloc(64, 64)
            .unwrap()
            .release_on_device()
            .unwrap();
        self.send(0, &[token.to_bits()]);
        self.pool.drain_device_releases();
        token.tag()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn lent_blocks_come_back_once_and_only_for_their_own_tokens(
        ops in proptest::collection::vec(op(), 1..80)
    ) {
        run(ops)?;
    }
}
