//! Test records of the device → host rings and a checker of one lane's records: what the test
//! producers of `kernels/ring_d2h.cu` publish (`d2h_produce_check`, one record per thread and
//! round; `d2h_produce_warp_check`, one per warp and round), checked byte for byte by the GPU
//! tests and by `vkgdr soak`.
//!
//! Record `id = producer << 32 | round` carries word 0 = `id` and word `k >= 1` =
//! [`test_word`]`(id, k)`, a 64-bit mix in which every byte depends on the whole id: a record
//! that repeats another, or a slot still holding an earlier lap's bytes, fails on every byte.
//!
//! ```
//! use vkgdr::ring::core::d2h::{test_payload, Record, TestLaneChecker};
//! // Lane 0 of a ring whose producers p publish into lane p % 2, kind 1, 24-byte payloads.
//! let mut check = TestLaneChecker::new(0, 1, 24, |p| p % 2);
//! let first = test_payload(0, 24); // producer 0, round 0
//! let other = test_payload(2 << 32, 24); // producer 2, round 0
//! check.check(&Record { seq: 0, kind: 1, payload: &first }).unwrap();
//! // Producer 0's round 0 again: refused, whatever its sequence number.
//! assert!(check.check(&Record { seq: 1, kind: 1, payload: &first }).is_err());
//! check.check(&Record { seq: 1, kind: 1, payload: &other }).unwrap();
//! assert!(check.all_rounds(4, 1).is_ok()); // producers 0 and 2 sent one round each
//! assert!(check.all_rounds(4, 2).is_err());
//! ```

use std::collections::HashMap;

use super::Record;

/// Word `k` of test record `id`'s payload (`d2h_test_word` in `kernels/ring_d2h.cu`): the id
/// for `k = 0`, else splitmix64's finaliser of `id` and `k`.
pub fn test_word(id: u64, k: u32) -> u64 {
    if k == 0 {
        return id;
    }
    let mut z = id
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(k).wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The first `len` bytes of test record `id`'s payload (little-endian [`test_word`]s).
pub fn test_payload(id: u64, len: usize) -> Vec<u8> {
    (0..len.div_ceil(8) as u32)
        .flat_map(|k| test_word(id, k).to_le_bytes())
        .take(len)
        .collect()
}

/// What a [`TestLaneChecker`] found wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TestRecordError {
    /// A record out of the lane's sequence.
    #[error("lane {lane}: record {seq} where {due} was due")]
    Sequence {
        /// The lane checked.
        lane: u32,
        /// The record's sequence number.
        seq: u64,
        /// The one due.
        due: u64,
    },
    /// A record of another kind or length.
    #[error("lane {lane}: record {seq} of kind {kind} and {len} bytes, expected kind {want_kind} and {want_len} bytes")]
    Shape {
        /// The lane checked.
        lane: u32,
        /// The record's sequence number.
        seq: u64,
        /// Its kind.
        kind: u32,
        /// Its payload length.
        len: usize,
        /// The kind expected.
        want_kind: u32,
        /// The length expected.
        want_len: usize,
    },
    /// A record of a producer that publishes into another lane.
    #[error("lane {lane}: record {seq} of producer {producer} of another lane")]
    OtherLane {
        /// The lane checked.
        lane: u32,
        /// The record's sequence number.
        seq: u64,
        /// The producer its id names.
        producer: u32,
    },
    /// A producer's round out of its order: repeated or lost.
    #[error("lane {lane}: record {seq}: producer {producer}'s round {round} where {due} was due (repeated or lost)")]
    Round {
        /// The lane checked.
        lane: u32,
        /// The record's sequence number.
        seq: u64,
        /// The producer.
        producer: u32,
        /// The round its id names.
        round: u32,
        /// The round due.
        due: u32,
    },
    /// A payload byte that is not the test record's.
    #[error("lane {lane}: record {seq} (producer {producer}, round {round}): byte {at} is {got:#04x}, expected {want:#04x}")]
    Byte {
        /// The lane checked.
        lane: u32,
        /// The record's sequence number.
        seq: u64,
        /// The producer.
        producer: u32,
        /// Its round.
        round: u32,
        /// The byte's offset in the payload.
        at: usize,
        /// The byte found.
        got: u8,
        /// The byte expected.
        want: u8,
    },
    /// A producer of the lane delivered fewer (or more) rounds than it published.
    #[error("lane {lane}: producer {producer} delivered {got} of {want} rounds")]
    Missing {
        /// The lane checked.
        lane: u32,
        /// The producer.
        producer: u32,
        /// The rounds delivered.
        got: u32,
        /// The rounds published.
        want: u32,
    },
}

/// Checks one lane's test records as they come: sequence numbers 0, 1, 2, ...; the kind and
/// length; only producers of this lane, each one's rounds in order and once; every payload byte.
pub struct TestLaneChecker {
    lane: u32,
    kind: u32,
    len: usize,
    lane_of: Box<dyn Fn(u32) -> u32 + Send>,
    next_seq: u64,
    next_round: HashMap<u32, u32>,
}

impl TestLaneChecker {
    /// A checker of lane `lane`, whose records are of `kind` with `len`-byte payloads (at least
    /// 8: the id), from the producers `p` with `lane_of(p) == lane`.
    pub fn new(
        lane: u32,
        kind: u32,
        len: usize,
        lane_of: impl Fn(u32) -> u32 + Send + 'static,
    ) -> Self {
        TestLaneChecker {
            lane,
            kind,
            len,
            lane_of: Box::new(lane_of),
            next_seq: 0,
            next_round: HashMap::new(),
        }
    }

    /// Checks the lane's next record.
    pub fn check(&mut self, rec: &Record<'_>) -> Result<(), TestRecordError> {
        let lane = self.lane;
        let seq = rec.seq;
        if seq != self.next_seq {
            return Err(TestRecordError::Sequence {
                lane,
                seq,
                due: self.next_seq,
            });
        }
        if rec.kind != self.kind || rec.payload.len() != self.len || self.len < 8 {
            return Err(TestRecordError::Shape {
                lane,
                seq,
                kind: rec.kind,
                len: rec.payload.len(),
                want_kind: self.kind,
                want_len: self.len,
            });
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&rec.payload[..8]);
        let id = u64::from_le_bytes(id);
        let (producer, round) = ((id >> 32) as u32, id as u32);
        if (self.lane_of)(producer) != lane {
            return Err(TestRecordError::OtherLane {
                lane,
                seq,
                producer,
            });
        }
        let due = self.next_round.entry(producer).or_insert(0);
        if round != *due {
            return Err(TestRecordError::Round {
                lane,
                seq,
                producer,
                round,
                due: *due,
            });
        }
        *due += 1;
        let want = test_payload(id, self.len);
        if let Some(at) = (0..self.len).find(|&i| rec.payload[i] != want[i]) {
            return Err(TestRecordError::Byte {
                lane,
                seq,
                producer,
                round,
                at,
                got: rec.payload[at],
                want: want[at],
            });
        }
        self.next_seq += 1;
        Ok(())
    }

    /// Records checked.
    pub fn count(&self) -> u64 {
        self.next_seq
    }

    /// Whether each of producers `0..producers` that publishes into this lane delivered exactly
    /// `rounds` records.
    pub fn all_rounds(&self, producers: u32, rounds: u32) -> Result<(), TestRecordError> {
        for producer in (0..producers).filter(|&p| (self.lane_of)(p) == self.lane) {
            let got = self.next_round.get(&producer).copied().unwrap_or(0);
            if got != rounds {
                return Err(TestRecordError::Missing {
                    lane: self.lane,
                    producer,
                    got,
                    want: rounds,
                });
            }
        }
        Ok(())
    }
}
