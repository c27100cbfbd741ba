//! Curve25519 keys of E2EE relay channels (seed 004, "Keys"): the node's
//! identity (a static key pair it stores), a client's static key, and the
//! public keys each side names the other by. "Curve25519 keys are 32 bytes";
//! their text form is standard base64.
//!
//! A private key is 32 bytes from the kernel's random source (getrandom),
//! kept unclamped as Noise implementations store them; X25519 clamps at use.
//! The public key is derived with the same X25519 that the handshake runs
//! (snow's), so the key a node reports is the key its handshakes prove.
//!
//! Low-order points are refused as peer keys: X25519 with any clamped
//! scalar maps them to zero, so a session "authenticated" by such a key
//! would be readable by anyone (a gateway that swapped a roster key for one
//! would learn every session key). The check is one scalar multiplication.

use snow::params::DHChoice;
use snow::resolvers::{CryptoResolver, DefaultResolver};
use snow::types::Dh;
use std::fmt;

/// Bytes in a Curve25519 key, private or public.
pub const KEY_LEN: usize = 32;

/// A Curve25519 public key: the node's identity as reported in
/// `node.identify`, or a client's static key read from message 1.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey([u8; KEY_LEN]);

impl PublicKey {
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> PublicKey {
        PublicKey(bytes)
    }

    /// The key from its base64 text, as `identity_pubkey` carries it.
    pub fn from_base64(text: &str) -> Result<PublicKey, KeyError> {
        let bytes = super::base64::decode(text).ok_or(KeyError::NotBase64)?;
        let bytes: [u8; KEY_LEN] = bytes
            .try_into()
            .map_err(|b: Vec<u8>| KeyError::Length(b.len()))?;
        Ok(PublicKey(bytes))
    }

    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// Standard base64 with padding (44 characters).
    pub fn to_base64(&self) -> String {
        super::base64::encode(&self.0)
    }

    /// Whether X25519 maps this point to zero for every clamped scalar: one
    /// of the small-order points, which authenticate nothing.
    pub fn is_low_order(&self) -> bool {
        // Any clamped scalar is a multiple of the cofactor 8, which sends
        // every point of order 1, 2, 4 or 8 to the identity (encoded as 0).
        let Some(mut dh) = x25519() else {
            return true;
        };
        dh.set(&[0x55; KEY_LEN]);
        let mut out = [0u8; KEY_LEN];
        if dh.dh(&self.0, &mut out).is_err() {
            return true;
        }
        out.iter().all(|&b| b == 0)
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_base64())
    }
}

/// A static key pair: the node's identity or a client's key.
pub struct StaticKey {
    private: [u8; KEY_LEN],
    public: PublicKey,
}

impl StaticKey {
    /// A new key pair from the kernel's random source.
    pub fn generate() -> Result<StaticKey, KeyError> {
        let mut private = [0u8; KEY_LEN];
        getrandom::fill(&mut private).map_err(|e| KeyError::Random(e.to_string()))?;
        StaticKey::from_private(private)
    }

    /// The pair for a stored private key.
    pub fn from_private(private: [u8; KEY_LEN]) -> Result<StaticKey, KeyError> {
        let mut dh = x25519().ok_or(KeyError::NoX25519)?;
        dh.set(&private);
        let public: [u8; KEY_LEN] = dh
            .pubkey()
            .try_into()
            .map_err(|_| KeyError::Length(dh.pubkey().len()))?;
        Ok(StaticKey {
            private,
            public: PublicKey(public),
        })
    }

    pub fn public(&self) -> PublicKey {
        self.public
    }

    /// The private key, for the Noise handshake and the identity file only.
    pub(super) fn private_bytes(&self) -> &[u8; KEY_LEN] {
        &self.private
    }
}

impl fmt::Debug for StaticKey {
    // Never the private half, not even in a log line or a failed assertion.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StaticKey {{ public: {} }}", self.public.to_base64())
    }
}

/// snow's X25519, the one the handshake runs.
fn x25519() -> Option<Box<dyn Dh>> {
    DefaultResolver.resolve_dh(&DHChoice::Curve25519)
}

/// Why a key could not be made or read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The kernel's random source failed.
    Random(String),
    /// The build has no X25519 (a snow feature is missing).
    NoX25519,
    /// The text is not standard base64 with padding.
    NotBase64,
    /// The key decodes to this many bytes, not 32.
    Length(usize),
}

impl KeyError {
    pub fn code(&self) -> &'static str {
        match self {
            KeyError::Random(_) => "e2e-random-failed",
            KeyError::NoX25519 => "e2e-no-x25519",
            KeyError::NotBase64 | KeyError::Length(_) => "e2e-key-invalid",
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Random(e) => write!(f, "cannot read random bytes for a key: {e}"),
            KeyError::NoX25519 => write!(f, "this build has no x25519"),
            KeyError::NotBase64 => write!(f, "key is not standard base64 with padding"),
            KeyError::Length(n) => write!(f, "key is {n} bytes, not {KEY_LEN}"),
        }
    }
}

impl std::error::Error for KeyError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc7748_public_key_from_private() {
        // RFC 7748, section 6.1: Alice's private and public keys.
        let private: [u8; 32] =
            hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
        let public = hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
        let key = StaticKey::from_private(private).unwrap();
        assert_eq!(key.public().as_bytes(), &public);
        let text = key.public().to_base64();
        assert_eq!(text.len(), 44);
        assert_eq!(PublicKey::from_base64(&text), Ok(key.public()));
        assert!(!key.public().is_low_order());
        assert!(
            !format!("{key:?}").contains("dwdt"),
            "no private bytes in Debug"
        );
    }

    #[test]
    fn generated_keys_differ_and_text_form_is_checked() {
        let a = StaticKey::generate().unwrap();
        let b = StaticKey::generate().unwrap();
        assert_ne!(a.public(), b.public());
        assert_eq!(PublicKey::from_base64("Zm9v"), Err(KeyError::Length(3)));
        assert_eq!(
            PublicKey::from_base64("not base64"),
            Err(KeyError::NotBase64)
        );
        assert_eq!(KeyError::Length(3).code(), "e2e-key-invalid");
    }

    #[test]
    fn small_order_points_are_low_order() {
        // 0 and 1, and the order-8 point from the libsodium blocklist.
        let mut one = [0u8; 32];
        one[0] = 1;
        let order8 = hex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800");
        for p in [[0u8; 32], one, order8] {
            assert!(PublicKey::from_bytes(p).is_low_order());
        }
    }

    fn hex(s: &str) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }
}
