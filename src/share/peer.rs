//! [`Peer`]: the side that attaches. It connects to an owner's socket, asks for regions by name,
//! checks every descriptor and fd it receives, and maps the memory through a Vulkan device of
//! its own, opened by the GPU's UUID: no CUDA in this process.

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::copy::WriteKernel;
use crate::core::alloc::AllocError;
use crate::core::handle::SendSyncPtr;
use crate::core::range::check_range;
use crate::core::ring::{Producer, RingCore, RingError, RingSink};
use crate::core::share::lane::LanePosition;
use crate::core::share::wire::{LaneDescriptor, Message, Region, RegionDescriptor};
use crate::core::share::ShareError;
use crate::core::sync::store_fence;
use crate::driver::vulkan::{
    format_uuid, DeviceSelector, MemoryOptions, VulkanContext, VulkanMemory,
};
use crate::error::{Error, Result};
use crate::mapping::Mapping;

use super::page::{check_memory_fd, SharedPage};
use super::relay::{
    write_position, ACTIVE, CONSUMER_GONE, O_HEAD, O_SEQ, O_STATE, O_TAIL, REVOKED,
};
use super::sys::{Connection, PeerCredentials};

/// How long a [`Peer`] waits for the owner's answer unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to an owner ([`ShareServer`](super::ShareServer)): the regions attached
/// through it ([`attach_memory`](Self::attach_memory), [`attach_pool`](Self::attach_pool),
/// [`attach_lane`](Self::attach_lane)) hold it, so it lives as long as any of them.
///
/// ```no_run
/// use vkgdr::share::Peer;
/// use vkgdr::Mapping;
/// # fn main() -> vkgdr::Result<()> {
/// let peer = Peer::connect("/tmp/frames.sock")?; // no CUDA here: Vulkan alone
/// let mut params = peer.attach_memory("params")?;
/// params.write(0, &[1, 2, 3, 4])?; // lands in the owner's GPU memory
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Peer {
    inner: Arc<PeerInner>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer").finish_non_exhaustive()
    }
}

struct PeerInner {
    conn: Connection,
    owner: PeerCredentials,
    /// The device the regions are mapped through: given, or opened by the first region's UUID.
    device: Mutex<Option<Arc<VulkanContext>>>,
    io: Mutex<Io>,
    /// Held while one thread receives a message and files it: a message is filed before the
    /// next is read (a chunk is imported before the block in it arrives), whichever thread
    /// reads them.
    reading: Mutex<()>,
    next_request: AtomicU64,
    timeout: Duration,
}

/// What arrived and is not yet taken.
#[derive(Default)]
struct Io {
    /// Answers (regions, refusals, requested blocks) by request number; 0 is the owner's
    /// refusal of the connection itself.
    answers: HashMap<u64, Answer>,
    /// Chunks of pool attachments: (attachment, chunk number) → the imported memory.
    chunks: HashMap<(u32, u32), Arc<VulkanMemory>>,
    /// Blocks the owner sent unasked, per attachment.
    pushed: HashMap<u32, VecDeque<BlockParts>>,
    /// Revocation flags of attachments and of blocks (by token).
    attachment_flags: HashMap<u32, Arc<AtomicBool>>,
    block_flags: HashMap<u64, Arc<AtomicBool>>,
    /// Set when the owner hung up.
    gone: bool,
}

/// An answer: the message, its fds, and for a block the block.
type Answer = (Message, Vec<OwnedFd>, Option<BlockParts>);

struct BlockParts {
    chunk: Arc<VulkanMemory>,
    offset: u64,
    len: u64,
    token: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Peer {
    /// Connects to the owner at `path`. The device is opened when the first region arrives, by
    /// the UUID its descriptor names.
    pub fn connect(path: impl AsRef<Path>) -> Result<Peer> {
        Self::connect_with(path, None, DEFAULT_TIMEOUT)
    }

    /// Connects, mapping regions through `device` (which refuses regions of other GPUs with
    /// [`ShareError::WrongDevice`]) when given, and waiting up to `timeout` for each answer.
    pub fn connect_with(
        path: impl AsRef<Path>,
        device: Option<Arc<VulkanContext>>,
        timeout: Duration,
    ) -> Result<Peer> {
        let conn = Connection::connect(path.as_ref())?;
        let owner = conn.peer_credentials()?;
        Ok(Peer {
            inner: Arc::new(PeerInner {
                conn,
                owner,
                device: Mutex::new(device),
                io: Mutex::new(Io::default()),
                reading: Mutex::new(()),
                next_request: AtomicU64::new(1),
                timeout,
            }),
        })
    }

    /// The owner's process, uid and gid (`SO_PEERCRED`).
    pub fn owner(&self) -> PeerCredentials {
        self.inner.owner
    }

    /// The Vulkan device regions are mapped through, once there is one.
    pub fn device(&self) -> Option<Arc<VulkanContext>> {
        lock(&self.inner.device).clone()
    }

    /// Attaches the raw memory shared as `name`.
    pub fn attach_memory(&self, name: &str) -> Result<AttachedMemory> {
        let (d, mut fds) = self.inner.attach(name)?;
        let Region::Memory { size, len } = d.region else {
            self.inner.detach(d.attachment);
            return Err(ShareError::Protocol(format!("{name:?} is not raw memory")).into());
        };
        let fd = fds.pop().expect("decode checked the fd count");
        let memory = self.inner.import(&d, fd, size, "memory").inspect_err(|_| {
            self.inner.detach(d.attachment);
        })?;
        Ok(AttachedMemory {
            revoked: self.inner.flag(d.attachment),
            peer: Arc::clone(&self.inner),
            attachment: d.attachment,
            memory,
            len,
        })
    }

    /// Attaches the pool shared as `name`: its blocks then come with
    /// [`AttachedPool::request`] or from the owner ([`AttachedPool::next_block`]).
    pub fn attach_pool(&self, name: &str) -> Result<AttachedPool> {
        let (d, _) = self.inner.attach(name)?;
        let Region::Pool { quota } = d.region else {
            self.inner.detach(d.attachment);
            return Err(ShareError::Protocol(format!("{name:?} is not a pool")).into());
        };
        self.inner.ensure_device(&d)?;
        Ok(AttachedPool {
            revoked: self.inner.flag(d.attachment),
            peer: Arc::clone(&self.inner),
            attachment: d.attachment,
            quota,
        })
    }

    /// Attaches a lane of the ring shared as `name`: this process becomes its producer
    /// ([`AttachedLane::producer`]), starting where the lane's last producer stopped.
    pub fn attach_lane(&self, name: &str) -> Result<AttachedLane> {
        let (d, fds) = self.inner.attach(name)?;
        let Region::RingLane(l) = d.region else {
            self.inner.detach(d.attachment);
            return Err(ShareError::Protocol(format!("{name:?} is not a ring")).into());
        };
        self.inner
            .lane(&d, l, fds)
            .inspect_err(|_| self.inner.detach(d.attachment))
    }

    /// Reads everything the owner sent meanwhile (revocations, blocks sent unasked) without
    /// waiting. Every call that waits for the owner does this too. An owner that hung up is
    /// [`ShareError::Disconnected`] from the first call that finds nothing before the hang-up:
    /// what it sent before counts first.
    pub fn poll(&self) -> Result<()> {
        let mut read = false;
        loop {
            match self.inner.pump(Some(Duration::ZERO)) {
                Ok(true) => read = true,
                Ok(false) => return Ok(()),
                Err(Error::Share(ShareError::Disconnected)) if read => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
}

impl PeerInner {
    fn request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// Receives one message (waiting up to `wait`) and files it; false if none came.
    fn pump(&self, wait: Option<Duration>) -> Result<bool> {
        let _reading = lock(&self.reading);
        let got = match wait {
            Some(Duration::ZERO) => self.conn.try_recv()?,
            w => match self.conn.recv(w) {
                Ok(x) => Some(x),
                Err(Error::Share(ShareError::Timeout { .. })) => None,
                Err(e) => return Err(e),
            },
        };
        let Some((m, fds)) = got else {
            return Ok(false);
        };
        let mut io = lock(&self.io);
        match m {
            Message::Region(ref d) => {
                io.answers.insert(d.request, (m, fds, None));
            }
            Message::Refused { request, .. } => {
                io.answers.insert(request, (m, fds, None));
            }
            Message::Chunk {
                attachment,
                chunk,
                size,
            } => {
                drop(io);
                let fd = fds.into_iter().next().expect("decode checked the fd count");
                let device = lock(&self.device)
                    .clone()
                    .ok_or_else(|| ShareError::Protocol("a chunk before any region".into()))?;
                check_memory_fd(std::os::fd::AsFd::as_fd(&fd), size, "pool chunk")?;
                let memory = device.import_fd(fd, size, device.memory_type().index)?;
                lock(&self.io)
                    .chunks
                    .insert((attachment, chunk), Arc::new(memory));
            }
            Message::Block {
                request,
                attachment,
                chunk,
                offset,
                len,
                token,
            } => {
                let memory = io
                    .chunks
                    .get(&(attachment, chunk))
                    .cloned()
                    .ok_or_else(|| {
                        ShareError::Protocol(format!("block {token} in chunk {chunk}, never sent"))
                    })?;
                if check_range(offset, len, memory.size()).is_err() {
                    return Err(ShareError::Protocol(format!(
                        "block {token} ({offset}+{len}) lies outside its {}-byte chunk",
                        memory.size()
                    ))
                    .into());
                }
                let parts = BlockParts {
                    chunk: memory,
                    offset,
                    len,
                    token,
                };
                if request == 0 {
                    io.pushed.entry(attachment).or_default().push_back(parts);
                } else {
                    io.answers.insert(request, (m, Vec::new(), Some(parts)));
                }
            }
            Message::Revoke { attachment, token } => {
                let flag = if token == 0 {
                    io.attachment_flags.get(&attachment)
                } else {
                    io.block_flags.get(&token)
                };
                if let Some(f) = flag {
                    f.store(true, Ordering::Release);
                }
            }
            other => {
                return Err(ShareError::Protocol(format!(
                    "the owner sent {}, which only a peer sends",
                    other.name()
                ))
                .into())
            }
        }
        Ok(true)
    }

    /// Waits for the answer to `request` (or the owner's refusal of the connection).
    fn answer(&self, request: u64) -> Result<Answer> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let answered = {
                let mut io = lock(&self.io);
                io.answers
                    .remove(&request)
                    .or_else(|| io.answers.remove(&0))
            };
            if let Some(a) = answered {
                return Ok(a);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ShareError::Timeout {
                    millis: self.timeout.as_millis() as u64,
                }
                .into());
            }
            if let Err(e) = self.pump(Some(left.min(Duration::from_millis(50)))) {
                if matches!(e, Error::Share(ShareError::Disconnected)) {
                    lock(&self.io).gone = true;
                }
                return Err(e);
            }
        }
    }

    fn attach(&self, name: &str) -> Result<(RegionDescriptor, Vec<OwnedFd>)> {
        let request = self.request_id();
        self.conn.send(
            &Message::Attach {
                request,
                name: name.into(),
            },
            &[],
            true,
        )?;
        match self.answer(request)? {
            (Message::Region(d), fds, _) => Ok((d, fds)),
            (Message::Refused { code, text, .. }, _, _) => {
                Err(ShareError::Refused { code, text }.into())
            }
            (m, _, _) => {
                Err(ShareError::Protocol(format!("{} answering an attach", m.name())).into())
            }
        }
    }

    fn detach(&self, attachment: u32) {
        let _ = self.conn.send(&Message::Detach { attachment }, &[], true);
    }

    fn flag(&self, attachment: u32) -> Arc<AtomicBool> {
        let flag = Arc::new(AtomicBool::new(false));
        lock(&self.io)
            .attachment_flags
            .insert(attachment, Arc::clone(&flag));
        flag
    }

    /// The device for `d`'s region: the one given or opened before (which must be the region's
    /// GPU, driver and memory type), or one opened now by the region's UUID.
    fn ensure_device(&self, d: &RegionDescriptor) -> Result<Arc<VulkanContext>> {
        let mut device = lock(&self.device);
        let ctx = match device.as_ref() {
            Some(ctx) => Arc::clone(ctx),
            None => {
                let ctx = VulkanContext::new(
                    DeviceSelector::Uuid(d.device_uuid),
                    MemoryOptions {
                        require_coherent: false,
                        force_non_coherent: d.non_coherent,
                    },
                )?;
                *device = Some(Arc::clone(&ctx));
                ctx
            }
        };
        let info = ctx.device_info();
        if info.uuid != d.device_uuid {
            return Err(ShareError::WrongDevice {
                expected: format_uuid(&d.device_uuid),
                found: format_uuid(&info.uuid),
            }
            .into());
        }
        if info.driver_uuid != d.driver_uuid {
            return Err(ShareError::WrongDriver {
                expected: format_uuid(&d.driver_uuid),
                found: format_uuid(&info.driver_uuid),
            }
            .into());
        }
        if ctx.memory_type().index != d.memory_type {
            return Err(ShareError::MemoryType {
                declared: d.memory_type,
                local: ctx.memory_type().index,
            }
            .into());
        }
        Ok(ctx)
    }

    fn import(
        &self,
        d: &RegionDescriptor,
        fd: OwnedFd,
        size: u64,
        which: &'static str,
    ) -> Result<VulkanMemory> {
        let ctx = self.ensure_device(d)?;
        check_memory_fd(std::os::fd::AsFd::as_fd(&fd), size, which)?;
        ctx.import_fd(fd, size, d.memory_type)
    }

    fn lane(
        self: &Arc<Self>,
        d: &RegionDescriptor,
        l: LaneDescriptor,
        fds: Vec<OwnedFd>,
    ) -> Result<AttachedLane> {
        let mut fds = fds.into_iter();
        let (data, producer, owner) = (
            fds.next().expect("decode checked the fd count"),
            fds.next().expect("decode checked the fd count"),
            fds.next().expect("decode checked the fd count"),
        );
        let memory = self.import(d, data, l.data_size, "lane data")?;
        let producer = SharedPage::map_received(producer, true, "lane producer page")?;
        let owner = SharedPage::map_received(owner, false, "lane owner page")?;
        let sink = PeerSink {
            // In range: decode checked `data_offset + capacity <= data_size`.
            data: SendSyncPtr::new(memory.as_ptr().wrapping_add(l.data_offset as usize)),
            offset: l.data_offset,
            capacity: l.capacity,
            kernel: WriteKernel::detected(),
            published: AtomicU64::new(l.start_pos),
            memory,
            producer,
        };
        let core =
            RingCore::starting_at(l.capacity, sink, l.wrap, l.start_pos, l.start_seq, l.head)?;
        Ok(AttachedLane {
            revoked: self.flag(d.attachment),
            peer: Arc::clone(self),
            attachment: d.attachment,
            descriptor: l,
            core,
            owner,
        })
    }
}

/// Raw memory attached from an owner: a [`Mapping`] of all of it (writes flushed, reads
/// invalidated where the memory is not coherent). Dropping it detaches.
pub struct AttachedMemory {
    peer: Arc<PeerInner>,
    attachment: u32,
    memory: VulkanMemory,
    len: u64,
    revoked: Arc<AtomicBool>,
}

impl std::fmt::Debug for AttachedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedMemory")
            .field("attachment", &self.attachment)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl AttachedMemory {
    /// Whether the owner revoked it (seen at the last [`Peer::poll`] or wait): writes are then
    /// refused with [`ShareError::Revoked`].
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// The Vulkan memory it maps.
    pub fn memory(&self) -> &VulkanMemory {
        &self.memory
    }

    /// [`Mapping::write`] through a shared reference: refused once revoked, then the same
    /// bounds check, copy and flush. For callers that keep writers of the same bytes apart
    /// themselves, as the C library's callers promise to.
    ///
    /// # Safety
    /// - No other thread of this process reads or writes `[offset, offset + src.len())` of the
    ///   mapping during the call, and `src` does not overlap it.
    pub unsafe fn write_shared(&self, offset: u64, src: &[u8]) -> Result<()> {
        if self.is_revoked() {
            return Err(ShareError::Revoked.into());
        }
        // SAFETY: the mapping holds `len()` bytes while `self` lives; the range is the caller's
        // alone for the call.
        unsafe { crate::mapping::store(self.host_ptr(), self.len(), offset, src) }?;
        self.memory.flush(offset, src.len() as u64)
    }
}

// SAFETY: the imported allocation is mapped whole for as long as `self.memory` lives, at least
// `len` bytes (decode checked `len <= size`); only `&mut self` methods write through it.
unsafe impl Mapping for AttachedMemory {
    fn host_ptr(&self) -> *mut u8 {
        self.memory.as_ptr()
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn after_write(&mut self, offset: u64, len: u64) -> Result<()> {
        self.memory.flush(offset, len)
    }
    fn before_read(&self, offset: u64, len: u64) -> Result<()> {
        self.memory.invalidate(offset, len)
    }
    fn write(&mut self, offset: u64, src: &[u8]) -> Result<()> {
        if self.is_revoked() {
            return Err(ShareError::Revoked.into());
        }
        // SAFETY: the mapping is valid for `len()` bytes while `self` lives and `&mut self`
        // excludes other writers of this process.
        unsafe { crate::mapping::store(self.host_ptr(), self.len(), offset, src) }?;
        self.after_write(offset, src.len() as u64)
    }
}

impl Drop for AttachedMemory {
    fn drop(&mut self) {
        self.peer.detach(self.attachment);
    }
}

/// A pool attached from an owner: where its blocks come from.
pub struct AttachedPool {
    peer: Arc<PeerInner>,
    attachment: u32,
    quota: u64,
    revoked: Arc<AtomicBool>,
}

impl std::fmt::Debug for AttachedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedPool")
            .field("attachment", &self.attachment)
            .field("quota", &self.quota)
            .finish_non_exhaustive()
    }
}

impl AttachedPool {
    /// The most bytes of blocks this process may hold at once.
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// Whether the owner revoked the pool (seen at the last [`Peer::poll`] or wait): requests
    /// are then refused with [`ShareError::Revoked`], and so are writes through its blocks.
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// Asks the owner for a block of `size` bytes aligned to `align` (a power of two). A zero
    /// size or another alignment is refused here, as the pool would refuse it
    /// ([`Error::InvalidArgument`]): the owner takes such a request for a broken peer's, and
    /// disconnects it.
    pub fn request(&self, size: u64, align: u64) -> Result<SharedBlock> {
        if size == 0 {
            return Err(AllocError::ZeroSize.into());
        }
        if !align.is_power_of_two() {
            return Err(AllocError::BadAlignment { align }.into());
        }
        if self.revoked.load(Ordering::Acquire) {
            return Err(ShareError::Revoked.into());
        }
        let request = self.peer.request_id();
        self.peer.conn.send(
            &Message::Request {
                request,
                attachment: self.attachment,
                size,
                align,
            },
            &[],
            true,
        )?;
        match self.peer.answer(request)? {
            (Message::Block { attachment, .. }, _, Some(parts))
                if attachment == self.attachment =>
            {
                Ok(self.block(parts))
            }
            (Message::Refused { code, text, .. }, _, _) => {
                Err(ShareError::Refused { code, text }.into())
            }
            (m, _, _) => {
                Err(ShareError::Protocol(format!("{} answering a request", m.name())).into())
            }
        }
    }

    /// The next block the owner sent unasked, waiting up to `timeout` for one.
    pub fn next_block(&self, timeout: Duration) -> Result<SharedBlock> {
        let deadline = Instant::now() + timeout;
        loop {
            let parts = lock(&self.peer.io)
                .pushed
                .get_mut(&self.attachment)
                .and_then(VecDeque::pop_front);
            if let Some(parts) = parts {
                return Ok(self.block(parts));
            }
            if self.revoked.load(Ordering::Acquire) {
                return Err(ShareError::Revoked.into());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ShareError::Timeout {
                    millis: timeout.as_millis() as u64,
                }
                .into());
            }
            self.peer.pump(Some(left.min(Duration::from_millis(50))))?;
        }
    }

    fn block(&self, parts: BlockParts) -> SharedBlock {
        let flag = Arc::new(AtomicBool::new(false));
        lock(&self.peer.io)
            .block_flags
            .insert(parts.token, Arc::clone(&flag));
        SharedBlock {
            peer: Arc::clone(&self.peer),
            attachment: self.attachment,
            parts,
            revoked: flag,
            pool_revoked: Arc::clone(&self.revoked),
        }
    }
}

impl Drop for AttachedPool {
    fn drop(&mut self) {
        self.peer.detach(self.attachment);
    }
}

/// A block of an owner's pool, lent to this process: a [`Mapping`] of its bytes. Dropping it
/// gives it back (the owner frees it then, not before).
pub struct SharedBlock {
    peer: Arc<PeerInner>,
    attachment: u32,
    parts: BlockParts,
    revoked: Arc<AtomicBool>,
    pool_revoked: Arc<AtomicBool>,
}

impl std::fmt::Debug for SharedBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBlock")
            .field("token", &self.parts.token)
            .field("offset", &self.parts.offset)
            .field("len", &self.parts.len)
            .finish_non_exhaustive()
    }
}

impl SharedBlock {
    /// The owner's name for it.
    pub fn token(&self) -> u64 {
        self.parts.token
    }

    /// Its offset in its chunk.
    pub fn offset_in_chunk(&self) -> u64 {
        self.parts.offset
    }

    /// Whether the owner took it (or its pool) back: writes are refused from then on.
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire) || self.pool_revoked.load(Ordering::Acquire)
    }

    /// Makes CPU writes to `[offset, offset + len)` of the block (through
    /// [`host_ptr`](Mapping::host_ptr)) visible to the device: a flush of that range of its
    /// chunk, a no-op on coherent memory. Checked against the block.
    pub fn flush(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.parts.len)?;
        self.parts.chunk.flush(self.parts.offset + offset, len)
    }

    /// [`Mapping::write`] through a shared reference: refused once revoked, then the same
    /// bounds check, copy and flush. For callers that keep writers of the same bytes apart
    /// themselves, as the C library's callers promise to.
    ///
    /// # Safety
    /// - No other thread of this process reads or writes `[offset, offset + src.len())` of the
    ///   block during the call, and `src` does not overlap it.
    pub unsafe fn write_shared(&self, offset: u64, src: &[u8]) -> Result<()> {
        if self.is_revoked() {
            return Err(ShareError::Revoked.into());
        }
        // SAFETY: the block's `len()` bytes lie inside the live chunk mapping; the range is the
        // caller's alone for the call.
        unsafe { crate::mapping::store(self.host_ptr(), self.len(), offset, src) }?;
        self.flush(offset, src.len() as u64)
    }
}

// SAFETY: the block lies inside its chunk (checked when it arrived), whose imported mapping the
// block keeps alive through its `Arc`; the owner hands each byte of a chunk to one block at a
// time, and only `&mut self` methods write.
unsafe impl Mapping for SharedBlock {
    fn host_ptr(&self) -> *mut u8 {
        self.parts
            .chunk
            .as_ptr()
            .wrapping_add(self.parts.offset as usize)
    }
    fn len(&self) -> u64 {
        self.parts.len
    }
    fn after_write(&mut self, offset: u64, len: u64) -> Result<()> {
        self.parts.chunk.flush(self.parts.offset + offset, len)
    }
    fn before_read(&self, offset: u64, len: u64) -> Result<()> {
        self.parts.chunk.invalidate(self.parts.offset + offset, len)
    }
    fn write(&mut self, offset: u64, src: &[u8]) -> Result<()> {
        if self.is_revoked() {
            return Err(ShareError::Revoked.into());
        }
        // SAFETY: as for the trait: `len()` bytes inside the live chunk mapping, written only
        // through `&mut self`.
        unsafe { crate::mapping::store(self.host_ptr(), self.len(), offset, src) }?;
        self.after_write(offset, src.len() as u64)
    }
}

impl Drop for SharedBlock {
    fn drop(&mut self) {
        lock(&self.peer.io).block_flags.remove(&self.parts.token);
        let _ = self.peer.conn.send(
            &Message::Release {
                attachment: self.attachment,
                token: self.parts.token,
            },
            &[],
            true,
        );
    }
}

/// A ring lane this process produces into: its records go straight into the owner's GPU memory
/// through this process's mapping, its tail to the owner, who passes it on to the consumer once
/// checked. Dropping it detaches: the owner takes the lane back at its last accepted record.
pub struct AttachedLane {
    peer: Arc<PeerInner>,
    attachment: u32,
    descriptor: LaneDescriptor,
    core: RingCore<PeerSink>,
    owner: SharedPage,
    revoked: Arc<AtomicBool>,
}

impl std::fmt::Debug for AttachedLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedLane")
            .field("lane", &self.descriptor.lane)
            .field("capacity", &self.descriptor.capacity)
            .finish_non_exhaustive()
    }
}

impl AttachedLane {
    /// The lane's number in the owner's ring.
    pub fn lane(&self) -> u32 {
        self.descriptor.lane
    }

    /// The lane's region size.
    pub fn capacity(&self) -> u64 {
        self.descriptor.capacity
    }

    /// Where this producer started.
    pub fn start(&self) -> LanePosition {
        LanePosition {
            tail: self.descriptor.start_pos,
            seq: self.descriptor.start_seq,
        }
    }

    /// The producer core (positions, counters, shared reservations).
    pub fn core(&self) -> &RingCore<PeerSink> {
        &self.core
    }

    /// What the owner has accepted and passed on to the consumer so far.
    pub fn accepted(&self) -> LanePosition {
        LanePosition {
            tail: self.owner.word(O_TAIL).load(Ordering::Acquire),
            seq: self.owner.word(O_SEQ).load(Ordering::Acquire),
        }
    }

    /// The consumer's head, as the owner last mirrored it.
    pub fn head(&self) -> u64 {
        self.owner.word(O_HEAD).load(Ordering::Acquire)
    }

    /// Whether the owner stopped serving the lane: revoked, refused a tail, or its consumer is
    /// gone. Records pushed from then on reach no consumer.
    pub fn is_stopped(&self) -> bool {
        self.owner.word(O_STATE).load(Ordering::Acquire) != ACTIVE
            || self.revoked.load(Ordering::Acquire)
    }

    /// Why the lane stopped, if it did.
    pub fn stop_reason(&self) -> Option<ShareError> {
        match self.owner.word(O_STATE).load(Ordering::Acquire) {
            ACTIVE if !self.revoked.load(Ordering::Acquire) => None,
            ACTIVE | REVOKED => Some(ShareError::Revoked),
            CONSUMER_GONE => Some(ShareError::Protocol("the ring's consumer is gone".into())),
            _ => Some(ShareError::Protocol(
                "the owner refused a tail this producer published".into(),
            )),
        }
    }

    /// The consumer's head as a producer's wait sees it: `Stopped` once the owner stopped
    /// serving the lane and no more space will free.
    fn lane_head(&self) -> std::result::Result<u64, RingError> {
        let head = self.head();
        if head <= self.core.reclaimed() && self.is_stopped() {
            return Err(RingError::Stopped);
        }
        Ok(head)
    }

    /// Claims the lane for one producer thread: records with no lock, a batch published with
    /// one fence and one tail (see [`Producer`]).
    pub fn producer(&self) -> Result<Producer<'_, PeerSink>> {
        Ok(self.core.claim(move || self.lane_head())?)
    }

    /// Writes and publishes one record from any thread; waits up to `timeout` for space.
    pub fn push(&self, payload: &[u8], timeout: Option<Duration>) -> Result<u64> {
        Ok(self.core.push(payload, timeout, &|| self.lane_head())?)
    }
}

impl Drop for AttachedLane {
    fn drop(&mut self) {
        self.peer.detach(self.attachment);
    }
}

/// Where a remote producer's records go: the lane's region in this process's mapping of the
/// owner's memory, and its `(tail, seq)` into the page the owner reads.
pub struct PeerSink {
    data: SendSyncPtr<u8>,
    offset: u64,
    capacity: u64,
    kernel: WriteKernel,
    /// End of the last publication (for the non-coherent flush).
    published: AtomicU64,
    memory: VulkanMemory,
    producer: SharedPage,
}

impl std::fmt::Debug for PeerSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerSink")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl PeerSink {
    fn flush_since_last(&self, tail: u64) {
        if !self.memory.is_non_coherent() {
            return;
        }
        let from = self.published.swap(tail, Ordering::AcqRel);
        if from >= tail {
            return;
        }
        let cap = self.capacity;
        let (a, len) = (from & (cap - 1), (tail - from).min(cap));
        // A flush error means a lost device; the owner's consumer reports what it then reads.
        let _ = self.memory.flush(self.offset + a, len.min(cap - a));
        if a + len > cap {
            let _ = self.memory.flush(self.offset, a + len - cap);
        }
    }
}

#[allow(clippy::missing_safety_doc)] // the trait's `# Safety` sections apply
impl RingSink for PeerSink {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    unsafe fn write(&self, offset: u64, bytes: &[u8]) {
        debug_assert!(offset + bytes.len() as u64 <= self.capacity);
        // SAFETY: the core hands an in-range span of the lane's region that no one else in this
        // process writes; the mapping lives as long as `self.memory`. `publish_seq` fences.
        unsafe {
            self.kernel
                .write_unfenced(self.data.get().add(offset as usize), bytes)
        };
    }

    fn writes_done(&self) {
        store_fence();
    }

    unsafe fn publish(&self, tail: u64) {
        // The core always calls `publish_seq`; a tail without its sequence number would be
        // refused by the owner, so none is published that way.
        let _ = tail;
    }

    unsafe fn publish_seq(&self, tail: u64, next_seq: u64) {
        self.flush_since_last(tail);
        // The records' bytes are posted before the owner can see the tail that covers them.
        store_fence();
        write_position(
            &self.producer,
            LanePosition {
                tail,
                seq: next_seq,
            },
        );
    }
}
