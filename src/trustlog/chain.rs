//! The chain rules and the state a valid chain yields (seed 004, Locked
//! mode, "Chain rules"): trusted signers, authorized devices (each with the
//! signer that authorized it), the genesis disablement commitments, whether
//! the log is disabled, its genesis and its tip.
//!
//! [`State::check`] tests one entry against the state without changing it
//! and [`State::apply`] folds a checked entry in; [`Chain::verify`] runs
//! both over a whole chain from its genesis. Decisions where the seed is
//! silent (the module comment of `trustlog/mod.rs` lists them for the man
//! page): revoke-device of a device that is not authorized and add-signer
//! of a key that already signs are valid and change nothing; a revoke-signer
//! entry must revoke at least one key and may not name a key twice in its
//! revoked keys or in Replaces.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use argon2::{Algorithm, Argon2, Params, Version};
use ed25519_dalek::VerifyingKey;

use super::entry::{Entry, Hash, Kind, verify, verifying_key};
use crate::limits::{
    TRUSTLOG_ARGON2_LANES, TRUSTLOG_ARGON2_MEMORY_KIB, TRUSTLOG_ARGON2_OUTPUT,
    TRUSTLOG_ARGON2_SALT, TRUSTLOG_ARGON2_TIME,
};

/// Why an entry does not extend a state. Each names the rule it breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleError {
    /// The first entry of a chain is not a genesis.
    NotGenesis,
    /// A genesis after the first entry.
    GenesisNotFirst,
    /// A genesis with a non-empty Prev.
    GenesisPrev,
    /// A genesis without signers.
    GenesisNoSigners,
    /// A genesis naming a signer twice.
    GenesisDuplicateSigner,
    /// A genesis signed by a key outside its own Signers.
    GenesisSignerNotListed,
    /// Prev is not the hash of the current tip.
    NotExtendingTip,
    /// The log is disabled: nothing follows a disable entry.
    Disabled,
    /// The signature (Signer and Sig) does not verify.
    BadSignature,
    /// Signed by a key that is not a trusted signer.
    UntrustedSigner,
    /// add-signer, remove-signer, authorize-device or revoke-device with
    /// an empty Key.
    EmptyKey,
    /// authorize-device of a device already authorized.
    DeviceAlreadyAuthorized,
    /// remove-signer of a key that is not a signer.
    NotASigner,
    /// remove-signer of the last signer.
    LastSigner,
    /// The disablement secret's commitment is not in the genesis.
    BadDisablementSecret,
    /// revoke-signer with a Signer or a Sig.
    RevokeSignerSigned,
    /// revoke-signer that revokes no key.
    RevokeNothing,
    /// revoke-signer naming a key twice in its revoked keys or Replaces.
    RevokeDuplicateKey,
    /// revoke-signer whose revoked keys and Replaces overlap.
    RevokeOverlap,
    /// revoke-signer without more distinct trusted co-signers than
    /// revoked keys.
    NotEnoughCoSigns { counted: usize, needed: usize },
    /// revoke-signer that would leave no signer.
    NoSignerLeft,
}

impl RuleError {
    /// A stable kebab-case name for programs and logs.
    pub fn code(&self) -> &'static str {
        match self {
            RuleError::NotGenesis => "trustlog-not-genesis",
            RuleError::GenesisNotFirst => "trustlog-genesis-not-first",
            RuleError::GenesisPrev => "trustlog-genesis-prev",
            RuleError::GenesisNoSigners => "trustlog-genesis-no-signers",
            RuleError::GenesisDuplicateSigner => "trustlog-genesis-duplicate-signer",
            RuleError::GenesisSignerNotListed => "trustlog-genesis-signer-not-listed",
            RuleError::NotExtendingTip => "trustlog-not-extending-tip",
            RuleError::Disabled => "trustlog-disabled",
            RuleError::BadSignature => "trustlog-bad-signature",
            RuleError::UntrustedSigner => "trustlog-untrusted-signer",
            RuleError::EmptyKey => "trustlog-empty-key",
            RuleError::DeviceAlreadyAuthorized => "trustlog-device-already-authorized",
            RuleError::NotASigner => "trustlog-not-a-signer",
            RuleError::LastSigner => "trustlog-last-signer",
            RuleError::BadDisablementSecret => "trustlog-bad-disablement-secret",
            RuleError::RevokeSignerSigned => "trustlog-revoke-signer-signed",
            RuleError::RevokeNothing => "trustlog-revoke-nothing",
            RuleError::RevokeDuplicateKey => "trustlog-revoke-duplicate-key",
            RuleError::RevokeOverlap => "trustlog-revoke-overlap",
            RuleError::NotEnoughCoSigns { .. } => "trustlog-not-enough-cosigns",
            RuleError::NoSignerLeft => "trustlog-no-signer-left",
        }
    }
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            RuleError::NotGenesis => "the first entry is not a genesis",
            RuleError::GenesisNotFirst => "a genesis follows another entry",
            RuleError::GenesisPrev => "the genesis has a prev",
            RuleError::GenesisNoSigners => "the genesis has no signers",
            RuleError::GenesisDuplicateSigner => "the genesis names a signer twice",
            RuleError::GenesisSignerNotListed => "the genesis signer is not one of its signers",
            RuleError::NotExtendingTip => "the entry does not extend the tip",
            RuleError::Disabled => "the log is disabled",
            RuleError::BadSignature => "the entry's signature does not verify",
            RuleError::UntrustedSigner => "the entry's signer is not a trusted signer",
            RuleError::EmptyKey => "the entry has an empty key",
            RuleError::DeviceAlreadyAuthorized => "the device is already authorized",
            RuleError::NotASigner => "the key to remove is not a signer",
            RuleError::LastSigner => "the key to remove is the last signer",
            RuleError::BadDisablementSecret => {
                "the disablement secret matches no commitment of the genesis"
            }
            RuleError::RevokeSignerSigned => "a revoke-signer entry has a signer or a signature",
            RuleError::RevokeNothing => "the revoke-signer entry revokes no key",
            RuleError::RevokeDuplicateKey => "the revoke-signer entry names a key twice",
            RuleError::RevokeOverlap => "the revoked keys and the replacements overlap",
            RuleError::NotEnoughCoSigns { counted, needed } => {
                return write!(
                    f,
                    "the revoke-signer entry has {counted} counted co-signers, {needed} needed"
                );
            }
            RuleError::NoSignerLeft => "the revoke-signer entry would leave no signer",
        };
        f.write_str(s)
    }
}

impl std::error::Error for RuleError {}

/// Entry `index` of a chain breaks `rule`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainError {
    pub index: usize,
    pub rule: RuleError,
}

impl fmt::Display for ChainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "trust-log entry {}: {}", self.index, self.rule)
    }
}

impl std::error::Error for ChainError {}

/// The Argon2id commitment of a disablement secret at the seed's
/// parameters. About 64 MiB and tens of milliseconds of work: callers run
/// it only after every cheaper check of the entry has passed.
pub fn disablement_commitment(secret: &[u8]) -> [u8; TRUSTLOG_ARGON2_OUTPUT] {
    let mut out = [0u8; TRUSTLOG_ARGON2_OUTPUT];
    // The parameters are constants within Argon2's ranges and the salt is
    // longer than its minimum, so neither call can fail; a failure would
    // leave an all-zero output that no genesis commits to.
    if let Ok(params) = Params::new(
        TRUSTLOG_ARGON2_MEMORY_KIB,
        TRUSTLOG_ARGON2_TIME,
        TRUSTLOG_ARGON2_LANES,
        Some(TRUSTLOG_ARGON2_OUTPUT),
    ) {
        let a = Argon2::new(Algorithm::Argon2id, Version::V0x13, params);
        if a.hash_password_into(secret, TRUSTLOG_ARGON2_SALT, &mut out)
            .is_err()
        {
            out = [0u8; TRUSTLOG_ARGON2_OUTPUT];
        }
    }
    out
}

/// What a valid chain (or its prefix) yields.
#[derive(Clone, Debug)]
pub struct State {
    genesis: Hash,
    tip: Hash,
    length: usize,
    /// Trusted signers, each with its parsed key (`None` for bytes that are
    /// no Ed25519 key: such a signer is trusted but can sign nothing).
    signers: BTreeMap<Vec<u8>, Option<VerifyingKey>>,
    /// Authorized devices, each with the signer that authorized it.
    devices: BTreeMap<Vec<u8>, Vec<u8>>,
    disablements: Vec<Vec<u8>>,
    disabled: bool,
}

fn has_duplicates(items: &[Vec<u8>]) -> bool {
    let mut seen = BTreeSet::new();
    items.iter().any(|i| !seen.insert(i.as_slice()))
}

impl State {
    /// The state of a one-entry chain, if `e` is a valid genesis: an empty
    /// Prev, at least one signer, none twice, signed by one of them.
    pub fn genesis(e: &Entry) -> Result<State, RuleError> {
        if e.kind() != Kind::Genesis {
            return Err(RuleError::NotGenesis);
        }
        if !e.prev().is_empty() {
            return Err(RuleError::GenesisPrev);
        }
        if e.signers().is_empty() {
            return Err(RuleError::GenesisNoSigners);
        }
        if has_duplicates(e.signers()) {
            return Err(RuleError::GenesisDuplicateSigner);
        }
        if !e.signers().iter().any(|s| s.as_slice() == e.signer()) {
            return Err(RuleError::GenesisSignerNotListed);
        }
        let ok = verifying_key(e.signer()).is_some_and(|k| verify(&k, e.signed_bytes(), e.sig()));
        if !ok {
            return Err(RuleError::BadSignature);
        }
        Ok(State {
            genesis: e.hash(),
            tip: e.hash(),
            length: 1,
            signers: e
                .signers()
                .iter()
                .map(|s| (s.clone(), verifying_key(s)))
                .collect(),
            devices: BTreeMap::new(),
            disablements: e.disablements().to_vec(),
            disabled: false,
        })
    }

    /// Whether `e` may follow this state: every rule, no change made.
    pub fn check(&self, e: &Entry) -> Result<(), RuleError> {
        if e.kind() == Kind::Genesis {
            return Err(RuleError::GenesisNotFirst);
        }
        if e.prev() != self.tip.0.as_slice() {
            return Err(RuleError::NotExtendingTip);
        }
        if self.disabled {
            return Err(RuleError::Disabled);
        }
        match e.kind() {
            Kind::RevokeSigner => self.check_revoke_signer(e),
            Kind::Disable => self.check_disable(e),
            _ => self.check_signed(e),
        }
    }

    /// A disable entry: a valid signature by any key, and the Argon2id
    /// commitment of its Key in the genesis Disablements.
    fn check_disable(&self, e: &Entry) -> Result<(), RuleError> {
        let ok = verifying_key(e.signer()).is_some_and(|k| verify(&k, e.signed_bytes(), e.sig()));
        if !ok {
            return Err(RuleError::BadSignature);
        }
        // The memory-hard commitment last, and not at all when the genesis
        // committed to no secret.
        if self.disablements.is_empty() {
            return Err(RuleError::BadDisablementSecret);
        }
        let c = disablement_commitment(e.key());
        if self.disablements.iter().any(|d| d.as_slice() == c) {
            Ok(())
        } else {
            Err(RuleError::BadDisablementSecret)
        }
    }

    /// add-signer, remove-signer, authorize-device and revoke-device: a
    /// non-empty Key and a signature from a trusted signer, then each
    /// kind's own rule.
    fn check_signed(&self, e: &Entry) -> Result<(), RuleError> {
        if e.key().is_empty() {
            return Err(RuleError::EmptyKey);
        }
        let Some(key) = self.signers.get(e.signer()) else {
            return Err(RuleError::UntrustedSigner);
        };
        let ok = key
            .as_ref()
            .is_some_and(|k| verify(k, e.signed_bytes(), e.sig()));
        if !ok {
            return Err(RuleError::BadSignature);
        }
        match e.kind() {
            Kind::AuthorizeDevice if self.devices.contains_key(e.key()) => {
                Err(RuleError::DeviceAlreadyAuthorized)
            }
            Kind::RemoveSigner if !self.signers.contains_key(e.key()) => Err(RuleError::NotASigner),
            Kind::RemoveSigner if self.signers.len() == 1 => Err(RuleError::LastSigner),
            _ => Ok(()),
        }
    }

    /// The distinct trusted signers whose co-signs count for a
    /// revoke-signer entry against this state: a valid signature over the
    /// signed bytes, from a trusted signer, and from a revoked signer only
    /// when Replaces is not empty. Fork choice weighs a revoke-signer entry
    /// by this same count against the state at the fork.
    pub fn counted_cosigners(&self, e: &Entry) -> usize {
        let revoked: BTreeSet<&[u8]> = e.signers().iter().map(Vec::as_slice).collect();
        let mut counted: BTreeSet<&[u8]> = BTreeSet::new();
        for c in e.cosigns() {
            if counted.contains(c.signer.as_slice()) {
                continue;
            }
            if revoked.contains(c.signer.as_slice()) && e.replaces().is_empty() {
                continue;
            }
            let Some(Some(key)) = self.signers.get(&c.signer) else {
                continue;
            };
            if verify(key, e.signed_bytes(), &c.sig) {
                counted.insert(&c.signer);
            }
        }
        counted.len()
    }

    fn check_revoke_signer(&self, e: &Entry) -> Result<(), RuleError> {
        if !e.signer().is_empty() || !e.sig().is_empty() {
            return Err(RuleError::RevokeSignerSigned);
        }
        if e.signers().is_empty() {
            return Err(RuleError::RevokeNothing);
        }
        if has_duplicates(e.signers()) || has_duplicates(e.replaces()) {
            return Err(RuleError::RevokeDuplicateKey);
        }
        if e.signers().iter().any(|r| e.replaces().contains(r)) {
            return Err(RuleError::RevokeOverlap);
        }
        let remains = self
            .signers
            .keys()
            .chain(e.replaces())
            .any(|k| !e.signers().contains(k));
        if !remains {
            return Err(RuleError::NoSignerLeft);
        }
        let counted = self.counted_cosigners(e);
        let needed = e.signers().len() + 1;
        if counted < needed {
            return Err(RuleError::NotEnoughCoSigns { counted, needed });
        }
        Ok(())
    }

    /// Folds in an entry that [`State::check`] accepted against this state.
    pub fn apply(&mut self, e: &Entry) {
        match e.kind() {
            Kind::Genesis => {}
            Kind::AddSigner => {
                if !self.signers.contains_key(e.key()) {
                    self.signers
                        .insert(e.key().to_vec(), verifying_key(e.key()));
                }
            }
            Kind::RemoveSigner => self.remove_signer(e.key()),
            Kind::AuthorizeDevice => {
                self.devices.insert(e.key().to_vec(), e.signer().to_vec());
            }
            Kind::RevokeDevice => {
                self.devices.remove(e.key());
            }
            Kind::Disable => self.disabled = true,
            Kind::RevokeSigner => {
                for r in e.replaces() {
                    if !self.signers.contains_key(r) {
                        self.signers.insert(r.clone(), verifying_key(r));
                    }
                }
                for r in e.signers() {
                    self.remove_signer(r);
                }
            }
        }
        self.tip = e.hash();
        self.length += 1;
    }

    /// "When a signer is removed or revoked, the devices it authorized are
    /// also removed."
    fn remove_signer(&mut self, key: &[u8]) {
        self.signers.remove(key);
        self.devices.retain(|_, by| by.as_slice() != key);
    }

    /// [`State::check`] then [`State::apply`].
    pub fn extend(&mut self, e: &Entry) -> Result<(), RuleError> {
        self.check(e)?;
        self.apply(e);
        Ok(())
    }

    pub fn genesis_hash(&self) -> Hash {
        self.genesis
    }
    pub fn tip(&self) -> Hash {
        self.tip
    }
    /// Entries in the chain, the genesis included.
    pub fn len(&self) -> usize {
        self.length
    }
    /// Never true: a state has at least its genesis.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }
    pub fn disabled(&self) -> bool {
        self.disabled
    }
    pub fn is_signer(&self, key: &[u8]) -> bool {
        self.signers.contains_key(key)
    }
    /// Trusted signers in bytewise order.
    pub fn signers(&self) -> impl Iterator<Item = &[u8]> {
        self.signers.keys().map(Vec::as_slice)
    }
    /// Whether the log authorizes the device. A disabled log authorizes
    /// no one by itself; enforcement reads [`State::disabled`] first.
    pub fn is_authorized(&self, device: &[u8]) -> bool {
        self.devices.contains_key(device)
    }
    /// Authorized devices in bytewise order.
    pub fn devices(&self) -> impl Iterator<Item = &[u8]> {
        self.devices.keys().map(Vec::as_slice)
    }
    /// The signer that authorized a device, if it is authorized.
    pub fn authorized_by(&self, device: &[u8]) -> Option<&[u8]> {
        self.devices.get(device).map(Vec::as_slice)
    }
    pub fn disablements(&self) -> &[Vec<u8>] {
        &self.disablements
    }
}

/// A chain that passed every rule, with the state it yields.
#[derive(Clone, Debug)]
pub struct Chain {
    entries: Vec<Entry>,
    state: State,
}

impl Chain {
    /// Verifies every entry in order from the genesis.
    pub fn verify(entries: Vec<Entry>) -> Result<Chain, ChainError> {
        let Some(first) = entries.first() else {
            return Err(ChainError {
                index: 0,
                rule: RuleError::NotGenesis,
            });
        };
        let mut state = State::genesis(first).map_err(|rule| ChainError { index: 0, rule })?;
        for (index, e) in entries.iter().enumerate().skip(1) {
            state.extend(e).map_err(|rule| ChainError { index, rule })?;
        }
        Ok(Chain { entries, state })
    }

    /// A chain of `entries` whose state is already known to be `state`
    /// (built entry by entry with [`State::extend`]).
    pub(super) fn from_parts(entries: Vec<Entry>, state: State) -> Chain {
        Chain { entries, state }
    }

    /// Appends an entry that extends this chain's tip.
    pub fn push(&mut self, e: Entry) -> Result<(), RuleError> {
        self.state.extend(&e)?;
        self.entries.push(e);
        Ok(())
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }
    pub fn state(&self) -> &State {
        &self.state
    }
    pub fn into_entries(self) -> Vec<Entry> {
        self.entries
    }

    /// The position of the entry with this hash.
    pub fn position(&self, hash: &Hash) -> Option<usize> {
        self.entries.iter().position(|e| e.hash() == *hash)
    }

    /// The state after the first `len` entries (1 ≤ len ≤ length), replayed
    /// without checking again what [`Chain::verify`] checked.
    pub fn state_at(&self, len: usize) -> Option<State> {
        let first = self.entries.first()?;
        if len == 0 || len > self.entries.len() {
            return None;
        }
        let mut s = State::genesis(first).ok()?;
        for e in &self.entries[1..len] {
            s.apply(e);
        }
        Some(s)
    }

    /// The chain cut after the entry with this hash.
    pub fn prefix_to(&self, hash: &Hash) -> Option<Chain> {
        let n = self.position(hash)? + 1;
        let state = self.state_at(n)?;
        Some(Chain {
            entries: self.entries[..n].to_vec(),
            state,
        })
    }

    /// The default fork point of a revoke-signer entry (seed 004: "the
    /// parent of the first entry of the revoked signer"): the Prev of the
    /// first entry after the genesis signed by a revoked key, or the tip if
    /// none of them signed one. The genesis is never a revoked signer's
    /// entry to erase: no chain forks before it.
    pub fn default_fork_point(&self, revoked: &[Vec<u8>]) -> Hash {
        self.entries
            .iter()
            .skip(1)
            .find(|e| revoked.iter().any(|r| r.as_slice() == e.signer()))
            .and_then(Entry::prev_hash)
            .unwrap_or(self.state.tip)
    }
}
