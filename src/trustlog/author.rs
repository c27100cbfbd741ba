//! Writing the log: the entries `lock.init`, `lock.sign`, `lock.revoke`,
//! `lock.addSigner`, `lock.removeSigner`, `lock.disable` and the
//! revoke-signer ceremony (`lock.revokeSignerStart`, `Cosign`, `Finish`)
//! make, as pure functions of a verified chain and this node's signing key
//! (seed 004, "Locked mode control"). The node stores what they return and
//! supplies all randomness (keys, disablement secrets).
//!
//! Keys given to these functions must be 32 bytes ("Signer and device keys
//! must be 32 bytes"); the log's own rule asks only for a non-empty Key.
//! An operation that finds its target already in the requested state
//! makes no entry (the methods answer `changed: false`).
//!
//! The ceremony: a blob is the wire form of the revoke-signer entry being
//! co-signed. Start picks the fork point (the one given, or
//! [`Chain::default_fork_point`]) and adds this node's co-sign; each
//! co-sign is checked against the state at the fork point, where the
//! final entry's co-signs will be counted: its signer must be trusted
//! there, not already have co-signed, and not be a revoked key unless
//! Replaces is set (such a co-sign would count for nothing), and the
//! co-signs already in the blob must verify, so a blob altered in transit
//! is refused at the next signer rather than at the end. Finish appends the
//! entry unchanged to the chain's prefix that ends at the fork point and
//! returns that chain; the node adopts it by fork choice
//! ([`super::fork::compare`]) like any chain it learns.

use std::fmt;

use ed25519_dalek::SigningKey;

use super::chain::{Chain, RuleError, State};
use super::entry::{
    BuildError, Content, DecodeError, Entry, Hash, KEY_LEN, Kind, verify, verifying_key,
};

/// Why an operation makes no entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthorError {
    /// A signer or device key that is not 32 bytes.
    KeyLength { len: usize },
    /// `lock.init` without this node's key among the signers.
    SignerNotListed,
    /// A kind that is not add-signer, remove-signer, authorize-device or
    /// revoke-device given to [`sign_op`].
    NotAnOperation { kind: Kind },
    /// The entry would break a chain rule.
    Rule(RuleError),
    /// The entry cannot be encoded within the decoder limits.
    Build(BuildError),
    /// A blob that does not decode.
    Decode(DecodeError),
    /// A blob that is not a revoke-signer entry.
    NotRevokeSigner { kind: Kind },
    /// The fork point is not an entry of this node's chain.
    ForkPointUnknown,
    /// This node's key was not a trusted signer at the fork point.
    NotTrustedAtFork,
    /// This node's key is revoked by the entry and Replaces is empty.
    RevokedCannotCoSign,
    /// This node's key co-signed the blob already.
    AlreadyCoSigned,
    /// A co-sign in the blob does not verify.
    BadCoSign,
}

impl AuthorError {
    /// A stable kebab-case name for programs and logs.
    pub fn code(&self) -> &'static str {
        match self {
            AuthorError::KeyLength { .. } => "trustlog-key-length",
            AuthorError::SignerNotListed => "trustlog-signer-not-listed",
            AuthorError::NotAnOperation { .. } => "trustlog-not-an-operation",
            AuthorError::Rule(r) => r.code(),
            AuthorError::Build(BuildError::Decode(d)) | AuthorError::Decode(d) => d.code(),
            AuthorError::Build(BuildError::NotRevokeSigner { .. }) => "trustlog-not-revoke-signer",
            AuthorError::NotRevokeSigner { .. } => "trustlog-not-revoke-signer",
            AuthorError::ForkPointUnknown => "trustlog-fork-point-unknown",
            AuthorError::NotTrustedAtFork => "trustlog-not-trusted-at-fork",
            AuthorError::RevokedCannotCoSign => "trustlog-revoked-cannot-cosign",
            AuthorError::AlreadyCoSigned => "trustlog-already-cosigned",
            AuthorError::BadCoSign => "trustlog-bad-cosign",
        }
    }
}

impl fmt::Display for AuthorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthorError::KeyLength { len } => write!(f, "key is {len} bytes, not {KEY_LEN}"),
            AuthorError::SignerNotListed => {
                f.write_str("this node's signer key is not among the signers")
            }
            AuthorError::NotAnOperation { kind } => {
                write!(f, "a {} entry is not a signed operation", kind.name())
            }
            AuthorError::Rule(r) => r.fmt(f),
            AuthorError::Build(b) => b.fmt(f),
            AuthorError::Decode(d) => write!(f, "blob: {d}"),
            AuthorError::NotRevokeSigner { kind } => {
                write!(f, "blob is a {} entry, not revoke-signer", kind.name())
            }
            AuthorError::ForkPointUnknown => {
                f.write_str("the fork point is not an entry of this log")
            }
            AuthorError::NotTrustedAtFork => {
                f.write_str("this node's signer key was not trusted at the fork point")
            }
            AuthorError::RevokedCannotCoSign => {
                f.write_str("a revoked signer co-signs only when the entry has replacements")
            }
            AuthorError::AlreadyCoSigned => {
                f.write_str("this node's signer key co-signed the blob already")
            }
            AuthorError::BadCoSign => f.write_str("a co-sign in the blob does not verify"),
        }
    }
}

impl std::error::Error for AuthorError {}

fn key_32(k: &[u8]) -> Result<(), AuthorError> {
    if k.len() == KEY_LEN {
        Ok(())
    } else {
        Err(AuthorError::KeyLength { len: k.len() })
    }
}

fn public(key: &SigningKey) -> Vec<u8> {
    key.verifying_key().to_bytes().to_vec()
}

fn entry_after(kind: Kind, tip: Hash, target: &[u8]) -> Content {
    Content {
        kind,
        prev: tip.0.to_vec(),
        signers: vec![],
        disablements: vec![],
        key: target.to_vec(),
        signer: vec![],
        replaces: vec![],
    }
}

/// `lock.init`: a genesis of `signers` and `commitments` signed by `key`
/// (which must be among the signers), then one authorize-device entry per
/// device, signed by `key`. Commitments are [`super::disablement_commitment`]
/// of secrets the caller drew.
pub fn init(
    signers: Vec<Vec<u8>>,
    devices: &[Vec<u8>],
    commitments: Vec<Vec<u8>>,
    key: &SigningKey,
) -> Result<Chain, AuthorError> {
    for k in signers.iter().chain(devices) {
        key_32(k)?;
    }
    if !signers.contains(&public(key)) {
        return Err(AuthorError::SignerNotListed);
    }
    let genesis = Content {
        kind: Kind::Genesis,
        prev: vec![],
        signers,
        disablements: commitments,
        key: vec![],
        signer: vec![],
        replaces: vec![],
    }
    .sign(key)
    .map_err(AuthorError::Build)?;
    let mut chain = Chain::verify(vec![genesis]).map_err(|e| AuthorError::Rule(e.rule))?;
    for d in devices {
        if let Some(e) = sign_op(&chain, Kind::AuthorizeDevice, d, key)? {
            chain.push(e).map_err(AuthorError::Rule)?;
        }
    }
    Ok(chain)
}

/// `lock.sign`, `lock.revoke`, `lock.addSigner`, `lock.removeSigner`: the
/// entry that puts `target` in the requested state, signed by `key` and
/// extending the tip; `None` when it is in that state already.
pub fn sign_op(
    chain: &Chain,
    kind: Kind,
    target: &[u8],
    key: &SigningKey,
) -> Result<Option<Entry>, AuthorError> {
    key_32(target)?;
    let s = chain.state();
    let changes = match kind {
        Kind::AuthorizeDevice => !s.is_authorized(target),
        Kind::RevokeDevice => s.is_authorized(target),
        Kind::AddSigner => !s.is_signer(target),
        Kind::RemoveSigner => s.is_signer(target),
        _ => return Err(AuthorError::NotAnOperation { kind }),
    };
    if !changes {
        return Ok(None);
    }
    let e = entry_after(kind, s.tip(), target)
        .sign(key)
        .map_err(AuthorError::Build)?;
    s.check(&e).map_err(AuthorError::Rule)?;
    Ok(Some(e))
}

/// `lock.disable`: the disable entry revealing `secret`, signed by `key`
/// (any key; the node's own), checked against the genesis commitments.
pub fn disable(chain: &Chain, secret: &[u8], key: &SigningKey) -> Result<Entry, AuthorError> {
    let e = entry_after(Kind::Disable, chain.state().tip(), secret)
        .sign(key)
        .map_err(AuthorError::Build)?;
    chain.state().check(&e).map_err(AuthorError::Rule)?;
    Ok(e)
}

/// The state at the fork point a blob names, from this node's chain.
fn state_at_fork(chain: &Chain, fork: &Hash) -> Result<State, AuthorError> {
    let n = chain.position(fork).ok_or(AuthorError::ForkPointUnknown)? + 1;
    chain.state_at(n).ok_or(AuthorError::ForkPointUnknown)
}

/// Whether the entry breaks no rule at the fork but its co-sign count.
fn check_shape(fork: &State, e: &Entry) -> Result<(), AuthorError> {
    match fork.check(e) {
        Ok(()) | Err(RuleError::NotEnoughCoSigns { .. }) => Ok(()),
        Err(r) => Err(AuthorError::Rule(r)),
    }
}

/// What every co-signer checks before adding its co-sign.
fn may_cosign(fork: &State, e: &Entry, me: &[u8]) -> Result<(), AuthorError> {
    if !fork.is_signer(me) {
        return Err(AuthorError::NotTrustedAtFork);
    }
    if e.signers().iter().any(|r| r.as_slice() == me) && e.replaces().is_empty() {
        return Err(AuthorError::RevokedCannotCoSign);
    }
    if e.cosigns().iter().any(|c| c.signer.as_slice() == me) {
        return Err(AuthorError::AlreadyCoSigned);
    }
    check_shape(fork, e)
}

/// `lock.revokeSignerStart`: the blob revoking `revoked`, adding
/// `replaces`, forking at `fork_from` or the default fork point, with this
/// node's co-sign.
pub fn revoke_start(
    chain: &Chain,
    revoked: Vec<Vec<u8>>,
    replaces: Vec<Vec<u8>>,
    fork_from: Option<Hash>,
    key: &SigningKey,
) -> Result<Entry, AuthorError> {
    for k in revoked.iter().chain(&replaces) {
        key_32(k)?;
    }
    let fork = fork_from.unwrap_or_else(|| chain.default_fork_point(&revoked));
    let state = state_at_fork(chain, &fork)?;
    let mut content = entry_after(Kind::RevokeSigner, fork, &[]);
    content.signers = revoked;
    content.replaces = replaces;
    let unsigned = Entry::assemble(content, vec![], vec![]).map_err(AuthorError::Build)?;
    may_cosign(&state, &unsigned, &public(key))?;
    let cosign = unsigned.content().cosign(key);
    unsigned.with_cosign(cosign).map_err(AuthorError::Build)
}

/// `lock.revokeSignerCosign`: the blob with this node's co-sign added.
pub fn revoke_cosign(chain: &Chain, blob: &[u8], key: &SigningKey) -> Result<Entry, AuthorError> {
    let e = decode_blob(blob)?;
    let fork = e.prev_hash().ok_or(AuthorError::ForkPointUnknown)?;
    let state = state_at_fork(chain, &fork)?;
    for c in e.cosigns() {
        let ok = verifying_key(&c.signer).is_some_and(|k| verify(&k, e.signed_bytes(), &c.sig));
        if !ok {
            return Err(AuthorError::BadCoSign);
        }
    }
    may_cosign(&state, &e, &public(key))?;
    let cosign = e.content().cosign(key);
    e.with_cosign(cosign).map_err(AuthorError::Build)
}

/// `lock.revokeSignerFinish`: this node's chain cut at the blob's fork
/// point with the entry appended unchanged, if it has enough co-signs.
pub fn revoke_finish(chain: &Chain, blob: &[u8]) -> Result<Chain, AuthorError> {
    let e = decode_blob(blob)?;
    let fork = e.prev_hash().ok_or(AuthorError::ForkPointUnknown)?;
    let mut forked = chain
        .prefix_to(&fork)
        .ok_or(AuthorError::ForkPointUnknown)?;
    forked.push(e).map_err(AuthorError::Rule)?;
    Ok(forked)
}

fn decode_blob(blob: &[u8]) -> Result<Entry, AuthorError> {
    let e = Entry::decode(blob).map_err(AuthorError::Decode)?;
    if e.kind() != Kind::RevokeSigner {
        return Err(AuthorError::NotRevokeSigner { kind: e.kind() });
    }
    Ok(e)
}
