//! Sharing GPU memory, pools and ring lanes with other processes of the host: the owner (the
//! process with the GPU's CUDA context and its kernels) runs a [`ShareServer`] on a Unix socket;
//! a peer ([`Peer`]) connects, attaches regions by name and writes them with plain CPU stores
//! through a Vulkan device of its own — no CUDA context, no kernel module.
//!
//! How: every region is Vulkan memory exported as an opaque fd, sent with `SCM_RIGHTS` in a
//! small versioned message ([`wire`]) and imported by the peer into a Vulkan device of the same
//! GPU (matched by UUID; the driver's UUID and the memory type must match too). A lane of a
//! ring is three fds: the lane's own data allocation, a page the producer writes its tail into,
//! and a read-only page where the owner mirrors the consumer's head; the owner's relay thread
//! checks every tail ([`lane::check_advance`]) before passing it on to the consumer.
//!
//! The trust model, in short (docs/SHARING.md has the whole of it):
//! - **Who may attach**: whoever can open the socket (its file mode, `0o600` by default) and
//!   passes the [`PeerPolicy`] (by default the owner's uid, checked with `SO_PEERCRED`).
//! - **What a peer reaches**: only memory it was sent — a region's allocation, the chunks of
//!   the pool blocks it was given (whole chunks: share a pool of its own), its lane's region.
//!   Never a ring's control words, another lane, or the owner's other memory.
//! - **What the owner trusts**: nothing. Every message is checked field by field, every
//!   number a peer sends is looked up (tokens, attachments) or checked (tails) before it is
//!   used, and a peer that breaks the protocol is disconnected.
//! - **Revocation**: the owner stops serving what it revokes at once (no new records reach the
//!   consumer, writes through revoked blocks are refused by the peer's handles); the memory
//!   stays allocated, and mapped there, until the peer detaches or dies — so nothing it may
//!   still write can land in memory handed to someone else.
//! - **Death**: a peer that hangs up or exits (its socket, or its pidfd) gives back everything
//!   it held; a producer killed in the middle of a record never makes the consumer see it (its
//!   tail was not published, or not checked), and never blocks other lanes.

mod checking;
mod event;
mod owner;
mod page;
mod peer;
mod relay;
mod sys;

pub use crate::core::share::{lane, wire, RefusalCode, ShareError};
pub use checking::CheckingLanes;
pub use event::{PeerId, ShareEvent};
pub use owner::{PeerInfo, PeerPolicy, ShareOptions, ShareServer, ShareStats};
pub use peer::{
    AttachedLane, AttachedMemory, AttachedPool, Peer, PeerSink, SharedBlock, DEFAULT_TIMEOUT,
};
pub use relay::{LaneSource, LaneTarget};
pub use relay::{ACTIVE, CONSUMER_GONE, FAULTED, REVOKED};
pub use sys::PeerCredentials;
