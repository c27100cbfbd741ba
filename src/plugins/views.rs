//! What the plugin host reads of the rest of the daemon to answer
//! sessions.list, sessions.get, seats.list and lanes.list (seed 000; issue 4,
//! "Sessions data").
//!
//! Sessions and seats are the core's (`core::sessions`, `core::seats`), read
//! at the moment of the answer on the reactor thread. Their plugin wire
//! items are built once, by `Session::plugin_item` and `Seat::plugin_item`,
//! as JSON values: the host pages them as they are and converts nothing
//! again. Lanes are the lane controller's, as verify.list lists them.
//!
//! sessions.get (API 1.1) is the busy query: a session with queued input or
//! an agent stop in progress is `running` (seed 001: "including
//! interruption cleanup"). It is a snapshot: a session can be admitted,
//! start a turn or end right after the answer, so a plugin must treat
//! `state` and `turnActive` as advice, never as a guarantee (seed 001).

use serde_json::Value;

use super::calls::LaneItem;
use crate::daemon::Daemon;

/// The daemon's sessions in creation order: this machine's first, then the
/// sessions it follows on other nodes (this daemon follows none).
pub fn session_items(d: &Daemon) -> Vec<Value> {
    d.core
        .sessions
        .iter()
        .map(|s| s.plugin_item(&d.node_name))
        .collect()
}

/// One session's item, read now, for the busy query (sessions.get, API
/// 1.1): as sessions.list gives it, except that a session the daemon counts
/// as busy although no turn runs is `running`: input is queued for it (the
/// next turn is about to start), or its agent is being stopped (seed 001:
/// "including interruption cleanup"). `turnActive` stays what it is.
pub fn session_item(d: &Daemon, session: &str) -> Option<Value> {
    let s = d.core.sessions.get(session)?;
    let mut item = s.plugin_item(&d.node_name);
    if item["state"] == "idle" && (s.queued() > 0 || s.stopping_agent()) {
        item["state"] = Value::from("running");
    }
    Some(item)
}

/// A sessions.list item's cursor: its session id.
pub fn session_cursor(item: &Value) -> String {
    item["session"].as_str().unwrap_or_default().to_string()
}

/// The seats of the registry, in registry order.
pub fn seat_items(d: &Daemon) -> Vec<Value> {
    d.core.seats.list.iter().map(|s| s.plugin_item()).collect()
}

/// A seats.list item's cursor: its harness id.
pub fn seat_cursor(item: &Value) -> String {
    item["harness"].as_str().unwrap_or_default().to_string()
}

/// The lanes verify.list gives, newest first, archived lanes left out. The
/// host keeps a copy of this for 5 seconds.
pub fn lane_items(d: &Daemon) -> Vec<LaneItem> {
    d.lanes
        .listed()
        .into_iter()
        .filter_map(crate::lanes::controller::plugin_item)
        .collect()
}
