//! The router (DESIGN.md, "How subsystems talk"; issue 11): applies the
//! effects a subsystem returns and delivers domain events, in order, each
//! to completion. It is the only module that names two subsystems: it
//! decides who hears "seats known" or "seats probed", so that the seat
//! registry knows neither the sessions nor the lanes.
//!
//! No re-entrancy: effects go on one queue, drained in a loop by the
//! outermost [`apply`]. When delivering an event makes another subsystem
//! return effects, [`apply`] only queues them, and they run after the
//! event in hand is done, in the order they were returned. The queue
//! lives on the reactor thread and holds what one outside input (a
//! message, a request, a timer) leads to; each subsystem method returns a
//! handful of effects, so it is bounded by construction, not by a limit.
//!
//! Seats are converted (the pilot): the reactor hands the probe worker's
//! typed [`Report`]s here, the registry answers with effects, and the
//! router runs the job and delivers the events. The sessions of the last
//! run are reopened once both the lanes are read and the seat list is
//! known (a detected seat is known only once the worker has looked at
//! PATH), whichever comes last; lanes resume at the end of each probe and
//! once the reopened sessions are in place. The sessions and the approvals
//! inbox are converted too: their routes are in [`sessions`]; the lane
//! controller's effects and its workers' reports are carried out in
//! [`lanes`]; the plugin host's in [`plugins`]; locked mode's operations
//! run one at a time in [`lock`]. Each of those files is the one place its
//! subsystem meets the others: what one asks of another comes back to the
//! router as an effect, which calls the other and hands the typed result
//! back.
//!
//! Where answers go: `ReplyTo` stays in the daemon, beside the surfaces it
//! names (a socket connection, an HTTP handler's channel, later a relay
//! channel). The domain never sees it: a request that a subsystem answers
//! later (a spawn, which waits for the isolation probe and its commit)
//! carries an opaque `core::ReplyKey` that the router hands in with the
//! request and maps back to the waiting caller, a surface or another
//! subsystem; an answer a subsystem gives at once is its method's return
//! value, and one given after a commit is the router's to send when the
//! commit comes back. Lanes and plugins take the same `core::ReplyKey`
//! for their own requests; each route file keeps its own key-to-caller
//! map.

pub mod tmux;

use std::collections::VecDeque;

pub mod lanes;
pub mod lock;
pub mod sessions;

use super::Daemon;
use super::effects::{DomainEvent, Effect, Job, Report};
use crate::core::seats::{self, Seats};
use crate::reactor::Msg;

pub mod plugins;

/// The router's state: its queue, and what it waits for before the
/// sessions of the last run are reopened.
#[derive(Default)]
pub struct Router {
    queue: VecDeque<Effect>,
    draining: bool,
    lanes_read: bool,
    seats_known: bool,
    restored: bool,
    sessions: sessions::Routes,
    /// The lane workers and who waits for the lanes' answers.
    lanes: lanes::Route,
    plugins: plugins::State,
}

impl Router {
    /// Queues `effects` behind those queued already; true when no drain
    /// runs, so that the caller is to drain the queue with [`Router::next`].
    fn enqueue(&mut self, effects: impl IntoIterator<Item = Effect>) -> bool {
        self.queue.extend(effects);
        !std::mem::replace(&mut self.draining, true)
    }

    /// Whether the sessions of the last run are to be reopened now: the
    /// lanes are read and the seats known, and they were not reopened yet.
    fn restore_now(&mut self) -> bool {
        let now = self.lanes_read && self.seats_known && !self.restored;
        self.restored |= now;
        now
    }

    /// The next effect to run; `None` ends the drain.
    fn next(&mut self) -> Option<Effect> {
        let next = self.queue.pop_front();
        self.draining = next.is_some();
        next
    }
}

/// Applies `effects` in order, each to completion; see the module comment.
pub fn apply<E: Into<Effect>>(d: &mut Daemon, effects: impl IntoIterator<Item = E>) {
    if !d.router.enqueue(effects.into_iter().map(Into::into)) {
        return;
    }
    while let Some(e) = d.router.next() {
        match e {
            Effect::Job(job) => start(d, job),
            Effect::Event(ev) => deliver(d, ev),
            Effect::Lanes(e) => lanes::run(d, *e),
            Effect::Plugins(e) => plugins::apply(d, *e),
        }
    }
}

/// Runs `f` on the seat registry and applies what it returns.
pub fn seats(d: &mut Daemon, f: impl FnOnce(&mut Seats) -> Vec<seats::Effect>) {
    let effects = f(&mut d.core.seats);
    apply(d, effects);
}

/// A worker's report, handed to the subsystem whose job sent it.
pub fn report(d: &mut Daemon, report: Report) {
    match report {
        Report::Seats(r) => {
            let now = crate::clock::now_ms();
            seats(d, |s| s.on_report(*r, now));
        }
        Report::Lanes(r) => lanes::report(d, *r),
        Report::Plugins(r) => plugins::report(d, *r),
    }
}

/// The lanes of the ledger are read, or could not be.
pub fn lanes_read(d: &mut Daemon) {
    apply(d, [Effect::Event(DomainEvent::LanesRead)]);
}

fn start(d: &mut Daemon, job: Job) {
    match job {
        Job::ProbeSeats(job) => {
            let inbox = d.inbox.clone();
            let path_var = crate::isolation::search_path();
            let spawned = crate::probe_thread::spawn("seat-probe", move || {
                seats::run_probe(job, &path_var, |r| {
                    inbox.send(Msg::Report(Report::Seats(Box::new(r))));
                })
            });
            if let Err(e) = spawned {
                crate::warn!(
                    "unable to start the seat probe thread: {}",
                    crate::errors::io_cause(&e)
                );
                seats(d, Seats::probe_not_started);
            }
        }
    }
}

fn deliver(d: &mut Daemon, event: DomainEvent) {
    match event {
        DomainEvent::SeatsKnown => {
            d.router.seats_known = true;
            if d.router.restore_now() {
                restore_sessions(d);
            }
        }
        DomainEvent::LanesRead => {
            d.router.lanes_read = true;
            if d.router.restore_now() {
                restore_sessions(d);
            }
        }
        // Lanes resume once the seats they need are known.
        DomainEvent::SeatsProbed => lanes::seats_probed(d),
        // Lanes resume their sessions once those are in place.
        DomainEvent::SessionsRestored => lanes::sessions_restored(d),
    }
}

/// Reopens the sessions of the last run but those the lanes will not use
/// again (a verifier whose verification starts over); the lanes resume
/// once those sessions are in place.
fn restore_sessions(d: &mut Daemon) {
    let not_needed = lanes::sessions_not_needed(d);
    sessions::restore(d, not_needed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(e: DomainEvent) -> Effect {
        Effect::Event(e)
    }

    #[test]
    fn effects_queued_while_draining_run_after_the_one_in_hand_in_order() {
        let mut r = Router::default();
        assert!(r.enqueue([
            event(DomainEvent::LanesRead),
            event(DomainEvent::SeatsKnown)
        ]));
        assert_eq!(r.next(), Some(event(DomainEvent::LanesRead)));
        // Delivering LanesRead made a subsystem return effects: queued,
        // not run now, and behind what was queued before.
        assert!(!r.enqueue([event(DomainEvent::SeatsProbed)]));
        assert_eq!(r.next(), Some(event(DomainEvent::SeatsKnown)));
        assert_eq!(r.next(), Some(event(DomainEvent::SeatsProbed)));
        assert_eq!(r.next(), None);
        // The drain is over: the next apply drains again.
        assert!(r.enqueue([event(DomainEvent::SeatsProbed)]));
    }

    #[test]
    fn sessions_are_reopened_once_when_both_lanes_and_seats_are_known() {
        for seats_first in [true, false] {
            let mut r = Router::default();
            if seats_first {
                r.seats_known = true;
            } else {
                r.lanes_read = true;
            }
            assert!(!r.restore_now(), "seats first: {seats_first}");
            r.seats_known = true;
            r.lanes_read = true;
            assert!(r.restore_now(), "seats first: {seats_first}");
            assert!(!r.restore_now(), "seats first: {seats_first}");
        }
    }

    #[test]
    fn the_seat_registry_s_effects_become_a_job_and_events() {
        let job = seats::ProbeJob {
            detect: true,
            seats: vec![],
        };
        assert_eq!(
            Effect::from(seats::Effect::Probe(job.clone())),
            Effect::Job(Job::ProbeSeats(job))
        );
        assert_eq!(
            Effect::from(seats::Effect::Known),
            event(DomainEvent::SeatsKnown)
        );
        assert_eq!(
            Effect::from(seats::Effect::Probed),
            event(DomainEvent::SeatsProbed)
        );
    }
}
