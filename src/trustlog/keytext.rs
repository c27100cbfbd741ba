//! Keys, hashes and secrets in text form (seed 004, Locked mode, "Pinning
//! and quarantine": "Keys in text form use a prefix and 64 hex
//! characters: sigpub:, devpub:, gen:, dis:, and tip:"). Printed in lower
//! case; parsed in either case, since people copy them between screens.
//! A text with another prefix than the one expected is refused, so a
//! device key is never taken for a signer key by mistake.

use std::fmt;

use super::entry::KEY_LEN;

/// What a text form names, by its prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyText {
    /// `sigpub:` a signer's Ed25519 public key.
    SignerPub,
    /// `devpub:` a device's public key.
    DevicePub,
    /// `gen:` a genesis hash.
    Genesis,
    /// `dis:` a disablement secret.
    Disablement,
    /// `tip:` a tip hash.
    Tip,
}

impl KeyText {
    pub fn prefix(self) -> &'static str {
        match self {
            KeyText::SignerPub => "sigpub:",
            KeyText::DevicePub => "devpub:",
            KeyText::Genesis => "gen:",
            KeyText::Disablement => "dis:",
            KeyText::Tip => "tip:",
        }
    }

    /// The text form of 32 bytes.
    pub fn format(self, bytes: &[u8; KEY_LEN]) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(self.prefix().len() + 2 * KEY_LEN);
        s.push_str(self.prefix());
        for b in bytes {
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 15)]));
        }
        s
    }

    /// The 32 bytes of a text form with this prefix.
    pub fn parse(self, text: &str) -> Result<[u8; KEY_LEN], KeyTextError> {
        let Some(hex) = text.strip_prefix(self.prefix()) else {
            return Err(KeyTextError::Prefix { expected: self });
        };
        let hex = hex.as_bytes();
        if hex.len() != 2 * KEY_LEN {
            return Err(KeyTextError::Length {
                expected: self,
                len: hex.len(),
            });
        }
        let mut out = [0u8; KEY_LEN];
        for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
            let (Some(hi), Some(lo)) = (nibble(pair[0]), nibble(pair[1])) else {
                return Err(KeyTextError::NotHex { expected: self });
            };
            *o = hi << 4 | lo;
        }
        Ok(out)
    }
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Why a text is not the key form expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyTextError {
    Prefix { expected: KeyText },
    Length { expected: KeyText, len: usize },
    NotHex { expected: KeyText },
}

impl KeyTextError {
    pub fn code(&self) -> &'static str {
        "trustlog-bad-key-text"
    }
}

impl fmt::Display for KeyTextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyTextError::Prefix { expected } => {
                write!(f, "key text does not start with {}", expected.prefix())
            }
            KeyTextError::Length { expected, len } => write!(
                f,
                "key text after {} has {len} characters, not 64",
                expected.prefix()
            ),
            KeyTextError::NotHex { expected } => {
                write!(f, "key text after {} is not hexadecimal", expected.prefix())
            }
        }
    }
}

impl std::error::Error for KeyTextError {}
