//! The daemon socket's methods for sessions and transcripts (issue 3; seed
//! 004, Sessions, Transcripts; names snake_case as DESIGN.md's table says).
//! [`super::dispatch`] hands every `sessions.*`, `session.*` and
//! `transcript.*` call here.
//!
//! | method                  | who      | answers                                      |
//! |-------------------------|----------|----------------------------------------------|
//! | sessions.list           | anyone†  | Session[] in creation order, then tmux's (src/socket/methods/tmux.rs) |
//! | sessions.get            | anyone†  | Session                                      |
//! | sessions.subscribe      | anyone†  | Session[]; then `session.event` notes        |
//! | sessions.unsubscribe    | anyone   | {was_subscribed}                             |
//! | sessions.spawn          | operator | {session_id, session} once session.start is committed |
//! | sessions.input          | operator | {queued, queue_length}                       |
//! | sessions.interrupt      | operator | {interrupted}                                |
//! | sessions.kill           | operator | {ended}                                      |
//! | session.rename          | operator | {name, applied}; a tmux session's is refused |
//! | sessions.transcriptView | anyone†  | {entries}                                    |
//! | sessions.toolDetail     | anyone†  | ToolDetail                                   |
//! | transcript.subscribe    | anyone†  | TranscriptDelta; then `transcript.delta`s    |
//! | transcript.unsubscribe  | anyone   | null                                         |
//!
//! †The session reads (sessions.list, .get, .subscribe and its
//! `session.event`s, sessions.transcriptView, .toolDetail,
//! transcript.subscribe) stay open to every caller, but each caller reads
//! only the sessions `sessions::may_read` gives it: the operator all, a
//! caller inside a session (an agent, or a program it started) only its
//! own, anyone else none. Another session is `session-not-found`, as an
//! unknown one is, so an agent cannot even learn which sessions exist. The
//! ids are random, so this is what keeps one agent from reading another's
//! prompts and tool calls.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{NoParams, params, require_operator};
use crate::core::{sessions, transcript};
use crate::daemon::{Daemon, Req, router};
use crate::errors::{Code, RpcError};
use crate::limits;

use super::{Handled, connection, subscriber};
use crate::socket::views;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionRef {
    session_id: String,
}

/// Whether this module serves `method`.
pub fn serves(method: &str) -> bool {
    ["sessions.", "session.", "transcript."]
        .iter()
        .any(|p| method.starts_with(p))
}

pub fn dispatch(d: &mut Daemon, req: Req, method: &str, p: Map<String, Value>) {
    let result = match method {
        "sessions.get" => sessions_get(d, &req, p),
        "sessions.subscribe" => sessions_subscribe(d, &req, p),
        "sessions.unsubscribe" => params::<NoParams>(p).and_then(|_| {
            let conn = connection(&req)?;
            Ok(Some(
                json!({"was_subscribed": d.socket.watches.unwatch(conn)}),
            ))
        }),
        "sessions.spawn" => sessions_spawn(d, &req, p),
        "sessions.input" => sessions_input(d, &req, p),
        "sessions.interrupt" => with_session(d, &req, p, |d, sid| {
            router::sessions::interrupt(d, sid).map(|i| json!({"interrupted": i}))
        }),
        "sessions.kill" => with_session(d, &req, p, |d, sid| {
            router::sessions::kill(d, sid)
                .map(|k| json!({"ended": k == sessions::Killed::AlreadyEnded}))
        }),
        "session.rename" => session_rename(d, &req, p),
        "sessions.transcriptView" => transcript_view(d, &req, p),
        "sessions.toolDetail" => tool_detail(d, &req, p),
        "transcript.subscribe" => transcript_subscribe(d, &req, p),
        "transcript.unsubscribe" => transcript_unsubscribe(d, &req, p),
        other => Err(super::unknown_method(other)),
    };
    super::finish(d, req, result);
}

/// Every session `req`'s caller may read, in creation order; also the
/// first part of `sessions.list`, which src/socket/methods/tmux.rs answers.
pub(super) fn readable(d: &Daemon, req: &Req) -> Value {
    let node = &d.node_name;
    Value::Array(
        d.core
            .sessions
            .iter()
            .filter(|s| sessions::may_read(&req.class, &s.id))
            .map(|s| views::session(s, node))
            .collect(),
    )
}

/// Session `sid` when `req`'s caller may read it (module comment).
fn readable_session<'a>(
    d: &'a Daemon,
    req: &Req,
    sid: &str,
) -> Result<&'a sessions::Session, RpcError> {
    d.core
        .sessions
        .get(sid)
        .filter(|_| sessions::may_read(&req.class, sid))
        .ok_or_else(|| sessions::not_found(sid))
}

fn sessions_get(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let SessionRef { session_id } = params(p)?;
    readable_session(d, req, &session_id).map(|s| Some(views::session(s, &d.node_name)))
}

fn sessions_subscribe(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let NoParams {} = params(p)?;
    // Subscribed before the snapshot: an event may arrive twice (seed 004).
    d.socket.watches.watch(connection(req)?);
    Ok(Some(readable(d, req)))
}

fn sessions_spawn(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let sp: sessions::SpawnParams = params(p)?;
    require_operator(req)?;
    let req = req.clone();
    router::sessions::spawn(d, sp.into(), move |d, r| {
        let r = r.map(|s| {
            let v = d
                .core
                .sessions
                .get(&s.session_id)
                .map(|x| views::session(x, &d.node_name));
            // seed 004: "For a headless agent ... pane_id in the
            // sessions.spawn result is an empty string".
            json!({"session_id": s.session_id, "pane_id": "", "session": v})
        });
        d.answer(req, r)
    });
    Ok(None)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InputParams {
    session_id: String,
    text: String,
    /// Seed 004's InputParams members, taken and ignored: an api session
    /// always submits, and has no pane to prepare.
    #[serde(default, rename = "submit")]
    _submit: Option<bool>,
    #[serde(default, rename = "prepare")]
    _prepare: Option<bool>,
}

fn sessions_input(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let InputParams {
        session_id, text, ..
    } = params(p)?;
    require_operator(req)?;
    router::sessions::input(d, &session_id, text)
        .map(|a| Some(json!({"queued": a.queued, "queue_length": a.queue_length})))
}

fn with_session(
    d: &mut Daemon,
    req: &Req,
    p: Map<String, Value>,
    f: fn(&mut Daemon, &str) -> Result<Value, RpcError>,
) -> Handled {
    let SessionRef { session_id } = params(p)?;
    require_operator(req)?;
    f(d, &session_id).map(Some)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RenameParams {
    session_id: String,
    name: String,
}

fn session_rename(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let RenameParams { session_id, name } = params(p)?;
    require_operator(req)?;
    if d.tmux.state.owns_id(&session_id) {
        sessions::clean_name(&name)?;
        let id = session_id.clone();
        let then: router::tmux::Then = Box::new(move |d, req, s| {
            let e = match s {
                None => sessions::not_found(&session_id),
                Some(s) => rename_refused(&s.found.agent),
            };
            d.answer(req, Err(e))
        });
        router::tmux::when_seen(d, req.clone(), id, then);
        return Ok(None);
    }
    let req = req.clone();
    router::sessions::rename(d, &session_id, &name, move |d, r| {
        d.answer(req, r.map(|name| json!({"name": name, "applied": true})))
    })?;
    Ok(None)
}

/// Why a session in a tmux pane of `agent` is not renamed, in seed 004's
/// words: the daemon drives a pane by its keys, and has neither the Argus
/// plugin connection Claude Code renames through nor another agent's
/// rename feature (its API) for a pane.
fn rename_refused(agent: &str) -> RpcError {
    let m = match agent {
        "claude" => "rename needs the Argus plugin connection".to_string(),
        other => format!("rename unsupported for {other} sessions"),
    };
    RpcError::new(Code::InvalidRequest, m)
}

/// Runs `job` on the ledger reader and answers with what it returns.
fn read_then(
    d: &mut Daemon,
    req: &Req,
    job: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<Value> + Send + 'static,
    finish: impl FnOnce(&mut Daemon, Value) -> Result<Value, RpcError> + Send + 'static,
) -> Handled {
    let inbox = d.inbox.clone();
    let req = req.clone();
    d.ledger
        .read(Box::new(move |conn| {
            let r = job(conn);
            inbox.run(move |d| {
                let out = match r {
                    Ok(v) => finish(d, v),
                    Err(e) => {
                        crate::error!("ledger read failed: {}", e.to_string().to_lowercase());
                        Err(RpcError::new(
                            Code::LedgerCorrupt,
                            "the ledger could not be read",
                        ))
                    }
                };
                d.answer(req, out);
            });
        }))
        .map_err(RpcError::from)?;
    Ok(None)
}

/// The session's entries from `start`: the ledger's, with the running
/// turn's from memory (they may not be committed yet).
fn merge_cached(d: &Daemon, sid: &str, start: usize, mut rows: Vec<Value>) -> Vec<Value> {
    if let Some(s) = d.core.sessions.get(sid) {
        if let Some(cs) = s.transcript.cache_start() {
            if cs >= start && cs <= start + rows.len() {
                rows.truncate(cs - start);
                rows.extend(s.transcript.cached_from(cs).unwrap_or_default());
            }
        }
    }
    rows
}

fn page_start(d: &Daemon, sid: &str) -> Result<usize, RpcError> {
    let s = d
        .core
        .sessions
        .get(sid)
        .ok_or_else(|| sessions::not_found(sid))?;
    Ok(s.transcript.len.saturating_sub(limits::TRANSCRIPT_PAGE_MAX))
}

fn transcript_view(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let SessionRef { session_id } = params(p)?;
    readable_session(d, req, &session_id)?;
    let start = page_start(d, &session_id)?;
    let sid = session_id.clone();
    read_then(
        d,
        req,
        move |conn| {
            transcript::read_entries(conn, &sid, start, limits::TRANSCRIPT_PAGE_MAX)
                .map(Value::Array)
        },
        move |d, v| {
            let rows = match v {
                Value::Array(a) => a,
                _ => Vec::new(),
            };
            Ok(json!({"entries": merge_cached(d, &session_id, start, rows)}))
        },
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolDetailParams {
    session_id: String,
    tool_id: String,
    #[serde(default)]
    agent_id: Option<String>,
}

fn tool_detail(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let ToolDetailParams {
        session_id,
        tool_id,
        agent_id,
    } = params(p)?;
    if let Some(a) = agent_id {
        return Err(RpcError::new(
            Code::NotFound,
            format!("unknown subagent: {a}"),
        ));
    }
    readable_session(d, req, &session_id)?;
    let (sid, tid) = (session_id.clone(), tool_id.clone());
    read_then(
        d,
        req,
        move |conn| transcript::tool_detail(conn, &sid, &tid).map(|o| o.unwrap_or(Value::Null)),
        move |_d, v| {
            if v.is_null() {
                Err(RpcError::new(
                    Code::NotFound,
                    format!("session {session_id} has no tool call {tool_id}"),
                ))
            } else {
                Ok(v)
            }
        },
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscribeParams {
    sub_id: String,
    session_id: String,
    #[serde(default)]
    have_entries: usize,
    #[serde(default)]
    agent_id: Option<String>,
}

fn transcript_subscribe(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let SubscribeParams {
        sub_id,
        session_id,
        have_entries,
        agent_id,
    } = params(p)?;
    if sub_id.is_empty() {
        return Err(RpcError::invalid_params("sub_id required"));
    }
    if let Some(a) = agent_id {
        return Err(RpcError::new(
            Code::NotFound,
            format!("unknown subagent: {a}"),
        ));
    }
    let len = readable_session(d, req, &session_id)?.transcript.len;
    let have = have_entries.min(len);
    let sid = session_id.clone();
    let who = subscriber(req)?;
    read_then(
        d,
        req,
        move |conn| {
            let start = transcript::subscribe_start(conn, &sid, have)?;
            let start = start.max(len.saturating_sub(limits::TRANSCRIPT_PAGE_MAX));
            let rows = transcript::read_entries(conn, &sid, start, limits::TRANSCRIPT_PAGE_MAX)?;
            Ok(json!({"start": start, "rows": rows}))
        },
        move |d, v| {
            let start = v["start"].as_u64().unwrap_or(0) as usize;
            let rows = match v.get("rows") {
                Some(Value::Array(a)) => a.clone(),
                _ => Vec::new(),
            };
            d.core
                .sessions
                .get(&session_id)
                .ok_or_else(|| sessions::not_found(&session_id))?;
            let sessions = &d.core.sessions;
            d.socket
                .watches
                .subscribe_transcript(&who, &sub_id, &session_id, |s| sessions.get(s).is_some())?;
            Ok(
                json!({"sub_id": sub_id, "from_index": start, "entries": merge_cached(d, &session_id, start, rows)}),
            )
        },
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UnsubscribeParams {
    sub_id: String,
}

fn transcript_unsubscribe(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let UnsubscribeParams { sub_id } = params(p)?;
    d.socket
        .watches
        .unsubscribe_transcript(&subscriber(req)?, &sub_id);
    Ok(Some(Value::Null))
}
