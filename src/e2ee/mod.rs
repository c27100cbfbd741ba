//! End-to-end encryption of relay channels (seed 004, "End-to-end
//! encryption": Keys, Noise parameters, Handshake, Sealed records; issue 13):
//! the protocol core only, with no I/O (DESIGN.md, "Protocol cores do no
//! I/O"). The uplink (the node's side) and a client call it with the bytes
//! of a frame's `body` and send what it returns.
//!
//! - [`keys`]: Curve25519 static keys, their base64 form, the low-order check.
//! - [`identity`]: the node's key in its state directory, the one function
//!   here that touches files.
//! - [`handshake`]: Noise IK, [`Initiator`] (the client) and [`respond`]
//!   (the node), with the seed's refusals through [`Admission`].
//! - [`records`]: [`Channel`], sealing and opening bodies as records.
//! - [`base64`]: the standard base64 of bodies and keys.
//!
//! A channel's life on the node: a frame `e2e.handshake` on an unknown
//! `chan_id` → [`respond`] → message 2 in the same frame shape, or nothing
//! at all on any error; then each request's body → [`Channel::open_body`]
//! (dropped without a reply on error, and the channel closed when
//! [`OpenError::closes_channel`]) and each reply or notification →
//! [`Channel::seal_body`], in wire order. Mode mismatch (seed 004: "A node
//! in E2EE mode drops frames for an unknown chan_id that are not
//! e2e.handshake"; "A node in plaintext mode also accepts e2e.handshake")
//! is the uplink's to apply, since it routes frames to channels.

pub mod base64;
pub mod handshake;
pub mod identity;
pub mod keys;
pub mod records;

pub use handshake::{Accepted, Admission, HandshakeError, Initiator, Refusal, respond};
pub use keys::{PublicKey, StaticKey};
pub use records::{Channel, OpenError, SealError};
