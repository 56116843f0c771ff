//! Whether a tail a remote producer published may reach the consumer.
//!
//! A ring lane whose producer is another process is written by that process directly (its
//! records go into the lane's data region through its own mapping), but its `tail` is not: the
//! producer publishes `(tail, seq)` into a word only it and the owner share, and the owner passes
//! the tail on to the consumer's tail word after [`check_advance`] accepted it. So the consumer's
//! tail only ever moves forward, by whole records, and never more than a capacity past the
//! consumer's head, whatever the producer writes; a producer that breaks the rule loses its lane.
//!
//! ```
//! use vkgdr::share::lane::{check_advance, BadTail, LanePosition};
//! let at = LanePosition { tail: 4096, seq: 10 };
//! // Three 32-byte records: accepted.
//! let next = LanePosition { tail: 4096 + 96, seq: 13 };
//! assert_eq!(check_advance(1 << 16, 4096, at, next), Ok(true));
//! // Backwards, or further than the consumer has room for: refused.
//! assert!(matches!(
//!     check_advance(1 << 16, 4096, next, at),
//!     Err(BadTail::Backwards { .. })
//! ));
//! let far = LanePosition { tail: 4096 + (1 << 16) + 16, seq: 14 };
//! assert!(matches!(
//!     check_advance(1 << 16, 4096, at, far),
//!     Err(BadTail::BeyondCapacity { .. })
//! ));
//! ```

use crate::core::ring::layout::{HEADER_LEN, RECORD_ALIGN};

/// A lane's published end and the sequence number of the first record after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LanePosition {
    /// End of the published records (a byte position that only grows).
    pub tail: u64,
    /// Sequence number the next record will carry.
    pub seq: u64,
}

/// Why a published tail was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadTail {
    /// The tail went backwards.
    #[error("tail {proposed} is below the published {published}")]
    Backwards {
        /// The tail already passed on.
        published: u64,
        /// The tail proposed.
        proposed: u64,
    },
    /// The tail is not a record boundary.
    #[error("tail {0} is not 16-byte aligned")]
    Misaligned(u64),
    /// The tail runs more than a capacity past the consumer's head.
    #[error("tail {proposed} is more than the capacity {capacity} past the head {head}")]
    BeyondCapacity {
        /// The tail proposed.
        proposed: u64,
        /// The consumer's head.
        head: u64,
        /// The lane's capacity.
        capacity: u64,
    },
    /// The sequence number went backwards, or moved where the tail did not.
    #[error("seq {proposed} after {published} does not follow the tail")]
    SeqBackwards {
        /// The sequence number already passed on.
        published: u64,
        /// The one proposed.
        proposed: u64,
    },
    /// More records numbered than the bytes published can hold (each takes at least a header).
    #[error("{records} records cannot fit in {bytes} bytes")]
    TooManyRecords {
        /// Records the new sequence number claims.
        records: u64,
        /// Bytes the tail moved.
        bytes: u64,
    },
}

/// Decides whether the remote producer's `proposed` position may follow `published` (what the
/// owner passed on last) on a lane of `capacity` bytes whose consumer's head is `head`
/// (`head <= published.tail`). `Ok(true)`: pass the tail on; `Ok(false)`: nothing new.
///
/// The rules: the tail moves forward by a multiple of 16 bytes and stays within a capacity of
/// the head; the sequence number never moves back, moves only when the tail does, and by no more
/// records than the bytes published can hold. Records themselves are not read here: the
/// consumer checks them (a producer that writes garbage below a valid tail breaks its own lane
/// only).
pub fn check_advance(
    capacity: u64,
    head: u64,
    published: LanePosition,
    proposed: LanePosition,
) -> Result<bool, BadTail> {
    if proposed.tail < published.tail {
        return Err(BadTail::Backwards {
            published: published.tail,
            proposed: proposed.tail,
        });
    }
    if proposed.seq < published.seq {
        return Err(BadTail::SeqBackwards {
            published: published.seq,
            proposed: proposed.seq,
        });
    }
    if proposed.tail == published.tail {
        if proposed.seq != published.seq {
            return Err(BadTail::SeqBackwards {
                published: published.seq,
                proposed: proposed.seq,
            });
        }
        return Ok(false);
    }
    if !proposed.tail.is_multiple_of(RECORD_ALIGN) {
        return Err(BadTail::Misaligned(proposed.tail));
    }
    if proposed.tail - head.min(published.tail) > capacity {
        return Err(BadTail::BeyondCapacity {
            proposed: proposed.tail,
            head,
            capacity,
        });
    }
    let bytes = proposed.tail - published.tail;
    let records = proposed.seq - published.seq;
    if records > bytes / HEADER_LEN {
        return Err(BadTail::TooManyRecords { records, bytes });
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CAP: u64 = 1 << 16;

    fn at(tail: u64, seq: u64) -> LanePosition {
        LanePosition { tail, seq }
    }

    #[test]
    fn each_rule_refuses_what_it_names() {
        let p = at(1024, 8);
        assert_eq!(check_advance(CAP, 512, p, p), Ok(false));
        assert_eq!(check_advance(CAP, 512, p, at(1024 + 48, 9)), Ok(true));
        assert_eq!(
            check_advance(CAP, 512, p, at(1008, 8)),
            Err(BadTail::Backwards {
                published: 1024,
                proposed: 1008
            })
        );
        assert_eq!(
            check_advance(CAP, 512, p, at(1030, 9)),
            Err(BadTail::Misaligned(1030))
        );
        assert_eq!(
            check_advance(CAP, 512, p, at(512 + CAP + 16, 9)),
            Err(BadTail::BeyondCapacity {
                proposed: 512 + CAP + 16,
                head: 512,
                capacity: CAP
            })
        );
        assert_eq!(check_advance(CAP, 512, p, at(512 + CAP, 9)), Ok(true));
        assert_eq!(
            check_advance(CAP, 512, p, at(1024, 9)),
            Err(BadTail::SeqBackwards {
                published: 8,
                proposed: 9
            })
        );
        assert_eq!(
            check_advance(CAP, 512, p, at(1040, 7)),
            Err(BadTail::SeqBackwards {
                published: 8,
                proposed: 7
            })
        );
        assert_eq!(
            check_advance(CAP, 512, p, at(1056, 11)),
            Err(BadTail::TooManyRecords {
                records: 3,
                bytes: 32
            })
        );
        // A lone wrap PAD moves the tail and no sequence number.
        assert_eq!(check_advance(CAP, 512, p, at(2048, 8)), Ok(true));
    }

    proptest! {
        /// Whatever a producer proposes, an accepted tail keeps the consumer's invariants.
        #[test]
        fn accepted_tails_keep_the_consumer_safe(
            head in 0u64..1 << 20, ahead in 0u64..CAP, seq in 0u64..1 << 30,
            tail in any::<u64>(), next_seq in any::<u64>(),
        ) {
            let published = at((head + ahead) & !15, seq);
            let head = head.min(published.tail);
            if let Ok(changed) = check_advance(CAP, head, published, at(tail, next_seq)) {
                prop_assert!(tail >= published.tail && tail % 16 == 0);
                prop_assert!(tail - head <= CAP);
                prop_assert!(next_seq >= seq);
                prop_assert!((next_seq - seq) * 16 <= tail - published.tail);
                prop_assert_eq!(changed, tail != published.tail);
            }
        }
    }
}
