//! What the plugin host reads of the rest of the daemon to answer
//! sessions.list, sessions.get, seats.list and lanes.list (seed 000; issue 4,
//! "Sessions data").
//!
//! The sessions, seats and lanes are built elsewhere; until they are wired
//! here these functions give empty lists, and the calls answer empty pages.
//! Each function is called on the reactor thread at the moment of the
//! answer. sessions.get (API 1.1) is therefore a snapshot: a session can be
//! admitted, start a turn or end right after the answer, so a plugin must
//! treat `state` and `turnActive` as advice, never as a guarantee (seed 001).

use super::calls::{LaneItem, SeatItem, SessionItem};
use crate::daemon::Daemon;

/// The daemon's sessions in creation order: this machine's first, then the
/// sessions it follows on other nodes.
pub fn session_items(_d: &Daemon) -> Vec<SessionItem> {
    Vec::new()
}

/// One session's item, read now.
pub fn session_item(d: &Daemon, session: &str) -> Option<SessionItem> {
    session_items(d).into_iter().find(|s| s.session == session)
}

/// The seats of the registry, in registry order.
pub fn seat_items(_d: &Daemon) -> Vec<SeatItem> {
    Vec::new()
}

/// The lanes verify.list gives, newest first, archived lanes left out. The
/// host keeps a copy of this for 5 seconds.
pub fn lane_items(d: &Daemon) -> Vec<LaneItem> {
    d.lanes.listed().into_iter().filter_map(|l| crate::lanes::controller::plugin_item(l)).collect()
}
