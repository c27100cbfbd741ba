//! The routes of the sessions and the approvals inbox (issue 11): the
//! session driver's effects applied, an agent's lines fed to it, an
//! answer to an approval delivered to its owner, and the requests of the
//! surfaces and the lanes turned into calls of the two subsystems.
//!
//! A round: what one outside input (an agent's output of one wake-up, a
//! request, a timer, an exit) does to one session, committed as one ledger
//! batch. The driver returns its effects in the order things happened;
//! [`run`] applies them in that order, and what an effect makes another
//! subsystem return (the inbox's rule answer, the agent's step after an
//! answer) is applied before the next effect of the list, so that the
//! batch keeps the order of events a reader of the stream expects
//! (approval.request before its approval.resolved, both before
//! session.end). Only a full stdin queue is told to the driver after the
//! effects in hand, so that the step that filled it is recorded first.
//! An agent's lines are fed one at a time, each applied to completion
//! before the next: the driver is never entered while one of its changes
//! is half done. [`finish`] ends the round with the session's row and
//! transcript text and, after the commit, tells the surfaces
//! (`Daemon::session_committed`).
//!
//! The inbox (`core::approvals`) decides nothing about other subsystems:
//! it says who owns an item (`approvals::owner`) and what an answer is
//! (`approvals::Settle`). [`settle`] hands the answer to that owner (the
//! session whose agent asked, the lane that waits to merge, the plugin's
//! task request) and closes the item with whether the owner could still
//! take it.
//!
//! A spawn's caller (a surface, a lane) waits under a [`ReplyKey`] the
//! router hands the driver with the request; the router keeps what the
//! key answers to, so the driver knows no surface. Timers are armed by
//! their typed key ([`Timer`]); the router keeps the reactor's id for
//! each, to move or cancel it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::super::Daemon;
use super::super::effects::{DomainEvent, Effect as RouterEffect};
use crate::agents::{CommandError, Decision};
use crate::children::{ChildId, ExitStatus, Output, Outputs, PipeLimits, WriteRefused};
use crate::core::ReplyKey;
use crate::core::approvals::{self, Owner, Settle};
use crate::core::inbox::{Answerer, InboxError, Item, LaneMerge, PluginTask, Verdict};
use crate::core::sessions::{
    self, Accepted, Change, Effect, Killed, SpawnRequest, Spawned, Start, Timer,
};
use crate::core::transcript::Delta;
use crate::errors::{Code, RpcError};
use crate::isolation::AgentSandbox;
use crate::ledger::{Op, WriteError};
use crate::limits;
use crate::reactor::TimerId;

/// Where a spawn's answer goes.
type SpawnReply = Box<dyn FnOnce(&mut Daemon, Result<Spawned, RpcError>)>;

/// What waits for a round's commit: a request's answer.
type After = Box<dyn FnOnce(&mut Daemon, Result<(), WriteError>)>;

/// What the router keeps for the sessions: the armed timers and the
/// spawns that wait for an answer. Both are bounded by the sessions held
/// (`limits::MAX_SESSIONS`): a session has at most a stall, a kill and an
/// exit timer, and a spawn waits only while its session is being started.
#[derive(Default)]
pub struct Routes {
    timers: HashMap<Timer, TimerId>,
    replies: HashMap<ReplyKey, SpawnReply>,
    next_reply: u64,
}

/// The records of one round, for one session's stream ("" for none).
struct Round {
    sid: String,
    ops: Vec<Op>,
}

impl Round {
    fn new(sid: &str) -> Round {
        Round {
            sid: sid.to_string(),
            ops: Vec::new(),
        }
    }
}

/// What a round's commit is announced with.
struct Committed {
    sid: String,
    delta: Option<Delta>,
    change: Option<Change>,
}

/// Applies the driver's `effects` to `round`, in order (module comment).
fn run(d: &mut Daemon, round: &mut Round, effects: Vec<Effect>) {
    let mut queue: VecDeque<Effect> = effects.into();
    while let Some(e) = queue.pop_front() {
        match e {
            Effect::Record(op) => round.ops.push(op),
            Effect::Write { sid, child, lines } => {
                for line in &lines {
                    match d.children.write(d.reactor.poll.registry(), child, line) {
                        Ok(()) => {}
                        Err(WriteRefused::Closed) => break,
                        Err(WriteRefused::Full) => {
                            queue.extend(d.core.sessions.stdin_full(&sid));
                            break;
                        }
                    }
                }
            }
            Effect::Stop { child } => {
                d.children.close_stdin(d.reactor.poll.registry(), child);
                d.children.signal(child, libc::SIGTERM);
            }
            Effect::Kill { child } => d.children.signal(child, libc::SIGKILL),
            Effect::Release { child } => d.children.remove(d.reactor.poll.registry(), child),
            Effect::Arm { timer, after } => arm(d, timer, after),
            Effect::Disarm(timer) => {
                if let Some(id) = d.router.sessions.timers.remove(&timer) {
                    d.reactor.cancel(id);
                }
            }
            Effect::Ask(ask) => {
                let now = crate::clock::now_ms();
                let fx = approvals::add_agent_request(
                    &mut d.core.approvals,
                    &d.cfg,
                    &ask,
                    now,
                    &mut round.ops,
                );
                inbox(d, fx, round);
            }
            Effect::Withdraw {
                approval_id,
                why,
                delivered,
            } => {
                approvals::close(
                    &mut d.core.approvals,
                    &approval_id,
                    Verdict::Cancel,
                    Answerer::Daemon(why.into()),
                    "daemon",
                    delivered,
                    None,
                    None,
                    crate::clock::now_ms(),
                    &mut round.ops,
                );
            }
            Effect::SignIn { harness, state } => d.core.seats.note_sign_in(&harness, state),
            Effect::Launch { start, reply } => launch(d, start, reply),
            Effect::NotStarted { reply, error } => answer_spawn(d, reply, Err(error)),
            Effect::ReadLastRun { not_needed } => read_last_run(d, not_needed),
        }
    }
}

/// Applies effects that belong to no session's round.
fn apply(d: &mut Daemon, effects: Vec<Effect>) {
    let mut round = Round::new("");
    run(d, &mut round, effects);
    finish(d, round, false, None);
}

/// Ends `round`: the session's transcript text and row join its records,
/// the batch is committed, and after the commit the surfaces hear of it
/// and `after` runs. When the ledger refuses the records nothing is
/// announced; `after` gets the error.
fn finish(d: &mut Daemon, round: Round, added: bool, after: Option<After>) {
    let Round { sid, mut ops } = round;
    let done = d.core.sessions.finish(&sid, added, crate::clock::now_ms());
    ops.extend(done.ops);
    if ops.is_empty() {
        if let Some(a) = after {
            a(d, Ok(()));
        }
        return;
    }
    let ack = Committed {
        sid,
        delta: done.delta,
        change: done.change,
    };
    d.write(ops, move |d, r| committed(d, ack, r, after));
}

fn committed(
    d: &mut Daemon,
    ack: Committed,
    r: Result<Vec<crate::ledger::Appended>, WriteError>,
    after: Option<After>,
) {
    if let Err(e) = r {
        crate::error!("session {}: the ledger refused its records: {e}", ack.sid);
        if let Some(a) = after {
            a(d, Err(e));
        }
        return;
    }
    d.session_committed(&ack.sid, ack.delta, ack.change);
    if let Some(a) = after {
        a(d, Ok(()));
    }
}

fn arm(d: &mut Daemon, timer: Timer, after: Duration) {
    let key = timer.clone();
    let id = d.reactor.schedule(after, move |d| fired(d, key));
    if let Some(old) = d.router.sessions.timers.insert(timer, id) {
        d.reactor.cancel(old);
    }
}

/// A timer of the driver's fired.
fn fired(d: &mut Daemon, timer: Timer) {
    d.router.sessions.timers.remove(&timer);
    let sid = match &timer {
        Timer::ExitGrace { sid } => {
            if let Some(status) = d.core.sessions.take_exit_pending(sid) {
                let sid = sid.clone();
                ended(d, &sid, status);
            }
            return;
        }
        Timer::Stall { sid, .. } => sid.clone(),
        Timer::Kill { child } => d
            .core
            .sessions
            .owner_of(*child)
            .unwrap_or_default()
            .to_string(),
    };
    let fx = d.core.sessions.on_timer(timer, Instant::now());
    let mut round = Round::new(&sid);
    run(d, &mut round, fx);
    finish(d, round, false, None);
}

/// What an agent's pipes produced, a line at a time (module comment).
pub fn on_output(d: &mut Daemon, child: ChildId, out: &Outputs) {
    let Some(sid) = d.core.sessions.owner_of(child).map(str::to_string) else {
        return;
    };
    let mut round = Round::new(&sid);
    // One clock read for the lines of one wake-up, not one per line.
    let (now, now_ms) = (Instant::now(), crate::clock::now_ms());
    for o in out.iter() {
        match o {
            Output::Line(line) => {
                let (fx, go_on) = d.core.sessions.on_line(&sid, line, now, now_ms);
                run(d, &mut round, fx);
                if !go_on {
                    break;
                }
            }
            Output::LineTooLong => {
                let fx = d.core.sessions.line_too_long(&sid);
                run(d, &mut round, fx);
                break;
            }
            Output::StdoutClosed => {
                if let Some(status) = d.core.sessions.take_exit_pending(&sid) {
                    finish(d, round, false, None);
                    ended(d, &sid, status);
                    return;
                }
            }
            Output::StdinClosed => {}
        }
    }
    finish(d, round, false, None);
}

/// A reaped agent's exit.
pub fn on_exit(d: &mut Daemon, child: ChildId, status: ExitStatus) {
    let status = if d.children.is_sandboxed(child) {
        status.through_bwrap()
    } else {
        status
    };
    let open = d.children.stdout_open(child);
    let tail = if open {
        Vec::new()
    } else {
        d.children.stderr_tail(child)
    };
    let Some((sid, fx)) = d.core.sessions.on_exit(child, status, open, &tail) else {
        return;
    };
    let mut round = Round::new(&sid);
    run(d, &mut round, fx);
    // While the daemon stops, ends are not recorded (core::sessions).
    if !open && !d.core.sessions.stopping() {
        finish(d, round, false, None);
    }
}

/// The agent of session `sid` is gone.
fn ended(d: &mut Daemon, sid: &str, status: ExitStatus) {
    let tail = d
        .core
        .sessions
        .child_of(sid)
        .map(|c| d.children.stderr_tail(c))
        .unwrap_or_default();
    let fx = d.core.sessions.ended(sid, status, &tail);
    let mut round = Round::new(sid);
    run(d, &mut round, fx);
    if !d.core.sessions.stopping() {
        finish(d, round, false, None);
    }
}

/// `sessions.spawn`: starts the seat's agent; `then` gets the session's
/// id once session.start is committed.
pub fn spawn(
    d: &mut Daemon,
    req: SpawnRequest,
    then: impl FnOnce(&mut Daemon, Result<Spawned, RpcError>) + 'static,
) {
    let routes = &mut d.router.sessions;
    routes.next_reply += 1;
    let key = ReplyKey(routes.next_reply);
    routes.replies.insert(key, Box::new(then));
    let isolation = d.cfg.agents.isolation();
    let gone = d.core.sessions.evict_ended(d.cfg.agents.ended_kept);
    if !gone.is_empty() {
        d.sessions_forgotten(&gone);
    }
    match d.core.sessions.spawn(&d.core.seats, req, isolation, key) {
        Ok(fx) => apply(d, fx),
        Err(e) => answer_spawn(d, key, Err(e)),
    }
}

fn answer_spawn(d: &mut Daemon, key: ReplyKey, r: Result<Spawned, RpcError>) {
    if let Some(then) = d.router.sessions.replies.remove(&key) {
        then(d, r);
    }
}

/// A start's outcome to its caller, or (a reopened session, which no
/// caller waits for) to the log.
fn started(d: &mut Daemon, sid: &str, reply: Option<ReplyKey>, r: Result<Spawned, RpcError>) {
    match (reply, r) {
        (Some(key), r) => answer_spawn(d, key, r),
        (None, Err(e)) => crate::warn!("session {sid}: could not be reopened: {}", e.message),
        (None, Ok(_)) => {}
    }
}

/// Starts the agent of a new or reopened session and records it.
fn launch(d: &mut Daemon, start: Start, reply: Option<ReplyKey>) {
    let sandbox = d.core.sessions.sandbox(d.cfg.agents.isolation());
    if sandbox == AgentSandbox::Pending {
        d.core.sessions.hold(start, reply);
        return;
    }
    let hidden =
        matches!(sandbox, AgentSandbox::Namespace(_)).then(|| crate::isolation::hidden_for(d));
    let sid = start.id().to_string();
    let (cmd, prepared) =
        match d
            .core
            .sessions
            .prepare(&d.core.seats, start, &sandbox, hidden.as_ref())
        {
            Ok(p) => p,
            Err(e) => return started(d, &sid, reply, Err(e)),
        };
    let pipes = PipeLimits {
        max_line: limits::AGENT_MAX_LINE,
        max_queued: limits::AGENT_STDIN_QUEUED,
        stderr_tail: limits::AGENT_STDERR_TAIL,
    };
    let spawned = d.children.spawn(
        d.reactor.poll.registry(),
        &mut d.roots,
        cmd,
        crate::procs::Owner::Session(sid.clone()),
        pipes,
    );
    let (child, pid) = match spawned {
        Ok(c) => c,
        Err(e) => {
            let msg = crate::children::spawn_error(&prepared.program, &e);
            crate::warn!("session {sid}: {msg}");
            return started(d, &sid, reply, Err(RpcError::new(Code::SeatNotReady, msg)));
        }
    };
    if prepared.contained {
        d.children.set_sandboxed(child);
    }
    let (sid, fx) = d.core.sessions.started(prepared, child, pid);
    let mut round = Round::new(&sid);
    run(d, &mut round, fx);
    // A reopened session is new to this run of the daemon too: `added`.
    let after: After = Box::new(move |d, r| {
        let r = r
            .map(|()| Spawned {
                session_id: sid.clone(),
            })
            .map_err(RpcError::from);
        started(d, &sid, reply, r)
    });
    finish(d, round, true, Some(after));
}

/// `sessions.input`: a prompt now, or queued behind the running turn.
pub fn input(d: &mut Daemon, sid: &str, text: String) -> Result<Accepted, RpcError> {
    let (accepted, fx) = d.core.sessions.input(sid, text)?;
    let mut round = Round::new(sid);
    run(d, &mut round, fx);
    finish(d, round, false, None);
    Ok(accepted)
}

/// `sessions.interrupt`: whether a turn was running.
pub fn interrupt(d: &mut Daemon, sid: &str) -> Result<bool, RpcError> {
    let (active, fx) = d.core.sessions.interrupt(sid)?;
    let mut round = Round::new(sid);
    run(d, &mut round, fx);
    finish(d, round, false, None);
    Ok(active)
}

/// `sessions.kill`: stops the agent; session.end follows its exit.
pub fn kill(d: &mut Daemon, sid: &str) -> Result<Killed, RpcError> {
    let (killed, fx) = d.core.sessions.kill(sid)?;
    run(d, &mut Round::new(sid), fx);
    Ok(killed)
}

/// `session.rename`: `then` gets the clean name once the row is
/// committed.
pub fn rename(
    d: &mut Daemon,
    sid: &str,
    name: &str,
    then: impl FnOnce(&mut Daemon, Result<String, RpcError>) + 'static,
) -> Result<(), RpcError> {
    let name = d.core.sessions.rename(sid, name)?;
    let after: After = Box::new(move |d, r| then(d, r.map(|()| name).map_err(RpcError::from)));
    finish(d, Round::new(sid), false, Some(after));
    Ok(())
}

/// The daemon stops: every agent is asked to exit (module comment of
/// core::sessions).
pub fn stop_all(d: &mut Daemon) {
    let fx = d.core.sessions.stop_all();
    apply(d, fx);
}

/// The machine's bubblewrap probe answered.
pub fn isolation_known(d: &mut Daemon, probe: &crate::isolation::Probe) {
    let fx = d
        .core
        .sessions
        .isolation_known(d.cfg.agents.isolation(), probe);
    apply(d, fx);
}

/// Reopens the sessions of the last run but those in `not_needed`; the
/// router hears [`DomainEvent::SessionsRestored`] once they are in place
/// (or the read failed).
pub fn restore(d: &mut Daemon, not_needed: HashSet<String>) {
    let fx = d
        .core
        .sessions
        .restore(d.cfg.agents.isolation(), not_needed);
    apply(d, fx);
}

fn restored(d: &mut Daemon) {
    super::apply(d, [RouterEffect::Event(DomainEvent::SessionsRestored)]);
}

fn read_last_run(d: &mut Daemon, not_needed: HashSet<String>) {
    let inbox = d.inbox.clone();
    let queued = d.ledger.read(Box::new(move |conn| {
        let rows = sessions::read_live(conn);
        let left = approvals::read_left(conn);
        inbox.run(move |d| {
            match (rows, left) {
                (Ok(rows), Ok(left)) => reopen(d, rows, left, &not_needed),
                (Err(e), _) | (_, Err(e)) => crate::error!(
                    "unable to read the sessions of the last run: {}",
                    e.to_string().to_lowercase()
                ),
            }
            restored(d);
        });
    }));
    if queued.is_err() {
        crate::error!("unable to read the sessions of the last run: the ledger reader is busy");
        restored(d);
    }
}

/// What the last run left: its pending approvals are withdrawn, its
/// history goes back into the inbox, its live sessions are reopened or
/// end.
fn reopen(
    d: &mut Daemon,
    rows: Vec<sessions::LiveRow>,
    left: approvals::Left,
    not_needed: &HashSet<String>,
) {
    let approvals::Left {
        pending,
        mut resolved,
    } = left;
    // The read ran while this run already served requests: a request this
    // run made is live here and is not the last run's.
    let pending: Vec<Item> = pending
        .into_iter()
        .filter(|i| d.core.approvals.get(&i.id).is_none())
        .collect();
    // Every request pending when the daemon stopped resolves undelivered.
    for item in pending {
        let stream = item.subject.session().unwrap_or_default().to_string();
        let mut ops = Vec::new();
        resolved.push(approvals::withdraw_stale(
            item,
            crate::clock::now_ms(),
            &mut ops,
        ));
        write_plain(d, &stream, ops);
    }
    // The last run's history, then this run's (issue 10, item 11).
    d.core.approvals.restore_resolved(resolved);
    for (sid, ops, start) in d.core.sessions.reopen(&d.core.seats, rows, not_needed) {
        write_plain(d, &sid, ops);
        if let Some(start) = start {
            launch(d, start, None);
        }
    }
}

/// Commits records of something that is not a live session (yet).
fn write_plain(d: &mut Daemon, what: &str, ops: Vec<Op>) {
    if ops.is_empty() {
        return;
    }
    let what = what.to_string();
    d.write(ops, move |_d, r| {
        if let Err(e) = r {
            crate::error!("session {what}: the ledger refused its records: {e}");
        }
    });
}

/// Applies what the inbox returned; rows of a rule's answer join `round`.
fn inbox(d: &mut Daemon, effects: Vec<approvals::Effect>, round: &mut Round) {
    for e in effects {
        match e {
            approvals::Effect::Expire { id, after_ms } => arm_expiry(d, id, after_ms),
            approvals::Effect::Settle(s) => {
                if let Err(e) = settle(d, &s, round) {
                    crate::warn!(
                        "approval {}: {} could not answer it: {}",
                        s.id,
                        s.by.describe(),
                        e.message
                    );
                }
            }
        }
    }
}

fn arm_expiry(d: &mut Daemon, id: String, after_ms: i64) {
    d.reactor
        .schedule(Duration::from_millis(after_ms.max(0) as u64), move |d| {
            expire(d, &id)
        });
}

/// An item's deadline passed: its fallback answers.
fn expire(d: &mut Daemon, id: &str) {
    let Some(s) = approvals::expire(&d.core.approvals, id, crate::clock::now_ms()) else {
        return;
    };
    let id = id.to_string();
    answer(d, s, None, move |_d, r| {
        if let Err(e) = r {
            crate::warn!(
                "approval {id}: its fallback could not be applied: {}",
                e.message
            );
        }
    });
}

/// Delivers an answer to the item's owner and resolves the item; the
/// ledger rows join `round`. `s.withdraw` sends the owner a cancel but
/// records the request as undelivered.
fn settle(d: &mut Daemon, s: &Settle, round: &mut Round) -> Result<Item, RpcError> {
    let item = approvals::pending(&d.core.approvals, &s.id, None)?;
    let delivered = deliver(d, &item, s, round)? && !s.withdraw;
    approvals::close(
        &mut d.core.approvals,
        &s.id,
        s.verdict,
        s.by.clone(),
        s.surface,
        delivered,
        s.reason.clone(),
        s.grant.as_ref().map(approvals::answer_json),
        crate::clock::now_ms(),
        &mut round.ops,
    )
    .ok_or_else(|| {
        RpcError::new(
            Code::NotPending,
            format!("approval {} is no longer pending", s.id),
        )
    })
}

/// Tells the owner of `item` the answer; Ok(false) when the owner can no
/// longer take it (the agent is gone, the request vanished, the plugin's
/// call no longer waits).
fn deliver(d: &mut Daemon, item: &Item, s: &Settle, round: &mut Round) -> Result<bool, RpcError> {
    match approvals::owner(item) {
        Owner::PluginRequest { id } => Ok(super::plugins::task_answered(d, id, s.verdict, &s.by)),
        Owner::Lane { lane, commit } => {
            Ok(super::lanes::merge_answered(d, lane, commit, s.verdict))
        }
        Owner::Session { session, key } => {
            let decision = match (s.verdict, &s.grant) {
                (Verdict::Allow, Some(g)) => Decision::AllowWith(g.clone()),
                (Verdict::Allow, None) => Decision::Allow,
                (Verdict::Deny, _) => Decision::Deny {
                    message: s.reason.clone(),
                },
                (Verdict::Cancel, _) => Decision::Cancel,
            };
            match d.core.sessions.answer(session, &item.id, key, decision) {
                Ok(Some(fx)) => {
                    run(d, round, fx);
                    Ok(true)
                }
                Ok(None) => Ok(false),
                Err(CommandError::NoMatchingOption) => Err(RpcError::new(
                    Code::Unavailable,
                    format!(
                        "the agent offered no option to {} approval {}",
                        s.verdict.wire_name(),
                        item.id
                    ),
                )),
                Err(_) => Ok(false),
            }
        }
    }
}

/// `approvals.answer` and every other answer from outside the inbox
/// (`expect_digest`: the action the caller saw): the commit of the
/// answer's records comes before `then`, which gets the resolved item for
/// its surface to show.
pub fn answer(
    d: &mut Daemon,
    s: Settle,
    expect_digest: Option<&str>,
    then: impl FnOnce(&mut Daemon, Result<Item, RpcError>) + 'static,
) {
    let item = match approvals::pending(&d.core.approvals, &s.id, expect_digest) {
        Ok(i) => i,
        Err(e) => return then(d, Err(e)),
    };
    let mut round = Round::new(item.subject.session().unwrap_or_default());
    match settle(d, &s, &mut round) {
        Ok(item) => {
            let after: After =
                Box::new(move |d, r| then(d, r.map(|()| item).map_err(RpcError::from)));
            finish(d, round, false, Some(after));
        }
        Err(e) => then(d, Err(e)),
    }
}

/// Resolves a pending item whose owner knows already or is gone (a
/// plugin's request withdrawn), its rows into `ops`.
#[allow(clippy::too_many_arguments)]
pub fn close(
    d: &mut Daemon,
    id: &str,
    verdict: Verdict,
    by: Answerer,
    surface: &'static str,
    delivered: bool,
    reason: Option<String>,
    ops: &mut Vec<Op>,
) -> Option<Item> {
    approvals::close(
        &mut d.core.approvals,
        id,
        verdict,
        by,
        surface,
        delivered,
        reason,
        None,
        crate::clock::now_ms(),
        ops,
    )
}

/// A plugin's task request is stored: into the inbox, recorded, expiring.
pub fn add_plugin_task(
    d: &mut Daemon,
    id: &str,
    task: PluginTask,
    created_ms: i64,
) -> Result<(), InboxError> {
    let now = crate::clock::now_ms();
    let (op, expire) =
        approvals::add_plugin_task(&mut d.core.approvals, &d.cfg, id, task, created_ms, now)?;
    record(d, id, op);
    inbox(d, vec![expire], &mut Round::new(""));
    Ok(())
}

/// A lane waits for the operator to allow its merge.
pub fn add_lane_merge(d: &mut Daemon, id: &str, merge: LaneMerge) -> Result<(), InboxError> {
    let now = crate::clock::now_ms();
    let (op, expire) = approvals::add_lane_merge(&mut d.core.approvals, &d.cfg, id, merge, now)?;
    record(d, id, op);
    inbox(d, expire.into_iter().collect(), &mut Round::new(""));
    Ok(())
}

/// Writes an item's row that belongs to no session's round.
fn record(d: &mut Daemon, id: &str, op: Op) {
    let id = id.to_string();
    d.write(vec![op], move |_d, r| {
        if let Err(e) = r {
            crate::error!("approval {id}: the ledger refused its record: {e:?}");
        }
    });
}
