//! Who may open a channel to a node, and what a trust sync does to the
//! node's log (seed 004, Locked mode, "Enforcement" and "Pinning and
//! quarantine"), as pure decisions over what the node holds.
//!
//! Admission, checked at the end of each Noise handshake and again for
//! every open channel when the log changes:
//! - a locally disabled node admits every channel ("accepts channels from
//!   any device"), quarantined or not;
//! - a quarantined node admits none;
//! - in locked mode, a disabled log admits every channel, and otherwise a
//!   channel is admitted only if the log authorizes its client key. An
//!   empty log authorizes no device. A plaintext channel has no client key
//!   for the log to authorize, so a locked node refuses it (else locked
//!   mode would be bypassed by not encrypting).
//!
//! After a sync, with the entries assembled into chains: the node's root
//! is its pinned genesis, or without a pin the genesis of the log it holds.
//! - No root (no log, no pin) and a valid chain on the gateway: quarantine,
//!   naming the lowest such genesis hash (a stable choice).
//! - A disabled log and a valid chain of another genesis: quarantine ("its
//!   disabled chain is superseded by another root"), naming that genesis.
//! - Otherwise the root's chain is adopted if fork choice prefers it to the
//!   log held (or the node holds none, or holds another log than the one
//!   now pinned); chains of other geneses are ignored.

use std::cmp::Ordering;
use std::fmt;

use super::chain::{Chain, State};
use super::entry::Hash;
use super::fork::{Assembly, compare};

/// What the node knows when it admits a channel.
#[derive(Clone, Copy, Debug)]
pub struct Gate<'a> {
    /// Locked mode is on (the node holds a log or pinned a genesis).
    pub locked: bool,
    /// The state of the node's log; `None` while it is empty.
    pub log: Option<&'a State>,
    pub local_disabled: bool,
    pub quarantined: bool,
}

/// Why a channel is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The node is quarantined and not locally disabled.
    Quarantined,
    /// The log does not authorize the client key.
    NotAuthorized,
    /// A plaintext channel to a node in locked mode.
    Plaintext,
}

impl Refusal {
    pub fn code(self) -> &'static str {
        match self {
            Refusal::Quarantined => "lock-quarantined",
            Refusal::NotAuthorized => "lock-not-authorized",
            Refusal::Plaintext => "lock-plaintext",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::Quarantined => "the node is quarantined",
            Refusal::NotAuthorized => "the trust log does not authorize the client key",
            Refusal::Plaintext => "the node is in locked mode and refuses plaintext channels",
        })
    }
}

impl Gate<'_> {
    /// Whether a channel is admitted: `client` is the client's static key
    /// from the handshake, `None` for a plaintext channel.
    pub fn admit(&self, client: Option<&[u8]>) -> Result<(), Refusal> {
        if self.local_disabled {
            return Ok(());
        }
        if self.quarantined {
            return Err(Refusal::Quarantined);
        }
        if !self.locked || self.log.is_some_and(State::disabled) {
            return Ok(());
        }
        match client {
            None => Err(Refusal::Plaintext),
            Some(k) if self.log.is_some_and(|s| s.is_authorized(k)) => Ok(()),
            Some(_) => Err(Refusal::NotAuthorized),
        }
    }
}

/// What a sync means for the node's log.
#[derive(Debug)]
pub enum Outcome<'a> {
    /// Replace the log held with this chain.
    Adopt(&'a Chain),
    /// Keep the log held.
    Keep,
    /// Become quarantined; `seen_genesis` is the genesis that caused it
    /// (`lock.status`'s `seen_genesis`).
    Quarantine { seen_genesis: Hash },
}

/// The decision after a sync: `pin` is the pinned genesis, `held` the log
/// the node holds, `found` the chains assembled from its entries and the
/// gateway's.
pub fn after_sync<'a>(pin: Option<Hash>, held: Option<&Chain>, found: &'a Assembly) -> Outcome<'a> {
    let held_genesis = held.map(|c| c.state().genesis_hash());
    let Some(root) = pin.or(held_genesis) else {
        return match found.chains.first() {
            Some(c) => Outcome::Quarantine {
                seen_genesis: c.state().genesis_hash(),
            },
            None => Outcome::Keep,
        };
    };
    if let Some(h) = held.filter(|h| h.state().disabled() && Some(root) == held_genesis) {
        let other = found
            .chains
            .iter()
            .map(|c| c.state().genesis_hash())
            .find(|g| *g != h.state().genesis_hash());
        if let Some(seen_genesis) = other {
            return Outcome::Quarantine { seen_genesis };
        }
    }
    let Some(candidate) = found.chain_for(&root) else {
        return Outcome::Keep;
    };
    match held {
        Some(h) if Some(root) == held_genesis => {
            if compare(candidate, h) == Some(Ordering::Greater) {
                Outcome::Adopt(candidate)
            } else {
                Outcome::Keep
            }
        }
        _ => Outcome::Adopt(candidate),
    }
}
