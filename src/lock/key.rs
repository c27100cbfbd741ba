//! The node's signer key on disk (seed 004, Keys: "node signer, Ed25519,
//! stored by the node (locked mode)"; issue 14). Run on the lock worker
//! thread, never on the reactor: it reads, writes and syncs files.
//!
//! Where: `lock-signer.key` in the state directory, the Ed25519 private
//! seed as standard base64 and a newline, mode 0600; not in the ledger.
//! Why a file: the documented recovery of a damaged ledger is to move the
//! file aside and start a new one, and operators copy a ledger to inspect
//! it (`sqlite3 .recover`, a bug report); the signer key must survive the
//! first and must not travel with the second. A node that lost its log
//! keeps its signer identity and finds its log again by sync; the file is
//! also where administrators look for keys (beside `e2ee-identity.key`),
//! to back up or to exclude from backups.
//!
//! The rules are those of the identity key (src/e2ee/identity.rs): made
//! at first need with `O_EXCL` under a temporary name, synced, then
//! hard-linked into place so two starts never make two keys; never
//! replaced; refused (naming the file) when it is not a regular 0600 file
//! or does not hold one key; symbolic links not followed.

use ed25519_dalek::SigningKey;
use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::e2ee::base64;

/// The signer key file's name in the state directory.
pub const SIGNER_FILE: &str = "lock-signer.key";

/// The seed's length, and the file's: 44 base64 characters and a newline.
const SEED_LEN: usize = 32;
const FILE_LEN: usize = SEED_LEN.div_ceil(3) * 4 + 1;

/// The signer key stored in `dir`, made and stored first if there is none.
/// The error is one line naming the file and what failed.
pub fn load_or_create(dir: &Path) -> Result<SigningKey, String> {
    let path = dir.join(SIGNER_FILE);
    match load(&path) {
        Err(Missing) => {}
        Ok(k) => return Ok(k),
        Err(Failed(e)) => return Err(e),
    }
    let mut seed = [0u8; SEED_LEN];
    getrandom::fill(&mut seed).map_err(|e| format!("cannot make a signer key: {e}"))?;
    let key = SigningKey::from_bytes(&seed);
    let mut tag = [0u8; 8];
    getrandom::fill(&mut tag).map_err(|e| format!("cannot make a signer key: {e}"))?;
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    let tmp = dir.join(format!("{SIGNER_FILE}.{tag}.tmp"));
    let linked = write_new(&tmp, &seed).and_then(|()| {
        fs::hard_link(&tmp, &path).map_err(|e| {
            if e.kind() == ErrorKind::AlreadyExists {
                String::new()
            } else {
                format!("cannot link signer key {}: {e}", path.display())
            }
        })
    });
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            if let Ok(d) = fs::File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(key)
        }
        // Another start stored its key first: that one is the signer.
        Err(e) if e.is_empty() => match load(&path) {
            Ok(k) => Ok(k),
            Err(Missing) => Err(format!("signer key {} vanished", path.display())),
            Err(Failed(e)) => Err(e),
        },
        Err(e) => Err(e),
    }
}

enum LoadError {
    Missing,
    Failed(String),
}
use LoadError::{Failed, Missing};

fn load(path: &Path) -> Result<SigningKey, LoadError> {
    let shown = path.display();
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Err(Missing),
        Err(e) => return Err(Failed(format!("cannot open signer key {shown}: {e}"))),
    };
    let meta = file
        .metadata()
        .map_err(|e| Failed(format!("cannot stat signer key {shown}: {e}")))?;
    if !meta.is_file() || meta.mode() & 0o077 != 0 {
        return Err(Failed(format!(
            "signer key {shown} must be a regular file of mode 0600, not {:o} (chmod 600 it)",
            meta.mode() & 0o7777
        )));
    }
    let mut text = Vec::with_capacity(FILE_LEN + 1);
    file.take(FILE_LEN as u64 + 1)
        .read_to_end(&mut text)
        .map_err(|e| Failed(format!("cannot read signer key {shown}: {e}")))?;
    let seed: [u8; SEED_LEN] = text
        .strip_suffix(b"\n")
        .and_then(|l| std::str::from_utf8(l).ok())
        .and_then(base64::decode)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| Failed(format!("signer key {shown} does not hold one base64 key")))?;
    Ok(SigningKey::from_bytes(&seed))
}

fn write_new(path: &Path, seed: &[u8; SEED_LEN]) -> Result<(), String> {
    let shown = path.display();
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot create signer key {shown}: {e}"))?;
    let text = format!("{}\n", base64::encode(seed));
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot write signer key {shown}: {e}"))
}
