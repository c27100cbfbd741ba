//! The ledger's schema and its migrations (issue 2, "The ledger"). The
//! database carries our `application_id` so that a file of another program is
//! never written to, and `user_version` counts the migrations applied. A
//! migration is appended to [`MIGRATIONS`], never edited once released.

use rusqlite::Connection;

/// "OMNC" as a big-endian integer: marks a database as an omniconfluxd ledger.
pub const APPLICATION_ID: i64 = 0x4F4D_4E43;

/// Each entry is one schema version: index 0 takes a new file to version 1.
pub const MIGRATIONS: &[&str] = &[
    // 1: the event streams. seq rises from 1 within a stream; `streams`
    // keeps the last seq of each so that appends and counts need no scan.
    "CREATE TABLE events (
        stream TEXT NOT NULL,
        seq    INTEGER NOT NULL CHECK (seq >= 1),
        kind   TEXT NOT NULL,
        ts     TEXT NOT NULL,
        data   TEXT NOT NULL,
        PRIMARY KEY (stream, seq)
    ) WITHOUT ROWID;
    CREATE TABLE streams (
        stream   TEXT PRIMARY KEY,
        last_seq INTEGER NOT NULL
    ) WITHOUT ROWID;",
    // 2: the plugin host (issue 4). Each plugin's storage folder, one row
    // per key; and the task requests plugins made, with the digest of the
    // request as stored, which is what the operator approves.
    "CREATE TABLE plugin_storage (
        plugin TEXT NOT NULL,
        key    TEXT NOT NULL,
        value  TEXT NOT NULL,
        PRIMARY KEY (plugin, key)
    ) WITHOUT ROWID;
    CREATE TABLE plugin_requests (
        request_id TEXT PRIMARY KEY,
        plugin     TEXT NOT NULL,
        plugin_name TEXT NOT NULL,
        params     TEXT NOT NULL,
        digest     TEXT NOT NULL,
        last_event TEXT,
        state      TEXT NOT NULL,
        created_at TEXT NOT NULL,
        expires_at TEXT NOT NULL
    ) WITHOUT ROWID;",
    // 3: sessions, their transcripts and the approvals inbox (issue 3).
    // A session row is rewritten whole on every change of its state; the
    // transcript keeps each entry once, tool input and result whole; an
    // approval row keeps who answered, when, and through which surface.
    "CREATE TABLE sessions (
        id               TEXT PRIMARY KEY,
        harness          TEXT NOT NULL,
        provider         TEXT NOT NULL,
        transport        TEXT NOT NULL,
        cwd              TEXT NOT NULL,
        name             TEXT,
        parent           TEXT,
        model            TEXT,
        created_at       TEXT NOT NULL,
        agent_session_id TEXT,
        ended            INTEGER NOT NULL DEFAULT 0,
        turn             INTEGER NOT NULL DEFAULT 0,
        turn_active      INTEGER NOT NULL DEFAULT 0,
        end_reason       TEXT,
        exit_code        INTEGER,
        exit_signal      TEXT,
        input_tokens     INTEGER NOT NULL DEFAULT 0,
        output_tokens    INTEGER NOT NULL DEFAULT 0,
        last_activity    TEXT,
        next_request     INTEGER NOT NULL DEFAULT 1,
        transcript_len   INTEGER NOT NULL DEFAULT 0
    ) WITHOUT ROWID;
    CREATE TABLE transcript (
        session     TEXT NOT NULL,
        idx         INTEGER NOT NULL,
        kind        TEXT NOT NULL,
        ts          TEXT NOT NULL,
        text        TEXT,
        tool_id     TEXT,
        tool_name   TEXT,
        tool_kind   TEXT,
        tool_status TEXT,
        tool_input  TEXT,
        tool_result TEXT,
        PRIMARY KEY (session, idx)
    ) WITHOUT ROWID;
    CREATE TABLE approvals (
        id          TEXT PRIMARY KEY,
        subject     TEXT NOT NULL,
        session     TEXT,
        action      TEXT NOT NULL,
        tool        TEXT NOT NULL,
        digest      TEXT NOT NULL,
        risk        TEXT NOT NULL,
        created_at  TEXT NOT NULL,
        expires_at  TEXT,
        fallback    TEXT NOT NULL,
        state       TEXT NOT NULL,
        decision    TEXT,
        delivered   INTEGER,
        answered_by TEXT,
        surface     TEXT,
        answered_at TEXT,
        reason      TEXT
    ) WITHOUT ROWID;",
    // 4: lanes (issue 5). A lane's whole state is one JSON record, written
    // in the same batch as the lane event that changed it; `archived` keeps
    // merged and closed lanes out of the start-up read.
    "CREATE TABLE lanes (
        id       TEXT PRIMARY KEY,
        archived INTEGER NOT NULL DEFAULT 0,
        record   TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX lanes_live ON lanes (archived);
    CREATE TABLE repos (
        path     TEXT PRIMARY KEY,
        added_at TEXT NOT NULL
    ) WITHOUT ROWID;",
    // 5: a growing transcript entry is stored as parts. Migration 3's
    // transcript appended each chunk with `text = text || ?`, which rewrites
    // the whole row: a turn of n chunks wrote O(n^2) bytes. Now an entry's
    // row keeps the text it was first written with (part 0) and each later
    // append is one row here (part 1, 2, ...); reads concatenate them in
    // order. Every row written before this migration holds its entry's
    // whole text, which is exactly part 0 of an entry with no further
    // parts: the existing text is already in the new shape and stays where
    // it is, so the migration only adds the table, whatever the ledger's
    // size.
    "CREATE TABLE transcript_parts (
        session TEXT NOT NULL,
        idx     INTEGER NOT NULL,
        part    INTEGER NOT NULL CHECK (part >= 1),
        text    TEXT NOT NULL,
        PRIMARY KEY (session, idx, part)
    ) WITHOUT ROWID;",
    // 6: the HTTP API's client identities (issue 6, phase 2; seed 002,
    // "Creation" and "Input admission and outcomes"). A creation row maps
    // the client's UUIDv7 to the session it created, with the submitted
    // intent (canonical JSON) and the decision (201, or the rejection's
    // status and problem). An input row keeps its intent, decision,
    // acceptance order and delivery, so retries get the retained decision
    // across restarts and a waiting input survives one.
    "CREATE TABLE http_creations (
        id         TEXT PRIMARY KEY,
        intent     TEXT NOT NULL,
        session    TEXT,
        status     INTEGER NOT NULL,
        problem    TEXT,
        created_at TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE http_inputs (
        id          TEXT PRIMARY KEY,
        session     TEXT NOT NULL,
        intent      TEXT NOT NULL,
        kind        TEXT NOT NULL,
        status      INTEGER NOT NULL,
        problem     TEXT,
        accepted_at TEXT NOT NULL,
        ord         INTEGER,
        delivery    TEXT,
        turn        INTEGER,
        outcome     TEXT,
        position    INTEGER,
        ended_at    TEXT
    ) WITHOUT ROWID;",
    // 7: the approvals inbox's history outlives a restart and names the
    // exact action (issue 10, items 11 and 12). `plugin` and `summary` are
    // what a plugin's task or a lane's merge shows (filled from
    // plugin_requests for the rows before this migration); `target` is the
    // exact action of an agent's request as JSON ({kind, text, truncated}),
    // NULL for rows before it. The index serves the start-up read of the
    // newest resolved rows.
    "ALTER TABLE approvals ADD COLUMN plugin TEXT;
    ALTER TABLE approvals ADD COLUMN summary TEXT;
    ALTER TABLE approvals ADD COLUMN target TEXT;
    UPDATE approvals SET plugin = (SELECT plugin FROM plugin_requests WHERE request_id = approvals.id)
        WHERE subject = 'plugin-task';
    CREATE INDEX approvals_by_state ON approvals (state, answered_at);",
    // 8: locked mode on the node (issue 14; seed 004, Locked mode). The
    // trust log the node holds, one row per entry in chain order (idx 0 is
    // the genesis), each its wire form and hash; a fork the node adopts
    // deletes the rows after the fork point and writes its own. `lock_state`
    // holds the pinned genesis (`pin_genesis`), the local disable
    // (`local_disabled`) and the quarantine (`quarantined`, the genesis
    // that caused it, empty when unknown). The signer key is not here: it
    // is a 0600 file of the state directory (src/lock/key.rs says why).
    "CREATE TABLE trustlog_entries (
        idx  INTEGER PRIMARY KEY CHECK (idx >= 0),
        hash BLOB NOT NULL,
        wire BLOB NOT NULL
    );
    CREATE TABLE lock_state (
        key   TEXT PRIMARY KEY,
        value BLOB NOT NULL
    ) WITHOUT ROWID;",
    // 9: the gateway's paired devices (issue 12; seed 004, "Pairing a new
    // device"): each by the SHA-256 of its client token, never the token,
    // and when it first connected. Written by the gateway thread's own
    // connection (src/gateway/tokens.rs).
    "CREATE TABLE gateway_clients (
        id         TEXT PRIMARY KEY,
        created_at TEXT NOT NULL
    ) WITHOUT ROWID;",
    // 10: what an answer carried beyond allow or deny (issue 13, seed 004
    // "Answering an interaction"): a question's answers and the permission
    // mode an allow switched to, as JSON ({"answers": {question: [label]},
    // "set_mode": mode}); NULL for a plain answer and the rows before it.
    "ALTER TABLE approvals ADD COLUMN answer TEXT;",
    // 11: transcripts move out of WITHOUT ROWID tables (issue 11, the
    // fan-out figure). A WITHOUT ROWID table is a B-tree keyed by its whole
    // row, and SQLite compares a key against a cell whose row overflows its
    // page by reading the whole row, overflow pages and all: every INSERT
    // of a part (a round of streamed text, 1.5 to 6 KB) read several KB of
    // earlier parts back, in the leaf and in the interior pages, whose
    // dividers are whole rows too. As rowid tables the rows are appended
    // by rowid and the key lives in its own small index: measured on the
    // fan-out bench's write pattern, a part costs half the instructions
    // and a sixteenth of the reads, and the file is half the size.
    // Names, columns, types, CHECKs and the key (now a UNIQUE index) are
    // as before, so no statement changes. The rows are copied in key
    // order, so a session's rows keep adjacent rowids; this is the one
    // migration whose time grows with the ledger.
    "CREATE TABLE transcript_new (
        session     TEXT NOT NULL,
        idx         INTEGER NOT NULL,
        kind        TEXT NOT NULL,
        ts          TEXT NOT NULL,
        text        TEXT,
        tool_id     TEXT,
        tool_name   TEXT,
        tool_kind   TEXT,
        tool_status TEXT,
        tool_input  TEXT,
        tool_result TEXT,
        PRIMARY KEY (session, idx)
    );
    INSERT INTO transcript_new (session, idx, kind, ts, text, tool_id, tool_name, tool_kind,
            tool_status, tool_input, tool_result)
        SELECT session, idx, kind, ts, text, tool_id, tool_name, tool_kind,
            tool_status, tool_input, tool_result
        FROM transcript ORDER BY session, idx;
    DROP TABLE transcript;
    ALTER TABLE transcript_new RENAME TO transcript;
    CREATE TABLE transcript_parts_new (
        session TEXT NOT NULL,
        idx     INTEGER NOT NULL,
        part    INTEGER NOT NULL CHECK (part >= 1),
        text    TEXT NOT NULL,
        PRIMARY KEY (session, idx, part)
    );
    INSERT INTO transcript_parts_new (session, idx, part, text)
        SELECT session, idx, part, text FROM transcript_parts ORDER BY session, idx, part;
    DROP TABLE transcript_parts;
    ALTER TABLE transcript_parts_new RENAME TO transcript_parts;",
];

/// The schema version this binary writes.
pub fn current_version() -> i64 {
    MIGRATIONS.len() as i64
}

/// Why a database cannot be written by this binary.
#[derive(Debug, Clone, PartialEq)]
pub enum Untrusted {
    /// Another program's database.
    ForeignApplication(i64),
    /// Written by a newer omniconfluxd; writing could destroy what it added.
    NewerSchema(i64),
    /// The tables are not what the version says they are.
    MissingTable(&'static str),
    /// No omniconfluxd writes a negative schema version.
    NegativeSchema(i64),
}

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Untrusted::ForeignApplication(id) => write!(
                f,
                "the file belongs to another program (application_id {id})"
            ),
            Untrusted::NewerSchema(v) => {
                write!(
                    f,
                    "schema version {v} was written by a newer omniconfluxd (this one knows {})",
                    current_version()
                )
            }
            Untrusted::MissingTable(t) => write!(f, "the table {t} is missing"),
            Untrusted::NegativeSchema(v) => write!(f, "schema version {v} is negative"),
        }
    }
}

/// Outcome of preparing a database for writing.
pub enum Prepared {
    Ready { migrated_from: i64 },
    Untrusted(Untrusted),
}

/// Checks identity and version, then applies the migrations this file lacks
/// in one transaction. On a ledger at the current version it reads only the
/// header and the schema table; a ledger before version 11 has its
/// transcripts copied once (migration 11), which takes time in proportion
/// to their size.
pub fn prepare(conn: &mut Connection) -> rusqlite::Result<Prepared> {
    let app: i64 = conn.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let tables: i64 = conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
    if app != APPLICATION_ID && !(app == 0 && version == 0 && tables == 0) {
        return Ok(Prepared::Untrusted(Untrusted::ForeignApplication(app)));
    }
    if version < 0 {
        return Ok(Prepared::Untrusted(Untrusted::NegativeSchema(version)));
    }
    if version > current_version() {
        return Ok(Prepared::Untrusted(Untrusted::NewerSchema(version)));
    }
    if version >= 1 {
        for t in ["events", "streams"] {
            let n: i64 = conn.query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [t],
                |r| r.get(0),
            )?;
            if n == 0 {
                return Ok(Prepared::Untrusted(Untrusted::MissingTable(t)));
            }
        }
    }
    if version < current_version() {
        let tx = conn.transaction()?;
        for m in &MIGRATIONS[version as usize..] {
            tx.execute_batch(m)?;
        }
        tx.execute_batch(&format!(
            "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {};",
            current_version()
        ))?;
        tx.commit()?;
    }
    Ok(Prepared::Ready {
        migrated_from: version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_negative_schema_version_is_untrusted() {
        let mut c = Connection::open_in_memory().unwrap();
        c.execute_batch(&format!(
            "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = -1;"
        ))
        .unwrap();
        assert!(matches!(
            prepare(&mut c).unwrap(),
            Prepared::Untrusted(Untrusted::NegativeSchema(-1))
        ));
    }

    /// Every column of every row of both transcript tables, in key order.
    fn transcript_rows(c: &Connection) -> Vec<Vec<rusqlite::types::Value>> {
        let mut rows = Vec::new();
        for sql in [
            "SELECT * FROM transcript ORDER BY session, idx",
            "SELECT * FROM transcript_parts ORDER BY session, idx, part",
        ] {
            let mut stmt = c.prepare(sql).unwrap();
            let n = stmt.column_count();
            let mut q = stmt.query([]).unwrap();
            while let Some(r) = q.next().unwrap() {
                rows.push((0..n).map(|i| r.get(i).unwrap()).collect());
            }
        }
        rows
    }

    #[test]
    fn migration_11_keeps_every_transcript_row_and_the_keys() {
        let dir = crate::testutil::TempDir::new("schema11");
        let path = dir.path().join("l.sqlite3");
        let mut c = Connection::open(&path).unwrap();
        crate::ledger::configure(&c, true).unwrap().unwrap();
        // A ledger as version 10 left it, with rows of every shape: NULLs,
        // tool input and result, text long enough to overflow a page, and
        // parts of two sessions.
        let tx = c.transaction().unwrap();
        for m in &MIGRATIONS[..10] {
            tx.execute_batch(m).unwrap();
        }
        tx.execute_batch(&format!(
            "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = 10;"
        ))
        .unwrap();
        tx.commit().unwrap();
        let long = "é".repeat(5000);
        for (sid, idx, kind, text, tool) in [
            ("s1", 0, "user", Some("go"), None),
            ("s1", 1, "text", Some(long.as_str()), None),
            (
                "s1",
                2,
                "tool",
                None,
                Some(("t1", "{\"path\":\"/x\"}", "no")),
            ),
            ("s1", 3, "turn_end", Some("completed"), None),
            ("s0", 0, "thinking", Some("hm"), None),
        ] {
            c.execute(
                "INSERT INTO transcript (session, idx, kind, ts, text, tool_id, tool_name, tool_kind, \
                 tool_status, tool_input, tool_result) VALUES (?1, ?2, ?3, 'ts', ?4, ?5, ?6, NULL, ?7, ?8, ?9)",
                rusqlite::params![
                    sid,
                    idx,
                    kind,
                    text,
                    tool.map(|t| t.0),
                    tool.map(|_| "Read"),
                    tool.map(|_| "failed"),
                    tool.map(|t| t.1),
                    tool.map(|t| t.2),
                ],
            )
            .unwrap();
        }
        for (sid, idx, part) in [("s1", 1, 1), ("s1", 1, 2), ("s0", 0, 1)] {
            c.execute(
                "INSERT INTO transcript_parts (session, idx, part, text) VALUES (?1, ?2, ?3, ?4)",
                rusqlite::params![sid, idx, part, format!("{long}{part}")],
            )
            .unwrap();
        }
        let before = transcript_rows(&c);
        assert_eq!(before.len(), 8);

        assert!(matches!(
            prepare(&mut c).unwrap(),
            Prepared::Ready { migrated_from: 10 }
        ));
        assert_eq!(transcript_rows(&c), before);
        let version: i64 = c
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, current_version());
        // Ordinary rowid tables now, under the same names.
        for t in ["transcript", "transcript_parts"] {
            let sql: String = c
                .query_row(
                    "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?1",
                    [t],
                    |r| r.get(0),
                )
                .unwrap();
            assert!(!sql.contains("WITHOUT ROWID"), "{sql}");
        }
        let no_leftovers: i64 = c
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name LIKE '%_new%'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(no_leftovers, 0);
        // The keys, the CHECK and NOT NULL still hold.
        for bad in [
            "INSERT INTO transcript (session, idx, kind, ts) VALUES ('s1', 1, 'text', 'ts')",
            "INSERT INTO transcript (session, idx, kind, ts) VALUES (NULL, 9, 'text', 'ts')",
            "INSERT INTO transcript_parts (session, idx, part, text) VALUES ('s1', 1, 2, 'x')",
            "INSERT INTO transcript_parts (session, idx, part, text) VALUES ('s1', 1, 0, 'x')",
        ] {
            let e = c.execute(bad, []).unwrap_err();
            assert_eq!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::ConstraintViolation),
                "{bad}"
            );
        }
        // The statements of src/core/transcript.rs run as they are.
        c.execute(
            "UPDATE transcript SET tool_result = coalesce(?3, tool_result) WHERE session = ?1 AND idx = ?2",
            rusqlite::params!["s1", 2, "yes"],
        )
        .unwrap();
        c.execute(
            "INSERT INTO transcript_parts (session, idx, part, text) VALUES ('s1', 1, 3, 'x')",
            [],
        )
        .unwrap();
        let read = crate::core::transcript::read_entries(&c, "s1", 0, 10).unwrap();
        assert_eq!(read.len(), 4);
        assert_eq!(
            read[1]["text"],
            serde_json::json!(format!("{long}{long}1{long}2x"))
        );
    }
}
