//! Sessions over HTTP (issue 6, phase 2; seed 002, "Sessions and durable
//! input", "SSE delivery and recovery"): the state the HTTP API keeps on
//! the reactor next to `core::sessions`, and the handlers of
//!
//! | path                                   | method | who      |
//! |----------------------------------------|--------|----------|
//! | /sessions                              | GET    | token    |
//! | /sessions/{session_id}                 | PUT    | operator |
//! | /sessions/{session_id}                 | GET    | token    |
//! | /sessions/{session_id}                 | DELETE | operator |
//! | /sessions/{session_id}/inputs/{input_id} | PUT  | operator |
//! | /sessions/{session_id}/inputs/{input_id} | GET  | token    |
//! | /sessions/{session_id}/inputs/{input_id}/cancel | POST | operator |
//! | /sessions/{session_id}/interrupt       | POST   | operator |
//! | /sessions/{session_id}/history         | GET    | token    |
//!
//! Identities. `PUT /sessions/{id}` takes the client's UUIDv7: it names the
//! *creation*, durably mapped (ledger table `http_creations`) to the
//! daemon's session id (`s-` + 12 hex), which the 201 carries in `id` and
//! `Location`. Every other route accepts either the daemon id or that
//! creation UUIDv7. Input ids are client UUIDv7s (`http_inputs`).
//!
//! Inputs. An input is committed to the ledger before its 202 (and a
//! rejection, `queue_full` included, before its 4xx), then waits in the
//! session's queue here. The HTTP layer hands the agent one input at a
//! time, when the session has no turn running, through
//! `router::sessions::input`; the next `turn.start` of the session is that
//! input's turn (delivery `committed`, turn `running`), and its `turn.end`
//! gives the outcome. So every turn holds exactly one input, and a cancel
//! never answers `shared_running`. Prompts sent through the daemon socket
//! (`sessions.input`) bypass this queue; a turn they start while an HTTP
//! input was just handed over is attributed to that input (a known
//! imprecision when both surfaces drive one session at the same moment).
//! A restart re-queues inputs still `pending` (one handed to the agent
//! just before the stop may run twice: delivery is at least once) and
//! marks a turn that was running `abandoned`.
//!
//! Watches. Each watched session has a [`sse::Topic`] whose generation is
//! random per topic (per daemon run, and anew when an unwatched topic is
//! dropped), with its own sequence: `status`, `input`, `text`,
//! `thinking`, `message`, `turn_completed` and `committed` events. The
//! growing text or thinking entry goes out as `text`/`thinking` events
//! that carry only the appended text (with its byte `offset` in the
//! entry), then once whole as `message` when a later entry (or the
//! session's end) completes it; every other entry goes out as `message`
//! each time a round changes it. A reset's snapshot shows the growing
//! entry exactly as far as its events have published it. A cursor of another
//! generation (another run) always resets. The collection watch feeds one
//! [`sse::CollectionQueue`] per subscriber with `invalidate` and `activity`.

use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::io::Write as _;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::pages;
use super::problem::{Code, Problem};
use super::routes::{counter, ledger_problem, negotiate, read_failed};
use super::snapshots::Snapshot;
use super::sse::{self, CollectionQueue, Start, Subscription, Topic};
use super::uuid7::Uuid7;
use super::{Answer, Ctx, Reply, Serialised, Shared};
use crate::core::sessions::{self as core_sessions, State};
use crate::core::transcript::Delta;
use crate::daemon::Daemon;
use crate::ledger::{Appended, Op};
use crate::limits;
use crate::procs::CallerClass;
use rusqlite::types::Value as Sql;

// ---- state kept on the reactor ----

/// A creation decision.
#[derive(Clone, Debug)]
pub struct Creation {
    pub intent: String,
    pub session: Option<String>,
    pub status: u16,
    pub problem: Option<(String, String)>,
    pub created_at: String,
    /// Still being decided or committed: a duplicate waits for it.
    pub settled: bool,
}

/// An input decision and its delivery.
#[derive(Clone, Debug)]
pub struct Input {
    pub id: String,
    pub session: String,
    pub intent: String,
    pub kind: String,
    pub text: Option<String>,
    pub status: u16,
    pub problem: Option<(String, String)>,
    pub accepted_at: String,
    pub order: Option<u64>,
    pub delivery: Option<String>,
    pub turn: Option<u64>,
    pub outcome: Option<String>,
    pub position: Option<u64>,
    pub durable: bool,
}

/// A session's input queue.
#[derive(Default, Debug)]
pub struct Queue {
    pub waiting: VecDeque<String>,
    /// Handed to the agent; its turn has not started yet.
    pub handed: Option<String>,
    /// The running turn and its one input.
    pub running: Option<(u64, String)>,
    pub interrupt_requested: bool,
    pub input_order: u64,
}

/// One line of a session's activity tail.
#[derive(Clone, Debug)]
struct Line {
    entry: String,
    kind: &'static str,
    text: String,
}

#[derive(Default)]
struct Activity {
    lines: VecDeque<Line>,
    observed_ms: i64,
}

struct CollectionSub {
    filter: Filter,
    queue: Arc<Mutex<CollectionQueue>>,
    wake: crossbeam_channel::Sender<()>,
}

/// The HTTP API's sessions state.
#[derive(Default)]
pub struct Api {
    pub creations: HashMap<String, Creation>,
    /// daemon session id -> creation id
    pub created_as: HashMap<String, String>,
    pub inputs: HashMap<String, Input>,
    pub queues: HashMap<String, Queue>,
    topics: HashMap<String, Topic>,
    /// The last status published to a topic, so unchanged ones are not.
    last_status: HashMap<String, String>,
    activity: HashMap<String, Activity>,
    collection: Vec<CollectionSub>,
    /// The growing text or thinking entry of each watched session: what
    /// its `text`/`thinking` events have published so far.
    live: HashMap<String, Live>,
    /// Recent history of live sessions read lately (GET /sessions/{id}).
    history: HistoryCache,
}

/// A watched session's growing entry. Its appended text goes out as
/// `text` (or `thinking`) events carrying only what is new, so a reply of
/// n bytes costs O(n) bytes per watcher, not O(n²) as re-sending the
/// entry whole each round would; the entry goes out whole once, as a
/// `message`, when a later entry shows it is complete (seed 002, Session
/// events: "text: Run ID, message ID, and appended assistant text";
/// "message: Completed display message").
struct Live {
    pos: u64,
    /// UTF-8 bytes of its text published so far.
    published: usize,
    /// The entry as last published (its inline text bounded by
    /// `HTTP_ENTRY_TEXT_MAX`): a reset's snapshot shows it, and its
    /// `message` carries it when no later round touches it again.
    entry: Value,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn problem_pair(p: &Problem) -> Option<(String, String)> {
    Some((p.code.as_str().to_string(), p.detail.clone()))
}

fn stored_problem(status: u16, pair: &Option<(String, String)>) -> Problem {
    let (code, detail) = pair
        .clone()
        .unwrap_or_else(|| ("conflict".into(), "the request was refused".into()));
    let mut p = Problem::new(Code::parse(&code).unwrap_or(Code::Conflict), detail);
    p.status_override = Some(status);
    p
}

impl Api {
    /// Loads the retained decisions and waiting inputs from the ledger
    /// file (read-only, before the reactor runs). Inputs whose turn was
    /// running when the daemon stopped are `abandoned`; the returned ops
    /// record that, and purge terminal decisions older than seven days.
    pub fn load(path: &std::path::Path) -> Result<(Api, Vec<Op>), String> {
        let mut api = Api::default();
        let mut ops = Vec::new();
        let conn =
            rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .map_err(|e| format!("unable to read the HTTP identities: {e}"))?;
        let cut = crate::clock::format_ts(crate::clock::now_ms() - limits::UUID7_MAX_AGE_MS);
        let r = (|| -> rusqlite::Result<()> {
            let mut st = conn.prepare(
                "SELECT id, intent, session, status, problem, created_at FROM http_creations",
            )?;
            let rows = st.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, String>(5)?,
                ))
            })?;
            for row in rows {
                let (id, intent, session, status, problem, created_at) = row?;
                if session.is_none() && created_at < cut {
                    ops.push(Op::Exec {
                        sql: "DELETE FROM http_creations WHERE id = ?1",
                        params: vec![Sql::Text(id)],
                    });
                    continue;
                }
                let problem =
                    problem.and_then(|p| serde_json::from_str::<(String, String)>(&p).ok());
                if let Some(s) = &session {
                    api.created_as.insert(s.clone(), id.clone());
                }
                api.creations.insert(
                    id,
                    Creation {
                        intent,
                        session,
                        status: status.clamp(100, 599) as u16,
                        problem,
                        created_at,
                        settled: true,
                    },
                );
            }
            let mut st = conn.prepare(
                "SELECT id, session, intent, kind, status, problem, accepted_at, ord, delivery, turn, outcome, position, ended_at FROM http_inputs ORDER BY session, ord",
            )?;
            let rows = st.query_map([], |r| {
                Ok((
                    Input {
                        id: r.get(0)?,
                        session: r.get(1)?,
                        intent: r.get(2)?,
                        kind: r.get(3)?,
                        text: None,
                        status: r.get::<_, i64>(4)?.clamp(100, 599) as u16,
                        problem: r
                            .get::<_, Option<String>>(5)?
                            .and_then(|p| serde_json::from_str(&p).ok()),
                        accepted_at: r.get(6)?,
                        order: r.get::<_, Option<i64>>(7)?.map(|o| o.max(0) as u64),
                        delivery: r.get(8)?,
                        turn: r.get::<_, Option<i64>>(9)?.map(|t| t.max(0) as u64),
                        outcome: r.get(10)?,
                        position: r.get::<_, Option<i64>>(11)?.map(|p| p.max(0) as u64),
                        durable: true,
                    },
                    r.get::<_, Option<String>>(12)?,
                ))
            })?;
            for row in rows {
                let (mut input, ended_at) = row?;
                let terminal = ended_at.as_deref().is_some_and(|e| e < cut.as_str())
                    || (input.status != 202 && input.accepted_at < cut);
                if terminal {
                    ops.push(Op::Exec {
                        sql: "DELETE FROM http_inputs WHERE id = ?1",
                        params: vec![Sql::Text(input.id.clone())],
                    });
                    continue;
                }
                input.text = serde_json::from_str::<Value>(&input.intent)
                    .ok()
                    .and_then(|v| v["text"].as_str().map(str::to_string));
                let q = api.queues.entry(input.session.clone()).or_default();
                if let Some(o) = input.order {
                    q.input_order = q.input_order.max(o);
                }
                if input.status == 202 && input.delivery.as_deref() == Some("pending") {
                    q.waiting.push_back(input.id.clone());
                }
                if input.outcome.as_deref() == Some("running") {
                    input.outcome = Some("abandoned".into());
                    ops.push(row_update(&input));
                }
                api.inputs.insert(input.id.clone(), input);
            }
            Ok(())
        })();
        r.map_err(|e| {
            format!(
                "unable to read the HTTP identities: {}",
                e.to_string().to_lowercase()
            )
        })?;
        Ok((api, ops))
    }

    fn waiting(&self, sid: &str) -> usize {
        self.queues.get(sid).map_or(0, |q| q.waiting.len())
    }
}

fn row_update(i: &Input) -> Op {
    let terminal = i.delivery.as_deref() == Some("cancelled")
        || i.outcome.as_deref().is_some_and(|o| o != "running");
    Op::Exec {
        sql: "UPDATE http_inputs SET delivery = ?2, turn = ?3, outcome = ?4, position = ?5, ended_at = coalesce(ended_at, ?6) WHERE id = ?1",
        params: vec![
            Sql::Text(i.id.clone()),
            i.delivery.clone().map(Sql::Text).unwrap_or(Sql::Null),
            i.turn.map(|t| Sql::Integer(t as i64)).unwrap_or(Sql::Null),
            i.outcome.clone().map(Sql::Text).unwrap_or(Sql::Null),
            i.position
                .map(|p| Sql::Integer(p as i64))
                .unwrap_or(Sql::Null),
            if terminal {
                Sql::Text(crate::clock::now_ts())
            } else {
                Sql::Null
            },
        ],
    }
}

fn input_insert(i: &Input) -> Op {
    Op::Exec {
        sql: "INSERT INTO http_inputs (id, session, intent, kind, status, problem, accepted_at, ord, delivery, ended_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params: vec![
            Sql::Text(i.id.clone()),
            Sql::Text(i.session.clone()),
            Sql::Text(i.intent.clone()),
            Sql::Text(i.kind.clone()),
            Sql::Integer(i.status as i64),
            i.problem
                .as_ref()
                .map(|p| Sql::Text(json!([p.0, p.1]).to_string()))
                .unwrap_or(Sql::Null),
            Sql::Text(i.accepted_at.clone()),
            i.order.map(|o| Sql::Integer(o as i64)).unwrap_or(Sql::Null),
            i.delivery.clone().map(Sql::Text).unwrap_or(Sql::Null),
            if i.status == 202 {
                Sql::Null
            } else {
                Sql::Text(i.accepted_at.clone())
            },
        ],
    }
}

// ---- representations ----

/// The HTTP API's name of a session state (SessionSummary.state and
/// status.phase; the openapi's SessionState).
fn state_name(st: State) -> &'static str {
    match st {
        State::Starting => "starting",
        State::Idle => "idle",
        State::Running => "running",
        State::AwaitingApproval => "awaiting_approval",
        State::Ended => "ended",
    }
}

/// Whether a turn the caller asked to interrupt still runs.
fn interrupting(s: &core_sessions::Session, q: Option<&Queue>) -> bool {
    !matches!(s.state(), State::Ended | State::Starting)
        && s.turn_active
        && q.is_some_and(|q| q.interrupt_requested)
}

/// The phase of a live session (status.phase): its state, except that a
/// turn being interrupted is `interrupting` until it ends.
fn phase(s: &core_sessions::Session, q: Option<&Queue>) -> &'static str {
    if interrupting(s, q) {
        "interrupting"
    } else {
        state_name(s.state())
    }
}

/// SessionSummary.state of a live session: a turn being interrupted still
/// runs.
fn summary_state(s: &core_sessions::Session, q: Option<&Queue>) -> State {
    if interrupting(s, q) {
        State::Running
    } else {
        s.state()
    }
}

fn status_json(s: &core_sessions::Session, q: Option<&Queue>) -> Value {
    let blocking = if !s.open.is_empty() {
        Some("waiting for the operator to answer an approval")
    } else {
        None
    };
    json!({
        "phase": phase(s, q),
        "run_id": if s.turn_active { Some(format!("r{}", s.turn)) } else { None },
        "interrupt_requested": q.is_some_and(|q| q.interrupt_requested) && s.turn_active,
        "blocking_reason": blocking,
    })
}

/// A session row as the ledger has it (for sessions not live here).
#[derive(Clone, Debug)]
pub struct Row {
    id: String,
    harness: String,
    provider: String,
    transport: String,
    cwd: String,
    name: Option<String>,
    parent: Option<String>,
    model: Option<String>,
    created_at: String,
    ended: bool,
    turn: u64,
    end_reason: Option<String>,
    exit_code: Option<i64>,
    exit_signal: Option<String>,
    input_tokens: u64,
    output_tokens: u64,
    last_activity: Option<String>,
    transcript_len: u64,
}

const ROW_COLUMNS: &str = "id, harness, provider, transport, cwd, name, parent, model, created_at, ended, turn, end_reason, exit_code, exit_signal, \
                           input_tokens, output_tokens, last_activity, transcript_len";

fn row_from(r: &rusqlite::Row) -> rusqlite::Result<Row> {
    Ok(Row {
        id: r.get(0)?,
        harness: r.get(1)?,
        provider: r.get(2)?,
        transport: r.get(3)?,
        cwd: r.get(4)?,
        name: r.get(5)?,
        parent: r.get(6)?,
        model: r.get(7)?,
        created_at: r.get(8)?,
        ended: r.get::<_, i64>(9)? != 0,
        turn: r.get::<_, i64>(10)?.max(0) as u64,
        end_reason: r.get(11)?,
        exit_code: r.get(12)?,
        exit_signal: r.get(13)?,
        input_tokens: r.get::<_, i64>(14)?.max(0) as u64,
        output_tokens: r.get::<_, i64>(15)?.max(0) as u64,
        last_activity: r.get(16)?,
        transcript_len: r.get::<_, i64>(17)?.max(0) as u64,
    })
}

fn read_row(conn: &rusqlite::Connection, sid: &str) -> rusqlite::Result<Option<Row>> {
    let mut st =
        conn.prepare_cached(&format!("SELECT {ROW_COLUMNS} FROM sessions WHERE id = ?1"))?;
    let mut rows = st.query_map([sid], row_from)?;
    rows.next().transpose()
}

/// The SessionSummary of a session: live state when the daemon runs it,
/// else its ledger row (ended, or not reopened).
fn summary(d: &Daemon, row: Option<&Row>, sid: &str) -> Option<Value> {
    let api = d.http.as_ref().map(|h| &h.sessions);
    let creation_id = api.and_then(|a| a.created_as.get(sid)).cloned();
    let cursor = |a: Option<&Api>| {
        a.and_then(|a| a.topics.get(sid))
            .map(|t| json!({"generation": t.generation(), "sequence": t.high_water()}))
    };
    if let Some(s) = d.core.sessions.get(sid) {
        let q = api.and_then(|a| a.queues.get(sid));
        let st = status_json(s, q);
        let state = state_name(summary_state(s, q));
        return Some(json!({
            "id": s.id,
            "creation_id": creation_id,
            "name": s.name,
            "harness": s.harness,
            "provider": s.provider,
            "transport": s.transport.wire_name(),
            "worktree": s.cwd.display().to_string(),
            "parent_id": s.parent,
            "model": s.model,
            "created_at": s.created_at,
            "activity_at": s.last_activity_ms.map(crate::clock::format_ts),
            "state": state,
            "status": st,
            "turn": s.turn,
            "pending_approvals": s.open.len(),
            "usage": {"input_tokens": s.input_tokens, "output_tokens": s.output_tokens},
            "end_reason": s.end_reason.map(crate::agents::EndReason::wire_name),
            "exit": s.exit.map(|e| json!({"code": e.code, "signal": e.signal.map(crate::procs::signal_name)})),
            "transcript_len": s.transcript.len,
            "activity": activity_json(api, sid),
            "cursor": cursor(api),
        }));
    }
    let r = row?;
    let phase = state_name(if r.ended {
        State::Ended
    } else {
        State::Starting
    });
    Some(json!({
        "id": r.id,
        "creation_id": creation_id,
        "name": r.name,
        "harness": r.harness,
        "provider": r.provider,
        "transport": r.transport,
        "worktree": r.cwd,
        "parent_id": r.parent,
        "model": r.model,
        "created_at": r.created_at,
        "activity_at": r.last_activity,
        "state": phase,
        "status": {"phase": phase, "run_id": null, "interrupt_requested": false, "blocking_reason": null},
        "turn": r.turn,
        "pending_approvals": 0,
        "usage": {"input_tokens": r.input_tokens, "output_tokens": r.output_tokens},
        "end_reason": r.end_reason,
        "exit": if r.ended { json!({"code": r.exit_code, "signal": r.exit_signal}) } else { Value::Null },
        "transcript_len": r.transcript_len,
        "activity": activity_json(api, sid),
        "cursor": cursor(api),
    }))
}

fn activity_json(api: Option<&Api>, sid: &str) -> Value {
    let a = api.and_then(|a| a.activity.get(sid));
    let lines: Vec<Value> = a
        .map(|a| {
            a.lines
                .iter()
                .map(|l| json!({"kind": l.kind, "text": l.text}))
                .collect()
        })
        .unwrap_or_default();
    json!({"lines": lines, "observed_at": a.map(|a| crate::clock::format_ts(a.observed_ms))})
}

/// The Input representation.
pub fn input_json(i: &Input) -> Value {
    let admission = if i.status == 202 {
        json!({"state": "accepted"})
    } else {
        let p = stored_problem(i.status, &i.problem);
        json!({"state": "rejected", "status": i.status, "code": p.code.as_str(), "detail": p.detail})
    };
    let blocking = match i.delivery.as_deref() {
        Some("pending") if i.turn.is_none() => {
            Some("waiting for the session's running turn to end")
        }
        _ => None,
    };
    json!({
        "id": i.id,
        "session_id": i.session,
        "kind": i.kind,
        "preview": i.text.as_deref().map(|t| t.chars().take(limits::HTTP_INPUT_PREVIEW_CHARS).collect::<String>()),
        "admission": admission,
        "accepted_at": i.accepted_at,
        "acceptance_order": i.order,
        "delivery": i.delivery,
        "blocking_reason": blocking,
        "transcript_position": i.position,
        "turn": i.turn.map(|t| json!({"run_id": format!("r{t}"), "outcome": i.outcome})),
    })
}

/// A history entry from a transcript row.
#[allow(clippy::too_many_arguments)]
fn entry_json(
    idx: u64,
    kind: &str,
    ts: &str,
    text: Option<&str>,
    tool_id: Option<&str>,
    tool_name: Option<&str>,
    tool_status: Option<&str>,
    input: Option<&str>,
) -> Value {
    let (text, complete) = match text {
        Some(t) if t.len() > limits::HTTP_ENTRY_TEXT_MAX => {
            let mut cut = limits::HTTP_ENTRY_TEXT_MAX;
            while !t.is_char_boundary(cut) {
                cut -= 1;
            }
            (Some(&t[..cut]), false)
        }
        t => (t, true),
    };
    let tool = (kind == "tool").then(|| {
        json!({
            "id": tool_id,
            "name": tool_name,
            "status": tool_status,
            "input_preview": input.map(crate::core::transcript::preview),
        })
    });
    json!({
        "id": format!("e{idx}"),
        "position": idx,
        "kind": kind,
        "created_at": ts,
        "text": if kind == "tool" { None } else { text },
        "tool": tool,
        "content_complete": complete,
    })
}

/// A history entry from a transcript delta's wire entry (camelCase).
fn entry_from_wire(pos: u64, m: &Value) -> Value {
    let kind = m["kind"].as_str().unwrap_or("system");
    let text = match kind {
        "turn_end" => m["stopReason"].as_str(),
        _ => m["text"].as_str(),
    };
    let status = match m.get("resultIsError").and_then(Value::as_bool) {
        Some(true) => Some("failed"),
        Some(false) => Some("completed"),
        None => None,
    };
    let mut e = entry_json(
        pos,
        kind,
        m["timestamp"].as_str().unwrap_or_default(),
        text,
        m["toolId"].as_str(),
        m["toolName"].as_str(),
        status,
        None,
    );
    if kind == "tool" {
        e["tool"]["input_preview"] = m.get("inputPreview").cloned().unwrap_or(Value::Null);
    }
    e
}

fn read_history(
    conn: &rusqlite::Connection,
    sid: &str,
    before: Option<u64>,
    after: Option<u64>,
    limit: usize,
) -> rusqlite::Result<(Vec<Value>, u64)> {
    let high: i64 = conn.query_row(
        "SELECT coalesce(max(idx) + 1, 0) FROM transcript WHERE session = ?1",
        [sid],
        |r| r.get(0),
    )?;
    // A growing entry's text is its row's first text and then its parts
    // in order (core::transcript: one row per append).
    let cols = "idx, kind, ts, CASE WHEN text IS NULL THEN NULL ELSE text || coalesce((SELECT group_concat(p.text, '' ORDER BY p.part) \
                FROM transcript_parts p WHERE p.session = transcript.session AND p.idx = transcript.idx), '') END, \
                tool_id, tool_name, tool_status, tool_input";
    let (sql, bound) = match (before, after) {
        (_, Some(a)) => (
            format!(
                "SELECT {cols} FROM transcript WHERE session = ?1 AND idx > ?2 ORDER BY idx ASC LIMIT ?3"
            ),
            a as i64,
        ),
        (Some(b), None) => (
            format!(
                "SELECT {cols} FROM transcript WHERE session = ?1 AND idx < ?2 ORDER BY idx DESC LIMIT ?3"
            ),
            b as i64,
        ),
        (None, None) => (
            format!(
                "SELECT {cols} FROM transcript WHERE session = ?1 AND idx < ?2 ORDER BY idx DESC LIMIT ?3"
            ),
            high,
        ),
    };
    let mut st = conn.prepare_cached(&sql)?;
    let rows = st.query_map(rusqlite::params![sid, bound, limit as i64], |r| {
        let idx: i64 = r.get(0)?;
        Ok(entry_json(
            idx.max(0) as u64,
            &r.get::<_, String>(1)?,
            &r.get::<_, String>(2)?,
            r.get::<_, Option<String>>(3)?.as_deref(),
            r.get::<_, Option<String>>(4)?.as_deref(),
            r.get::<_, Option<String>>(5)?.as_deref(),
            r.get::<_, Option<String>>(6)?.as_deref(),
            r.get::<_, Option<String>>(7)?.as_deref(),
        ))
    })?;
    let mut items: Vec<Value> = rows.collect::<rusqlite::Result<_>>()?;
    if after.is_none() {
        items.reverse();
    }
    // The content budget: keep the entries nearest the anchor.
    let mut bytes = 0;
    let mut keep = 0;
    let order: Vec<usize> = if after.is_some() {
        (0..items.len()).collect()
    } else {
        (0..items.len()).rev().collect()
    };
    for &i in &order {
        let n = items[i].to_string().len();
        if keep > 0 && bytes + n > limits::HTTP_HISTORY_BYTES {
            break;
        }
        bytes += n;
        keep += 1;
    }
    if after.is_some() {
        items.truncate(keep);
    } else {
        items.drain(..items.len() - keep);
    }
    Ok((items, high.max(0) as u64))
}

fn history_page(items: Vec<Value>, high: u64) -> Value {
    let first = items.first().and_then(|e| e["position"].as_u64());
    let last = items.last().and_then(|e| e["position"].as_u64());
    json!({
        "items": items,
        "older": first.filter(|&f| f > 0),
        "newer": last.filter(|&l| l + 1 < high),
        "high_water": high,
    })
}

// ---- lookups ----

/// The daemon session id a path names: the id itself, or the UUIDv7 of
/// its creation.
fn resolve(d: &Daemon, raw: &str) -> Option<String> {
    if raw.starts_with("s-") {
        return Some(raw.to_string());
    }
    let key = Uuid7::parse(raw).ok()?.canonical();
    d.http
        .as_ref()?
        .sessions
        .creations
        .get(&key)?
        .session
        .clone()
}

/// The session a path names when `class` may read it
/// ([`core_sessions::may_read`]): None alike for one it may not read and
/// one that does not exist, so that a refusal does not reveal a session.
fn readable(d: &Daemon, class: &CallerClass, raw: &str) -> Option<String> {
    resolve(d, raw).filter(|sid| core_sessions::may_read(class, sid))
}

fn not_found(raw: &str) -> Problem {
    Problem::new(Code::NotFound, format!("no session {raw}"))
}

fn api_mut(d: &mut Daemon) -> Result<&mut Api, Problem> {
    d.http
        .as_mut()
        .map(|h| &mut h.sessions)
        .ok_or_else(|| Problem::new(Code::Unavailable, "the HTTP API is not running"))
}

// ---- GET /sessions ----

/// The collection filters (query parameters), and the caller whose
/// sessions alone pass ([`core_sessions::may_read`]).
#[derive(Clone, Debug)]
pub struct Filter {
    reader: CallerClass,
    state: Option<String>,
    harness: Option<String>,
    worktree: Option<String>,
    parent: Option<String>,
    search: Option<String>,
}

const STATES: [&str; 6] = [
    "starting",
    "idle",
    "running",
    "awaiting_approval",
    "ended",
    "interrupting",
];

fn filter_of(ctx: &Ctx, reader: CallerClass) -> Result<Filter, Problem> {
    let text = |name: &str| -> Result<Option<String>, Problem> {
        match ctx.param(name) {
            Some(v) if v.is_empty() || v.len() > 4096 || v.chars().any(char::is_control) => {
                Err(Problem::invalid(format!(
                    "{name} must be 1 to 4096 bytes without control characters"
                )))
            }
            v => Ok(v.map(str::to_string)),
        }
    };
    let state = text("state")?;
    if let Some(s) = &state {
        if !STATES[..5].contains(&s.as_str()) {
            return Err(Problem::invalid(
                "state must be starting, idle, running, awaiting_approval or ended",
            ));
        }
    }
    Ok(Filter {
        reader,
        state,
        harness: text("harness")?,
        worktree: text("worktree")?,
        parent: text("parent")?,
        search: text("search")?,
    })
}

impl Filter {
    /// Whether a summary passes (state and search included).
    fn admits(&self, s: &Value) -> bool {
        let eq = |f: &Option<String>, k: &str| {
            f.as_ref().is_none_or(|v| s[k].as_str() == Some(v.as_str()))
        };
        let search = self.search.as_ref().is_none_or(|q| {
            let q = q.to_lowercase();
            s["id"].as_str().is_some_and(|i| i.starts_with(&q))
                || s["creation_id"].as_str().is_some_and(|i| i.starts_with(&q))
                || s["name"]
                    .as_str()
                    .is_some_and(|n| n.to_lowercase().contains(&q))
        });
        let readable = s["id"]
            .as_str()
            .is_some_and(|id| core_sessions::may_read(&self.reader, id));
        readable
            && eq(&self.state, "state")
            && eq(&self.harness, "harness")
            && eq(&self.worktree, "worktree")
            && eq(&self.parent, "parent_id")
            && search
    }
}

pub fn get_sessions(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let filter = filter_of(ctx, ctx.caller()?)?;
    if negotiate(
        ctx.head.header("accept"),
        &["application/json", "text/event-stream"],
    )? == "text/event-stream"
    {
        if ctx.param("limit").is_some() || ctx.param("next").is_some() {
            return Err(Problem::invalid(
                "limit and next belong to JSON pages, not to a watch",
            ));
        }
        return watch_collection(ctx, filter);
    }
    let limit = pages::limit(ctx.param("limit"))?;
    let after = match ctx.param("next") {
        Some(t) => {
            let pos = pages::resume(ctx.route, &ctx.query, t)?;
            let (at, id) = pos
                .split_once('|')
                .ok_or_else(|| Problem::invalid("next is not a continuation of this query"))?;
            Some((at.to_string(), id.to_string()))
        }
        None => None,
    };
    let (route, query) = (ctx.route, ctx.query.clone());
    let body = ctx.reactor(move |d, answer: Answer<Result<Value, Problem>>| {
        let inbox = d.inbox.clone();
        let fallback = answer.clone();
        let f = filter.clone();
        let queued = d.ledger.read(Box::new(move |conn| {
            let rows = list_rows(conn, &f, after.as_ref(), limit + 1);
            inbox.run(move |d| {
                let rows = match rows {
                    Ok(r) => r,
                    Err(e) => return answer.send(Err(read_failed(&e))),
                };
                let more = rows.len() > limit;
                let mut last_key = None;
                let mut items = Vec::new();
                for (key, row) in rows.into_iter().take(limit) {
                    last_key = Some(key);
                    if let Some(s) = summary(d, Some(&row), &row.id) {
                        if filter.admits(&s) {
                            items.push(s);
                        }
                    }
                }
                let (items, all) = pages::fit(items);
                let next = match (&last_key, more || !all) {
                    (Some((at, id)), true) => {
                        let (at, id) = if all {
                            (at.clone(), id.clone())
                        } else {
                            sort_key(items.last())
                        };
                        json!(pages::token(route, &query, &format!("{at}|{id}")))
                    }
                    _ => Value::Null,
                };
                answer.send(Ok(json!({"items": items, "next": next})));
            });
        }));
        if let Err(e) = queued {
            fallback.send(Err(ledger_problem(e)));
        }
    })??;
    Ok(Reply::Json {
        status: 200,
        body,
        etag: true,
        headers: vec![("Vary", "Accept".into())],
    })
}

fn sort_key(v: Option<&Value>) -> (String, String) {
    let v = v.cloned().unwrap_or(Value::Null);
    let at = v["activity_at"]
        .as_str()
        .or(v["created_at"].as_str())
        .unwrap_or_default()
        .to_string();
    (at, v["id"].as_str().unwrap_or_default().to_string())
}

type Keyed = ((String, String), Row);

fn list_rows(
    conn: &rusqlite::Connection,
    f: &Filter,
    after: Option<&(String, String)>,
    limit: usize,
) -> rusqlite::Result<Vec<Keyed>> {
    let mut sql = format!(
        "SELECT {ROW_COLUMNS}, coalesce(last_activity, created_at) AS k FROM sessions WHERE 1 = 1"
    );
    let mut params: Vec<Sql> = Vec::new();
    let mut add = |clause: &str, v: Sql, params: &mut Vec<Sql>| {
        params.push(v);
        sql.push_str(&clause.replace('?', &format!("?{}", params.len())));
    };
    // Only the rows the caller may read, so that its pages are not empty
    // ones of others' sessions ([`Filter::admits`] checks again).
    match &f.reader {
        CallerClass::Operator => {}
        CallerClass::AgentSession(Some(own)) => {
            add(" AND id = ?", Sql::Text(own.clone()), &mut params)
        }
        _ => add(" AND 0 = ?", Sql::Integer(1), &mut params),
    }
    if let Some(h) = &f.harness {
        add(" AND harness = ?", Sql::Text(h.clone()), &mut params);
    }
    if let Some(w) = &f.worktree {
        add(" AND cwd = ?", Sql::Text(w.clone()), &mut params);
    }
    if let Some(p) = &f.parent {
        add(" AND parent = ?", Sql::Text(p.clone()), &mut params);
    }
    match f.state.as_deref() {
        Some("ended") => sql.push_str(" AND ended = 1"),
        Some(_) => sql.push_str(" AND ended = 0"),
        None => {}
    }
    if let Some((at, id)) = after {
        params.push(Sql::Text(at.clone()));
        params.push(Sql::Text(id.clone()));
        let (a, b) = (params.len() - 1, params.len());
        sql.push_str(&format!(" AND (k < ?{a} OR (k = ?{a} AND id < ?{b}))"));
    }
    params.push(Sql::Integer(limit as i64));
    sql.push_str(&format!(
        " ORDER BY k DESC, id DESC LIMIT ?{}",
        params.len()
    ));
    let mut st = conn.prepare(&sql)?;
    let rows = st.query_map(rusqlite::params_from_iter(params), |r| {
        let row = row_from(r)?;
        let k: String = r.get(18)?;
        Ok(((k, row.id.clone()), row))
    })?;
    rows.collect()
}

fn watch_collection(ctx: &mut Ctx, filter: Filter) -> Result<Reply, Problem> {
    let (queue, wake) = ctx.reactor(move |d, answer: Answer<Result<_, Problem>>| {
        let r = (|| {
            if d.is_stopping() {
                return Err(Problem::new(Code::ShuttingDown, "the daemon is stopping"));
            }
            let api = api_mut(d)?;
            // A writer that ended dropped its share of the queue. Not a
            // probe wake: that would wake every live watcher.
            api.collection.retain(|c| Arc::strong_count(&c.queue) > 1);
            if api.collection.len() >= limits::SSE_COLLECTION_WATCHES {
                return Err(Problem::new(
                    Code::TooManyStreams,
                    "the daemon already serves the maximum number of collection watches",
                )
                .retry(1));
            }
            let queue = Arc::new(Mutex::new(CollectionQueue::new()));
            let (tx, rx) = crossbeam_channel::bounded(limits::SSE_MAILBOX);
            api.collection.push(CollectionSub {
                filter,
                queue: queue.clone(),
                wake: tx,
            });
            Ok((queue, rx))
        })();
        answer.send(r);
    })??;
    Ok(Reply::Stream(Box::new(move |w: &mut TcpStream| {
        let end = sse::run_collection(
            w,
            &queue,
            &wake,
            Duration::from_millis(limits::SSE_KEEPALIVE_MS),
        );
        let _ = w.flush();
        end
    })))
}

// ---- PUT /sessions/{id} ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    harness: String,
    worktree: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
}

pub fn put_session(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let raw = ctx.path_param("session_id").unwrap_or_default().to_string();
    let id = Uuid7::parse(&raw)?.canonical();
    match ctx.head.header("if-none-match") {
        Some("*") => {}
        Some(_) => return Err(Problem::invalid("creation takes If-None-Match: * only")),
        None => {
            return Err(Problem::new(
                Code::PreconditionRequired,
                "creation needs If-None-Match: *",
            ));
        }
    }
    let body: CreateBody = ctx.json()?;
    let intent = json!({
        "kind": "new", "harness": body.harness, "worktree": body.worktree,
        "name": body.name, "model": body.model, "prompt": body.prompt,
    })
    .to_string();
    let uuid = Uuid7::parse(&raw)?;
    let (status, sid) =
        ctx.reactor(move |d, answer: Answer<Result<(u16, String), Problem>>| {
            create(d, id, uuid, intent, body, answer)
        })??;
    let shared = ctx.shared.clone();
    let session = full_session(
        &shared,
        CallerClass::Operator,
        sid.clone(),
        limits::HTTP_TAIL_DEFAULT,
    )?;
    // The ETag is the one `GET /sessions/{id}` gives the same bytes
    // (seed 002: "Success returns 201 with Session, its Location, and
    // ETag").
    Ok(Reply::Json {
        status,
        body: session,
        etag: true,
        headers: vec![("Location", format!("/sessions/{sid}"))],
    })
}

fn create(
    d: &mut Daemon,
    id: String,
    uuid: Uuid7,
    intent: String,
    body: CreateBody,
    answer: Answer<Result<(u16, String), Problem>>,
) {
    let api = match api_mut(d) {
        Ok(a) => a,
        Err(p) => return answer.send(Err(p)),
    };
    if let Some(c) = api.creations.get(&id) {
        let r = if c.intent != intent {
            Err(Problem::new(
                Code::IdentityConflict,
                format!("creation {id} was made with another intent"),
            ))
        } else if !c.settled {
            Err(Problem::new(
                Code::Unavailable,
                "this creation is still being decided; repeat it",
            )
            .retry(1))
        } else if let Some(s) = &c.session {
            // The same intent again: the session exists, so `If-None-Match:
            // *` is false (RFC 9110, 13.1.2; seed 002: "An existing session
            // fails the create precondition with 412"). The intent was
            // compared above, so this 412 proves the creation; the
            // Session is read at its UUIDv7 or its id.
            Err(Problem::new(
                Code::PreconditionFailed,
                format!("creation {id} already made session {s}; read /sessions/{s}"),
            ))
        } else {
            Err(stored_problem(c.status, &c.problem))
        };
        return answer.send(r);
    }
    if let Err(p) = uuid.check_age(crate::clock::now_ms()) {
        return answer.send(Err(p));
    }
    if api.creations.len() >= limits::HTTP_DECISIONS_MAX {
        return answer.send(Err(Problem::new(
            Code::TooManySessions,
            "too many creation decisions are retained",
        )
        .retry(3600)));
    }
    let created_at = crate::clock::now_ts();
    api.creations.insert(
        id.clone(),
        Creation {
            intent: intent.clone(),
            session: None,
            status: 0,
            problem: None,
            created_at: created_at.clone(),
            settled: false,
        },
    );
    let sp = core_sessions::SpawnRequest {
        harness: body.harness,
        cwd: body.worktree,
        prompt: body.prompt,
        model: body.model,
        name: body.name,
    };
    crate::daemon::router::sessions::spawn(d, sp, move |d, r| {
        let (session, status, problem) = match &r {
            Ok(s) => (Some(s.session_id.clone()), 201u16, None),
            Err(e) => {
                let p = Problem::from_rpc(e);
                (None, p.status(), Some(p))
            }
        };
        let op = Op::Exec {
            sql: "INSERT INTO http_creations (id, intent, session, status, problem, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params: vec![
                Sql::Text(id.clone()),
                Sql::Text(intent),
                session.clone().map(Sql::Text).unwrap_or(Sql::Null),
                Sql::Integer(status as i64),
                problem
                    .as_ref()
                    .and_then(problem_pair)
                    .map(|p| Sql::Text(json!([p.0, p.1]).to_string()))
                    .unwrap_or(Sql::Null),
                Sql::Text(created_at),
            ],
        };
        d.write(vec![op], move |d, w| {
            let Ok(api) = api_mut(d) else {
                return answer.send(Err(Problem::new(
                    Code::ShuttingDown,
                    "the daemon is stopping",
                )));
            };
            if let Err(e) = w {
                api.creations.remove(&id);
                return answer.send(Err(ledger_problem(e)));
            }
            if let Some(c) = api.creations.get_mut(&id) {
                c.settled = true;
                c.session = session.clone();
                c.status = status;
                c.problem = problem.as_ref().and_then(problem_pair);
            }
            match (session, problem) {
                (Some(s), _) => {
                    api.created_as.insert(s.clone(), id);
                    answer.send(Ok((201, s)));
                }
                (None, Some(p)) => answer.send(Err(p)),
                (None, None) => answer.send(Err(Problem::new(
                    Code::Unavailable,
                    "the session could not be started",
                ))),
            }
        });
    });
}

// ---- GET /sessions/{id} ----

/// The recent history of live sessions read lately, kept on the reactor
/// so that a `GET /sessions/{id}` of a session whose transcript has not
/// changed is one reactor round trip, without a ledger read. Only the
/// history (what the ledger holds) is kept: the rest of the Session is
/// built anew from the reactor's state each time, so nothing else needs
/// an invalidation hook. An entry is dropped when a round of its session
/// is committed ([`on_committed`]) or the session starts or ends
/// ([`on_events`]); a read that started before such a change is not kept
/// (`stamp`). Bounded by `limits::HTTP_HISTORY_CACHE`, least recently
/// used first out.
#[derive(Default)]
pub struct HistoryCache {
    map: HashMap<String, Cached>,
    /// Counts invalidations (and uses).
    clock: u64,
}

struct Cached {
    /// The clock at this session's last invalidation.
    stamp: u64,
    used: u64,
    /// (tail, items, high water)
    data: Option<(usize, Arc<Vec<Value>>, u64)>,
}

impl HistoryCache {
    fn hit(&mut self, sid: &str, tail: usize) -> Option<(Arc<Vec<Value>>, u64)> {
        self.clock += 1;
        let c = self.map.get_mut(sid)?;
        c.used = self.clock;
        c.data
            .as_ref()
            .filter(|(t, _, _)| *t == tail)
            .map(|(_, items, high)| (items.clone(), *high))
    }

    /// Before a ledger read: the clock to hand to [`HistoryCache::fill`].
    fn begin(&mut self, sid: &str) -> u64 {
        self.clock += 1;
        let now = self.clock;
        if !self.map.contains_key(sid) {
            if self.map.len() >= limits::HTTP_HISTORY_CACHE {
                if let Some(old) = self
                    .map
                    .iter()
                    .min_by_key(|(_, c)| c.used)
                    .map(|(k, _)| k.clone())
                {
                    self.map.remove(&old);
                }
            }
            self.map.insert(
                sid.to_string(),
                Cached {
                    stamp: 0,
                    used: now,
                    data: None,
                },
            );
        }
        now
    }

    /// After the read begun at `start`: kept unless the session changed
    /// since (or its entry left).
    fn fill(&mut self, sid: &str, start: u64, tail: usize, items: &[Value], high: u64) {
        if let Some(c) = self.map.get_mut(sid).filter(|c| c.stamp < start) {
            c.data = Some((tail, Arc::new(items.to_vec()), high));
        }
    }

    fn invalidate(&mut self, sid: &str) {
        self.clock += 1;
        if let Some(c) = self.map.get_mut(sid) {
            c.stamp = self.clock;
            c.data = None;
        }
    }
}

fn history_cache(d: &mut Daemon) -> Option<&mut HistoryCache> {
    d.http.as_mut().map(|h| &mut h.sessions.history)
}

/// Captures the full Session on the reactor, then reads its recent
/// history: (cursor, Session). A live session's history comes from
/// [`HistoryCache`] when it holds it.
fn capture(
    shared: &Shared,
    class: CallerClass,
    raw: String,
    tail: usize,
) -> Result<(u64, Value), Problem> {
    capture_then(shared, class, raw, tail, |_, _, captured| Ok(captured))
}

/// [`capture`], then `then` on the reactor in the same turn, before any
/// other change can reach the session: for a change conditional on the
/// representation just captured (If-Match). `then` gets the session id.
fn capture_then<T: Send + 'static>(
    shared: &Shared,
    class: CallerClass,
    raw: String,
    tail: usize,
    then: impl FnOnce(&mut Daemon, &str, (u64, Value)) -> Result<T, Problem> + Send + 'static,
) -> Result<T, Problem> {
    capture_in(shared, false, class, raw, tail, move |d, sid, c, _| {
        then(d, sid, c)
    })
}

/// [`capture_then`], as a read ([`super::reactor_read`]) when `read`:
/// then `then` must change nothing visible. `then` is also told whether
/// the capture is current as of the reactor's change count now: false
/// when it came from a ledger read that other work overtook.
fn capture_in<T: Send + 'static>(
    shared: &Shared,
    read: bool,
    class: CallerClass,
    raw: String,
    tail: usize,
    then: impl FnOnce(&mut Daemon, &str, (u64, Value), bool) -> Result<T, Problem> + Send + 'static,
) -> Result<T, Problem> {
    super::reactor_send(
        shared,
        read,
        move |d: &mut Daemon, answer: Answer<Result<T, Problem>>| {
            let Some(sid) = readable(d, &class, &raw) else {
                return answer.send(Err(not_found(&raw)));
            };
            let live = d.core.sessions.get(&sid).is_some();
            if live {
                let watched = |d: &Daemon| {
                    d.http
                        .as_ref()
                        .is_some_and(|h| h.sessions.topics.contains_key(&sid))
                };
                // A live session's read carries the cursor a first watch
                // resumes from (seed 002: "JSON reads return the same
                // cursor pair for subsequent attachment"), so its topic
                // starts here if no watch started it (issue 10, item 27).
                // With every topic slot watched, the cursor stays null
                // and a watch starts with a reset.
                // A topic started (or one dropped for it) changes what
                // other reads show: counted as a change (src/http/snapshots.rs).
                if !watched(d) {
                    let _ = live_topic(d, &sid);
                    d.inbox.changed();
                }
                if let Some((items, high)) = history_cache(d).and_then(|c| c.hit(&sid, tail)) {
                    let got = assemble(d, None, &sid, &raw, tail, items.as_ref().clone(), high);
                    return answer.send(got.and_then(|c| then(d, &sid, c, true)));
                }
            }
            let start = history_cache(d).map_or(0, |c| c.begin(&sid));
            let inbox = d.inbox.clone();
            let fallback = answer.clone();
            let before = d.inbox.changes();
            let queued = d.ledger.read(Box::new(move |conn| {
                let got = read_row(conn, &sid)
                    .and_then(|row| Ok((row, read_history(conn, &sid, None, None, tail)?)));
                let task = move |d: &mut Daemon| {
                    let (row, (items, high)) = match got {
                        Ok(v) => v,
                        Err(e) => return answer.send(Err(read_failed(&e))),
                    };
                    if d.core.sessions.get(&sid).is_some() {
                        if let Some(c) = history_cache(d) {
                            c.fill(&sid, start, tail, &items, high);
                        }
                    }
                    let got = assemble(d, row.as_ref(), &sid, &raw, tail, items, high);
                    let current = d.inbox.changes() == before;
                    answer.send(got.and_then(|c| then(d, &sid, c, current)));
                };
                if read {
                    inbox.read(task);
                } else {
                    inbox.run(task);
                }
            }));
            if let Err(e) = queued {
                fallback.send(Err(ledger_problem(e)));
            }
        },
    )?
}

/// The full Session from the reactor's state and the history read.
fn assemble(
    d: &Daemon,
    row: Option<&Row>,
    sid: &str,
    raw: &str,
    tail: usize,
    items: Vec<Value>,
    high: u64,
) -> Result<(u64, Value), Problem> {
    // The state and the cursor are captured here, on the reactor, where
    // publication happens.
    let Some(mut s) = summary(d, row, sid) else {
        return Err(not_found(raw));
    };
    let api = d.http.as_ref().map(|h| &h.sessions);
    let cursor = api
        .and_then(|a| a.topics.get(sid))
        .map_or(0, Topic::high_water);
    let creation = api.and_then(|a| a.created_as.get(sid).and_then(|c| a.creations.get(c)));
    s["creation"] = match creation {
        Some(c) => {
            json!({"id": api.and_then(|a| a.created_as.get(sid)), "submitted": serde_json::from_str::<Value>(&c.intent).unwrap_or(Value::Null), "created_at": c.created_at})
        }
        None => Value::Null,
    };
    let q = api.and_then(|a| a.queues.get(sid));
    let pending: Vec<Value> = q
        .map(|q| {
            q.handed
                .iter()
                .chain(q.waiting.iter())
                .filter_map(|i| api.and_then(|a| a.inputs.get(i)))
                .map(input_json)
                .collect()
        })
        .unwrap_or_default();
    s["pending_inputs"] = Value::Array(pending);
    s["input_order"] = json!(q.map_or(0, |q| q.input_order));
    // The growing entry as its events have published it, so that the
    // `text` events after this cursor append to exactly what the
    // snapshot shows.
    let (mut items, mut high) = (items, high);
    if let Some(l) = api.and_then(|a| a.live.get(sid)) {
        match items
            .iter_mut()
            .find(|e| e["position"].as_u64() == Some(l.pos))
        {
            Some(e) => *e = l.entry.clone(),
            None if tail > 0 && l.pos >= high => {
                items.push(l.entry.clone());
                high = l.pos + 1;
            }
            None => {}
        }
    }
    s["history"] = history_page(items, high);
    Ok((cursor, s))
}

fn full_session(
    shared: &Shared,
    class: CallerClass,
    raw: String,
    tail: usize,
) -> Result<Value, Problem> {
    capture(shared, class, raw, tail).map(|(_, v)| v)
}

fn tail_of(ctx: &Ctx) -> Result<usize, Problem> {
    match ctx.param("tail") {
        None => Ok(limits::HTTP_TAIL_DEFAULT),
        Some(t) => match t.parse::<usize>() {
            Ok(n) if n <= limits::HTTP_TAIL_MAX && t.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
            _ => Err(Problem::invalid(format!(
                "tail must be a whole number from 0 to {}",
                limits::HTTP_TAIL_MAX
            ))),
        },
    }
}

/// What `GET /sessions/{id}` asks for, once its parameters are checked.
enum SessionRead {
    Watch(CallerClass, String, usize),
    /// A current snapshot the caller may read.
    Current(Arc<Snapshot>),
    /// No current snapshot: one is made on the reactor.
    Capture(CallerClass, String, usize),
}

fn session_read(ctx: &mut Ctx) -> Result<SessionRead, Problem> {
    let raw = ctx.path_param("session_id").unwrap_or_default().to_string();
    let tail = tail_of(ctx)?;
    let class = ctx.caller()?;
    if negotiate(
        ctx.head.header("accept"),
        &["application/json", "text/event-stream"],
    )? == "text/event-stream"
    {
        return Ok(SessionRead::Watch(class, raw, tail));
    }
    if ctx.param("after_generation").is_some() || ctx.param("after_seq").is_some() {
        return Err(Problem::invalid(
            "after_generation and after_seq belong to a watch (Accept: text/event-stream)",
        ));
    }
    let shared = ctx.shared;
    Ok(match shared.snapshots.get(&shared.inbox, &raw, tail) {
        Some(s) if core_sessions::may_read(&class, &s.sid) => SessionRead::Current(s),
        _ => SessionRead::Capture(class, raw, tail),
    })
}

fn serialised(snap: &Snapshot) -> Serialised {
    Serialised {
        body: snap.body.clone(),
        etag: snap.etag.clone(),
        headers: vec![("Vary", "Accept".into())],
    }
}

pub fn get_session(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let snap = match session_read(ctx)? {
        SessionRead::Watch(class, raw, tail) => return watch_session(ctx, class, raw, tail),
        SessionRead::Current(s) => s,
        SessionRead::Capture(class, raw, tail) => {
            let shared = ctx.shared;
            capture_in(
                shared,
                true,
                class,
                raw.clone(),
                tail,
                move |d, sid, (_, v), current| {
                    let body: Arc<[u8]> = serde_json::to_vec(&v).unwrap_or_default().into();
                    let snap = Arc::new(Snapshot {
                        at: d.inbox.changes(),
                        sid: sid.to_string(),
                        etag: super::etag::of(&body),
                        body,
                    });
                    if current {
                        if let Some(h) = d.http.as_ref() {
                            h.shared.snapshots.put(&raw, tail, snap.clone());
                        }
                    }
                    Ok(snap)
                },
            )?
        }
    };
    Ok(Reply::Shared(serialised(&snap)))
}

/// `GET /sessions/{id}` answered where its request was read, without
/// waiting for anything: its refusals, and a current snapshot's bytes
/// (src/http/snapshots.rs). `None` when the answer needs the reactor (a
/// watch, or no current snapshot).
pub fn get_session_at_once(ctx: &mut Ctx) -> Option<Result<Serialised, Problem>> {
    match session_read(ctx) {
        Err(p) => Some(Err(p)),
        Ok(SessionRead::Current(s)) => Some(Ok(serialised(&s))),
        Ok(SessionRead::Watch(..) | SessionRead::Capture(..)) => None,
    }
}

fn watch_session(
    ctx: &mut Ctx,
    class: CallerClass,
    raw: String,
    tail: usize,
) -> Result<Reply, Problem> {
    let after = match (ctx.param("after_generation"), ctx.param("after_seq")) {
        (None, None) => None,
        (Some(g), Some(s)) if !g.is_empty() && g.len() <= 128 => {
            Some((g.to_string(), counter("after_seq", s)?))
        }
        _ => {
            return Err(Problem::invalid(
                "a watch resumes with both after_generation and after_seq, from the last batch consumed",
            ));
        }
    };
    let (r, reader) = (raw.clone(), class.clone());
    let (sub, start): (Subscription, Start) =
        ctx.reactor(move |d, answer: Answer<Result<_, Problem>>| {
            let r = (|| {
                if d.is_stopping() {
                    return Err(Problem::new(Code::ShuttingDown, "the daemon is stopping"));
                }
                let sid = readable(d, &reader, &r)
                    .filter(|s| d.core.sessions.get(s).is_some())
                    .ok_or_else(|| {
                        Problem::new(Code::NotFound, format!("no live session {r} to watch"))
                    })?;
                let topic = live_topic(d, &sid)?;
                let sub = topic.subscribe().map_err(|_| {
                    Problem::new(
                        Code::TooManyStreams,
                        "this session has the maximum number of watchers",
                    )
                    .retry(1)
                })?;
                let start = sub.plan(after.as_ref().map(|(g, s)| (g.as_str(), *s)));
                Ok((sub, start))
            })();
            answer.send(r);
        })??;
    let shared = ctx.shared.clone();
    Ok(Reply::Stream(Box::new(move |w: &mut TcpStream| {
        let mut snapshot = || match capture(&shared, class.clone(), raw.clone(), tail) {
            Ok((at, v)) => Ok((at, v.to_string())),
            Err(p) if p.code == Code::NotFound => Err("session_not_found"),
            Err(p) if p.code == Code::ShuttingDown => Err("shutting_down"),
            Err(_) => Err("snapshot_failed"),
        };
        let end = sse::run_watch(
            w,
            &sub,
            start,
            Duration::from_millis(limits::SSE_KEEPALIVE_MS),
            &mut snapshot,
        );
        let _ = w.flush();
        end
    })))
}

fn new_generation() -> String {
    let mut b = [0u8; 16];
    crate::ids::random_bytes(&mut b);
    base64url(&b)
}

/// Unpadded base64url (RFC 4648, 5): the generation's text.
fn base64url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len() * 4 / 3 + 2);
    for c in bytes.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=c.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// The topic of a live session, made (with its growing entry seeded) when
/// it has none yet.
fn live_topic<'a>(d: &'a mut Daemon, sid: &str) -> Result<&'a mut Topic, Problem> {
    let seed = live_now(d, sid);
    let api = api_mut(d)?;
    if !api.topics.contains_key(sid) {
        match seed {
            Some(l) => api.live.insert(sid.to_string(), l),
            None => api.live.remove(sid),
        };
    }
    topic_for(api, sid)
}

fn topic_for<'a>(api: &'a mut Api, sid: &str) -> Result<&'a mut Topic, Problem> {
    if !api.topics.contains_key(sid) {
        if api.topics.len() >= limits::SSE_SESSION_TOPICS {
            let idle = api
                .topics
                .iter_mut()
                .find_map(|(k, t)| (t.watchers() == 0).then(|| k.clone()));
            match idle {
                Some(k) => {
                    api.topics.remove(&k);
                    api.last_status.remove(&k);
                    api.live.remove(&k);
                }
                None => {
                    return Err(Problem::new(
                        Code::TooManyStreams,
                        "every session watch slot is in use",
                    )
                    .retry(1));
                }
            }
        }
        api.topics
            .insert(sid.to_string(), Topic::new(new_generation(), 0));
    }
    api.topics
        .get_mut(sid)
        .ok_or_else(|| Problem::new(Code::Unavailable, "the watch could not be set up"))
}

// ---- DELETE /sessions/{id} ----

/// Ends a live session. With `If-Match` (seed 002: "conditional DELETE
/// require[s] the observed If-Match"), only while the Session as `GET
/// /sessions/{id}` shows it with its default tail still has that ETag:
/// the representation is captured and compared, and the session ended,
/// in one reactor turn, so nothing the agent does comes between. `*`
/// matches any live session. Without `If-Match` the end is unconditional
/// (ending is always safe to repeat).
pub fn delete_session(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let raw = ctx.path_param("session_id").unwrap_or_default().to_string();
    let body = match ctx.head.header("if-match").map(str::to_string) {
        None => ctx.reactor(move |d, answer: Answer<Result<Value, Problem>>| {
            let r = resolve(d, &raw)
                .ok_or_else(|| not_found(&raw))
                .and_then(|sid| end_session(d, &raw, &sid));
            answer.send(r);
        })??,
        Some(if_match) => {
            let class = ctx.caller()?;
            let r = raw.clone();
            capture_then(
                ctx.shared,
                class,
                raw,
                limits::HTTP_TAIL_DEFAULT,
                move |d, sid, (_, session)| {
                    let bytes = serde_json::to_vec(&session).unwrap_or_default();
                    super::etag::require_match(Some(&if_match), &super::etag::of(&bytes))?;
                    end_session(d, &r, sid)
                },
            )?
        }
    };
    Ok(Reply::json(200, body))
}

fn end_session(d: &mut Daemon, raw: &str, sid: &str) -> Result<Value, Problem> {
    if d.core.sessions.get(sid).is_none() {
        // Not live here: ended before, or unknown.
        return Err(Problem::new(
            Code::NotFound,
            format!("no live session {raw}; an ended session keeps its record"),
        ));
    }
    let k = crate::daemon::router::sessions::kill(d, sid).map_err(|e| Problem::from_rpc(&e))?;
    let ended = k == core_sessions::Killed::AlreadyEnded;
    Ok(json!({"id": sid, "state": if ended { "ended" } else { "stopping" }}))
}

// ---- inputs ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
enum InputBody {
    Message {
        text: String,
        #[serde(default)]
        client_id: Option<String>,
    },
    Continue {
        #[serde(default)]
        client_id: Option<String>,
    },
}

/// The prompt a `continue` input gives the agent.
const CONTINUE_PROMPT: &str = "Continue.";

pub fn put_input(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let raw = ctx.path_param("session_id").unwrap_or_default().to_string();
    let uuid = Uuid7::parse(ctx.path_param("input_id").unwrap_or_default())?;
    let body: InputBody = ctx.json_within(limits::HTTP_INPUT_BODY_MAX)?;
    let (kind, text, client_id) = match body {
        InputBody::Message { text, client_id } => {
            if text.trim().is_empty() {
                return Err(Problem::invalid("a message needs nonblank text"));
            }
            if text.len() > limits::PROMPT_MAX_BYTES {
                return Err(Problem::new(
                    Code::BodyTooLarge,
                    format!(
                        "a message's text is at most {} bytes",
                        limits::PROMPT_MAX_BYTES
                    ),
                ));
            }
            ("message", Some(text), client_id)
        }
        InputBody::Continue { client_id } => ("continue", None, client_id),
    };
    if client_id
        .as_ref()
        .is_some_and(|c| c.len() > 128 || c.chars().any(char::is_control))
    {
        return Err(Problem::invalid(
            "client_id must be at most 128 bytes without control characters",
        ));
    }
    let (status, v) = ctx.reactor(move |d, answer: Answer<Result<(u16, Value), Problem>>| {
        admit(d, raw, uuid, kind, text, answer)
    })??;
    if status >= 400 {
        let p = stored_problem(
            status,
            &Some((
                v["admission"]["code"]
                    .as_str()
                    .unwrap_or("conflict")
                    .to_string(),
                v["admission"]["detail"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )),
        );
        return Err(p);
    }
    let _ = client_id;
    Ok(Reply::json(status, v))
}

fn admit(
    d: &mut Daemon,
    raw: String,
    uuid: Uuid7,
    kind: &'static str,
    text: Option<String>,
    answer: Answer<Result<(u16, Value), Problem>>,
) {
    let Some(sid) = resolve(d, &raw) else {
        return answer.send(Err(not_found(&raw)));
    };
    let id = uuid.canonical();
    let intent = json!({"session_id": sid, "kind": kind, "text": text}).to_string();
    let live = d.core.sessions.get(&sid).map(|s| s.ended);
    let api = match api_mut(d) {
        Ok(a) => a,
        Err(p) => return answer.send(Err(p)),
    };
    if let Some(i) = api.inputs.get(&id) {
        let r = if i.intent != intent {
            Err(Problem::new(
                Code::InputConflict,
                format!("input {id} was admitted with another intent"),
            ))
        } else if !i.durable {
            Err(Problem::new(
                Code::Unavailable,
                "this input is still being committed; repeat it",
            )
            .retry(1))
        } else {
            Ok((i.status, input_json(i)))
        };
        return answer.send(r);
    }
    if let Err(p) = uuid.check_age(crate::clock::now_ms()) {
        return answer.send(Err(p));
    }
    if api.inputs.len() >= limits::HTTP_DECISIONS_MAX {
        return answer.send(Err(Problem::new(
            Code::QueueFull,
            "too many input decisions are retained",
        )
        .retry(3600)));
    }
    let rejection = match live {
        None => {
            return answer.send(Err(Problem::new(
                Code::NotFound,
                format!("no live session {raw}"),
            )));
        }
        Some(true) => Some(Problem::new(
            Code::SessionEnded,
            format!("session {sid} has ended"),
        )),
        Some(false) if api.waiting(&sid) >= limits::HTTP_INPUTS_WAITING => Some(Problem::new(
            Code::QueueFull,
            format!(
                "session {sid} has {} inputs waiting already",
                limits::HTTP_INPUTS_WAITING
            ),
        )),
        Some(false) => None,
    };
    let q = api.queues.entry(sid.clone()).or_default();
    let order = rejection.is_none().then(|| {
        q.input_order += 1;
        q.input_order
    });
    let input = Input {
        id: id.clone(),
        session: sid.clone(),
        intent,
        kind: kind.into(),
        text,
        status: rejection.as_ref().map_or(202, Problem::status),
        problem: rejection.as_ref().and_then(problem_pair),
        accepted_at: crate::clock::now_ts(),
        order,
        delivery: rejection.is_none().then(|| "pending".to_string()),
        turn: None,
        outcome: None,
        position: None,
        durable: false,
    };
    if rejection.is_none() {
        q.waiting.push_back(id.clone());
    }
    let op = input_insert(&input);
    api.inputs.insert(id.clone(), input);
    d.write(vec![op], move |d, w| {
        let Ok(api) = api_mut(d) else {
            return answer.send(Err(Problem::new(
                Code::ShuttingDown,
                "the daemon is stopping",
            )));
        };
        if let Err(e) = w {
            api.inputs.remove(&id);
            if let Some(q) = api.queues.get_mut(&sid) {
                q.waiting.retain(|x| x != &id);
            }
            return answer.send(Err(ledger_problem(e)));
        }
        let Some(i) = api.inputs.get_mut(&id) else {
            return answer.send(Err(Problem::new(Code::Unavailable, "the input vanished")));
        };
        i.durable = true;
        let out = (i.status, input_json(i));
        answer.send(Ok(out));
        deliver(d, &sid);
        publish_input(d, &id);
    });
}

pub fn get_input(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let raw = ctx.path_param("session_id").unwrap_or_default().to_string();
    let id = Uuid7::parse(ctx.path_param("input_id").unwrap_or_default())?.canonical();
    let class = ctx.caller()?;
    let body = ctx.reactor(move |d, answer: Answer<Result<Value, Problem>>| {
        let sid = readable(d, &class, &raw);
        let r = d
            .http
            .as_ref()
            .and_then(|h| h.sessions.inputs.get(&id))
            .filter(|i| i.durable && Some(&i.session) == sid.as_ref())
            .map(input_json)
            .ok_or_else(|| Problem::new(Code::NotFound, format!("no input {id} in session {raw}")));
        answer.send(r);
    })??;
    Ok(Reply::representation(body))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

pub fn cancel_input(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let raw = ctx.path_param("session_id").unwrap_or_default().to_string();
    let id = Uuid7::parse(ctx.path_param("input_id").unwrap_or_default())?.canonical();
    let Empty {} = ctx.json()?;
    let body = ctx.reactor(move |d, answer: Answer<Result<Value, Problem>>| {
        let r = (|| {
            let sid = resolve(d, &raw).ok_or_else(|| not_found(&raw))?;
            let api = api_mut(d)?;
            let i = api
                .inputs
                .get(&id)
                .filter(|i| i.durable && i.session == sid)
                .ok_or_else(|| {
                    Problem::new(Code::NotFound, format!("no input {id} in session {raw}"))
                })?;
            let q = api.queues.entry(sid.clone()).or_default();
            let result = if q.waiting.contains(&id) {
                q.waiting.retain(|x| x != &id);
                "cancelled"
            } else if q.handed.as_ref() == Some(&id)
                || q.running.as_ref().is_some_and(|(_, r)| r == &id)
            {
                q.interrupt_requested = true;
                "interrupt_requested"
            } else {
                let _ = i;
                "not_pending"
            };
            match result {
                "cancelled" => {
                    if let Some(i) = api.inputs.get_mut(&id) {
                        i.delivery = Some("cancelled".into());
                        let op = row_update(i);
                        d.write(vec![op], |_, _| {});
                    }
                    publish_input(d, &id);
                }
                "interrupt_requested" => {
                    crate::daemon::router::sessions::interrupt(d, &sid)
                        .map_err(|e| Problem::from_rpc(&e))?;
                    publish_status(d, &sid);
                }
                _ => {}
            }
            let i = d
                .http
                .as_ref()
                .and_then(|h| h.sessions.inputs.get(&id))
                .map(input_json)
                .unwrap_or(Value::Null);
            Ok(json!({"result": result, "input": i}))
        })();
        answer.send(r);
    })??;
    Ok(Reply::json(200, body))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InterruptBody {
    run_id: Option<String>,
    through_input_order: u64,
}

pub fn post_interrupt(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let raw = ctx.path_param("session_id").unwrap_or_default().to_string();
    let body: InterruptBody = ctx.json()?;
    if body.through_input_order >= 1 << 53 {
        return Err(Problem::invalid(
            "through_input_order must be a whole number from 0 to 2^53-1",
        ));
    }
    let out = ctx.reactor(move |d, answer: Answer<Result<Value, Problem>>| {
        let r = (|| {
            let sid = resolve(d, &raw).ok_or_else(|| not_found(&raw))?;
            let s = d.core.sessions.get(&sid).ok_or_else(|| Problem::new(Code::NotFound, format!("no live session {raw}")))?;
            let current = s.turn_active.then(|| format!("r{}", s.turn));
            let api = api_mut(d)?;
            let q = api.queues.entry(sid.clone()).or_default();
            let mut cancelled = Vec::new();
            let through = body.through_input_order;
            let inputs = &api.inputs;
            q.waiting.retain(|id| {
                let hit = inputs.get(id).and_then(|i| i.order).is_some_and(|o| o <= through);
                if hit {
                    cancelled.push(id.clone());
                }
                !hit
            });
            let hit = body.run_id.is_some() && body.run_id == current;
            if hit {
                q.interrupt_requested = true;
            }
            let mut ops = Vec::new();
            for id in &cancelled {
                if let Some(i) = api.inputs.get_mut(id) {
                    i.delivery = Some("cancelled".into());
                    ops.push(row_update(i));
                }
            }
            if !ops.is_empty() {
                d.write(ops, |_, _| {});
            }
            for id in &cancelled {
                publish_input(d, id);
            }
            if hit {
                crate::daemon::router::sessions::interrupt(d, &sid).map_err(|e| Problem::from_rpc(&e))?;
                publish_status(d, &sid);
            }
            Ok(json!({"run_id": body.run_id, "state": if hit { "requested" } else { "already_ended" }, "cancelled_input_ids": cancelled, "warnings": []}))
        })();
        answer.send(r);
    })??;
    Ok(Reply::json(202, out))
}

// ---- history ----

pub fn get_history(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let raw = ctx.path_param("session_id").unwrap_or_default().to_string();
    let limit = match ctx.param("limit") {
        None => limits::HTTP_HISTORY_DEFAULT,
        Some(l) => match l.parse::<usize>() {
            Ok(n)
                if (1..=limits::HTTP_HISTORY_MAX).contains(&n)
                    && l.bytes().all(|b| b.is_ascii_digit()) =>
            {
                n
            }
            _ => {
                return Err(Problem::invalid(format!(
                    "limit must be a whole number from 1 to {}",
                    limits::HTTP_HISTORY_MAX
                )));
            }
        },
    };
    let before = ctx
        .param("before")
        .map(|b| counter("before", b))
        .transpose()?;
    let after = ctx
        .param("after")
        .map(|a| counter("after", a))
        .transpose()?;
    if before.is_some() && after.is_some() {
        return Err(Problem::invalid("give before or after, not both"));
    }
    let class = ctx.caller()?;
    let body = ctx.reactor(move |d, answer: Answer<Result<Value, Problem>>| {
        let Some(sid) = readable(d, &class, &raw) else {
            return answer.send(Err(not_found(&raw)));
        };
        let fallback = answer.clone();
        let queued = d.ledger.read(Box::new(move |conn| {
            let r = match read_row(conn, &sid) {
                Ok(None) => Err(not_found(&raw)),
                Ok(Some(_)) => read_history(conn, &sid, before, after, limit)
                    .map(|(items, high)| history_page(items, high))
                    .map_err(|e| read_failed(&e)),
                Err(e) => Err(read_failed(&e)),
            };
            answer.send(r);
        }));
        if let Err(e) = queued {
            fallback.send(Err(ledger_problem(e)));
        }
    })??;
    Ok(Reply::representation(body))
}

// ---- publication (reactor side) ----

/// Hands the next waiting input to the agent when the session has no
/// turn running and none handed.
pub fn deliver(d: &mut Daemon, sid: &str) {
    let Some(s) = d.core.sessions.get(sid) else {
        return;
    };
    if s.ended || s.turn_active || !s.open.is_empty() {
        return;
    }
    let Some(api) = d.http.as_mut().map(|h| &mut h.sessions) else {
        return;
    };
    let Some(q) = api.queues.get_mut(sid) else {
        return;
    };
    if q.handed.is_some() || q.running.is_some() {
        return;
    }
    let Some(id) = q.waiting.pop_front() else {
        return;
    };
    let text = api
        .inputs
        .get(&id)
        .map(|i| {
            i.text
                .clone()
                .unwrap_or_else(|| CONTINUE_PROMPT.to_string())
        })
        .unwrap_or_default();
    q.handed = Some(id.clone());
    if let Err(e) = crate::daemon::router::sessions::input(d, sid, text) {
        crate::warn!(
            "session {sid}: input {id} could not be handed to the agent: {}",
            e.message
        );
        if let Some(q) = d.http.as_mut().and_then(|h| h.sessions.queues.get_mut(sid)) {
            q.handed = None;
            q.waiting.push_front(id);
        }
    }
}

/// Committed events of session streams: turn membership and outcomes.
pub fn on_events(d: &mut Daemon, events: &[Appended]) {
    for ev in events {
        if !ev.stream.starts_with("s-") {
            continue;
        }
        let sid = ev.stream.as_str();
        let turn = d.core.sessions.get(sid).map_or(0, |s| s.turn);
        let position = d
            .core
            .sessions
            .get(sid)
            .map_or(0, |s| s.transcript.len as u64);
        let Some(api) = d.http.as_mut().map(|h| &mut h.sessions) else {
            return;
        };
        let mut touched = None;
        let mut completed = None;
        match ev.kind.as_str() {
            "turn.start" => {
                if let Some(q) = api.queues.get_mut(sid) {
                    if let Some(id) = q.handed.take() {
                        q.running = Some((turn, id.clone()));
                        if let Some(i) = api.inputs.get_mut(&id) {
                            i.delivery = Some("committed".into());
                            i.turn = Some(turn);
                            i.outcome = Some("running".into());
                            i.position = Some(position.saturating_sub(1));
                        }
                        touched = Some(id);
                    }
                }
            }
            "turn.end" | "session.end" => {
                let outcome = match serde_json::from_str::<Value>(&ev.data)
                    .ok()
                    .and_then(|v| v["reason"].as_str().map(str::to_string))
                    .as_deref()
                {
                    Some("completed") => "completed",
                    Some("interrupted") => "interrupted",
                    _ if ev.kind == "session.end" => "abandoned",
                    _ => "failed",
                };
                let running = api.queues.get_mut(sid).and_then(|q| {
                    q.interrupt_requested = false;
                    q.running.take()
                });
                if let Some((_, id)) = &running {
                    if let Some(i) = api.inputs.get_mut(id) {
                        i.outcome = Some(outcome.into());
                    }
                    touched = Some(id.clone());
                }
                // Every turn's end is told, with the one input it held, if
                // any (a prompt given at creation or through the socket
                // holds none).
                if ev.kind == "turn.end" || running.is_some() {
                    let t = running.as_ref().map_or(turn, |(t, _)| *t);
                    completed = Some((t, outcome, running.map(|(_, id)| id)));
                }
            }
            _ => {}
        }
        if let Some(id) = &touched {
            if let Some(i) = api.inputs.get(id) {
                let op = row_update(i);
                d.write(vec![op], |_, _| {});
            }
            publish_input(d, id);
        }
        if let Some((t, outcome, id)) = completed {
            let ids: Vec<String> = id.into_iter().collect();
            publish(
                d,
                sid,
                "turn_completed",
                json!({"run_id": format!("r{t}"), "outcome": outcome, "input_ids": ids}),
            );
        }
        if ev.kind == "session.end" {
            // No later entry will complete a growing one now.
            if let Some(l) = d.http.as_mut().and_then(|h| h.sessions.live.remove(sid)) {
                publish(d, sid, "message", json!({"entry": l.entry}));
            }
        }
        if ev.kind == "session.end" || ev.kind == "session.start" {
            if let Some(c) = history_cache(d) {
                c.invalidate(sid);
            }
            invalidate(d, sid);
        }
    }
}

/// A round of a session was committed (`router::sessions`): its
/// transcript entries, status and activity go out, and the next input is
/// handed over when the session is free.
pub fn on_committed(d: &mut Daemon, sid: &str, delta: Option<&Delta>) {
    let Some(cache) = history_cache(d) else {
        return;
    };
    cache.invalidate(sid);
    if let Some(delta) = delta {
        let now = crate::clock::now_ms();
        let run_id = format!("r{}", d.core.sessions.get(sid).map_or(0, |s| s.turn));
        let watched = d
            .http
            .as_ref()
            .is_some_and(|h| h.sessions.topics.contains_key(sid));
        let mut live = d.http.as_mut().and_then(|h| h.sessions.live.remove(sid));
        let end = (delta.from + delta.entries.len()) as u64;
        // The growing entry is complete once a later entry exists; when
        // this round did not touch it, its last published form goes out.
        if let Some(l) = live.take_if(|l| l.pos < delta.from as u64 && l.pos + 1 < end) {
            publish(d, sid, "message", json!({"entry": l.entry}));
        }
        for (i, e) in delta.entries.iter().enumerate() {
            let pos = (delta.from + i) as u64;
            let entry = entry_from_wire(pos, e);
            if let Some(api) = d.http.as_mut().map(|h| &mut h.sessions) {
                note_activity(
                    api.activity.entry(sid.to_string()).or_default(),
                    &entry,
                    now,
                );
            }
            let kind = e["kind"].as_str().unwrap_or_default();
            if watched && (kind == "text" || kind == "thinking") && pos + 1 == end {
                let text = e["text"].as_str().unwrap_or_default();
                let from = live
                    .as_ref()
                    .filter(|l| l.pos == pos)
                    .map_or(0, |l| l.published);
                publish_appended(d, sid, kind, &run_id, pos, from, text);
                live = Some(Live {
                    pos,
                    published: text.len().max(from),
                    entry,
                });
                continue;
            }
            if live.as_ref().is_some_and(|l| l.pos == pos) {
                live = None;
            }
            publish(d, sid, "message", json!({"entry": entry}));
        }
        if let (Some(l), Some(api)) = (live, d.http.as_mut().map(|h| &mut h.sessions)) {
            api.live.insert(sid.to_string(), l);
        }
        // The end of what this round committed: the core's transcript may
        // already hold entries of the next round, which are not committed
        // and not yet published, and a watcher that reads this high-water
        // as "everything up to here" must have them.
        publish(d, sid, "committed", json!({"high_water": end}));
    }
    publish_status(d, sid);
    deliver(d, sid);
    collection_activity(d, sid);
}

fn note_activity(a: &mut Activity, entry: &Value, now: i64) {
    let kind = match entry["kind"].as_str() {
        Some("user") => "input",
        Some("text") => "assistant",
        Some("thinking") => "thinking",
        Some("tool") => "tool",
        Some("system") => "error",
        _ => "note",
    };
    let text = match kind {
        "tool" => entry["tool"]["name"].as_str().unwrap_or("tool").to_string(),
        _ => entry["text"].as_str().unwrap_or_default().to_string(),
    };
    // The tail of the text: the current partial line is what moves.
    let chars: Vec<char> = text.chars().collect();
    let text: String = chars[chars.len().saturating_sub(limits::HTTP_ACTIVITY_LINE_CHARS)..]
        .iter()
        .collect();
    let id = entry["id"].as_str().unwrap_or_default().to_string();
    a.observed_ms = now;
    if let Some(l) = a.lines.iter_mut().find(|l| l.entry == id) {
        l.text = text;
        return;
    }
    a.lines.push_back(Line {
        entry: id,
        kind,
        text,
    });
    while a.lines.len() > limits::HTTP_ACTIVITY_LINES {
        a.lines.pop_front();
    }
}

/// Publishes the text of a growing entry past its first `from` bytes as
/// `text` (or `thinking`) events, each at most `HTTP_ENTRY_TEXT_MAX` bytes
/// of text so that one event always fits a frame and the replay buffer.
/// `offset` is where the event's text starts in the entry, in UTF-8 bytes.
fn publish_appended(
    d: &mut Daemon,
    sid: &str,
    kind: &str,
    run_id: &str,
    pos: u64,
    from: usize,
    text: &str,
) {
    let Some(mut rest) = text.get(from..) else {
        return;
    };
    let mut offset = from;
    while !rest.is_empty() {
        let mut cut = rest.len().min(limits::HTTP_ENTRY_TEXT_MAX);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (piece, tail) = rest.split_at(cut);
        publish(
            d,
            sid,
            kind,
            json!({"run_id": run_id, "message_id": format!("e{pos}"), "offset": offset, "text": piece}),
        );
        offset += piece.len();
        rest = tail;
    }
}

/// The growing entry a new topic starts from: the running turn's last
/// entry, when it is text or thinking, as the session core holds it now.
fn live_now(d: &Daemon, sid: &str) -> Option<Live> {
    let s = d.core.sessions.get(sid).filter(|s| s.turn_active)?;
    let pos = s.transcript.len.checked_sub(1)?;
    let e = s.transcript.cached_from(pos)?.into_iter().next()?;
    let kind = e["kind"].as_str()?;
    if kind != "text" && kind != "thinking" {
        return None;
    }
    let published = e["text"].as_str().map_or(0, str::len);
    Some(Live {
        pos: pos as u64,
        published,
        entry: entry_from_wire(pos as u64, &e),
    })
}

/// Publishes one event to the session's topic, if it is watched.
fn publish(d: &mut Daemon, sid: &str, kind: &str, data: Value) {
    let Some(topic) = d.http.as_mut().and_then(|h| h.sessions.topics.get_mut(sid)) else {
        return;
    };
    let seq = topic.high_water() + 1;
    topic.publish(seq, &sse::event(kind, seq, &data));
}

fn publish_status(d: &mut Daemon, sid: &str) {
    let Some(s) = d.core.sessions.get(sid) else {
        return;
    };
    let Some(api) = d.http.as_mut().map(|h| &mut h.sessions) else {
        return;
    };
    if !api.topics.contains_key(sid) {
        return;
    }
    let st = status_json(s, api.queues.get(sid));
    let text = st.to_string();
    if api.last_status.get(sid) == Some(&text) {
        return;
    }
    api.last_status.insert(sid.to_string(), text);
    publish(d, sid, "status", st);
}

fn publish_input(d: &mut Daemon, id: &str) {
    let Some(i) = d.http.as_ref().and_then(|h| h.sessions.inputs.get(id)) else {
        return;
    };
    let (sid, v) = (i.session.clone(), input_json(i));
    publish(d, &sid, "input", json!({"input": v}));
}

/// Queues an `activity` replacement for the session to every collection
/// watch whose filter admits it.
fn collection_activity(d: &mut Daemon, sid: &str) {
    if d.http
        .as_ref()
        .is_none_or(|h| h.sessions.collection.is_empty())
    {
        return;
    }
    let Some(s) = summary(d, None, sid) else {
        return;
    };
    let ev = json!({"type": "activity", "data": {
        "session_id": sid,
        "cursor": s["cursor"],
        "status": s["status"],
        "activity": s["activity"],
    }})
    .to_string();
    let Some(api) = d.http.as_mut().map(|h| &mut h.sessions) else {
        return;
    };
    api.collection.retain(|c| {
        if c.filter.admits(&s) {
            lock(&c.queue).activity(sid, ev.clone());
            !matches!(
                c.wake.try_send(()),
                Err(crossbeam_channel::TrySendError::Disconnected(()))
            )
        } else {
            true
        }
    });
}

/// Tells every collection watch that a session's row changed (added,
/// ended): it reads the session again. Filters are not consulted: a
/// session that left a filter must reach the client too.
fn invalidate(d: &mut Daemon, sid: &str) {
    let Some(api) = d.http.as_mut().map(|h| &mut h.sessions) else {
        return;
    };
    if api.collection.is_empty() {
        return;
    }
    let ev = json!({"type": "invalidate", "data": {"resource": "session", "url": format!("/sessions/{sid}"), "session_ids": [sid]}}).to_string();
    api.collection.retain(|c| {
        lock(&c.queue).invalidate(ev.clone());
        !matches!(
            c.wake.try_send(()),
            Err(crossbeam_channel::TrySendError::Disconnected(()))
        )
    });
}

/// Ends every watch (the daemon is stopping).
pub fn close_all(api: &mut Api) {
    for t in api.topics.values_mut() {
        t.close();
    }
    api.collection.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_cache_keeps_no_read_older_than_a_change_and_stays_bounded() {
        let mut c = HistoryCache::default();
        let items = vec![json!({"position": 0})];
        assert!(c.hit("s-1", 100).is_none());
        let start = c.begin("s-1");
        c.fill("s-1", start, 100, &items, 1);
        assert_eq!(c.hit("s-1", 100).map(|(i, h)| (i.len(), h)), Some((1, 1)));
        assert!(c.hit("s-1", 5).is_none(), "another tail is another window");
        // A change between the read's start and its fill: not kept.
        let start = c.begin("s-2");
        c.invalidate("s-2");
        c.fill("s-2", start, 100, &items, 1);
        assert!(c.hit("s-2", 100).is_none());
        // A change drops what was kept.
        c.invalidate("s-1");
        assert!(c.hit("s-1", 100).is_none());
        for n in 0..limits::HTTP_HISTORY_CACHE + 10 {
            let sid = format!("s-x{n}");
            let start = c.begin(&sid);
            c.fill(&sid, start, 100, &items, 1);
        }
        assert_eq!(c.map.len(), limits::HTTP_HISTORY_CACHE);
    }
}
