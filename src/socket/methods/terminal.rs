//! The daemon socket's live terminal methods (issue 15; seed 004,
//! Terminals): a tmux session's pane streamed to the caller
//! (src/tmux/terminal.rs says how), keystrokes and sizes back. All are the
//! operator's. Persistent terminals (`terminal_id`, terminal.create and
//! the rest) are not served: this daemon's capabilities say
//! `terminal: false`, and an open by `terminal_id` is refused with
//! "terminals not supported on this node".
//!
//! | method          | who      | answers                                         |
//! |-----------------|----------|-------------------------------------------------|
//! | terminal.open   | operator | null once attached; then `terminal.output`s     |
//! | terminal.input  | operator | null; `data` (base64) written to the terminal   |
//! | terminal.resize | operator | null; a size of 0 or less is ignored            |
//! | terminal.close  | operator | null; no `terminal.exited` follows              |
//! | terminal.list   | anyone   | {terminals: []}                                 |
//!
//! Sizes: 80×24 when not given (or 0 or less), at most 1000 each way.
//! `terminal.exited` carries `exited` when the client ends (the pane or
//! its session went) and `evicted` when a newer terminal.open, from any
//! connection, took the session.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{Handled, connection, params, require_operator};
use crate::daemon::router::tmux as route;
use crate::daemon::{Daemon, Req};
use crate::errors::{Code, RpcError};
use crate::limits;
use crate::tmux::terminal::{Input, b64_decode};

pub fn dispatch(d: &mut Daemon, req: Req, method: &str, p: Map<String, Value>) {
    let result = match method {
        "terminal.open" => open(d, &req, p),
        "terminal.input" => input(d, &req, p),
        "terminal.resize" => resize(d, &req, p),
        "terminal.close" => close(d, &req, p),
        "terminal.list" => params::<NoParams>(p).map(|_| Some(json!({"terminals": []}))),
        other => Err(RpcError::new(
            Code::MethodNotFound,
            format!("unknown method {other}"),
        )),
    };
    super::finish(d, req, result);
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

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
    let conn = connection(req)?;
    let session_id = match (o.session_id, o.terminal_id) {
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
        (None, Some(_)) => {
            return Err(RpcError::new(
                Code::InvalidRequest,
                "terminals not supported on this node",
            ));
        }
        (Some(s), None) => s,
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
        conn,
        route::OpenTerminal {
            term_id: o.term_id,
            session_id,
            cols: size(o.cols, limits::TERMINAL_DEFAULT_COLS),
            rows: size(o.rows, limits::TERMINAL_DEFAULT_ROWS),
            client_pane: o.client_pane,
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
    let conn = connection(req)?;
    let bytes = b64_decode(&data).ok_or_else(|| RpcError::invalid_params("bad base64"))?;
    if bytes.len() > limits::TERMINAL_INPUT_MAX_BYTES {
        return Err(RpcError::invalid_params(format!(
            "data must decode to at most {} bytes",
            limits::TERMINAL_INPUT_MAX_BYTES
        )));
    }
    route::terminal_input(d, conn, &term_id, Input::Data(bytes))?;
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
    let conn = connection(req)?;
    if cols <= 0 || rows <= 0 {
        // "The node ignores a resize with a size of 0 or less."
        route::terminal_known(d, conn, &term_id)?;
        return Ok(Some(Value::Null));
    }
    let max = limits::TERMINAL_MAX_SIZE as i64;
    route::terminal_input(
        d,
        conn,
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
    route::terminal_close(d, connection(req)?, &term_id)?;
    Ok(Some(Value::Null))
}
