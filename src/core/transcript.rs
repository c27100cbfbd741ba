//! A session's transcript, normalised into entries (seed 004, Transcripts
//! and the Transcript data type; issue 3): user, text, thinking, tool,
//! turn_end, system. This file owns the entries in memory for the running
//! turn, the ledger writes that record them, the `transcript.delta`s that
//! tell subscribers about them, and the reads that assemble them back from
//! the ledger. Every entry is stored once in the ledger's `transcript`
//! table with tool input and result whole; the wire form (camelCase, as the
//! spec's Entry) never carries them: `sessions.toolDetail` reads them.
//!
//! Consecutive text (or thinking) chunks of the agent are one entry that
//! grows; later reports about a tool call change its entry. So only the
//! running turn's entries can change, and only they are kept in memory
//! (`TRANSCRIPT_TURN_CACHE`), to build `transcript.delta`s: an idle session
//! holds none. Entry ids are `e<index>`, stable as the transcript grows.
//!
//! Storage of a growing entry: its `transcript` row holds the text it had
//! when it was first written (part 0), and each later append is one row of
//! `transcript_parts` (part 1, 2, ...), which reads concatenate in order.
//! Appending a chunk used to rewrite the whole row (`text = text || ?` on a
//! WITHOUT ROWID table copies the row in its B-tree), so a turn of n
//! chunks cost O(n²) bytes written; an INSERT of a part costs what the part
//! holds, so a turn costs O(total bytes). This is simpler than keeping the
//! text in memory and switching shapes past a size: one shape, one read
//! path, and nothing to convert when an entry grows. Chunks are not
//! written one by one either: the first chunk of a round notes where the
//! cached entry's text stood (0 for an entry the round started), and
//! [`Transcript::flush`], run once per round (all lines of one wake-up of
//! the agent's pipe), writes what the entry gained since as the row's
//! first text or as one part, so a round costs one statement however many
//! chunks it had. A chunk is appended to the cached entry only; the round's
//! text is copied out of it once, at its final size.
//!
//! Deltas: a delta cuts the client's list at `from_index` and appends
//! `entries` (seed 004); it has no way to append to an entry's text, so a
//! delta that changes the growing entry carries it whole. The smallest
//! wire cost the protocol allows is then one delta per change *seen* by a
//! subscriber, not per chunk: [`Transcript::flush`] builds at most one
//! delta per round (the entries from the first one the round changed), and
//! the session core merges the deltas of every batch committed together
//! into one line per subscriber (the socket's `watches::flush_deltas`).

use rusqlite::types::Value as Sql;
use serde_json::{Map, Value, json};
use std::collections::HashMap;

use crate::agents::{Entry, ToolEntry, ToolStatus};
use crate::ledger::Op;
use crate::limits;

const INSERT: &str = "INSERT INTO transcript (session, idx, kind, ts, text, tool_id, tool_name, tool_kind, tool_status, tool_input, tool_result) \
                      VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";
const APPEND_PART: &str =
    "INSERT INTO transcript_parts (session, idx, part, text) VALUES (?1, ?2, ?3, ?4)";
const TOOL_UPDATE: &str = "UPDATE transcript SET tool_name = coalesce(?3, tool_name), tool_kind = coalesce(?4, tool_kind), \
                           tool_status = coalesce(?5, tool_status), tool_input = coalesce(?6, tool_input), \
                           tool_result = coalesce(?7, tool_result) WHERE session = ?1 AND idx = ?2";

/// Entries from `from` to the end, as they are now: what a client applies
/// by cutting its list to `from` and appending.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    pub from: usize,
    pub entries: Vec<Value>,
}

impl Delta {
    /// Folds a later change into this one.
    pub fn merge(slot: &mut Option<Delta>, next: Delta) {
        match slot {
            Some(d) if next.from >= d.from && next.from <= d.from + d.entries.len() => {
                d.entries.truncate(next.from - d.from);
                d.entries.extend(next.entries);
            }
            _ => *slot = Some(next),
        }
    }
}

/// Text of the last entry not yet handed to the ledger: its cached
/// entry's text from byte `from` on. The entry stays cached until the text
/// is written (the cache drops entries only in [`Transcript::flush`], after
/// it writes the pending text), and its text only grows, so `from` stays a
/// boundary inside it.
#[derive(Debug)]
struct Pending {
    idx: usize,
    /// The entry's row is not written yet (its kind and timestamp): the text
    /// goes into its INSERT. Otherwise the text is the entry's next part.
    row: Option<(&'static str, String)>,
    from: usize,
}

#[derive(Default, Debug)]
pub struct Transcript {
    /// How many entries the session has.
    pub len: usize,
    /// The index of `cache[0]`.
    cache_start: usize,
    cache: Vec<Map<String, Value>>,
    /// Tool call id -> entry index, for the running turn.
    tools: HashMap<String, usize>,
    /// The last entry's text not yet written: where it starts, and the
    /// entry's kind and timestamp while its row is not written either.
    pending: Option<Pending>,
    /// The next part number of the last entry (its row is part 0).
    next_part: i64,
    /// The first cached entry changed since the last flush.
    dirty_from: Option<usize>,
    /// Where the turn that ended since the last flush ended: entries before
    /// it leave the cache once its delta is built.
    ended_at: Option<usize>,
}

fn text_kind(e: &Entry) -> Option<(&'static str, &str)> {
    match e {
        Entry::Text { text } => Some(("text", text)),
        Entry::Thinking { text } => Some(("thinking", text)),
        _ => None,
    }
}

fn status_name(s: ToolStatus) -> &'static str {
    match s {
        ToolStatus::Pending => "pending",
        ToolStatus::InProgress => "in_progress",
        ToolStatus::Completed => "completed",
        ToolStatus::Failed => "failed",
    }
}

fn opt(s: Option<String>) -> Sql {
    s.map(Sql::Text).unwrap_or(Sql::Null)
}

/// The first characters of a tool's input, for `inputPreview`.
pub fn preview(input: &str) -> String {
    input
        .chars()
        .take(limits::TRANSCRIPT_PREVIEW_CHARS)
        .collect()
}

impl Transcript {
    pub fn restored(len: usize) -> Transcript {
        Transcript {
            len,
            cache_start: len,
            ..Transcript::default()
        }
    }

    /// The running turn's entries, from `from` on, if they are cached.
    pub fn cached_from(&self, from: usize) -> Option<Vec<Value>> {
        if from < self.cache_start || from > self.len {
            return None;
        }
        Some(
            self.cache[from - self.cache_start..]
                .iter()
                .map(|m| Value::Object(m.clone()))
                .collect(),
        )
    }

    /// Where the cache starts, and whether it holds anything.
    pub fn cache_start(&self) -> Option<usize> {
        (!self.cache.is_empty()).then_some(self.cache_start)
    }

    fn touched(&mut self, idx: usize) {
        if idx >= self.cache_start {
            self.dirty_from = Some(self.dirty_from.map_or(idx, |d| d.min(idx)));
        }
    }

    /// Appends a chunk of `kind` (`text` or `thinking`) to the last entry
    /// when that entry is of the same kind and still cached: the commonest
    /// thing an agent's stream does, so it takes the chunk borrowed (the
    /// session core's fast path hands it straight from the agent's line).
    /// False when the chunk starts a new entry; [`push`](Self::push)
    /// records that.
    pub fn grow(&mut self, sid: &str, kind: &str, text: &str, ops: &mut Vec<Op>) -> bool {
        let last = self.len.checked_sub(1);
        let cached_last = self.cache_start + self.cache.len();
        let (Some(idx), Some(m)) = (last, self.cache.last_mut()) else {
            return false;
        };
        if m.get("kind").and_then(Value::as_str) != Some(kind) || idx + 1 != cached_last {
            return false;
        }
        let Some(Value::String(s)) = m.get_mut("text") else {
            return false;
        };
        let from = s.len();
        s.push_str(text);
        if self.pending.as_ref().is_none_or(|p| p.idx != idx) {
            self.write_pending(sid, ops);
            self.pending = Some(Pending {
                idx,
                row: None,
                from,
            });
        }
        self.touched(idx);
        true
    }

    /// Records `entry`: its ledger operations go to `ops` (the text of a
    /// growing entry at the next [`flush`](Self::flush)), and the change to
    /// the next flush's delta. A new entry is stamped `ts`, or now when it
    /// is `None`: a chunk that grows an entry costs no clock read or format.
    pub fn push(
        &mut self,
        sid: &str,
        entry: &Entry,
        ts: Option<&str>,
        is_error: bool,
        ops: &mut Vec<Op>,
    ) {
        // A text chunk after a text chunk grows that entry.
        if let Some((kind, text)) = text_kind(entry) {
            if self.grow(sid, kind, text, ops) {
                return;
            }
        }
        // Anything else is recorded in order after the text before it.
        self.write_pending(sid, ops);
        if let Entry::Tool(t) = entry {
            if let Some(&idx) = self.tools.get(&t.id) {
                self.update_tool(sid, idx, t, ops);
                return;
            }
        }
        let idx = self.len;
        let ts = ts.map_or_else(crate::clock::now_ts, str::to_string);
        let ts = ts.as_str();
        let mut wire = Map::new();
        wire.insert("id".into(), json!(format!("e{idx}")));
        wire.insert("timestamp".into(), json!(ts));
        let Columns {
            kind,
            text,
            tool_id,
            tool_name,
            tool_kind,
            status,
            input,
            result,
        } = match entry {
            Entry::User { text } => Columns::plain("user", text.clone()),
            Entry::Text { text } => Columns::plain("text", text.clone()),
            Entry::Thinking { text } => Columns::plain("thinking", text.clone()),
            Entry::System { text } => Columns {
                status: is_error.then(|| "error".to_string()),
                ..Columns::plain("system", text.clone())
            },
            Entry::TurnEnd { reason } => Columns::plain("turn_end", reason.wire_name().to_string()),
            Entry::Tool(t) => {
                self.tools.insert(t.id.clone(), idx);
                let name = t
                    .title
                    .clone()
                    .or_else(|| t.kind.map(|k| k.wire_name().to_string()));
                Columns {
                    kind: "tool",
                    text: None,
                    tool_id: Some(t.id.clone()),
                    tool_name: name,
                    tool_kind: t.kind.map(|k| k.wire_name().to_string()),
                    status: t.status.map(|s| status_name(s).to_string()),
                    input: t.input.as_ref().map(Value::to_string),
                    result: t.result.as_ref().map(Value::to_string),
                }
            }
        };
        wire.insert("kind".into(), json!(kind));
        fill_wire(
            &mut wire,
            kind,
            text.as_deref(),
            tool_id.as_deref(),
            tool_name.as_deref(),
            status.as_deref(),
            input.as_deref(),
        );
        if let (Some((k, _)), Some(_)) = (text_kind(entry), &text) {
            // A text entry is written at the flush, with the text of every
            // chunk of this round.
            self.pending = Some(Pending {
                idx,
                row: Some((k, ts.to_string())),
                from: 0,
            });
            self.next_part = 1;
        } else {
            ops.push(Op::Exec {
                sql: INSERT,
                params: vec![
                    Sql::Text(sid.into()),
                    Sql::Integer(idx as i64),
                    Sql::Text(kind.into()),
                    Sql::Text(ts.into()),
                    opt(text),
                    opt(tool_id),
                    opt(tool_name),
                    opt(tool_kind),
                    opt(status),
                    opt(input),
                    opt(result),
                ],
            });
        }
        self.len += 1;
        if self.cache.is_empty() {
            self.cache_start = idx;
        }
        self.cache.push(wire);
        self.touched(idx);
        if kind == "turn_end" {
            // The turn is over: nothing of it changes any more. Its entries
            // leave the cache once this round's delta is built.
            self.ended_at = Some(self.len);
            self.tools.clear();
        }
    }

    /// Writes the pending text of the last entry: its row, or one part.
    fn write_pending(&mut self, sid: &str, ops: &mut Vec<Op>) {
        let Some(p) = self.pending.take() else { return };
        let cached = p
            .idx
            .checked_sub(self.cache_start)
            .and_then(|pos| self.cache.get(pos))
            .and_then(|m| m.get("text")?.as_str()?.get(p.from..));
        let text = match cached {
            Some(t) => t.to_string(),
            // Cannot happen while `Pending`'s invariant holds; if it broke,
            // the row or part is still written, so the entry keeps its
            // index, and the log says which text went missing.
            None => {
                debug_assert!(false, "pending text of e{} is not cached", p.idx);
                crate::warn!(
                    "session {sid}: the text of transcript entry e{} was not cached when written",
                    p.idx
                );
                String::new()
            }
        };
        match p.row {
            Some((kind, ts)) => ops.push(Op::Exec {
                sql: INSERT,
                params: vec![
                    Sql::Text(sid.into()),
                    Sql::Integer(p.idx as i64),
                    Sql::Text(kind.into()),
                    Sql::Text(ts),
                    Sql::Text(text),
                    Sql::Null,
                    Sql::Null,
                    Sql::Null,
                    Sql::Null,
                    Sql::Null,
                    Sql::Null,
                ],
            }),
            None => {
                ops.push(Op::Exec {
                    sql: APPEND_PART,
                    params: vec![
                        Sql::Text(sid.into()),
                        Sql::Integer(p.idx as i64),
                        Sql::Integer(self.next_part),
                        Sql::Text(text),
                    ],
                });
                self.next_part += 1;
            }
        }
    }

    /// Ends a round: writes the pending text to `ops` and returns the
    /// round's delta (the entries from the first one it changed, as they
    /// are now), then lets go of a finished turn and of entries past the
    /// cache bound.
    pub fn flush(&mut self, sid: &str, ops: &mut Vec<Op>) -> Option<Delta> {
        self.write_pending(sid, ops);
        let delta = self.dirty_from.take().and_then(|from| self.delta(from));
        if let Some(end) = self.ended_at.take() {
            let drop = end.saturating_sub(self.cache_start).min(self.cache.len());
            self.cache.drain(..drop);
            self.cache_start += drop;
        }
        if self.cache.len() > limits::TRANSCRIPT_TURN_CACHE {
            let drop = self.cache.len() - limits::TRANSCRIPT_TURN_CACHE;
            self.cache.drain(..drop);
            self.cache_start += drop;
        }
        if self.cache.is_empty() {
            self.cache_start = self.len;
        }
        delta
    }

    fn update_tool(&mut self, sid: &str, idx: usize, t: &ToolEntry, ops: &mut Vec<Op>) {
        let name = t.title.clone();
        ops.push(Op::Exec {
            sql: TOOL_UPDATE,
            params: vec![
                Sql::Text(sid.into()),
                Sql::Integer(idx as i64),
                opt(name.clone()),
                opt(t.kind.map(|k| k.wire_name().to_string())),
                opt(t.status.map(|s| status_name(s).to_string())),
                opt(t.input.as_ref().map(Value::to_string)),
                opt(t.result.as_ref().map(Value::to_string)),
            ],
        });
        let Some(pos) = idx.checked_sub(self.cache_start) else {
            return;
        };
        let Some(m) = self.cache.get_mut(pos) else {
            return;
        };
        if let Some(n) = name {
            m.insert("toolName".into(), json!(n));
        }
        if let Some(input) = &t.input {
            m.insert("inputPreview".into(), json!(preview(&input.to_string())));
        }
        if let Some(s) = t.status {
            m.insert("resultIsError".into(), json!(s == ToolStatus::Failed));
        }
        self.touched(idx);
    }

    fn delta(&self, from: usize) -> Option<Delta> {
        self.cached_from(from)
            .map(|entries| Delta { from, entries })
    }
}

fn fill_wire(
    m: &mut Map<String, Value>,
    kind: &str,
    text: Option<&str>,
    tool_id: Option<&str>,
    tool_name: Option<&str>,
    status: Option<&str>,
    input: Option<&str>,
) {
    match kind {
        "tool" => {
            if let Some(n) = tool_name {
                m.insert("toolName".into(), json!(n));
            }
            if let Some(id) = tool_id {
                m.insert("toolId".into(), json!(id));
            }
            if let Some(i) = input {
                m.insert("inputPreview".into(), json!(preview(i)));
            }
            if let Some(s) = status {
                if s == "completed" || s == "failed" {
                    m.insert("resultIsError".into(), json!(s == "failed"));
                }
            }
        }
        "turn_end" => {
            let reason = text.unwrap_or("completed");
            m.insert("stopReason".into(), json!(reason));
            m.insert("interrupted".into(), json!(reason == "interrupted"));
        }
        "system" => {
            m.insert("text".into(), json!(text.unwrap_or_default()));
            if status == Some("error") {
                m.insert("isError".into(), json!(true));
            }
        }
        _ => {
            m.insert("text".into(), json!(text.unwrap_or_default()));
        }
    }
}

/// One `transcript` row as read, before its parts are added.
struct Row {
    idx: i64,
    kind: String,
    ts: String,
    text: Option<String>,
    tool_id: Option<String>,
    tool_name: Option<String>,
    status: Option<String>,
    input: Option<String>,
}

/// Entries `from..` of a session from the ledger (reader thread), at most
/// `limit`, in wire form: each entry's text is its row's followed by its
/// parts in order.
pub fn read_entries(
    conn: &rusqlite::Connection,
    sid: &str,
    from: usize,
    limit: usize,
) -> rusqlite::Result<Vec<Value>> {
    let mut stmt = conn.prepare_cached(
        "SELECT idx, kind, ts, text, tool_id, tool_name, tool_status, tool_input FROM transcript \
         WHERE session = ?1 AND idx >= ?2 ORDER BY idx LIMIT ?3",
    )?;
    let mut rows = stmt
        .query_map(rusqlite::params![sid, from as i64, limit as i64], |r| {
            Ok(Row {
                idx: r.get(0)?,
                kind: r.get(1)?,
                ts: r.get(2)?,
                text: r.get(3)?,
                tool_id: r.get(4)?,
                tool_name: r.get(5)?,
                status: r.get(6)?,
                input: r.get(7)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<Row>>>()?;
    if let (Some(first), Some(last)) = (rows.first().map(|r| r.idx), rows.last().map(|r| r.idx)) {
        let mut parts = conn.prepare_cached(
            "SELECT idx, text FROM transcript_parts WHERE session = ?1 AND idx >= ?2 AND idx <= ?3 ORDER BY idx, part",
        )?;
        let mut q = parts.query(rusqlite::params![sid, first, last])?;
        while let Some(p) = q.next()? {
            let idx: i64 = p.get(0)?;
            let piece: String = p.get(1)?;
            // Rows are sorted by idx: find the entry the part belongs to.
            if let Ok(pos) = rows.binary_search_by_key(&idx, |r| r.idx) {
                rows[pos]
                    .text
                    .get_or_insert_with(String::new)
                    .push_str(&piece);
            }
        }
    }
    Ok(rows
        .into_iter()
        .map(|r| {
            let mut m = Map::new();
            m.insert("id".into(), json!(format!("e{}", r.idx)));
            m.insert("kind".into(), json!(r.kind));
            m.insert("timestamp".into(), json!(r.ts));
            fill_wire(
                &mut m,
                &r.kind,
                r.text.as_deref(),
                r.tool_id.as_deref(),
                r.tool_name.as_deref(),
                r.status.as_deref(),
                r.input.as_deref(),
            );
            Value::Object(m)
        })
        .collect())
}

/// Where a first `transcript.subscribe` answer starts (seed 004): the first
/// entry of the turn that holds the client's last cached entry, or that
/// entry itself when it ends a turn.
pub fn subscribe_start(
    conn: &rusqlite::Connection,
    sid: &str,
    have: usize,
) -> rusqlite::Result<usize> {
    if have == 0 {
        return Ok(0);
    }
    let last = (have - 1) as i64;
    let ends = "kind IN ('turn_end', 'system', 'compact', 'shell')";
    let last_ends: bool = conn
        .prepare_cached(&format!(
            "SELECT count(*) FROM transcript WHERE session = ?1 AND idx = ?2 AND {ends}"
        ))?
        .query_row(rusqlite::params![sid, last], |r| r.get::<_, i64>(0))?
        > 0;
    if last_ends {
        return Ok(have - 1);
    }
    let prev: Option<i64> = conn
        .prepare_cached(&format!(
            "SELECT max(idx) FROM transcript WHERE session = ?1 AND idx < ?2 AND {ends}"
        ))?
        .query_row(rusqlite::params![sid, last], |r| r.get(0))?;
    Ok(prev.map(|p| p as usize + 1).unwrap_or(0))
}

/// `sessions.toolDetail`: the first entry of that tool call, whole.
pub fn tool_detail(
    conn: &rusqlite::Connection,
    sid: &str,
    tool_id: &str,
) -> rusqlite::Result<Option<Value>> {
    let mut stmt = conn.prepare_cached(
        "SELECT tool_input, tool_result, tool_status FROM transcript WHERE session = ?1 AND tool_id = ?2 ORDER BY idx LIMIT 1",
    )?;
    let mut rows = stmt.query(rusqlite::params![sid, tool_id])?;
    let Some(r) = rows.next()? else {
        return Ok(None);
    };
    let mut m = Map::new();
    if let Some(i) = r.get::<_, Option<String>>(0)? {
        m.insert("toolInput".into(), json!(i));
    }
    if let Some(res) = r.get::<_, Option<String>>(1)? {
        m.insert("result".into(), json!(res));
    }
    if let Some(s) = r.get::<_, Option<String>>(2)? {
        if s == "completed" || s == "failed" {
            m.insert("resultIsError".into(), json!(s == "failed"));
        }
    }
    Ok(Some(Value::Object(m)))
}

/// One transcript row's columns, as the ledger keeps them.
#[derive(Default)]
struct Columns {
    kind: &'static str,
    text: Option<String>,
    tool_id: Option<String>,
    tool_name: Option<String>,
    tool_kind: Option<String>,
    status: Option<String>,
    input: Option<String>,
    result: Option<String>,
}

impl Columns {
    /// A row of `kind` that holds only text.
    fn plain(kind: &'static str, text: String) -> Columns {
        Columns {
            kind,
            text: Some(text),
            ..Columns::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::{ActionKind, EndReason};

    fn db() -> rusqlite::Connection {
        let mut c = rusqlite::Connection::open_in_memory().unwrap();
        assert!(matches!(
            crate::ledger::schema::prepare(&mut c).unwrap(),
            crate::ledger::schema::Prepared::Ready { .. }
        ));
        c
    }

    fn apply(c: &rusqlite::Connection, ops: &mut Vec<Op>) {
        for op in ops.drain(..) {
            if let Op::Exec { sql, params } = op {
                c.execute(sql, rusqlite::params_from_iter(params)).unwrap();
            }
        }
    }

    #[test]
    fn chunks_merge_tools_update_and_the_turn_end_clears_the_cache() {
        let mut t = Transcript::default();
        let mut ops = Vec::new();
        for e in [
            Entry::User { text: "hi".into() },
            Entry::Text { text: "a".into() },
            Entry::Text { text: "b".into() },
        ] {
            t.push("s", &e, Some("ts"), false, &mut ops);
        }
        let d = t.flush("s", &mut ops).unwrap();
        assert_eq!(d.from, 0);
        assert_eq!(d.entries.len(), 2);
        assert_eq!(d.entries[1]["text"], json!("ab"));
        // The user row and the text row, whose INSERT holds both chunks.
        assert_eq!(ops.len(), 2);
        let call = ToolEntry {
            id: "c1".into(),
            title: Some("Read".into()),
            kind: Some(ActionKind::Read),
            input: Some(json!({"path": "/x"})),
            status: None,
            result: None,
        };
        t.push("s", &Entry::Tool(call), Some("ts"), false, &mut ops);
        let d = t.flush("s", &mut ops).unwrap();
        assert_eq!((d.from, d.entries.len()), (2, 1));
        let done = ToolEntry {
            id: "c1".into(),
            title: None,
            kind: None,
            input: None,
            status: Some(ToolStatus::Failed),
            result: Some(json!("no")),
        };
        t.push("s", &Entry::Tool(done), Some("ts"), false, &mut ops);
        t.push(
            "s",
            &Entry::TurnEnd {
                reason: EndReason::Interrupted,
            },
            Some("ts"),
            false,
            &mut ops,
        );
        let d = t.flush("s", &mut ops).unwrap();
        assert_eq!(
            (
                d.from,
                d.entries[0]["resultIsError"].clone(),
                d.entries[0]["toolName"].clone()
            ),
            (2, json!(true), json!("Read"))
        );
        assert_eq!(d.entries[1]["interrupted"], json!(true));
        assert_eq!(t.len, 4);
        assert_eq!(t.cache_start(), None);
        assert_eq!(t.flush("s", &mut ops), None);
        assert_eq!(ops.len(), 5);
        let mut merged = Some(Delta {
            from: 3,
            entries: vec![json!(3), json!(4)],
        });
        Delta::merge(
            &mut merged,
            Delta {
                from: 4,
                entries: vec![json!("4b"), json!(5)],
            },
        );
        assert_eq!(
            merged.unwrap().entries,
            vec![json!(3), json!("4b"), json!(5)]
        );
    }

    #[test]
    fn a_growing_entry_is_one_statement_a_round_and_reads_back_whole() {
        let c = db();
        let mut t = Transcript::default();
        let mut ops = Vec::new();
        t.push(
            "s",
            &Entry::User { text: "go".into() },
            Some("ts"),
            false,
            &mut ops,
        );
        let mut want = String::new();
        for round in 0..5 {
            for chunk in 0..10 {
                let piece = format!("<{round}.{chunk}>");
                want.push_str(&piece);
                t.push(
                    "s",
                    &Entry::Text { text: piece },
                    Some("ts"),
                    false,
                    &mut ops,
                );
            }
            let d = t.flush("s", &mut ops).unwrap();
            // One statement per round: the row, then one part each.
            assert_eq!(ops.len(), if round == 0 { 2 } else { 1 });
            assert_eq!(d.entries.last().unwrap()["text"], json!(want));
            apply(&c, &mut ops);
        }
        let parts: i64 = c
            .query_row("SELECT count(*) FROM transcript_parts", [], |r| r.get(0))
            .unwrap();
        assert_eq!(parts, 4);
        // Thinking after text is a new entry; a tool between stops a merge.
        t.push(
            "s",
            &Entry::Thinking { text: "hm".into() },
            Some("ts"),
            false,
            &mut ops,
        );
        t.push(
            "s",
            &Entry::Thinking { text: "m".into() },
            Some("ts"),
            false,
            &mut ops,
        );
        t.push(
            "s",
            &Entry::TurnEnd {
                reason: EndReason::Completed,
            },
            Some("ts"),
            false,
            &mut ops,
        );
        t.flush("s", &mut ops);
        apply(&c, &mut ops);
        let rows = read_entries(&c, "s", 0, 100).unwrap();
        let texts: Vec<Value> = rows.iter().map(|r| r["text"].clone()).collect();
        assert_eq!(
            texts,
            vec![json!("go"), json!(want), json!("hmm"), Value::Null]
        );
        assert_eq!(rows[3]["stopReason"], json!("completed"));
        // A page that starts inside the transcript still gets its parts.
        let page = read_entries(&c, "s", 1, 1).unwrap();
        assert_eq!((page.len(), page[0]["text"].clone()), (1, json!(want)));
    }
}
