//! The method table of the daemon socket: each method's params are decoded
//! strictly (unknown members refused with `invalid-params`), its caller class
//! checked, and its answer given now or after a ledger commit or read. The
//! exchanges are documented, one per method, in omniconfluxd(8).
//!
//! | method            | who            | answers                                  |
//! |-------------------|----------------|------------------------------------------|
//! | ping              | anyone         | null, before any other rule (seed 004)   |
//! | server.info       | anyone         | version, started_at, instance_id, caller |
//! | server.stop       | operator       | null, then the daemon stops              |
//! | events.list       | anyone         | a page of one stream after a seq         |
//! | events.append     | operator       | the committed event's seq and ts         |
//! | events.subscribe  | anyone         | live `event` notifications from now on   |
//! | events.unsubscribe| anyone         | stops them                               |
//! | seats.*           | see [`seats`]                              |
//! | sessions.*, session.*, transcript.* | see [`sessions`]         |
//! | sessions.list, .refresh, pane methods | see [`tmux`]           |
//! | host.*            | see [`host`]                               |
//! | terminal.*        | see [`terminal`]                           |
//! | approvals.*       | see [`approvals`]                          |
//! | sessions.respond  | see [`respond`]                            |
//! | repos.*, task.dispatch, verify.list, lanes.* | see [`lanes`]   |
//! | plugin.*          | see [`plugins`]                            |
//! | lock.*            | operator, unix socket only; see [`lock`]   |
//! | clients.*         | see [`gateway`]                            |
//!
//! A remote client (a relay channel of the uplink, issue 13) is held to
//! [`remote_gate`] before the table: it reads and controls sessions (live
//! terminals on sessions included); what only the operator may do
//! (persistent terminals, the host methods, `host.setWakelock` among them)
//! it may do on the channels `[uplink] remote_operator` names (by default
//! only end-to-end encrypted ones).

pub mod approvals;
pub mod gateway;
pub mod host;
pub mod lanes;
pub mod lock;
pub mod plugins;
pub mod respond;
pub mod seats;
pub mod sessions;
pub mod terminal;
pub mod tmux;

use mio::Token;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::daemon::{Daemon, Req};
use crate::errors::{Code, RpcError};
use crate::ledger::{self, Op, WriteError};
use crate::limits;

/// Decodes params into `T`, refusing unknown members and wrong types with
/// serde's own description of what was expected.
pub fn params<T: DeserializeOwned>(p: Map<String, Value>) -> Result<T, RpcError> {
    serde_json::from_value(Value::Object(p)).map_err(|e| {
        let msg = e.to_string();
        // serde_json appends " at line L column C" for values, which means
        // nothing for params that came from one line.
        let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
        RpcError::invalid_params(msg)
    })
}

/// Refuses a caller that is not the operator.
pub fn require_operator(req: &Req) -> Result<(), RpcError> {
    if req.class.is_operator() {
        Ok(())
    } else {
        Err(RpcError::new(
            Code::OperatorOnly,
            format!(
                "only the operator may call this; the caller is {}",
                req.class.name()
            ),
        ))
    }
}

/// The socket connection a subscription is kept against. Another surface
/// that runs these methods (HTTP runs `plugin.*` only) has none to keep
/// one on, and is refused.
pub fn connection(req: &Req) -> Result<Token, RpcError> {
    req.conn().ok_or_else(|| {
        RpcError::new(
            Code::InvalidRequest,
            "subscriptions are kept on a daemon socket connection only",
        )
    })
}

/// Who keeps a transcript subscription: the socket connection or the
/// relay channel `req` came on (issue 13: a channel is served like a
/// connection). HTTP has neither, and is refused.
pub fn subscriber(req: &Req) -> Result<crate::socket::watches::Subscriber, RpcError> {
    use crate::socket::watches::Subscriber;
    match &req.to {
        crate::daemon::ReplyTo::Relay { link, chan, .. } => Ok(Subscriber::Chan {
            link: *link,
            chan: chan.clone(),
        }),
        _ => connection(req).map(Subscriber::Conn),
    }
}

/// Whether `req`'s caller may read `stream`: the operator reads every
/// stream; a caller inside an agent session reads its own session's stream
/// only (it would otherwise see other sessions' events, prompts included);
/// plugins read events through their own wire, behind their permission.
fn may_read_stream(req: &Req, stream: &str) -> Result<(), RpcError> {
    match &req.class {
        crate::procs::CallerClass::Operator => Ok(()),
        crate::procs::CallerClass::AgentSession(Some(own)) if own == stream => Ok(()),
        other => Err(RpcError::new(
            Code::OperatorOnly,
            format!(
                "a caller of class {} reads only its own session's events",
                other.name()
            ),
        )),
    }
}

/// What a remote client may call on any channel: `server.info` and the
/// reads and control of sessions and their approvals (issue 13: "Plaintext
/// channels get read access and session control"). Transcript
/// subscriptions are kept on the channel; `sessions.subscribe` is here so
/// that it is refused for the reason that holds (a channel gets its
/// `session.event`s without asking), not as operator-only.
const REMOTE_CLIENT_METHODS: &[&str] = &[
    "ping",
    "server.info",
    "events.list",
    "seats.list",
    "sessions.list",
    "sessions.get",
    "sessions.subscribe",
    "sessions.unsubscribe",
    "sessions.refresh",
    "sessions.spawn",
    "sessions.resume",
    "sessions.input",
    "sessions.key",
    "sessions.capture",
    "sessions.focus",
    "sessions.interrupt",
    "sessions.kill",
    "session.rename",
    "sessions.transcriptView",
    "sessions.toolDetail",
    "sessions.tasks",
    "host.info",
    "host.completeDir",
    "transcript.subscribe",
    "transcript.unsubscribe",
    "approvals.list",
    "approvals.get",
    // Live terminals on sessions (issue 15) are session control: a
    // terminal.open of a session, and input, resize and close of the
    // channel's own terminals. A terminal.open of a persistent terminal,
    // a shell on the node, is the operator's ([`remote_gate`]).
    "terminal.open",
    "terminal.input",
    "terminal.resize",
    "terminal.close",
];

/// The namespaces of the methods this table serves: a refused call outside
/// them is an unknown method (-32601), not an operator-only one.
const SERVED_NAMESPACES: &[&str] = &[
    "approvals",
    "clients",
    "events",
    "host",
    "lanes",
    "lock",
    "plugin",
    "repos",
    "seats",
    "server",
    "session",
    "sessions",
    "task",
    "terminal",
    "transcript",
    "verify",
];

/// Holds a remote client to what it may call (module comment). A call it
/// may make runs as the operator's, since the gateway checked the
/// client's token; `ping` and `server.info` keep the class, so that
/// `server.info` says who is calling.
#[allow(clippy::result_large_err)]
pub fn remote_gate(
    d: &Daemon,
    req: Req,
    method: &str,
    p: &Map<String, Value>,
) -> Result<Req, (Req, RpcError)> {
    let crate::procs::CallerClass::RemoteClient { e2ee } = req.class else {
        return Ok(req);
    };
    if method == "ping" || method == "server.info" {
        return Ok(req);
    }
    // A shell on the node is the operator's: a persistent terminal, and a
    // spawn of a `command` (where a spawn of an `agent` runs one of the
    // agents the node knows).
    let shell = (method == "terminal.open" && p.contains_key("terminal_id"))
        || (method == "sessions.spawn" && p.contains_key("command"));
    if (REMOTE_CLIENT_METHODS.contains(&method) && !shell) || d.cfg.uplink.operator_on(e2ee) {
        return Ok(Req {
            class: crate::procs::CallerClass::Operator,
            ..req
        });
    }
    if !SERVED_NAMESPACES
        .iter()
        .any(|n| method.split_once('.').is_some_and(|(ns, _)| ns == *n))
    {
        // What no one may call is not the operator's either.
        let e = RpcError::new(Code::MethodNotFound, format!("unknown method {method}"));
        return Err((req, e));
    }
    let channel = if e2ee {
        "an end-to-end encrypted"
    } else {
        "a plaintext"
    };
    let e = RpcError::new(
        Code::OperatorOnly,
        format!(
            "only the operator may call {method}; a remote client on {channel} channel reads and controls sessions only ([uplink] remote_operator is {})",
            d.cfg.uplink.remote_operator().name()
        ),
    );
    Err((req, e))
}

pub fn dispatch(d: &mut Daemon, req: Req, method: &str, p: Map<String, Value>) {
    let req = match remote_gate(d, req, method, &p) {
        Ok(r) => r,
        Err((req, e)) => return d.answer(req, Err(e)),
    };
    let result = match method {
        "ping" => params::<NoParams>(p).map(|NoParams {}| Some(Value::Null)),
        "server.info" => server_info(d, &req, p),
        "server.stop" => server_stop(d, &req, p),
        "events.list" => events_list(d, &req, p),
        "events.append" => events_append(d, &req, p),
        "events.subscribe" => events_subscribe(d, &req, p),
        "events.unsubscribe" => events_unsubscribe(d, &req, p),
        m if m.starts_with("plugin.") => {
            plugins::dispatch(d, req, m, p);
            return;
        }
        m if lanes::serves(m) => {
            return lanes::dispatch(d, req, m, p);
        }
        m if m.starts_with("seats.") => return seats::dispatch(d, req, m, p),
        m if m.starts_with("approvals.") => return approvals::dispatch(d, req, m, p),
        m if m.starts_with("lock.") => return lock::dispatch(d, req, m, p),
        m if m.starts_with("clients.") => return gateway::dispatch(d, req, m, p),
        m if tmux::serves(d, m, &p) => return tmux::dispatch(d, req, m, p),
        m if m.starts_with("host.") => return host::dispatch(d, req, m, p),
        m if m.starts_with("terminal.") => return terminal::dispatch(d, req, m, p),
        "sessions.subscribe" => {
            let conn = req.conn();
            sessions::dispatch(d, req, method, p);
            if let Some(conn) = conn {
                crate::daemon::router::tmux::watched(d, conn);
            }
            return;
        }
        "sessions.respond" => return respond::dispatch(d, req, p),
        m if sessions::serves(m) => return sessions::dispatch(d, req, m, p),
        other => Err(RpcError::new(
            Code::MethodNotFound,
            format!("unknown method {other}"),
        )),
    };
    finish(d, req, result);
}

/// A handler's outcome: `Some` answers now, `None` means a continuation
/// answers later.
pub type Handled = Result<Option<Value>, RpcError>;

/// Answers what a handler decided now; `None` is answered later by its
/// continuation.
pub(super) fn finish(d: &mut Daemon, req: Req, result: Handled) {
    match result {
        Ok(Some(v)) => d.answer(req, Ok(v)),
        Ok(None) => {}
        Err(e) => d.answer(req, Err(e)),
    }
}

/// The params of a method that takes none: any member is refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// The error of a method no table serves.
pub fn unknown_method(method: &str) -> RpcError {
    RpcError::new(Code::MethodNotFound, format!("unknown method {method}"))
}

fn server_info(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let NoParams {} = params(p)?;
    let mut caller = json!({"class": req.class.name()});
    match &req.class {
        crate::procs::CallerClass::AgentSession(Some(s)) => caller["session"] = json!(s),
        crate::procs::CallerClass::Plugin(Some(p)) => caller["plugin"] = json!(p),
        _ => {}
    }
    let mut info = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "started_at": crate::clock::format_ts(d.started_at_ms),
        "instance_id": d.instance_id,
        "uptime_ms": d.started.elapsed().as_millis() as u64,
        "nodes": [crate::uplink::identify(d)],
        "uplink": crate::uplink::status(d),
        "pushPortConfigured": false,
        "caller": caller,
        "ledger": {
            "path": d.paths.ledger.display().to_string(),
            "schema": ledger::current_version(),
            "state": if d.ledger.corrupt.is_some() { "read-only" } else { "ok" },
        },
        "counts": {
            "connections": d.socket.conns.len(),
            "sessions": d.core.sessions.len(),
            "sessions_live": d.core.sessions.iter().filter(|s| !s.ended).count(),
            "approvals_pending": d.core.approvals.pending_count(),
            "plugins": d.plugins.plugins.len(),
            "plugins_running": d.plugins.plugins.values().filter(|p| p.run.is_some()).count(),
            "lanes": d.lanes.listed().len(),
            "seats": d.core.seats.list.len(),
        },
        "stopping": d.is_stopping(),
        // Where the HTTP API listens (the port chosen for `--http IP:0`).
        "http": d.http.as_ref().map(|h| json!({"address": h.addr.to_string()})),
        // Where the in-node gateway listens (the port chosen for
        // `--gateway IP:0`); null when the node runs no gateway.
        "gateway": d.gateway.as_ref().map(|g| json!({"address": g.addr().to_string()})),
        "agent_isolation": d.core.sessions.sandbox(d.cfg.agents.isolation()).to_json(),
    });
    if let Some(reason) = &d.ledger.corrupt {
        info["ledger"]["reason"] = json!(reason.0);
    }
    // Event counts come from the reader thread; the rest is known here.
    let inbox = d.inbox.clone();
    let req = req.clone();
    let queued = d.ledger.read(Box::new(move |conn| {
        let counts = ledger::counts(conn);
        inbox.run(move |d| {
            let mut info = info;
            match counts {
                Ok((streams, events)) => {
                    info["counts"]["streams"] = json!(streams);
                    info["counts"]["events"] = json!(events);
                }
                Err(_) => info["counts"]["events"] = Value::Null,
            }
            d.answer(req, Ok(info));
        });
    }));
    match queued {
        Ok(()) => Ok(None),
        Err(e) => Err(RpcError::from(e)),
    }
}

fn server_stop(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let NoParams {} = params(p)?;
    require_operator(req)?;
    // The reply is queued before the stop begins, and a stop flushes queued
    // replies before it exits: "replies first, then stops" (seed 004).
    d.answer(req.clone(), Ok(Value::Null));
    d.begin_stop("server.stop");
    Ok(None)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    stream: String,
    #[serde(default)]
    after_seq: i64,
    limit: Option<usize>,
}

fn events_list(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let ListParams {
        stream,
        after_seq,
        limit,
    } = params(p)?;
    may_read_stream(req, &stream)?;
    let limit = limit.unwrap_or(limits::EVENTS_PAGE_DEFAULT);
    if !(1..=limits::EVENTS_PAGE_MAX).contains(&limit) {
        return Err(RpcError::invalid_params(format!(
            "limit must be 1 to {}",
            limits::EVENTS_PAGE_MAX
        )));
    }
    if after_seq < 0 {
        return Err(RpcError::invalid_params("after_seq must be at least 0"));
    }
    let req = req.clone();
    // One more row than asked tells whether another page follows.
    read_events(d, stream, after_seq, limit + 1, move |d, page| {
        let result = match page {
            Ok(mut rows) => {
                let more = rows.len() > limit;
                rows.truncate(limit);
                let next = if more { rows.last().map(|r| json!(r.seq)) } else { None };
                let events: Vec<Value> = rows
                    .into_iter()
                    .map(|r| {
                        let data = serde_json::from_str::<Value>(&r.data).unwrap_or(Value::Null);
                        json!({"stream": r.stream, "seq": r.seq, "kind": r.kind, "ts": r.ts, "data": data})
                    })
                    .collect();
                Ok(json!({"events": events, "next_after_seq": next.unwrap_or(Value::Null)}))
            }
            Err(e) => {
                crate::error!("ledger read failed: {}", e.to_string().to_lowercase());
                Err(RpcError::new(Code::LedgerCorrupt, "the ledger could not be read"))
            }
        };
        d.answer(req, result);
    })
    .map_err(RpcError::from)?;
    Ok(None)
}

/// Reads up to `limit` events of `stream` after `after_seq` on the ledger
/// reader thread; `then` gets them on the reactor. The one read behind the
/// socket's `events.list` and HTTP's `GET /events`.
pub fn read_events(
    d: &mut Daemon,
    stream: String,
    after_seq: i64,
    limit: usize,
    then: impl FnOnce(&mut Daemon, rusqlite::Result<Vec<ledger::StoredEvent>>) + Send + 'static,
) -> Result<(), WriteError> {
    let inbox = d.inbox.clone();
    d.ledger.read(Box::new(move |conn| {
        let page = ledger::list_events(conn, &stream, after_seq, limit);
        inbox.run(move |d| then(d, page));
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendParams {
    stream: String,
    kind: String,
    #[serde(default)]
    data: Option<Map<String, Value>>,
}

/// Streams operators and scripts may write to: their own, named `x-...`,
/// apart from the streams the daemon writes.
fn valid_user_stream(s: &str) -> bool {
    s.len() <= 128
        && s.strip_prefix("x-").is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

fn valid_kind(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-' || b == b'_'
        })
}

fn events_append(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let AppendParams { stream, kind, data } = params(p)?;
    require_operator(req)?;
    if !valid_user_stream(&stream) {
        return Err(RpcError::invalid_params(
            "stream must be x- followed by 1 to 126 letters, digits, '-' or '_'",
        ));
    }
    if !valid_kind(&kind) {
        return Err(RpcError::invalid_params(
            "kind must be 1 to 64 lowercase letters, digits, '.', '-' or '_'",
        ));
    }
    let data = serde_json::to_string(&Value::Object(data.unwrap_or_default()))
        .unwrap_or_else(|_| "{}".into());
    if data.len() > limits::EVENT_MAX_DATA_BYTES {
        return Err(RpcError::invalid_params(format!(
            "data must serialise to at most {} bytes",
            limits::EVENT_MAX_DATA_BYTES
        )));
    }
    let ts = crate::clock::now_ts();
    let req = req.clone();
    d.write(
        vec![Op::Event {
            stream,
            kind,
            ts,
            data,
        }],
        move |d, r| {
            let result = r
                .map_err(RpcError::from)
                .map(|appended| match appended.first() {
                    Some(a) => json!({"stream": a.stream, "seq": a.seq, "ts": a.ts}),
                    None => Value::Null,
                });
            d.answer(req, result);
        },
    );
    Ok(None)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscribeParams {
    streams: Option<Vec<String>>,
}

fn events_subscribe(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let SubscribeParams { streams } = params(p)?;
    match &streams {
        Some(list) => list.iter().try_for_each(|s| may_read_stream(req, s))?,
        None => require_operator(req)?,
    }
    if let Some(s) = &streams {
        if s.is_empty() || s.len() > limits::EVENTS_SUBSCRIBE_MAX_STREAMS {
            return Err(RpcError::invalid_params(format!(
                "streams must name 1 to {} streams",
                limits::EVENTS_SUBSCRIBE_MAX_STREAMS
            )));
        }
    }
    let conn = connection(req)?;
    let filter = streams.clone().map(|v| v.into_iter().collect());
    // One subscription per connection; a second call replaces the first,
    // as events.subscribe does for plugins (seed 000).
    d.socket.watches.subscribe_events(conn, filter);
    Ok(Some(json!({"streams": streams})))
}

fn events_unsubscribe(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let NoParams {} = params(p)?;
    let was = d.socket.watches.unsubscribe_events(connection(req)?);
    Ok(Some(json!({"subscribed": false, "was_subscribed": was})))
}
