//! What happens between an owner and its peers ([`ShareEvent`]), and how the owner numbers its
//! peers ([`PeerId`]).

/// A connected peer's number, unique for the server's life.
pub type PeerId = u64;

/// What happened between the owner and its peers, in order ([`ShareServer::next_event`](super::ShareServer::next_event)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShareEvent {
    /// A peer connected and was let in.
    Connected {
        /// Its number.
        peer: PeerId,
        /// Its pid and uid.
        pid: i32,
        /// Its uid.
        uid: u32,
    },
    /// A process was turned away by the [`PeerPolicy`](super::PeerPolicy).
    Refused {
        /// Its pid.
        pid: i32,
        /// Its uid.
        uid: u32,
        /// The rule.
        why: String,
    },
    /// A peer attached a region.
    Attached {
        /// The peer.
        peer: PeerId,
        /// The region's name.
        region: String,
        /// The attachment's number.
        attachment: u32,
    },
    /// A peer's request was refused.
    RequestRefused {
        /// The peer.
        peer: PeerId,
        /// The owner's words.
        why: String,
    },
    /// A peer detached an attachment.
    Detached {
        /// The peer.
        peer: PeerId,
        /// The attachment.
        attachment: u32,
    },
    /// A peer gave a block back.
    Released {
        /// The peer.
        peer: PeerId,
        /// The block's token.
        token: u64,
    },
    /// A remote producer published a tail the owner refused: its lane is out of service until
    /// it detaches or dies.
    LaneFault {
        /// The peer.
        peer: PeerId,
        /// The ring lane.
        lane: u32,
        /// What was wrong.
        error: String,
    },
    /// A peer sent something the protocol does not allow, and was disconnected.
    Misbehaved {
        /// The peer.
        peer: PeerId,
        /// What it sent.
        error: String,
    },
    /// A peer is gone (hung up, died, or disconnected by the owner); everything it held went
    /// back.
    Gone {
        /// The peer.
        peer: PeerId,
        /// Its pid.
        pid: i32,
    },
}
