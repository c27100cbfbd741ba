//! A session's transcript, normalised into entries (seed 004, Transcripts
//! and the Transcript data type; issue 3): user, text, thinking, tool,
//! turn_end, system. Every entry is stored once in the ledger's
//! `transcript` table with tool input and result whole; the wire form
//! (camelCase, as the spec's Entry) never carries them: `sessions.toolDetail`
//! reads them.
//!
//! Consecutive text (or thinking) chunks of the agent are one entry that
//! grows; later reports about a tool call change its entry. So only the
//! running turn's entries can change, and only they are kept in memory
//! (`TRANSCRIPT_TURN_CACHE`), to build `transcript.delta`s: an idle session
//! holds none. Entry ids are `e<index>`, stable as the transcript grows.

use rusqlite::types::Value as Sql;
use serde_json::{json, Map, Value};
use std::collections::HashMap;

use crate::agents::{Entry, ToolEntry, ToolStatus};
use crate::ledger::Op;
use crate::limits;

const INSERT: &str = "INSERT INTO transcript (session, idx, kind, ts, text, tool_id, tool_name, tool_kind, tool_status, tool_input, tool_result) \
                      VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";
const APPEND_TEXT: &str = "UPDATE transcript SET text = coalesce(text, '') || ?3 WHERE session = ?1 AND idx = ?2";
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

#[derive(Default, Debug)]
pub struct Transcript {
    /// How many entries the session has.
    pub len: usize,
    /// The index of `cache[0]`.
    cache_start: usize,
    cache: Vec<Map<String, Value>>,
    /// Tool call id -> entry index, for the running turn.
    tools: HashMap<String, usize>,
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
    input.chars().take(limits::TRANSCRIPT_PREVIEW_CHARS).collect()
}

impl Transcript {
    pub fn restored(len: usize) -> Transcript {
        Transcript { len, cache_start: len, ..Transcript::default() }
    }

    /// The running turn's entries, from `from` on, if they are cached.
    pub fn cached_from(&self, from: usize) -> Option<Vec<Value>> {
        if from < self.cache_start || from > self.len {
            return None;
        }
        Some(self.cache[from - self.cache_start..].iter().map(|m| Value::Object(m.clone())).collect())
    }

    /// Where the cache starts, and whether it holds anything.
    pub fn cache_start(&self) -> Option<usize> {
        (!self.cache.is_empty()).then_some(self.cache_start)
    }

    /// Records `entry`: the ledger operations for it, and the delta.
    pub fn push(&mut self, sid: &str, entry: &Entry, ts: &str, is_error: bool, ops: &mut Vec<Op>) -> Option<Delta> {
        // A text chunk after a text chunk grows that entry.
        if let Some((kind, text)) = text_kind(entry) {
            let last = self.len.checked_sub(1);
            let cached_last = self.cache_start + self.cache.len();
            if let (Some(idx), Some(m)) = (last, self.cache.last_mut()) {
                if m.get("kind").and_then(Value::as_str) == Some(kind) && idx + 1 == cached_last {
                    if let Some(Value::String(s)) = m.get_mut("text") {
                        s.push_str(text);
                    }
                    ops.push(Op::Exec { sql: APPEND_TEXT, params: vec![Sql::Text(sid.into()), Sql::Integer(idx as i64), Sql::Text(text.into())] });
                    return self.delta(idx);
                }
            }
        }
        if let Entry::Tool(t) = entry {
            if let Some(&idx) = self.tools.get(&t.id) {
                return self.update_tool(sid, idx, t, ops);
            }
        }
        let idx = self.len;
        let mut wire = Map::new();
        wire.insert("id".into(), json!(format!("e{idx}")));
        wire.insert("timestamp".into(), json!(ts));
        let (kind, text, tool_id, tool_name, tool_kind, status, input, result) = match entry {
            Entry::User { text } => ("user", Some(text.clone()), None, None, None, None, None, None),
            Entry::Text { text } => ("text", Some(text.clone()), None, None, None, None, None, None),
            Entry::Thinking { text } => ("thinking", Some(text.clone()), None, None, None, None, None, None),
            Entry::System { text } => ("system", Some(text.clone()), None, None, None, is_error.then(|| "error".to_string()), None, None),
            Entry::TurnEnd { reason } => ("turn_end", Some(reason.wire_name().to_string()), None, None, None, None, None, None),
            Entry::Tool(t) => {
                self.tools.insert(t.id.clone(), idx);
                let name = t.title.clone().or_else(|| t.kind.map(|k| k.wire_name().to_string()));
                (
                    "tool",
                    None,
                    Some(t.id.clone()),
                    name,
                    t.kind.map(|k| k.wire_name().to_string()),
                    t.status.map(|s| status_name(s).to_string()),
                    t.input.as_ref().map(Value::to_string),
                    t.result.as_ref().map(Value::to_string),
                )
            }
        };
        wire.insert("kind".into(), json!(kind));
        fill_wire(&mut wire, kind, text.as_deref(), tool_id.as_deref(), tool_name.as_deref(), status.as_deref(), input.as_deref());
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
        self.len += 1;
        if self.cache.len() >= limits::TRANSCRIPT_TURN_CACHE {
            self.cache.remove(0);
            self.cache_start += 1;
        }
        self.cache.push(wire);
        let delta = self.delta(idx);
        if kind == "turn_end" {
            // The turn is over: nothing of it changes any more.
            self.cache.clear();
            self.cache_start = self.len;
            self.tools.clear();
        }
        delta
    }

    fn update_tool(&mut self, sid: &str, idx: usize, t: &ToolEntry, ops: &mut Vec<Op>) -> Option<Delta> {
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
        let pos = idx.checked_sub(self.cache_start)?;
        let m = self.cache.get_mut(pos)?;
        if let Some(n) = name {
            m.insert("toolName".into(), json!(n));
        }
        if let Some(input) = &t.input {
            m.insert("inputPreview".into(), json!(preview(&input.to_string())));
        }
        if let Some(s) = t.status {
            m.insert("resultIsError".into(), json!(s == ToolStatus::Failed));
        }
        self.delta(idx)
    }

    fn delta(&self, from: usize) -> Option<Delta> {
        self.cached_from(from).map(|entries| Delta { from, entries })
    }
}

fn fill_wire(m: &mut Map<String, Value>, kind: &str, text: Option<&str>, tool_id: Option<&str>, tool_name: Option<&str>, status: Option<&str>, input: Option<&str>) {
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

/// Entries `from..` of a session from the ledger (reader thread), at most
/// `limit`, in wire form.
pub fn read_entries(conn: &rusqlite::Connection, sid: &str, from: usize, limit: usize) -> rusqlite::Result<Vec<Value>> {
    let mut stmt = conn.prepare_cached(
        "SELECT idx, kind, ts, text, tool_id, tool_name, tool_status, tool_input FROM transcript \
         WHERE session = ?1 AND idx >= ?2 ORDER BY idx LIMIT ?3",
    )?;
    let rows = stmt.query_map(rusqlite::params![sid, from as i64, limit as i64], |r| {
        let idx: i64 = r.get(0)?;
        let kind: String = r.get(1)?;
        let mut m = Map::new();
        m.insert("id".into(), json!(format!("e{idx}")));
        m.insert("kind".into(), json!(kind));
        m.insert("timestamp".into(), json!(r.get::<_, String>(2)?));
        let text: Option<String> = r.get(3)?;
        let tool_id: Option<String> = r.get(4)?;
        let tool_name: Option<String> = r.get(5)?;
        let status: Option<String> = r.get(6)?;
        let input: Option<String> = r.get(7)?;
        fill_wire(&mut m, &kind, text.as_deref(), tool_id.as_deref(), tool_name.as_deref(), status.as_deref(), input.as_deref());
        Ok(Value::Object(m))
    })?;
    rows.collect()
}

/// Where a first `transcript.subscribe` answer starts (seed 004): the first
/// entry of the turn that holds the client's last cached entry, or that
/// entry itself when it ends a turn.
pub fn subscribe_start(conn: &rusqlite::Connection, sid: &str, have: usize) -> rusqlite::Result<usize> {
    if have == 0 {
        return Ok(0);
    }
    let last = (have - 1) as i64;
    let ends = "kind IN ('turn_end', 'system', 'compact', 'shell')";
    let last_ends: bool = conn
        .prepare_cached(&format!("SELECT count(*) FROM transcript WHERE session = ?1 AND idx = ?2 AND {ends}"))?
        .query_row(rusqlite::params![sid, last], |r| r.get::<_, i64>(0))?
        > 0;
    if last_ends {
        return Ok(have - 1);
    }
    let prev: Option<i64> = conn
        .prepare_cached(&format!("SELECT max(idx) FROM transcript WHERE session = ?1 AND idx < ?2 AND {ends}"))?
        .query_row(rusqlite::params![sid, last], |r| r.get(0))?;
    Ok(prev.map(|p| p as usize + 1).unwrap_or(0))
}

/// `sessions.toolDetail`: the first entry of that tool call, whole.
pub fn tool_detail(conn: &rusqlite::Connection, sid: &str, tool_id: &str) -> rusqlite::Result<Option<Value>> {
    let mut stmt = conn.prepare_cached(
        "SELECT tool_input, tool_result, tool_status FROM transcript WHERE session = ?1 AND tool_id = ?2 ORDER BY idx LIMIT 1",
    )?;
    let mut rows = stmt.query(rusqlite::params![sid, tool_id])?;
    let Some(r) = rows.next()? else { return Ok(None) };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::{ActionKind, EndReason};

    #[test]
    fn chunks_merge_tools_update_and_the_turn_end_clears_the_cache() {
        let mut t = Transcript::default();
        let mut ops = Vec::new();
        let mut delta = None;
        for e in [
            Entry::User { text: "hi".into() },
            Entry::Text { text: "a".into() },
            Entry::Text { text: "b".into() },
        ] {
            if let Some(d) = t.push("s", &e, "ts", false, &mut ops) {
                Delta::merge(&mut delta, d);
            }
        }
        let d = delta.take().unwrap();
        assert_eq!(d.from, 0);
        assert_eq!(d.entries.len(), 2);
        assert_eq!(d.entries[1]["text"], json!("ab"));
        let call = ToolEntry { id: "c1".into(), title: Some("Read".into()), kind: Some(ActionKind::Read), input: Some(json!({"path": "/x"})), status: None, result: None };
        t.push("s", &Entry::Tool(call), "ts", false, &mut ops);
        let done = ToolEntry { id: "c1".into(), title: None, kind: None, input: None, status: Some(ToolStatus::Failed), result: Some(json!("no")) };
        let d = t.push("s", &Entry::Tool(done), "ts", false, &mut ops).unwrap();
        assert_eq!((d.from, d.entries[0]["resultIsError"].clone(), d.entries[0]["toolName"].clone()), (2, json!(true), json!("Read")));
        let d = t.push("s", &Entry::TurnEnd { reason: EndReason::Interrupted }, "ts", false, &mut ops).unwrap();
        assert_eq!(d.entries[0]["interrupted"], json!(true));
        assert_eq!(t.len, 4);
        assert_eq!(t.cache_start(), None);
        assert_eq!(ops.len(), 6);
        let mut merged = Some(Delta { from: 3, entries: vec![json!(3), json!(4)] });
        Delta::merge(&mut merged, Delta { from: 4, entries: vec![json!("4b"), json!(5)] });
        assert_eq!(merged.unwrap().entries, vec![json!(3), json!("4b"), json!(5)]);
    }
}
