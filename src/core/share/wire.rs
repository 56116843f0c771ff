//! The messages of the sharing protocol, as bytes.
//!
//! The owner and a peer talk over a Unix `SOCK_SEQPACKET` socket: each message is one packet
//! (the socket keeps their boundaries), and the fds a message carries travel with it as
//! `SCM_RIGHTS`. A message is a 16-byte header and a body, little-endian:
//!
//! | offset | field      | type     | value |
//! |-------:|------------|----------|-------|
//! | 0      | magic      | `[u8; 4]`| `b"VKGD"` ([`MAGIC`]) |
//! | 4      | version    | `u16`    | [`VERSION`] |
//! | 6      | kind       | `u16`    | one per [`Message`] variant ([`Message::kind`]) |
//! | 8      | body bytes | `u32`    | exact length of the body |
//! | 12     | fds        | `u16`    | fds carried ([`Message::fd_count`]) |
//! | 14     | reserved   | `u16`    | 0 |
//!
//! [`decode`] checks the magic, the version, the kind, the exact body length of the kind, the fd
//! count and every field's range before it returns a [`Message`]: an owner never acts on a field
//! it has not checked, and a peer never maps memory on a descriptor it has not checked. Sizes of
//! fds are checked against the descriptor by the receiving side (`share` layer) before the fds
//! are imported.
//!
//! ```
//! use vkgdr::share::wire::{decode, encode, Message};
//! let m = Message::Attach { request: 1, name: "frames".into() };
//! let bytes = encode(&m);
//! assert_eq!(decode(&bytes, m.fd_count()), Ok(m));
//! // One byte short: refused by name.
//! assert!(decode(&bytes[..bytes.len() - 1], 0).is_err());
//! ```

use super::error::{RefusalCode, ShareError};
use crate::core::ring::layout::{WrapMode, MIN_CAPACITY, RECORD_ALIGN};

/// The first four bytes of every message.
pub const MAGIC: [u8; 4] = *b"VKGD";
/// The protocol version this build speaks (and the only one it accepts).
pub const VERSION: u16 = 1;
/// Bytes of the header.
pub const HEADER_LEN: usize = 16;
/// Largest message, header included: a receiver's buffer.
pub const MAX_MESSAGE: usize = 1024;
/// Largest region name, in bytes of UTF-8.
pub const MAX_NAME: usize = 64;
/// Largest refusal text, in bytes of UTF-8 (longer texts are cut at a character boundary).
pub const MAX_TEXT: usize = 512;
/// Most fds one message carries.
pub const MAX_FDS: usize = 3;
/// Allocation granularity every exported size is a multiple of.
pub const PAGE: u64 = 4096;
/// Largest `nonCoherentAtomSize` a descriptor may declare.
pub const MAX_ATOM: u64 = 1 << 16;

/// One message of the protocol. Owner → peer: [`Region`](Message::Region),
/// [`Refused`](Message::Refused), [`Chunk`](Message::Chunk), [`Block`](Message::Block),
/// [`Revoke`](Message::Revoke). Peer → owner: [`Attach`](Message::Attach),
/// [`Request`](Message::Request), [`Release`](Message::Release), [`Detach`](Message::Detach).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Asks for the region shared under `name`.
    Attach {
        /// The peer's number for this request, repeated in the answer.
        request: u64,
        /// The region's name.
        name: String,
    },
    /// The region asked for: what it is and how to map it (with its fds).
    Region(RegionDescriptor),
    /// The owner's no to a request.
    Refused {
        /// The request refused.
        request: u64,
        /// Why.
        code: RefusalCode,
        /// The owner's words (at most [`MAX_TEXT`] bytes).
        text: String,
    },
    /// A chunk of a shared pool (one fd: the chunk's memory), sent before the first block in it.
    Chunk {
        /// The pool's attachment.
        attachment: u32,
        /// The chunk's number in this attachment.
        chunk: u32,
        /// The chunk's size in bytes (a multiple of [`PAGE`]).
        size: u64,
    },
    /// A block of a shared pool handed to the peer.
    Block {
        /// The request it answers, or 0 for a block the owner sends unasked.
        request: u64,
        /// The pool's attachment.
        attachment: u32,
        /// The chunk it lies in (sent before in a [`Chunk`](Message::Chunk)).
        chunk: u32,
        /// Its offset in the chunk.
        offset: u64,
        /// Its length.
        len: u64,
        /// The owner's name for it: the peer gives it back with [`Release`](Message::Release);
        /// never 0.
        token: u64,
    },
    /// The owner takes something back: a block (`token`), or the whole attachment (`token` 0).
    Revoke {
        /// The attachment.
        attachment: u32,
        /// The block's token, or 0 for the attachment.
        token: u64,
    },
    /// The peer asks for a block of a shared pool.
    Request {
        /// The peer's number for this request, repeated in the answer.
        request: u64,
        /// The pool's attachment.
        attachment: u32,
        /// Bytes wanted.
        size: u64,
        /// Alignment wanted (a power of two).
        align: u64,
    },
    /// The peer gives a block back.
    Release {
        /// The pool's attachment.
        attachment: u32,
        /// The block's token.
        token: u64,
    },
    /// The peer is done with an attachment.
    Detach {
        /// The attachment.
        attachment: u32,
    },
}

/// What a peer needs to map a region: the device it lives on and how its memory is typed, and
/// the region itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionDescriptor {
    /// The request this answers.
    pub request: u64,
    /// The owner's number for this attachment (unique on the connection, never 0).
    pub attachment: u32,
    /// The GPU's Vulkan `deviceUUID` (CUDA's UUID on NVIDIA).
    pub device_uuid: [u8; 16],
    /// The exporting driver's Vulkan `driverUUID`.
    pub driver_uuid: [u8; 16],
    /// The Vulkan memory type index of the region's device memory.
    pub memory_type: u32,
    /// `nonCoherentAtomSize` (a power of two, at most [`MAX_ATOM`]).
    pub atom: u64,
    /// Whether writes must be flushed and reads invalidated.
    pub non_coherent: bool,
    /// The region.
    pub region: Region,
}

/// The kinds of region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Region {
    /// One allocation (one fd).
    Memory {
        /// The allocation's size (a multiple of [`PAGE`]).
        size: u64,
        /// Bytes of it the region covers, from offset 0 (at most `size`).
        len: u64,
    },
    /// A pool: no fds here; its chunks arrive as [`Message::Chunk`], its blocks as
    /// [`Message::Block`].
    Pool {
        /// Most bytes of blocks the peer may hold at once (its quota).
        quota: u64,
    },
    /// One lane of a ring whose producer the peer becomes (three fds: the data allocation, the
    /// lane's producer page and its owner page).
    RingLane(LaneDescriptor),
}

/// One ring lane handed to a remote producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneDescriptor {
    /// The lane's number in its ring.
    pub lane: u32,
    /// How records meet the end of the region.
    pub wrap: WrapMode,
    /// The lane's region size (a power of two, at least [`MIN_CAPACITY`]).
    pub capacity: u64,
    /// The size of the data allocation (a multiple of [`PAGE`]).
    pub data_size: u64,
    /// Where the lane's region starts in the data allocation.
    pub data_offset: u64,
    /// The position and sequence number the producer starts at (the lane's published end).
    pub start_pos: u64,
    /// The sequence number of the first record the producer writes.
    pub start_seq: u64,
    /// The consumer's head when the lane was handed out (at most `start_pos`, within a capacity).
    pub head: u64,
}

impl Message {
    /// The wire number of this kind.
    pub fn kind(&self) -> u16 {
        match self {
            Message::Attach { .. } => 1,
            Message::Region(_) => 2,
            Message::Refused { .. } => 3,
            Message::Chunk { .. } => 4,
            Message::Block { .. } => 5,
            Message::Revoke { .. } => 6,
            Message::Request { .. } => 7,
            Message::Release { .. } => 8,
            Message::Detach { .. } => 9,
        }
    }

    /// How many fds travel with this message.
    pub fn fd_count(&self) -> usize {
        match self {
            Message::Region(d) => d.region.fd_count(),
            Message::Chunk { .. } => 1,
            _ => 0,
        }
    }

    /// A short name of the kind, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Attach { .. } => "Attach",
            Message::Region(_) => "Region",
            Message::Refused { .. } => "Refused",
            Message::Chunk { .. } => "Chunk",
            Message::Block { .. } => "Block",
            Message::Revoke { .. } => "Revoke",
            Message::Request { .. } => "Request",
            Message::Release { .. } => "Release",
            Message::Detach { .. } => "Detach",
        }
    }
}

impl Region {
    /// How many fds a region of this kind carries, in order: memory (1); none for a pool; a ring
    /// lane's data allocation, producer page and owner page (3).
    pub fn fd_count(&self) -> usize {
        match self {
            Region::Memory { .. } => 1,
            Region::Pool { .. } => 0,
            Region::RingLane(_) => 3,
        }
    }

    fn tag(&self) -> u8 {
        match self {
            Region::Memory { .. } => 1,
            Region::Pool { .. } => 2,
            Region::RingLane(_) => 3,
        }
    }
}

/// The message's bytes, header included.
pub fn encode(m: &Message) -> Vec<u8> {
    let mut body = Writer(Vec::with_capacity(128));
    match m {
        Message::Attach { request, name } => {
            body.u64(*request);
            body.text(name);
        }
        Message::Region(d) => {
            body.u64(d.request);
            body.u32(d.attachment);
            body.bytes(&d.device_uuid);
            body.bytes(&d.driver_uuid);
            body.u32(d.memory_type);
            body.u64(d.atom);
            body.u8(u8::from(d.non_coherent));
            body.u8(d.region.tag());
            match &d.region {
                Region::Memory { size, len } => {
                    body.u64(*size);
                    body.u64(*len);
                }
                Region::Pool { quota } => body.u64(*quota),
                Region::RingLane(l) => {
                    body.u32(l.lane);
                    body.u32(l.wrap as u32);
                    for v in [
                        l.capacity,
                        l.data_size,
                        l.data_offset,
                        l.start_pos,
                        l.start_seq,
                        l.head,
                    ] {
                        body.u64(v);
                    }
                }
            }
        }
        Message::Refused {
            request,
            code,
            text,
        } => {
            body.u64(*request);
            body.u16(*code as u16);
            body.text(cut(text, MAX_TEXT));
        }
        Message::Chunk {
            attachment,
            chunk,
            size,
        } => {
            body.u32(*attachment);
            body.u32(*chunk);
            body.u64(*size);
        }
        Message::Block {
            request,
            attachment,
            chunk,
            offset,
            len,
            token,
        } => {
            body.u64(*request);
            body.u32(*attachment);
            body.u32(*chunk);
            body.u64(*offset);
            body.u64(*len);
            body.u64(*token);
        }
        Message::Revoke { attachment, token } | Message::Release { attachment, token } => {
            body.u32(*attachment);
            body.u64(*token);
        }
        Message::Request {
            request,
            attachment,
            size,
            align,
        } => {
            body.u64(*request);
            body.u32(*attachment);
            body.u64(*size);
            body.u64(*align);
        }
        Message::Detach { attachment } => body.u32(*attachment),
    }
    let mut out = Writer(Vec::with_capacity(HEADER_LEN + body.0.len()));
    out.bytes(&MAGIC);
    out.u16(VERSION);
    out.u16(m.kind());
    out.u32(body.0.len() as u32);
    out.u16(m.fd_count() as u16);
    out.u16(0);
    out.bytes(&body.0);
    out.0
}

/// The message in `bytes` (one packet, exactly), which arrived with `fds` fds. Every field is
/// checked; see the module docs.
pub fn decode(bytes: &[u8], fds: usize) -> Result<Message, ShareError> {
    let mut r = Reader {
        bytes,
        at: 0,
        what: "header",
    };
    let magic: [u8; 4] = r.array()?;
    if magic != MAGIC {
        return Err(ShareError::BadMagic { found: magic });
    }
    let version = r.u16()?;
    if version != VERSION {
        return Err(ShareError::UnknownVersion {
            got: version,
            supported: VERSION,
        });
    }
    let kind = r.u16()?;
    let body_len = r.u32()? as usize;
    let declared_fds = r.u16()? as usize;
    let reserved = r.u16()?;
    if reserved != 0 {
        return bad("reserved", u64::from(reserved), "must be 0");
    }
    let have = bytes.len() - HEADER_LEN;
    if have < body_len {
        return Err(ShareError::Truncated {
            what: "body",
            need: body_len,
            got: have,
        });
    }
    if have > body_len {
        return Err(ShareError::Trailing {
            kind,
            extra: have - body_len,
        });
    }
    r.what = "body";
    let m = match kind {
        1 => Message::Attach {
            request: r.u64()?,
            name: r.name()?,
        },
        2 => Message::Region(region(&mut r)?),
        3 => {
            let request = r.u64()?;
            let code = r.u16()?;
            let code = RefusalCode::from_u16(code).ok_or(ShareError::BadField {
                field: "refusal code",
                value: u64::from(code),
                rule: "a known code",
            })?;
            Message::Refused {
                request,
                code,
                text: r.text(MAX_TEXT)?,
            }
        }
        4 => {
            let (attachment, chunk, size) = (r.u32()?, r.u32()?, r.u64()?);
            pages("chunk size", size)?;
            Message::Chunk {
                attachment,
                chunk,
                size,
            }
        }
        5 => {
            let request = r.u64()?;
            let (attachment, chunk) = (r.u32()?, r.u32()?);
            let (offset, len, token) = (r.u64()?, r.u64()?, r.u64()?);
            if len == 0 {
                return bad("block len", 0, "non-zero");
            }
            if offset.checked_add(len).is_none() {
                return bad("block offset", offset, "offset + len must not overflow");
            }
            if token == 0 {
                return bad("block token", 0, "non-zero");
            }
            Message::Block {
                request,
                attachment,
                chunk,
                offset,
                len,
                token,
            }
        }
        6 => Message::Revoke {
            attachment: r.u32()?,
            token: r.u64()?,
        },
        7 => {
            let request = r.u64()?;
            let (attachment, size, align) = (r.u32()?, r.u64()?, r.u64()?);
            if size == 0 {
                return bad("request size", 0, "non-zero");
            }
            if !align.is_power_of_two() {
                return bad("request align", align, "a power of two");
            }
            Message::Request {
                request,
                attachment,
                size,
                align,
            }
        }
        8 => {
            let (attachment, token) = (r.u32()?, r.u64()?);
            if token == 0 {
                return bad("release token", 0, "non-zero");
            }
            Message::Release { attachment, token }
        }
        9 => Message::Detach {
            attachment: r.u32()?,
        },
        k => return Err(ShareError::UnknownKind(k)),
    };
    if r.at != bytes.len() {
        return Err(ShareError::Trailing {
            kind,
            extra: bytes.len() - r.at,
        });
    }
    if declared_fds != m.fd_count() {
        return Err(ShareError::FdCount {
            what: m.name(),
            expected: m.fd_count(),
            got: declared_fds,
        });
    }
    if fds != m.fd_count() {
        return Err(ShareError::FdCount {
            what: m.name(),
            expected: m.fd_count(),
            got: fds,
        });
    }
    Ok(m)
}

fn region(r: &mut Reader<'_>) -> Result<RegionDescriptor, ShareError> {
    let request = r.u64()?;
    let attachment = r.u32()?;
    if attachment == 0 {
        return bad("attachment", 0, "non-zero");
    }
    let device_uuid = r.array()?;
    let driver_uuid = r.array()?;
    let memory_type = r.u32()?;
    if memory_type >= 32 {
        return bad(
            "memory type",
            u64::from(memory_type),
            "below VK_MAX_MEMORY_TYPES (32)",
        );
    }
    let atom = r.u64()?;
    if !atom.is_power_of_two() || atom > MAX_ATOM {
        return bad("atom", atom, "a power of two of at most 65536");
    }
    let non_coherent = match r.u8()? {
        0 => false,
        1 => true,
        v => return bad("non_coherent", u64::from(v), "0 or 1"),
    };
    let region = match r.u8()? {
        1 => {
            let (size, len) = (r.u64()?, r.u64()?);
            pages("memory size", size)?;
            if len == 0 || len > size {
                return bad("memory len", len, "non-zero and at most the size");
            }
            Region::Memory { size, len }
        }
        2 => Region::Pool { quota: r.u64()? },
        3 => {
            let lane = r.u32()?;
            let wrap = match r.u32()? {
                0 => WrapMode::Padded,
                1 => WrapMode::Mirrored,
                v => return bad("wrap", u64::from(v), "0 (padded) or 1 (mirrored)"),
            };
            let l = LaneDescriptor {
                lane,
                wrap,
                capacity: r.u64()?,
                data_size: r.u64()?,
                data_offset: r.u64()?,
                start_pos: r.u64()?,
                start_seq: r.u64()?,
                head: r.u64()?,
            };
            check_lane(&l)?;
            Region::RingLane(l)
        }
        v => return bad("region kind", u64::from(v), "1, 2 or 3"),
    };
    Ok(RegionDescriptor {
        request,
        attachment,
        device_uuid,
        driver_uuid,
        memory_type,
        atom,
        non_coherent,
        region,
    })
}

fn check_lane(l: &LaneDescriptor) -> Result<(), ShareError> {
    if !l.capacity.is_power_of_two() || l.capacity < MIN_CAPACITY {
        return bad("capacity", l.capacity, "a power of two of at least 4096");
    }
    pages("data size", l.data_size)?;
    match l.data_offset.checked_add(l.capacity) {
        Some(end) if end <= l.data_size => {}
        _ => {
            return bad(
                "data offset",
                l.data_offset,
                "offset + capacity within the data",
            )
        }
    }
    if !l.start_pos.is_multiple_of(RECORD_ALIGN) {
        return bad("start position", l.start_pos, "16-byte aligned");
    }
    if l.head > l.start_pos || l.start_pos - l.head > l.capacity {
        return bad("head", l.head, "at most the start, within a capacity of it");
    }
    Ok(())
}

fn pages(field: &'static str, size: u64) -> Result<(), ShareError> {
    if size == 0 || !size.is_multiple_of(PAGE) {
        return bad(field, size, "a non-zero multiple of 4096");
    }
    Ok(())
}

fn bad<T>(field: &'static str, value: u64, rule: &'static str) -> Result<T, ShareError> {
    Err(ShareError::BadField { field, value, rule })
}

/// `s` cut to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

struct Writer(Vec<u8>);

impl Writer {
    fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    /// A length-prefixed (u16) UTF-8 string.
    fn text(&mut self, s: &str) {
        self.u16(s.len() as u16);
        self.bytes(s.as_bytes());
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], ShareError> {
        let rest = &self.bytes[self.at..];
        if rest.len() < n {
            return Err(ShareError::Truncated {
                what: self.what,
                need: self.at + n,
                got: self.bytes.len(),
            });
        }
        self.at += n;
        Ok(&rest[..n])
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], ShareError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, ShareError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, ShareError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, ShareError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, ShareError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn text(&mut self, max: usize) -> Result<String, ShareError> {
        let n = self.u16()? as usize;
        if n > max {
            return bad("text length", n as u64, "at most 512 bytes");
        }
        let b = self.take(n)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| ShareError::BadName("not UTF-8"))
    }
    fn name(&mut self) -> Result<String, ShareError> {
        let n = self.u16()? as usize;
        let b = self.take(n)?;
        let s = std::str::from_utf8(b).map_err(|_| ShareError::BadName("not UTF-8"))?;
        check_name(s)?;
        Ok(s.to_owned())
    }
}

/// Whether `name` may name a region: 1 to [`MAX_NAME`] bytes of UTF-8 with no NUL or control
/// character.
pub fn check_name(name: &str) -> Result<(), ShareError> {
    if name.is_empty() {
        return Err(ShareError::BadName("empty"));
    }
    if name.len() > MAX_NAME {
        return Err(ShareError::BadName("longer than 64 bytes"));
    }
    if name.chars().any(char::is_control) {
        return Err(ShareError::BadName("holds a control character"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lane() -> LaneDescriptor {
        LaneDescriptor {
            lane: 3,
            wrap: WrapMode::Padded,
            capacity: 1 << 20,
            data_size: 2 << 20,
            data_offset: 0,
            start_pos: 4096,
            start_seq: 64,
            head: 1024,
        }
    }

    fn descriptor(region: Region) -> Message {
        Message::Region(RegionDescriptor {
            request: 1,
            attachment: 7,
            device_uuid: [1; 16],
            driver_uuid: [2; 16],
            memory_type: 4,
            atom: 64,
            non_coherent: false,
            region,
        })
    }

    fn every_kind() -> Vec<Message> {
        vec![
            Message::Attach {
                request: 1,
                name: "frames".into(),
            },
            descriptor(Region::Memory {
                size: 8192,
                len: 5000,
            }),
            descriptor(Region::Pool { quota: 1 << 30 }),
            descriptor(Region::RingLane(lane())),
            Message::Refused {
                request: 2,
                code: RefusalCode::Busy,
                text: "every lane is taken".into(),
            },
            Message::Chunk {
                attachment: 7,
                chunk: 0,
                size: 2 << 20,
            },
            Message::Block {
                request: 3,
                attachment: 7,
                chunk: 0,
                offset: 256,
                len: 100,
                token: 9,
            },
            Message::Revoke {
                attachment: 7,
                token: 0,
            },
            Message::Request {
                request: 3,
                attachment: 7,
                size: 100,
                align: 256,
            },
            Message::Release {
                attachment: 7,
                token: 9,
            },
            Message::Detach { attachment: 7 },
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        for m in every_kind() {
            let b = encode(&m);
            assert!(b.len() <= MAX_MESSAGE, "{m:?}");
            assert_eq!(decode(&b, m.fd_count()), Ok(m.clone()));
        }
    }

    #[test]
    fn each_check_refuses_what_it_names() {
        let m = descriptor(Region::Memory {
            size: 8192,
            len: 5000,
        });
        let good = encode(&m);
        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(decode(&b, 1), Err(ShareError::BadMagic { .. })));
        let mut b = good.clone();
        b[4] = 2;
        assert_eq!(
            decode(&b, 1),
            Err(ShareError::UnknownVersion {
                got: 2,
                supported: 1
            })
        );
        let mut b = good.clone();
        b[6] = 99;
        assert_eq!(decode(&b, 1), Err(ShareError::UnknownKind(99)));
        assert!(matches!(
            decode(&good[..good.len() - 3], 1),
            Err(ShareError::Truncated { .. })
        ));
        assert!(matches!(
            decode(&good[..10], 1),
            Err(ShareError::Truncated { .. })
        ));
        let mut b = good.clone();
        b.push(0);
        assert!(matches!(decode(&b, 1), Err(ShareError::Trailing { .. })));
        assert!(matches!(
            decode(&good, 0),
            Err(ShareError::FdCount {
                expected: 1,
                got: 0,
                ..
            })
        ));
        assert!(matches!(
            decode(&good, 2),
            Err(ShareError::FdCount {
                expected: 1,
                got: 2,
                ..
            })
        ));
        // Sizes, lanes and names out of range.
        for (region, field) in [
            (
                Region::Memory {
                    size: 8191,
                    len: 10,
                },
                "memory size",
            ),
            (
                Region::Memory {
                    size: 8192,
                    len: 8193,
                },
                "memory len",
            ),
            (
                Region::RingLane(LaneDescriptor {
                    capacity: 3 << 12,
                    ..lane()
                }),
                "capacity",
            ),
            (
                Region::RingLane(LaneDescriptor {
                    data_offset: 2 << 20,
                    ..lane()
                }),
                "data offset",
            ),
            (
                Region::RingLane(LaneDescriptor {
                    start_pos: 4097,
                    ..lane()
                }),
                "start position",
            ),
            (
                Region::RingLane(LaneDescriptor {
                    head: 8192,
                    ..lane()
                }),
                "head",
            ),
        ] {
            let m = descriptor(region);
            assert!(
                matches!(decode(&encode(&m), m.fd_count()), Err(ShareError::BadField { field: f, .. }) if f == field),
                "{field}"
            );
        }
        for name in ["", "a\0b", &"x".repeat(65)] {
            let m = Message::Attach {
                request: 1,
                name: name.into(),
            };
            assert!(
                matches!(decode(&encode(&m), 0), Err(ShareError::BadName(_))),
                "{name:?}"
            );
        }
    }

    proptest! {
        /// Any bytes at all: an error or a message that encodes back to the same bytes.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200), fds in 0usize..4) {
            if let Ok(m) = decode(&bytes, fds) {
                prop_assert_eq!(encode(&m), bytes);
            }
        }

        /// Valid messages with any one byte changed: never a panic, and never a message that
        /// breaks a field rule.
        #[test]
        fn one_changed_byte_is_caught_or_harmless(k in 0usize..11, at in any::<prop::sample::Index>(), v in any::<u8>()) {
            let m = &every_kind()[k];
            let mut b = encode(m);
            let i = at.index(b.len());
            b[i] = v;
            if let Ok(Message::Region(d)) = decode(&b, m.fd_count()) {
                if let Region::RingLane(l) = d.region {
                    prop_assert!(check_lane(&l).is_ok());
                }
            }
        }
    }
}
