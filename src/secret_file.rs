//! Small secrets kept in files of the state directory, made once and never
//! replaced: the node's identity key (src/e2ee/identity.rs) and its trust-log
//! signer key (src/lock/key.rs). One set of rules for both, because both are
//! what others know the node by, and a silent new one would break every
//! client and every log that names it:
//! - The file holds one line of text and a newline, mode 0600.
//! - A missing file is made: written to a random temporary name with
//!   `O_EXCL`, synced, then hard-linked to its name, which fails if another
//!   process got there first; the loser reads the winner's secret. So two
//!   starts never end with two secrets, and a crash never leaves a
//!   half-written secret under the real name (at worst a stray `.tmp` file).
//! - An existing file is never replaced. One that is not a regular file,
//!   that group or others may read or write, or that does not hold one line
//!   of the expected length, is an error naming the file; the operator fixes
//!   the mode or removes the file.
//! - Symbolic links are not followed (`O_NOFOLLOW`), and a read takes at
//!   most one byte more than the line can hold.
//!
//! It reads, writes and syncs: callers run it where blocking is allowed (at
//! start-up, or on a worker thread), never on the reactor.

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Makes directory `dir` and its missing parents with mode 0700: the state
/// and socket directories hold the ledger (every prompt and transcript),
/// the secrets above and the operator's socket, which no other user may
/// reach whatever the umask of a daemon started by hand (the system units
/// set 0077 and `StateDirectoryMode=0700` themselves). A directory that is
/// there already keeps its mode.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Why a secret file could not be read or made.
#[derive(Debug)]
pub enum SecretFileError {
    /// A file operation failed: `action` is what was tried.
    Io {
        path: PathBuf,
        action: &'static str,
        error: std::io::Error,
    },
    /// Not a regular file, or group or others may read or write it.
    Permissions { path: PathBuf, mode: u32 },
    /// The file does not hold one line of the expected length.
    Malformed { path: PathBuf },
    /// A new secret could not be made (no randomness); the cause.
    Make(String),
}

/// The line stored in `dir/name` (without its newline), after making it with
/// `fresh` if the file is missing. `len` is the line's exact length.
pub fn load_or_create(
    dir: &Path,
    name: &str,
    len: usize,
    fresh: impl FnOnce() -> Result<String, String>,
) -> Result<String, SecretFileError> {
    let path = dir.join(name);
    if let Some(line) = read(&path, len)? {
        return Ok(line);
    }
    let line = fresh().map_err(SecretFileError::Make)?;
    // Unique per attempt, so that concurrent starts never write one file.
    let mut tag = [0u8; 8];
    getrandom::fill(&mut tag).map_err(|e| SecretFileError::Make(e.to_string()))?;
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    let tmp = dir.join(format!("{name}.{tag}.tmp"));
    let linked = write_new(&tmp, &line).and_then(|()| {
        fs::hard_link(&tmp, &path).map_err(|error| SecretFileError::Io {
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
            Ok(line)
        }
        // Another start stored its secret first: that one is kept.
        Err(SecretFileError::Io { error, .. }) if error.kind() == ErrorKind::AlreadyExists => {
            read(&path, len)?.ok_or_else(|| SecretFileError::Io {
                path,
                action: "open",
                error: ErrorKind::NotFound.into(),
            })
        }
        Err(e) => Err(e),
    }
}

/// The line of the secret file at `path`; `None` when there is no file.
fn read(path: &Path, len: usize) -> Result<Option<String>, SecretFileError> {
    let io = |action: &'static str| {
        move |error| SecretFileError::Io {
            path: path.to_path_buf(),
            action,
            error,
        }
    };
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("open")(e)),
    };
    let meta = file.metadata().map_err(io("stat"))?;
    if !meta.is_file() || meta.mode() & 0o077 != 0 {
        return Err(SecretFileError::Permissions {
            path: path.to_path_buf(),
            mode: meta.mode(),
        });
    }
    // The line, its newline, and one byte more to tell "longer" from "exact".
    let mut text = Vec::with_capacity(len + 2);
    file.take(len as u64 + 2)
        .read_to_end(&mut text)
        .map_err(io("read"))?;
    text.strip_suffix(b"\n")
        .filter(|l| l.len() == len)
        .and_then(|l| String::from_utf8(l.to_vec()).ok())
        .map(Some)
        .ok_or_else(|| SecretFileError::Malformed {
            path: path.to_path_buf(),
        })
}

/// `line` and a newline in a new file at `path`, mode 0600, synced.
fn write_new(path: &Path, line: &str) -> Result<(), SecretFileError> {
    let io = |action: &'static str| {
        move |error| SecretFileError::Io {
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
    file.write_all(format!("{line}\n").as_bytes())
        .map_err(io("write"))?;
    file.sync_all().map_err(io("sync"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let mut tag = [0u8; 8];
        getrandom::fill(&mut tag).unwrap();
        let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        let d = std::env::temp_dir().join(format!("omniconflux-secret-{tag}"));
        fs::create_dir(&d).unwrap();
        d
    }

    #[test]
    fn made_once_then_read_back_and_never_replaced() {
        let d = dir();
        let first = load_or_create(&d, "k", 4, || Ok("abcd".into())).unwrap();
        assert_eq!(first, "abcd");
        let meta = fs::metadata(d.join("k")).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        let again = load_or_create(&d, "k", 4, || panic!("must not make a second")).unwrap();
        assert_eq!(again, "abcd");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn loose_modes_wrong_lengths_and_links_are_refused() {
        let d = dir();
        load_or_create(&d, "k", 4, || Ok("abcd".into())).unwrap();
        fs::set_permissions(d.join("k"), fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            load_or_create(&d, "k", 4, || Ok("efgh".into())),
            Err(SecretFileError::Permissions { .. })
        ));
        fs::set_permissions(d.join("k"), fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            load_or_create(&d, "k", 5, || Ok("efghi".into())),
            Err(SecretFileError::Malformed { .. })
        ));
        std::os::unix::fs::symlink(d.join("k"), d.join("l")).unwrap();
        assert!(matches!(
            load_or_create(&d, "l", 4, || Ok("efgh".into())),
            Err(SecretFileError::Io { action: "open", .. })
        ));
        assert!(matches!(
            load_or_create(&d, "m", 4, || Err("no randomness".into())),
            Err(SecretFileError::Make(_))
        ));
        fs::remove_dir_all(&d).unwrap();
    }

    use std::os::unix::fs::PermissionsExt;
}
