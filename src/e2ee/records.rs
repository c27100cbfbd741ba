//! Sealed records: the body of every relay frame on an E2EE channel after
//! the handshake (seed 004, "Sealed records"), with the two keys of the
//! Noise split and ring's ChaCha20-Poly1305. snow's transport API takes no
//! associated data, so this module is the cipher state: one key and one
//! counter per direction.
//!
//! The contract, from the seed:
//! - `record = uint16_be(len(ciphertext)) || ciphertext`; each record holds
//!   at most `limits::E2EE_RECORD_MAX_PLAINTEXT` (65519) bytes of plaintext;
//! - the associated data of a record is 5 bytes: its 0-based index in the
//!   blob as `uint32_be`, then 0x01 for the last record, 0x00 otherwise;
//! - an empty message is one empty final record (the 16-byte tag alone);
//! - the nonce is 4 zero bytes and the 64-bit counter in little-endian order;
//!   every record takes the next counter value, and there is no rekey;
//! - an empty blob, and a blob whose last record is missing, are rejected;
//! - if the first record of a blob fails, the receive counter does not
//!   change and the frame is dropped ([`OpenError::closes_channel`] is
//!   false); if a later record fails, the earlier ones advanced the counter,
//!   the channel is out of sync and must be closed.
//!
//! Decisions where the seed is silent:
//! - A blob is parsed whole before anything is decrypted: a length prefix
//!   that runs past the end, a record shorter than its tag, or trailing
//!   bytes shorter than a prefix make it malformed, and a malformed blob is
//!   dropped like a failing first record (no counter moves). Only a record
//!   that fails authentication after an earlier one opened desynchronises.
//! - A non-final record shorter than 65519 bytes is accepted: the limit is
//!   on the sender, and authentication already binds every record's place.
//! - Once out of sync a channel refuses to open or seal anything more
//!   ([`OpenError::Desynced`], [`SealError::Desynced`]): nothing it could
//!   still produce would be read correctly, and the seed says to close it.
//! - The counter stops at 2^64 - 2; the value 2^64 - 1 is reserved by the
//!   Noise specification (section 5.1). A message that would need it is
//!   refused, not wrapped ([`SealError::NoncesExhausted`]).

use super::base64;
use super::keys::PublicKey;
use crate::limits::E2EE_RECORD_MAX_PLAINTEXT;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use std::fmt;

/// The Poly1305 tag that ends each record's ciphertext.
const TAG_LEN: usize = 16;
/// The `uint16_be` length before each record.
const PREFIX_LEN: usize = 2;
/// The last counter value a record may use: 2^64 - 1 is reserved.
const MAX_NONCE: u64 = u64::MAX - 1;

/// One direction of a channel: a ChaCha20-Poly1305 key and the counter of
/// the next record.
struct CipherState {
    key: LessSafeKey,
    next: u64,
}

impl CipherState {
    fn new(key: &[u8; 32]) -> Option<CipherState> {
        let key = UnboundKey::new(&CHACHA20_POLY1305, key).ok()?;
        Some(CipherState {
            key: LessSafeKey::new(key),
            next: 0,
        })
    }

    /// Whether `records` more counter values are left.
    fn has_room_for(&self, records: u64) -> bool {
        MAX_NONCE
            .checked_sub(self.next)
            .is_some_and(|left| left >= records.saturating_sub(1))
    }
}

/// "4 zero bytes, then the 64-bit message counter in little-endian order"
/// (seed 004, Noise parameters).
fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

/// The 5 bytes of associated data of record `index`.
fn associated_data(index: u32, last: bool) -> [u8; 5] {
    let i = index.to_be_bytes();
    [i[0], i[1], i[2], i[3], u8::from(last)]
}

/// An established E2EE channel: what the handshake leaves, on either side.
pub struct Channel {
    send: CipherState,
    recv: CipherState,
    peer: PublicKey,
    desynced: bool,
}

impl Channel {
    /// The channel from the two keys of the Noise split, already ordered:
    /// "the initiator encrypts with the first cipher state and decrypts
    /// with the second. The responder uses the reverse."
    pub(super) fn new(send: &[u8; 32], recv: &[u8; 32], peer: PublicKey) -> Option<Channel> {
        Some(Channel {
            send: CipherState::new(send)?,
            recv: CipherState::new(recv)?,
            peer,
            desynced: false,
        })
    }

    /// The other end's static key, proven by the handshake: the client's
    /// key on a node (what locked mode authorizes), the node's on a client.
    pub fn peer(&self) -> PublicKey {
        self.peer
    }

    /// `message` as a blob of records, advancing the send counter by the
    /// number of records.
    pub fn seal(&mut self, message: &[u8]) -> Result<Vec<u8>, SealError> {
        if self.desynced {
            return Err(SealError::Desynced);
        }
        // An empty message is one empty record; otherwise full records and
        // a shorter last one.
        let records = message.len().div_ceil(E2EE_RECORD_MAX_PLAINTEXT).max(1);
        let index_fits = u32::try_from(records - 1).is_ok();
        if !index_fits || !self.send.has_room_for(records as u64) {
            return Err(SealError::NoncesExhausted);
        }
        let mut out = Vec::with_capacity(message.len() + records * (PREFIX_LEN + TAG_LEN));
        let mut chunks = message.chunks(E2EE_RECORD_MAX_PLAINTEXT);
        for index in 0..records {
            let chunk = chunks.next().unwrap_or(&[]);
            let last = index + 1 == records;
            // At most 65519 + 16 = 65535 bytes: the prefix always fits.
            let len = (chunk.len() + TAG_LEN) as u16;
            out.extend_from_slice(&len.to_be_bytes());
            let start = out.len();
            out.extend_from_slice(chunk);
            let ad = associated_data(index as u32, last);
            let sealed = self.send.key.seal_in_place_separate_tag(
                nonce(self.send.next),
                Aad::from(ad),
                &mut out[start..],
            );
            let Ok(tag) = sealed else {
                // Earlier records of this message took counter values the
                // peer will never see: the channel cannot go on.
                if index > 0 {
                    self.desynced = true;
                }
                return Err(SealError::Cipher);
            };
            out.extend_from_slice(tag.as_ref());
            self.send.next += 1;
        }
        Ok(out)
    }

    /// `message` sealed as a relay frame's `body`: base64 of the records.
    pub fn seal_body(&mut self, message: &[u8]) -> Result<String, SealError> {
        self.seal(message).map(|blob| base64::encode(&blob))
    }

    /// The message a blob of records carries. Opens in place: the blob's
    /// buffer becomes the message.
    pub fn open(&mut self, mut blob: Vec<u8>) -> Result<Vec<u8>, OpenError> {
        if self.desynced {
            return Err(OpenError::Desynced);
        }
        if blob.is_empty() {
            return Err(OpenError::Empty);
        }
        let records = count_records(&blob)?;
        if !self.recv.has_room_for(u64::from(records)) {
            return Err(OpenError::NoncesExhausted);
        }
        let mut read = 0;
        let mut written = 0;
        for index in 0..records {
            let len = usize::from(u16::from_be_bytes([blob[read], blob[read + 1]]));
            let start = read + PREFIX_LEN;
            let end = start + len;
            let last = index + 1 == records;
            let ad = associated_data(index, last);
            let opened = self.recv.key.open_in_place(
                nonce(self.recv.next),
                Aad::from(ad),
                &mut blob[start..end],
            );
            let plain_len = match opened {
                Ok(plain) => plain.len(),
                Err(_) if index == 0 => return Err(OpenError::Rejected),
                Err(_) => {
                    self.desynced = true;
                    return Err(OpenError::Desynced);
                }
            };
            self.recv.next += 1;
            // The plaintext moves down over the prefixes and tags before it.
            blob.copy_within(start..start + plain_len, written);
            written += plain_len;
            read = end;
        }
        blob.truncate(written);
        Ok(blob)
    }

    /// The message in a relay frame's `body`.
    pub fn open_body(&mut self, body: &str) -> Result<Vec<u8>, OpenError> {
        if self.desynced {
            return Err(OpenError::Desynced);
        }
        let blob = base64::decode(body).ok_or(OpenError::NotBase64)?;
        self.open(blob)
    }
}

/// How many records `blob` holds, if its framing is whole: every prefix
/// complete, every record at least a tag, nothing left over.
fn count_records(blob: &[u8]) -> Result<u32, OpenError> {
    let mut at = 0;
    let mut count: u32 = 0;
    while at < blob.len() {
        let Some(prefix) = blob.get(at..at + PREFIX_LEN) else {
            return Err(OpenError::Malformed);
        };
        let len = usize::from(u16::from_be_bytes([prefix[0], prefix[1]]));
        if len < TAG_LEN || blob.len() - at - PREFIX_LEN < len {
            return Err(OpenError::Malformed);
        }
        at += PREFIX_LEN + len;
        count = count.checked_add(1).ok_or(OpenError::Malformed)?;
    }
    Ok(count)
}

/// Why a message could not be sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealError {
    /// The send counter has no room for the message's records.
    NoncesExhausted,
    /// The channel is out of sync; close it.
    Desynced,
    /// ring refused to seal a record (it does so only for inputs far
    /// larger than a record).
    Cipher,
}

impl SealError {
    pub fn code(&self) -> &'static str {
        match self {
            SealError::NoncesExhausted => "e2e-nonces-exhausted",
            SealError::Desynced => "e2e-channel-desynced",
            SealError::Cipher => "e2e-cipher-failed",
        }
    }
}

impl fmt::Display for SealError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SealError::NoncesExhausted => {
                write!(f, "channel has used all its nonces; open a new one")
            }
            SealError::Desynced => write!(f, "channel is out of sync; open a new one"),
            SealError::Cipher => write!(f, "chacha20-poly1305 refused to seal a record"),
        }
    }
}

impl std::error::Error for SealError {}

/// Why a body did not open. The frame is dropped without a reply in every
/// case ("If the node cannot open the body of a request, it drops the frame
/// without a reply", seed 004); [`OpenError::closes_channel`] says whether
/// the channel must be closed too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenError {
    /// The body is not standard base64 with padding. No counter moved.
    NotBase64,
    /// The blob is empty ("A receiver rejects an empty blob"). No counter
    /// moved.
    Empty,
    /// The record framing is broken: a prefix or record runs past the end,
    /// or a record is shorter than its tag. No counter moved.
    Malformed,
    /// The first record failed to open (a replay, a reordered or altered
    /// frame, a missing last record): no counter moved.
    Rejected,
    /// A later record failed after earlier ones opened, or the channel was
    /// out of sync already: close the channel.
    Desynced,
    /// The receive counter has no room for the blob's records: close the
    /// channel.
    NoncesExhausted,
}

impl OpenError {
    /// Whether the channel is unusable now and must be closed.
    pub fn closes_channel(&self) -> bool {
        matches!(self, OpenError::Desynced | OpenError::NoncesExhausted)
    }

    pub fn code(&self) -> &'static str {
        match self {
            OpenError::NotBase64 => "e2e-body-not-base64",
            OpenError::Empty => "e2e-body-empty",
            OpenError::Malformed => "e2e-record-malformed",
            OpenError::Rejected => "e2e-record-rejected",
            OpenError::Desynced => "e2e-channel-desynced",
            OpenError::NoncesExhausted => "e2e-nonces-exhausted",
        }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::NotBase64 => write!(f, "body is not standard base64 with padding"),
            OpenError::Empty => write!(f, "body holds no record"),
            OpenError::Malformed => write!(f, "body's record framing is broken"),
            OpenError::Rejected => write!(f, "first record of the body does not open"),
            OpenError::Desynced => write!(f, "channel is out of sync; open a new one"),
            OpenError::NoncesExhausted => {
                write!(f, "channel has used all its nonces; open a new one")
            }
        }
    }
}

impl std::error::Error for OpenError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Channel, Channel) {
        let (k1, k2) = ([1u8; 32], [2u8; 32]);
        let peer = PublicKey::from_bytes([9; 32]);
        (
            Channel::new(&k1, &k2, peer).unwrap(),
            Channel::new(&k2, &k1, peer).unwrap(),
        )
    }

    #[test]
    fn counters_stop_before_the_reserved_nonce() {
        let (mut a, mut b) = pair();
        a.send.next = MAX_NONCE;
        b.recv.next = MAX_NONCE;
        // One record fits (counter 2^64 - 2), two do not.
        let two = vec![0u8; E2EE_RECORD_MAX_PLAINTEXT + 1];
        assert_eq!(a.seal(&two), Err(SealError::NoncesExhausted));
        let last = a.seal(b"x").unwrap();
        assert_eq!(b.open(last).unwrap(), b"x");
        assert_eq!(a.seal(b"y"), Err(SealError::NoncesExhausted));
        assert_eq!(
            b.open(vec![0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(OpenError::NoncesExhausted)
        );
    }

    #[test]
    fn the_nonce_is_zero_bytes_then_the_counter_little_endian() {
        let n = nonce(0x0102_0304_0506_0708);
        assert_eq!(n.as_ref(), &[0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(
            associated_data(0x0a0b_0c0d, true),
            [0x0a, 0x0b, 0x0c, 0x0d, 1]
        );
        assert_eq!(associated_data(1, false), [0, 0, 0, 1, 0]);
    }
}
