//! The route table and its handlers (issue 6, phase 1).
//!
//! | path              | method | who      | answers                                        |
//! |-------------------|--------|----------|------------------------------------------------|
//! | /server           | GET    | token    | instance, protocol, state, capabilities, build |
//! | /server/shutdown  | POST   | operator | 202, then the daemon drains and stops          |
//! | /storage          | GET    | operator | database figures, events per stream (paged)    |
//! | /events           | GET    | token    | a page of one stream, or (SSE) a watch of it   |
//!
//! Phase 2's routes are listed where their handlers live: sessions,
//! inputs and history in [`super::sessions`], approvals, seats and
//! plugins in [`super::inbox`].
//!
//! Adding a route (phase 2): write a handler `fn(&mut Ctx) -> Result<Reply,
//! Problem>`, and add a [`Route`] to [`ROUTES`] with its path template
//! (`/sessions/{session_id}`), and per method the query parameters it
//! accepts and whether it is operator-only. The pipeline in [`super`] has
//! already checked Host, Origin, token, method, query names and caller
//! class; the handler reads its body with [`Ctx::json`], reaches the
//! daemon's state with [`Ctx::reactor`], and answers a representation
//! (ETag and If-None-Match handled) or a stream. The OpenAPI document in
//! `vendor-schemas/openapi.yaml` gets the same operation, and tests/http.rs
//! validates real replies against it.

use serde::Deserialize;
use serde_json::{Value, json};
use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use super::inbox as ib;
use super::pages;
use super::problem::{Code, Problem};
use super::sessions as ss;
use super::sse::{self, Start, Subscription};
use super::{Answer, Ctx, Reply, Serialised};
use crate::daemon::Daemon;
use crate::ledger::{self, Appended, WriteError};
use crate::limits;

/// The daemon's HTTP protocol version; attachment checks it.
pub const PROTOCOL: u64 = 1;

pub type Handler = fn(&mut Ctx) -> Result<Reply, Problem>;

/// The changes that evaluate `If-Match` (seed 002: "PATCH and conditional
/// DELETE require the observed If-Match"); GETs evaluate it against the
/// representation they would answer. Any other change carrying it is 400
/// rather than silently unconditional: a client that sends a precondition
/// must never believe it held when nothing checked it. Actions (answer,
/// cancel, interrupt, plugin state changes) have their own conflict
/// answers (409 `not_pending`, `action_mismatch`, a stale `run_id`).
pub const IF_MATCH: &[(&str, &str)] = &[("/sessions/{session_id}", "DELETE")];

/// The operations that choose between JSON and an SSE stream by `Accept`
/// themselves ([`negotiate`]). Every other operation answers only JSON,
/// so the pipeline answers 406 `not_acceptable` before running it when
/// `Accept` admits no `application/json` (seed 002: "406 Unsupported
/// response media type"). A problem is still sent as
/// application/problem+json whatever `Accept` says (RFC 9110, 12.5.1
/// lets a server disregard Accept for an error).
pub const NEGOTIATES: &[(&str, &str)] = &[
    ("/events", "GET"),
    ("/sessions", "GET"),
    ("/sessions/{session_id}", "GET"),
];

/// An operation's answer made where its request was read, on the poller,
/// without waiting for anything; `None` when it needs a handler thread
/// (src/http/listener.rs, "Reads answered at once").
pub type AtOnce = fn(&mut Ctx) -> Option<Result<Serialised, Problem>>;

/// The operations that can answer at once, and how: reads of committed
/// state that a current snapshot answers (src/http/snapshots.rs). What
/// such a function answers is what the operation's handler would.
pub const AT_ONCE: &[(&str, &str, AtOnce)] =
    &[("/sessions/{session_id}", "GET", ss::get_session_at_once)];

/// The at-once form of `method` on `route`, if it has one.
pub fn at_once(route: &str, method: &str) -> Option<AtOnce> {
    AT_ONCE
        .iter()
        .find(|(p, m, _)| *p == route && *m == method)
        .map(|(_, _, f)| *f)
}

/// One method of a route.
pub struct Op {
    pub method: &'static str,
    /// The query parameters it accepts; any other is 400.
    pub query: &'static [&'static str],
    /// Refused to agents and plugins even with the token.
    pub operator_only: bool,
    pub handler: Handler,
}

pub struct Route {
    pub path: &'static str,
    pub ops: &'static [Op],
}

impl Route {
    /// The `Allow` header value.
    pub fn allow(&self) -> String {
        let mut m: Vec<&str> = self.ops.iter().map(|o| o.method).collect();
        m.push("OPTIONS");
        m.join(", ")
    }
}

pub const ROUTES: &[Route] = &[
    Route {
        path: "/server",
        ops: &[Op {
            method: "GET",
            query: &[],
            operator_only: false,
            handler: get_server,
        }],
    },
    Route {
        path: "/server/shutdown",
        ops: &[Op {
            method: "POST",
            query: &[],
            operator_only: true,
            handler: post_shutdown,
        }],
    },
    Route {
        path: "/storage",
        ops: &[Op {
            method: "GET",
            query: &["limit", "next", "sessions_next"],
            operator_only: true,
            handler: get_storage,
        }],
    },
    Route {
        path: "/events",
        ops: &[Op {
            method: "GET",
            query: &["stream", "after_seq", "limit", "next", "after_generation"],
            operator_only: false,
            handler: get_events,
        }],
    },
    Route {
        path: "/sessions",
        ops: &[Op {
            method: "GET",
            query: &[
                "state", "harness", "worktree", "parent", "search", "limit", "next",
            ],
            operator_only: false,
            handler: ss::get_sessions,
        }],
    },
    Route {
        path: "/sessions/{session_id}",
        ops: &[
            Op {
                method: "GET",
                query: &["tail", "after_generation", "after_seq"],
                operator_only: false,
                handler: ss::get_session,
            },
            Op {
                method: "PUT",
                query: &[],
                operator_only: true,
                handler: ss::put_session,
            },
            Op {
                method: "DELETE",
                query: &[],
                operator_only: true,
                handler: ss::delete_session,
            },
        ],
    },
    Route {
        path: "/sessions/{session_id}/inputs/{input_id}",
        ops: &[
            Op {
                method: "GET",
                query: &[],
                operator_only: false,
                handler: ss::get_input,
            },
            Op {
                method: "PUT",
                query: &[],
                operator_only: true,
                handler: ss::put_input,
            },
        ],
    },
    Route {
        path: "/sessions/{session_id}/inputs/{input_id}/cancel",
        ops: &[Op {
            method: "POST",
            query: &[],
            operator_only: true,
            handler: ss::cancel_input,
        }],
    },
    Route {
        path: "/sessions/{session_id}/interrupt",
        ops: &[Op {
            method: "POST",
            query: &[],
            operator_only: true,
            handler: ss::post_interrupt,
        }],
    },
    Route {
        path: "/sessions/{session_id}/history",
        ops: &[Op {
            method: "GET",
            query: &["before", "after", "limit"],
            operator_only: false,
            handler: ss::get_history,
        }],
    },
    Route {
        path: "/approvals",
        ops: &[Op {
            method: "GET",
            query: &["state", "limit", "next"],
            operator_only: false,
            handler: ib::get_approvals,
        }],
    },
    Route {
        path: "/approvals/{approval_id}",
        ops: &[Op {
            method: "GET",
            query: &[],
            operator_only: false,
            handler: ib::get_approval,
        }],
    },
    Route {
        path: "/approvals/{approval_id}/answer",
        ops: &[Op {
            method: "POST",
            query: &[],
            operator_only: true,
            handler: ib::post_answer,
        }],
    },
    Route {
        path: "/seats",
        ops: &[Op {
            method: "GET",
            query: &[],
            operator_only: false,
            handler: ib::get_seats,
        }],
    },
    Route {
        path: "/plugins",
        ops: &[Op {
            method: "GET",
            query: &[],
            operator_only: false,
            handler: ib::get_plugins,
        }],
    },
    Route {
        path: "/plugins/{plugin_id}",
        ops: &[
            Op {
                method: "GET",
                query: &[],
                operator_only: false,
                handler: ib::get_plugin,
            },
            Op {
                method: "DELETE",
                query: &["stop_tasks"],
                operator_only: true,
                handler: ib::delete_plugin,
            },
        ],
    },
    Route {
        path: "/plugins/{plugin_id}/approve",
        ops: &[Op {
            method: "POST",
            query: &[],
            operator_only: true,
            handler: ib::post_plugin_approve,
        }],
    },
    Route {
        path: "/plugins/{plugin_id}/discard",
        ops: &[Op {
            method: "POST",
            query: &[],
            operator_only: true,
            handler: ib::post_plugin_discard,
        }],
    },
    Route {
        path: "/plugins/{plugin_id}/enable",
        ops: &[Op {
            method: "POST",
            query: &[],
            operator_only: true,
            handler: ib::post_plugin_enable,
        }],
    },
    Route {
        path: "/plugins/{plugin_id}/disable",
        ops: &[Op {
            method: "POST",
            query: &[],
            operator_only: false,
            handler: ib::post_plugin_disable,
        }],
    },
    Route {
        path: "/plugins/{plugin_id}/commands",
        ops: &[Op {
            method: "GET",
            query: &[],
            operator_only: false,
            handler: ib::get_plugin_commands,
        }],
    },
    Route {
        path: "/plugins/{plugin_id}/commands/{command_id}/run",
        ops: &[Op {
            method: "POST",
            query: &[],
            operator_only: true,
            handler: ib::post_plugin_command_run,
        }],
    },
    Route {
        path: "/plugin-requests/{request_id}",
        ops: &[Op {
            method: "GET",
            query: &[],
            operator_only: false,
            handler: ib::get_plugin_request,
        }],
    },
];

/// Path parameters by the names in the route template.
pub type PathParams = Vec<(&'static str, String)>;

/// Matches a request path against the table: the route and its path
/// parameters (percent-decoded), or 404.
pub fn find(path: &str) -> Result<(&'static Route, PathParams), Problem> {
    let segs: Vec<&str> = path.split('/').skip(1).collect();
    'routes: for r in ROUTES {
        let tmpl: Vec<&'static str> = r.path.split('/').skip(1).collect();
        if tmpl.len() != segs.len() {
            continue;
        }
        let mut params = Vec::new();
        for (t, s) in tmpl.iter().zip(&segs) {
            if let Some(name) = t.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
                let v = super::wire::percent_decode(s, false)?;
                if v.is_empty() {
                    continue 'routes;
                }
                params.push((name, v));
            } else if t != s {
                continue 'routes;
            }
        }
        // The path matched; an id past the OpenAPI's maxLength is a bad
        // request, not an unknown resource.
        if let Some((name, _)) = params
            .iter()
            .find(|(_, v)| v.chars().count() > limits::HTTP_PATH_ID_MAX)
        {
            return Err(Problem::invalid(format!(
                "{name} is longer than {} characters",
                limits::HTTP_PATH_ID_MAX
            )));
        }
        return Ok((r, params));
    }
    Err(Problem::new(Code::NotFound, "no such resource"))
}

/// Picks the representation `Accept` admits best among `offers` (the first
/// offer on a tie or without Accept); 406 when none.
pub fn negotiate(accept: Option<&str>, offers: &[&'static str]) -> Result<&'static str, Problem> {
    let Some(accept) = accept else {
        return Ok(offers[0]);
    };
    let mut best: Option<(f32, usize)> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default().to_ascii_lowercase();
        let q = parts
            .find_map(|p| p.strip_prefix("q="))
            .and_then(|q| q.parse::<f32>().ok())
            .unwrap_or(1.0);
        if q <= 0.0 {
            continue;
        }
        for (i, offer) in offers.iter().enumerate() {
            let (ty, _) = offer.split_once('/').unwrap_or((offer, ""));
            let hit = media == *offer || media == "*/*" || media == format!("{ty}/*");
            if hit && best.is_none_or(|(bq, bi)| q > bq || (q == bq && i < bi)) {
                best = Some((q, i));
            }
        }
    }
    best.map(|(_, i)| offers[i]).ok_or_else(|| {
        Problem::new(
            Code::NotAcceptable,
            format!("this resource is served as {}", offers.join(" or ")),
        )
    })
}

/// Maps a ledger refusal to a problem.
pub(crate) fn ledger_problem(e: WriteError) -> Problem {
    match e {
        WriteError::Corrupt => Problem::new(
            Code::LedgerCorrupt,
            "the ledger cannot be trusted and is read-only",
        ),
        WriteError::Busy => {
            Problem::new(Code::LedgerBusy, "the ledger is busy; try again").retry(1)
        }
        WriteError::Failed(why) => {
            crate::error!("ledger access failed: {why}");
            Problem::new(Code::Unavailable, "the ledger could not be reached")
        }
    }
}

pub(crate) fn read_failed(e: &rusqlite::Error) -> Problem {
    crate::error!("ledger read failed: {}", e.to_string().to_lowercase());
    Problem::new(Code::Unavailable, "the ledger could not be read")
}

/// A whole number from 0 to 2^53 - 1 (seed 002, "Counters and sequence
/// numbers are integers from zero through 2^53 - 1").
pub(crate) fn counter(name: &str, raw: &str) -> Result<u64, Problem> {
    match raw.parse::<u64>() {
        Ok(n) if n < (1 << 53) && raw.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(Problem::invalid(format!(
            "{name} must be a whole number from 0 to 2^53-1"
        ))),
    }
}

// ---- /server ----

fn get_server(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let body = ctx.reactor(|d, answer: Answer<Value>| answer.send(server_json(d)))?;
    Ok(Reply::representation(body))
}

/// The capabilities `GET /server` advertises (seed 002, "Capabilities are
/// a map from stable feature names to integer contract versions"). The
/// seed's names are listed for what this daemon implements of them:
/// `durable_inputs` (inputs admitted once by client UUIDv7, decisions
/// kept seven days), `collection_invalidation` (the `GET /sessions`
/// watch: ready, reset, invalidate, activity, overflow) and
/// `session_replay` at the version 2 the seed requires (generation and
/// cursor replay of 256 events or 992 KiB, reset snapshots captured with
/// the cursor). `tool_progress` is not advertised: tool entries are sent
/// whole each time they change, without the seed's coalesced previews.
/// `events`, `events_watch` and `storage_report` are this daemon's own.
const CAPABILITIES: [(&str, u32); 6] = [
    ("durable_inputs", 1),
    ("collection_invalidation", 1),
    ("session_replay", 2),
    ("events", 1),
    ("events_watch", 1),
    ("storage_report", 1),
];

fn server_json(d: &Daemon) -> Value {
    let capabilities: serde_json::Map<String, Value> = CAPABILITIES
        .iter()
        .map(|(k, v)| (k.to_string(), Value::from(*v)))
        .collect();
    json!({
        "instance_id": d.instance_id,
        "protocol": PROTOCOL,
        "state": if d.is_stopping() { "draining" } else { "ready" },
        "capabilities": capabilities,
        "build": {"version": env!("CARGO_PKG_VERSION")},
        "started_at": crate::clock::format_ts(d.started_at_ms),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShutdownBody {
    instance_id: String,
    timeout_ms: Option<u64>,
}

fn post_shutdown(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let body: ShutdownBody = ctx.json()?;
    let timeout = body
        .timeout_ms
        .unwrap_or(limits::HTTP_SHUTDOWN_TIMEOUT_DEFAULT_MS);
    if !(1..=limits::HTTP_SHUTDOWN_TIMEOUT_MAX_MS).contains(&timeout) {
        return Err(Problem::invalid(format!(
            "timeout_ms must be 1 to {}",
            limits::HTTP_SHUTDOWN_TIMEOUT_MAX_MS
        )));
    }
    let id = body.instance_id;
    let result = ctx.reactor(move |d, answer: Answer<Result<Value, Problem>>| {
        if id != d.instance_id {
            answer.send(Err(Problem::new(
                Code::InstanceChanged,
                "the daemon is another instance than the one named; read /server again",
            )));
            return;
        }
        // The answer is handed over before the stop begins, and the stop
        // waits for in-flight HTTP answers before the process exits.
        answer.send(Ok(
            json!({"instance_id": d.instance_id, "state": "draining"}),
        ));
        d.begin_stop_within("POST /server/shutdown", Duration::from_millis(timeout));
    })?;
    Ok(Reply::json(202, result?))
}

// ---- /storage ----

fn get_storage(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let limit = pages::limit(ctx.param("limit"))?;
    let after = match ctx.param("next") {
        Some(t) => Some(pages::resume(ctx.route, &ctx.query, t)?),
        None => None,
    };
    let after_session = match ctx.param("sessions_next") {
        Some(t) => Some(pages::resume("/storage#sessions", &ctx.query, t)?),
        None => None,
    };
    let query = ctx.query.clone();
    let route = ctx.route;
    let result = ctx.reactor(move |d, answer: Answer<Result<Value, Problem>>| {
        let main = std::fs::metadata(&d.paths.ledger)
            .map(|m| m.len())
            .unwrap_or(0);
        let side = |ext: &str| {
            let mut p = d.paths.ledger.clone().into_os_string();
            p.push(ext);
            std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
        };
        let wal = side("-wal") + side("-shm");
        let fallback = answer.clone();
        let queued = d.ledger.read(Box::new(move |conn| {
            let figures = ledger::page_figures(conn);
            let streams = ledger::stream_counts(conn, after.as_deref().unwrap_or(""), limit + 1);
            let sessions =
                session_estimates(conn, after_session.as_deref().unwrap_or(""), limit + 1);
            let v = match (figures, streams, sessions) {
                (Ok((page_size, pages_total, free)), Ok(mut rows), Ok(mut srows)) => {
                    let smore = srows.len() > limit;
                    srows.truncate(limit);
                    let (sitems, sall) = pages::fit(srows);
                    let snext = match sitems.last() {
                        Some(last) if smore || !sall => json!(pages::token(
                            "/storage#sessions",
                            &query,
                            last["id"].as_str().unwrap_or("")
                        )),
                        _ => Value::Null,
                    };
                    let more = rows.len() > limit;
                    rows.truncate(limit);
                    let items = rows.iter().map(|(s, n)| json!({"stream": s, "events": n}));
                    let (items, all) = pages::fit(items);
                    let next = match items.last() {
                        Some(last) if more || !all => json!(pages::token(
                            route,
                            &query,
                            last["stream"].as_str().unwrap_or("")
                        )),
                        _ => Value::Null,
                    };
                    Ok(json!({
                        "database": {
                            "main_file_bytes": main,
                            "wal_bytes": wal,
                            "page_size_bytes": page_size,
                            "page_count": pages_total,
                            "free_page_count": free,
                            "used_bytes": (pages_total - free) * page_size,
                        },
                        "streams": {"items": items, "next": next},
                        "sessions": {"items": sitems, "next": snext},
                        "measured_at": crate::clock::now_ts(),
                    }))
                }
                (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => Err(read_failed(&e)),
            };
            answer.send(v);
        }));
        if let Err(e) = queued {
            fallback.send(Err(ledger_problem(e)));
        }
    });
    Ok(Reply::representation(result??))
}

/// Per-session estimates (seed 002, "Storage accounting": "Session items
/// include ID, title, workspace, creation and activity timestamps, and
/// estimated content bytes"), after session id `after`, by id: events in
/// the session's stream, transcript entries and their text bytes.
fn session_estimates(
    conn: &rusqlite::Connection,
    after: &str,
    limit: usize,
) -> rusqlite::Result<Vec<Value>> {
    let mut st = conn.prepare_cached(
        "SELECT s.id, s.name, s.cwd, s.created_at, s.last_activity, \
         coalesce((SELECT last_seq FROM streams WHERE stream = s.id), 0), \
         (SELECT count(*) FROM transcript t WHERE t.session = s.id), \
         (SELECT coalesce(sum(length(coalesce(text, '')) + length(coalesce(tool_input, '')) + length(coalesce(tool_result, ''))), 0) FROM transcript t WHERE t.session = s.id) \
         FROM sessions s WHERE s.id > ?1 ORDER BY s.id LIMIT ?2",
    )?;
    let rows = st.query_map(rusqlite::params![after, limit as i64], |r| {
        Ok(json!({
            "id": r.get::<_, String>(0)?,
            "title": r.get::<_, Option<String>>(1)?,
            "workspace": r.get::<_, String>(2)?,
            "created_at": r.get::<_, String>(3)?,
            "activity_at": r.get::<_, Option<String>>(4)?,
            "events": r.get::<_, i64>(5)?.max(0),
            "transcript_entries": r.get::<_, i64>(6)?.max(0),
            "estimated_content_bytes": r.get::<_, i64>(7)?.max(0),
        }))
    })?;
    rows.collect()
}

// ---- /events ----

/// One ledger event as the API shows it: the daemon socket's shape
/// (`events.list`), with `data` left out (null, `data_omitted: true`) when
/// it is larger than `HTTP_EVENT_INLINE_MAX`, so that any page or frame
/// stays within its bound.
pub fn event_item_text(stream: &str, seq: i64, kind: &str, ts: &str, data: &str) -> String {
    let mut s = String::with_capacity(data.len() + stream.len() + kind.len() + 96);
    s.push_str("{\"stream\":");
    s.push_str(&Value::from(stream).to_string());
    s.push_str(&format!(",\"seq\":{seq},\"kind\":"));
    s.push_str(&Value::from(kind).to_string());
    s.push_str(",\"ts\":");
    s.push_str(&Value::from(ts).to_string());
    if data.len() > limits::HTTP_EVENT_INLINE_MAX {
        s.push_str(",\"data\":null,\"data_omitted\":true}");
    } else {
        s.push_str(",\"data\":");
        s.push_str(data);
        s.push('}');
    }
    s
}

/// A committed event as an SSE watch event `{type, sequence, data}`.
pub fn event_sse_json(ev: &Appended) -> String {
    format!(
        "{{\"type\":\"event\",\"sequence\":{},\"data\":{}}}",
        ev.seq,
        event_item_text(&ev.stream, ev.seq, &ev.kind, &ev.ts, &ev.data)
    )
}

fn stream_name(ctx: &Ctx) -> Result<String, Problem> {
    let s = ctx
        .param("stream")
        .ok_or_else(|| Problem::invalid("stream is required"))?;
    if s.is_empty() || s.len() > 128 || s.chars().any(char::is_control) {
        return Err(Problem::invalid(
            "stream must be 1 to 128 characters without control characters",
        ));
    }
    Ok(s.to_string())
}

/// Whether the caller may read `stream`, as on the daemon socket: the
/// operator every stream, a caller inside a session its own only, anyone
/// else none (403 operator_only).
fn may_read_stream(ctx: &Ctx, stream: &str) -> Result<(), Problem> {
    match ctx.caller()? {
        crate::procs::CallerClass::Operator => Ok(()),
        crate::procs::CallerClass::AgentSession(Some(own)) if own == stream => Ok(()),
        other => Err(Problem::new(
            Code::OperatorOnly,
            format!(
                "a caller of class {} reads only its own session's events",
                other.name()
            ),
        )),
    }
}

fn get_events(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let stream = stream_name(ctx)?;
    may_read_stream(ctx, &stream)?;
    if negotiate(
        ctx.head.header("accept"),
        &["application/json", "text/event-stream"],
    )? == "text/event-stream"
    {
        return watch_events(ctx, stream);
    }
    if ctx.param("after_generation").is_some() {
        return Err(Problem::invalid(
            "after_generation belongs to a watch (Accept: text/event-stream)",
        ));
    }
    let limit = pages::limit(ctx.param("limit"))?;
    let after = match (ctx.param("next"), ctx.param("after_seq")) {
        (Some(t), _) => counter("next", &pages::resume(ctx.route, &ctx.query, t)?)?,
        (None, Some(a)) => counter("after_seq", a)?,
        (None, None) => 0,
    };
    let rows = ctx.reactor(
        move |d, answer: Answer<Result<Vec<ledger::StoredEvent>, Problem>>| {
            let fallback = answer.clone();
            let queued = crate::socket::methods::read_events(
                d,
                stream,
                after as i64,
                limit + 1,
                move |_, rows| {
                    answer.send(rows.map_err(|e| read_failed(&e)));
                },
            );
            if let Err(e) = queued {
                fallback.send(Err(ledger_problem(e)));
            }
        },
    )??;
    let more = rows.len() > limit;
    let items = rows.iter().take(limit).map(|r| {
        serde_json::from_str::<Value>(&event_item_text(&r.stream, r.seq, &r.kind, &r.ts, &r.data))
            .unwrap_or(Value::Null)
    });
    let (items, all) = pages::fit(items);
    let next = match items.last() {
        Some(last) if more || !all => json!(pages::token(
            ctx.route,
            &ctx.query,
            &last["seq"].to_string()
        )),
        _ => Value::Null,
    };
    Ok(Reply::Json {
        status: 200,
        body: json!({"items": items, "next": next}),
        etag: true,
        headers: vec![("Vary", "Accept".into())],
    })
}

fn watch_events(ctx: &mut Ctx, stream: String) -> Result<Reply, Problem> {
    if ctx.param("limit").is_some() || ctx.param("next").is_some() {
        return Err(Problem::invalid(
            "limit and next belong to JSON pages, not to a watch",
        ));
    }
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
    let (sub, start) =
        ctx.reactor(move |d, answer| subscribe_events(d, stream, after, answer))??;
    let name = ctx.param("stream").unwrap_or_default().to_string();
    Ok(Reply::Stream(Box::new(move |w: &mut TcpStream| {
        let mut snapshot = || {
            let at = sub.high_water();
            Ok((at, json!({"stream": name, "high_water": at}).to_string()))
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

type Attached = Result<(Subscription, Start), Problem>;

/// Subscribes to a ledger stream's topic, creating the topic at the
/// stream's committed high water when it is the first watch.
fn subscribe_events(
    d: &mut Daemon,
    stream: String,
    after: Option<(String, u64)>,
    answer: Answer<Attached>,
) {
    if d.is_stopping() {
        answer.send(Err(Problem::new(
            Code::ShuttingDown,
            "the daemon is stopping",
        )));
        return;
    }
    let Some(http) = d.http.as_mut() else {
        answer.send(Err(Problem::new(
            Code::Unavailable,
            "the HTTP API is not running",
        )));
        return;
    };
    if let Some(topic) = http.event_topics.get_mut(&stream) {
        answer.send(attach(topic, &after));
        return;
    }
    let inbox = d.inbox.clone();
    let fallback = answer.clone();
    let queued = d.ledger.read(Box::new(move |conn| {
        let last = ledger::stream_last_seq(conn, &stream);
        inbox.run(move |d| {
            let generation = d.instance_id.clone();
            let r = match (last, d.http.as_mut()) {
                (Err(e), _) => Err(read_failed(&e)),
                (Ok(_), None) => Err(Problem::new(
                    Code::Unavailable,
                    "the HTTP API is not running",
                )),
                (Ok(high), Some(http)) => topic_for(http, &stream, generation, high.max(0) as u64)
                    .and_then(|t| attach(t, &after)),
            };
            answer.send(r);
        });
    }));
    if let Err(e) = queued {
        fallback.send(Err(ledger_problem(e)));
    }
}

fn topic_for<'a>(
    http: &'a mut super::Http,
    stream: &str,
    generation: String,
    high: u64,
) -> Result<&'a mut sse::Topic, Problem> {
    if !http.event_topics.contains_key(stream) {
        if http.event_topics.len() >= limits::SSE_EVENT_TOPICS {
            let idle = http
                .event_topics
                .iter_mut()
                .filter_map(|(k, t)| (t.watchers() == 0).then(|| k.clone()))
                .next();
            match idle {
                Some(k) => {
                    http.event_topics.remove(&k);
                }
                None => {
                    return Err(Problem::new(
                        Code::TooManyStreams,
                        "every watchable stream slot is in use",
                    )
                    .retry(1));
                }
            }
        }
        http.event_topics
            .insert(stream.to_string(), sse::Topic::new(generation, high));
    }
    http.event_topics
        .get_mut(stream)
        .ok_or_else(|| Problem::new(Code::Unavailable, "the watch could not be set up"))
}

fn attach(topic: &mut sse::Topic, after: &Option<(String, u64)>) -> Attached {
    let sub = topic.subscribe().map_err(|_| {
        Problem::new(
            Code::TooManyStreams,
            "this stream has the maximum number of watchers",
        )
        .retry(1)
    })?;
    let start = sub.plan(after.as_ref().map(|(g, s)| (g.as_str(), *s)));
    Ok((sub, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_templates_and_refuse_the_rest() {
        assert_eq!(find("/server").unwrap().0.path, "/server");
        assert_eq!(find("/server/shutdown").unwrap().0.path, "/server/shutdown");
        for missing in ["/", "/server/", "/servers", "/server/shutdown/x", ""] {
            assert_eq!(
                find(missing).err().map(|p| p.status()),
                Some(404),
                "{missing}"
            );
        }
        assert_eq!(find("/events").unwrap().0.allow(), "GET, OPTIONS");
    }

    #[test]
    fn negotiation_prefers_quality_then_order() {
        let offers = ["application/json", "text/event-stream"];
        assert_eq!(negotiate(None, &offers).unwrap(), "application/json");
        assert_eq!(
            negotiate(Some("text/event-stream"), &offers).unwrap(),
            "text/event-stream"
        );
        assert_eq!(negotiate(Some("*/*"), &offers).unwrap(), "application/json");
        assert_eq!(
            negotiate(Some("application/json;q=0.5, text/*"), &offers).unwrap(),
            "text/event-stream"
        );
        assert_eq!(
            negotiate(Some("text/html"), &offers).unwrap_err().status(),
            406
        );
        assert_eq!(
            negotiate(Some("application/json;q=0"), &offers[..1])
                .unwrap_err()
                .status(),
            406
        );
    }

    #[test]
    fn large_event_data_is_left_out() {
        let small = event_item_text("x-a", 3, "note", "t", "{\"n\":1}");
        assert_eq!(
            serde_json::from_str::<Value>(&small).unwrap()["data"]["n"],
            1
        );
        let big = format!(
            "{{\"s\":\"{}\"}}",
            "x".repeat(limits::HTTP_EVENT_INLINE_MAX)
        );
        let v: Value = serde_json::from_str(&event_item_text("x-a", 3, "note", "t", &big)).unwrap();
        assert_eq!(
            (v["data"].clone(), v["data_omitted"].clone()),
            (Value::Null, json!(true))
        );
    }
}
