//! Domain state owned by the reactor thread (DESIGN.md, "Threads and
//! ownership"): seats, sessions with their transcripts, and the approvals
//! inbox (issue 3). No locks: everything here runs on the reactor, one
//! event at a time; blocking work (seat probes, ledger reads) runs on
//! worker threads and comes back through the reactor inbox.
//!
//! A subsystem converted to effects (seats, sessions and the approvals
//! inbox; issue 11) names no daemon: what its change asks of the others
//! (seats known, an approval to deliver, a permission for the inbox) goes
//! back as its effects to the router in daemon/router/, which alone
//! decides who hears it. Start, reload and stop are the router's too.

pub mod agentfs;
pub mod approvals;
pub mod inbox;
pub mod risk;
pub mod seats;
pub mod sessions;
pub mod transcript;

use crate::config::FileConfig;

/// Names a request that waits for a subsystem's answer, opaque to the
/// subsystem: the router hands one in with the request and maps it back
/// to where the answer goes (a surface's `ReplyTo`, or the subsystem that
/// asked), so that the domain never names a surface (issue 11).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReplyKey(pub u64);

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
