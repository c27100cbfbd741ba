//! The plugin host's routes (issue 11; DESIGN.md, "How subsystems talk"):
//! every call into `plugins::host::Host` goes through [`with`], which
//! builds the host's read-only context (the `[plugins]` config, the time,
//! the children's pipes, views of sessions, seats and lanes) and applies
//! the effects the host queued through the router's one queue, in order.
//!
//! What the effects name, this module does:
//! - child operations: the spawn ([`Host::command`] builds the command),
//!   writes (a full stdin queue goes back as [`Host::write_refused`]),
//!   closes, signals, and the reap of a finished run (its error output is
//!   read before the child is forgotten);
//! - timers: a typed [`TimerKey`] maps to the reactor's timer, so that a
//!   key set again replaces the one set before and a cancel finds it; a
//!   timer that fires goes back to [`Host::on_timer`];
//! - ledger batches: a task request's withdrawn inbox items are closed by
//!   the approvals inbox into the same batch, and the commit's result goes
//!   back to [`Host::committed`] with the batch's typed acknowledgement;
//! - replies: a [`ReplyKey`] maps to the [`Req`] a socket method handed
//!   over ([`reply_key`]), so the host never names a surface;
//! - jobs on the host's three worker threads (`plugin-records`:
//!   plugins.json; `plugin-install`: copies, deletions and plugin.approve's
//!   checks; `plugin-check`: the approved copy's hash before a start, and
//!   the watch's walk of /proc), each started on its first job and again
//!   after a job killed it; their reports come back through the reactor
//!   inbox to [`Host::on_report`], but a staged install and a checked
//!   approval, which go to the socket method that asked;
//! - the other subsystems: a task request into the approvals inbox
//!   (`core::approvals::add_plugin_task`), an allowed request dispatched as
//!   a lane (`lanes::controller::dispatch`, whose answer, or its loss, goes
//!   back as [`Host::landed`]), a lane closed for a removal
//!   (`lanes::controller::stop_for_removal`), and the inbox's answer to a
//!   request ([`task_answered`]).

use std::collections::HashMap;
use std::time::Instant;

use super::super::effects::Report as DaemonReport;
use super::super::{Daemon, Req};
use crate::children::{ChildId, Children, ExitStatus, Outputs, WriteRefused};
use crate::core::inbox::{Answerer, Verdict};
use crate::errors::{Code, RpcError};
use crate::limits;
use crate::plugins::effects::{Aborted, Cx, Effect, Job, Pipes, ReplyKey, Report, TimerKey};
use crate::plugins::host::{self, Host};
use crate::plugins::{store, tasks, views};
use crate::procs::Owner;
use crate::reactor::{Msg, TimerId};

/// What the router keeps for the plugin host.
#[derive(Default)]
pub struct State {
    replies: HashMap<ReplyKey, Req>,
    next_reply: u64,
    timers: HashMap<TimerKey, TimerId>,
    records: Option<store::Worker>,
    install: Option<store::Worker>,
    check: Option<store::Worker>,
}

/// The children's pipes, as the host reads them.
struct ChildPipes<'a>(&'a Children);

impl Pipes for ChildPipes<'_> {
    fn queued(&self, child: ChildId) -> usize {
        self.0.queued(child)
    }

    fn stdout_open(&self, child: ChildId) -> bool {
        self.0.stdout_open(child)
    }
}

/// Runs `f` on the host with its context, then applies what it queued.
pub fn with<R>(d: &mut Daemon, f: impl FnOnce(&mut Host, &Cx) -> R) -> R {
    let stopping = d.is_stopping();
    let r = {
        let views = views::Of {
            core: &d.core,
            lanes: &d.lanes,
            node: &d.node_name,
        };
        let pipes = ChildPipes(&d.children);
        let cx = Cx {
            cfg: &d.cfg.plugins,
            stopping,
            started: d.started,
            now: Instant::now(),
            pipes: &pipes,
            views: &views,
        };
        f(&mut d.plugins, &cx)
    };
    let mut fx = d.plugins.take_effects();
    super::apply(d, fx.drain(..));
    d.plugins.recycle_effects(fx);
    r
}

/// The views the host reads, for a socket method that shows them
/// (plugin.get's lanes).
pub fn lanes_at_work(d: &Daemon, rec: &store::Record) -> Vec<String> {
    let views = views::Of {
        core: &d.core,
        lanes: &d.lanes,
        node: &d.node_name,
    };
    host::lanes_at_work(&views, rec)
}

/// A key for `req`, which the host hands back with its answer.
pub fn reply_key(d: &mut Daemon, req: Req) -> ReplyKey {
    let st = &mut d.router.plugins;
    st.next_reply += 1;
    let key = ReplyKey(st.next_reply);
    st.replies.insert(key, req);
    key
}

/// The request of `key`, taken back to be answered.
pub fn take_reply(d: &mut Daemon, key: ReplyKey) -> Option<Req> {
    d.router.plugins.replies.remove(&key)
}

/// The machine's isolation probe answered.
pub fn isolation_known(d: &mut Daemon, probe: &crate::isolation::Probe) {
    let hidden = crate::isolation::hidden_for(d);
    with(d, |h, cx| h.isolation_known(probe, hidden, cx));
}

/// A plugin child's pipes produced `out` (or drained its stdin queue).
pub fn on_output(d: &mut Daemon, child: ChildId, out: &Outputs) {
    with(d, |h, cx| h.on_output(child, out, cx));
}

/// A plugin child was reaped.
pub fn on_exit(d: &mut Daemon, child: ChildId, status: ExitStatus) {
    with(d, |h, cx| h.on_exit(child, status, cx));
}

/// The approvals inbox answered a plugin's task request: true when the
/// plugin's call still waited for it.
pub fn task_answered(d: &mut Daemon, rid: &str, verdict: Verdict, by: &Answerer) -> bool {
    with(d, |h, cx| h.on_task_answer(rid, verdict, by, cx))
}

/// A worker's report for the host.
pub fn report(d: &mut Daemon, report: Report) {
    match report {
        Report::Staged { ticket, staged } => {
            let Some((to, installed_by)) = d.plugins.staged(ticket) else {
                return;
            };
            if let Some(req) = take_reply(d, to) {
                crate::socket::methods::plugins::staged(d, req, installed_by, staged);
            }
        }
        Report::Checked { ticket, checked } => {
            let Some((to, a)) = d.plugins.checked_waiting(ticket) else {
                return;
            };
            if let Some(req) = take_reply(d, to) {
                crate::socket::methods::plugins::approve_checked(d, req, a, checked);
            }
        }
        other => with(d, |h, cx| h.on_report(other, cx)),
    }
}

/// The last step of a stop, once the reactor is gone: the records' write
/// that runs is finished, and changes no write has taken yet are written
/// here, so that a stop that ran out of time loses no record.
pub fn finish(d: &mut Daemon) {
    if let Some(w) = &mut d.router.plugins.records {
        w.finish();
    }
    d.plugins.save_at_exit();
}

/// Applies one effect of the host.
pub(super) fn apply(d: &mut Daemon, e: Effect) {
    match e {
        Effect::Spawn { plugin, spec } => {
            let started = match d.plugins.command(&d.cfg.plugins, &spec) {
                Err(why) => Err(why),
                Ok((cmd, pipe_limits)) => d
                    .children
                    .spawn(
                        d.reactor.poll.registry(),
                        &mut d.roots,
                        cmd,
                        Owner::Plugin(plugin.clone()),
                        pipe_limits,
                    )
                    .map_err(|e| crate::children::spawn_error(&spec.main, &e)),
            };
            with(d, |h, cx| h.spawned(&plugin, started, cx));
        }
        Effect::Write { child, bytes } => {
            let written = d.children.write(d.reactor.poll.registry(), child, &bytes);
            if let Err(WriteRefused::Full) = written {
                with(d, |h, _| h.write_refused(child));
            }
        }
        Effect::CloseStdin(child) => d.children.close_stdin(d.reactor.poll.registry(), child),
        Effect::Signal { child, signal } => d.children.signal(child, signal),
        Effect::Reap {
            plugin,
            child,
            status,
        } => {
            d.children.drain_stderr(d.reactor.poll.registry(), child);
            let tail = d.children.stderr_tail(child);
            d.children.remove(d.reactor.poll.registry(), child);
            with(d, |h, cx| h.reaped(&plugin, status, &tail, cx));
        }
        Effect::Timer { key, after } => {
            if let Some(old) = d.router.plugins.timers.remove(&key) {
                d.reactor.cancel(old);
            }
            let fired = key.clone();
            let id = d.reactor.schedule(after, move |d| timer_fired(d, fired));
            d.router.plugins.timers.insert(key, id);
        }
        Effect::CancelTimer(key) => {
            if let Some(id) = d.router.plugins.timers.remove(&key) {
                d.reactor.cancel(id);
            }
        }
        Effect::Ledger {
            mut ops,
            withdraw,
            ack,
        } => {
            for w in withdraw {
                super::sessions::close(
                    d,
                    &w.rid,
                    Verdict::Cancel,
                    Answerer::Daemon(w.why),
                    w.surface,
                    false,
                    None,
                    &mut ops,
                );
            }
            d.write(ops, move |d, r| {
                let r = r.map(|_| ()).map_err(|e| e.to_string());
                with(d, |h, _| h.committed(ack, r));
            });
        }
        Effect::Reply { to, result } => {
            if let Some(req) = take_reply(d, to) {
                d.answer(req, result);
            }
        }
        Effect::Job(job) => start_job(d, job),
        Effect::AddApproval {
            rid,
            task,
            created_ms,
        } => match super::sessions::add_plugin_task(d, &rid, task, created_ms) {
            Ok(()) => d.plugins.inbox_added(&rid),
            Err(e) => with(d, |h, _| h.inbox_refused(&rid, &format!("{e:?}"))),
        },
        Effect::Dispatch { rid, request } => {
            let guard = DropGuard {
                inbox: Some(d.inbox.clone()),
                rid: rid.clone(),
            };
            super::lanes::dispatch(d, request, move |d, res| {
                guard.disarm();
                with(d, |h, cx| h.landed(&rid, tasks::Landing::Answered(res), cx));
            });
        }
        Effect::FreshenLaneHeads => super::lanes::keep_heads_fresh(d),
        Effect::CloseLane { lane } => {
            super::lanes::stop_for_removal(d, &lane);
        }
        Effect::Abort { plugin, rid, how } => {
            let lane = match &how {
                Aborted::Lane(lane) => Some(lane.clone()),
                Aborted::NoLane(_) => None,
                Aborted::CutOff(request) => {
                    let wt = crate::lanes::controller::planned_worktree(&d.cfg.lanes, request);
                    d.lanes
                        .map
                        .values()
                        .find(|l| !l.archived && l.worktree == wt)
                        .map(|l| l.id.clone())
                }
            };
            let (stopped, worktree) = match (lane, how) {
                (Some(lane), _) => {
                    let wt = d.lanes.map.get(&lane).map(|l| l.worktree.clone());
                    (super::lanes::stop_for_removal(d, &lane), wt)
                }
                (None, Aborted::NoLane(Some(r)) | Aborted::CutOff(r)) => (
                    0,
                    Some(crate::lanes::controller::planned_worktree(&d.cfg.lanes, &r)),
                ),
                (None, _) => (0, None),
            };
            with(d, |h, cx| {
                h.abort_landed(&plugin, &rid, stopped, worktree, cx)
            });
        }
        Effect::ReadRequest { to, rid } => {
            let inbox = d.inbox.clone();
            let queued = d.ledger.read(Box::new(move |conn| {
                let row = tasks::read_request(conn, &rid);
                let r = Report::RequestRead { to, row };
                inbox.send(Msg::Report(DaemonReport::Plugins(Box::new(r))));
            }));
            if queued.is_err() {
                let busy = RpcError::new(Code::Unavailable, "the ledger reader is busy; try again");
                if let Some(req) = take_reply(d, to) {
                    d.answer(req, Err(busy));
                }
            }
        }
    }
}

fn timer_fired(d: &mut Daemon, key: TimerKey) {
    d.router.plugins.timers.remove(&key);
    with(d, |h, cx| h.on_timer(key, cx));
}

/// Queues `job` on its worker, starting the worker when it is not running;
/// a job that cannot be queued goes back to the host.
fn start_job(d: &mut Daemon, job: Job) {
    let st = &mut d.router.plugins;
    let (slot, name, bound) = match &job {
        Job::WriteRecords { .. } => (
            &mut st.records,
            "plugin-records",
            limits::PLUGIN_RECORD_WRITES,
        ),
        // Room for every copy in flight and the deletion each may ask for,
        // and for as many approvals' checks; deletions queued beyond that
        // wait for the next start's sweep.
        Job::Stage { .. } | Job::Discard { .. } | Job::CheckWaiting { .. } => (
            &mut st.install,
            "plugin-install",
            3 * limits::PLUGIN_INSTALLS_IN_FLIGHT,
        ),
        // At most one check per installed plugin is in flight, and one
        // count of the watch.
        Job::Hash { .. } | Job::Sample { .. } => (
            &mut st.check,
            "plugin-check",
            limits::PLUGIN_MAX_INSTALLED + 1,
        ),
    };
    if slot.as_ref().is_some_and(store::Worker::stopped) {
        *slot = None;
    }
    if slot.is_none() {
        match store::Worker::spawn(name, bound) {
            Ok(w) => *slot = Some(w),
            Err(e) => {
                let why = format!("unable to start the {name} thread: {e}");
                return with(d, |h, cx| h.job_refused(job, why, cx));
            }
        }
    }
    let back = job.clone();
    let inbox = d.inbox.clone();
    let queued = match slot {
        Some(w) => w.queue(Box::new(move || {
            if let Some(r) = job.run() {
                inbox.send(Msg::Report(DaemonReport::Plugins(Box::new(r))));
            }
        })),
        None => Err(format!("the {name} thread is not running")),
    };
    if let Err(why) = queued {
        if matches!(back, Job::WriteRecords { .. }) {
            *slot = None;
        }
        with(d, |h, cx| h.job_refused(back, why, cx));
    }
}

/// Answers a dispatch whose callback was dropped unanswered (a worker pool
/// that died, a session spawn that gave up): without it the plugin's call
/// would wait for the timeout while counting toward too-many-pending. It
/// never blocks: when the reactor's queue is full, the timeout answers.
struct DropGuard {
    inbox: Option<crate::reactor::Inbox>,
    rid: String,
}

impl DropGuard {
    fn disarm(mut self) {
        self.inbox = None;
    }
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if let Some(inbox) = self.inbox.take() {
            let rid = std::mem::take(&mut self.rid);
            inbox.try_run(move |d| {
                crate::error!("task request {rid}: the dispatch's answer was lost");
                with(d, |h, cx| h.landed(&rid, tasks::Landing::Failed, cx));
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Router;
    use crate::daemon::effects::Effect as DaemonEffect;
    use crate::plugins::effects::{Effect, TimerKey};
    use std::time::Duration;

    #[test]
    fn the_host_s_effects_join_the_router_s_one_queue_in_order() {
        let mut r = Router::default();
        let timer = || Effect::Timer {
            key: TimerKey::Watch,
            after: Duration::from_millis(5),
        };
        assert!(r.enqueue([Effect::CloseStdin(3), timer()].map(DaemonEffect::from)));
        // Applying the first made the host return more: they wait.
        assert_eq!(
            r.next(),
            Some(DaemonEffect::Plugins(Box::new(Effect::CloseStdin(3))))
        );
        assert!(!r.enqueue([DaemonEffect::from(Effect::CancelTimer(TimerKey::Watch))]));
        assert_eq!(r.next(), Some(DaemonEffect::Plugins(Box::new(timer()))));
        assert_eq!(
            r.next(),
            Some(DaemonEffect::Plugins(Box::new(Effect::CancelTimer(
                TimerKey::Watch
            ))))
        );
        assert_eq!(r.next(), None);
    }
}
