//! [`ShareError`]: what either side of a shared region refuses, by name.

use std::fmt;

/// Why an owner refused a peer's request; sent in a [`Refused`](super::wire::Message::Refused)
/// message and reported by the peer as [`ShareError::Refused`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
#[non_exhaustive]
pub enum RefusalCode {
    /// No region of that name is shared.
    NoSuchRegion = 1,
    /// The peer may not attach (its uid, or the owner's policy).
    NotAllowed = 2,
    /// The attachment or block was revoked.
    Revoked = 3,
    /// Every lane of the ring is taken.
    Busy = 4,
    /// The owner could not allocate what was asked for.
    OutOfMemory = 5,
    /// The peer holds as much as the owner lets one peer hold.
    Quota = 6,
    /// A request the owner cannot take (an unknown attachment, a bad size).
    BadRequest = 7,
    /// The owner failed for a reason of its own.
    Internal = 8,
}

impl RefusalCode {
    /// The code for a wire value; `None` for a value this version does not know.
    pub fn from_u16(v: u16) -> Option<RefusalCode> {
        Some(match v {
            1 => RefusalCode::NoSuchRegion,
            2 => RefusalCode::NotAllowed,
            3 => RefusalCode::Revoked,
            4 => RefusalCode::Busy,
            5 => RefusalCode::OutOfMemory,
            6 => RefusalCode::Quota,
            7 => RefusalCode::BadRequest,
            8 => RefusalCode::Internal,
            _ => return None,
        })
    }
}

impl fmt::Display for RefusalCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RefusalCode::NoSuchRegion => "no such region",
            RefusalCode::NotAllowed => "not allowed",
            RefusalCode::Revoked => "revoked",
            RefusalCode::Busy => "busy",
            RefusalCode::OutOfMemory => "out of memory",
            RefusalCode::Quota => "over quota",
            RefusalCode::BadRequest => "bad request",
            RefusalCode::Internal => "internal error",
        })
    }
}

/// What the sharing protocol refuses. Every variant names the check that failed and the values it
/// saw; none leaves anything mapped or any fd open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShareError {
    /// A message that does not start with the protocol's magic bytes.
    #[error("not a vkgdr share message (magic {found:02x?})")]
    BadMagic {
        /// The first bytes received.
        found: [u8; 4],
    },
    /// A message of a protocol version this build does not speak.
    #[error("share protocol version {got} is not supported (this build speaks {supported})")]
    UnknownVersion {
        /// The version in the message.
        got: u16,
        /// The version this build speaks.
        supported: u16,
    },
    /// A message kind this version does not know.
    #[error("unknown share message kind {0}")]
    UnknownKind(u16),
    /// A message shorter than its header or its kind's body.
    #[error("truncated share message: {what} needs {need} bytes, {got} arrived")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes there.
        got: usize,
    },
    /// A message with bytes after its body.
    #[error("share message of kind {kind} has {extra} bytes after its body")]
    Trailing {
        /// The message kind.
        kind: u16,
        /// Bytes left over.
        extra: usize,
    },
    /// A message whose fds do not match what its kind carries.
    #[error("share message {what} carries {expected} fds, {got} arrived")]
    FdCount {
        /// The message.
        what: &'static str,
        /// Fds its kind carries.
        expected: usize,
        /// Fds received.
        got: usize,
    },
    /// A field outside the values its kind allows.
    #[error("bad share descriptor: {field} = {value} ({rule})")]
    BadField {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// A region name that is empty, too long, not UTF-8 or holds a NUL.
    #[error("bad region name ({0})")]
    BadName(&'static str),
    /// The region lives on another GPU than the one this process opened for it.
    #[error("the region is on GPU-{expected}, and this device is GPU-{found}")]
    WrongDevice {
        /// The region's device UUID.
        expected: String,
        /// This process's device UUID.
        found: String,
    },
    /// The region was exported by another driver (driver UUID): Vulkan forbids the import.
    #[error("the region was exported by driver {expected}, this process runs driver {found}")]
    WrongDriver {
        /// The exporter's driver UUID.
        expected: String,
        /// This process's driver UUID.
        found: String,
    },
    /// The region's memory type is not the one this process's device would use for it.
    #[error("the region's memory type is {declared}, this device's is {local}")]
    MemoryType {
        /// The memory type the owner declared.
        declared: u32,
        /// The type this device uses.
        local: u32,
    },
    /// An fd that is not what the descriptor says it is (a regular file where device memory was
    /// declared, a memfd without the seals the protocol requires, a closed fd).
    #[error("fd for {which} is {what}")]
    WrongFdKind {
        /// Which of the message's fds.
        which: &'static str,
        /// What it was found to be.
        what: String,
    },
    /// An fd whose size is not the size the descriptor declared.
    #[error("{which} is {actual} bytes, the descriptor says {declared}")]
    SizeMismatch {
        /// Which of the message's fds.
        which: &'static str,
        /// The declared size.
        declared: u64,
        /// The size found.
        actual: u64,
    },
    /// A peer the owner's policy does not let in.
    #[error("peer uid {uid} (pid {pid}) may not attach: {why}")]
    PeerNotAllowed {
        /// The peer's uid (`SO_PEERCRED`).
        uid: u32,
        /// The peer's pid.
        pid: i32,
        /// The rule it fails.
        why: String,
    },
    /// The owner refused the request.
    #[error("the owner refused: {code}: {text}")]
    Refused {
        /// Why.
        code: RefusalCode,
        /// The owner's words.
        text: String,
    },
    /// A message that makes no sense at this point of the protocol (a block for an attachment
    /// that does not exist, a region where a block was expected).
    #[error("share protocol violation: {0}")]
    Protocol(String),
    /// The other side hung up (or died).
    #[error("the other side of the share connection hung up")]
    Disconnected,
    /// No answer within the time allowed.
    #[error("no answer from the other side within {millis} ms")]
    Timeout {
        /// The time waited, in milliseconds.
        millis: u64,
    },
    /// The attachment or block was revoked by the owner.
    #[error("revoked by the owner")]
    Revoked,
    /// A region name already shared.
    #[error("a region named {0:?} is already shared")]
    NameTaken(String),
    /// A remote producer published a tail the owner refuses to pass on.
    #[error("lane tail refused: {0}")]
    BadTail(#[from] super::lane::BadTail),
}
