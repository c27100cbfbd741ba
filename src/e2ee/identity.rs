//! The node's identity key on disk (seed 004, Keys: "node identity,
//! Curve25519, stored by the node"; issue 13: "generated at first start,
//! stored 0600 in the state directory, reported base64"). The only file I/O
//! of src/e2ee/, kept here so that the handshake and records stay pure.
//!
//! The file is `e2ee-identity.key` in the directory given (the daemon's
//! state directory): the private key as standard base64 and a newline, mode
//! 0600, kept by the rules of src/secret_file.rs (made once, never
//! replaced, refused when others may read it). Clients know a node by this
//! key (the roster, the trust log), so a silent new key would break every
//! one of them, and a key others could read may be known to them. The
//! operator fixes the mode (`chmod 600`) or removes the file to make a new
//! identity.

use super::base64;
use super::keys::{KEY_LEN, KeyError, StaticKey};
use crate::secret_file::{self, SecretFileError};
use std::fmt;
use std::path::{Path, PathBuf};

/// The identity file's name in the state directory.
pub const IDENTITY_FILE: &str = "e2ee-identity.key";

/// The line's exact length: 44 base64 characters.
const LINE_LEN: usize = KEY_LEN.div_ceil(3) * 4;

/// The identity stored in `dir`, made and stored first if there is none.
pub fn load_or_create(dir: &Path) -> Result<StaticKey, IdentityError> {
    let line = secret_file::load_or_create(dir, IDENTITY_FILE, LINE_LEN, || {
        StaticKey::generate()
            .map(|k| base64::encode(k.private_bytes()))
            .map_err(|e| e.to_string())
    })
    .map_err(|e| match e {
        SecretFileError::Io {
            path,
            action,
            error,
        } => IdentityError::Io {
            path,
            action,
            error,
        },
        SecretFileError::Permissions { path, mode } => IdentityError::Permissions { path, mode },
        SecretFileError::Malformed { path } => IdentityError::Malformed { path },
        SecretFileError::Make(why) => IdentityError::Key(KeyError::Random(why)),
    })?;
    let private: [u8; KEY_LEN] = base64::decode(&line)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| IdentityError::Malformed {
            path: dir.join(IDENTITY_FILE),
        })?;
    StaticKey::from_private(private).map_err(IdentityError::Key)
}

/// Why the identity could not be loaded or stored.
#[derive(Debug)]
pub enum IdentityError {
    /// A file operation failed.
    Io {
        path: PathBuf,
        action: &'static str,
        error: std::io::Error,
    },
    /// Not a regular file, or group or others may read or write it.
    Permissions { path: PathBuf, mode: u32 },
    /// The file does not hold one base64 key and a newline.
    Malformed { path: PathBuf },
    /// No key could be made.
    Key(KeyError),
}

impl IdentityError {
    pub fn code(&self) -> &'static str {
        match self {
            IdentityError::Io { .. } => "e2e-identity-io",
            IdentityError::Permissions { .. } => "e2e-identity-permissions",
            IdentityError::Malformed { .. } => "e2e-identity-malformed",
            IdentityError::Key(e) => e.code(),
        }
    }
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentityError::Io {
                path,
                action,
                error,
            } => write!(
                f,
                "cannot {action} identity key {}: {error}",
                path.display()
            ),
            IdentityError::Permissions { path, mode } => write!(
                f,
                "identity key {} must be a regular file of mode 0600, not {:o} (chmod 600 it, or remove it to make a new identity)",
                path.display(),
                mode & 0o7777
            ),
            IdentityError::Malformed { path } => write!(
                f,
                "identity key {} does not hold one base64 key (remove it to make a new identity)",
                path.display()
            ),
            IdentityError::Key(e) => write!(f, "cannot make an identity key: {e}"),
        }
    }
}

impl std::error::Error for IdentityError {}
