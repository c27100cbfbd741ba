//! The daemon socket's methods for seats, sessions, transcripts and the
//! approvals inbox (issue 3; seed 004, Sessions, Transcripts; names
//! snake_case as DESIGN.md's table says). `socket::methods::dispatch`
//! hands every `seats.*`, `sessions.*`, `session.*`, `transcript.*` and
//! `approvals.*` call here.
//!
//! | method                  | who      | answers                                      |
//! |-------------------------|----------|----------------------------------------------|
//! | seats.list              | anyone   | {seats}                                      |
//! | seats.probe             | operator | null; seats detected (when on), probed again |
//! | sessions.list           | anyone†  | Session[] in creation order                  |
//! | sessions.get            | anyone†  | Session                                      |
//! | sessions.subscribe      | anyone†  | Session[]; then `session.event` notes        |
//! | sessions.unsubscribe    | anyone   | {was_subscribed}                             |
//! | sessions.spawn          | operator | {session_id, session} once session.start is committed |
//! | sessions.input          | operator | {queued, queue_length}                       |
//! | sessions.interrupt      | operator | {interrupted}                                |
//! | sessions.kill           | operator | {ended}                                      |
//! | session.rename          | operator | {name, applied}                              |
//! | sessions.transcriptView | anyone†  | {entries}                                    |
//! | sessions.toolDetail     | anyone†  | ToolDetail                                   |
//! | transcript.subscribe    | anyone†  | TranscriptDelta; then `transcript.delta`s    |
//! | transcript.unsubscribe  | anyone   | null                                         |
//! | approvals.list          | anyone*  | {approvals}                                  |
//! | approvals.get           | anyone*  | the approval                                 |
//! | approvals.answer        | operator | the resolved approval, once committed        |
//!
//! *a caller inside a session sees only its own session's approvals.
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

use crate::core::inbox::{Answerer, Verdict};
use crate::core::{approvals, sessions, transcript};
use crate::daemon::{Daemon, Req};
use crate::errors::{Code, RpcError};
use crate::limits;
use crate::socket::methods::{params, require_operator, write_error};

type Handled = Result<Option<Value>, RpcError>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionRef {
    session_id: String,
}

/// Whether this module serves `method`.
pub fn serves(method: &str) -> bool {
    [
        "seats.",
        "sessions.",
        "session.",
        "transcript.",
        "approvals.",
    ]
    .iter()
    .any(|p| method.starts_with(p))
}

pub fn dispatch(d: &mut Daemon, req: Req, method: &str, p: Map<String, Value>) {
    let result = match method {
        "seats.list" => seats_list(d, p),
        "seats.probe" => seats_probe(d, &req, p),
        "sessions.list" => sessions_list(d, &req, p),
        "sessions.get" => sessions_get(d, &req, p),
        "sessions.subscribe" => sessions_subscribe(d, &req, p),
        "sessions.unsubscribe" => params::<NoParams>(p)
            .map(|_| Some(json!({"was_subscribed": d.core.sessions.unwatch(req.conn)}))),
        "sessions.spawn" => sessions_spawn(d, &req, p),
        "sessions.input" => sessions_input(d, &req, p),
        "sessions.interrupt" => with_session(d, &req, p, |d, sid| {
            sessions::interrupt(d, sid).map(|i| json!({"interrupted": i}))
        }),
        "sessions.kill" => with_session(d, &req, p, |d, sid| {
            sessions::kill(d, sid).map(|k| json!({"ended": k == sessions::Killed::AlreadyEnded}))
        }),
        "session.rename" => session_rename(d, &req, p),
        "sessions.transcriptView" => transcript_view(d, &req, p),
        "sessions.toolDetail" => tool_detail(d, &req, p),
        "transcript.subscribe" => transcript_subscribe(d, &req, p),
        "transcript.unsubscribe" => transcript_unsubscribe(d, &req, p),
        "approvals.list" => approvals_list(d, &req, p),
        "approvals.get" => approvals_get(d, &req, p),
        "approvals.answer" => approvals_answer(d, &req, p),
        other => Err(RpcError::new(
            Code::MethodNotFound,
            format!("unknown method {other}"),
        )),
    };
    match result {
        Ok(Some(v)) => d.answer(req, Ok(v)),
        Ok(None) => {}
        Err(e) => d.answer(req, Err(e)),
    }
}

fn seats_list(d: &mut Daemon, p: Map<String, Value>) -> Handled {
    let NoParams {} = params(p)?;
    let seats: Vec<Value> = d.core.seats.list.iter().map(|s| s.to_socket()).collect();
    Ok(Some(json!({
        "seats": seats,
        "agent_isolation": crate::core::sessions::sandbox(d).to_json(),
    })))
}

fn seats_probe(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let NoParams {} = params(p)?;
    require_operator(req)?;
    crate::core::seats::probe_all(d);
    Ok(Some(Value::Null))
}

/// Every session `req`'s caller may read, in creation order.
fn readable(d: &Daemon, req: &Req) -> Value {
    let node = &d.node_name;
    Value::Array(
        d.core
            .sessions
            .iter()
            .filter(|s| sessions::may_read(&req.class, &s.id))
            .map(|s| s.to_socket(node))
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

fn sessions_list(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let NoParams {} = params(p)?;
    Ok(Some(readable(d, req)))
}

fn sessions_get(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let SessionRef { session_id } = params(p)?;
    readable_session(d, req, &session_id).map(|s| Some(s.to_socket(&d.node_name)))
}

fn sessions_subscribe(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let NoParams {} = params(p)?;
    // Subscribed before the snapshot: an event may arrive twice (seed 004).
    d.core.sessions.watch(req.conn);
    Ok(Some(readable(d, req)))
}

fn sessions_spawn(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let sp: sessions::SpawnParams = params(p)?;
    require_operator(req)?;
    let req = req.clone();
    sessions::spawn(d, sp.into(), move |d, r| {
        let r = r.map(|s| {
            let v = d
                .core
                .sessions
                .get(&s.session_id)
                .map(|x| x.to_socket(&d.node_name));
            json!({"session_id": s.session_id, "session": v})
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
    sessions::input(d, &session_id, text)
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
    let name = sessions::clean_name(&name)?;
    let s = d
        .core
        .sessions
        .get_mut(&session_id)
        .ok_or_else(|| sessions::not_found(&session_id))?;
    s.name = Some(name.clone());
    let fx = sessions::Effects {
        changed: true,
        ..Default::default()
    };
    let req = req.clone();
    sessions::finish(
        d,
        &session_id,
        fx,
        false,
        Some(Box::new(
            move |d: &mut Daemon, r: Result<(), crate::ledger::WriteError>| {
                let out = r
                    .map(|()| json!({"name": name, "applied": true}))
                    .map_err(crate::socket::methods::write_error);
                d.answer(req, out)
            },
        )),
    );
    Ok(None)
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
        .map_err(write_error)?;
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
    let conn_token = req.conn;
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
            d.core
                .sessions
                .subscribe_transcript(conn_token, &sub_id, &session_id)?;
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
    d.core.sessions.unsubscribe_transcript(req.conn, &sub_id);
    Ok(Some(Value::Null))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalsListParams {
    #[serde(default)]
    all: bool,
}

/// Whether `req`'s caller may see `item`: the operator sees every item; a
/// caller inside a session only its own session's, so that no session
/// learns what another asks for; anyone else none.
fn may_see(req: &Req, item: &crate::core::inbox::Item) -> bool {
    match &req.class {
        crate::procs::CallerClass::Operator => true,
        crate::procs::CallerClass::AgentSession(Some(s)) => {
            item.subject.session() == Some(s.as_str())
        }
        _ => false,
    }
}

fn approvals_list(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let ApprovalsListParams { all } = params(p)?;
    let items: Vec<Value> = d
        .core
        .approvals
        .list(all)
        .into_iter()
        .filter(|i| may_see(req, i))
        .map(approvals::to_socket)
        .collect();
    Ok(Some(json!({"approvals": items})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalRef {
    request_id: String,
}

fn approvals_get(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let ApprovalRef { request_id } = params(p)?;
    let not_found = |id: &str| RpcError::new(Code::NotFound, format!("no approval {id}"));
    if let Some(i) = d.core.approvals.get(&request_id) {
        return match may_see(req, i) {
            true => Ok(Some(approvals::to_socket(i))),
            false => Err(not_found(&request_id)),
        };
    }
    // Older than the history the inbox keeps in memory: the ledger has
    // every approval of every run (issue 10, item 11).
    let inbox = d.inbox.clone();
    let req = req.clone();
    let queued = d.ledger.read(Box::new(move |conn| {
        let found = approvals::read_one(conn, &request_id);
        inbox.run(move |d| {
            let r = match found {
                Ok(Some(item)) if may_see(&req, &item) => Ok(approvals::to_socket(&item)),
                Ok(_) => Err(not_found(&request_id)),
                Err(e) => {
                    crate::error!("approval {request_id} could not be read: {e}");
                    Err(RpcError::new(
                        Code::Unavailable,
                        format!("the ledger could not read approval {request_id}"),
                    ))
                }
            };
            d.answer(req, r);
        });
    }));
    queued.map(|()| None).map_err(write_error)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerParams {
    request_id: String,
    decision: String,
    #[serde(default)]
    reason: Option<String>,
    /// The digest the operator saw; refused if the request is for another
    /// action.
    #[serde(default)]
    digest: Option<String>,
}

fn approvals_answer(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let AnswerParams {
        request_id,
        decision,
        reason,
        digest,
    } = params(p)?;
    let verdict = match decision.as_str() {
        "allow" => Verdict::Allow,
        "deny" => Verdict::Deny,
        other => {
            return Err(RpcError::invalid_params(format!(
                "decision must be allow or deny, found {other:?}"
            )));
        }
    };
    let pid = d.socket.conns.get(&req.conn).map_or(0, |c| c.peer_pid);
    if let Err(e) = require_operator(req) {
        crate::warn!(
            "refused approvals.answer for {request_id} from a caller of class {} (pid {pid})",
            req.class.name()
        );
        return Err(e);
    }
    if reason
        .as_ref()
        .is_some_and(|r| r.len() > 4096 || r.chars().any(|c| c.is_control() && c != '\n'))
    {
        return Err(RpcError::invalid_params(
            "reason must be at most 4096 bytes without control characters",
        ));
    }
    let req = req.clone();
    approvals::answer(
        d,
        &request_id,
        verdict,
        Answerer::Operator { pid },
        "socket",
        reason,
        digest.as_deref(),
        false,
        move |d, r| d.answer(req, r),
    );
    Ok(None)
}
