//! [`LentLane`]: a lane of a shareable [`DeviceRing`] whose producer runs in another process.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::core::ring::layout::WrapMode;
use crate::core::ring::RingError;
use crate::error::{Error, Result};
use crate::mapping::gpu::Gpu;

use super::persistent::DeviceRing;
use super::sink::RingData;

/// One lane of a [`DeviceRing::new_shareable`] ring lent to a producer this process does not
/// run. While it is lent, the lane takes no local producer and no shared reservation; its
/// records arrive through the remote producer's own mapping of the lane's region
/// ([`export_data`](Self::export_data)), and its tail through
/// [`publish`](Self::publish), which the lender calls once it has checked what the producer
/// published. Dropping it ends the loan: the lane's next producer starts where the lent one's
/// last published record ends.
pub struct LentLane {
    ring: Arc<DeviceRing>,
    lane: usize,
    start: (u64, u64),
}

impl std::fmt::Debug for LentLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentLane")
            .field("lane", &self.lane)
            .field("start", &self.start)
            .finish_non_exhaustive()
    }
}

impl DeviceRing {
    /// Lends the first lane that no producer owns and no one has borrowed (a ring made with
    /// [`new_shareable`](Self::new_shareable) only): [`RingError::Claimed`] when every lane is
    /// taken, [`Error::Unsupported`] for a ring whose lanes share one allocation.
    pub fn lend_lane(self: &Arc<Self>) -> Result<LentLane> {
        if !self.shareable {
            return Err(Error::Unsupported(
                "only a ring made with DeviceRing::new_shareable lends its lanes".into(),
            ));
        }
        self.check_running()?;
        let n = self.lanes();
        let mut last = RingError::Claimed;
        for lane in 0..n {
            match self.lane(lane).map(|core| core.lend()) {
                Some(Ok(start)) => {
                    return Ok(LentLane {
                        ring: Arc::clone(self),
                        lane,
                        start,
                    })
                }
                Some(Err(e)) => last = e,
                None => break,
            }
        }
        Err(last.into())
    }
}

impl LentLane {
    /// The lane's number in its ring.
    pub fn lane(&self) -> usize {
        self.lane
    }

    /// The ring the lane belongs to.
    pub fn ring(&self) -> &Arc<DeviceRing> {
        &self.ring
    }

    /// The GPU the ring lives on.
    pub fn gpu(&self) -> &Gpu {
        self.ring.gpu()
    }

    /// The lane's region size.
    pub fn capacity(&self) -> u64 {
        self.core().capacity()
    }

    /// How records meet the end of the region.
    pub fn wrap(&self) -> WrapMode {
        self.core().wrap_mode()
    }

    /// Where the borrower starts: the lane's published end and the next sequence number.
    pub fn start(&self) -> (u64, u64) {
        self.start
    }

    /// The consumer's head for this lane (pinned host memory: a cheap load).
    pub fn head(&self) -> u64 {
        self.ring.head_of(self.lane)
    }

    /// Whether the ring was stopped or its watched consumer has exited: no space will free.
    pub fn consumer_gone(&self) -> bool {
        self.ring.consumer_gone()
    }

    /// The lane's published end (what the consumer may read up to).
    pub fn published(&self) -> u64 {
        self.core().published()
    }

    /// Publishes the borrower's records up to `pos`, `next_seq` numbering the first record after
    /// them: a fence and the tail store, as a local producer's publication. The caller has
    /// checked the pair (`share::lane::check_advance`); the core refuses one that breaks its
    /// rules ([`RingError::BadLentTail`]) and publishes nothing then.
    pub fn publish(&self, pos: u64, next_seq: u64) -> Result<()> {
        // The head the consumer published bounds the space: take it before checking.
        let _ = self.core().reclaim_to(self.head());
        Ok(self.core().lent_published(pos, next_seq)?)
    }

    /// A new fd of the lane's data allocation, its size, and where the lane's region starts in
    /// it: what the borrower maps.
    pub fn export_data(&self) -> Result<(OwnedFd, u64, u64)> {
        let sink = self.core().sink();
        match &self.ring.memory.data[sink.data_index] {
            RingData::Raw(memory) => {
                let (fd, size) = memory.export_fd()?;
                Ok((fd, size, sink.data_offset))
            }
            RingData::Mirrored(_) => Err(Error::Unsupported(
                "a mirrored ring's lanes cannot be lent".into(),
            )),
        }
    }

    fn core(&self) -> &crate::core::ring::RingCore<super::sink::BarSink> {
        // In range: the lane was found in this ring.
        self.ring.lane(self.lane).expect("a lent lane exists")
    }
}

impl Drop for LentLane {
    fn drop(&mut self) {
        // Cannot fail: the lane is lent until here, and only this value ends the loan.
        let _ = self.core().end_lend();
    }
}
