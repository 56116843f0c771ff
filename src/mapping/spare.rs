//! Mappings of their own that freed raw allocations leave for the next allocation of their size.
//!
//! A raw allocation above [`CARVE_MAX`](super::carve::CARVE_MAX) maps memory of its own: a
//! Vulkan allocation, its export and CUDA import, an address range, the map and the access, and
//! as many steps back when it is freed — hundreds of µs in all. A program that allocates and
//! frees buffers of one size in a loop (vkgdr 0.1's users do, from Python) pays them every time.
//! So a [`Gpu`](crate::Gpu) keeps the mappings of its last such frees, at most [`SPARE_MAX`]
//! bytes each and [`SPARE_BYTES`] in all (the oldest go first), and hands one to the next
//! allocation of exactly its size.
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

/// The largest mapping kept (bytes asked for, rounded to 4 KiB): frame-sized buffers of tens of
/// MiB that a loop allocates and frees take no driver call (a 16 MiB mapping of its own costs
/// about a millisecond to make and free; figures: BENCHMARKS.md, 'The link, tail latency, the
/// pool and Python on 2 × H200').
pub const SPARE_MAX: u64 = 32 << 20;
/// The most bytes kept in all: device and BAR memory a process holds beyond what it uses, given
/// back by [`Gpu::trim`](crate::Gpu::trim) and to an allocation that runs out of memory.
pub const SPARE_BYTES: u64 = 64 << 20;

/// The spare values and the rule for keeping them: pure, so that it is tested without a GPU.
/// `T` is a mapping in the library ([`MappedMemory`](super::vmm::MappedMemory)).
pub(crate) struct Spares<T> {
    /// `(size, value)`, oldest first.
    kept: Mutex<VecDeque<(u64, T)>>,
    max_one: u64,
    max_total: u64,
}

impl<T> Spares<T> {
    /// Keeps values of at most `max_one` bytes, `max_total` bytes in all.
    pub(crate) fn new(max_one: u64, max_total: u64) -> Spares<T> {
        Spares {
            kept: Mutex::new(VecDeque::new()),
            max_one,
            max_total,
        }
    }

    /// The newest value kept for exactly `size` bytes.
    pub(crate) fn take(&self, size: u64) -> Option<T> {
        let mut kept = self.kept.lock();
        let i = kept.iter().rposition(|&(s, _)| s == size)?;
        kept.remove(i).map(|(_, v)| v)
    }

    /// Offers `value` of `size` bytes. Returns what is not kept (the value itself where it is
    /// larger than a spare may be, the oldest values where the total would pass the limit), for
    /// the caller to drop outside the lock.
    #[must_use = "the values not kept are to be dropped by the caller, outside the lock"]
    pub(crate) fn give(&self, size: u64, value: T) -> Vec<T> {
        if size > self.max_one || size > self.max_total {
            return vec![value];
        }
        let mut kept = self.kept.lock();
        let mut total: u64 = kept.iter().map(|&(s, _)| s).sum::<u64>() + size;
        let mut out = Vec::new();
        while total > self.max_total {
            let Some((s, v)) = kept.pop_front() else {
                break;
            };
            total -= s;
            out.push(v);
        }
        kept.push_back((size, value));
        out
    }

    /// Every value kept, for the caller to drop outside the lock.
    #[must_use = "the values are to be dropped by the caller, outside the lock"]
    pub(crate) fn drain(&self) -> Vec<T> {
        self.kept.lock().drain(..).map(|(_, v)| v).collect()
    }

    /// How many values are kept and their bytes.
    pub(crate) fn held(&self) -> (u64, u64) {
        let kept = self.kept.lock();
        (kept.len() as u64, kept.iter().map(|&(s, _)| s).sum())
    }

    /// Whether none is kept.
    pub(crate) fn is_empty(&self) -> bool {
        self.kept.lock().is_empty()
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
    use super::Spares;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_value_is_taken_back_only_for_its_own_size_newest_first() {
        let spares = Spares::new(8 * MIB, 16 * MIB);
        assert!(spares.give(2 * MIB, "a").is_empty());
        assert!(spares.give(4 * MIB, "b").is_empty());
        assert!(spares.give(2 * MIB, "c").is_empty());
        assert_eq!(spares.held(), (3, 8 * MIB));
        assert_eq!(spares.take(3 * MIB), None);
        assert_eq!(spares.take(2 * MIB), Some("c"));
        assert_eq!(spares.take(2 * MIB), Some("a"));
        assert_eq!(spares.take(2 * MIB), None);
        assert_eq!(spares.held(), (1, 4 * MIB));
    }

    #[test]
    fn too_large_a_value_is_handed_back_at_once() {
        let spares = Spares::new(8 * MIB, 16 * MIB);
        assert_eq!(spares.give(8 * MIB + 4096, "big"), vec!["big"]);
        assert!(spares.is_empty());
        // A limit on the total below the limit on one value still holds.
        let small = Spares::new(8 * MIB, 4 * MIB);
        assert_eq!(small.give(6 * MIB, "x"), vec!["x"]);
    }

    #[test]
    fn the_oldest_go_once_the_total_would_pass_the_limit() {
        let spares = Spares::new(8 * MIB, 16 * MIB);
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
