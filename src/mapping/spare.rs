//! Mappings of their own that freed raw allocations leave for the next allocation of their size.
//!
//! A raw allocation above [`CARVE_MAX`](super::carve::CARVE_MAX) maps memory of its own: a
//! Vulkan allocation, its export and CUDA import, an address range, the map and the access, and
//! as many steps back when it is freed — hundreds of µs in all, milliseconds from tens of MiB. A
//! program that allocates and frees buffers of one size in a loop (vkgdr 0.1's users do, from
//! Python) pays them every time. So a [`Gpu`](crate::Gpu) keeps the mappings of its last such
//! frees, within its [`SpareLimits`] (the oldest go first), and hands one to the next allocation
//! of exactly its size.
//!
//! A mapping comes here only when its release drops it, that is after its release fence passed,
//! so the GPU work queued before the free is done before the bytes are handed out again (as for
//! a carved piece). Never kept: a mapping whose fd was exported (another process may still map
//! it) or that a peer GPU was granted (the next owner did not grant it). [`Gpu::trim`] gives the
//! spares back, and so does an allocation that runs out of device memory before it tries again.
//! Spares are BAR and device memory that [`Gpu::retained`] lists as `spare mappings`.
//!
//! [`Gpu::trim`]: crate::Gpu::trim
//! [`Gpu::retained`]: crate::Gpu::retained

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::core::sync::lock::Mutex;
use crate::mapping::vmm::MappedMemory;

/// How much of the mappings freed raw allocations leave a [`Gpu`](crate::Gpu) keeps for the next
/// allocation of their size: the largest mapping kept and the bytes kept in all. Chosen when the
/// handle opens ([`OpenOptions::spare_limits`](crate::OpenOptions::spare_limits)), by default
/// [`SpareLimits::for_heap`] of the device's BAR heap, and changed at any time with
/// [`Gpu::set_spare_limits`](crate::Gpu::set_spare_limits).
///
/// ```
/// use vkgdr::SpareLimits;
/// const MIB: u64 = 1 << 20;
/// // An H200's BAR heap (140.4 GiB): frames of up to 128 MiB are kept, 256 MiB in all.
/// let h200 = SpareLimits::for_heap(140 << 30);
/// assert_eq!((h200.each, h200.total), (128 * MIB, 256 * MIB));
/// // A small heap keeps the least default: 32 MiB each, 64 MiB in all.
/// assert_eq!(SpareLimits::for_heap(256 * MIB), SpareLimits::LEAST);
/// // None at all: every free above 1 MiB goes back to the driver.
/// let options = vkgdr::OpenOptions::new().spare_limits(SpareLimits::NONE);
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpareLimits {
    /// The largest mapping kept, in bytes asked for rounded up to 4 KiB.
    pub each: u64,
    /// The most bytes kept in all: device and BAR memory the process holds beyond what it uses,
    /// given back by [`Gpu::trim`](crate::Gpu::trim) and to an allocation that runs out of
    /// memory.
    pub total: u64,
}

impl SpareLimits {
    /// Nothing kept.
    pub const NONE: SpareLimits = SpareLimits { each: 0, total: 0 };
    /// The least default, that of a device whose BAR heap is under 64 GiB: 32 MiB each
    /// (a 16 MiB mapping of its own costs about a millisecond to make and free; figures:
    /// BENCHMARKS.md, 'The link, tail latency, the pool and Python on 2 × H200'), 64 MiB in all.
    pub const LEAST: SpareLimits = SpareLimits {
        each: 32 << 20,
        total: 64 << 20,
    };
    /// The largest mapping the default keeps, whatever the heap.
    pub const MOST_EACH: u64 = 256 << 20;

    /// The default for a device whose BAR heap (the Vulkan heap BAR allocations come from) holds
    /// `heap` bytes: mappings of up to 1/1024 of the heap, rounded down to a power of two, between
    /// [`LEAST`](Self::LEAST)'s 32 MiB and [`MOST_EACH`](Self::MOST_EACH); two of them in all
    /// (1/512 of the heap at most). Frame buffers scale with the device: an H100's 80 GB keep
    /// 64 MiB frames, an H200's 141 GB 128 MiB ones.
    pub fn for_heap(heap: u64) -> SpareLimits {
        let scaled = match heap / 1024 {
            0 => 0,
            n => 1 << n.ilog2(),
        };
        let each = scaled.clamp(Self::LEAST.each, Self::MOST_EACH);
        SpareLimits {
            each,
            total: 2 * each,
        }
    }
}

/// The spare values and the rule for keeping them: pure, so that it is tested without a GPU.
/// `T` is a mapping in the library ([`MappedMemory`](super::vmm::MappedMemory)).
pub(crate) struct Spares<T> {
    state: Mutex<State<T>>,
}

/// What [`Spares::take`] gives an allocation.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reuse<T> {
    /// The newest value kept for exactly its size.
    Taken(T),
    /// None kept for its size; a value of its size is kept when given.
    Keepable,
    /// Its size is past the limits: a value of its size is never kept.
    PastLimits,
}

/// What the lock of a [`Spares`] guards: the values and the limits they are kept within.
struct State<T> {
    /// `(size, value)`, oldest first.
    kept: VecDeque<(u64, T)>,
    limits: SpareLimits,
}

impl<T> State<T> {
    fn may_keep(&self, size: u64) -> bool {
        size <= self.limits.each && size <= self.limits.total
    }

    /// Takes out the oldest values until the total with `adding` more bytes is within the limit,
    /// and every value larger than a spare may be.
    fn evict(&mut self, adding: u64) -> Vec<T> {
        let mut out = Vec::new();
        let each = self.limits.each;
        let mut i = 0;
        while i < self.kept.len() {
            if self.kept[i].0 > each {
                out.extend(self.kept.remove(i).map(|(_, v)| v));
            } else {
                i += 1;
            }
        }
        let mut total: u64 = self.kept.iter().map(|&(s, _)| s).sum::<u64>() + adding;
        while total > self.limits.total {
            let Some((s, v)) = self.kept.pop_front() else {
                break;
            };
            total -= s;
            out.push(v);
        }
        out
    }
}

impl<T> Spares<T> {
    /// Keeps values within `limits`.
    pub(crate) fn new(limits: SpareLimits) -> Spares<T> {
        Spares {
            state: Mutex::new(State {
                kept: VecDeque::new(),
                limits,
            }),
        }
    }

    /// What is kept at most.
    pub(crate) fn limits(&self) -> SpareLimits {
        self.state.lock().limits
    }

    /// Keeps values within `limits` from now on. Returns those kept beyond them (larger than a
    /// spare may now be, then the oldest until the total is within the limit), for the caller to
    /// drop outside the lock.
    #[must_use = "the values not kept are to be dropped by the caller, outside the lock"]
    pub(crate) fn set_limits(&self, limits: SpareLimits) -> Vec<T> {
        let mut state = self.state.lock();
        state.limits = limits;
        state.evict(0)
    }

    /// What an allocation of `size` bytes gets, decided and taken under one lock: the newest
    /// value kept for exactly its size, or whether a value of its size would be kept.
    pub(crate) fn take(&self, size: u64) -> Reuse<T> {
        let mut state = self.state.lock();
        if !state.may_keep(size) {
            return Reuse::PastLimits;
        }
        let newest = state.kept.iter().rposition(|&(s, _)| s == size);
        newest
            .and_then(|i| state.kept.remove(i))
            .map_or(Reuse::Keepable, |(_, v)| Reuse::Taken(v))
    }

    /// Offers `value` of `size` bytes. Returns what is not kept (the value itself where it is
    /// larger than a spare may be, the oldest values where the total would pass the limit), for
    /// the caller to drop outside the lock.
    #[must_use = "the values not kept are to be dropped by the caller, outside the lock"]
    pub(crate) fn give(&self, size: u64, value: T) -> Vec<T> {
        let mut state = self.state.lock();
        if !state.may_keep(size) {
            return vec![value];
        }
        let out = state.evict(size);
        state.kept.push_back((size, value));
        out
    }

    /// Every value kept, for the caller to drop outside the lock.
    #[must_use = "the values are to be dropped by the caller, outside the lock"]
    pub(crate) fn drain(&self) -> Vec<T> {
        self.state.lock().kept.drain(..).map(|(_, v)| v).collect()
    }

    /// How many values are kept and their bytes.
    pub(crate) fn held(&self) -> (u64, u64) {
        let state = self.state.lock();
        (
            state.kept.len() as u64,
            state.kept.iter().map(|&(s, _)| s).sum(),
        )
    }

    /// Whether none is kept.
    pub(crate) fn is_empty(&self) -> bool {
        self.state.lock().kept.is_empty()
    }
}

/// A raw allocation's mapping of its own, which goes to its `Gpu`'s spares when its release
/// drops it, unless its fd was exported or a peer was granted access.
pub(crate) struct Kept {
    /// `None` only while dropping.
    memory: Option<MappedMemory>,
    /// The bytes asked for, rounded to 4 KiB: the size the next allocation must ask for.
    size: u64,
    spares: Arc<Spares<MappedMemory>>,
    reusable: AtomicBool,
}

impl Kept {
    /// `memory`, mapped for an allocation of `size` bytes, to go back to `spares`.
    pub(crate) fn new(memory: MappedMemory, size: u64, spares: Arc<Spares<MappedMemory>>) -> Kept {
        Kept {
            memory: Some(memory),
            size,
            spares,
            reusable: AtomicBool::new(true),
        }
    }

    /// The mapping.
    pub(crate) fn mapping(&self) -> &MappedMemory {
        // Taken only by `drop`.
        self.memory
            .as_ref()
            .expect("a kept mapping is whole until dropped")
    }

    /// Makes the mapping go back to the driver when released, never to another allocation: its
    /// fd was exported, or a peer GPU was granted access.
    pub(crate) fn never_reuse(&self) {
        self.reusable.store(false, Ordering::Relaxed);
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        let Some(memory) = self.memory.take() else {
            return;
        };
        if self.reusable.load(Ordering::Relaxed) {
            // What is not kept unmaps here, outside the spares' lock.
            drop(self.spares.give(self.size, memory));
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{Reuse, SpareLimits, Spares};

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn limits(each: u64, total: u64) -> SpareLimits {
        SpareLimits { each, total }
    }

    #[test]
    fn the_default_scales_with_the_heap_within_its_bounds() {
        let each = |heap| SpareLimits::for_heap(heap).each;
        // 1/1024 of the heap, rounded down to a power of two.
        assert_eq!(each(140 * GIB + 400 * MIB), 128 * MIB, "H200");
        assert_eq!(each(79 * GIB + 600 * MIB), 64 * MIB, "H100 80GB");
        assert_eq!(each(64 * GIB), 64 * MIB);
        assert_eq!(each(64 * GIB - 4096), 32 * MIB);
        // Within 32 MiB and 256 MiB, whatever the heap.
        assert_eq!(each(256 * MIB), 32 * MIB);
        assert_eq!(each(0), 32 * MIB);
        assert_eq!(each(1 << 40), 256 * MIB);
        assert_eq!(each(u64::MAX), 256 * MIB);
        for heap in [0, 1, 300 * MIB, 33 * GIB, 100 * GIB, 1 << 50, u64::MAX] {
            let l = SpareLimits::for_heap(heap);
            assert_eq!(l.total, 2 * l.each, "two of the largest in all ({heap})");
            assert!(l.each.is_power_of_two(), "{heap}");
        }
        assert_eq!(SpareLimits::for_heap(0), SpareLimits::LEAST);
    }

    #[test]
    fn no_limits_keep_nothing() {
        let spares = Spares::new(SpareLimits::NONE);
        assert_eq!(spares.take(4096), Reuse::PastLimits);
        assert_eq!(spares.give(4096, "x"), vec!["x"]);
        assert!(spares.is_empty());
    }

    #[test]
    fn a_value_is_taken_back_only_for_its_own_size_newest_first() {
        let spares = Spares::new(limits(8 * MIB, 16 * MIB));
        assert!(spares.give(2 * MIB, "a").is_empty());
        assert!(spares.give(4 * MIB, "b").is_empty());
        assert!(spares.give(2 * MIB, "c").is_empty());
        assert_eq!(spares.held(), (3, 8 * MIB));
        assert_eq!(spares.take(3 * MIB), Reuse::Keepable);
        assert_eq!(spares.take(2 * MIB), Reuse::Taken("c"));
        assert_eq!(spares.take(2 * MIB), Reuse::Taken("a"));
        assert_eq!(spares.take(2 * MIB), Reuse::Keepable);
        assert_eq!(spares.held(), (1, 4 * MIB));
    }

    #[test]
    fn too_large_a_value_is_handed_back_at_once() {
        let spares = Spares::new(limits(8 * MIB, 16 * MIB));
        assert_eq!(spares.take(8 * MIB), Reuse::Keepable);
        assert_eq!(spares.take(8 * MIB + 4096), Reuse::PastLimits);
        assert_eq!(spares.give(8 * MIB + 4096, "big"), vec!["big"]);
        assert!(spares.is_empty());
        // A limit on the total below the limit on one value still holds.
        let small = Spares::new(limits(8 * MIB, 4 * MIB));
        assert_eq!(small.take(6 * MIB), Reuse::PastLimits);
        assert_eq!(small.give(6 * MIB, "x"), vec!["x"]);
    }

    #[test]
    fn new_limits_give_back_what_is_kept_beyond_them() {
        let spares = Spares::new(limits(8 * MIB, 16 * MIB));
        for (size, v) in [(2, "a"), (8, "b"), (2, "c"), (4, "d")] {
            assert!(spares.give(size * MIB, v).is_empty(), "{v}");
        }
        // Larger than a spare may now be first, then the oldest until the total fits.
        assert_eq!(spares.set_limits(limits(4 * MIB, 6 * MIB)), vec!["b", "a"]);
        assert_eq!(spares.held(), (2, 6 * MIB));
        assert_eq!(spares.limits(), limits(4 * MIB, 6 * MIB));
        assert_eq!(spares.give(8 * MIB, "e"), vec!["e"], "past the new limit");
        assert_eq!(spares.set_limits(SpareLimits::NONE), vec!["c", "d"]);
        assert!(spares.is_empty());
        // Raised again, values are kept again.
        assert!(spares.set_limits(limits(8 * MIB, 16 * MIB)).is_empty());
        assert!(spares.give(8 * MIB, "f").is_empty());
        assert_eq!(spares.take(8 * MIB), Reuse::Taken("f"));
    }

    proptest! {
        /// Whatever is given, taken and limited, in any order: what is kept stays within the
        /// limits of the moment, a value comes back only for its own size and only once, and
        /// every value given is kept, handed back or taken, never lost nor duplicated.
        #[test]
        fn kept_values_stay_within_the_limits_and_none_is_lost(
            ops in proptest::collection::vec((0u8..4, 1u64..12, 0u64..40), 1..200),
        ) {
            let spares = Spares::new(limits(8 * MIB, 16 * MIB));
            let mut next = 0u64;
            let mut given = Vec::new();
            let mut back = Vec::new();
            let mut sizes = std::collections::HashMap::new();
            for (op, a, b) in ops {
                match op {
                    0 | 1 => {
                        let size = a * MIB;
                        next += 1;
                        given.push(next);
                        sizes.insert(next, size);
                        back.extend(spares.give(size, next));
                    }
                    2 => {
                        if let Reuse::Taken(v) = spares.take(a * MIB) {
                            prop_assert_eq!(sizes[&v], a * MIB);
                            back.push(v);
                        }
                    }
                    _ => back.extend(spares.set_limits(limits(a * MIB, b * MIB))),
                }
                let l = spares.limits();
                let (count, bytes) = spares.held();
                prop_assert!(bytes <= l.total, "{} kept past {}", bytes, l.total);
                let kept = spares.drain();
                prop_assert_eq!(kept.len() as u64, count);
                prop_assert!(kept.iter().all(|v| sizes[v] <= l.each));
                for v in kept {
                    // Given back in order: the drain leaves it as it was.
                    prop_assert!(spares.give(sizes[&v], v).is_empty());
                }
            }
            back.extend(spares.drain());
            back.sort_unstable();
            prop_assert_eq!(back, given);
        }
    }

    #[test]
    fn the_oldest_go_once_the_total_would_pass_the_limit() {
        let spares = Spares::new(limits(8 * MIB, 16 * MIB));
        for (i, v) in ["a", "b", "c", "d"].into_iter().enumerate() {
            assert!(spares.give(4 * MIB, v).is_empty(), "value {i}");
        }
        assert_eq!(spares.held(), (4, 16 * MIB));
        assert_eq!(spares.give(8 * MIB, "e"), vec!["a", "b"]);
        assert_eq!(spares.held(), (3, 16 * MIB));
        assert_eq!(spares.drain(), vec!["c", "d", "e"]);
        assert!(spares.is_empty());
        assert_eq!(spares.held(), (0, 0));
    }
}
