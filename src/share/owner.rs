//! [`ShareServer`]: the owner's side. It listens on a Unix socket, lets in the peers its
//! [`PeerPolicy`] allows, answers their requests for the regions shared by name, hands them
//! pool blocks and ring lanes, and takes everything back when they detach, die or are revoked.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};

use crate::core::share::wire::{check_name, LaneDescriptor, Message, Region, RegionDescriptor};
use crate::core::share::{RefusalCode, ShareError};
use crate::driver::vulkan::{VulkanContext, VulkanMemory};
use crate::error::{Error, Result};
use crate::mapping::memory::RawMemory;
use crate::pool::{Block, Pool};
use crate::ring::DeviceRing;

use super::event::{PeerId, ShareEvent};
use super::page::SharedPage;
use super::relay::{LaneSource, Relay, RelayLane};
use super::sys::{self, sys, Connection, PeerCredentials};

/// Who may attach.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PeerPolicy {
    /// Processes of this process's effective uid (checked with `SO_PEERCRED`).
    #[default]
    SameUser,
    /// Anyone who can open the socket: its file permissions
    /// ([`ShareOptions::socket_mode`]) are the only gate.
    AnyUser,
    /// Processes of these uids.
    Uids(Vec<u32>),
}

impl PeerPolicy {
    /// Why `cred` may not attach, or `None` if it may.
    fn refuses(&self, cred: &PeerCredentials) -> Option<String> {
        let me = rustix::process::geteuid().as_raw();
        match self {
            PeerPolicy::AnyUser => None,
            PeerPolicy::SameUser if cred.uid == me => None,
            PeerPolicy::SameUser => Some(format!("only uid {me} may attach")),
            PeerPolicy::Uids(uids) if uids.contains(&cred.uid) => None,
            PeerPolicy::Uids(uids) => Some(format!("only uids {uids:?} may attach")),
        }
    }
}

/// How a [`ShareServer`] runs.
#[derive(Debug, Clone)]
pub struct ShareOptions {
    /// Who may attach (default: processes of the same user).
    pub peers: PeerPolicy,
    /// The socket file's permissions, set before the server accepts anyone (default `0o600`).
    pub socket_mode: u32,
    /// How long the relay keeps polling without a pause after a lane's tail or head last moved
    /// (default 2 ms): while records flow, a lone record's tail is passed on within the time two
    /// cores take to hand over a cache line.
    pub relay_spin: Duration,
    /// The relay's pause between polls once nothing moved for `relay_spin` (default 20 µs).
    pub relay_idle_poll: Duration,
    /// Whether a block a peer gives back comes back to the owner ([`ShareServer::take_returned`]:
    /// a receiver fills it, the owner's kernel reads it) or goes straight back to its pool
    /// (default true).
    pub return_blocks: bool,
}

impl Default for ShareOptions {
    fn default() -> Self {
        ShareOptions {
            peers: PeerPolicy::SameUser,
            socket_mode: 0o600,
            relay_spin: Duration::from_millis(2),
            relay_idle_poll: Duration::from_micros(20),
            return_blocks: true,
        }
    }
}

/// A peer as [`ShareServer::peers`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// Its number.
    pub id: PeerId,
    /// Its process, uid and gid.
    pub credentials: PeerCredentials,
    /// Attachments it holds.
    pub attachments: usize,
    /// Pool blocks it holds.
    pub blocks: usize,
    /// Bytes of those blocks.
    pub block_bytes: u64,
}

/// Counters over the server's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShareStats {
    /// Peers let in.
    pub connected: u64,
    /// Processes turned away by the policy.
    pub refused: u64,
    /// Peers gone (hung up, died or disconnected).
    pub gone: u64,
    /// Peers disconnected for breaking the protocol.
    pub misbehaved: u64,
    /// Tails a remote producer published that the relay refused.
    pub lane_faults: u64,
    /// Peers connected now.
    pub peers: usize,
}

/// The device every region of a server lives on, as its descriptors name it.
#[derive(Debug, Clone, Copy)]
struct Identity {
    uuid: [u8; 16],
    driver_uuid: [u8; 16],
    memory_type: u32,
    atom: u64,
    non_coherent: bool,
}

enum Shared {
    Memory { fd: OwnedFd, size: u64, len: u64 },
    Pool { pool: Pool, quota: u64 },
    Lanes(Arc<dyn LaneSource>),
}

/// A block handed to a peer: kept allocated here until the peer gives it back or is gone, so
/// its bytes are never handed to anyone else while the peer may still write them.
struct Held {
    block: Block,
    revoked: bool,
}

enum Attachment {
    Memory,
    Pool {
        pool: Pool,
        quota: u64,
        held_bytes: u64,
        /// Chunk serial → (the number the peer knows it by, the exported fd kept so the
        /// chunk's memory lives while the peer may map it).
        chunks: HashMap<u64, (u32, OwnedFd)>,
        blocks: HashMap<u64, Held>,
    },
    Lane,
}

struct PeerState {
    conn: Connection,
    pidfd: Option<OwnedFd>,
    cred: PeerCredentials,
    attachments: BTreeMap<u32, (String, Attachment)>,
    /// Set by the owner's threads; the service thread disconnects it.
    doomed: bool,
}

struct State {
    regions: HashMap<String, Shared>,
    peers: BTreeMap<PeerId, PeerState>,
    next_peer: PeerId,
    next_attachment: u32,
    next_token: u64,
    stats: ShareStats,
    /// Blocks peers gave back, for the owner to take (with `return_blocks`).
    returned: BTreeMap<u64, (PeerId, Block)>,
}

/// A peer's number, its socket's fd and its pidfd's, as the service thread polls them.
type Watched = (PeerId, i32, Option<i32>);

struct Inner {
    path: PathBuf,
    listener: OwnedFd,
    wake: OwnedFd,
    identity: Identity,
    policy: PeerPolicy,
    return_blocks: bool,
    state: Mutex<State>,
    events: Mutex<VecDeque<ShareEvent>>,
    event_ready: Condvar,
    stop: AtomicBool,
    relay: Arc<Relay>,
}

/// The owner's side of sharing: a Unix socket peers connect to, the regions it shares by name,
/// and the threads that serve them (one that answers peers, one that relays ring tails).
///
/// ```no_run
/// use vkgdr::share::{ShareOptions, ShareServer};
/// # fn main() -> vkgdr::Result<()> {
/// let gpu = vkgdr::Gpu::open(0)?;
/// let server = ShareServer::bind("/tmp/frames.sock", gpu.vulkan(), ShareOptions::default())?;
/// let params = gpu.alloc_shareable(64 << 10)?;
/// server.share_memory("params", &params)?; // a peer attaches it by name and writes into it
/// # Ok(()) }
/// ```
///
/// Dropping the server stops both threads, disconnects every peer, gives every lent lane back
/// to its ring (the memory a peer mapped stays mapped there until it exits) and removes the
/// socket file.
pub struct ShareServer {
    inner: Arc<Inner>,
    service: Option<std::thread::JoinHandle<()>>,
    relay: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for ShareServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShareServer")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ShareServer {
    /// Listens at `path` (a socket file, replaced if a dead one is there) for peers that map
    /// memory of `device`'s GPU. The regions shared must live on that device.
    pub fn bind(
        path: impl AsRef<Path>,
        device: &Arc<VulkanContext>,
        options: ShareOptions,
    ) -> Result<ShareServer> {
        let path = path.as_ref().to_path_buf();
        let info = device.device_info();
        let identity = Identity {
            uuid: info.uuid,
            driver_uuid: info.driver_uuid,
            memory_type: device.memory_type().index,
            atom: device.atom_size(),
            non_coherent: device.is_non_coherent(),
        };
        let listener = sys::listen(&path, options.socket_mode)?;
        let wake = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(sys("eventfd"))?;
        let relay = Relay::new(options.relay_spin, options.relay_idle_poll);
        let inner = Arc::new(Inner {
            path,
            listener,
            wake,
            identity,
            policy: options.peers,
            return_blocks: options.return_blocks,
            state: Mutex::new(State {
                regions: HashMap::new(),
                peers: BTreeMap::new(),
                next_peer: 1,
                next_attachment: 1,
                next_token: 1,
                stats: ShareStats::default(),
                returned: BTreeMap::new(),
            }),
            events: Mutex::new(VecDeque::new()),
            event_ready: Condvar::new(),
            stop: AtomicBool::new(false),
            relay,
        });
        let spawn = |name: &str| std::thread::Builder::new().name(name.into());
        let service = {
            let inner = Arc::clone(&inner);
            spawn("vkgdr-share")
                .spawn(move || inner.serve())
                .map_err(|e| Error::System {
                    call: "pthread_create",
                    errno: e.to_string(),
                })?
        };
        let relay = {
            let inner = Arc::clone(&inner);
            spawn("vkgdr-relay").spawn(move || {
                let events = |e| inner.event(e);
                inner.relay.run(&events)
            })
        };
        let relay = match relay {
            Ok(r) => r,
            Err(e) => {
                inner.stop.store(true, Ordering::Release);
                inner.poke();
                let _ = service.join();
                return Err(Error::System {
                    call: "pthread_create",
                    errno: e.to_string(),
                });
            }
        };
        Ok(ShareServer {
            inner,
            service: Some(service),
            relay: Some(relay),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Shares `memory` (an allocation of its own: [`Gpu::alloc_shareable`](crate::Gpu::alloc_shareable))
    /// under `name`: a peer that attaches it maps all `memory.size()` bytes. The server keeps an
    /// fd of the memory, so the bytes stay allocated while it is shared, even if `memory` is
    /// dropped (the owner's mapping goes; the peers' stay).
    pub fn share_memory(&self, name: &str, memory: &RawMemory) -> Result<()> {
        let (fd, size) = memory.export_fd()?;
        self.add(
            name,
            Shared::Memory {
                fd,
                size,
                len: memory.size(),
            },
        )
    }

    /// [`share_memory`](Self::share_memory) for Vulkan-only memory (an owner without CUDA).
    pub fn share_vulkan_memory(&self, name: &str, memory: &VulkanMemory) -> Result<()> {
        let fd = memory.export_fd()?;
        self.add(
            name,
            Shared::Memory {
                fd,
                size: memory.size(),
                len: memory.size(),
            },
        )
    }

    /// Shares `pool` under `name`: a peer that attaches it receives blocks — sent by the owner
    /// ([`send_block`](Self::send_block)) or asked for by the peer, up to `quota` bytes held at
    /// once. A peer maps every chunk it receives a block of whole, so it can reach the other
    /// blocks of those chunks: share a pool of its own, holding only what peers may see.
    pub fn share_pool(&self, name: &str, pool: &Pool, quota: u64) -> Result<()> {
        self.add(
            name,
            Shared::Pool {
                pool: pool.clone(),
                quota,
            },
        )
    }

    /// Shares the lanes of `ring` (made with [`DeviceRing::new_shareable`]) under `name`: each
    /// peer that attaches it borrows one free lane and becomes its producer.
    pub fn share_ring(&self, name: &str, ring: &Arc<DeviceRing>) -> Result<()> {
        self.share_lanes(name, Arc::new(Arc::clone(ring)))
    }

    /// Shares lanes from any [`LaneSource`] under `name`.
    pub fn share_lanes(&self, name: &str, source: Arc<dyn LaneSource>) -> Result<()> {
        self.add(name, Shared::Lanes(source))
    }

    fn add(&self, name: &str, shared: Shared) -> Result<()> {
        check_name(name)?;
        let mut state = lock(&self.inner.state);
        if state.regions.contains_key(name) {
            return Err(ShareError::NameTaken(name.into()).into());
        }
        state.regions.insert(name.into(), shared);
        Ok(())
    }

    /// Stops sharing `name`: no new attachment; the existing ones stay until detached, revoked
    /// or gone. False if nothing was shared under it.
    pub fn unshare(&self, name: &str) -> bool {
        lock(&self.inner.state).regions.remove(name).is_some()
    }

    /// Hands `block` to `peer`, which attached the pool shared as `region`; the chunk's fd goes
    /// first if the peer has not received it yet. The server keeps the block allocated until
    /// the peer gives it back (then it is freed to its pool), is revoked and gives it back, or
    /// is gone. Returns the block's token.
    pub fn send_block(&self, peer: PeerId, region: &str, block: Block) -> Result<u64> {
        let inner = &self.inner;
        let mut state = lock(&inner.state);
        let token = state.next_token;
        let p = state
            .peers
            .get_mut(&peer)
            .ok_or_else(|| ShareError::Protocol(format!("no peer {peer}")))?;
        let attachment = p
            .attachments
            .iter()
            .find(|(_, (name, a))| name == region && matches!(a, Attachment::Pool { .. }))
            .map(|(id, _)| *id)
            .ok_or_else(|| {
                ShareError::Protocol(format!("peer {peer} has not attached a pool {region:?}"))
            })?;
        let sent = hand_block(p, attachment, block, token, 0, false);
        match sent {
            Ok(()) => {
                state.next_token += 1;
                Ok(token)
            }
            Err(e) => {
                // A peer that cannot take a message is disconnected.
                if let Some(p) = state.peers.get_mut(&peer) {
                    p.doomed = true;
                }
                drop(state);
                inner.poke();
                Err(e)
            }
        }
    }

    /// Takes a block back from `peer`: the peer is told, and its writes through that block are
    /// refused from then on; the block is freed once the peer gives it back or is gone (never
    /// before: the peer's mapping of the chunk stays until then).
    pub fn revoke_block(&self, peer: PeerId, token: u64) -> Result<()> {
        let mut state = lock(&self.inner.state);
        let p = state
            .peers
            .get_mut(&peer)
            .ok_or_else(|| ShareError::Protocol(format!("no peer {peer}")))?;
        for (id, (_, a)) in p.attachments.iter_mut() {
            if let Attachment::Pool { blocks, .. } = a {
                if let Some(h) = blocks.get_mut(&token) {
                    h.revoked = true;
                    let m = Message::Revoke {
                        attachment: *id,
                        token,
                    };
                    let _ = p.conn.send(&m, &[], false);
                    return Ok(());
                }
            }
        }
        Err(ShareError::Protocol(format!("peer {peer} holds no block {token}")).into())
    }

    /// Revokes everything `peer` holds and disconnects it: its lanes stop at once (nothing it
    /// publishes from now on reaches a consumer), its blocks and lanes go back once the peer
    /// process has exited or closed its end (its mappings live until then).
    pub fn revoke(&self, peer: PeerId) -> Result<()> {
        let mut state = lock(&self.inner.state);
        let p = state
            .peers
            .get_mut(&peer)
            .ok_or_else(|| ShareError::Protocol(format!("no peer {peer}")))?;
        for (id, (_, a)) in p.attachments.iter() {
            if matches!(a, Attachment::Lane) {
                self.inner.relay.revoke(peer, *id);
            }
            let m = Message::Revoke {
                attachment: *id,
                token: 0,
            };
            let _ = p.conn.send(&m, &[], false);
        }
        p.doomed = true;
        drop(state);
        self.inner.poke();
        Ok(())
    }

    /// The block `token` that a peer gave back ([`ShareEvent::Released`]), with what the peer
    /// wrote into it; `None` if it was not given back (or was taken already). Blocks given back
    /// stay here until taken, or the server is dropped.
    pub fn take_returned(&self, token: u64) -> Option<Block> {
        lock(&self.inner.state)
            .returned
            .remove(&token)
            .map(|(_, b)| b)
    }

    /// Every block given back and not yet taken, oldest token first, with the peer it came from.
    pub fn drain_returned(&self) -> Vec<(PeerId, u64, Block)> {
        let returned = std::mem::take(&mut lock(&self.inner.state).returned);
        returned.into_iter().map(|(t, (p, b))| (p, t, b)).collect()
    }

    /// The peers connected now.
    pub fn peers(&self) -> Vec<PeerInfo> {
        let state = lock(&self.inner.state);
        state
            .peers
            .iter()
            .map(|(id, p)| {
                let (mut blocks, mut block_bytes) = (0, 0);
                for (_, a) in p.attachments.values() {
                    if let Attachment::Pool {
                        blocks: b,
                        held_bytes,
                        ..
                    } = a
                    {
                        blocks += b.len();
                        block_bytes += held_bytes;
                    }
                }
                PeerInfo {
                    id: *id,
                    credentials: p.cred,
                    attachments: p.attachments.len(),
                    blocks,
                    block_bytes,
                }
            })
            .collect()
    }

    /// Counters over the server's life.
    pub fn stats(&self) -> ShareStats {
        let state = lock(&self.inner.state);
        ShareStats {
            lane_faults: self.inner.relay.faults.load(Ordering::Relaxed),
            peers: state.peers.len(),
            ..state.stats
        }
    }

    /// The next event, waiting up to `timeout` for one (`None` if none came).
    pub fn next_event(&self, timeout: Duration) -> Option<ShareEvent> {
        let events = lock(&self.inner.events);
        let (mut events, _) = self
            .inner
            .event_ready
            .wait_timeout_while(events, timeout, |e| e.is_empty())
            .unwrap_or_else(|e| e.into_inner());
        events.pop_front()
    }
}

impl Drop for ShareServer {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.relay.stop();
        self.inner.poke();
        if let Some(t) = self.service.take() {
            let _ = t.join();
        }
        if let Some(t) = self.relay.take() {
            let _ = t.join();
        }
        // Every peer goes, and with it every lent lane (given back to its ring) and held block.
        let ids: Vec<PeerId> = lock(&self.inner.state).peers.keys().copied().collect();
        for id in ids {
            self.inner.drop_peer(id);
        }
        let _ = rustix::fs::unlink(&self.inner.path);
    }
}

/// Sends `block` to the peer's pool attachment (its chunk first if the peer lacks it) and keeps
/// it. With `enforce_quota` (a block the peer asked for) the peer's quota bounds what it holds;
/// blocks the owner sends unasked are the owner's choice.
fn hand_block(
    p: &mut PeerState,
    attachment: u32,
    block: Block,
    token: u64,
    request: u64,
    enforce_quota: bool,
) -> Result<()> {
    let Some((
        _,
        Attachment::Pool {
            quota,
            held_bytes,
            chunks,
            blocks,
            ..
        },
    )) = p.attachments.get_mut(&attachment)
    else {
        return Err(ShareError::Protocol(format!("no pool attachment {attachment}")).into());
    };
    let len = block.size();
    if enforce_quota && held_bytes.saturating_add(len) > *quota {
        return Err(ShareError::Refused {
            code: RefusalCode::Quota,
            text: format!("the peer holds {held_bytes} of its {quota} bytes"),
        }
        .into());
    }
    let serial = block.chunk_serial();
    let chunk = match chunks.get(&serial) {
        Some((n, _)) => *n,
        None => {
            let (fd, size) = block.export_chunk_fd()?;
            let n = chunks.len() as u32;
            let m = Message::Chunk {
                attachment,
                chunk: n,
                size,
            };
            p.conn.send(&m, &[fd.as_fd()], false)?;
            chunks.insert(serial, (n, fd));
            n
        }
    };
    let m = Message::Block {
        request,
        attachment,
        chunk,
        offset: block.offset_in_chunk(),
        len,
        token,
    };
    p.conn.send(&m, &[], false)?;
    *held_bytes += len;
    blocks.insert(
        token,
        Held {
            block,
            revoked: false,
        },
    );
    Ok(())
}

impl Inner {
    fn event(&self, e: ShareEvent) {
        let mut events = lock(&self.events);
        // A bounded log: an owner that never reads events does not grow without end.
        if events.len() >= 4096 {
            events.pop_front();
        }
        events.push_back(e);
        self.event_ready.notify_all();
    }

    /// Wakes the service thread.
    fn poke(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// The service thread: accepts, answers, notices hang-ups and deaths.
    fn serve(&self) {
        while !self.stop.load(Ordering::Acquire) {
            // The fds are read under the lock and polled without it: only this thread closes a
            // peer's fds (the owner's threads mark a peer `doomed`), so they stay open.
            let (doomed, watched): (Vec<PeerId>, Vec<Watched>) = {
                let state = lock(&self.state);
                (
                    state
                        .peers
                        .iter()
                        .filter(|(_, p)| p.doomed)
                        .map(|(id, _)| *id)
                        .collect(),
                    state
                        .peers
                        .iter()
                        .map(|(id, p)| {
                            (
                                *id,
                                p.conn.as_fd().as_raw_fd(),
                                p.pidfd.as_ref().map(|f| f.as_raw_fd()),
                            )
                        })
                        .collect(),
                )
            };
            for id in doomed {
                self.drop_peer(id);
            }
            let mut fds = vec![
                PollFd::new(&self.listener, PollFlags::IN),
                PollFd::new(&self.wake, PollFlags::IN),
            ];
            let mut index = Vec::new();
            for (id, conn, pidfd) in &watched {
                // SAFETY: the fds belong to peers only this thread removes (see above).
                let conn = unsafe { BorrowedFd::borrow_raw(*conn) };
                fds.push(PollFd::from_borrowed_fd(conn, PollFlags::IN));
                index.push((*id, false));
                if let Some(pidfd) = pidfd {
                    // SAFETY: as above.
                    let pidfd = unsafe { BorrowedFd::borrow_raw(*pidfd) };
                    fds.push(PollFd::from_borrowed_fd(pidfd, PollFlags::IN));
                    index.push((*id, true));
                }
            }
            if sys::poll_fds(&mut fds, Some(Duration::from_millis(200))).is_err() {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            let listener_ready = !fds[0].revents().is_empty();
            if !fds[1].revents().is_empty() {
                let mut buf = [0u8; 8];
                let _ = rustix::io::read(&self.wake, &mut buf);
            }
            let ready: Vec<(PeerId, bool, PollFlags)> = fds[2..]
                .iter()
                .zip(&index)
                .filter(|(f, _)| !f.revents().is_empty())
                .map(|(f, (id, is_pidfd))| (*id, *is_pidfd, f.revents()))
                .collect();
            drop(fds);
            if listener_ready {
                self.accept_all();
            }
            for (id, is_pidfd, revents) in ready {
                if is_pidfd {
                    // The process exited: whatever its socket still holds is dropped with it.
                    self.drain(id);
                    self.drop_peer(id);
                } else if revents.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR) {
                    self.drain(id);
                }
            }
        }
    }

    fn accept_all(&self) {
        while let Ok(Some(conn)) = sys::accept(self.listener.as_fd()) {
            let cred = match conn.peer_credentials() {
                Ok(c) => c,
                Err(_) => continue,
            };
            let mut state = lock(&self.state);
            if let Some(why) = self.policy.refuses(&cred) {
                state.stats.refused += 1;
                drop(state);
                let m = Message::Refused {
                    request: 0,
                    code: RefusalCode::NotAllowed,
                    text: why.clone(),
                };
                let _ = conn.send(&m, &[], false);
                self.event(ShareEvent::Refused {
                    pid: cred.pid,
                    uid: cred.uid,
                    why,
                });
                continue;
            }
            let id = state.next_peer;
            state.next_peer += 1;
            state.stats.connected += 1;
            state.peers.insert(
                id,
                PeerState {
                    conn,
                    pidfd: sys::pidfd(cred.pid),
                    cred,
                    attachments: BTreeMap::new(),
                    doomed: false,
                },
            );
            drop(state);
            self.event(ShareEvent::Connected {
                peer: id,
                pid: cred.pid,
                uid: cred.uid,
            });
        }
    }

    /// Handles every message waiting from `id`; a hang-up or a protocol violation drops it.
    fn drain(&self, id: PeerId) {
        loop {
            let got = {
                let state = lock(&self.state);
                let Some(p) = state.peers.get(&id) else {
                    return;
                };
                p.conn.try_recv()
            };
            match got {
                Ok(None) => return,
                Ok(Some((m, fds))) => match self.handle(id, m, fds) {
                    Ok(()) => {}
                    // It asked and hung up before the answer: gone, not hostile.
                    Err(Error::Share(ShareError::Disconnected)) => {
                        self.drop_peer(id);
                        return;
                    }
                    Err(e) => {
                        self.misbehaved(id, e);
                        return;
                    }
                },
                Err(Error::Share(ShareError::Disconnected)) => {
                    self.drop_peer(id);
                    return;
                }
                Err(e) => {
                    self.misbehaved(id, e);
                    return;
                }
            }
        }
    }

    fn misbehaved(&self, id: PeerId, e: Error) {
        lock(&self.state).stats.misbehaved += 1;
        self.event(ShareEvent::Misbehaved {
            peer: id,
            error: e.to_string(),
        });
        self.drop_peer(id);
    }

    /// One message from a peer. An error is the peer's fault and disconnects it.
    fn handle(&self, id: PeerId, m: Message, fds: Vec<OwnedFd>) -> Result<()> {
        drop(fds); // no peer message carries fds (decode checked the count)
        match m {
            Message::Attach { request, name } => self.attach(id, request, &name),
            Message::Request {
                request,
                attachment,
                size,
                align,
            } => self.request(id, request, attachment, size, align),
            Message::Release { attachment, token } => {
                let mut state = lock(&self.state);
                let p = state.peers.get_mut(&id).ok_or(ShareError::Disconnected)?;
                if let Some((
                    _,
                    Attachment::Pool {
                        blocks, held_bytes, ..
                    },
                )) = p.attachments.get_mut(&attachment)
                {
                    if let Some(h) = blocks.remove(&token) {
                        *held_bytes -= h.block.size();
                        if self.return_blocks && !h.revoked {
                            state.returned.insert(token, (id, h.block));
                            drop(state);
                        } else {
                            drop(state);
                            // Back to its pool (outside the lock: a free may take the pool's).
                            drop(h.block);
                        }
                        self.event(ShareEvent::Released { peer: id, token });
                        return Ok(());
                    }
                }
                Err(ShareError::Protocol(format!(
                    "release of block {token} of attachment {attachment}, which the peer does not hold"
                ))
                .into())
            }
            Message::Detach { attachment } => {
                let removed = {
                    let mut state = lock(&self.state);
                    let p = state.peers.get_mut(&id).ok_or(ShareError::Disconnected)?;
                    p.attachments.remove(&attachment)
                };
                let Some((_, a)) = removed else {
                    return Err(ShareError::Protocol(format!(
                        "detach of attachment {attachment}, which does not exist"
                    ))
                    .into());
                };
                self.release_attachment(id, attachment, a);
                self.event(ShareEvent::Detached {
                    peer: id,
                    attachment,
                });
                Ok(())
            }
            other => Err(ShareError::Protocol(format!(
                "a peer sent {}, which only the owner sends",
                other.name()
            ))
            .into()),
        }
    }

    fn refuse(
        &self,
        p: &PeerState,
        id: PeerId,
        request: u64,
        code: RefusalCode,
        text: String,
    ) -> Result<()> {
        self.event(ShareEvent::RequestRefused {
            peer: id,
            why: format!("{code}: {text}"),
        });
        p.conn.send(
            &Message::Refused {
                request,
                code,
                text,
            },
            &[],
            false,
        )
    }

    fn attach(&self, id: PeerId, request: u64, name: &str) -> Result<()> {
        let mut state = lock(&self.state);
        let attachment = state.next_attachment;
        let st = &mut *state;
        let p = st.peers.get_mut(&id).ok_or(ShareError::Disconnected)?;
        let Some(shared) = st.regions.get(name) else {
            return self.refuse(
                p,
                id,
                request,
                RefusalCode::NoSuchRegion,
                format!("nothing is shared as {name:?}"),
            );
        };
        let ident = self.identity;
        let descriptor = |region| {
            Message::Region(RegionDescriptor {
                request,
                attachment,
                device_uuid: ident.uuid,
                driver_uuid: ident.driver_uuid,
                memory_type: ident.memory_type,
                atom: ident.atom,
                non_coherent: ident.non_coherent,
                region,
            })
        };
        let kept = match shared {
            Shared::Memory { fd, size, len } => {
                let m = descriptor(Region::Memory {
                    size: *size,
                    len: *len,
                });
                p.conn.send(&m, &[fd.as_fd()], false)?;
                Attachment::Memory
            }
            Shared::Pool { pool, quota } => {
                p.conn
                    .send(&descriptor(Region::Pool { quota: *quota }), &[], false)?;
                Attachment::Pool {
                    pool: pool.clone(),
                    quota: *quota,
                    held_bytes: 0,
                    chunks: HashMap::new(),
                    blocks: HashMap::new(),
                }
            }
            Shared::Lanes(source) => {
                let target = match source.lend() {
                    Ok(t) => t,
                    Err(e) => {
                        let code = match e {
                            Error::Ring(crate::core::ring::RingError::Claimed)
                            | Error::Ring(crate::core::ring::RingError::Busy) => RefusalCode::Busy,
                            _ => RefusalCode::Internal,
                        };
                        return self.refuse(p, id, request, code, e.to_string());
                    }
                };
                let made = (|| -> Result<_> {
                    let (data, data_size, data_offset) = target.export_data()?;
                    let producer = SharedPage::create("vkgdr-lane-producer", true)?;
                    let owner = SharedPage::create("vkgdr-lane-owner", false)?;
                    Ok((data, data_size, data_offset, producer, owner))
                })();
                let (data, data_size, data_offset, producer, owner) = match made {
                    Ok(x) => x,
                    Err(e) => {
                        return self.refuse(p, id, request, RefusalCode::Internal, e.to_string())
                    }
                };
                let start = target.start();
                let lane = RelayLane::new(id, attachment, target, producer, owner);
                let l = &lane.target;
                let m = descriptor(Region::RingLane(LaneDescriptor {
                    lane: l.lane(),
                    wrap: l.wrap(),
                    capacity: l.capacity(),
                    data_size,
                    data_offset,
                    start_pos: start.tail,
                    start_seq: start.seq,
                    head: l.head().min(start.tail),
                }));
                p.conn.send(
                    &m,
                    &[data.as_fd(), lane.producer.fd(), lane.owner.fd()],
                    false,
                )?;
                self.relay.add(lane);
                Attachment::Lane
            }
        };
        p.attachments.insert(attachment, (name.to_owned(), kept));
        st.next_attachment = st.next_attachment.wrapping_add(1).max(1);
        drop(state);
        self.event(ShareEvent::Attached {
            peer: id,
            region: name.to_owned(),
            attachment,
        });
        Ok(())
    }

    fn request(
        &self,
        id: PeerId,
        request: u64,
        attachment: u32,
        size: u64,
        align: u64,
    ) -> Result<()> {
        let mut state = lock(&self.state);
        let token = state.next_token;
        let p = state.peers.get_mut(&id).ok_or(ShareError::Disconnected)?;
        let pool = match p.attachments.get(&attachment) {
            Some((
                _,
                Attachment::Pool {
                    pool,
                    quota,
                    held_bytes,
                    ..
                },
            )) => {
                if held_bytes.saturating_add(size) > *quota {
                    let text = format!("{size} more bytes would pass the quota of {quota}");
                    return self.refuse(p, id, request, RefusalCode::Quota, text);
                }
                pool.clone()
            }
            _ => {
                let text = format!("attachment {attachment} is no pool of this peer");
                return self.refuse(p, id, request, RefusalCode::BadRequest, text);
            }
        };
        let block = match pool.alloc(size, align) {
            Ok(b) => b,
            Err(e) => {
                let code = if e.is_out_of_memory() {
                    RefusalCode::OutOfMemory
                } else {
                    RefusalCode::BadRequest
                };
                return self.refuse(p, id, request, code, e.to_string());
            }
        };
        match hand_block(p, attachment, block, token, request, true) {
            Ok(()) => {
                state.next_token += 1;
                Ok(())
            }
            // The peer is gone or not reading: its end of the protocol.
            Err(e @ Error::Share(ShareError::Disconnected)) => Err(e),
            Err(
                e @ Error::System {
                    call: "sendmsg", ..
                },
            ) => Err(e),
            // The owner's side failed (the chunk could not be exported): the peer hears why.
            Err(e) => self.refuse(p, id, request, RefusalCode::Internal, e.to_string()),
        }
    }

    /// What an attachment held goes back: a lane to its ring (after the relay's last look),
    /// blocks to their pool, chunk fds closed.
    fn release_attachment(&self, id: PeerId, attachment: u32, a: Attachment) {
        match a {
            Attachment::Lane => {
                let events = |e| self.event(e);
                drop(self.relay.remove(id, attachment, &events));
            }
            Attachment::Pool { blocks, chunks, .. } => {
                drop(blocks);
                drop(chunks);
            }
            Attachment::Memory => {}
        }
    }

    /// Disconnects `id` and takes back everything it held.
    fn drop_peer(&self, id: PeerId) {
        let Some(p) = ({
            let mut state = lock(&self.state);
            let p = state.peers.remove(&id);
            if p.is_some() {
                state.stats.gone += 1;
            }
            p
        }) else {
            return;
        };
        for (attachment, (_, a)) in p.attachments {
            self.release_attachment(id, attachment, a);
        }
        self.event(ShareEvent::Gone {
            peer: id,
            pid: p.cred.pid,
        });
    }
}
