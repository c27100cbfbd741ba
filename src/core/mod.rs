//! Domain state owned by the reactor thread (DESIGN.md, "Threads and
//! ownership"): seats, sessions with their transcripts, and the approvals
//! inbox (issue 3). No locks: everything here runs on the reactor, one
//! event at a time; blocking work (seat probes, ledger reads) runs on
//! worker threads and comes back through the reactor inbox.

pub mod agentfs;
pub mod approvals;
pub mod inbox;
pub mod risk;
pub mod seats;
pub mod sessions;
pub mod transcript;

use crate::config::FileConfig;
use crate::daemon::Daemon;

pub struct Core {
    pub seats: seats::Seats,
    pub sessions: sessions::Sessions,
    pub approvals: inbox::Inbox,
}

impl Core {
    pub fn new(cfg: &FileConfig) -> Core {
        Core {
            seats: seats::Seats::from_config(cfg),
            sessions: sessions::Sessions::default(),
            approvals: inbox::Inbox::default(),
        }
    }
}

/// Once the daemon is ready: probe the seats. The sessions the ledger says
/// were live are reopened by the router once the lanes are read and the
/// registry knows its seats (detected seats are known only when the probe
/// worker has looked at PATH), so that a lane's session it will not use
/// again is not reopened and a detected seat's session finds its seat.
pub fn start(d: &mut Daemon) {
    seats::probe_all(d);
}

/// SIGHUP: take the new seats (or detect them again) and probe them.
pub fn reload(d: &mut Daemon) {
    d.core.seats.reconfigure(&d.cfg);
    seats::probe_all(d);
}

/// The daemon begins to stop: agents are asked to exit, and their exits
/// are not recorded as session ends, so that resumable sessions are
/// reopened at the next start.
pub fn on_stop(d: &mut Daemon) {
    sessions::stop_all(d);
}
