//! The Noise IK handshake of an E2EE relay channel (seed 004, "Noise
//! parameters" and "Handshake"): `Noise_IK_25519_ChaChaPoly_BLAKE2s`, the
//! client as initiator, the prologue `argus-e2e/v1|<node_id>|<chan_id>`,
//! empty payloads, a 96-byte message 1 and a 48-byte message 2. snow runs
//! the state machine (its ring resolver for ChaCha20-Poly1305, its own
//! X25519 and BLAKE2s); what it leaves is the two split keys, from which
//! [`Channel`] seals records.
//!
//! Bytes in, bytes out: nothing here reads a socket or a clock. The caller
//! base64-decodes a frame's `body`, calls [`respond`] (node) or
//! [`Initiator::finish`] (client), and sends what comes back.
//!
//! On the node every error means the same on the wire: "The node drops the
//! frame and sends nothing" (seed 004, Handshake); a refused client sees
//! only its own timeout. The typed error is for the node's log. The seed's
//! three refusals are asked of the caller through [`Admission`]; the order
//! of the checks is cheapest first, so that a flood of message 1s on an
//! existing channel or a quarantined node costs no Diffie-Hellman:
//! 1. a channel with this `chan_id` exists ([`Refusal::ChannelExists`]):
//!    the frame never reaches Noise, and the live channel is untouched;
//! 2. the node is quarantined ([`Refusal::Quarantined`]);
//! 3. message 1 is not 96 bytes ([`HandshakeError::Length`]); with exactly
//!    96 bytes the payload is necessarily empty;
//! 4. message 1 does not authenticate: a wrong node key, another prologue
//!    (node id or channel id), an altered byte ([`HandshakeError::Rejected`]);
//! 5. the client's static key is a low-order point ([`HandshakeError::LowOrderKey`],
//!    a decision of ours: see keys.rs);
//! 6. locked mode does not authorize the client's key ([`Refusal::Unauthorized`]).
//!
//! The client refuses a node key of low order before sending anything, and
//! a message 2 that is not 48 bytes or does not authenticate.

use super::keys::{PublicKey, StaticKey};
use super::records::Channel;
use crate::limits::{E2EE_MSG1_LEN, E2EE_MSG2_LEN};
use snow::resolvers::{DefaultResolver, FallbackResolver, RingResolver};
use snow::{Builder, HandshakeState};
use std::fmt;

/// "Protocol: Noise_IK_25519_ChaChaPoly_BLAKE2s" (seed 004).
pub const NOISE_PARAMS: &str = "Noise_IK_25519_ChaChaPoly_BLAKE2s";

/// "argus-e2e/v1|<node_id>|<chan_id>": binds the session to the node and
/// to the channel id the gateway assigned.
pub fn prologue(node_id: &str, chan_id: &str) -> String {
    format!("argus-e2e/v1|{node_id}|{chan_id}")
}

/// A snow builder on ring's ChaCha20-Poly1305, with snow's own X25519 and
/// BLAKE2s for what ring lacks.
fn builder<'a>() -> Result<Builder<'a>, HandshakeError> {
    let params = NOISE_PARAMS.parse().map_err(HandshakeError::Noise)?;
    let resolver = FallbackResolver::new(Box::new(RingResolver), Box::new(DefaultResolver));
    Ok(Builder::with_resolver(params, Box::new(resolver)))
}

/// The client's half-done handshake: message 1 is out, message 2 awaited.
pub struct Initiator {
    state: HandshakeState,
    node: PublicKey,
}

impl Initiator {
    /// Message 1 to `node` (its `identity_pubkey` from the roster) on
    /// channel `chan_id` of node `node_id`, as `client`.
    pub fn start(
        client: &StaticKey,
        node: &PublicKey,
        node_id: &str,
        chan_id: &str,
    ) -> Result<(Initiator, [u8; E2EE_MSG1_LEN]), HandshakeError> {
        if node.is_low_order() {
            return Err(HandshakeError::LowOrderKey);
        }
        let prologue = prologue(node_id, chan_id);
        let mut state = builder()?
            .local_private_key(client.private_bytes())
            .and_then(|b| b.remote_public_key(node.as_bytes()))
            .and_then(|b| b.prologue(prologue.as_bytes()))
            .and_then(|b| b.build_initiator())
            .map_err(HandshakeError::Noise)?;
        let mut msg1 = [0u8; E2EE_MSG1_LEN];
        let n = state
            .write_message(&[], &mut msg1)
            .map_err(HandshakeError::Noise)?;
        if n != E2EE_MSG1_LEN {
            return Err(HandshakeError::Length {
                expected: E2EE_MSG1_LEN,
                got: n,
            });
        }
        Ok((Initiator { state, node: *node }, msg1))
    }

    /// The channel, once the node's message 2 authenticates.
    pub fn finish(mut self, msg2: &[u8]) -> Result<Channel, HandshakeError> {
        if msg2.len() != E2EE_MSG2_LEN {
            return Err(HandshakeError::Length {
                expected: E2EE_MSG2_LEN,
                got: msg2.len(),
            });
        }
        let mut payload = [0u8; E2EE_MSG2_LEN];
        self.state
            .read_message(msg2, &mut payload)
            .map_err(|_| HandshakeError::Rejected)?;
        if !self.state.is_handshake_finished() {
            return Err(HandshakeError::Rejected);
        }
        // "the initiator encrypts with the first cipher state and decrypts
        // with the second"
        let (first, second) = self.state.dangerously_get_raw_split();
        Channel::new(&first, &second, self.node).ok_or(HandshakeError::Rejected)
    }
}

/// What the node must decide about a message 1 (seed 004, Handshake and
/// Enforcement); the uplink answers from its channels and the trust log.
pub trait Admission {
    /// "A channel with this chan_id already exists."
    fn channel_exists(&self, chan_id: &str) -> bool;
    /// "The node is quarantined" (and not locally disabled).
    fn quarantined(&self) -> bool;
    /// Whether the client's key may open a channel: true unless locked mode
    /// is on, the node and the log are not disabled, and the log does not
    /// authorize the key.
    fn authorizes(&self, client: &PublicKey) -> bool;
}

/// A node's accepted handshake: message 2 to send back, and the channel.
pub struct Accepted {
    pub msg2: [u8; E2EE_MSG2_LEN],
    pub channel: Channel,
}

impl fmt::Debug for Accepted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Accepted {{ client: {:?} }}", self.channel.peer())
    }
}

/// The node's answer to message 1 on channel `chan_id`: message 2 and the
/// channel, or why the frame is dropped (module comment: the order of the
/// checks).
pub fn respond(
    identity: &StaticKey,
    node_id: &str,
    chan_id: &str,
    msg1: &[u8],
    admission: &dyn Admission,
) -> Result<Accepted, HandshakeError> {
    if admission.channel_exists(chan_id) {
        return Err(HandshakeError::Refused(Refusal::ChannelExists));
    }
    if admission.quarantined() {
        return Err(HandshakeError::Refused(Refusal::Quarantined));
    }
    if msg1.len() != E2EE_MSG1_LEN {
        return Err(HandshakeError::Length {
            expected: E2EE_MSG1_LEN,
            got: msg1.len(),
        });
    }
    let prologue = prologue(node_id, chan_id);
    let mut state = builder()?
        .local_private_key(identity.private_bytes())
        .and_then(|b| b.prologue(prologue.as_bytes()))
        .and_then(|b| b.build_responder())
        .map_err(HandshakeError::Noise)?;
    let mut payload = [0u8; E2EE_MSG1_LEN];
    state
        .read_message(msg1, &mut payload)
        .map_err(|_| HandshakeError::Rejected)?;
    let client: [u8; 32] = state
        .get_remote_static()
        .and_then(|k| k.try_into().ok())
        .ok_or(HandshakeError::Rejected)?;
    let client = PublicKey::from_bytes(client);
    if client.is_low_order() {
        return Err(HandshakeError::LowOrderKey);
    }
    if !admission.authorizes(&client) {
        return Err(HandshakeError::Refused(Refusal::Unauthorized));
    }
    let mut msg2 = [0u8; E2EE_MSG2_LEN];
    let n = state
        .write_message(&[], &mut msg2)
        .map_err(HandshakeError::Noise)?;
    if n != E2EE_MSG2_LEN || !state.is_handshake_finished() {
        return Err(HandshakeError::Length {
            expected: E2EE_MSG2_LEN,
            got: n,
        });
    }
    // "The responder uses the reverse."
    let (first, second) = state.dangerously_get_raw_split();
    let channel = Channel::new(&second, &first, client).ok_or(HandshakeError::Rejected)?;
    Ok(Accepted { msg2, channel })
}

/// The seed's three reasons to refuse a client that completed message 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A channel with this `chan_id` exists already.
    ChannelExists,
    /// The node is quarantined.
    Quarantined,
    /// Locked mode is on and the trust log does not authorize the key.
    Unauthorized,
}

/// Why a handshake message was not accepted. On the node, every case means
/// the frame is dropped without a reply.
#[derive(Debug)]
pub enum HandshakeError {
    /// The message is not the length the seed gives.
    Length { expected: usize, got: usize },
    /// The message does not authenticate: another key, another prologue,
    /// or altered bytes.
    Rejected,
    /// The peer's static key is a low-order point.
    LowOrderKey,
    /// One of the seed's refusals.
    Refused(Refusal),
    /// snow refused to build or run the handshake (a defect of ours, never
    /// caused by the peer's bytes).
    Noise(snow::Error),
}

impl HandshakeError {
    pub fn code(&self) -> &'static str {
        match self {
            HandshakeError::Length { .. } => "e2e-handshake-length",
            HandshakeError::Rejected => "e2e-handshake-rejected",
            HandshakeError::LowOrderKey => "e2e-key-low-order",
            HandshakeError::Refused(Refusal::ChannelExists) => "e2e-channel-exists",
            HandshakeError::Refused(Refusal::Quarantined) => "e2e-node-quarantined",
            HandshakeError::Refused(Refusal::Unauthorized) => "e2e-client-unauthorized",
            HandshakeError::Noise(_) => "e2e-noise-failed",
        }
    }
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::Length { expected, got } => {
                write!(f, "handshake message is {got} bytes, not {expected}")
            }
            HandshakeError::Rejected => write!(
                f,
                "handshake message does not authenticate (another key or prologue, or altered)"
            ),
            HandshakeError::LowOrderKey => write!(f, "peer's static key is a low-order point"),
            HandshakeError::Refused(Refusal::ChannelExists) => {
                write!(f, "a channel with this id exists already")
            }
            HandshakeError::Refused(Refusal::Quarantined) => {
                write!(f, "node is quarantined and refuses every channel")
            }
            HandshakeError::Refused(Refusal::Unauthorized) => {
                write!(f, "trust log does not authorize the client's key")
            }
            HandshakeError::Noise(e) => write!(f, "noise handshake failed: {e}"),
        }
    }
}

impl std::error::Error for HandshakeError {}
