//! The gateway's secrets (seed 004, "Authentication" and "Pairing a new
//! device"; issue 12): the master token and the store of paired devices'
//! client tokens.
//!
//! Master token: `OMNICONFLUX_GATEWAY_TOKEN` when set, else the file
//! `STATE/gateway.token` (mode 0600, 64 lowercase hex characters, created
//! at first start). Never a command-line argument: every user of the
//! machine can read argv. A token file others can read, or one that is not
//! 64 lowercase hex characters, stops the start with a message saying so.
//!
//! Client tokens are never stored raw: a token is known by its SHA-256 (its
//! *id*, 64 lowercase hex, what `clients.list` shows and `clients.remove`
//! takes). Every check hashes the token offered and compares digests in
//! constant time (the master token), or looks the digest up (client tokens:
//! the lookup's timing depends on a hash of the secret, not on the secret).
//!
//! Where they persist: in the node (`[gateway] listen`), the table
//! `gateway_clients` of the node's ledger (ledger migration 9), written
//! through the gateway's own SQLite connection to the same file; the ledger
//! runs in WAL mode, so this connection never blocks the reactor's reads,
//! and its rare writes (a device paired, a device removed) wait at most the
//! ledger's busy timeout behind a group commit. Standalone (`omniconfluxd
//! gateway`), the file `STATE/gateway.sqlite3` with the same table. Why not
//! the ledger writer: the gateway must run where no ledger exists, and a
//! pairing is a single-row write an operator waits for anyway.

use rusqlite::Connection;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::errors::io_cause;
use crate::limits;

/// The environment variable that carries the master token.
pub const TOKEN_ENV: &str = "OMNICONFLUX_GATEWAY_TOKEN";

/// The table paired devices are kept in; the same text is ledger migration 9.
pub const CLIENTS_TABLE: &str = "CREATE TABLE IF NOT EXISTS gateway_clients (
        id         TEXT PRIMARY KEY,
        created_at TEXT NOT NULL
    ) WITHOUT ROWID;";

pub type Digest = [u8; 32];

pub fn sha256(b: &[u8]) -> Digest {
    let d = ring::digest::digest(&ring::digest::SHA256, b);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Compares two digests in time independent of where they differ.
pub fn digest_eq(a: &Digest, b: &Digest) -> bool {
    std::hint::black_box(
        a.iter()
            .zip(b.iter())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y)),
    ) == 0
}

/// Whether `s` is exactly 64 lowercase hex characters (a client token, a
/// token id, a generated master token).
pub fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The master token's digest, from the environment or the state directory.
pub fn master(state_dir: &Path, env_value: Option<String>) -> Result<Digest, String> {
    if let Some(v) = env_value {
        if v.is_empty() {
            return Err(format!("{TOKEN_ENV} is set but empty"));
        }
        return Ok(sha256(v.as_bytes()));
    }
    let path = state_dir.join("gateway.token");
    let shown = path.display();
    match std::fs::symlink_metadata(&path) {
        Ok(meta) => {
            if !meta.file_type().is_file() {
                return Err(format!("gateway token file {shown} is not a regular file"));
            }
            if meta.mode() & 0o077 != 0 {
                return Err(format!(
                    "gateway token file {shown} is readable by others (mode {:o}); chmod 600 it",
                    meta.mode() & 0o777
                ));
            }
            let text = std::fs::read_to_string(&path).map_err(|e| {
                format!(
                    "unable to read gateway token file {shown}: {}",
                    io_cause(&e)
                )
            })?;
            let token = text.trim_end_matches('\n');
            if !is_hex64(token) {
                return Err(format!(
                    "gateway token file {shown} must hold 64 lowercase hex characters"
                ));
            }
            Ok(sha256(token.as_bytes()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            crate::secret_file::create_private_dir(state_dir).map_err(|e| {
                format!(
                    "unable to create state directory {}: {}",
                    state_dir.display(),
                    io_cause(&e)
                )
            })?;
            let token = crate::ids::secret_hex(limits::GATEWAY_TOKEN_BYTES);
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| {
                    format!(
                        "unable to create gateway token file {shown}: {}",
                        io_cause(&e)
                    )
                })?;
            f.write_all(format!("{token}\n").as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(|e| {
                    format!(
                        "unable to write gateway token file {shown}: {}",
                        io_cause(&e)
                    )
                })?;
            crate::info!("created the gateway master token file {shown}");
            Ok(sha256(token.as_bytes()))
        }
        Err(e) => Err(format!(
            "unable to read gateway token file {shown}: {}",
            io_cause(&e)
        )),
    }
}

/// One paired device: its token's id and when it first connected.
#[derive(Clone, Debug, PartialEq)]
pub struct Paired {
    pub id: String,
    pub created_at: String,
}

/// The stored client tokens, on the gateway thread's own connection.
pub struct Store {
    conn: Connection,
}

impl Store {
    /// Opens the file holding `gateway_clients`. `create`: make the table
    /// (the standalone file); in the node the ledger's migration made it,
    /// and the gateway writes nothing else into the ledger.
    pub fn open(path: &Path, create: bool) -> Result<Store, String> {
        let fail = |e: rusqlite::Error| {
            format!(
                "unable to open the gateway's client tokens in {}: {}",
                path.display(),
                e.to_string().to_lowercase()
            )
        };
        let conn = Connection::open(path).map_err(fail)?;
        conn.busy_timeout(std::time::Duration::from_millis(
            limits::LEDGER_BUSY_TIMEOUT_MS,
        ))
        .map_err(fail)?;
        if create {
            conn.execute_batch("PRAGMA journal_mode = WAL;")
                .map_err(fail)?;
            conn.execute_batch(CLIENTS_TABLE).map_err(fail)?;
        }
        conn.execute_batch("PRAGMA synchronous = FULL;")
            .map_err(fail)?;
        Ok(Store { conn })
    }

    /// Every paired device, oldest first.
    pub fn load(&self) -> Result<Vec<Paired>, String> {
        let read = || -> rusqlite::Result<Vec<Paired>> {
            let mut st = self
                .conn
                .prepare("SELECT id, created_at FROM gateway_clients ORDER BY created_at, id")?;
            let rows = st.query_map([], |r| {
                Ok(Paired {
                    id: r.get(0)?,
                    created_at: r.get(1)?,
                })
            })?;
            rows.collect()
        };
        read().map_err(|e| {
            format!(
                "unable to read the gateway's client tokens: {}",
                e.to_string().to_lowercase()
            )
        })
    }

    pub fn insert(&self, p: &Paired) -> Result<(), String> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO gateway_clients (id, created_at) VALUES (?1, ?2)",
                [&p.id, &p.created_at],
            )
            .map(|_| ())
            .map_err(|e| {
                format!(
                    "unable to store a client token: {}",
                    e.to_string().to_lowercase()
                )
            })
    }

    pub fn remove(&self, id: &str) -> Result<(), String> {
        self.conn
            .execute("DELETE FROM gateway_clients WHERE id = ?1", [id])
            .map(|_| ())
            .map_err(|e| {
                format!(
                    "unable to remove a client token: {}",
                    e.to_string().to_lowercase()
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_token_file_is_created_private_and_checked() {
        let dir = crate::testutil::TempDir::new("gw-token");
        let a = master(dir.path(), None).unwrap();
        let path = dir.path().join("gateway.token");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(is_hex64(text.trim_end()));
        assert_eq!(master(dir.path(), None).unwrap(), a);
        assert_eq!(
            master(dir.path(), Some("s3cret".into())).unwrap(),
            sha256(b"s3cret")
        );
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        assert!(master(dir.path(), None).unwrap_err().contains("chmod 600"));
    }

    #[test]
    fn store_keeps_ids_only() {
        let dir = crate::testutil::TempDir::new("gw-store");
        let s = Store::open(&dir.path().join("g.sqlite3"), true).unwrap();
        let id = crate::ids::hex(&sha256(b"tok"));
        s.insert(&Paired {
            id: id.clone(),
            created_at: "2026-01-01T00:00:00.000Z".into(),
        })
        .unwrap();
        assert_eq!(s.load().unwrap()[0].id, id);
        s.remove(&id).unwrap();
        assert!(s.load().unwrap().is_empty());
        assert!(digest_eq(&sha256(b"a"), &sha256(b"a")));
        assert!(!digest_eq(&sha256(b"a"), &sha256(b"b")));
    }
}
