//! The daemon socket's methods for sessions in tmux panes (issue 15; seed
//! 004, Features › Sessions and its method table) and the socket's view of
//! them. [`super::dispatch`] hands a call here when [`serves`] says so:
//! the list, the refresh and the pane methods always, `sessions.input`
//! and `sessions.kill` when their `session_id` is a tmux session's
//! (`<server>:%<n>`), and `sessions.spawn` when it names an `agent`, a
//! `command`, or the `harness` of a seat with `transport = "tmux"` (the
//! seed's SpawnParams; any other `harness` is a seat's session,
//! src/socket/methods/sessions.rs).
//!
//! A tmux seat (issue 15: "a seat whose transport = "tmux" does the same
//! for agents with no API") starts its `command` and `args`, with its
//! `env` added, in a pane of the daemon's own server, in a tmux session
//! named after the harness unless `name` says otherwise; it is then a
//! spawned tmux session like any other. Decided where the issue is
//! silent: such a seat takes no `model` or `prompt` (a program with no
//! API has no known flag for either: type the prompt with
//! `sessions.input`), and the seat registry leaves it out
//! (src/core/seats.rs), so that neither `seats.list`, the lanes nor the
//! session core ever try to drive it over ACP or stream-json.
//!
//! | method           | who      | answers                                         |
//! |------------------|----------|-------------------------------------------------|
//! | sessions.list    | anyone†  | the daemon's sessions, then the tmux sessions   |
//! | sessions.refresh | anyone†  | the same, after a rescan of the tmux servers    |
//! | sessions.capture | operator | {screen}                                        |
//! | sessions.key     | operator | null; `keys` sent to the pane in order          |
//! | sessions.focus   | operator | null; the pane becomes its window's active one  |
//! | sessions.input   | operator | null; the text typed into the pane              |
//! | sessions.kill    | operator | null; the pane killed                           |
//! | sessions.spawn   | operator | {session_id, pane_id}                           |
//! | sessions.resume  | operator | {session_id, pane_id}: `claude --resume ID`     |
//! | sessions.transcriptView, .toolDetail, .tasks, transcript.subscribe | operator | from the Claude Code transcript file (src/tmux/transcript.rs) |
//!
//! The transcript methods and `transcript.unsubscribe` come here for every
//! session: a tmux session's are read from its transcript file; any
//! other's go on to src/socket/methods/sessions.rs (the ledger), and
//! `sessions.tasks` of a session of the daemon's own is `{tasks: []}`, since
//! the agents it drives report no task list the daemon keeps. A
//! subscription replaces one of either kind with the same `sub_id` on the
//! connection or relay channel (a channel keeps its subscriptions as a
//! connection does, issue 13); `transcript.unsubscribe` ends the tmux one
//! if there is one, and otherwise goes on to the ledger's.
//!
//! †This is the one place where the two lists meet: `sessions.list` and
//! `sessions.refresh` answer the daemon's own sessions (those its caller
//! may read, src/socket/methods/sessions.rs) followed by the tmux
//! sessions, which only the operator reads: a pane may be anything the
//! operator runs.
//!
//! `sessions.focus` also takes a composite id with this node's prefix,
//! `<node_id>:<session id>` (seed 004, Composite ids: "A node accepts a
//! composite id with its own prefix in sessions.focus"); the node id is
//! `daemon.node_name`, and the prefix is taken off only when what follows
//! is a session id, so `default:%3` on a node named `default` stays as it
//! is.
//!
//! A pane method on a session of the daemon (which has no pane) fails with
//! `no-terminal-control` ("session has no terminal control"); on an id no
//! one knows, with `session-not-found` ("unknown session: <id>"), as seed
//! 004 words them.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{Handled, NoParams, params, require_operator};
use crate::daemon::router::tmux as route;
use crate::daemon::{Daemon, Req};
use crate::errors::{Code, RpcError};
use crate::limits;
use crate::tmux::{self, Answer, Error, Op, Session};

/// Whether this module serves `method` with params `p` (module comment).
pub fn serves(d: &Daemon, method: &str, p: &Map<String, Value>) -> bool {
    match method {
        "sessions.list" | "sessions.refresh" | "sessions.capture" | "sessions.key"
        | "sessions.focus" => true,
        "sessions.input" | "sessions.kill" => p
            .get("session_id")
            .and_then(Value::as_str)
            .is_some_and(|id| d.tmux.state.owns_id(id)),
        "sessions.spawn" => {
            p.contains_key("agent")
                || p.contains_key("command")
                || p.get("harness")
                    .and_then(Value::as_str)
                    .is_some_and(|h| tmux_seat(d, h).is_some())
        }
        "sessions.resume" => true,
        // A Claude Code transcript file of a tmux session; the rest go on
        // to src/socket/methods/sessions.rs from here (module comment).
        "sessions.transcriptView"
        | "sessions.toolDetail"
        | "sessions.tasks"
        | "transcript.subscribe"
        | "transcript.unsubscribe" => true,
        _ => false,
    }
}

pub fn dispatch(d: &mut Daemon, req: Req, method: &str, p: Map<String, Value>) {
    let result = match method {
        "sessions.list" => no_params(p).map(|()| route::list(d, req.clone(), false)),
        "sessions.refresh" => no_params(p).map(|()| route::list(d, req.clone(), true)),
        "sessions.capture" => {
            pane_call(d, &req, p, |p: SessionRef| Ok((p.session_id, Op::Capture)))
        }
        "sessions.focus" => {
            let mut p = p;
            if let Some(Value::String(id)) = p.get_mut("session_id") {
                if let Some(rest) = local_id(d, id) {
                    *id = rest;
                }
            }
            pane_call(d, &req, p, |p: SessionRef| Ok((p.session_id, Op::Focus)))
        }
        "sessions.kill" => pane_call(d, &req, p, |p: SessionRef| Ok((p.session_id, Op::Kill))),
        "sessions.key" => pane_call(d, &req, p, |p: KeyParams| {
            check_keys(&p.keys)?;
            Ok((p.session_id, Op::Keys(p.keys)))
        }),
        "sessions.input" => pane_call(d, &req, p, |p: InputParams| {
            if p.text.len() > limits::PROMPT_MAX_BYTES {
                return Err(RpcError::invalid_params(format!(
                    "text must be at most {} bytes",
                    limits::PROMPT_MAX_BYTES
                )));
            }
            Ok((
                p.session_id,
                Op::Input {
                    text: p.text,
                    submit: p.submit,
                    prepare: p.prepare,
                },
            ))
        }),
        "sessions.spawn" => spawn(d, &req, p),
        "sessions.resume" => resume(d, &req, p),
        "sessions.transcriptView"
        | "sessions.toolDetail"
        | "sessions.tasks"
        | "transcript.subscribe"
        | "transcript.unsubscribe" => {
            return transcript(d, req, method, p);
        }
        other => Err(super::unknown_method(other)),
    };
    super::finish(d, req, result);
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolDetailParams {
    session_id: String,
    tool_id: String,
    #[serde(default)]
    agent_id: Option<String>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UnsubscribeParams {
    #[serde(rename = "sub_id")]
    _sub_id: String,
}

/// The transcript methods: a tmux session's are read from its Claude Code
/// transcript file (src/tmux/transcript.rs); every other session's go on
/// to src/socket/methods/sessions.rs, which reads the ledger. A
/// subscription replaces one of the other kind with the same `sub_id`.
/// `sessions.tasks` of a session of the daemon's own is an empty list:
/// the agents it drives report no task list it keeps.
fn transcript(d: &mut Daemon, req: Req, method: &str, p: Map<String, Value>) {
    let id = p
        .get("session_id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let ours = d.tmux.state.owns_id(&id);
    let result = match method {
        "transcript.unsubscribe" => {
            let sub_id = p.get("sub_id").and_then(Value::as_str).map(str::to_string);
            let removed = match (sub_id, super::subscriber(&req)) {
                (Some(s), Ok(who)) => route::transcript_unsubscribe(d, &who, &s),
                _ => false,
            };
            if !removed {
                return super::sessions::dispatch(d, req, method, p);
            }
            params::<UnsubscribeParams>(p).map(|_| Some(Value::Null))
        }
        "transcript.subscribe" => {
            let sub_id = p.get("sub_id").and_then(Value::as_str);
            if let (Some(s), Ok(who)) = (sub_id, super::subscriber(&req)) {
                route::transcript_unsubscribe(d, &who, s);
                if ours {
                    d.socket.watches.unsubscribe_transcript(&who, s);
                }
            }
            if !ours {
                return super::sessions::dispatch(d, req, method, p);
            }
            subscribe(d, &req, p)
        }
        "sessions.tasks" if !ours => params::<SessionRef>(p).and_then(|r| {
            if d.core.sessions.get(&r.session_id).is_some()
                && crate::core::sessions::may_read(&req.class, &r.session_id)
            {
                Ok(Some(json!({"tasks": []})))
            } else {
                Err(error(&Error::UnknownSession(r.session_id)))
            }
        }),
        _ if !ours => return super::sessions::dispatch(d, req, method, p),
        "sessions.transcriptView" => params::<SessionRef>(p).and_then(|r| {
            require_operator(&req)?;
            route::transcript_request(d, req.clone(), r.session_id, None, route::Want::View);
            Ok(None)
        }),
        "sessions.tasks" => params::<SessionRef>(p).and_then(|r| {
            require_operator(&req)?;
            route::transcript_request(d, req.clone(), r.session_id, None, route::Want::Tasks);
            Ok(None)
        }),
        _ => params::<ToolDetailParams>(p).and_then(|t| {
            require_operator(&req)?;
            let agent = subagent(t.agent_id)?;
            route::transcript_request(
                d,
                req.clone(),
                t.session_id,
                agent,
                route::Want::Tool(t.tool_id),
            );
            Ok(None)
        }),
    };
    super::finish(d, req, result);
}

/// An `agent_id` as Claude Code names subagents (letters, digits, `-` and
/// `_`, at most 64): anything else names no file of it, and is no
/// subagent.
fn subagent(agent_id: Option<String>) -> Result<Option<String>, RpcError> {
    match agent_id {
        Some(a)
            if a.is_empty()
                || a.len() > 64
                || !a
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') =>
        {
            Err(RpcError::new(
                Code::NotFound,
                format!("unknown subagent: {a}"),
            ))
        }
        other => Ok(other),
    }
}

fn subscribe(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let s: SubscribeParams = params(p)?;
    if s.sub_id.is_empty() {
        return Err(RpcError::invalid_params("sub_id required"));
    }
    require_operator(req)?;
    let agent = subagent(s.agent_id)?;
    let who = super::subscriber(req)?;
    route::transcript_request(
        d,
        req.clone(),
        s.session_id,
        agent,
        route::Want::Subscribe {
            who,
            sub_id: s.sub_id,
            have: s.have_entries,
        },
    );
    Ok(None)
}

fn no_params(p: Map<String, Value>) -> Result<(), RpcError> {
    params::<NoParams>(p).map(|NoParams {}| ())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionRef {
    session_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyParams {
    session_id: String,
    keys: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InputParams {
    session_id: String,
    text: String,
    #[serde(default)]
    submit: bool,
    #[serde(default)]
    prepare: bool,
}

/// The session id in `id` when it is a composite id with this node's
/// prefix (module comment).
fn local_id(d: &Daemon, id: &str) -> Option<String> {
    let rest = id.strip_prefix(d.node_name.as_str())?.strip_prefix(':')?;
    (d.tmux.state.owns_id(rest) || d.core.sessions.get(rest).is_some()).then(|| rest.to_string())
}

/// Decodes a pane method's params, checks the caller and the session, and
/// hands the call to the tmux subsystem.
fn pane_call<T: serde::de::DeserializeOwned>(
    d: &mut Daemon,
    req: &Req,
    p: Map<String, Value>,
    op: impl FnOnce(T) -> Result<(String, Op), RpcError>,
) -> Handled {
    let (id, op) = op(params(p)?)?;
    require_operator(req)?;
    if !d.tmux.state.owns_id(&id) {
        // A session of the daemon's own has no pane.
        return Err(if d.core.sessions.get(&id).is_some() {
            error(&Error::NoTerminalControl)
        } else {
            error(&Error::UnknownSession(id))
        });
    }
    route::pane(d, req.clone(), id, op);
    Ok(None)
}

/// `sessions.key`'s keys: 1 to `TMUX_KEYS_MAX` names of printable
/// characters without spaces, each at most `TMUX_KEY_NAME_MAX` bytes.
fn check_keys(keys: &[String]) -> Result<(), RpcError> {
    let bad = keys.is_empty()
        || keys.len() > limits::TMUX_KEYS_MAX
        || keys.iter().any(|k| {
            k.is_empty()
                || k.len() > limits::TMUX_KEY_NAME_MAX
                || k.chars().any(|c| c.is_control() || c.is_whitespace())
        });
    if bad {
        return Err(RpcError::invalid_params(format!(
            "keys must be 1 to {} key names of at most {} bytes without spaces or control characters",
            limits::TMUX_KEYS_MAX,
            limits::TMUX_KEY_NAME_MAX
        )));
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpawnParams {
    #[serde(default)]
    node_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    command: Option<String>,
    /// A seat with `transport = "tmux"` ([`serves`] routes only those
    /// here).
    #[serde(default)]
    harness: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    model: Option<String>,
}

/// The agents `sessions.spawn` starts in a pane, by name: their own
/// interactive programs, found on the daemon's PATH. A `command` runs
/// with `$SHELL -c` (`/bin/sh` when SHELL is unset or relative), as the
/// operator's own tmux would run it.
const SPAWNABLE: &[&str] = tmux::discover::AGENTS;

fn spawn(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let sp: SpawnParams = params(p)?;
    require_operator(req)?;
    let _ = sp.node_id; // routing only (seed 004)
    let invalid = |m: String| RpcError::new(Code::InvalidRequest, m);
    let cwd = enterable(d, sp.cwd.as_deref().unwrap_or("~"))?;
    let (argv, default_name) = match (&sp.command, &sp.agent) {
        (None, None) if sp.harness.is_some() => {
            let h = sp.harness.as_deref().unwrap_or_default();
            let seat = tmux_seat(d, h).ok_or_else(|| invalid(format!("unknown seat: {h}")))?;
            if sp.model.is_some() || sp.prompt.is_some() {
                return Err(invalid(format!(
                    "seat {h} runs in tmux: it takes no model or prompt"
                )));
            }
            (seat_argv(seat)?, seat.harness.clone())
        }
        (Some(c), _) => {
            if sp.model.is_some() {
                return Err(invalid("model is not taken with a command".into()));
            }
            if c.trim().is_empty() {
                return Err(invalid("command must not be empty".into()));
            }
            let shell = std::env::var("SHELL")
                .ok()
                .filter(|s| s.starts_with('/'))
                .unwrap_or_else(|| "/bin/sh".into());
            (vec![shell, "-c".into(), c.clone()], "shell".to_string())
        }
        (None, Some(a)) => {
            let Some(agent) = SPAWNABLE.iter().find(|x| **x == a.as_str()) else {
                return Err(invalid(format!("unknown agent: {a}")));
            };
            let Some(program) = crate::isolation::which(agent) else {
                return Err(invalid(format!(
                    "agent {agent} is not installed: no {agent} on PATH"
                )));
            };
            let mut argv = agent_argv(agent, sp.model.as_deref(), sp.prompt.as_deref());
            argv[0] = program.display().to_string();
            (argv, agent.to_string())
        }
        (None, None) => return Err(invalid("set agent or command".into())),
    };
    if sp.command.is_some() && sp.prompt.is_some() {
        return Err(invalid("prompt is not taken with a command".into()));
    }
    let name = sp
        .name
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty());
    let name = name.unwrap_or(default_name);
    if name.len() > 64 || name.chars().any(|c| c == ':' || c == '.' || c.is_control()) {
        return Err(RpcError::invalid_params(
            "name must be at most 64 bytes without ':', '.' or control characters",
        ));
    }
    route::spawn(d, req.clone(), name, cwd.display().to_string(), argv);
    Ok(None)
}

/// `cwd` with a leading `~` resolved against the home directory, when it
/// is an absolute directory that can be entered (seed 004: "reject
/// (-32600) a cwd that is relative, does not exist, is not a directory, or
/// cannot be entered").
pub(super) fn enterable(d: &Daemon, cwd: &str) -> Result<std::path::PathBuf, RpcError> {
    let invalid = |m: String| RpcError::new(Code::InvalidRequest, m);
    let home = route::home(d);
    let cwd = match cwd {
        "~" => home,
        c if c.starts_with("~/") => home.join(&c[2..]),
        c => std::path::PathBuf::from(c),
    };
    if !cwd.is_absolute() {
        return Err(invalid(format!(
            "cwd must be absolute or start with ~: {}",
            cwd.display()
        )));
    }
    match std::fs::metadata(&cwd) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(invalid(format!(
                "cwd is not a directory: {}",
                cwd.display()
            )));
        }
        Err(e) => {
            return Err(invalid(format!(
                "cwd cannot be entered: {}: {}",
                cwd.display(),
                crate::errors::io_cause(&e)
            )));
        }
    }
    if std::fs::read_dir(&cwd).is_err() {
        return Err(invalid(format!("cwd cannot be entered: {}", cwd.display())));
    }
    Ok(cwd)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeParams {
    #[serde(default, rename = "node_id")]
    _node_id: Option<String>,
    agent: String,
    agent_session_id: String,
    #[serde(default)]
    cwd: String,
}

/// `sessions.resume`: a past Claude Code session (`claude --resume ID`)
/// in a new window of the daemon's server, in tmux session `claude`.
/// Other agents are refused: only Claude Code's resume is known here.
fn resume(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let rp: ResumeParams = params(p)?;
    require_operator(req)?;
    let invalid = |m: String| RpcError::new(Code::InvalidRequest, m);
    if rp.agent != "claude" {
        return Err(invalid(format!("cannot resume {} sessions", rp.agent)));
    }
    let id = &rp.agent_session_id;
    if id.is_empty()
        || id.len() > 128
        || id.chars().any(|c| c.is_control() || c.is_whitespace())
        || id.starts_with('-')
    {
        return Err(invalid(format!("cannot resume: not a session id: {id:?}")));
    }
    if rp.cwd.is_empty() {
        return Err(invalid(
            "cannot resume: session working directory is unknown".into(),
        ));
    }
    let cwd = enterable(d, &rp.cwd)?;
    let Some(program) = crate::isolation::which("claude") else {
        return Err(invalid(
            "agent claude is not installed: no claude on PATH".into(),
        ));
    };
    let argv = vec![program.display().to_string(), "--resume".into(), id.clone()];
    route::spawn(
        d,
        req.clone(),
        "claude".into(),
        cwd.display().to_string(),
        argv,
    );
    Ok(None)
}

/// The command line of an interactive agent with a model and a first
/// prompt, in each agent's own flags.
fn agent_argv(agent: &str, model: Option<&str>, prompt: Option<&str>) -> Vec<String> {
    let mut v = vec![agent.to_string()];
    if let Some(m) = model {
        v.extend(["--model".to_string(), m.to_string()]);
    }
    if let Some(p) = prompt.filter(|p| !p.is_empty()) {
        match agent {
            "gemini" => v.extend(["--prompt-interactive".to_string(), p.to_string()]),
            "opencode" => v.extend(["--prompt".to_string(), p.to_string()]),
            _ => v.push(p.to_string()),
        }
    }
    v
}

/// The `[[seat]]` named `harness` when its transport is `tmux`.
fn tmux_seat<'a>(d: &'a Daemon, harness: &str) -> Option<&'a crate::config::SeatConfig> {
    d.cfg
        .seat
        .iter()
        .find(|s| s.harness == harness && s.in_tmux())
}

/// What a tmux seat's pane runs: its command found on the daemon's PATH
/// and its arguments, under `env` with its variables added to the tmux
/// server's environment.
fn seat_argv(seat: &crate::config::SeatConfig) -> Result<Vec<String>, RpcError> {
    let program = crate::isolation::which(&seat.command).ok_or_else(|| {
        RpcError::new(
            Code::InvalidRequest,
            format!(
                "seat {} is not installed: no {} on PATH",
                seat.harness, seat.command
            ),
        )
    })?;
    let mut argv = Vec::new();
    if !seat.env.is_empty() {
        argv.push("env".to_string());
        argv.extend(seat.env.iter().map(|(k, v)| format!("{k}={v}")));
    }
    argv.push(program.display().to_string());
    argv.extend(seat.args.iter().cloned());
    Ok(argv)
}

/// The socket's error for a tmux failure (seed 004's texts).
pub fn error(e: &Error) -> RpcError {
    match e {
        Error::UnknownSession(id) => {
            RpcError::new(Code::SessionNotFound, format!("unknown session: {id}"))
        }
        Error::NoTerminalControl => {
            RpcError::new(Code::NoTerminalControl, "session has no terminal control")
        }
        Error::Busy => RpcError::new(Code::SessionBusy, "session is busy"),
        Error::Tmux(t) => RpcError::new(Code::Unavailable, t.0.clone()),
        Error::UnknownTerminal(id) => {
            RpcError::new(Code::NotFound, format!("unknown terminal: {id}"))
        }
        Error::Overloaded => RpcError::new(
            Code::Unavailable,
            "too many tmux calls are waiting; try again",
        ),
    }
}

/// Answers a tmux request: the one place the two session lists merge
/// (module comment).
pub fn reply(d: &mut Daemon, req: Req, result: Result<Answer, Error>) {
    let out = match result {
        Ok(Answer::Sessions(list)) => {
            let mut all = match super::sessions::readable(d, &req) {
                Value::Array(a) => a,
                _ => Vec::new(),
            };
            if req.class.is_operator() {
                all.extend(list.iter().map(|s| session(s, &d.node_name)));
            }
            Ok(Value::Array(all))
        }
        Ok(Answer::Terminals(list)) => {
            let (home, attached) = (route::home(d), route::attached_terminals(d));
            let views: Vec<Value> = list
                .iter()
                .map(|t| terminal(t, &home, attached.contains(&t.id)))
                .collect();
            Ok(json!({"terminals": views}))
        }
        Ok(Answer::Terminal(t)) => {
            let attached = route::attached_terminals(d).contains(&t.id);
            Ok(terminal(&t, &route::home(d), attached))
        }
        Ok(Answer::Host(i)) => {
            let mut v = answer(Answer::Host(i));
            v["wakelock"] = route::wakelock_view(d);
            Ok(v)
        }
        Ok(Answer::Dirs(paths)) => Ok(json!({
            "home": route::home(d).display().to_string(),
            "paths": paths,
        })),
        Ok(a) => Ok(answer(a)),
        Err(e) => Err(error(&e)),
    };
    d.answer(req, out);
}

/// The socket's answer for a tmux request other than a list.
fn answer(a: Answer) -> Value {
    match a {
        Answer::Sessions(_) => Value::Null,
        Answer::Screen(screen) => json!({"screen": screen}),
        Answer::Null => Value::Null,
        Answer::Spawned {
            session_id,
            pane_id,
        } => json!({"session_id": session_id, "pane_id": pane_id}),
        Answer::Host(i) => {
            // The wakelock is the daemon's, filled in by `reply`. os and
            // battery are absent when unknown (seed 004).
            let mut v = json!({"uptime_seconds": i.uptime_seconds, "wakelock": {}});
            if let Some(os) = i.os {
                v["os"] = json!(os);
            }
            if let Some(b) = i.battery {
                v["battery"] = json!({"percent": b.percent, "state": b.state});
            }
            v
        }
        Answer::Dirs(_) | Answer::Terminals(_) | Answer::Terminal(_) => Value::Null,
    }
}

/// The daemon socket's Session of a tmux pane (seed 004, Session). A
/// session `awaiting_input` was read so from its screen (a permission
/// prompt; src/tmux/discover.rs): its `interaction` is a `permission`
/// whose `message` is the prompt line, and it has no `request_id` or
/// `options`, since no agent waits on the node for the answer (an answer
/// is typed into the pane with `sessions.key` or `sessions.input`).
pub fn session(s: &Session, node: &str) -> Value {
    let f = &s.found;
    let status = f.status.wire_name();
    let interaction = match f.status {
        tmux::Status::AwaitingInput => json!({
            "kind": "permission",
            "message": f.prompt.clone().unwrap_or_default(),
        }),
        _ => Value::Null,
    };
    let mut v = json!({
        "id": f.id,
        "agent": f.agent,
        "agent_session_id": f.agent_session_id,
        "tmux": {
            "server": f.server,
            "pane_id": f.pane.pane_id,
            "session_name": f.pane.session_name,
            "window_index": f.pane.window_index,
            "current_path": f.pane.current_path,
        },
        "cwd": f.cwd,
        "transcript_path": f.transcript_path,
        "status": status,
        "status_label": if status == "awaiting_input" { "awaiting" } else { status },
        "status_since": crate::clock::format_ts(s.status_since_ms),
        "source": if s.spawned() { "spawned" } else { "discovered" },
        "frontend": "tmux",
        "input_mode": "pane",
        "can_open_terminal": true,
        "can_prompt": s.can_prompt(),
        "interaction": interaction,
        "repo": f.repo,
        "branch": f.branch,
        "node": node,
    });
    crate::socket::views::absent_when_null(
        &mut v,
        &[
            "agent_session_id",
            "cwd",
            "transcript_path",
            "interaction",
            "repo",
            "branch",
        ],
    );
    v
}

/// seed 004's Terminal: the home directory in `cwd` shown as `~`.
pub fn terminal(t: &tmux::persistent::Terminal, home: &std::path::Path, attached: bool) -> Value {
    let cwd = match std::path::Path::new(&t.cwd).strip_prefix(home) {
        Ok(rest) if rest.as_os_str().is_empty() => "~".to_string(),
        Ok(rest) => format!("~/{}", rest.display()),
        Err(_) => t.cwd.clone(),
    };
    json!({
        "id": t.id,
        "name": t.name,
        "cwd": cwd,
        "command": t.command,
        "attached": attached,
    })
}
