//! The owner's side of sharing with other processes (`vkgdr_share_*`), a thin layer over
//! [`vkgdr::share::ShareServer`]: a Unix socket that peers connect to (any process, in any
//! language, through `vkgdr_peer_*` of [`crate::peer`]: no CUDA there), the raw memory, pools and
//! shareable rings the owner shares by name, the blocks it sends and takes back, revocation, and
//! what happened, as events.
//!
//! What a peer reaches, and what the owner trusts (nothing it receives), is the library's trust
//! model: see [`vkgdr::share`].

use std::ffi::{c_char, c_int, CStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::LazyLock;
use std::time::Duration;

use vkgdr::share::{PeerPolicy, ShareEvent, ShareOptions, ShareServer};

use crate::device::{device, vkgdr_t, Device};
use crate::error::{guard, CResult, Failure};
use crate::handles::{HandleTable, Tag};
use crate::memory::{memory, vkgdr_memory_t, Memory};
use crate::pool::{vkgdr_block_t, vkgdr_pool_t, BLOCKS};
use crate::ring::{timeout, vkgdr_ring_t};
use crate::versioned::{self, Versioned};
use crate::{
    copy_text, lookup, register, release, write_optional, Handle, VKGDR_ERROR, VKGDR_SUCCESS,
};

/// Opaque handle to a share server.
pub struct vkgdr_share_server {
    _private: [u8; 0],
}

/// Opaque handle to the owner's side of sharing, from `vkgdr_share_server_create`; freed with
/// `vkgdr_share_server_destroy`.
pub type vkgdr_share_server_t = *mut vkgdr_share_server;

/// Nothing there (yet): no event before the timeout (`vkgdr_share_next_event`), no block given
/// back under that token (`vkgdr_share_take_returned`), no block sent before the timeout
/// (`vkgdr_attached_pool_next_block`). Not an error: the last error is left alone.
pub const VKGDR_SHARE_NONE: c_int = 1;

/// `vkgdr_share_options.peers`: who may attach.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub enum vkgdr_share_peers {
    /// Processes of this process's effective uid (checked with `SO_PEERCRED`): the default.
    VKGDR_SHARE_PEERS_SAME_USER = 0,
    /// Anyone who can open the socket: its file mode (`socket_mode`) is the only gate.
    VKGDR_SHARE_PEERS_ANY_USER = 1,
    /// Processes of the uids in `vkgdr_share_options.uids`.
    VKGDR_SHARE_PEERS_UIDS = 2,
}

/// How `vkgdr_share_server_create` runs a server. Fill it with `vkgdr_share_options_init`, then
/// change what you need. Later versions may add fields at the end: `struct_size` tells the
/// library which ones the caller knows.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vkgdr_share_options {
    /// `sizeof(vkgdr_share_options)` as the caller was compiled (set by
    /// `vkgdr_share_options_init`).
    pub struct_size: usize,
    /// Who may attach, a `vkgdr_share_peers` (default `VKGDR_SHARE_PEERS_SAME_USER`).
    pub peers: u32,
    /// The socket file's permission bits, set before anyone is let in (default 0600).
    pub socket_mode: u32,
    /// With `VKGDR_SHARE_PEERS_UIDS`: the uids that may attach (`uid_count` of them, read
    /// during `vkgdr_share_server_create` only). Ignored otherwise.
    pub uids: *const u32,
    /// Number of `uids`.
    pub uid_count: usize,
    /// How long the relay (which checks each remote producer's tail and passes it on to the
    /// ring's consumer) keeps polling without a pause after a lane last moved (default
    /// 2,000,000 ns).
    pub relay_spin_ns: u64,
    /// The relay's pause between polls once nothing moved for `relay_spin_ns` (default
    /// 20,000 ns).
    pub relay_idle_poll_ns: u64,
    /// 1 (the default): a block a peer gives back waits for the owner
    /// (`VKGDR_SHARE_EVENT_RELEASED`, then `vkgdr_share_take_returned`), with what the peer
    /// wrote into it; 0: it goes straight back to its pool.
    pub return_blocks: u32,
    /// Must be 0.
    pub flags: u32,
}

// SAFETY: integers and a raw pointer (any bit pattern is a valid value); `struct_size` first.
unsafe impl Versioned for vkgdr_share_options {
    const NAME: &'static str = "vkgdr_share_options";
}

impl vkgdr_share_options {
    fn defaults() -> Self {
        let d = ShareOptions::default();
        vkgdr_share_options {
            struct_size: std::mem::size_of::<Self>(),
            peers: vkgdr_share_peers::VKGDR_SHARE_PEERS_SAME_USER as u32,
            socket_mode: d.socket_mode,
            uids: std::ptr::null(),
            uid_count: 0,
            relay_spin_ns: d.relay_spin.as_nanos() as u64,
            relay_idle_poll_ns: d.relay_idle_poll.as_nanos() as u64,
            return_blocks: u32::from(d.return_blocks),
            flags: 0,
        }
    }

    /// The library's options.
    ///
    /// # Safety
    /// - With `VKGDR_SHARE_PEERS_UIDS`, `uids` is NULL or readable for `uid_count` values.
    unsafe fn to_options(self) -> CResult<ShareOptions> {
        if self.flags != 0 {
            return Err(Failure::Api(format!(
                "vkgdr_share_options.flags must be 0 (got {:#x})",
                self.flags
            )));
        }
        if self.socket_mode & !0o777 != 0 {
            return Err(Failure::Api(format!(
                "vkgdr_share_options.socket_mode {:#o} has bits beyond 0777",
                self.socket_mode
            )));
        }
        if self.return_blocks > 1 {
            return Err(Failure::Api(format!(
                "vkgdr_share_options.return_blocks is {}: 0 or 1",
                self.return_blocks
            )));
        }
        let peers = match self.peers {
            0 => PeerPolicy::SameUser,
            1 => PeerPolicy::AnyUser,
            2 => {
                if self.uid_count == 0 || self.uids.is_null() {
                    return Err(Failure::Api(
                        "VKGDR_SHARE_PEERS_UIDS needs uids and a uid_count above 0".into(),
                    ));
                }
                // SAFETY: non-null and readable for `uid_count` values (caller).
                let uids = unsafe { std::slice::from_raw_parts(self.uids, self.uid_count) };
                PeerPolicy::Uids(uids.to_vec())
            }
            other => {
                return Err(Failure::Api(format!(
                    "vkgdr_share_options.peers {other} is no vkgdr_share_peers"
                )))
            }
        };
        Ok(ShareOptions {
            peers,
            socket_mode: self.socket_mode,
            relay_spin: Duration::from_nanos(self.relay_spin_ns),
            relay_idle_poll: Duration::from_nanos(self.relay_idle_poll_ns),
            return_blocks: self.return_blocks == 1,
        })
    }
}

/// `vkgdr_share_event.kind`: what happened.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub enum vkgdr_share_event_kind {
    /// A peer connected and was let in: `peer`, `pid`, `uid`.
    VKGDR_SHARE_EVENT_CONNECTED = 1,
    /// A process was turned away by the policy (`vkgdr_share_options.peers`): `pid`, `uid`, and
    /// the rule in `text`.
    VKGDR_SHARE_EVENT_REFUSED = 2,
    /// A peer attached a region: `peer`, `attachment`, the region's name in `text`.
    VKGDR_SHARE_EVENT_ATTACHED = 3,
    /// A peer's request was refused (a name nothing is shared under, a pool's quota, every lane
    /// taken): `peer`, the owner's words in `text`.
    VKGDR_SHARE_EVENT_REQUEST_REFUSED = 4,
    /// A peer detached an attachment: `peer`, `attachment`.
    VKGDR_SHARE_EVENT_DETACHED = 5,
    /// A peer gave a pool block back: `peer`, `token` (for `vkgdr_share_take_returned`).
    VKGDR_SHARE_EVENT_RELEASED = 6,
    /// A remote producer published a tail the owner refused: its lane is out of service until
    /// it detaches or dies. `peer`, `lane`, what was wrong in `text`.
    VKGDR_SHARE_EVENT_LANE_FAULT = 7,
    /// A peer sent something the protocol does not allow and was disconnected: `peer`, what it
    /// sent in `text`.
    VKGDR_SHARE_EVENT_MISBEHAVED = 8,
    /// A peer is gone (hung up, died, revoked or disconnected); everything it held went back:
    /// `peer`, `pid`.
    VKGDR_SHARE_EVENT_GONE = 9,
    /// An event this version of the header does not name; `text` describes it.
    VKGDR_SHARE_EVENT_OTHER = 255,
}

/// Bytes of `vkgdr_share_event.text`, its NUL included.
pub const VKGDR_SHARE_EVENT_TEXT: usize = 512;

/// One event of a server (`vkgdr_share_next_event`). Set `struct_size` to
/// `sizeof(vkgdr_share_event)` before the call. Fields an event kind does not name are 0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vkgdr_share_event {
    /// `sizeof(vkgdr_share_event)` as the caller was compiled.
    pub struct_size: usize,
    /// A `vkgdr_share_event_kind`.
    pub kind: u32,
    /// The peer's process ID.
    pub pid: i32,
    /// The peer's number, unique for the server's life (what `vkgdr_share_send_block` and
    /// `vkgdr_share_revoke` take).
    pub peer: u64,
    /// A block's token.
    pub token: u64,
    /// The peer's effective uid.
    pub uid: u32,
    /// The attachment's number (the peer's end knows it too).
    pub attachment: u32,
    /// The lane of the ring.
    pub lane: u32,
    /// Bytes of the event's text, without the NUL: when it is `VKGDR_SHARE_EVENT_TEXT` or more,
    /// `text` holds its first `VKGDR_SHARE_EVENT_TEXT - 1` bytes (cut at a UTF-8 character).
    pub text_len: u32,
    /// The event's text (a region name, a reason), UTF-8, NUL-terminated; empty for kinds
    /// without one.
    pub text: [c_char; VKGDR_SHARE_EVENT_TEXT],
}

// SAFETY: integers only; `struct_size` first.
unsafe impl Versioned for vkgdr_share_event {
    const NAME: &'static str = "vkgdr_share_event";
}

impl vkgdr_share_event {
    fn from_event(e: ShareEvent) -> Self {
        use vkgdr_share_event_kind as K;
        // SAFETY: integers only: all zeros is a valid value (kind and text filled below).
        let mut out: Self = unsafe { std::mem::zeroed() };
        out.struct_size = std::mem::size_of::<Self>();
        let (kind, text) = match e {
            ShareEvent::Connected { peer, pid, uid } => {
                (out.peer, out.pid, out.uid) = (peer, pid, uid);
                (K::VKGDR_SHARE_EVENT_CONNECTED, String::new())
            }
            ShareEvent::Refused { pid, uid, why } => {
                (out.pid, out.uid) = (pid, uid);
                (K::VKGDR_SHARE_EVENT_REFUSED, why)
            }
            ShareEvent::Attached {
                peer,
                region,
                attachment,
            } => {
                (out.peer, out.attachment) = (peer, attachment);
                (K::VKGDR_SHARE_EVENT_ATTACHED, region)
            }
            ShareEvent::RequestRefused { peer, why } => {
                out.peer = peer;
                (K::VKGDR_SHARE_EVENT_REQUEST_REFUSED, why)
            }
            ShareEvent::Detached { peer, attachment } => {
                (out.peer, out.attachment) = (peer, attachment);
                (K::VKGDR_SHARE_EVENT_DETACHED, String::new())
            }
            ShareEvent::Released { peer, token } => {
                (out.peer, out.token) = (peer, token);
                (K::VKGDR_SHARE_EVENT_RELEASED, String::new())
            }
            ShareEvent::LaneFault { peer, lane, error } => {
                (out.peer, out.lane) = (peer, lane);
                (K::VKGDR_SHARE_EVENT_LANE_FAULT, error)
            }
            ShareEvent::Misbehaved { peer, error } => {
                out.peer = peer;
                (K::VKGDR_SHARE_EVENT_MISBEHAVED, error)
            }
            ShareEvent::Gone { peer, pid } => {
                (out.peer, out.pid) = (peer, pid);
                (K::VKGDR_SHARE_EVENT_GONE, String::new())
            }
            other => (K::VKGDR_SHARE_EVENT_OTHER, format!("{other:?}")),
        };
        out.kind = kind as u32;
        out.text_len = u32::try_from(text.len()).unwrap_or(u32::MAX);
        copy_text(&mut out.text, &text);
        out
    }
}

/// Counters over a server's life (`vkgdr_share_get_stats`). Set `struct_size` to
/// `sizeof(vkgdr_share_stats)` before the call.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct vkgdr_share_stats {
    /// `sizeof(vkgdr_share_stats)` as the caller was compiled.
    pub struct_size: usize,
    /// Peers let in.
    pub connected: u64,
    /// Processes turned away by the policy.
    pub refused: u64,
    /// Peers gone (hung up, died, revoked or disconnected).
    pub gone: u64,
    /// Peers disconnected for breaking the protocol.
    pub misbehaved: u64,
    /// Tails a remote producer published that the relay refused.
    pub lane_faults: u64,
    /// Peers connected now.
    pub peers: u64,
}

// SAFETY: integers only; `struct_size` first.
unsafe impl Versioned for vkgdr_share_stats {
    const NAME: &'static str = "vkgdr_share_stats";
}

/// Live `vkgdr_share_server_t` handles.
static SERVERS: LazyLock<HandleTable<ShareServer>> =
    LazyLock::new(|| HandleTable::new(Tag::ShareServer));

/// # Safety
/// - No thread destroys `s` while the reference is in use.
unsafe fn server<'a>(s: vkgdr_share_server_t) -> CResult<&'a ShareServer> {
    // SAFETY: forwarded to our caller.
    unsafe { lookup(&SERVERS, s) }
}

/// A NUL-terminated C string argument (`what` names it in errors).
///
/// # Safety
/// - `p` is NULL or a NUL-terminated string that lives and stays unchanged during the borrow.
pub(crate) unsafe fn c_str<'a>(p: *const c_char, what: &str) -> CResult<&'a CStr> {
    if p.is_null() {
        return Err(Failure::Api(format!("the {what} pointer is NULL")));
    }
    // SAFETY: non-null and NUL-terminated (caller).
    Ok(unsafe { CStr::from_ptr(p) })
}

/// A region name argument: NUL-terminated UTF-8 (the library checks the rest: 1 to 64 bytes,
/// no control characters).
///
/// # Safety
/// - As for [`c_str`].
pub(crate) unsafe fn region_name<'a>(p: *const c_char) -> CResult<&'a str> {
    // SAFETY: forwarded to our caller.
    let s = unsafe { c_str(p, "name") }?;
    s.to_str()
        .map_err(|_| Failure::Api(format!("the name {s:?} is not UTF-8")))
}

/// A socket path argument (any bytes but NUL).
///
/// # Safety
/// - As for [`c_str`].
pub(crate) unsafe fn socket_path<'a>(p: *const c_char) -> CResult<&'a Path> {
    // SAFETY: forwarded to our caller.
    let s = unsafe { c_str(p, "path") }?;
    Ok(Path::new(std::ffi::OsStr::from_bytes(s.to_bytes())))
}

/// Writes NULL to the out-pointer `out` (named `what` in the error when it is NULL itself).
///
/// # Safety
/// - `out` is NULL or writable.
pub(crate) unsafe fn clear_out<T>(out: *mut *mut T, what: &str) -> CResult<()> {
    if out.is_null() {
        return Err(Failure::Api(format!("the {what} pointer is NULL")));
    }
    // SAFETY: writable (caller).
    unsafe { out.write(std::ptr::null_mut()) };
    Ok(())
}

/// Fills `*options` with the defaults (same-user peers, socket mode 0600, blocks given back to
/// the owner) and sets `options->struct_size` to `struct_size`, which must be
/// `sizeof(vkgdr_share_options)` as the caller sees it (only that many bytes are written).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` if `options` is NULL or `struct_size` too small.
///
/// Thread safety: any thread.
///
/// # Safety
/// - `options` is NULL or writable for `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_share_options_init(
    options: *mut vkgdr_share_options,
    struct_size: usize,
) -> c_int {
    guard("vkgdr_share_options_init", VKGDR_ERROR, || {
        if options.is_null() {
            return Err(Failure::Api(
                "the vkgdr_share_options pointer is NULL".into(),
            ));
        }
        if struct_size < std::mem::size_of::<usize>() {
            return Err(Failure::Api(format!(
                "struct_size {struct_size} is too small"
            )));
        }
        // SAFETY: writable for `struct_size` bytes (caller), of which the first hold the size.
        unsafe { options.cast::<usize>().write_unaligned(struct_size) };
        // SAFETY: as above; `write` copies at most `struct_size` bytes.
        unsafe { versioned::write(options, &vkgdr_share_options::defaults()) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Starts sharing with other processes of this host: listens on a Unix socket at `path` (a
/// file there from an earlier server that is gone is replaced; a live server's is an error)
/// for peers (`vkgdr_peer_connect`, from any process: no CUDA needed there) that map memory of
/// `g`'s GPU. Two threads of the library serve them: one answers peers, one passes the records
/// of remote ring producers on (after checking every tail).
///
/// - `g`: a `vkgdr_open` handle, or a `vkgdr_open_vulkan` one (an owner without CUDA: it shares
///   `vkgdr_memory_alloc_shareable` memory and pools of that handle). What is shared must be
///   memory of this device.
/// - `path`: the socket's path (at most 107 bytes, as Unix sockets go).
/// - `options`: NULL for the defaults, or options from `vkgdr_share_options_init`.
/// - `out`: where to store the handle (NULL unless `VKGDR_SUCCESS`).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle or option, a NULL pointer, the
/// socket's failure, e.g. `bind failed (EADDRINUSE)`).
///
/// Thread safety: any thread; every `vkgdr_share_*` call on the server may come from any thread,
/// concurrently. Free it with `vkgdr_share_server_destroy`.
///
/// # Safety
/// - `path` is a NUL-terminated string; `options` is NULL or readable for
///   `options->struct_size` bytes (and its `uids` as it says); `out` is writable.
/// - No thread closes `g` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_share_server_create(
    g: vkgdr_t,
    path: *const c_char,
    options: *const vkgdr_share_options,
    out: *mut vkgdr_share_server_t,
) -> c_int {
    guard("vkgdr_share_server_create", VKGDR_ERROR, || {
        // SAFETY: writable (caller).
        unsafe { clear_out(out, "server") }?;
        let o = if options.is_null() {
            vkgdr_share_options::defaults()
        } else {
            // SAFETY: readable for its struct_size (caller).
            unsafe { versioned::read(options, vkgdr_share_options::defaults()) }?
        };
        // SAFETY: `uids` readable as the options say (caller).
        let options = unsafe { o.to_options() }?;
        // SAFETY: a NUL-terminated string (caller).
        let path = unsafe { socket_path(path) }?;
        // SAFETY: the caller does not close `g` during the call.
        let vulkan = match unsafe { device(g) }? {
            Device::Cuda(gpu) => gpu.vulkan().clone(),
            Device::Vulkan(vulkan) => vulkan.clone(),
        };
        let server = ShareServer::bind(path, &vulkan, options)?;
        let h = register(&SERVERS, server)?;
        // SAFETY: writable (caller).
        unsafe { out.write(h) };
        Ok(VKGDR_SUCCESS)
    })
}

/// Stops sharing: disconnects every peer, gives every lent ring lane back to its ring, frees
/// the blocks peers held or gave back and no one took (their pools stay), removes the socket
/// file. Memory a peer mapped stays mapped in that peer (and so allocated) until it detaches or
/// exits. Waits for the server's two threads to end (a few milliseconds). `NULL` is ignored.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already destroyed or not a
/// `vkgdr_share_server_t`.
///
/// Thread safety: any thread, but not while another thread is using the same server.
///
/// # Safety
/// - No other thread uses `server` during or after the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_share_server_destroy(server: vkgdr_share_server_t) {
    guard("vkgdr_share_server_destroy", (), || {
        release(&SERVERS, server)
    })
}

/// Shares `mem` under `name` (1 to 64 bytes of UTF-8, no control characters): a peer that
/// attaches it (`vkgdr_peer_attach_memory`) maps all of it and writes it with CPU stores. The
/// server keeps an fd of the memory, so its bytes stay allocated while they are shared (and
/// while a peer maps them), even after `vkgdr_memory_free`.
///
/// - `mem`: memory from `vkgdr_memory_alloc_shareable` on this server's device
///   (`vkgdr_memory_alloc`'s small allocations are carved out of memory other allocations
///   share, and are refused).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a bad or taken name, carved
/// memory, the driver's failure to export it).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `name` is a NUL-terminated string.
/// - No thread destroys `server` or frees `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_share_memory(
    server: vkgdr_share_server_t,
    name: *const c_char,
    mem: vkgdr_memory_t,
) -> c_int {
    guard("vkgdr_share_memory", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `server` during the call.
        let s = unsafe { self::server(server) }?;
        // SAFETY: a NUL-terminated string (caller).
        let name = unsafe { region_name(name) }?;
        // SAFETY: the caller does not free `mem` during the call.
        match unsafe { memory(mem) }? {
            Memory::Cuda(m) => s.share_memory(name, m).map_err(|e| match e {
                vkgdr::Error::Unsupported(_) => Failure::Api(
                    "this memory is carved out of memory other allocations share (as \
                     vkgdr_memory_alloc's small allocations are): allocate memory to share with \
                     vkgdr_memory_alloc_shareable"
                        .into(),
                ),
                e => e.into(),
            })?,
            Memory::Vulkan { memory, .. } => s.share_vulkan_memory(name, memory)?,
        }
        Ok(VKGDR_SUCCESS)
    })
}

/// Shares `pool` under `name`: a peer that attaches it (`vkgdr_peer_attach_pool`) receives
/// blocks, sent by the owner (`vkgdr_share_send_block`) or asked for by the peer
/// (`vkgdr_attached_pool_request`, up to `quota` bytes held at once). A peer maps every chunk it
/// receives a block of whole, so it can reach the other blocks of those chunks: share a pool of
/// its own, holding only what peers may see.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a bad or taken name).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `name` is a NUL-terminated string.
/// - No thread destroys `server` or `pool` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_share_pool(
    server: vkgdr_share_server_t,
    name: *const c_char,
    pool: vkgdr_pool_t,
    quota: u64,
) -> c_int {
    guard("vkgdr_share_pool", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `server` during the call.
        let s = unsafe { self::server(server) }?;
        // SAFETY: a NUL-terminated string (caller).
        let name = unsafe { region_name(name) }?;
        // SAFETY: the caller does not destroy `pool` during the call.
        let p = unsafe { crate::pool::pool(pool) }?;
        s.share_pool(name, p, quota)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Shares the lanes of `ring` under `name`: each attachment (`vkgdr_peer_attach_lane`) borrows
/// one free lane (the first that no producer owns and no peer has) and becomes its producer;
/// its records go straight into the lane's GPU memory, and the server checks each tail it
/// publishes before passing it on to the ring's consumer. When every lane is taken, a peer's
/// attach is refused (busy). A lane comes back when its peer detaches, dies or is revoked, and
/// its next producer starts where the last accepted record ends.
///
/// - `ring`: made with `VKGDR_RING_SHAREABLE_BIT` (`vkgdr_ring_create` or the options'
///   `flags`).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a ring made without
/// `VKGDR_RING_SHAREABLE_BIT`, a bad or taken name).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `name` is a NUL-terminated string.
/// - No thread destroys `server` or `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_share_ring(
    server: vkgdr_share_server_t,
    name: *const c_char,
    ring: vkgdr_ring_t,
) -> c_int {
    guard("vkgdr_share_ring", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `server` during the call.
        let s = unsafe { self::server(server) }?;
        // SAFETY: a NUL-terminated string (caller).
        let name = unsafe { region_name(name) }?;
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { crate::ring::ring(ring) }?;
        if !r.is_shareable() {
            return Err(Failure::Api(
                "the ring was not made with VKGDR_RING_SHAREABLE_BIT: its lanes share one \
                 allocation, so none can be lent"
                    .into(),
            ));
        }
        s.share_ring(name, r)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Stops sharing `name`: no new attachment; existing ones stay until detached, revoked or gone.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, nothing shared under `name`).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `name` is a NUL-terminated string.
/// - No thread destroys `server` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_share_unshare(
    server: vkgdr_share_server_t,
    name: *const c_char,
) -> c_int {
    guard("vkgdr_share_unshare", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `server` during the call.
        let s = unsafe { self::server(server) }?;
        // SAFETY: a NUL-terminated string (caller).
        let name = unsafe { region_name(name) }?;
        if !s.unshare(name) {
            return Err(Failure::Api(format!("nothing is shared as {name:?}")));
        }
        Ok(VKGDR_SUCCESS)
    })
}

/// Sends a block to `peer`, which attached the pool shared as `name`, and takes the block
/// handle: the peer receives it (`vkgdr_attached_pool_next_block`), writes and reads it, and
/// gives it back; the server keeps the block allocated until then (or until the peer is gone),
/// and with `return_blocks` (the default) it comes back to the owner
/// (`VKGDR_SHARE_EVENT_RELEASED`, then `vkgdr_share_take_returned` with the token) with what
/// the peer wrote.
///
/// - `peer`: the peer's number (`vkgdr_share_event.peer` of its `VKGDR_SHARE_EVENT_CONNECTED`
///   or `_ATTACHED`).
/// - `block`: a block of the shared pool.
/// - `token`: NULL, or where to store the block's token.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR`. The block handle is gone after the call, unless
/// the call failed on an invalid or NULL argument (an invalid server or block handle, a NULL or
/// non-UTF-8 name): then nothing happened and the block is still the caller's. Once the
/// server tried to send it (no such peer, a peer that did not attach the pool, a peer that does
/// not read its messages, which is then disconnected), a failure frees the block back to its
/// pool.
///
/// Thread safety: any thread, but not while another thread is using the same block.
///
/// # Safety
/// - `name` is a NUL-terminated string; `token` is NULL or writable.
/// - No thread destroys `server` during the call; no other thread uses `block` during or after
///   it.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_share_send_block(
    server: vkgdr_share_server_t,
    peer: u64,
    name: *const c_char,
    block: vkgdr_block_t,
    token: *mut u64,
) -> c_int {
    guard("vkgdr_share_send_block", VKGDR_ERROR, || {
        // Everything that leaves the block with the caller is checked before it is taken.
        // SAFETY: the caller does not destroy `server` during the call.
        let s = unsafe { self::server(server) }?;
        // SAFETY: a NUL-terminated string (caller).
        let name = unsafe { region_name(name) }?;
        let b = BLOCKS
            .remove(block.token())
            .map_err(|why| Failure::handle(Tag::Block, why))?;
        let t = s.send_block(peer, name, b).map_err(|e| {
            Failure::Api(format!(
                "the block went back to its pool, unsent: {}",
                vkgdr::compat::message(&e)
            ))
        })?;
        // SAFETY: `token` is NULL or writable (caller).
        unsafe { write_optional(token, t) };
        Ok(VKGDR_SUCCESS)
    })
}

/// Takes the block `token` that a peer gave back (`VKGDR_SHARE_EVENT_RELEASED`), with what the
/// peer wrote into it, as a new block handle of its pool: read it, send it again, free it.
/// Blocks given back wait in the server until taken or the server is destroyed.
///
/// - `out`: where to store the block handle (NULL unless `VKGDR_SUCCESS`).
///
/// Returns `VKGDR_SUCCESS`; `VKGDR_SHARE_NONE` when no block was given back under `token` (not
/// yet, taken already, revoked, or the server runs with `return_blocks` 0); or `VKGDR_ERROR` (an
/// invalid handle, `out` NULL).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `out` is writable.
/// - No thread destroys `server` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_share_take_returned(
    server: vkgdr_share_server_t,
    token: u64,
    out: *mut vkgdr_block_t,
) -> c_int {
    guard("vkgdr_share_take_returned", VKGDR_ERROR, || {
        // SAFETY: writable (caller).
        unsafe { clear_out(out, "block") }?;
        // SAFETY: the caller does not destroy `server` during the call.
        let s = unsafe { self::server(server) }?;
        let Some(b) = s.take_returned(token) else {
            return Ok(VKGDR_SHARE_NONE);
        };
        let h = register(&BLOCKS, b)?;
        // SAFETY: writable (caller).
        unsafe { out.write(h) };
        Ok(VKGDR_SUCCESS)
    })
}

/// Revokes everything `peer` holds and disconnects it: its ring lanes stop at once (nothing it
/// publishes from now on reaches a consumer), its writes through the handles of its attached
/// memory and blocks are refused once it has read the revocation (`vkgdr_peer_poll`, or any
/// call that waits for the owner). Its blocks and lanes go back when the peer has exited or
/// closed its end (its mappings live until then, so nothing it may still write lands in memory
/// handed to someone else).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, no such peer).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `server` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_share_revoke(server: vkgdr_share_server_t, peer: u64) -> c_int {
    guard("vkgdr_share_revoke", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `server` during the call.
        unsafe { self::server(server) }?.revoke(peer)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Takes one block back from `peer`: the peer is told, and its writes through that block are
/// refused once it has read that (`vkgdr_peer_poll`); the block is freed to its pool once the
/// peer gives it back or is gone, never before. A revoked block does not come back to the
/// owner (`vkgdr_share_take_returned`).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, no such peer, a token the peer
/// does not hold).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `server` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_share_revoke_block(
    server: vkgdr_share_server_t,
    peer: u64,
    token: u64,
) -> c_int {
    guard("vkgdr_share_revoke_block", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `server` during the call.
        unsafe { self::server(server) }?.revoke_block(peer, token)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// The server's next event, in order: peers connecting, attaching, giving blocks back,
/// detaching, misbehaving, going. The server keeps the last 4096 events unread; older ones
/// are dropped.
///
/// - `timeout_ns`: how long to wait for one: 0 only looks, negative waits until one comes.
/// - `event`: filled (as far as its `struct_size` reaches) when one came.
///
/// Returns `VKGDR_SUCCESS` with `*event` filled; `VKGDR_SHARE_NONE` if none came in time
/// (`*event` untouched); or `VKGDR_ERROR` (an invalid handle, `event` NULL or its
/// `struct_size` unset).
///
/// Thread safety: any thread; each event goes to one caller.
///
/// # Safety
/// - `event` is NULL or writable for `event->struct_size` bytes.
/// - No thread destroys `server` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_share_next_event(
    server: vkgdr_share_server_t,
    timeout_ns: i64,
    event: *mut vkgdr_share_event,
) -> c_int {
    guard("vkgdr_share_next_event", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `server` during the call.
        let s = unsafe { self::server(server) }?;
        // Checked before waiting: an event taken for a struct it cannot be written to is lost.
        // SAFETY: readable for its struct_size (caller).
        unsafe { versioned::check(event) }?;
        let e = match timeout(timeout_ns) {
            Some(t) => s.next_event(t),
            None => loop {
                if let Some(e) = s.next_event(Duration::from_secs(1)) {
                    break Some(e);
                }
            },
        };
        let Some(e) = e else {
            return Ok(VKGDR_SHARE_NONE);
        };
        // SAFETY: writable for its struct_size (caller).
        unsafe { versioned::write(event, &vkgdr_share_event::from_event(e)) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Fills `*stats` (whose `struct_size` the caller sets) with the server's counters.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `stats` NULL or its
/// `struct_size` unset).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `stats` is NULL or writable for `stats->struct_size` bytes.
/// - No thread destroys `server` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_share_get_stats(
    server: vkgdr_share_server_t,
    stats: *mut vkgdr_share_stats,
) -> c_int {
    guard("vkgdr_share_get_stats", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `server` during the call.
        let s = unsafe { self::server(server) }?.stats();
        let out = vkgdr_share_stats {
            struct_size: std::mem::size_of::<vkgdr_share_stats>(),
            connected: s.connected,
            refused: s.refused,
            gone: s.gone,
            misbehaved: s.misbehaved,
            lane_faults: s.lane_faults,
            peers: s.peers as u64,
        };
        // SAFETY: writable for its struct_size (caller).
        unsafe { versioned::write(stats, &out) }?;
        Ok(VKGDR_SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_text_is_cut_at_a_character_and_terminated() {
        let mut buf = [1 as c_char; 8];
        copy_text(&mut buf, "abc");
        assert_eq!(
            &buf[..4],
            &[b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]
        );
        // "ab" + a 3-byte character + "x": 6 bytes; 7 fit; the character is kept whole.
        copy_text(&mut buf, "ab\u{20ac}xyz");
        assert_eq!(buf[5] as u8, b'x');
        assert_eq!(buf[7], 0);
        copy_text(&mut buf, "abcdef\u{20ac}");
        assert_eq!(buf[6], 0, "a character that does not fit is left out");
        let e = vkgdr_share_event::from_event(ShareEvent::Attached {
            peer: 3,
            region: "params".into(),
            attachment: 9,
        });
        assert_eq!(
            e.kind,
            vkgdr_share_event_kind::VKGDR_SHARE_EVENT_ATTACHED as u32
        );
        assert_eq!((e.peer, e.attachment, e.text_len), (3, 9, 6));
        // SAFETY: NUL-terminated by copy_text.
        let text = unsafe { CStr::from_ptr(e.text.as_ptr()) };
        assert_eq!(text.to_str(), Ok("params"));
    }

    #[test]
    fn options_are_checked_before_anything_is_bound() {
        let mut o = vkgdr_share_options::defaults();
        assert_eq!(o.socket_mode, 0o600);
        // SAFETY: no uids are read with these policies.
        unsafe {
            assert!(o.to_options().is_ok());
            o.flags = 1;
            assert!(o.to_options().is_err());
            o.flags = 0;
            o.socket_mode = 0o1777;
            assert!(o.to_options().is_err());
            o.socket_mode = 0o660;
            o.peers = 2;
            assert!(o.to_options().is_err(), "UIDS without uids");
            o.peers = 3;
            assert!(o.to_options().is_err());
        }
        let uids = [1000u32, 1001];
        o.peers = 2;
        o.uids = uids.as_ptr();
        o.uid_count = 2;
        // SAFETY: `uids` is readable for 2 values.
        let options = unsafe { o.to_options() }.unwrap();
        assert_eq!(options.peers, PeerPolicy::Uids(vec![1000, 1001]));
        assert_eq!(options.socket_mode, 0o660);
    }
}
