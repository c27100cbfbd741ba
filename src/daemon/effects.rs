//! What a subsystem's change asks of the rest of the daemon, typed
//! (DESIGN.md, "How subsystems talk"; issue 11).
//!
//! A subsystem declares its own narrow effect type in its own terms
//! (`core::seats::Effect`) and never names this module: the domain does
//! not depend on the daemon. [`Effect`] is the union the router applies;
//! each subsystem's type converts into it with one `From` here. The session
//! driver's effects (`core::sessions::Effect`: records of a round, child
//! operations, typed timers, an ask for the inbox) are applied within the
//! round they belong to by router/sessions.rs, which keeps a round's
//! records in one ledger batch, in order; only what another subsystem
//! hears of the sessions goes through the union, as a [`DomainEvent`].
//! The lane controller's many kinds (ledger writes with a typed
//! acknowledgement key, lane jobs, timers with a typed key, sessions and
//! approvals asked for, answers under a reply key) travel as one variant
//! that router/lanes.rs applies, in the same queue and order as the rest.
//!
//! [`Report`] is the other direction: what a worker thread started for a
//! [`Job`] sends back through the reactor inbox, handed by the router to
//! the subsystem that asked.

use crate::core::seats;
use crate::lanes::controller as lanes;
use crate::plugins::effects as host;

/// One thing the router does, in order, to completion.
#[derive(Debug, PartialEq)]
pub enum Effect {
    /// Start blocking work on a worker thread; it reports back as a
    /// [`Report`].
    Job(Job),
    /// Deliver a domain event to whoever waits for it.
    Event(DomainEvent),
    /// The lane controller's own kinds, in its own terms, applied by
    /// router/lanes.rs (boxed: the queue's slots are as large as its
    /// largest kind, and a lane job is large).
    Lanes(Box<lanes::Effect>),
    /// What the plugin host asks (`router::plugins` applies it): child
    /// operations, timers, ledger batches, replies, its jobs, and requests
    /// to the lanes and the approvals inbox.
    Plugins(Box<host::Effect>),
}

/// Blocking work for a worker thread (DESIGN.md, "Threads and ownership":
/// probes never run on the reactor).
#[derive(Debug, PartialEq)]
pub enum Job {
    /// Detect and probe seats; reports [`Report::Seats`].
    ProbeSeats(seats::ProbeJob),
}

/// Something that happened in one subsystem that another waits for.
#[derive(Debug, PartialEq)]
pub enum DomainEvent {
    /// The seat registry's list is known for the first time: once the
    /// lanes are read too, the sessions of the last run are reopened.
    SeatsKnown,
    /// A seat probe answered for every seat: lanes may resume.
    SeatsProbed,
    /// The lanes of the ledger are read (or could not be): once the seats
    /// are known too, the sessions of the last run are reopened.
    LanesRead,

    // Sessions (router/sessions.rs).
    /// The sessions of the last run are reopened (or could not be read):
    /// lanes may resume theirs.
    SessionsRestored,
}

/// What a worker thread hands back to the reactor for a [`Job`].
#[derive(Debug)]
pub enum Report {
    /// The seat probe's worker, in the order it learns things. Each
    /// variant is boxed: reports queue on the reactor's inbox, whose
    /// 4,096 slots are as large as its largest message and all written
    /// when it is made (an unboxed seat report made them 72 bytes, 288 KiB
    /// of an idle daemon's memory; boxed, 32).
    Seats(Box<seats::Report>),
    /// A lane worker or the heads thread.
    Lanes(Box<crate::lanes::work::Report>),
    /// A plugin host's worker, or the ledger reader for it.
    Plugins(Box<host::Report>),
}

impl From<seats::Effect> for Effect {
    fn from(e: seats::Effect) -> Effect {
        match e {
            seats::Effect::Probe(job) => Effect::Job(Job::ProbeSeats(job)),
            seats::Effect::Known => Effect::Event(DomainEvent::SeatsKnown),
            seats::Effect::Probed => Effect::Event(DomainEvent::SeatsProbed),
        }
    }
}

impl From<lanes::Effect> for Effect {
    fn from(e: lanes::Effect) -> Effect {
        Effect::Lanes(Box::new(e))
    }
}

impl From<host::Effect> for Effect {
    fn from(e: host::Effect) -> Effect {
        Effect::Plugins(Box::new(e))
    }
}
