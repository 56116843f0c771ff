//! The pool's registry: the labels of live blocks and the dedicated chunks, kept beside the
//! blocks rather than in them, off the allocation fast path. Reports
//! ([`Pool::report`](super::Pool::report)) read it.

use std::collections::HashMap;
use std::sync::Arc;

use crate::core::sync::lock::Mutex;

/// Which chunk a block lies in: its address identifies it while the block is alive.
pub(super) type ChunkKey = usize;

/// A labeled block in the registry.
#[derive(Clone)]
pub(super) struct LabelEntry {
    pub(super) label: Arc<str>,
    pub(super) size: u64,
}

/// The pool's labels and dedicated chunks, off the allocation fast path.
#[derive(Default)]
pub(super) struct Registry {
    /// Live labeled blocks by (chunk, offset in the chunk).
    pub(super) labels: Mutex<HashMap<(ChunkKey, u64), LabelEntry>>,
    /// Live dedicated chunks by address: their size and the size their block requested.
    pub(super) dedicated: Mutex<HashMap<ChunkKey, (u64, u64)>>,
}
