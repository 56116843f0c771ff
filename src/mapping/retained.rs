//! What a [`Gpu`](crate::Gpu) keeps between allocations, by name ([`Retained`],
//! [`Gpu::retained`](crate::Gpu::retained)): its live raw allocations, the caches it keeps for
//! later ones and the objects it made on first use.
//!
//! Why: NVML's BAR1 used and the free VRAM are figures of the whole device, and the driver keeps
//! memory of its own for a process (page tables, its own pools of events and channels) that no
//! call of ours names. A check that nothing stayed behind (`vkgdr soak`'s figures before and
//! after) can tell growth of ours from anyone else's only if the library says what it holds
//! itself. How each kind of item shows in the device's figures is [`RetainedKind`]'s to say.

/// How a [`RetainedItem`] shows in the device's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetainedKind {
    /// Device memory mapped through the BAR: each byte counts once in the VRAM in use and twice
    /// in NVML's BAR1 used (measured on an H100), in whole VMM granules (2 MiB there).
    Bar,
    /// Pinned host memory: counts in neither.
    Host,
    /// Driver objects (streams, events): the driver's memory for them is its own, not counted
    /// here in bytes.
    DriverObjects,
    /// Releases waiting for GPU work: their memory still counts as in use, in the items it
    /// belongs to (`bytes` is 0).
    Releases,
}

/// One thing a [`Gpu`](crate::Gpu) holds: how many and how many bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetainedItem {
    /// What it is (`"raw allocations"`, `"carved granules"`, ...), the same for every report.
    pub name: &'static str,
    /// How it shows in the device's figures.
    pub kind: RetainedKind,
    /// How many.
    pub count: u64,
    /// How many bytes (0 for driver objects and waiting releases).
    pub bytes: u64,
}

impl RetainedItem {
    /// Whether it holds more than `earlier` (more of them, or more bytes).
    pub fn grew_since(&self, earlier: &RetainedItem) -> bool {
        self.count > earlier.count || self.bytes > earlier.bytes
    }
}

/// What one [`Gpu`](crate::Gpu) holds, item by item, always the same items in the same order
/// (an item of nothing has a count of 0), so two reports line up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retained {
    /// The items.
    pub items: Vec<RetainedItem>,
    /// Event fences made since the handle was opened: releases for which no completion word
    /// could be had (none made yet, or the driver refused the stream write), each one a
    /// `cuEventCreate` instead. Not a holding, a count of a rare path taken: the driver keeps
    /// pools for events of its own.
    pub event_fences_made: u64,
    /// The most event fences alive at once since the handle was opened: a driver's pool of
    /// events grows to its peak and keeps it, so a new peak late in a run can leave memory of
    /// the driver's behind.
    pub event_fences_peak: u64,
}

/// The items' names, in report order.
pub mod names {
    /// Live raw allocations (user memory, pool chunks, rings' memory): [`crate::Gpu::allocations`].
    pub const RAW_ALLOCATIONS: &str = "raw allocations";
    /// Shared granules small raw allocations are carved from (one empty one is kept).
    pub const CARVED_GRANULES: &str = "carved granules";
    /// Mappings of freed raw allocations, kept for the next allocation of their size (within
    /// [`crate::Gpu::spare_limits`]; [`crate::Gpu::trim`] gives them back).
    pub const SPARE_MAPPINGS: &str = "spare mappings";
    /// Pinned host memory holding the release fences' completion words.
    pub const COMPLETION_WORDS: &str = "completion words";
    /// The library's stream for synchronous copies.
    pub const COPY_STREAM: &str = "copy stream";
    /// Idle sets of pinned buffers (with a stream and events) for staged reads.
    pub const STAGED_READ_SETS: &str = "staged-read sets";
    /// `cuMemHostAlloc` buffers copies read from, kept for reuse.
    pub const HOST_STAGING_BUFFERS: &str = "host staging buffers";
    /// Releases waiting for GPU work queued before them.
    pub const RELEASES_WAITING: &str = "releases waiting";
    /// Event fences alive (releases that wait on a CUDA event).
    pub const EVENT_FENCES: &str = "event fences";
}

impl Retained {
    /// The item called `name` ([`names`]).
    pub fn get(&self, name: &str) -> Option<&RetainedItem> {
        self.items.iter().find(|i| i.name == name)
    }

    /// Each item that holds more than in `earlier`, with its earlier form: `(before, now)`.
    pub fn grown_since(&self, earlier: &Retained) -> Vec<(RetainedItem, RetainedItem)> {
        self.items
            .iter()
            .filter_map(|now| {
                let before = earlier.get(now.name).copied().unwrap_or(RetainedItem {
                    count: 0,
                    bytes: 0,
                    ..*now
                });
                now.grew_since(&before).then_some((before, *now))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(name: &'static str, count: u64, bytes: u64) -> RetainedItem {
        RetainedItem {
            name,
            kind: RetainedKind::Bar,
            count,
            bytes,
        }
    }

    #[test]
    fn growth_is_more_of_an_item_or_more_bytes() {
        let before = Retained {
            items: vec![item("a", 1, 4096), item("b", 2, 0), item("c", 1, 2 << 20)],
            event_fences_made: 0,
            event_fences_peak: 0,
        };
        let after = Retained {
            items: vec![item("a", 1, 8192), item("b", 1, 0), item("c", 1, 2 << 20)],
            event_fences_made: 3,
            event_fences_peak: 2,
        };
        let grown = after.grown_since(&before);
        assert_eq!(grown, [(item("a", 1, 4096), item("a", 1, 8192))]);
        assert!(before.grown_since(&before).is_empty());
        // Fewer bytes is no growth, more of an item is.
        assert_eq!(
            before.grown_since(&after),
            [(item("b", 1, 0), item("b", 2, 0))]
        );
        // An item the earlier report lacks grows from nothing.
        let newer = Retained {
            items: vec![item("d", 1, 0)],
            event_fences_made: 0,
            event_fences_peak: 0,
        };
        assert_eq!(newer.grown_since(&before).len(), 1);
    }
}
