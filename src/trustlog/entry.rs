//! One trust-log entry: its kinds, its signed bytes and wire form, the
//! decoder with its limits, its BLAKE2s-256 hash and its Ed25519
//! signatures (seed 004, Locked mode, "Entry encoding").
//!
//! An [`Entry`] exists only in a form that decodes: it is built by
//! [`Entry::decode`], or by encoding a [`Content`] with its signature and
//! decoding the result, so its wire bytes, its fields and its hash always
//! agree and it always fits the decoder limits. Canonical form: the decoder
//! refuses co-signs that are not in strictly increasing (signer, signature)
//! order, so one set of co-signs has one wire form and one hash, and a relay
//! cannot grind an entry's hash by reordering them; the same pair twice is
//! refused for the same reason.

use std::cmp::Ordering;
use std::fmt;

use blake2::{Blake2s256, Digest};
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};

use crate::limits::{TRUSTLOG_MAX_CHAIN, TRUSTLOG_MAX_FIELD, TRUSTLOG_MAX_LIST};

/// Ed25519 public keys and BLAKE2s-256 hashes are this long.
pub const KEY_LEN: usize = 32;
/// Ed25519 signatures are this long.
pub const SIG_LEN: usize = 64;

/// The kinds of entry, with their wire values (seed 004, the kind table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Genesis = 1,
    AddSigner = 2,
    RemoveSigner = 3,
    AuthorizeDevice = 4,
    RevokeDevice = 5,
    Disable = 6,
    RevokeSigner = 7,
}

impl Kind {
    pub fn from_byte(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Genesis,
            2 => Kind::AddSigner,
            3 => Kind::RemoveSigner,
            4 => Kind::AuthorizeDevice,
            5 => Kind::RevokeDevice,
            6 => Kind::Disable,
            7 => Kind::RevokeSigner,
            _ => return None,
        })
    }

    /// The name `lock.log` gives the kind (seed 004, LockLogEntry).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Genesis => "genesis",
            Kind::AddSigner => "add-signer",
            Kind::RemoveSigner => "remove-signer",
            Kind::AuthorizeDevice => "authorize-device",
            Kind::RevokeDevice => "revoke-device",
            Kind::Disable => "disable",
            Kind::RevokeSigner => "revoke-signer",
        }
    }

    /// remove-signer and revoke-signer: preferred on a fork-choice tie.
    pub fn is_removal(self) -> bool {
        matches!(self, Kind::RemoveSigner | Kind::RevokeSigner)
    }
}

/// A BLAKE2s-256 entry hash. Ordered bytewise, as fork choice's last rule
/// ("the lower entry hash wins") compares them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hash(pub [u8; KEY_LEN]);

impl Hash {
    /// A hash from bytes of any length: `None` unless exactly 32.
    pub fn from_slice(b: &[u8]) -> Option<Hash> {
        b.try_into().ok().map(Hash)
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..6] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…")
    }
}

/// What an entry's signature covers: every field but the signature and
/// the co-signs. `replaces` exists only on revoke-signer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Content {
    pub kind: Kind,
    pub prev: Vec<u8>,
    pub signers: Vec<Vec<u8>>,
    pub disablements: Vec<Vec<u8>>,
    pub key: Vec<u8>,
    pub signer: Vec<u8>,
    pub replaces: Vec<Vec<u8>>,
}

/// One signer's signature over a revoke-signer entry's signed bytes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CoSign {
    pub signer: Vec<u8>,
    pub sig: Vec<u8>,
}

/// A decoded entry with its wire form and hash.
#[derive(Clone, Debug)]
pub struct Entry {
    content: Content,
    sig: Vec<u8>,
    cosigns: Vec<CoSign>,
    /// Where the signed bytes end in `wire`.
    signed_len: usize,
    wire: Vec<u8>,
    hash: Hash,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Entry) -> bool {
        self.wire == other.wire
    }
}
impl Eq for Entry {}

/// Why bytes are not an entry or a chain. Offsets count from the start of
/// the entry (or of the chain, for the chain's own count and fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The bytes end inside a kind, length, count or field.
    Truncated { at: usize },
    /// The kind byte is not 1 to 7.
    UnknownKind { kind: u8 },
    /// A field is longer than 1 MiB.
    FieldTooLong { at: usize, len: u64 },
    /// A list holds more than 4096 items.
    TooManyItems { at: usize, count: u64 },
    /// A chain holds more than 65536 entries.
    TooManyEntries { count: u64 },
    /// An entry's wire form is longer than 1 MiB.
    EntryTooLong { len: usize },
    /// Bytes follow the last field.
    TrailingBytes { at: usize },
    /// Co-sign `index` does not sort strictly after the one before it.
    CoSignsUnsorted { index: usize },
    /// Entry `index` of a chain does not decode.
    InChain {
        index: usize,
        error: Box<DecodeError>,
    },
}

impl DecodeError {
    /// A stable kebab-case name for programs and logs.
    pub fn code(&self) -> &'static str {
        match self {
            DecodeError::Truncated { .. } => "trustlog-truncated",
            DecodeError::UnknownKind { .. } => "trustlog-unknown-kind",
            DecodeError::FieldTooLong { .. } => "trustlog-field-too-long",
            DecodeError::TooManyItems { .. } => "trustlog-too-many-items",
            DecodeError::TooManyEntries { .. } => "trustlog-too-many-entries",
            DecodeError::EntryTooLong { .. } => "trustlog-entry-too-long",
            DecodeError::TrailingBytes { .. } => "trustlog-trailing-bytes",
            DecodeError::CoSignsUnsorted { .. } => "trustlog-cosigns-unsorted",
            DecodeError::InChain { error, .. } => error.code(),
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { at } => write!(f, "trust-log entry ends early at byte {at}"),
            DecodeError::UnknownKind { kind } => {
                write!(f, "trust-log entry has unknown kind {kind}")
            }
            DecodeError::FieldTooLong { at, len } => write!(
                f,
                "trust-log field at byte {at} is {len} bytes, over the limit of {TRUSTLOG_MAX_FIELD}"
            ),
            DecodeError::TooManyItems { at, count } => write!(
                f,
                "trust-log list at byte {at} has {count} items, over the limit of {TRUSTLOG_MAX_LIST}"
            ),
            DecodeError::TooManyEntries { count } => write!(
                f,
                "trust-log chain has {count} entries, over the limit of {TRUSTLOG_MAX_CHAIN}"
            ),
            DecodeError::EntryTooLong { len } => write!(
                f,
                "trust-log entry is {len} bytes, over the limit of {TRUSTLOG_MAX_FIELD}"
            ),
            DecodeError::TrailingBytes { at } => {
                write!(f, "trust-log bytes continue after the end at byte {at}")
            }
            DecodeError::CoSignsUnsorted { index } => write!(
                f,
                "trust-log co-sign {index} is not sorted after the one before it"
            ),
            DecodeError::InChain { index, error } => {
                write!(f, "trust-log chain entry {index}: {error}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Why a content cannot be made into an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildError {
    /// Replaces or co-signs on a kind that has none in its wire form.
    NotRevokeSigner { kind: Kind },
    /// The result would not decode (a limit is exceeded).
    Decode(DecodeError),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NotRevokeSigner { kind } => {
                write!(f, "a {} entry carries no replaces or co-signs", kind.name())
            }
            BuildError::Decode(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for BuildError {}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    // Every length and count written here was checked against the decoder
    // limits (all far below u32::MAX) before it is encoded, or is refused
    // by the decode that follows; saturate rather than wrap regardless.
    let n = u32::try_from(n).unwrap_or(u32::MAX);
    out.extend_from_slice(&n.to_be_bytes());
}

fn put_field(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len());
    out.extend_from_slice(b);
}

fn put_list(out: &mut Vec<u8>, items: &[Vec<u8>]) {
    put_u32(out, items.len());
    for i in items {
        put_field(out, i);
    }
}

impl Content {
    /// The signed bytes (seed 004): kind, Prev, Signers, Disablements, Key,
    /// Signer, and for revoke-signer Replaces.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.prev.len() + self.key.len());
        out.push(self.kind as u8);
        put_field(&mut out, &self.prev);
        put_list(&mut out, &self.signers);
        put_list(&mut out, &self.disablements);
        put_field(&mut out, &self.key);
        put_field(&mut out, &self.signer);
        if self.kind == Kind::RevokeSigner {
            put_list(&mut out, &self.replaces);
        }
        out
    }

    /// Signs with `key`, which becomes the Signer: every kind but
    /// revoke-signer is made this way.
    pub fn sign(mut self, key: &SigningKey) -> Result<Entry, BuildError> {
        self.signer = key.verifying_key().to_bytes().to_vec();
        let sig = key.sign(&self.signed_bytes()).to_bytes().to_vec();
        Entry::assemble(self, sig, Vec::new())
    }

    /// `key`'s co-sign over these signed bytes (revoke-signer).
    pub fn cosign(&self, key: &SigningKey) -> CoSign {
        CoSign {
            signer: key.verifying_key().to_bytes().to_vec(),
            sig: key.sign(&self.signed_bytes()).to_bytes().to_vec(),
        }
    }
}

/// Reads the wire grammar with the decoder limits. Every read checks the
/// bytes left first, so no input makes it index out of bounds or allocate
/// more than the input's own length.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn u8(&mut self) -> Result<u8, DecodeError> {
        let v = *self
            .b
            .get(self.at)
            .ok_or(DecodeError::Truncated { at: self.at })?;
        self.at += 1;
        Ok(v)
    }

    fn u32(&mut self) -> Result<u64, DecodeError> {
        let end = self.at.checked_add(4).filter(|e| *e <= self.b.len());
        let Some(end) = end else {
            return Err(DecodeError::Truncated { at: self.at });
        };
        let mut n = [0u8; 4];
        n.copy_from_slice(&self.b[self.at..end]);
        self.at = end;
        Ok(u64::from(u32::from_be_bytes(n)))
    }

    fn field(&mut self) -> Result<&'a [u8], DecodeError> {
        let at = self.at;
        let len = self.u32()?;
        if len > TRUSTLOG_MAX_FIELD as u64 {
            return Err(DecodeError::FieldTooLong { at, len });
        }
        let len = len as usize;
        if self.b.len() - self.at < len {
            return Err(DecodeError::Truncated { at: self.b.len() });
        }
        let v = &self.b[self.at..self.at + len];
        self.at += len;
        Ok(v)
    }

    fn count(&mut self, max: usize) -> Result<usize, DecodeError> {
        let at = self.at;
        let count = self.u32()?;
        if count > max as u64 {
            return Err(DecodeError::TooManyItems { at, count });
        }
        Ok(count as usize)
    }

    fn list(&mut self) -> Result<Vec<Vec<u8>>, DecodeError> {
        let n = self.count(TRUSTLOG_MAX_LIST)?;
        // Each item takes at least its 4-byte length: never reserve more
        // than the bytes left could hold.
        let mut v = Vec::with_capacity(n.min((self.b.len() - self.at) / 4));
        for _ in 0..n {
            v.push(self.field()?.to_vec());
        }
        Ok(v)
    }
}

impl Entry {
    /// Decodes one entry's wire form, refusing unknown kinds, lengths and
    /// counts over the limits, unsorted co-signs and trailing bytes.
    pub fn decode(wire: &[u8]) -> Result<Entry, DecodeError> {
        if wire.len() > TRUSTLOG_MAX_FIELD {
            return Err(DecodeError::EntryTooLong { len: wire.len() });
        }
        let mut r = Reader { b: wire, at: 0 };
        let kind_byte = r.u8()?;
        let kind =
            Kind::from_byte(kind_byte).ok_or(DecodeError::UnknownKind { kind: kind_byte })?;
        let prev = r.field()?.to_vec();
        let signers = r.list()?;
        let disablements = r.list()?;
        let key = r.field()?.to_vec();
        let signer = r.field()?.to_vec();
        let replaces = if kind == Kind::RevokeSigner {
            r.list()?
        } else {
            Vec::new()
        };
        let signed_len = r.at;
        let sig = r.field()?.to_vec();
        let mut cosigns: Vec<CoSign> = Vec::new();
        if kind == Kind::RevokeSigner {
            let n = r.count(TRUSTLOG_MAX_LIST)?;
            cosigns.reserve(n.min((wire.len() - r.at) / 8));
            for index in 0..n {
                let c = CoSign {
                    signer: r.field()?.to_vec(),
                    sig: r.field()?.to_vec(),
                };
                if cosigns.last().is_some_and(|p| p.cmp(&c) != Ordering::Less) {
                    return Err(DecodeError::CoSignsUnsorted { index });
                }
                cosigns.push(c);
            }
        }
        if r.at != wire.len() {
            return Err(DecodeError::TrailingBytes { at: r.at });
        }
        Ok(Entry {
            content: Content {
                kind,
                prev,
                signers,
                disablements,
                key,
                signer,
                replaces,
            },
            sig,
            cosigns,
            signed_len,
            hash: Hash(Blake2s256::digest(wire).into()),
            wire: wire.to_vec(),
        })
    }

    /// Encodes `content` with its signature and co-signs (sorted here) and
    /// decodes the result, so that what is built is what a peer decodes.
    pub fn assemble(
        content: Content,
        sig: Vec<u8>,
        mut cosigns: Vec<CoSign>,
    ) -> Result<Entry, BuildError> {
        if content.kind != Kind::RevokeSigner
            && !(content.replaces.is_empty() && cosigns.is_empty())
        {
            return Err(BuildError::NotRevokeSigner { kind: content.kind });
        }
        let mut wire = content.signed_bytes();
        put_field(&mut wire, &sig);
        if content.kind == Kind::RevokeSigner {
            cosigns.sort();
            cosigns.dedup();
            put_u32(&mut wire, cosigns.len());
            for c in &cosigns {
                put_field(&mut wire, &c.signer);
                put_field(&mut wire, &c.sig);
            }
        }
        Entry::decode(&wire).map_err(BuildError::Decode)
    }

    /// The same entry with one more co-sign (a revoke-signer blob passing
    /// from signer to signer).
    pub fn with_cosign(&self, cosign: CoSign) -> Result<Entry, BuildError> {
        let mut cosigns = self.cosigns.clone();
        cosigns.push(cosign);
        Entry::assemble(self.content.clone(), self.sig.clone(), cosigns)
    }

    pub fn content(&self) -> &Content {
        &self.content
    }
    pub fn kind(&self) -> Kind {
        self.content.kind
    }
    pub fn prev(&self) -> &[u8] {
        &self.content.prev
    }
    pub fn signers(&self) -> &[Vec<u8>] {
        &self.content.signers
    }
    pub fn disablements(&self) -> &[Vec<u8>] {
        &self.content.disablements
    }
    pub fn key(&self) -> &[u8] {
        &self.content.key
    }
    pub fn signer(&self) -> &[u8] {
        &self.content.signer
    }
    pub fn replaces(&self) -> &[Vec<u8>] {
        &self.content.replaces
    }
    pub fn sig(&self) -> &[u8] {
        &self.sig
    }
    pub fn cosigns(&self) -> &[CoSign] {
        &self.cosigns
    }
    /// The signed bytes, as they sit at the start of the wire form.
    pub fn signed_bytes(&self) -> &[u8] {
        &self.wire[..self.signed_len]
    }
    pub fn wire(&self) -> &[u8] {
        &self.wire
    }
    /// BLAKE2s-256 over the wire form.
    pub fn hash(&self) -> Hash {
        self.hash
    }
    /// Prev as a hash; `None` when empty (genesis) or not 32 bytes long.
    pub fn prev_hash(&self) -> Option<Hash> {
        Hash::from_slice(&self.content.prev)
    }
}

/// A parsed Ed25519 public key, or `None` for bytes that are not one.
/// Parsing decompresses a curve point, so callers keep the result for
/// keys they use again (trusted signers).
pub fn verifying_key(bytes: &[u8]) -> Option<VerifyingKey> {
    let b: &[u8; KEY_LEN] = bytes.try_into().ok()?;
    VerifyingKey::from_bytes(b).ok()
}

/// Strict Ed25519 verification of `sig` over `msg`: refuses small-order
/// keys and non-canonical signatures, so a signature cannot be altered
/// into another valid one (which would change the entry's hash).
pub fn verify(key: &VerifyingKey, msg: &[u8], sig: &[u8]) -> bool {
    let Ok(sig) = <&[u8; SIG_LEN]>::try_from(sig) else {
        return false;
    };
    key.verify_strict(msg, &Signature::from_bytes(sig)).is_ok()
}

/// The chain form: uint32(count), then field(entry wire form) for each.
pub fn encode_chain<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Vec<u8> {
    let mut out = vec![0u8; 4];
    let mut n = 0usize;
    for e in entries {
        put_field(&mut out, e.wire());
        n += 1;
    }
    let n = u32::try_from(n).unwrap_or(u32::MAX);
    out[..4].copy_from_slice(&n.to_be_bytes());
    out
}

/// Decodes a chain's file form: at most 65536 entries, each a field of at
/// most 1 MiB that decodes as an entry, nothing after the last.
pub fn decode_chain(b: &[u8]) -> Result<Vec<Entry>, DecodeError> {
    let mut r = Reader { b, at: 0 };
    let count = r.u32()?;
    if count > TRUSTLOG_MAX_CHAIN as u64 {
        return Err(DecodeError::TooManyEntries { count });
    }
    let count = count as usize;
    let mut out = Vec::with_capacity(count.min(b.len() / 4));
    for index in 0..count {
        let field = r.field()?;
        let e = Entry::decode(field).map_err(|error| DecodeError::InChain {
            index,
            error: Box::new(error),
        })?;
        out.push(e);
    }
    if r.at != b.len() {
        return Err(DecodeError::TrailingBytes { at: r.at });
    }
    Ok(out)
}
