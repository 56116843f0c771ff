//! The pure half of sharing memory, pools and ring lanes with other processes: the messages the
//! owner and its peers exchange over a Unix socket ([`wire`]), the rule by which the owner accepts
//! a remote producer's tail ([`lane`]), and what either side refuses ([`ShareError`]).
//!
//! Everything a peer sends is hostile input: [`wire::decode`] checks every length, count and
//! field before anything is built from it, and [`lane::check_advance`] decides whether a tail a
//! remote producer published may be passed on to the consumer. Neither touches a socket, an fd
//! or a driver, so proptest and the fuzzer (`fuzz/fuzz_targets/share_wire.rs`) run them anywhere.
//! The sockets, fds and mappings are the `share` layer's (`vkgdr::share`).
#![forbid(unsafe_code)]

mod error;
pub mod lane;
pub mod wire;

pub use error::{RefusalCode, ShareError};
