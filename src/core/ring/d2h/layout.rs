//! The device → host wire format: a lane's slots and control words, the view a kernel takes,
//! and what the consumer refuses. `include/vkgdr/ring_d2h.cuh` mirrors every constant here
//! (`VKGDR_D2H_*`).
#![forbid(unsafe_code)]

/// Bytes of a slot's header: the commit word, then the meta word (in a tagged slot, the length
/// word, then the kind word).
pub const SLOT_HEADER_LEN: u32 = 16;
/// Word index, inside a slot, of the commit word: `seq + 1` once record `seq` is complete
/// (0: never written).
pub const COMMIT_WORD: usize = 0;
/// Word index, inside a slot, of the meta word: payload length in the low 32 bits, kind in the
/// high 32 bits.
pub const META_WORD: usize = 1;
/// Smallest slot stride (a 16-byte payload).
pub const MIN_STRIDE: u32 = 32;
/// Largest slot stride.
pub const MAX_STRIDE: u32 = 1 << 16;
/// Fewest slots of a lane.
pub const MIN_SLOTS: u32 = 2;
/// Most slots of a lane.
pub const MAX_SLOTS: u32 = 1 << 24;
/// Bytes between two lanes' host control blocks (the `head` and `closed` words).
pub const CONTROL_STRIDE: u64 = 128;
/// Byte offset of `head` (u64: records consumed, written by the CPU) in a control block.
pub const CONTROL_HEAD_OFFSET: u64 = 0;
/// Byte offset of `closed` (u64: non-zero once the consumer is gone) in a control block.
pub const CONTROL_CLOSED_OFFSET: u64 = 8;
/// Bytes between two lanes' device-memory states (`reserve`, `head_cache`, `gave_up`).
pub const DEVICE_STRIDE: u64 = 128;
/// [`SlotFormat::Committed`]'s code in [`D2hDeviceView::format`] (`VKGDR_D2H_FORMAT_COMMITTED`).
pub const FORMAT_COMMITTED: u32 = 0;
/// [`SlotFormat::Tagged`]'s code in [`D2hDeviceView::format`] (`VKGDR_D2H_FORMAT_TAGGED`).
pub const FORMAT_TAGGED: u32 = 1;
/// Payload bytes in each word of a tagged slot (the low half; the high half is the tag).
pub const TAGGED_BYTES_PER_WORD: u32 = 4;
/// Kinds from this one up are the library's own; a kernel's records use kinds below it.
pub const KIND_RESERVED: u32 = 0x8000_0000;
/// Kind of a record of release tokens: the payload is `len / 8` little-endian `u64` tokens
/// (see [`ReleaseTokens`](super::ReleaseTokens)).
pub const KIND_RELEASE: u32 = 0x8000_0001;

/// A device-side publication's status (`VKGDR_D2H_*` in `ring_d2h.cuh`): published. The model
/// producer ([`ProducerModel`](super::ProducerModel)) returns the other statuses as [`Refusal`].
pub const STATUS_OK: u32 = 0;
/// The consumer closed the lane: nothing will be taken any more.
pub const STATUS_CLOSED: u32 = 1;
/// The lane stayed full and the consumer's head did not move for the whole spin budget.
pub const STATUS_STALLED: u32 = 2;
/// The payload is larger than the lane's slots carry.
pub const STATUS_TOO_LARGE: u32 = 3;

/// Why a device producer published nothing. Nothing was reserved: the lane is as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// [`STATUS_CLOSED`].
    #[error("the lane's consumer closed it")]
    Closed,
    /// [`STATUS_STALLED`].
    #[error("the lane stayed full: its consumer made no progress")]
    Stalled,
    /// [`STATUS_TOO_LARGE`].
    #[error("record of {len} bytes exceeds the slot's payload of {max}")]
    TooLarge {
        /// Payload bytes asked for.
        len: usize,
        /// The lane's largest payload.
        max: u32,
    },
}

impl Refusal {
    /// The device's status code of this refusal.
    pub const fn status(self) -> u32 {
        match self {
            Refusal::Closed => STATUS_CLOSED,
            Refusal::Stalled => STATUS_STALLED,
            Refusal::TooLarge { .. } => STATUS_TOO_LARGE,
        }
    }
}

/// How a lane's slots carry their records: what the kernels' publications write and what the
/// consumer checks before it delivers a record. Chosen per ring, with its [`LaneShape`].
///
/// | | [`Committed`](Self::Committed) (the default) | [`Tagged`](Self::Tagged) |
/// |:--|:--|:--|
/// | a slot of `stride` bytes carries | `stride - 16` payload bytes | `stride / 2 - 8` payload bytes |
/// | the device, per record | payload, a release fence at system scope, then the commit word | every 8-byte word stored with its tag, no fence |
/// | a lone record's trip to the CPU | a PCIe round trip longer: the fence waits for the payload's stores to be acknowledged | one posted write's time |
/// | the CPU knows a record arrived by | its commit word | the tag in every word it reads |
///
/// `Tagged` is the device → host form of NCCL's low-latency protocol: each aligned 8-byte word
/// holds four payload bytes (low half) and the record's tag, `(seq + 1) as u32` (high half),
/// and the device stores each with one 8-byte store, which reaches host memory whole. A word
/// whose tag is its record's is that record's, whatever order the words arrived in, so nothing
/// needs a fence. The price is half the slot: take it for records that must arrive soonest
/// (status words, completion notices, release tokens), and `Committed` for throughput.
/// (BENCHMARKS.md, "A record's commit from the device", measures the fence.)
///
/// ```
/// use vkgdr::ring::core::d2h::{LaneShape, SlotFormat};
/// let shape = LaneShape::new(1024, 64)?.with_format(SlotFormat::Tagged);
/// assert_eq!(shape.max_payload(), 24); // 64 / 2 - 8
/// assert_eq!(SlotFormat::from_code(shape.format().code()), Some(SlotFormat::Tagged));
/// # Ok::<(), vkgdr::ring::core::d2h::D2hError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SlotFormat {
    /// A commit word (`seq + 1`) and a meta word, then the payload; the device stores the commit
    /// word last, after a release fence at system scope.
    #[default]
    Committed,
    /// Every 8-byte word carries four bytes and the record's tag: word 0 the payload length,
    /// word 1 the kind, then the payload, four bytes a word (little-endian, zero-padded).
    Tagged,
}

impl SlotFormat {
    /// The code a kernel reads in [`D2hDeviceView::format`]: [`FORMAT_COMMITTED`] or
    /// [`FORMAT_TAGGED`].
    pub const fn code(self) -> u32 {
        match self {
            SlotFormat::Committed => FORMAT_COMMITTED,
            SlotFormat::Tagged => FORMAT_TAGGED,
        }
    }

    /// The format of a code, `None` for an unknown one.
    pub const fn from_code(code: u32) -> Option<Self> {
        match code {
            FORMAT_COMMITTED => Some(SlotFormat::Committed),
            FORMAT_TAGGED => Some(SlotFormat::Tagged),
            _ => None,
        }
    }
}

/// The tag of record `seq` in a [`SlotFormat::Tagged`] slot: `(seq + 1) as u32`, never 0 on a
/// slot's first lap, and different from the tag of the slot's previous lap (`seq - slots`)
/// because a lane has fewer than 2^32 slots.
pub const fn tag_of(seq: u64) -> u32 {
    seq.wrapping_add(1) as u32
}

/// A word of record `seq` in a [`SlotFormat::Tagged`] slot: `data` in the low half, the tag in
/// the high half.
pub const fn tagged_word(seq: u64, data: u32) -> u64 {
    data as u64 | (tag_of(seq) as u64) << 32
}

/// The geometry of a lane: `slots` slots (a power of two) of `stride` bytes (a power of two),
/// each a [`SLOT_HEADER_LEN`]-byte header and up to `stride - 16` payload bytes, or in the
/// [`Tagged`](SlotFormat::Tagged) format ([`with_format`](Self::with_format)) up to
/// `stride / 2 - 8`.
///
/// ```
/// use vkgdr::ring::core::d2h::LaneShape;
/// let shape = LaneShape::new(1024, 64)?;
/// assert_eq!(shape.max_payload(), 48);
/// assert_eq!(shape.bytes(), 64 * 1024);
/// assert_eq!(shape.slot_of(1025), 1);
/// assert!(LaneShape::new(1000, 64).is_err());
/// # Ok::<(), vkgdr::ring::core::d2h::D2hError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaneShape {
    slots: u32,
    stride: u32,
    format: SlotFormat,
}

impl LaneShape {
    /// A shape of `slots` slots of `stride` bytes: powers of two within
    /// [`MIN_SLOTS`]..=[`MAX_SLOTS`] and [`MIN_STRIDE`]..=[`MAX_STRIDE`].
    pub fn new(slots: u32, stride: u32) -> Result<Self, D2hError> {
        let ok = |v: u32, lo, hi| v.is_power_of_two() && (lo..=hi).contains(&v);
        if ok(slots, MIN_SLOTS, MAX_SLOTS) && ok(stride, MIN_STRIDE, MAX_STRIDE) {
            Ok(LaneShape {
                slots,
                stride,
                format: SlotFormat::Committed,
            })
        } else {
            Err(D2hError::InvalidShape { slots, stride })
        }
    }

    /// The same geometry with the slots in `format`.
    pub const fn with_format(self, format: SlotFormat) -> Self {
        LaneShape { format, ..self }
    }

    /// How the slots carry their records.
    pub const fn format(&self) -> SlotFormat {
        self.format
    }

    /// Slots in the lane.
    pub const fn slots(&self) -> u32 {
        self.slots
    }

    /// Bytes per slot.
    pub const fn stride(&self) -> u32 {
        self.stride
    }

    /// The largest payload a record carries.
    pub const fn max_payload(&self) -> u32 {
        match self.format {
            SlotFormat::Committed => self.stride - SLOT_HEADER_LEN,
            SlotFormat::Tagged => (self.stride - SLOT_HEADER_LEN) / 2,
        }
    }

    /// Bytes of the lane's slot region.
    pub const fn bytes(&self) -> u64 {
        self.slots as u64 * self.stride as u64
    }

    /// `u64` words of the lane's slot region.
    pub const fn words(&self) -> usize {
        (self.bytes() / 8) as usize
    }

    /// The slot record `seq` goes to: `seq % slots`.
    pub const fn slot_of(&self, seq: u64) -> u32 {
        (seq & (self.slots as u64 - 1)) as u32
    }

    /// Index of the first word of the slot record `seq` goes to.
    pub const fn first_word(&self, seq: u64) -> usize {
        self.slot_of(seq) as usize * (self.stride as usize / 8)
    }

    /// The commit word of an intact slot holding record `seq`.
    pub const fn commit_of(seq: u64) -> u64 {
        seq + 1
    }

    /// The commit word the slot of record `seq` holds before that record arrives: the previous
    /// lap's record (`seq - slots`), or 0 (never written) on the first lap.
    pub const fn commit_before(&self, seq: u64) -> u64 {
        if seq < self.slots as u64 {
            0
        } else {
            seq + 1 - self.slots as u64
        }
    }

    /// The tag the words of a [`Tagged`](SlotFormat::Tagged) slot's header hold before record
    /// `seq` arrives: the previous lap's (`seq - slots`), or 0 on the first lap.
    pub const fn tag_before(&self, seq: u64) -> u32 {
        if seq < self.slots as u64 {
            0
        } else {
            tag_of(seq - self.slots as u64)
        }
    }
}

/// The meta word of a slot: `len | kind << 32`.
pub const fn meta_word(len: u32, kind: u32) -> u64 {
    len as u64 | (kind as u64) << 32
}

/// What a kernel needs to publish into a device → host ring, passed by value (`vkgdr_d2h_view`
/// in `ring_d2h.cuh`, 48 bytes). Addresses are device addresses: the slots lie in host memory
/// the device writes over PCIe, the control blocks where the CPU stores to (host memory, or GPU
/// memory through the BAR), the lanes' states in device memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct D2hDeviceView {
    /// Lane 0's slot region; lane `i`'s is `i * slots * stride` bytes further.
    pub slots_addr: u64,
    /// Lane 0's control block (`head`, `closed`); lane `i`'s is `i * CONTROL_STRIDE` bytes further.
    pub control_addr: u64,
    /// Lane 0's device state (device memory: `reserve`, `head_cache`, `gave_up`, zeroed at
    /// creation); lane `i`'s is `i * DEVICE_STRIDE` bytes further.
    pub device_addr: u64,
    /// Slots per lane (a power of two).
    pub slots: u32,
    /// Bytes per slot (a power of two).
    pub stride: u32,
    /// Number of lanes.
    pub lanes: u32,
    /// Looks at the consumer's head (each about a PCIe round trip and a short sleep) a full lane
    /// makes, with no progress, before a publication gives up with [`STATUS_STALLED`].
    pub spin_limit: u32,
    /// How the slots carry their records: [`SlotFormat::code`] ([`FORMAT_COMMITTED`] or
    /// [`FORMAT_TAGGED`]).
    pub format: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

const _: () = assert!(std::mem::size_of::<D2hDeviceView>() == 48);

impl D2hDeviceView {
    /// The 48 bytes of `vkgdr_d2h_view` as the kernel takes them by value (little-endian, the
    /// fields in declaration order): for faces that pass kernel parameters as bytes.
    pub fn to_bytes(&self) -> [u8; 48] {
        let mut b = [0u8; 48];
        b[0..8].copy_from_slice(&self.slots_addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.control_addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.device_addr.to_le_bytes());
        b[24..28].copy_from_slice(&self.slots.to_le_bytes());
        b[28..32].copy_from_slice(&self.stride.to_le_bytes());
        b[32..36].copy_from_slice(&self.lanes.to_le_bytes());
        b[36..40].copy_from_slice(&self.spin_limit.to_le_bytes());
        b[40..44].copy_from_slice(&self.format.to_le_bytes());
        b[44..48].copy_from_slice(&self.reserved.to_le_bytes());
        b
    }
}

/// Why a lane's consumer stopped. A lane that reported one stays broken: the same error on
/// every later call, nothing delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum D2hError {
    /// Slots or stride out of range or not a power of two.
    #[error(
        "lane shape of {slots} slots of {stride} bytes: both must be powers of two, \
         {MIN_SLOTS}..={MAX_SLOTS} slots of {MIN_STRIDE}..={MAX_STRIDE} bytes"
    )]
    InvalidShape {
        /// Slots asked for.
        slots: u32,
        /// Stride asked for.
        stride: u32,
    },
    /// A lane index beyond the ring's lanes.
    #[error("lane {lane} of a ring of {lanes} lanes")]
    NoSuchLane {
        /// The lane asked for.
        lane: u32,
        /// The ring's lanes.
        lanes: u32,
    },
    /// The lane has a consumer already (one at a time per lane).
    #[error("lane {lane} has a consumer already")]
    LaneTaken {
        /// The lane asked for.
        lane: u32,
    },
    /// The lane's memory does not have the shape's size.
    #[error("lane memory of {found} words, the shape needs {expected}")]
    MemoryMismatch {
        /// Words the shape needs.
        expected: usize,
        /// Words the memory has.
        found: usize,
    },
    /// The slot of record `seq` holds a commit word that is neither that record's nor the
    /// previous lap's: the device wrote past the consumer's head or wrote garbage.
    #[error("slot of record {seq} holds commit word {found:#x}")]
    BadCommit {
        /// The record expected next.
        seq: u64,
        /// The commit word found.
        found: u64,
    },
    /// Record `seq` claims more payload than a slot carries.
    #[error("record {seq} claims {len} payload bytes, a slot carries {max}")]
    BadLength {
        /// The record.
        seq: u64,
        /// Its claimed length.
        len: u32,
        /// The lane's largest payload.
        max: u32,
    },
    /// The slot of record `seq` changed while it was read: the device overwrote it before the
    /// consumer's head let it.
    #[error("record {seq} was overwritten while it was read")]
    Torn {
        /// The record.
        seq: u64,
    },
}
