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
//! The rules are those of the identity key, in src/secret_file.rs: made
//! at first need under a temporary name and hard-linked into place so two
//! starts never make two keys; never replaced; refused (naming the file)
//! when it is not a regular 0600 file or does not hold one key; symbolic
//! links not followed.

use ed25519_dalek::SigningKey;
use std::path::Path;

use crate::e2ee::base64;
use crate::secret_file::{self, SecretFileError};

/// The signer key file's name in the state directory.
pub const SIGNER_FILE: &str = "lock-signer.key";

/// The seed's length, and its line's: 44 base64 characters.
const SEED_LEN: usize = 32;
const LINE_LEN: usize = SEED_LEN.div_ceil(3) * 4;

/// The signer key stored in `dir`, made and stored first if there is none.
/// The error is one line naming the file and what failed.
pub fn load_or_create(dir: &Path) -> Result<SigningKey, String> {
    let path = dir.join(SIGNER_FILE);
    let shown = path.display();
    let line = secret_file::load_or_create(dir, SIGNER_FILE, LINE_LEN, || {
        let mut seed = [0u8; SEED_LEN];
        getrandom::fill(&mut seed).map_err(|e| e.to_string())?;
        Ok(base64::encode(&seed))
    })
    .map_err(|e| match e {
        SecretFileError::Io { action, error, .. } => {
            format!("cannot {action} signer key {shown}: {error}")
        }
        SecretFileError::Permissions { mode, .. } => format!(
            "signer key {shown} must be a regular file of mode 0600, not {:o} (chmod 600 it)",
            mode & 0o7777
        ),
        SecretFileError::Malformed { .. } => {
            format!("signer key {shown} does not hold one base64 key")
        }
        SecretFileError::Make(why) => format!("cannot make a signer key: {why}"),
    })?;
    let seed: [u8; SEED_LEN] = base64::decode(&line)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| format!("signer key {shown} does not hold one base64 key"))?;
    Ok(SigningKey::from_bytes(&seed))
}
