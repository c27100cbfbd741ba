//! Locked mode's rows in the ledger (migration 8; src/ledger/schema.rs):
//! the writes a [`Change`] makes, for the ledger writer, and the start-up
//! read, for the ledger reader. No other code names these tables.

use rusqlite::Connection;
use rusqlite::types::Value;

use super::{Change, Lock, NewLog, Stored};
use crate::ledger::Op;
use crate::trustlog::Entry;

const INSERT_ENTRY: &str = "INSERT INTO trustlog_entries (idx, hash, wire) VALUES (?1, ?2, ?3)";
const DELETE_FROM: &str = "DELETE FROM trustlog_entries WHERE idx >= ?1";
const SET: &str = "INSERT OR REPLACE INTO lock_state (key, value) VALUES (?1, ?2)";
const UNSET: &str = "DELETE FROM lock_state WHERE key = ?1";

const PIN: &str = "pin_genesis";
const LOCAL_DISABLED: &str = "local_disabled";
const QUARANTINED: &str = "quarantined";

fn insert(idx: usize, e: &Entry) -> Op {
    Op::Exec {
        sql: INSERT_ENTRY,
        params: vec![
            Value::Integer(idx as i64),
            Value::Blob(e.hash().0.to_vec()),
            Value::Blob(e.wire().to_vec()),
        ],
    }
}

fn set(key: &str, value: Vec<u8>) -> Op {
    Op::Exec {
        sql: SET,
        params: vec![Value::Text(key.into()), Value::Blob(value)],
    }
}

fn unset(key: &str) -> Op {
    Op::Exec {
        sql: UNSET,
        params: vec![Value::Text(key.into())],
    }
}

/// The writes that make `c` true of what `lock` holds, in one batch.
/// Adopting a chain keeps the rows of the prefix it shares with the log
/// held and rewrites the rest.
pub fn writes(lock: &Lock, c: &Change) -> Vec<Op> {
    let mut ops = Vec::new();
    if c.clear_quarantine && lock.unusable_rows() {
        ops.push(Op::Exec {
            sql: DELETE_FROM,
            params: vec![Value::Integer(0)],
        });
    }
    let held = lock.chain().map_or(&[][..], |h| h.entries());
    match &c.log {
        Some(NewLog::Append(entries)) => {
            for (i, e) in entries.iter().enumerate() {
                ops.push(insert(held.len() + i, e));
            }
        }
        Some(NewLog::Adopt(chain)) => {
            let new = chain.entries();
            let shared = held
                .iter()
                .zip(new)
                .take_while(|(a, b)| a.hash() == b.hash())
                .count();
            ops.push(Op::Exec {
                sql: DELETE_FROM,
                params: vec![Value::Integer(shared as i64)],
            });
            for (i, e) in new.iter().enumerate().skip(shared) {
                ops.push(insert(i, e));
            }
        }
        None => {}
    }
    match c.pin {
        Some(Some(h)) => ops.push(set(PIN, h.0.to_vec())),
        Some(None) => ops.push(unset(PIN)),
        None => {}
    }
    match c.local_disabled {
        Some(true) => ops.push(set(LOCAL_DISABLED, vec![1])),
        Some(false) => ops.push(unset(LOCAL_DISABLED)),
        None => {}
    }
    if c.clear_quarantine {
        ops.push(unset(QUARANTINED));
    }
    if let Some(g) = c.quarantine {
        ops.push(set(QUARANTINED, g.0.to_vec()));
    }
    ops
}

/// Everything locked mode keeps in the ledger, read at start.
pub fn read(conn: &Connection) -> rusqlite::Result<Stored> {
    let mut stored = Stored::default();
    let mut stmt = conn.prepare("SELECT wire FROM trustlog_entries ORDER BY idx")?;
    let rows = stmt.query_map([], |r| r.get::<_, Vec<u8>>(0))?;
    for w in rows {
        stored.entries.push(w?);
    }
    let mut stmt = conn.prepare("SELECT key, value FROM lock_state")?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
    })?;
    for row in rows {
        let (k, v) = row?;
        match k.as_str() {
            PIN => stored.pin = Some(v),
            LOCAL_DISABLED => stored.local_disabled = true,
            QUARANTINED => stored.quarantined = Some(v),
            _ => {}
        }
    }
    Ok(stored)
}
