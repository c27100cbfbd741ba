//! Locked mode on the node (seed 004, "Locked mode", "Locked mode control",
//! "Enforcement", "Pinning and quarantine"; issue 14): the trust log this
//! node holds, its pinned genesis, its signer key, the quarantine and the
//! local disable, and what each `lock.*` call does to them. The rules of
//! the log itself are the pure core's (src/trustlog/); this module decides
//! which entry an operation writes and what the node keeps, and the router
//! runs it on the daemon: one operation at a time, Argon2id and chain
//! verification on the lock worker thread, every change committed to the
//! ledger before it is answered or acted on.
//!
//! Where things are kept: the log's entries, the pin, the local disable
//! and the quarantine in the ledger (migration 8); the signer key in
//! `lock-signer.key`, a 0600 file of the state directory ([`key`] says
//! why). The signer key is made at the first start and never replaced.
//!
//! Decisions where the seed is silent (omniconfluxd(8), LOCKED MODE, states
//! them for administrators):
//! - `lock.init` on a node that holds a log is refused (`lock-exists`): a
//!   second genesis would silently orphan every device the first one
//!   authorized. It pins the new genesis, ends a local disable and a
//!   quarantine. `signers` defaults to this node's signer key alone.
//! - `lock.pin` also ends a local disable and a quarantine (the operator
//!   chose which log to trust); `lock.unpin` only removes the pin. A local
//!   disable lasts until `lock.pin` or `lock.init`, across restarts.
//! - The pin is kept in the ledger and reported with `pin_source: "file"`
//!   (stored by the node, not set by a configuration key, which this daemon
//!   does not have).
//! - `authorized` in `lock.status` is whether the log authorizes this
//!   node's E2EE identity key (`identity_pubkey`), the key clients check.
//! - `lock.disable` of a log already disabled answers `disabled: true`
//!   without a new entry. `lock.revokeSignerFinish` adopts the forked
//!   chain only if fork choice prefers it to the log held, else it is
//!   refused and nothing changes.
//! - A stored log that no longer verifies (the ledger edited or damaged)
//!   is not used: the node starts quarantined, refusing every channel,
//!   until the operator pins a genesis or disables locally. The error log
//!   names the entry that failed; `lock.pin` (or `lock.init`) then deletes
//!   the stored entries, so the next start is not quarantined again.
//! - `lock.log` entries carry `target` for the four key operations; a
//!   disable entry's Key (the revealed secret) is not shown as a target.
//!
//! For the uplink (relay channels, not built yet): [`Lock::admit`] answers
//! "may this client key open a channel now?" at the end of each Noise
//! handshake (`None` for a plaintext channel), and [`Lock::to_close`]
//! answers "which open channels must close?" after every change this node
//! commits or adopts; router/lock.rs calls the uplink's side of it once it
//! exists. Both read only what is committed.

pub mod key;
pub mod store;

use ed25519_dalek::SigningKey;
use std::fmt;

use crate::limits;
use crate::trustlog::author::{self, AuthorError};
use crate::trustlog::enforce::{Gate, Refusal};
use crate::trustlog::{Chain, Entry, Hash, Kind, compare, disablement_commitment};

/// A 32-byte key or hash as the methods carry it.
pub type Key = Vec<u8>;

/// What the node holds. Owned by the reactor; changed only by
/// [`Lock::apply`] after a commit, or by the start-up load.
pub struct Lock {
    chain: Option<Chain>,
    pin: Option<Hash>,
    local_disabled: bool,
    quarantined: bool,
    seen_genesis: Option<Hash>,
    /// The signer key, or why it could not be had (a file error, or not
    /// loaded yet).
    signer: Result<SigningKey, String>,
    /// This node's E2EE identity public key, when it could be read.
    identity: Option<[u8; 32]>,
    /// The ledger holds entries that did not verify at start; the change
    /// that ends the quarantine deletes them.
    unusable_rows: bool,
}

impl Default for Lock {
    fn default() -> Lock {
        Lock {
            chain: None,
            pin: None,
            local_disabled: false,
            quarantined: false,
            seen_genesis: None,
            signer: Err("the signer key is not loaded yet".into()),
            identity: None,
            unusable_rows: false,
        }
    }
}

/// One `lock.*` call, its params decoded.
#[derive(Debug)]
pub enum Op {
    Init {
        signers: Option<Vec<Key>>,
        devices: Vec<Key>,
        disablements: u32,
    },
    /// `lock.sign`, `lock.revoke`, `lock.addSigner`, `lock.removeSigner`:
    /// authorize-device, revoke-device, add-signer, remove-signer.
    Entry(Kind, Key),
    Disable(Key),
    Pin(Hash),
    Unpin,
    LocalDisable,
    Status,
    Log,
    RevokeStart {
        revoked: Vec<Key>,
        replaces: Vec<Key>,
        fork_from: Option<Hash>,
    },
    RevokeCosign(Vec<u8>),
    RevokeFinish(Vec<u8>),
    /// The entries a `trustlog.sync` of the uplink brought, in wire form:
    /// assembled with the log held and decided by fork choice (seed 004,
    /// Distribution).
    Sync(Vec<Vec<u8>>),
}

/// What an operation answers, read together with the state after it.
#[derive(Debug)]
pub enum Answer {
    Init {
        tip: Hash,
        signer_count: usize,
        secrets: Vec<[u8; 32]>,
    },
    Changed {
        tip: Hash,
        changed: bool,
    },
    Disabled {
        tip: Hash,
    },
    /// null
    Done,
    /// The state as `lock.status` shows it.
    Status,
    /// The log as `lock.log` shows it.
    Log,
    Blob(Vec<u8>),
    Tip(Hash),
}

/// Why an operation changes nothing.
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// The node holds no log (`lock-no-log`).
    NoLog,
    /// `lock.init` on a node that holds a log (`lock-exists`).
    Exists,
    /// The node has no signer key (`lock-no-signer-key`).
    NoSigner(String),
    /// A param that no operation could use (`invalid-params`).
    Invalid(String),
    /// The entry breaks a chain rule or the ceremony's (`lock-refused`).
    Refused(String),
    /// Randomness or the worker failed (`unavailable`).
    Unavailable(String),
    /// The ledger did not commit the change.
    Ledger(crate::ledger::WriteError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoLog => f.write_str("this node holds no trust log; run lock.init or sync one"),
            Error::Exists => f.write_str(
                "this node holds a trust log already; add signers and devices to it instead",
            ),
            Error::NoSigner(why) => write!(f, "this node has no signer key: {why}"),
            Error::Invalid(m) | Error::Refused(m) | Error::Unavailable(m) => f.write_str(m),
            Error::Ledger(e) => write!(f, "the ledger did not commit the change: {e}"),
        }
    }
}

impl From<AuthorError> for Error {
    fn from(e: AuthorError) -> Error {
        match e {
            AuthorError::KeyLength { .. }
            | AuthorError::SignerNotListed
            | AuthorError::Decode(_)
            | AuthorError::NotRevokeSigner { .. } => Error::Invalid(e.to_string()),
            other => Error::Refused(other.to_string()),
        }
    }
}

/// What a change writes and then makes true.
#[derive(Debug, Default)]
pub struct Change {
    pub log: Option<NewLog>,
    /// `Some(pin)`: the pin becomes `pin`.
    pub pin: Option<Option<Hash>>,
    pub local_disabled: Option<bool>,
    pub clear_quarantine: bool,
    /// A trust sync found a root other than this node's: quarantined,
    /// naming that genesis (seed 004, Pinning and quarantine).
    pub quarantine: Option<Hash>,
}

/// How the log held changes.
#[derive(Debug)]
pub enum NewLog {
    /// Entries that extend the tip, none of them a disable entry (they
    /// are checked again when applied, which costs one verification each).
    Append(Vec<Entry>),
    /// A verified chain that replaces the log held.
    Adopt(Chain),
}

/// What to do for an operation.
pub enum Plan {
    /// Answer now; nothing changes.
    Answer(Result<Answer, Error>),
    /// Commit the change, then answer (boxed: a change holds a chain).
    Commit(Box<Change>, Answer),
    /// Run on the lock worker; it yields the change and the answer.
    Work(Work),
}

/// Work for the lock worker thread.
pub type Work = Box<dyn FnOnce() -> Result<(Box<Change>, Answer), Error> + Send>;

/// What the start-up load read from the ledger.
#[derive(Debug, Default)]
pub struct Stored {
    /// Wire forms in chain order.
    pub entries: Vec<Vec<u8>>,
    pub pin: Option<Vec<u8>>,
    pub local_disabled: bool,
    /// `Some(seen_genesis)` when quarantined; empty when unknown.
    pub quarantined: Option<Vec<u8>>,
}

/// The start-up load, run on the lock worker: the stored log decoded and
/// verified, the signer key read or made, the identity key read.
pub struct Loaded {
    chain: Result<Option<Chain>, String>,
    pin: Option<Hash>,
    local_disabled: bool,
    quarantine: Option<Option<Hash>>,
    signer: Result<SigningKey, String>,
    identity: Option<[u8; 32]>,
}

/// Verifies what the ledger holds and reads the keys of `state_dir`. Runs
/// on the lock worker: a chain of 65,536 entries is as many signature
/// verifications, and a disable entry one Argon2id evaluation.
pub fn load(stored: Stored, state_dir: &std::path::Path) -> Loaded {
    let chain = if stored.entries.is_empty() {
        Ok(None)
    } else {
        stored
            .entries
            .iter()
            .enumerate()
            .map(|(i, w)| Entry::decode(w).map_err(|e| format!("stored trust-log entry {i}: {e}")))
            .collect::<Result<Vec<_>, _>>()
            .and_then(|es| Chain::verify(es).map_err(|e| format!("stored {e}")))
            .map(Some)
    };
    let identity = crate::e2ee::identity::load_or_create(state_dir)
        .map(|k| *k.public().as_bytes())
        .map_err(|e| crate::warn!("locked mode: {e}"))
        .ok();
    Loaded {
        chain,
        pin: stored.pin.as_deref().and_then(Hash::from_slice),
        local_disabled: stored.local_disabled,
        quarantine: stored.quarantined.map(|g| Hash::from_slice(&g)),
        signer: key::load_or_create(state_dir),
        identity,
    }
}

impl Lock {
    /// Takes what [`load`] found. A stored log that does not verify is
    /// dropped and the node quarantined (module comment).
    pub fn install(&mut self, l: Loaded) {
        if let Err(e) = &l.signer {
            crate::error!("locked mode: {e}; lock operations that sign are refused");
        }
        self.signer = l.signer;
        self.identity = l.identity;
        self.pin = l.pin;
        self.local_disabled = l.local_disabled;
        match l.quarantine {
            Some(seen) => {
                self.quarantined = true;
                self.seen_genesis = seen;
            }
            None => {
                self.quarantined = false;
                self.seen_genesis = None;
            }
        }
        match l.chain {
            Ok(c) => self.chain = c,
            Err(e) => {
                crate::error!(
                    "locked mode: {e}; the stored trust log is not used and the node is quarantined until lock.pin or lock.localDisable"
                );
                self.chain = None;
                self.quarantined = true;
                self.unusable_rows = true;
            }
        }
    }

    /// The log held, if any.
    pub fn chain(&self) -> Option<&Chain> {
        self.chain.as_ref()
    }
    pub fn pin(&self) -> Option<Hash> {
        self.pin
    }
    pub fn local_disabled(&self) -> bool {
        self.local_disabled
    }
    pub fn quarantined(&self) -> bool {
        self.quarantined
    }
    pub fn seen_genesis(&self) -> Option<Hash> {
        self.seen_genesis
    }
    /// Whether the ledger holds entries that did not verify at start.
    pub fn unusable_rows(&self) -> bool {
        self.unusable_rows
    }
    /// Locked mode is on: the node holds a log or pinned a genesis.
    pub fn locked(&self) -> bool {
        self.chain.is_some() || self.pin.is_some()
    }
    /// This node's signer public key, once loaded.
    pub fn signer_pubkey(&self) -> Option<[u8; 32]> {
        self.signer
            .as_ref()
            .ok()
            .map(|k| k.verifying_key().to_bytes())
    }
    pub fn identity_pubkey(&self) -> Option<[u8; 32]> {
        self.identity
    }
    /// Whether this node's signer key is a trusted signer of the log.
    pub fn signer_trusted(&self) -> bool {
        match (&self.chain, self.signer_pubkey()) {
            (Some(c), Some(k)) => c.state().is_signer(&k),
            _ => false,
        }
    }
    /// Whether the log authorizes this node's identity key.
    pub fn authorized(&self) -> bool {
        match (&self.chain, self.identity) {
            (Some(c), Some(k)) => c.state().is_authorized(&k),
            _ => false,
        }
    }

    fn gate(&self) -> Gate<'_> {
        Gate {
            locked: self.locked(),
            log: self.chain.as_ref().map(Chain::state),
            local_disabled: self.local_disabled,
            quarantined: self.quarantined,
        }
    }

    /// For the uplink: may a channel whose client key is `client` (`None`
    /// for a plaintext channel) open now? Checked at the end of each Noise
    /// handshake (seed 004, Enforcement).
    pub fn admit(&self, client: Option<&[u8]>) -> Result<(), Refusal> {
        self.gate().admit(client)
    }

    /// For the uplink, after each change: of the `open` channels, each
    /// with its client key (`None` if plaintext), those the node must
    /// close now ("When the log changes, the node closes channels whose
    /// client is no longer authorized"), with the reason to log.
    pub fn to_close<'a, K>(
        &self,
        open: impl IntoIterator<Item = (K, Option<&'a [u8]>)>,
    ) -> Vec<(K, Refusal)> {
        let gate = self.gate();
        open.into_iter()
            .filter_map(|(k, client)| gate.admit(client).err().map(|r| (k, r)))
            .collect()
    }

    fn signing_key(&self) -> Result<SigningKey, Error> {
        self.signer.clone().map_err(Error::NoSigner)
    }

    fn held(&self) -> Result<&Chain, Error> {
        self.chain.as_ref().ok_or(Error::NoLog)
    }

    /// What `op` does, against the committed state.
    pub fn plan(&self, op: Op) -> Plan {
        match self.plan_inner(op) {
            Ok(p) => p,
            Err(e) => Plan::Answer(Err(e)),
        }
    }

    fn plan_inner(&self, op: Op) -> Result<Plan, Error> {
        Ok(match op {
            Op::Status => Plan::Answer(Ok(Answer::Status)),
            Op::Log => Plan::Answer(Ok(Answer::Log)),
            Op::Init {
                signers,
                devices,
                disablements,
            } => {
                if self.chain.is_some() {
                    return Err(Error::Exists);
                }
                let key = self.signing_key()?;
                let signers =
                    signers.unwrap_or_else(|| vec![key.verifying_key().to_bytes().to_vec()]);
                if disablements > limits::LOCK_MAX_DISABLEMENTS {
                    return Err(Error::Invalid(format!(
                        "gen_disablements must be at most {}",
                        limits::LOCK_MAX_DISABLEMENTS
                    )));
                }
                Plan::Work(Box::new(move || init(signers, devices, disablements, &key)))
            }
            Op::Entry(kind, target) => {
                let chain = self.held()?;
                let key = self.signing_key()?;
                match author::sign_op(chain, kind, &target, &key)? {
                    None => Plan::Answer(Ok(Answer::Changed {
                        tip: chain.state().tip(),
                        changed: false,
                    })),
                    Some(e) => {
                        let tip = e.hash();
                        Plan::Commit(
                            Box::new(Change {
                                log: Some(NewLog::Append(vec![e])),
                                ..Change::default()
                            }),
                            Answer::Changed { tip, changed: true },
                        )
                    }
                }
            }
            Op::Disable(secret) => {
                let chain = self.held()?;
                let key = self.signing_key()?;
                if chain.state().disabled() {
                    return Ok(Plan::Answer(Ok(Answer::Disabled {
                        tip: chain.state().tip(),
                    })));
                }
                let mut chain = chain.clone();
                Plan::Work(Box::new(move || {
                    let e = author::disable(&chain, &secret, &key)?;
                    // Checked again by push: a second Argon2id, on this
                    // worker, for an operation made once in a log's life.
                    chain.push(e).map_err(|r| Error::Refused(r.to_string()))?;
                    let tip = chain.state().tip();
                    Ok((
                        Box::new(Change {
                            log: Some(NewLog::Adopt(chain)),
                            ..Change::default()
                        }),
                        Answer::Disabled { tip },
                    ))
                }))
            }
            Op::Pin(genesis) => Plan::Commit(
                Box::new(Change {
                    pin: Some(Some(genesis)),
                    local_disabled: Some(false),
                    clear_quarantine: true,
                    ..Change::default()
                }),
                Answer::Done,
            ),
            Op::Unpin => Plan::Commit(
                Box::new(Change {
                    pin: Some(None),
                    ..Change::default()
                }),
                Answer::Done,
            ),
            Op::LocalDisable => Plan::Commit(
                Box::new(Change {
                    local_disabled: Some(true),
                    ..Change::default()
                }),
                Answer::Done,
            ),
            Op::RevokeStart {
                revoked,
                replaces,
                fork_from,
            } => {
                let chain = self.held()?;
                let key = self.signing_key()?;
                let e = author::revoke_start(chain, revoked, replaces, fork_from, &key)?;
                Plan::Answer(Ok(Answer::Blob(e.wire().to_vec())))
            }
            Op::RevokeCosign(blob) => {
                let chain = self.held()?;
                let key = self.signing_key()?;
                let e = author::revoke_cosign(chain, &blob, &key)?;
                Plan::Answer(Ok(Answer::Blob(e.wire().to_vec())))
            }
            Op::Sync(wires) => {
                let held = self.chain.clone();
                let pin = self.pin;
                Plan::Work(Box::new(move || Ok((sync(pin, held, wires), Answer::Done))))
            }
            Op::RevokeFinish(blob) => {
                let chain = self.held()?;
                let forked = author::revoke_finish(chain, &blob)?;
                match compare(&forked, chain) {
                    Some(std::cmp::Ordering::Greater) => {}
                    Some(std::cmp::Ordering::Equal) => {
                        return Err(Error::Refused(
                            "the revoke-signer entry is in the log already".into(),
                        ));
                    }
                    _ => {
                        return Err(Error::Refused(
                            "the revocation loses fork choice against the log this node holds"
                                .into(),
                        ));
                    }
                }
                let tip = forked.state().tip();
                Plan::Commit(
                    Box::new(Change {
                        log: Some(NewLog::Adopt(forked)),
                        ..Change::default()
                    }),
                    Answer::Tip(tip),
                )
            }
        })
    }

    /// Makes a committed change true in memory. An appended entry that no
    /// longer extends the tip cannot happen (operations run one at a time
    /// against the committed state); if it did, the log held is kept and
    /// the error logged, and the ledger is read again at the next start.
    pub fn apply(&mut self, c: Change) {
        match c.log {
            Some(NewLog::Append(entries)) => {
                if let Some(chain) = &mut self.chain {
                    for e in entries {
                        if let Err(r) = chain.push(e) {
                            crate::error!("locked mode: a committed entry did not apply: {r}");
                            break;
                        }
                    }
                }
            }
            Some(NewLog::Adopt(chain)) => self.chain = Some(chain),
            None => {}
        }
        if let Some(pin) = c.pin {
            self.pin = pin;
        }
        if let Some(d) = c.local_disabled {
            self.local_disabled = d;
        }
        if c.clear_quarantine {
            self.quarantined = false;
            self.seen_genesis = None;
            self.unusable_rows = false;
        }
        if let Some(g) = c.quarantine {
            self.quarantined = true;
            self.seen_genesis = Some(g);
        }
    }

    /// `known` of a `trustlog.sync`: the hashes of the entries held, the
    /// newest [`limits::TRUSTLOG_SYNC_KNOWN_MAX`], and whether it is cut.
    pub fn known(&self) -> (Vec<Hash>, bool) {
        let held = self.chain.as_ref().map_or(&[][..], |c| c.entries());
        let skip = held.len().saturating_sub(limits::TRUSTLOG_SYNC_KNOWN_MAX);
        (held[skip..].iter().map(Entry::hash).collect(), skip > 0)
    }

    /// The wire forms of the held entries among `want` (a gateway's
    /// `want`, answered with `trustlog.push`).
    pub fn wanted(&self, want: &[Hash]) -> Vec<Vec<u8>> {
        let held = self.chain.as_ref().map_or(&[][..], |c| c.entries());
        held.iter()
            .filter(|e| want.contains(&e.hash()))
            .map(|e| e.wire().to_vec())
            .collect()
    }
}

/// A trust sync on the worker: the gateway's entries that decode, with the
/// log held, assembled into chains and decided (src/trustlog/enforce.rs,
/// `after_sync`). Entries that do not decode are left out: the gateway does
/// not verify what it relays, and one bad entry must not hide the others.
fn sync(pin: Option<Hash>, held: Option<Chain>, wires: Vec<Vec<u8>>) -> Box<Change> {
    let mut entries: Vec<Entry> = held
        .as_ref()
        .map_or_else(Vec::new, |c| c.entries().to_vec());
    // Each disable entry costs one Argon2id (64 MiB) to check, and anyone
    // can sign one: a gateway's first few are checked, the rest left out.
    let mut disables = 0;
    entries.extend(
        wires
            .iter()
            .take(limits::TRUSTLOG_MAX_CHAIN)
            .filter_map(|w| Entry::decode(w).ok())
            .filter(|e| {
                let disable = e.kind() == Kind::Disable;
                disables += usize::from(disable);
                !disable || disables <= limits::LOCK_SYNC_DISABLES
            }),
    );
    let found = crate::trustlog::fork::assemble(entries);
    let change = match crate::trustlog::enforce::after_sync(pin, held.as_ref(), &found) {
        crate::trustlog::enforce::Outcome::Adopt(chain) => Change {
            log: Some(NewLog::Adopt(chain.clone())),
            ..Change::default()
        },
        crate::trustlog::enforce::Outcome::Keep => Change::default(),
        crate::trustlog::enforce::Outcome::Quarantine { seen_genesis } => Change {
            quarantine: Some(seen_genesis),
            ..Change::default()
        },
    };
    Box::new(change)
}

/// `lock.init` on the worker: the secrets drawn, their commitments
/// computed (one Argon2id each), the genesis and device entries signed.
fn init(
    signers: Vec<Key>,
    devices: Vec<Key>,
    disablements: u32,
    key: &SigningKey,
) -> Result<(Box<Change>, Answer), Error> {
    let mut secrets = Vec::new();
    for _ in 0..disablements {
        let mut s = [0u8; limits::TRUSTLOG_SECRET_LEN];
        getrandom::fill(&mut s)
            .map_err(|e| Error::Unavailable(format!("cannot draw a disablement secret: {e}")))?;
        secrets.push(s);
    }
    let commitments = secrets
        .iter()
        .map(|s| disablement_commitment(s).to_vec())
        .collect();
    let chain = author::init(signers, &devices, commitments, key)?;
    let genesis = chain.state().genesis_hash();
    let answer = Answer::Init {
        tip: chain.state().tip(),
        signer_count: chain.state().signers().count(),
        secrets,
    };
    Ok((
        Box::new(Change {
            log: Some(NewLog::Adopt(chain)),
            pin: Some(Some(genesis)),
            local_disabled: Some(false),
            clear_quarantine: true,
            quarantine: None,
        }),
        answer,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_with_device(device: &[u8]) -> Lock {
        let key = SigningKey::from_bytes(&[7; 32]);
        let me = key.verifying_key().to_bytes().to_vec();
        let chain = author::init(vec![me], &[device.to_vec()], vec![], &key).unwrap();
        Lock {
            chain: Some(chain),
            signer: Ok(key),
            ..Lock::default()
        }
    }

    #[test]
    fn the_uplink_admits_only_what_the_log_authorizes() {
        let (ok, other) = ([1u8; 32], [2u8; 32]);
        let mut l = node_with_device(&ok);
        assert_eq!(l.admit(Some(&ok)), Ok(()));
        assert_eq!(l.admit(Some(&other)), Err(Refusal::NotAuthorized));
        assert_eq!(l.admit(None), Err(Refusal::Plaintext));
        let open = [(10, Some(&ok[..])), (11, Some(&other[..])), (12, None)];
        assert_eq!(
            l.to_close(open),
            vec![(11, Refusal::NotAuthorized), (12, Refusal::Plaintext)]
        );
        // After the device is revoked its channel closes too.
        let Plan::Commit(change, _) = l.plan(Op::Entry(Kind::RevokeDevice, ok.to_vec())) else {
            panic!("revoke writes an entry");
        };
        l.apply(*change);
        assert_eq!(l.to_close(open).len(), 3);
        // Quarantine refuses all; a local disable admits all.
        l.quarantined = true;
        assert_eq!(l.admit(Some(&ok)), Err(Refusal::Quarantined));
        let Plan::Commit(change, _) = l.plan(Op::LocalDisable) else {
            panic!("local disable is a change");
        };
        l.apply(*change);
        assert!(l.to_close(open).is_empty());
    }

    /// Runs a sync's work as the worker would and applies its change.
    fn synced(l: &mut Lock, from: &Lock) -> Box<Change> {
        let wires = from
            .chain
            .as_ref()
            .unwrap()
            .entries()
            .iter()
            .map(|e| e.wire().to_vec())
            .collect();
        let Plan::Work(work) = l.plan(Op::Sync(wires)) else {
            panic!("a sync runs on the worker");
        };
        work().unwrap().0
    }

    #[test]
    fn a_sync_adopts_the_pinned_log_quarantines_a_stranger_and_keeps_its_own() {
        let a = node_with_device(&[1u8; 32]);
        let genesis = a.chain.as_ref().unwrap().state().genesis_hash();
        // Pinned to A's genesis, holding nothing: A's log is adopted, and
        // with it A's device.
        let mut pinned = Lock {
            pin: Some(genesis),
            ..Lock::default()
        };
        let change = synced(&mut pinned, &a);
        assert!(matches!(change.log, Some(NewLog::Adopt(_))));
        pinned.apply(*change);
        assert_eq!(pinned.admit(Some(&[1u8; 32])), Ok(()));
        // No pin and no log: a log on the gateway quarantines the node,
        // naming its genesis.
        let mut bare = Lock::default();
        let change = synced(&mut bare, &a);
        assert_eq!(change.quarantine, Some(genesis));
        bare.apply(*change);
        assert_eq!(bare.admit(None), Err(Refusal::Quarantined));
        // Its own log back from the gateway changes nothing, and `known`
        // names every entry it holds; `wanted` gives back their wire forms.
        let mut same = node_with_device(&[1u8; 32]);
        let change = synced(&mut same, &a);
        assert!(change.log.is_none() && change.quarantine.is_none());
        let (known, truncated) = same.known();
        assert_eq!(known.len(), 2);
        assert!(!truncated);
        assert_eq!(same.wanted(&known[1..]).len(), 1);
    }

    #[test]
    fn a_node_without_log_or_pin_admits_every_channel() {
        let l = Lock::default();
        assert!(!l.locked());
        assert_eq!(l.admit(None), Ok(()));
        assert_eq!(l.admit(Some(&[3u8; 32])), Ok(()));
    }

    #[test]
    fn a_pinned_node_without_its_log_authorizes_no_device() {
        let Plan::Commit(change, _) = Lock::default().plan(Op::Pin(Hash([4; 32]))) else {
            panic!("pin is a change");
        };
        let mut l = Lock::default();
        l.apply(*change);
        assert!(l.locked());
        assert_eq!(l.admit(Some(&[3u8; 32])), Err(Refusal::NotAuthorized));
    }
}
