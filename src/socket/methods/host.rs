//! The daemon socket's host methods (issue 15; seed 004, Host and
//! `host.completeDir`). The facts are read on the tmux workers
//! (src/tmux/host.rs says what each is); all three are the operator's,
//! since a directory listing or the machine's uptime is no business of an
//! agent or a plugin.
//!
//! | method           | who      | answers                                       |
//! |------------------|----------|-----------------------------------------------|
//! | host.info        | operator | {os, uptime_seconds, battery?, wakelock}      |
//! | host.completeDir | operator | {home, paths}                                 |
//! | host.setWakelock | operator | HostWakelock: {until} while on, {} when off   |
//!
//! `node_id` is taken and ignored: it only routes a call between nodes.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::{Handled, params, require_operator};
use crate::daemon::router::tmux as route;
use crate::daemon::{Daemon, Req};
use crate::errors::RpcError;
use crate::tmux::Op;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InfoParams {
    #[serde(default, rename = "node_id")]
    _node_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteParams {
    #[serde(default, rename = "node_id")]
    _node_id: Option<String>,
    path: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WakelockParams {
    #[serde(default, rename = "node_id")]
    _node_id: Option<String>,
    #[serde(default)]
    until: Option<String>,
}

pub fn dispatch(d: &mut Daemon, req: Req, method: &str, p: Map<String, Value>) {
    let result = match method {
        "host.info" => info(d, &req, p),
        "host.completeDir" => complete_dir(d, &req, p),
        "host.setWakelock" => set_wakelock(d, &req, p),
        other => Err(super::unknown_method(other)),
    };
    super::finish(d, req, result);
}

fn info(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let InfoParams { .. } = params(p)?;
    require_operator(req)?;
    route::call(d, req.clone(), Op::HostInfo);
    Ok(None)
}

fn complete_dir(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let CompleteParams { path, .. } = params(p)?;
    require_operator(req)?;
    if path.len() > 4096 {
        return Err(RpcError::invalid_params("path must be at most 4096 bytes"));
    }
    let home = route::home(d);
    route::call(d, req.clone(), Op::CompleteDir { home, path });
    Ok(None)
}

/// Seed 004: "host.setWakelock fails with -32600 for an invalid until,
/// for an until in the past, and on a node without wakelock support";
/// `capabilities.host_wakelock` says beforehand whether it is served
/// (src/tmux/wakelock.rs).
fn set_wakelock(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let WakelockParams { until, .. } = params(p)?;
    require_operator(req)?;
    route::set_wakelock(d, until).map(Some)
}
