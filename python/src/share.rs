//! `ShareServer` and `ShareEvent`: the owner's side of sharing memory, pool blocks and ring lanes
//! with other processes ([`vkgdr::share::ShareServer`]); the peer's side is in [`crate::peer`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use vkgdr::share::{PeerPolicy, ShareOptions};
use vkgdr::vulkan::VulkanContext;

use crate::compat::RawMemory;
use crate::device::gpu_of;
use crate::errors::{invalid_argument, to_py, vkgdr_error};
use crate::fork::Home;
use crate::identity::Identity;
use crate::interface::type_name;
use crate::pool::{Block, Pool};
use crate::ring::DeviceRing;
use crate::vulkan::{CheckingRing, VulkanDevice, VulkanMemory};

/// How long one GIL-free wait lasts before Python signals are checked.
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// The deadline of a ``timeout`` argument in seconds (None: no limit).
pub(crate) fn deadline(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => {
            Ok(Some(Instant::now() + Duration::from_secs_f64(t.min(1e9))))
        }
        Some(t) => Err(invalid_argument(format!("timeout {t} is not >= 0"))),
    }
}

/// How long the next GIL-free wait may last: a slice, or what is left before `deadline` (zero
/// once it has passed, so that a last try still runs).
pub(crate) fn slice(deadline: Option<Instant>) -> Duration {
    match deadline {
        None => WAIT_SLICE,
        Some(d) => d.saturating_duration_since(Instant::now()).min(WAIT_SLICE),
    }
}

/// Whether `deadline` has passed.
pub(crate) fn passed(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// The Vulkan device and (for a `Vkgdr`) the GPU handle behind a server's `owner` argument.
fn owner_device(owner: &Bound<'_, PyAny>) -> PyResult<(Arc<VulkanContext>, Option<vkgdr::Gpu>)> {
    if let Ok(device) = owner.cast::<VulkanDevice>() {
        return Ok((Arc::clone(device.get().context()?), None));
    }
    match gpu_of(owner) {
        Ok(gpu) => Ok((Arc::clone(gpu.vulkan()), Some(gpu))),
        Err(e) if e.is_instance_of::<PyTypeError>(owner.py()) => {
            let text = e.value(owner.py()).to_string();
            if text.starts_with("the owner must be a vkgdr.Vkgdr, not") {
                Err(PyTypeError::new_err(format!(
                    "the owner must be a vkgdr.Vkgdr or a vkgdr.VulkanDevice, not {}",
                    type_name(owner)
                )))
            } else {
                Err(e)
            }
        }
        Err(e) => Err(e),
    }
}

/// The `peers` argument: ``"same-user"``, ``"any"`` or an iterable of uids.
fn policy(peers: &Bound<'_, PyAny>) -> PyResult<PeerPolicy> {
    if let Ok(s) = peers.extract::<String>() {
        return match s.as_str() {
            "same-user" => Ok(PeerPolicy::SameUser),
            "any" => Ok(PeerPolicy::AnyUser),
            other => Err(invalid_argument(format!(
                "peers={other:?}: say \"same-user\", \"any\" or give a list of uids"
            ))),
        };
    }
    let items = peers.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "peers takes \"same-user\", \"any\" or an iterable of uids, not {}",
            type_name(peers)
        ))
    })?;
    let mut uids = Vec::new();
    for item in items {
        let item = item?;
        let uid = item.extract::<u32>().map_err(|_| {
            invalid_argument(format!(
                "peers: {} is not a uid",
                item.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        })?;
        uids.push(uid);
    }
    Ok(PeerPolicy::Uids(uids))
}

/// Something that happened between the owner and its peers (``ShareServer.next_event``).
///
/// ``kind`` says what, and which of the other attributes are set (None otherwise):
///
/// - ``"connected"``: a peer was let in (``peer``, ``pid``, ``uid``);
/// - ``"refused"``: a process was turned away by the server's ``peers`` policy (``pid``,
///   ``uid``, ``why``);
/// - ``"attached"``: a peer attached a region (``peer``, ``region``, ``attachment``);
/// - ``"request_refused"``: a peer's request was refused (``peer``, ``why``);
/// - ``"detached"``: a peer detached an attachment (``peer``, ``attachment``);
/// - ``"released"``: a peer gave a block back (``peer``, ``token``: ``take_returned(token)``);
/// - ``"lane_fault"``: a remote producer published a tail the owner refused; its lane is out of
///   service until it detaches or dies (``peer``, ``lane``, ``why``);
/// - ``"misbehaved"``: a peer broke the protocol and was disconnected (``peer``, ``why``);
/// - ``"gone"``: a peer hung up, died or was disconnected; everything it held went back
///   (``peer``, ``pid``).
#[pyclass(module = "vkgdr", name = "ShareEvent", frozen, get_all)]
pub struct ShareEvent {
    /// What happened (see the class docs).
    kind: &'static str,
    /// The peer's number (``ShareServer.peers()``, ``send_block``, ``revoke``).
    peer: Option<u64>,
    /// The process.
    pid: Option<i32>,
    /// Its user.
    uid: Option<u32>,
    /// The region's name.
    region: Option<String>,
    /// The attachment's number.
    attachment: Option<u32>,
    /// The block's token.
    token: Option<u64>,
    /// The ring lane.
    lane: Option<u32>,
    /// Why, in words.
    why: Option<String>,
}

impl ShareEvent {
    fn of(e: vkgdr::share::ShareEvent) -> ShareEvent {
        use vkgdr::share::ShareEvent as E;
        let mut made = ShareEvent {
            kind: "other",
            peer: None,
            pid: None,
            uid: None,
            region: None,
            attachment: None,
            token: None,
            lane: None,
            why: None,
        };
        match e {
            E::Connected { peer, pid, uid } => {
                made.kind = "connected";
                (made.peer, made.pid, made.uid) = (Some(peer), Some(pid), Some(uid));
            }
            E::Refused { pid, uid, why } => {
                made.kind = "refused";
                (made.pid, made.uid, made.why) = (Some(pid), Some(uid), Some(why));
            }
            E::Attached {
                peer,
                region,
                attachment,
            } => {
                made.kind = "attached";
                (made.peer, made.region, made.attachment) =
                    (Some(peer), Some(region), Some(attachment));
            }
            E::RequestRefused { peer, why } => {
                made.kind = "request_refused";
                (made.peer, made.why) = (Some(peer), Some(why));
            }
            E::Detached { peer, attachment } => {
                made.kind = "detached";
                (made.peer, made.attachment) = (Some(peer), Some(attachment));
            }
            E::Released { peer, token } => {
                made.kind = "released";
                (made.peer, made.token) = (Some(peer), Some(token));
            }
            E::LaneFault { peer, lane, error } => {
                made.kind = "lane_fault";
                (made.peer, made.lane, made.why) = (Some(peer), Some(lane), Some(error));
            }
            E::Misbehaved { peer, error } => {
                made.kind = "misbehaved";
                (made.peer, made.why) = (Some(peer), Some(error));
            }
            E::Gone { peer, pid } => {
                made.kind = "gone";
                (made.peer, made.pid) = (Some(peer), Some(pid));
            }
            // An event of a later library version: named by its words.
            other => made.why = Some(format!("{other:?}")),
        }
        made
    }
}

#[pymethods]
impl ShareEvent {
    fn __repr__(&self) -> String {
        let mut parts = vec![self.kind.to_string()];
        let mut field = |name: &str, value: Option<String>| {
            if let Some(v) = value {
                parts.push(format!("{name}={v}"));
            }
        };
        field("peer", self.peer.map(|v| v.to_string()));
        field("pid", self.pid.map(|v| v.to_string()));
        field("uid", self.uid.map(|v| v.to_string()));
        field("region", self.region.as_ref().map(|v| format!("{v:?}")));
        field("attachment", self.attachment.map(|v| v.to_string()));
        field("token", self.token.map(|v| v.to_string()));
        field("lane", self.lane.map(|v| v.to_string()));
        field("why", self.why.as_ref().map(|v| format!("{v:?}")));
        format!("<vkgdr.ShareEvent {}>", parts.join(" "))
    }
}

/// The owner's side of sharing: a Unix socket other processes of this host connect to
/// (``vkgdr.Peer(path)``), the memory, pools and ring lanes shared there by name, and two
/// threads of the library that serve them (one answers peers, one passes remote producers'
/// ring tails on to the consumer after checking them).
///
/// ``ShareServer(owner, path, *, peers="same-user", socket_mode=0o600, return_blocks=True)``:
/// ``owner`` is a ``vkgdr.Vkgdr`` (memory of its GPU, kernels in this process) or a
/// ``vkgdr.VulkanDevice`` (a CPU-only owner); everything shared must live on that device.
/// ``path`` is the socket file (replaced if a dead one is there, removed on ``close()``), made
/// with ``socket_mode``. ``peers`` says who may attach: processes of this user (checked with
/// ``SO_PEERCRED``), ``"any"`` who can open the socket, or a list of uids. With
/// ``return_blocks`` a block a peer gives back comes back to the owner (``take_returned``);
/// without, it goes straight back to its pool.
///
/// A peer reaches only what it was sent: a shared allocation whole, the chunks of the pool
/// blocks it holds (whole chunks: share a pool of its own), its lane's region. The server
/// trusts nothing a peer sends; a peer that breaks the protocol is disconnected, and one that
/// dies gives back everything it held. ``revoke(peer)`` stops serving a peer at once; the
/// memory it mapped stays allocated until it has gone, so none of its late writes can land in
/// memory handed to someone else.
///
/// ``close()`` (or the end of a ``with`` block, or collection) stops the threads, disconnects
/// every peer, gives every lent lane back to its ring and removes the socket file. Waits
/// (``next_event``) release the GIL and stop at Ctrl-C.
#[pyclass(module = "vkgdr", name = "ShareServer", frozen)]
pub struct ShareServer {
    /// `None` once closed. Methods take a clone of the `Arc` and use it without the lock.
    server: Mutex<Option<Arc<vkgdr::share::ShareServer>>>,
    identity: Identity,
    gpu: Option<vkgdr::Gpu>,
    path: PathBuf,
    home: Home,
}

impl ShareServer {
    /// The running server, or why it cannot be used.
    fn server(&self) -> PyResult<Arc<vkgdr::share::ShareServer>> {
        self.home.check("ShareServer")?;
        self.server
            .lock()
            .clone()
            .ok_or_else(|| vkgdr_error("the ShareServer is closed"))
    }

    /// A Python `Block` for a block that came back from a peer.
    fn block(&self, block: vkgdr::Block) -> Block {
        let gpu = block.device_ptr().and(self.gpu.clone());
        Block::new(block, self.identity, gpu)
    }
}

impl Drop for ShareServer {
    fn drop(&mut self) {
        if !self.home.is_here() {
            // A forked child: the threads, the socket file and the peers are the parent's.
            std::mem::forget(self.server.get_mut().take());
        }
    }
}

#[pymethods]
impl ShareServer {
    #[new]
    #[pyo3(signature = (owner, path, *, peers = None, socket_mode = 0o600, return_blocks = true))]
    fn new(
        py: Python<'_>,
        owner: &Bound<'_, PyAny>,
        path: PathBuf,
        peers: Option<&Bound<'_, PyAny>>,
        socket_mode: u32,
        return_blocks: bool,
    ) -> PyResult<Self> {
        let (vulkan, gpu) = owner_device(owner)?;
        let peers = match peers {
            None => PeerPolicy::SameUser,
            Some(p) => policy(p)?,
        };
        if socket_mode > 0o777 {
            return Err(invalid_argument(format!(
                "socket_mode {socket_mode:#o} is not a file mode (0 to 0o777)"
            )));
        }
        let options = ShareOptions {
            peers,
            socket_mode,
            return_blocks,
            ..Default::default()
        };
        let server = py
            .detach(|| vkgdr::share::ShareServer::bind(&path, &vulkan, options))
            .map_err(|e| {
                crate::errors::to_py_in(e, &format!("ShareServer at {}", path.display()))
            })?;
        Ok(ShareServer {
            server: Mutex::new(Some(Arc::new(server))),
            identity: Identity::of(&vulkan),
            gpu,
            path,
            home: Home::here(),
        })
    }

    /// The socket file's path.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Whether ``close()`` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.server.lock().is_none()
    }

    /// Shares ``memory`` under ``name`` (1 to 64 bytes of UTF-8, no NUL): a peer that attaches
    /// it maps all of it. ``memory`` is a ``vkgdr.RawMemory`` made with ``shareable=True`` (an
    /// allocation of its own: a small one made without shares a granule with other
    /// allocations, and is refused) or a ``VulkanMemory``. The server keeps the memory
    /// allocated for its peers while it is shared, even if the object is freed.
    fn share_memory(&self, py: Python<'_>, name: &str, memory: &Bound<'_, PyAny>) -> PyResult<()> {
        let server = self.server()?;
        if let Ok(m) = memory.cast::<VulkanMemory>() {
            let m = m.get().memory()?;
            let m = m.lock();
            self.identity.check(Identity::of(m.context()), "memory")?;
            return py
                .detach(|| server.share_vulkan_memory(name, &m))
                .map_err(to_py);
        }
        let raw = match memory.cast::<RawMemory>() {
            Ok(r) => r.clone(),
            Err(_) => match memory
                .getattr("_impl")
                .ok()
                .map(|i| i.cast_into::<RawMemory>())
            {
                Some(Ok(r)) => r,
                _ => {
                    return Err(PyTypeError::new_err(format!(
                        "share_memory takes a vkgdr.RawMemory or a vkgdr.VulkanMemory, not {}",
                        type_name(memory)
                    )))
                }
            },
        };
        let raw = raw.try_borrow().map_err(|_| {
            vkgdr_error("the RawMemory is in use by another thread: share it after that")
        })?;
        let raw = raw.raw()?;
        self.identity
            .check(Identity::of(raw.gpu().vulkan()), "memory")?;
        match py.detach(|| server.share_memory(name, raw)) {
            Err(vkgdr::Error::Unsupported(_)) => Err(invalid_argument(
                "this RawMemory shares a granule with other small allocations, which a peer \
                 would reach too: allocate memory to share with vkgdr.RawMemory(owner, size, \
                 shareable=True)",
            )),
            other => other.map_err(to_py),
        }
    }

    /// Shares ``pool`` under ``name``: a peer that attaches it receives blocks, sent by the
    /// owner (``send_block``) or asked for by the peer (``AttachedPool.request``), up to
    /// ``quota`` bytes held at once. A peer maps every chunk it gets a block of whole, and so
    /// can reach the other blocks of those chunks: share a pool of its own, holding only what
    /// peers may see.
    fn share_pool(&self, name: &str, pool: &Bound<'_, Pool>, quota: u64) -> PyResult<()> {
        let server = self.server()?;
        let pool = pool.get();
        self.identity.check(pool.identity, "pool")?;
        server.share_pool(name, &pool.pool, quota).map_err(to_py)
    }

    /// Shares the lanes of ``ring`` under ``name``: each peer that attaches it
    /// (``AttachedLane``) borrows one free lane and becomes its producer, starting where the
    /// lane's last producer stopped. ``ring`` is a ``DeviceRing`` made with ``shareable=True``
    /// (its consumer a kernel of this process; the server keeps the ring alive until it is
    /// closed) or a ``CheckingRing``. A peer that finds every lane taken is refused
    /// (``ShareError``, reason ``"busy"``).
    fn share_ring(&self, name: &str, ring: &Bound<'_, PyAny>) -> PyResult<()> {
        let server = self.server()?;
        if let Ok(r) = ring.cast::<DeviceRing>() {
            let r = r.get();
            if !r.shareable {
                return Err(invalid_argument(
                    "only a ring made with DeviceRing(..., shareable=True) lends its lanes: its \
                     lanes are allocations of their own",
                ));
            }
            self.identity
                .check(Identity::of(r.ring.gpu().vulkan()), "ring")?;
            return server.share_ring(name, &r.ring).map_err(to_py);
        }
        if let Ok(r) = ring.cast::<CheckingRing>() {
            return server.share_lanes(name, r.get().source()?).map_err(to_py);
        }
        Err(PyTypeError::new_err(format!(
            "share_ring takes a vkgdr.DeviceRing or a vkgdr.CheckingRing, not {}",
            type_name(ring)
        )))
    }

    /// Stops sharing ``name``: no new attachment; those made stay until detached, revoked or
    /// gone. Returns whether anything was shared under it.
    fn unshare(&self, name: &str) -> PyResult<bool> {
        Ok(self.server()?.unshare(name))
    }

    /// Hands ``block`` to ``peer``, which has attached the pool shared as ``name``; returns
    /// the block's token. ``block`` should be a ``Block`` of that pool: the peer maps the chunk
    /// it lies in whole, whichever pool of the server's device it is of. The ``Block`` object
    /// is spent: its
    /// methods raise ``VkgdrError`` from then on. The server keeps the block allocated until
    /// the peer gives it back (``"released"`` event; then ``take_returned(token)``), is revoked
    /// or is gone. A block whose memory was exported (``np.asarray``, ``view()``, an array
    /// interface, DLPack) is refused (``InvalidArgumentError``): a view could go on writing
    /// memory that is the peer's; fill blocks to send with ``block.write(data)``. On any other
    /// error the block has gone back to its pool.
    fn send_block(
        &self,
        py: Python<'_>,
        peer: u64,
        name: &str,
        block: &Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        let server = self.server()?;
        let block = block.cast::<Block>().map_err(|_| {
            PyTypeError::new_err(format!(
                "send_block takes a vkgdr.Block, not {}",
                type_name(block)
            ))
        })?;
        let block = block.get();
        block.check_sendable()?;
        self.identity.check(block.identity(), "block")?;
        if !server.peers().iter().any(|p| p.id == peer) {
            return Err(crate::errors::share_error(
                format!("no peer {peer} is connected (ShareServer.peers() lists them)"),
                None,
            ));
        }
        let taken = block.take_for_send()?;
        py.detach(|| server.send_block(peer, name, taken))
            .map_err(to_py)
    }

    /// The block ``token`` that a peer gave back, with what the peer wrote into it, as a new
    /// ``Block``; None if it was not given back (or was taken already). Blocks given back wait
    /// here until taken or the server is closed.
    fn take_returned(&self, token: u64) -> PyResult<Option<Block>> {
        let server = self.server()?;
        Ok(server.take_returned(token).map(|b| self.block(b)))
    }

    /// Every block given back and not yet taken, oldest first: a list of ``(peer, token,
    /// Block)``.
    fn drain_returned<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let server = self.server()?;
        let list = PyList::empty(py);
        for (peer, token, block) in server.drain_returned() {
            list.append((peer, token, self.block(block)))?;
        }
        Ok(list)
    }

    /// Takes a block back from ``peer``: the peer is told, and its writes through the block
    /// are refused from then on; the block goes back to its pool once the peer gives it back
    /// or is gone (never before: the peer's mapping lives until then).
    fn revoke_block(&self, py: Python<'_>, peer: u64, token: u64) -> PyResult<()> {
        let server = self.server()?;
        py.detach(|| server.revoke_block(peer, token))
            .map_err(to_py)
    }

    /// Revokes everything ``peer`` holds and disconnects it: its lanes stop at once (nothing it
    /// publishes from then on reaches a consumer), its attachments are marked revoked
    /// (``is_revoked``; writes through the package's methods are refused), and what it held
    /// goes back once the process has exited or closed its end.
    fn revoke(&self, py: Python<'_>, peer: u64) -> PyResult<()> {
        let server = self.server()?;
        py.detach(|| server.revoke(peer)).map_err(to_py)
    }

    /// The next event (a ``ShareEvent``), waiting up to ``timeout`` seconds (None: without
    /// limit) without holding the GIL; None if none came. Ctrl-C interrupts the wait. Events
    /// are kept in order (the oldest dropped beyond 4096 unread).
    #[pyo3(signature = (timeout = None))]
    fn next_event(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<ShareEvent>> {
        let server = self.server()?;
        let deadline = deadline(timeout)?;
        loop {
            let wait = slice(deadline);
            if let Some(e) = py.detach(|| server.next_event(wait)) {
                return Ok(Some(ShareEvent::of(e)));
            }
            if passed(deadline) {
                return Ok(None);
            }
            py.check_signals()?;
        }
    }

    /// The peers connected now: a list of dicts with ``peer`` (its number), ``pid``, ``uid``,
    /// ``gid``, ``attachments``, ``blocks`` and ``block_bytes`` (the pool blocks it holds).
    fn peers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let server = self.server()?;
        let list = PyList::empty(py);
        for p in server.peers() {
            let d = PyDict::new(py);
            d.set_item("peer", p.id)?;
            d.set_item("pid", p.credentials.pid)?;
            d.set_item("uid", p.credentials.uid)?;
            d.set_item("gid", p.credentials.gid)?;
            d.set_item("attachments", p.attachments)?;
            d.set_item("blocks", p.blocks)?;
            d.set_item("block_bytes", p.block_bytes)?;
            list.append(d)?;
        }
        Ok(list)
    }

    /// Counters over the server's life: a dict of ``connected``, ``refused`` (by the policy),
    /// ``gone``, ``misbehaved``, ``lane_faults`` and ``peers`` (connected now).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.server()?.stats();
        let d = PyDict::new(py);
        d.set_item("connected", s.connected)?;
        d.set_item("refused", s.refused)?;
        d.set_item("gone", s.gone)?;
        d.set_item("misbehaved", s.misbehaved)?;
        d.set_item("lane_faults", s.lane_faults)?;
        d.set_item("peers", s.peers)?;
        Ok(d)
    }

    /// Stops serving: the threads stop, every peer is disconnected, every lent lane goes back
    /// to its ring, blocks not taken back go back to their pools, and the socket file is
    /// removed. Closing twice does nothing; every other method raises ``VkgdrError`` after.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.home.check("ShareServer")?;
        let server = self.server.lock().take();
        // The server's threads need no GIL to finish; a method running in another thread holds
        // its own reference, and the server stops when that call returns.
        py.detach(|| drop(server));
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = match self.server.lock().as_ref() {
            Some(s) => format!("{} peers", s.stats().peers),
            None => "closed".into(),
        };
        format!("<vkgdr.ShareServer at {} ({state})>", self.path.display())
    }
}
