//! The trust log of locked mode, its pure core (seed 004, Locked mode:
//! "Entry encoding", "Chain rules", "Fork choice", "Distribution"; issue
//! 14): entries and their wire form, the chain rules and the state a chain
//! yields, fork choice and chain assembly, the `trustlog.sync` answer, the
//! key text forms, the entries the `lock.*` methods write ([`author`]),
//! and admission and quarantine decisions ([`enforce`]). No I/O and no clock: the node, the gateway and the command
//! line call in with bytes and get values back. Key generation and the
//! randomness of secrets belong to the caller.
//!
//! Decisions where the seed is silent (the man page's locked-mode section
//! states them for administrators):
//!
//! - **Revoke-signer and "extend the tip".** A revoke-signer entry extends
//!   the tip of the chain it is in, like every entry: its Prev, the fork
//!   point, is the tip of the chain's prefix that ends there. Revoking a
//!   signer that already appended entries therefore makes a new branch
//!   from the fork point (by default the parent of the revoked signer's
//!   first entry after the genesis, [`Chain::default_fork_point`]); the
//!   revoked signer's entries stay on the other branch, and fork choice
//!   picks the revocation because its weight is its counted co-signers
//!   where the other branch's first entry weighs 1. Entries honest signers
//!   appended after the fork point are on the losing branch too and must
//!   be signed again on the new one.
//! - **Revoke-signer's shape.** Its Signer and Sig are empty (the seed: "a
//!   client that fills Signer or Sig computes a different hash"; such an
//!   entry is refused). It revokes at least one key and names no key twice
//!   in its revoked keys or in Replaces, as a genesis may not name a signer
//!   twice. A revoked key need not be a signer. "More than the number of
//!   revoked keys": at least revoked + 1 distinct counted co-signers.
//! - **Weight.** A revoke-signer entry weighs its co-signers counted by
//!   the chain rule against the state at the fork (so a revoked signer's
//!   co-sign weighs only with Replaces), each signer once.
//! - **Idempotent entries.** add-signer of a signer and revoke-device of a
//!   device that is not authorized are valid and change nothing (the seed
//!   makes only authorize-device of an authorized device fail).
//! - **Device keys** need only be non-empty in the log (the seed's rule);
//!   `lock.*` refuses keys that are not 32 bytes before signing anything.
//! - **Canonical wire form.** The decoder refuses co-signs out of order
//!   (or the same pair twice), and an entry longer than the 1 MiB a chain
//!   field may hold.
//! - **Signatures** are verified strictly (`verify_strict`: no small-order
//!   keys, no non-canonical signatures), so no one can alter a signature
//!   into another valid one and change an entry's hash.
//! - **The ceremony** checks each co-sign where it is added: the signer
//!   must be trusted at the fork point, must not have co-signed, and must
//!   not be a revoked key unless Replaces is set; co-signs already in the
//!   blob must verify. Finish returns the forked chain; the node adopts it
//!   by fork choice.
//! - **Locked nodes refuse plaintext channels** (no client key for the log
//!   to authorize), unless locally disabled or the log is disabled; a
//!   pinned node ignores chains of other geneses, and without a pin a node
//!   with a log treats its log's genesis as pinned ([`enforce`]).
//! - **Assembly** cuts a branch at its first invalid entry and keeps what
//!   precedes it as a candidate ([`fork`] says why).
//!
//! Cost: checking a disable entry is one Argon2id evaluation (64 MiB, tens
//! of milliseconds), run only after its signature verifies and only when
//! the genesis holds commitments. Anyone can sign a disable entry, so a
//! peer that sends many of them makes assembly pay for each: callers run
//! assembly off the reactor thread and bound the entries they accept.

pub mod author;
pub mod chain;
pub mod enforce;
pub mod entry;
pub mod fork;
pub mod keytext;
pub mod sync;

pub use chain::{Chain, ChainError, RuleError, State, disablement_commitment};
pub use entry::{
    BuildError, CoSign, Content, DecodeError, Entry, Hash, Kind, decode_chain, encode_chain,
};
pub use fork::{Assembly, assemble, compare};
pub use keytext::{KeyText, KeyTextError};
pub use sync::{SyncAnswer, SyncError, SyncRequest};
