//! The node's identity key on disk (seed 004, Keys: "node identity,
//! Curve25519, stored by the node"; issue 13: "generated at first start,
//! stored 0600 in the state directory, reported base64"). The only file I/O
//! of src/e2ee/, kept here so that the handshake and records stay pure.
//!
//! The file is `e2ee-identity.key` in the directory given (the daemon's
//! state directory): the private key as standard base64 and a newline, mode
//! 0600. Decisions:
//! - A missing file is created: written to a random temporary name with
//!   `O_EXCL`, synced, then hard-linked to its name, which fails if another
//!   process got there first; the loser reads the winner's key. So two
//!   starts never end with two identities, and a crash never leaves a
//!   half-written key under the real name (at worst a stray `.tmp` file).
//! - An existing file is never replaced. One that is not a regular file,
//!   is readable or writable by group or others, or does not hold one key,
//!   is an error naming the file: clients know a node by this key (the
//!   roster, the trust log), so a silent new key would break every one of
//!   them, and a key others could read may be known to them. The operator
//!   fixes the mode (`chmod 600`) or removes the file to make a new identity.
//! - Symbolic links are not followed (`O_NOFOLLOW`).

use super::base64;
use super::keys::{KEY_LEN, KeyError, StaticKey};
use std::fmt;
use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The identity file's name in the state directory.
pub const IDENTITY_FILE: &str = "e2ee-identity.key";

/// The file's exact length: 44 base64 characters and a newline.
const FILE_LEN: usize = KEY_LEN.div_ceil(3) * 4 + 1;

/// The identity stored in `dir`, made and stored first if there is none.
pub fn load_or_create(dir: &Path) -> Result<StaticKey, IdentityError> {
    let path = dir.join(IDENTITY_FILE);
    match load(&path) {
        Err(IdentityError::Io { error, .. }) if error.kind() == ErrorKind::NotFound => {}
        other => return other,
    }
    let key = StaticKey::generate().map_err(IdentityError::Key)?;
    // Unique per attempt, so that concurrent starts never write one file.
    let mut tag = [0u8; 8];
    getrandom::fill(&mut tag).map_err(|e| IdentityError::Key(KeyError::Random(e.to_string())))?;
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    let tmp = dir.join(format!("{IDENTITY_FILE}.{tag}.tmp"));
    let written = write_new(&tmp, &key);
    let linked = written.and_then(|()| {
        fs::hard_link(&tmp, &path).map_err(|error| IdentityError::Io {
            path: path.clone(),
            action: "link",
            error,
        })
    });
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            // The new name is durable only once the directory is synced.
            if let Ok(d) = fs::File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(key)
        }
        // Another start stored its key first: that one is the identity.
        Err(IdentityError::Io { error, .. }) if error.kind() == ErrorKind::AlreadyExists => {
            load(&path)
        }
        Err(e) => Err(e),
    }
}

/// The key in the identity file at `path`.
fn load(path: &Path) -> Result<StaticKey, IdentityError> {
    let io = |action: &'static str| {
        move |error| IdentityError::Io {
            path: path.to_path_buf(),
            action,
            error,
        }
    };
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(io("open"))?;
    let meta = file.metadata().map_err(io("stat"))?;
    if !meta.is_file() || meta.mode() & 0o077 != 0 {
        return Err(IdentityError::Permissions {
            path: path.to_path_buf(),
            mode: meta.mode(),
        });
    }
    // One byte more than a key file holds, to tell "longer" from "exact".
    let mut text = Vec::with_capacity(FILE_LEN + 1);
    file.take(FILE_LEN as u64 + 1)
        .read_to_end(&mut text)
        .map_err(io("read"))?;
    let malformed = || IdentityError::Malformed {
        path: path.to_path_buf(),
    };
    let line = text
        .strip_suffix(b"\n")
        .and_then(|l| std::str::from_utf8(l).ok())
        .ok_or_else(malformed)?;
    let private: [u8; KEY_LEN] = base64::decode(line)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(malformed)?;
    StaticKey::from_private(private).map_err(IdentityError::Key)
}

/// `key` in a new file at `path`, mode 0600, synced.
fn write_new(path: &Path, key: &StaticKey) -> Result<(), IdentityError> {
    let io = |action: &'static str| {
        move |error| IdentityError::Io {
            path: path.to_path_buf(),
            action,
            error,
        }
    };
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(io("create"))?;
    let text = format!("{}\n", base64::encode(key.private_bytes()));
    file.write_all(text.as_bytes()).map_err(io("write"))?;
    file.sync_all().map_err(io("sync"))
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
