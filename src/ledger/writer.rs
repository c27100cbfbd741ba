//! The `ledger-writer` thread: group commit (DESIGN.md, "Threads and
//! ownership"; "Performance notes").
//!
//! It blocks for one batch, then takes every batch already queued (up to
//! `LEDGER_GROUP_MAX_OPS` operations) and applies them in one transaction,
//! so that one failing batch does not fail the others: a batch of several
//! operations inside its own savepoint, one of a single statement without
//! (a failed statement leaves nothing of itself). Where SQLite ends the
//! transaction itself (it may on an I/O error, a full disk or no memory),
//! the whole group fails. After COMMIT returns, fsync included, it reports
//! every batch's outcome at once; only then may anything be acknowledged.
//!
//! The writer assigns `seq`: it owns the only connection that writes
//! events, so it alone knows the last committed seq of each stream. A
//! failed batch or commit forgets the seqs it had taken, so seq never has a
//! gap or a duplicate.
//!
//! Once its queue has been empty for `LEDGER_WAL_PRESIZE_IDLE` after a
//! start, it writes zeros past the end of the WAL, step after step while
//! the queue stays empty, until the file is as long as the WAL gets before
//! SQLite's automatic checkpoint starts the log again from the top
//! ([`Presize`]). Until then every commit appended to the file, and an
//! fsync that has to allocate the file's new blocks took 1.2 to 1.6 times
//! one that only overwrites (issue 11, the durable storage.set figure).

use crossbeam_channel::{Receiver, RecvTimeoutError};
use rusqlite::types::Value;
use rusqlite::{Connection, params};
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use crate::limits;

/// One write.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Appends an event to a stream; the writer assigns its seq.
    Event {
        stream: String,
        kind: String,
        ts: String,
        data: String,
    },
    /// Runs one statement of a record table (a session row, a storage key).
    /// A batch of one runs without a savepoint of its own, so the statement
    /// must leave nothing of itself when it fails: no `OR FAIL` conflict
    /// resolution, which keeps the rows changed before the failing one.
    Exec {
        sql: &'static str,
        params: Vec<Value>,
    },
}

/// Operations committed together or not at all, and the ticket the reactor
/// uses to find what waits on them.
#[derive(Debug)]
pub struct Batch {
    pub ticket: u64,
    pub ops: Vec<Op>,
}

/// An event as committed, with its seq.
#[derive(Debug, Clone, PartialEq)]
pub struct Appended {
    pub stream: String,
    pub seq: i64,
    pub kind: String,
    pub ts: String,
    pub data: String,
}

/// Why a batch was not committed.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteError {
    /// The ledger is read-only (`ledger-corrupt`).
    Corrupt,
    /// The writer's queue is full (`ledger-busy`).
    Busy,
    /// SQLite refused the batch or the commit; the text is for the log.
    Failed(String),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Corrupt => f.write_str("the ledger is read-only"),
            WriteError::Busy => f.write_str("the writer's queue is full"),
            WriteError::Failed(why) => f.write_str(why),
        }
    }
}

/// The outcome of one batch.
#[derive(Debug)]
pub struct Committed {
    pub ticket: u64,
    pub result: Result<Vec<Appended>, WriteError>,
}

#[derive(Default)]
struct Seqs {
    last: HashMap<String, i64>,
}

impl Seqs {
    fn last(&mut self, tx: &Connection, stream: &str) -> rusqlite::Result<i64> {
        if let Some(&s) = self.last.get(stream) {
            return Ok(s);
        }
        let s: i64 = tx
            .query_row(
                "SELECT last_seq FROM streams WHERE stream = ?1",
                [stream],
                |r| r.get(0),
            )
            .or_else(|e| {
                if matches!(e, rusqlite::Error::QueryReturnedNoRows) {
                    Ok(0)
                } else {
                    Err(e)
                }
            })?;
        self.last.insert(stream.to_string(), s);
        Ok(s)
    }
}

pub fn run(
    mut conn: Connection,
    rx: Receiver<Batch>,
    on_commit: Box<dyn Fn(Vec<Committed>) + Send>,
) {
    conn.set_prepared_statement_cache_capacity(limits::LEDGER_WRITER_STATEMENTS);
    let mut seqs = Seqs::default();
    let mut presize = Presize::of(&conn);
    loop {
        let first = match presize.as_mut() {
            // Steps only once no batch has come for a while, then one after
            // another while none comes: right after a start the reactor is
            // answering its first requests, on the same core when the
            // daemon is pinned to one.
            Some(p) => match rx.recv_timeout(limits::LEDGER_WAL_PRESIZE_IDLE) {
                Ok(b) => b,
                Err(RecvTimeoutError::Timeout) => {
                    while rx.is_empty() {
                        if !p.step(&conn) {
                            presize = None;
                            break;
                        }
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            },
            None => match rx.recv() {
                Ok(b) => b,
                Err(_) => break,
            },
        };
        let mut group = vec![first];
        let mut ops = group[0].ops.len();
        while ops < limits::LEDGER_GROUP_MAX_OPS {
            match rx.try_recv() {
                Ok(b) => {
                    ops += b.ops.len();
                    group.push(b);
                }
                Err(_) => break,
            }
        }
        let results = commit_group(&mut conn, &mut seqs, &group);
        on_commit(results);
    }
    // The daemon is stopping and every batch is committed: fold the WAL into
    // the database so the next start does not replay it.
    if let Err(e) = conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)") {
        crate::warn!("ledger checkpoint at stop failed: {}", cause(&e));
    }
}

/// The WAL's file, lengthened with zeros a step at a time.
///
/// Writing there is safe for SQLite:
/// - Each step holds SQLite's write lock (an empty `BEGIN IMMEDIATE`
///   transaction on the writer's connection), so no connection can be
///   writing frames while it runs. The writer's is not the only write
///   connection: the gateway's token store has its own, and an operator may
///   open the file too. Without the lock, a frame committed between reading
///   the file's length and writing the zeros would be zeroed.
/// - Under the lock every committed frame lies before the file's end, and
///   only bytes past the end are written.
/// - SQLite reads a WAL only up to the first frame whose salt and checksum
///   do not follow from the header, which a zeroed frame never does; a
///   zeroed header is an empty WAL, whose next commit writes the header
///   anew. SQLite leaves stale frames past the end of the log after every
///   restart for the same reason.
/// - SQLite locks the database and `-shm` files, never the `-wal`, so
///   closing this descriptor releases no lock of SQLite's.
struct Presize {
    file: std::fs::File,
    path: PathBuf,
    /// 32-byte header and `wal_autocheckpoint` frames of a page and its
    /// 24-byte frame header, at most `LEDGER_WAL_PRESIZE_MAX`.
    target: u64,
}

impl Presize {
    /// None (the writer then runs as it did, appending) for a database in
    /// memory, when the automatic checkpoint is off, when a pragma cannot be
    /// read, and when the WAL cannot be opened (logged).
    fn of(conn: &Connection) -> Option<Presize> {
        let db = conn.path().filter(|p| !p.is_empty())?;
        let pragma = |name: &str| -> Option<u64> {
            let v: i64 = conn
                .query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
                .ok()?;
            u64::try_from(v).ok()
        };
        let (page, frames) = (pragma("page_size")?, pragma("wal_autocheckpoint")?);
        if frames == 0 {
            return None;
        }
        let target = frames
            .checked_mul(page + 24)
            .and_then(|b| b.checked_add(32))
            .map_or(limits::LEDGER_WAL_PRESIZE_MAX, |b| {
                b.min(limits::LEDGER_WAL_PRESIZE_MAX)
            });
        let path = PathBuf::from(format!("{db}-wal"));
        match std::fs::OpenOptions::new().write(true).open(&path) {
            Ok(file) => Some(Presize { file, path, target }),
            Err(e) => {
                crate::warn!(
                    "unable to open ledger wal at {} to presize it: {}",
                    path.display(),
                    crate::errors::io_cause(&e)
                );
                None
            }
        }
    }

    /// Adds one step of zeros on `conn`'s write lock; false once the WAL is
    /// long enough, or when the lock or a write failed (logged: the ledger
    /// works as before, only slower to commit).
    fn step(&mut self, conn: &Connection) -> bool {
        let r = (|| -> Result<bool, String> {
            // Waits for another writer as a commit of ours would (the busy
            // timeout); a transaction that changes nothing writes no frame.
            let tx = Tx::begin(conn).map_err(|e| cause(&e))?;
            let grown = self.grow().map_err(|e| crate::errors::io_cause(&e));
            // Ends the empty transaction whatever happened; dropping it
            // would roll back, which for no change is the same.
            let _ = tx.commit();
            grown
        })();
        r.unwrap_or_else(|e| {
            crate::warn!(
                "unable to presize ledger wal at {}: {e}",
                self.path.display()
            );
            false
        })
    }

    /// Writes one step of zeros at the file's end and syncs them; false
    /// once the file is long enough.
    fn grow(&mut self) -> std::io::Result<bool> {
        let len = self.file.metadata()?.len();
        if len >= self.target {
            return Ok(false);
        }
        let n = (self.target - len).min(limits::LEDGER_WAL_PRESIZE_STEP);
        self.file.seek(SeekFrom::Start(len))?;
        // Through io::copy's buffer on the stack: a heap buffer this size
        // stayed in the writer thread's arena, resident at idle.
        std::io::copy(&mut std::io::repeat(0).take(n), &mut self.file)?;
        // Allocated on disk, not only in the page cache: an fsync of
        // SQLite's would otherwise still allocate them.
        self.file.sync_data()?;
        Ok(len + n < self.target)
    }
}

/// The write transaction of a group, begun and ended with statements
/// prepared once and kept: rusqlite's `Transaction` runs its BEGIN and
/// COMMIT through `execute_batch`, which parses them again for every group
/// (a set committed alone: 21,500 instructions of the writer's, 18,900
/// with these kept). Dropped without a commit, or after a COMMIT that
/// failed, it rolls back what is still open, as `Transaction` does. The
/// presizing steps take the write lock through it too.
struct Tx<'c> {
    conn: &'c Connection,
    committed: bool,
}

impl<'c> Tx<'c> {
    fn begin(conn: &'c Connection) -> rusqlite::Result<Tx<'c>> {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(Tx {
            conn,
            committed: false,
        })
    }

    fn commit(mut self) -> rusqlite::Result<()> {
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        self.committed = true;
        Ok(())
    }
}

impl std::ops::Deref for Tx<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if !self.committed && !self.conn.is_autocommit() {
            let rolled_back = self
                .conn
                .prepare_cached("ROLLBACK")
                .and_then(|mut s| s.execute([]));
            if let Err(e) = rolled_back {
                crate::warn!("ledger rollback failed: {}", cause(&e));
            }
        }
    }
}

fn commit_group(conn: &mut Connection, seqs: &mut Seqs, group: &[Batch]) -> Vec<Committed> {
    // The seq each stream this group touches had before it: what a failed
    // group puts back, and what tells which `streams` rows to write.
    let mut before: HashMap<String, i64> = HashMap::new();
    let tx = match Tx::begin(conn) {
        Ok(tx) => tx,
        Err(e) => return fail_all(group, &e),
    };
    let mut outcomes: Vec<Result<Vec<Appended>, WriteError>> = Vec::with_capacity(group.len());
    for batch in group {
        // A batch of one statement needs no savepoint: a statement that
        // fails leaves nothing of itself behind, or SQLite ends the whole
        // transaction, which is checked below. A savepoint costs two
        // statements and a copy of every page the batch changes.
        let own = batch.ops.len() > 1;
        // The seq each stream this batch touches had before it.
        let mut undo: Vec<(&str, i64)> = Vec::new();
        let applied = (|| -> rusqlite::Result<Vec<Appended>> {
            if own {
                // Prepared once and kept: execute_batch would parse the
                // statement again for every batch, and a round of an
                // agent's streamed chunks is one batch (issue 11, the
                // fan-out figure).
                tx.prepare_cached("SAVEPOINT batch")?.execute([])?;
            }
            let mut appended = Vec::new();
            for op in &batch.ops {
                match op {
                    Op::Event {
                        stream,
                        kind,
                        ts,
                        data,
                    } => {
                        let last = seqs.last(&tx, stream)?;
                        let seq = last + 1;
                        tx.prepare_cached("INSERT INTO events (stream, seq, kind, ts, data) VALUES (?1, ?2, ?3, ?4, ?5)")?
                            .execute(params![stream, seq, kind, ts, data])?;
                        if !undo.iter().any(|(s, _)| *s == stream) {
                            undo.push((stream, last));
                        }
                        if !before.contains_key(stream) {
                            before.insert(stream.clone(), last);
                        }
                        seqs.last.insert(stream.clone(), seq);
                        appended.push(Appended {
                            stream: stream.clone(),
                            seq,
                            kind: kind.clone(),
                            ts: ts.clone(),
                            data: data.clone(),
                        });
                    }
                    Op::Exec { sql, params } => {
                        tx.prepare_cached(sql)?
                            .execute(rusqlite::params_from_iter(params.iter()))?;
                    }
                }
            }
            if own {
                tx.prepare_cached("RELEASE batch")?.execute([])?;
            }
            Ok(appended)
        })();
        let e = match applied {
            Ok(a) => {
                outcomes.push(Ok(a));
                continue;
            }
            Err(e) => e,
        };
        // The group goes on only where the failure was the batch's own and
        // its changes are undone. SQLite may end the transaction itself on
        // an I/O error, a full disk or no memory, and advises a rollback
        // after those even where it did not; a statement run after the
        // transaction ended would commit on its own.
        let kept = !ends_group(&e)
            && !tx.is_autocommit()
            && (!own || tx.execute_batch("ROLLBACK TO batch; RELEASE batch").is_ok())
            && !tx.is_autocommit();
        if !kept {
            drop(tx);
            restore(seqs, &before);
            return fail_all(group, &e);
        }
        for (stream, last) in undo {
            seqs.last.insert(stream.to_string(), last);
        }
        outcomes.push(Err(WriteError::Failed(cause(&e))));
    }
    // The last seq of each stream this group moved, written once per group.
    for (stream, last) in &before {
        let now = seqs.last.get(stream).copied().unwrap_or(*last);
        if now == *last {
            continue;
        }
        let r = tx
            .prepare_cached(
                "INSERT INTO streams (stream, last_seq) VALUES (?1, ?2)
                 ON CONFLICT (stream) DO UPDATE SET last_seq = excluded.last_seq",
            )
            .and_then(|mut s| s.execute(params![stream, now]));
        if let Err(e) = r {
            drop(tx);
            restore(seqs, &before);
            return fail_all(group, &e);
        }
    }
    if let Err(e) = tx.commit() {
        restore(seqs, &before);
        return fail_all(group, &e);
    }
    group
        .iter()
        .zip(outcomes)
        .map(|(b, result)| Committed {
            ticket: b.ticket,
            result,
        })
        .collect()
}

/// Whether an error fails the whole group: those after which SQLite may
/// have rolled the transaction back, and advises a rollback where it did not
/// (sqlite.org/lang_transaction.html, "Response To Errors Within A
/// Transaction").
fn ends_group(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode::{DatabaseBusy, DiskFull, OutOfMemory, SystemIoFailure};
    matches!(
        e.sqlite_error_code(),
        Some(DiskFull | SystemIoFailure | OutOfMemory | DatabaseBusy)
    )
}

/// Puts back the seqs a group that was not committed had taken.
fn restore(seqs: &mut Seqs, before: &HashMap<String, i64>) {
    for (stream, last) in before {
        seqs.last.insert(stream.clone(), *last);
    }
}

fn cause(e: &rusqlite::Error) -> String {
    e.to_string()
        .lines()
        .next()
        .unwrap_or("sqlite error")
        .to_lowercase()
}

fn fail_all(group: &[Batch], e: &rusqlite::Error) -> Vec<Committed> {
    use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
    let err = match e.sqlite_error_code() {
        Some(DatabaseCorrupt) | Some(NotADatabase) => WriteError::Corrupt,
        _ => WriteError::Failed(cause(e)),
    };
    group
        .iter()
        .map(|b| Committed {
            ticket: b.ticket,
            result: Err(err.clone()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{configure, schema};

    fn open(dir: &std::path::Path) -> Connection {
        let mut c = Connection::open(dir.join("l.sqlite3")).unwrap();
        configure(&c, true).unwrap().unwrap();
        assert!(matches!(
            schema::prepare(&mut c).unwrap(),
            schema::Prepared::Ready { .. }
        ));
        c
    }

    fn ev(stream: &str) -> Op {
        Op::Event {
            stream: stream.into(),
            kind: "k".into(),
            ts: "t".into(),
            data: "{}".into(),
        }
    }

    #[test]
    fn a_transaction_not_committed_is_rolled_back_and_one_committed_is_kept() {
        let dir = crate::testutil::TempDir::new("writer");
        let conn = open(dir.path());
        let set = |tx: &Tx, v: &str| {
            tx.execute(
                "INSERT OR REPLACE INTO plugin_storage (plugin, key, value) VALUES ('p', 'k', ?1)",
                [v],
            )
            .unwrap()
        };
        let stored = || -> Option<String> {
            conn.query_row("SELECT value FROM plugin_storage", [], |r| r.get(0))
                .ok()
        };
        let tx = Tx::begin(&conn).unwrap();
        set(&tx, "dropped");
        drop(tx);
        assert!(conn.is_autocommit());
        assert_eq!(stored(), None);
        // Twice: the second time BEGIN and COMMIT come from the cache.
        for v in ["kept", "kept again"] {
            let tx = Tx::begin(&conn).unwrap();
            set(&tx, v);
            tx.commit().unwrap();
            assert!(conn.is_autocommit());
            assert_eq!(stored().as_deref(), Some(v));
        }
        // A transaction another connection holds the write lock against
        // fails to begin and leaves nothing open.
        let other = Connection::open(dir.path().join("l.sqlite3")).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        conn.busy_timeout(std::time::Duration::ZERO).unwrap();
        assert!(Tx::begin(&conn).is_err());
        assert!(conn.is_autocommit());
        other.execute_batch("ROLLBACK").unwrap();
        // A COMMIT that fails leaves the transaction open; the guard rolls
        // it back. A deferred foreign key broken at COMMIT is such a
        // failure.
        conn.execute_batch(
            "CREATE TABLE parent (id INTEGER PRIMARY KEY);
             CREATE TABLE child (p INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);",
        )
        .unwrap();
        let tx = Tx::begin(&conn).unwrap();
        set(&tx, "never");
        tx.execute("INSERT INTO child (p) VALUES (7)", []).unwrap();
        assert!(tx.commit().is_err());
        assert!(conn.is_autocommit());
        assert_eq!(stored().as_deref(), Some("kept again"));
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM child", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 0);
        // And the next begins as before.
        let tx = Tx::begin(&conn).unwrap();
        set(&tx, "after");
        tx.commit().unwrap();
        assert_eq!(stored().as_deref(), Some("after"));
    }

    #[test]
    fn seq_rises_per_stream_and_a_failed_batch_leaves_no_gap() {
        let dir = crate::testutil::TempDir::new("writer");
        let mut conn = open(dir.path());
        let mut seqs = Seqs::default();
        let bad = Op::Exec {
            sql: "INSERT INTO no_such_table VALUES (1)",
            params: vec![],
        };
        let group = vec![
            Batch {
                ticket: 1,
                ops: vec![ev("a"), ev("a"), ev("b")],
            },
            Batch {
                ticket: 2,
                ops: vec![ev("a"), bad],
            },
            Batch {
                ticket: 3,
                ops: vec![ev("a")],
            },
        ];
        let out = commit_group(&mut conn, &mut seqs, &group);
        let seq_of = |c: &Committed| {
            c.result
                .as_ref()
                .unwrap()
                .iter()
                .map(|a| (a.stream.clone(), a.seq))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            seq_of(&out[0]),
            vec![("a".into(), 1), ("a".into(), 2), ("b".into(), 1)]
        );
        assert!(matches!(out[1].result, Err(WriteError::Failed(_))));
        assert_eq!(seq_of(&out[2]), vec![("a".into(), 3)]);
        // A fresh writer continues from the committed seq.
        let mut fresh = Seqs::default();
        let out = commit_group(
            &mut conn,
            &mut fresh,
            &[Batch {
                ticket: 4,
                ops: vec![ev("a")],
            }],
        );
        assert_eq!(seq_of(&out[0]), vec![("a".into(), 4)]);
        assert_eq!(crate::ledger::counts(&conn).unwrap(), (2, 5));
    }

    /// A batch of one operation.
    fn one(ticket: u64, op: Op) -> Batch {
        Batch {
            ticket,
            ops: vec![op],
        }
    }

    fn events(conn: &Connection) -> i64 {
        conn.query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .unwrap()
    }

    fn streams(conn: &Connection) -> Vec<(String, i64)> {
        let mut st = conn
            .prepare("SELECT stream, last_seq FROM streams ORDER BY stream")
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn a_failed_batch_of_one_statement_leaves_nothing_of_itself_and_the_group_goes_on() {
        let dir = crate::testutil::TempDir::new("writer-one");
        let mut conn = open(dir.path());
        let mut seqs = Seqs::default();
        let out = commit_group(&mut conn, &mut seqs, &[one(1, ev("a")), one(2, ev("b"))]);
        assert!(out.iter().all(|c| c.result.is_ok()));
        // Without a savepoint of its own, this batch's statement renames
        // `a` and then fails on `b`: SQLite undoes the statement whole.
        let rename = Op::Exec {
            sql: "UPDATE streams SET stream = 'x'",
            params: vec![],
        };
        let out = commit_group(
            &mut conn,
            &mut seqs,
            &[one(3, ev("a")), one(4, rename), one(5, ev("b"))],
        );
        assert!(out[0].result.is_ok());
        assert!(matches!(out[1].result, Err(WriteError::Failed(_))));
        assert!(out[2].result.is_ok());
        assert_eq!(streams(&conn), vec![("a".into(), 2), ("b".into(), 2)]);
        assert_eq!(events(&conn), 4);
    }

    #[test]
    fn a_transaction_sqlite_ended_fails_the_whole_group_and_gives_back_its_seqs() {
        let dir = crate::testutil::TempDir::new("writer-rollback");
        let mut conn = open(dir.path());
        let mut seqs = Seqs::default();
        let out = commit_group(&mut conn, &mut seqs, &[one(1, ev("a"))]);
        assert!(out[0].result.is_ok());
        // A conflict resolved by ROLLBACK ends the transaction, as an I/O
        // error or a full disk may: a batch run after it would commit on
        // its own, outside the group.
        let ends = Op::Exec {
            sql: "INSERT OR ROLLBACK INTO streams (stream, last_seq) VALUES ('a', 0)",
            params: vec![],
        };
        let out = commit_group(
            &mut conn,
            &mut seqs,
            &[
                one(2, ev("a")),
                one(3, ends),
                one(4, ev("a")),
                one(5, ev("c")),
            ],
        );
        assert_eq!(out.len(), 4);
        assert!(out.iter().all(|c| c.result.is_err()), "{out:?}");
        assert_eq!(streams(&conn), vec![("a".into(), 1)]);
        assert_eq!(events(&conn), 1);
        // The seqs the failed group took are free again.
        let out = commit_group(&mut conn, &mut seqs, &[one(6, ev("a"))]);
        assert_eq!(out[0].result.as_ref().unwrap()[0].seq, 2);
    }

    fn wal_len(dir: &std::path::Path) -> u64 {
        std::fs::metadata(dir.join("l.sqlite3-wal")).unwrap().len()
    }

    #[test]
    fn a_presized_wal_is_overwritten_not_grown_and_reads_back_after_a_crash() {
        let dir = crate::testutil::TempDir::new("presize");
        let mut conn = open(dir.path());
        let mut seqs = Seqs::default();
        let commit = |conn: &mut Connection, seqs: &mut Seqs, ticket: u64| {
            let out = commit_group(
                conn,
                seqs,
                &[Batch {
                    ticket,
                    ops: vec![ev("a")],
                }],
            );
            assert!(out[0].result.is_ok(), "{:?}", out[0].result);
        };
        commit(&mut conn, &mut seqs, 1);
        // As after a clean stop: every frame in the database and the WAL
        // empty, so the zeros start at its header.
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
        let before = wal_len(dir.path());
        assert_eq!(before, 0);
        let mut p = Presize::of(&conn).unwrap();
        assert_eq!(p.target, 32 + 1000 * (4096 + 24));
        let mut steps = 1;
        while p.step(&conn) {
            steps += 1;
        }
        assert_eq!(wal_len(dir.path()), p.target);
        assert_eq!(
            steps,
            (p.target - before).div_ceil(limits::LEDGER_WAL_PRESIZE_STEP)
        );
        // Commits go into the zeros: the file does not grow.
        for t in 2..=50 {
            commit(&mut conn, &mut seqs, t);
        }
        assert_eq!(wal_len(dir.path()), p.target);
        // The files as a crash leaves them (the connection still open, the
        // WAL not checkpointed) read back every commit and nothing of the
        // zeros after them.
        let image = crate::testutil::TempDir::new("presize-image");
        for f in ["l.sqlite3", "l.sqlite3-wal"] {
            std::fs::copy(dir.path().join(f), image.path().join(f)).unwrap();
        }
        let back = Connection::open(image.path().join("l.sqlite3")).unwrap();
        crate::ledger::quick_check(&back).unwrap();
        assert_eq!(crate::ledger::counts(&back).unwrap(), (1, 50));
        assert_eq!(crate::ledger::stream_last_seq(&back, "a").unwrap(), 50);
    }

    #[test]
    fn a_step_writes_nothing_while_another_connection_holds_the_write_lock() {
        let dir = crate::testutil::TempDir::new("presize-lock");
        let conn = open(dir.path());
        let mut p = Presize::of(&conn).unwrap();
        let before = wal_len(dir.path());
        // Another connection (the gateway's, an operator's) in the middle of
        // a write: its frames may be going in at the file's end.
        let other = Connection::open(dir.path().join("l.sqlite3")).unwrap();
        other
            .execute_batch(
                "BEGIN IMMEDIATE; INSERT INTO streams (stream, last_seq) VALUES ('x', 7)",
            )
            .unwrap();
        conn.busy_timeout(std::time::Duration::ZERO).unwrap();
        assert!(!p.step(&conn));
        assert_eq!(wal_len(dir.path()), before);
        other.execute_batch("COMMIT").unwrap();
        // Once it is done, a step goes on after its frames.
        let mut p = Presize::of(&conn).unwrap();
        let committed = wal_len(dir.path());
        assert!(committed > before);
        assert!(p.step(&conn));
        assert_eq!(
            wal_len(dir.path()),
            committed + limits::LEDGER_WAL_PRESIZE_STEP
        );
        assert_eq!(crate::ledger::stream_last_seq(&conn, "x").unwrap(), 7);
    }

    #[test]
    fn a_database_in_memory_is_not_presized() {
        let conn = Connection::open_in_memory().unwrap();
        assert!(Presize::of(&conn).is_none());
    }
}
