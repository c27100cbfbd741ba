//! The ledger: one SQLite database in the state directory holding every event
//! and record of the daemon (DESIGN.md, "Ledger"; issue 2, "The ledger").
//!
//! Two threads of the ledger touch the file. The `ledger-writer` thread owns
//! the read-write connection that writes events and records, and commits
//! everything queued to it in one transaction per fsync (group commit):
//! nothing is acknowledged before it is committed. The `ledger-reader`
//! thread owns a read connection and runs queries the reactor hands it, so
//! that no page read blocks the reactor. (The gateway's token store keeps a
//! read-write connection of its own, for its one table.)
//! Every connection runs in WAL mode with `synchronous=FULL`, set and read
//! back, because NORMAL can lose acknowledged commits on power loss.
//!
//! A database that cannot be trusted (another program's file, a newer
//! schema, a failed integrity check, a file SQLite refuses) is opened
//! read-only: reads are served, writes are refused with `ledger-corrupt`.

pub(crate) mod schema;
mod writer;

pub use schema::{Untrusted, current_version};
pub use writer::{Appended, Batch, Committed, Op, WriteError};

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use crate::errors::io_cause;
use crate::limits;

/// A query run on the reader thread with its connection; it sends its own
/// result wherever it needs to go.
pub type ReadJob = Box<dyn FnOnce(&Connection) + Send>;

/// Why the ledger is read-only, for the log line and `server.info`.
#[derive(Debug, Clone, PartialEq)]
pub struct CorruptReason(pub String);

/// The ledger as the reactor holds it.
pub struct Ledger {
    pub path: PathBuf,
    writer_tx: Option<Sender<Batch>>,
    reader_tx: Sender<ReadJob>,
    writer_thread: Option<JoinHandle<()>>,
    reader_thread: Option<JoinHandle<()>>,
    /// Set when the ledger cannot be trusted; writes are refused.
    pub corrupt: Option<CorruptReason>,
}

/// Opening the ledger failed before any thread started.
#[derive(Debug)]
pub struct OpenError(pub String);

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Sets and checks the pragmas every connection must run with.
pub fn configure(conn: &Connection, writable: bool) -> rusqlite::Result<Result<(), String>> {
    conn.busy_timeout(std::time::Duration::from_millis(
        limits::LEDGER_BUSY_TIMEOUT_MS,
    ))?;
    if writable {
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Ok(Err(format!("journal_mode is {mode}, not wal")));
        }
    }
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")?;
    let sync: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
    if sync != 2 {
        return Ok(Err(format!("synchronous is {sync}, not FULL (2)")));
    }
    Ok(Ok(()))
}

fn sqlite_cause(e: &rusqlite::Error) -> String {
    e.to_string()
        .lines()
        .next()
        .unwrap_or("sqlite error")
        .to_lowercase()
}

impl Ledger {
    /// Opens (creating and migrating when needed) the ledger at `path` and
    /// starts its threads. `on_commit` is called on the writer thread after
    /// every group commit; it hands the result to the reactor.
    pub fn open(
        path: &Path,
        on_commit: Box<dyn Fn(Vec<Committed>) + Send>,
    ) -> Result<Ledger, OpenError> {
        if let Some(dir) = path.parent() {
            crate::secret_file::create_private_dir(dir).map_err(|e| {
                OpenError(format!(
                    "unable to create state directory {}: {}",
                    dir.display(),
                    io_cause(&e)
                ))
            })?;
        }
        let (corrupt, writer_conn) = match Self::open_writable(path) {
            Ok(conn) => (None, Some(conn)),
            Err(WritableError::Untrusted(reason)) => (Some(CorruptReason(reason)), None),
            Err(WritableError::Fatal(msg)) => return Err(OpenError(msg)),
        };
        let mut writer_thread = None;
        let writer_tx = match writer_conn {
            Some(conn) => {
                let (tx, rx) = bounded::<Batch>(limits::LEDGER_QUEUE);
                let handle = std::thread::Builder::new()
                    .name("ledger-writer".into())
                    .spawn(move || writer::run(conn, rx, on_commit))
                    .map_err(|e| {
                        OpenError(format!(
                            "unable to start the ledger writer thread: {}",
                            io_cause(&e)
                        ))
                    })?;
                writer_thread = Some(handle);
                Some(tx)
            }
            None => None,
        };
        let (reader_tx, reader_rx) = bounded::<ReadJob>(limits::LEDGER_READ_QUEUE);
        let read_path = path.to_path_buf();
        let handle = std::thread::Builder::new()
            .name("ledger-reader".into())
            .spawn(move || reader_run(&read_path, reader_rx))
            .map_err(|e| {
                OpenError(format!(
                    "unable to start the ledger reader thread: {}",
                    io_cause(&e)
                ))
            })?;
        Ok(Ledger {
            path: path.to_path_buf(),
            writer_tx,
            reader_tx,
            writer_thread,
            reader_thread: Some(handle),
            corrupt,
        })
    }

    fn open_writable(path: &Path) -> Result<Connection, WritableError> {
        let shown = path.display();
        let mut conn = Connection::open(path)
            .map_err(|e| classify_open(&e, &format!("unable to open ledger at {shown}")))?;
        match configure(&conn, true) {
            Ok(Ok(())) => {}
            Ok(Err(why)) => {
                return Err(WritableError::Fatal(format!(
                    "unable to open ledger at {shown}: {why}"
                )));
            }
            Err(e) => {
                return Err(classify_open(
                    &e,
                    &format!("unable to open ledger at {shown}"),
                ));
            }
        }
        match schema::prepare(&mut conn) {
            Ok(schema::Prepared::Ready { migrated_from }) => {
                if migrated_from != schema::current_version() && migrated_from != 0 {
                    crate::info!(
                        "ledger at {shown} migrated from schema {migrated_from} to {}",
                        schema::current_version()
                    );
                }
                Ok(conn)
            }
            Ok(schema::Prepared::Untrusted(u)) => Err(WritableError::Untrusted(u.to_string())),
            Err(e) => Err(classify_open(
                &e,
                &format!("unable to prepare ledger at {shown}"),
            )),
        }
    }

    /// Queues a batch for the writer. Refused at once when the ledger is
    /// read-only or the writer's queue is full; never blocks the reactor.
    pub fn submit(&self, batch: Batch) -> Result<(), WriteError> {
        if self.corrupt.is_some() {
            return Err(WriteError::Corrupt);
        }
        let Some(tx) = &self.writer_tx else {
            return Err(WriteError::Corrupt);
        };
        match tx.try_send(batch) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(WriteError::Busy),
            Err(TrySendError::Disconnected(_)) => {
                Err(WriteError::Failed("the ledger writer stopped".into()))
            }
        }
    }

    /// Queues a read. Refused when the reader's queue is full.
    pub fn read(&self, job: ReadJob) -> Result<(), WriteError> {
        match self.reader_tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(WriteError::Busy),
            Err(TrySendError::Disconnected(_)) => {
                Err(WriteError::Failed("the ledger reader stopped".into()))
            }
        }
    }

    /// Marks the ledger read-only from now on (a failed integrity check or a
    /// corruption error from the writer).
    pub fn mark_corrupt(&mut self, reason: String) {
        if self.corrupt.is_none() {
            self.corrupt = Some(CorruptReason(reason));
            self.writer_tx = None;
        }
    }

    /// Stops both threads after the writer has committed everything queued.
    /// The reader goes first so that the writer's connection is the last one
    /// open: it checkpoints the WAL into the database and truncates it, and
    /// the next start has no WAL to read back.
    pub fn close(mut self) {
        // Replacing the reader's sender ends its loop once its queue is done.
        let (dead_tx, _) = bounded(1);
        self.reader_tx = dead_tx;
        if let Some(t) = self.reader_thread.take() {
            let _ = t.join();
        }
        self.writer_tx = None;
        if let Some(t) = self.writer_thread.take() {
            let _ = t.join();
        }
    }
}

enum WritableError {
    Untrusted(String),
    Fatal(String),
}

/// SQLite's "not a database" and "corrupt" are a damaged file, which the
/// daemon serves read-only; anything else (permissions, a full disk) stops it.
fn classify_open(e: &rusqlite::Error, what: &str) -> WritableError {
    use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
    match e.sqlite_error_code() {
        Some(DatabaseCorrupt) | Some(NotADatabase) => WritableError::Untrusted(sqlite_cause(e)),
        _ => WritableError::Fatal(format!("{what}: {}", sqlite_cause(e))),
    }
}

fn reader_run(path: &Path, rx: Receiver<ReadJob>) {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    );
    let conn = match conn {
        Ok(c) => {
            if let Err(e) = configure(&c, false) {
                crate::warn!("ledger reader at {}: {}", path.display(), sqlite_cause(&e));
            }
            Some(c)
        }
        Err(e) => {
            crate::error!(
                "unable to open ledger at {} for reading: {}",
                path.display(),
                sqlite_cause(&e)
            );
            None
        }
    };
    // Without a connection every job still runs, against an in-memory
    // database with no tables, so that each caller gets its error answer.
    let fallback;
    let conn = match &conn {
        Some(c) => c,
        None => match Connection::open_in_memory() {
            Ok(c) => {
                fallback = c;
                &fallback
            }
            Err(_) => return,
        },
    };
    for job in rx {
        job(conn);
    }
}

/// Runs SQLite's quick integrity check; `Err` holds the first problem.
pub fn quick_check(conn: &Connection) -> Result<(), String> {
    let mut stmt = conn
        .prepare("PRAGMA quick_check(1)")
        .map_err(|e| sqlite_cause(&e))?;
    let first: String = stmt
        .query_row([], |r| r.get(0))
        .map_err(|e| sqlite_cause(&e))?;
    if first == "ok" { Ok(()) } else { Err(first) }
}

/// One stored event, as read back.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub stream: String,
    pub seq: i64,
    pub kind: String,
    pub ts: String,
    pub data: String,
}

/// A page of one stream's events after `after_seq`.
pub fn list_events(
    conn: &Connection,
    stream: &str,
    after_seq: i64,
    limit: usize,
) -> rusqlite::Result<Vec<StoredEvent>> {
    let mut stmt = conn.prepare_cached(
        "SELECT stream, seq, kind, ts, data FROM events WHERE stream = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
    )?;
    let rows = stmt.query_map(rusqlite::params![stream, after_seq, limit as i64], |r| {
        Ok(StoredEvent {
            stream: r.get(0)?,
            seq: r.get(1)?,
            kind: r.get(2)?,
            ts: r.get(3)?,
            data: r.get(4)?,
        })
    })?;
    rows.collect()
}

/// Counts without a scan: streams, and events as the sum of each stream's
/// last seq (seq has no gaps).
pub fn counts(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    conn.query_row(
        "SELECT count(*), coalesce(sum(last_seq), 0) FROM streams",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// The last committed seq of a stream; 0 for a stream with no events.
pub fn stream_last_seq(conn: &Connection, stream: &str) -> rusqlite::Result<i64> {
    let mut stmt = conn.prepare_cached("SELECT last_seq FROM streams WHERE stream = ?1")?;
    match stmt.query_row([stream], |r| r.get(0)) {
        Err(rusqlite::Error::QueryReturnedNoRows) => Ok(0),
        other => other,
    }
}

/// Streams after `after` in name order with their event counts (seq has
/// no gaps, so the last seq is the count), at most `limit`.
pub fn stream_counts(
    conn: &Connection,
    after: &str,
    limit: usize,
) -> rusqlite::Result<Vec<(String, i64)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT stream, last_seq FROM streams WHERE stream > ?1 ORDER BY stream LIMIT ?2",
    )?;
    let rows = stmt.query_map(rusqlite::params![after, limit as i64], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })?;
    rows.collect()
}

/// The database's page size, page count and free pages, in one read.
pub fn page_figures(conn: &Connection) -> rusqlite::Result<(i64, i64, i64)> {
    let size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    let count: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    let free: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
    Ok((size, count, free))
}
