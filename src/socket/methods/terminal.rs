//! The daemon socket's terminal methods (issue 15; seed 004, Terminals
//! and Persistent terminals): a tmux session's pane or a persistent
//! terminal streamed to the caller (src/tmux/terminal.rs says how),
//! keystrokes and sizes back, and the persistent terminals themselves
//! (src/tmux/persistent.rs), shells in the daemon's own tmux server that
//! outlive terminal.close and the daemon. All are the operator's.
//!
//! | method          | who      | answers                                         |
//! |-----------------|----------|-------------------------------------------------|
//! | terminal.open   | operator | null once attached; then `terminal.output`s     |
//! | terminal.input  | operator | null; `data` (base64) written to the terminal   |
//! | terminal.resize | operator | null; a size of 0 or less is ignored            |
//! | terminal.close  | operator | null; no `terminal.exited` follows              |
//! | terminal.list   | operator | {terminals} in creation order                   |
//! | terminal.create | operator | Terminal: the default shell in the home dir     |
//! | terminal.kill   | operator | null; an attach gets `terminal.exited`          |
//! | terminal.rename | operator | null                                            |
//!
//! Sizes: 80×24 when not given (or 0 or less), at most 1000 each way.
//! `terminal.exited` carries `exited` when the client ends (the pane, its
//! session or the shell went) and `evicted` when a newer terminal.open,
//! from any connection or relay channel, took the session or terminal.
//! `terminal.changed` goes to the operator connections that watch the
//! sessions (sessions.subscribe), and to the relay channels that listed,
//! created, opened, killed or renamed a persistent terminal, after a
//! create, kill or rename, and when an attach to a persistent terminal
//! begins or ends.
//!
//! On a relay channel (issue 13) a terminal belongs to the channel: its
//! output and `terminal.exited` come as relay notifications, and it closes
//! with the channel (src/daemon/router/tmux.rs says how a channel that
//! cannot keep up is treated). A remote client opens terminals on sessions
//! as session control; persistent terminals, shells on the node, are the
//! operator's (`remote_gate`). Without tmux, terminal.list is
//! empty and the rest fail with "terminals not supported on this node".
//! This daemon keeps no workspaces, so a `workspace_id` is unknown.
//!
//! A session of the daemon's own (ACP, stream-json) has no pane: its
//! terminal shows a viewer pane of its transcript (src/tmux/viewer.rs),
//! started in the session's directory, which is checked here as a spawn's
//! is (seed 004, "applies the same cwd checks to the directory of the
//! session").

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{Handled, NoParams, params, require_operator, subscriber};
use crate::daemon::router::tmux as route;
use crate::daemon::{Daemon, Req};
use crate::errors::{Code, RpcError};
use crate::limits;
use crate::tmux::Op;
use crate::tmux::terminal::{Input, b64_decode};

pub fn dispatch(d: &mut Daemon, req: Req, method: &str, p: Map<String, Value>) {
    let result = match method {
        "terminal.open" => open(d, &req, p),
        "terminal.input" => input(d, &req, p),
        "terminal.resize" => resize(d, &req, p),
        "terminal.close" => close(d, &req, p),
        "terminal.list" => list(d, &req, p),
        "terminal.create" => create(d, &req, p),
        "terminal.kill" => kill(d, &req, p),
        "terminal.rename" => rename(d, &req, p),
        other => Err(super::unknown_method(other)),
    };
    super::finish(d, req, result);
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenParams {
    #[serde(default)]
    term_id: String,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    terminal_id: Option<String>,
    #[serde(default)]
    cols: i64,
    #[serde(default)]
    rows: i64,
    #[serde(default)]
    client_pane: Option<String>,
}

/// A size as given: the default for 0 or less, at most the maximum.
fn size(n: i64, default: u16) -> u16 {
    if n <= 0 {
        default
    } else {
        n.min(limits::TERMINAL_MAX_SIZE as i64) as u16
    }
}

fn term_id_required(id: &str) -> Result<(), RpcError> {
    if id.is_empty() {
        return Err(RpcError::invalid_params("term_id required"));
    }
    Ok(())
}

fn open(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let o: OpenParams = params(p)?;
    require_operator(req)?;
    term_id_required(&o.term_id)?;
    let who = subscriber(req)?;
    let target = match (o.session_id, o.terminal_id) {
        (Some(_), Some(_)) => {
            return Err(RpcError::invalid_params(
                "set session_id or terminal_id, not both",
            ));
        }
        (None, None) => {
            return Err(RpcError::invalid_params(
                "session_id or terminal_id required",
            ));
        }
        (None, Some(t)) => {
            supported()?;
            route::Target::Terminal(t)
        }
        (Some(s), None) => route::Target::Session(s),
    };
    // One of the daemon's own sessions has no pane: seed 004 shows it in
    // a viewer pane started in its directory, checked as a spawn's is.
    let viewer_cwd = match &target {
        route::Target::Session(s) if !d.tmux.state.owns_id(s) => match d.core.sessions.get(s) {
            Some(own) if own.cwd.as_os_str().is_empty() => {
                return Err(RpcError::new(
                    Code::InvalidRequest,
                    "cannot open terminal: session working directory is unknown",
                ));
            }
            Some(own) => Some(super::tmux::enterable(d, &own.cwd.to_string_lossy())?),
            None => None,
        },
        _ => None,
    };
    if let Some(cp) = &o.client_pane {
        if !crate::tmux::driver::is_pane_id(cp) {
            return Err(RpcError::invalid_params(
                "client_pane must be a pane id such as %3",
            ));
        }
    }
    route::open_terminal(
        d,
        req.clone(),
        who,
        route::OpenTerminal {
            term_id: o.term_id,
            target,
            cols: size(o.cols, limits::TERMINAL_DEFAULT_COLS),
            rows: size(o.rows, limits::TERMINAL_DEFAULT_ROWS),
            client_pane: o.client_pane,
            viewer_cwd,
        },
    );
    Ok(None)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InputParams {
    #[serde(default)]
    term_id: String,
    data: String,
}

fn input(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let InputParams { term_id, data } = params(p)?;
    require_operator(req)?;
    term_id_required(&term_id)?;
    let who = subscriber(req)?;
    let bytes = b64_decode(&data).ok_or_else(|| RpcError::invalid_params("bad base64"))?;
    if bytes.len() > limits::TERMINAL_INPUT_MAX_BYTES {
        return Err(RpcError::invalid_params(format!(
            "data must decode to at most {} bytes",
            limits::TERMINAL_INPUT_MAX_BYTES
        )));
    }
    route::terminal_input(d, &who, &term_id, Input::Data(bytes))?;
    Ok(Some(Value::Null))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResizeParams {
    #[serde(default)]
    term_id: String,
    #[serde(default)]
    cols: i64,
    #[serde(default)]
    rows: i64,
}

fn resize(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let ResizeParams {
        term_id,
        cols,
        rows,
    } = params(p)?;
    require_operator(req)?;
    term_id_required(&term_id)?;
    let who = subscriber(req)?;
    if cols <= 0 || rows <= 0 {
        // "The node ignores a resize with a size of 0 or less."
        route::terminal_known(d, &who, &term_id)?;
        return Ok(Some(Value::Null));
    }
    let max = limits::TERMINAL_MAX_SIZE as i64;
    route::terminal_input(
        d,
        &who,
        &term_id,
        Input::Resize(cols.min(max) as u16, rows.min(max) as u16),
    )?;
    Ok(Some(Value::Null))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CloseParams {
    #[serde(default)]
    term_id: String,
}

fn close(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let CloseParams { term_id } = params(p)?;
    require_operator(req)?;
    term_id_required(&term_id)?;
    route::terminal_close(d, &subscriber(req)?, &term_id)?;
    Ok(Some(Value::Null))
}

/// A relay channel that asks about persistent terminals hears
/// `terminal.changed` from then on (module comment).
fn watch(d: &mut Daemon, req: &Req) {
    if let Ok(who) = subscriber(req) {
        route::watch_terminals(d, &who);
    }
}

/// Persistent terminals need tmux (capabilities.terminal).
fn supported() -> Result<(), RpcError> {
    if crate::isolation::which("tmux").is_none() {
        return Err(RpcError::new(
            Code::InvalidRequest,
            "terminals not supported on this node",
        ));
    }
    Ok(())
}

fn list(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let NoParams {} = params(p)?;
    require_operator(req)?;
    watch(d, req);
    if supported().is_err() {
        // "A node without capabilities.terminal returns an empty list."
        return Ok(Some(json!({"terminals": []})));
    }
    route::call(d, req.clone(), Op::TermList);
    Ok(None)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateParams {
    #[serde(default, rename = "node_id")]
    _node_id: Option<String>,
    #[serde(default)]
    workspace_id: Option<String>,
}

fn create(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let CreateParams { workspace_id, .. } = params(p)?;
    require_operator(req)?;
    supported()?;
    watch(d, req);
    if let Some(w) = workspace_id {
        // This daemon keeps no workspaces (seed 004, Projects and
        // workspaces), so no workspace_id names one.
        return Err(RpcError::new(
            Code::NotFound,
            format!("unknown workspace: {w}"),
        ));
    }
    let id = crate::ids::hex(&{
        let mut b = [0u8; 6];
        crate::ids::random_bytes(&mut b);
        b
    });
    let cwd = route::home(d).display().to_string();
    route::call(d, req.clone(), Op::TermCreate { id, cwd });
    Ok(None)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TerminalRef {
    #[serde(default)]
    terminal_id: String,
}

/// A terminal id as this daemon makes them, or the seed's error.
fn known_form(id: &str) -> Result<(), RpcError> {
    if crate::tmux::persistent::valid_id(id) {
        Ok(())
    } else {
        Err(RpcError::new(
            Code::NotFound,
            format!("unknown terminal: {id}"),
        ))
    }
}

fn kill(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let TerminalRef { terminal_id } = params(p)?;
    require_operator(req)?;
    known_form(&terminal_id)?;
    watch(d, req);
    route::call(d, req.clone(), Op::TermKill { id: terminal_id });
    Ok(None)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RenameParams {
    #[serde(default)]
    terminal_id: String,
    #[serde(default)]
    name: String,
}

fn rename(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let RenameParams { terminal_id, name } = params(p)?;
    require_operator(req)?;
    let name = name.trim().to_string();
    if name.is_empty() {
        return Err(RpcError::invalid_params("name required"));
    }
    if name.len() > 256 || name.chars().any(char::is_control) {
        return Err(RpcError::invalid_params(
            "name must be at most 256 bytes without control characters",
        ));
    }
    known_form(&terminal_id)?;
    watch(d, req);
    route::call(
        d,
        req.clone(),
        Op::TermRename {
            id: terminal_id,
            name,
        },
    );
    Ok(None)
}
