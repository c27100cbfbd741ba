//! Task requests of plugins: tasks.create, tasks.cancel (API 1.1) and
//! plugin.request.get (seed 000; seed 001; issues 4 and 10).
//!
//! tasks.create is checked (permission and params by the host, then here:
//! too-many-pending at 3 unanswered requests, 20 a day, 3 of the hour's 60
//! ledger records), stored in the ledger with the SHA-256 of its params as
//! stored (`digest`, the inbox item's scopeIdentity) under its request id
//! `plugin_<uuid>`, and once stored put in the daemon's approvals inbox
//! under the same id (`core::approvals::add_plugin_task`: high risk,
//! `plugins.task_expiry_ms` (30 minutes), then denied by the timer). The
//! inbox owns the deadline; the operator answers with approvals.answer, and
//! the inbox calls [`on_answer`]: a deny answers `approval-denied`, the
//! timer `approval-expired`, and an allow goes to [`resolve`].
//!
//! An allow makes the request `answered` at once, in memory and in the
//! ledger: from then on it is not pending (plugin.request.get says
//! `answered`, tasks.cancel fails `not-pending` `answered`: seed 001,
//! "promotion wins and cancellation exposes the conflict"). Its call waits
//! for the dispatch of exactly the stored request as a lane, which answers
//! `{requestId, lane, session}`, `task-refused` whose reason is the
//! daemon's own code for the refused dispatch (repo-unknown, same-family,
//! isolation-missing, ...), or `unavailable` for a dispatch that failed
//! without a code (the page's words), whose callback was dropped, or that
//! passed `plugins.task_dispatch_timeout_ms` ("up to 15 more [minutes] for
//! the dispatch"). Until it lands the dispatch counts toward
//! too-many-pending and is in the plugin's record (`starting`); a lane that
//! starts after its request ended is closed at once, its worktree kept.
//! plugin.remove with stopTasks aborts a dispatch in flight
//! (`host::dispatch_aborted`): its lane is closed and the call, if anyone
//! still waits, gets `shutting-down`.
//!
//! tasks.cancel `{id}` names the wire id of the plugin's own tasks.create
//! request in this run. A pending one is withdrawn: the tasks.create call
//! fails with `request-cancelled`, and tasks.cancel answers `{requestId,
//! cancelled: true}`. Otherwise it fails with `not-pending` and
//! `data.state`: `answered` (also for a request the daemon withdrew itself,
//! `orphaned`: its call already got `unavailable`, and only the plugin
//! cancels), `expired`, `cancelled`, or `unknown` (no such request in this
//! run).
//!
//! Decided where the page is silent (also in omniconflux-plugin(7)): a
//! verifier or builder seat of family `auto` is refused as `same-family`
//! (the lanes' check): the page promises a verifier of another provider
//! family than the builder's, which the daemon cannot know of an `auto`
//! seat.
//!
//! This table and the inbox change together, in the same reactor step, so
//! that plugin.request.get and approvals.get agree: `pending` while the
//! inbox item is pending; `answered` once the operator allowed or denied it;
//! `expired` once the timer denied it; `orphaned` when nobody waits for the
//! answer any more (the plugin withdrew it, or its run ended: the inbox item
//! is withdrawn, delivered false; or the daemon restarted: the inbox
//! withdraws what the last run left pending).

use rusqlite::Connection;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use super::calls::{self, TaskCancelled, TaskRequest};
use super::host;
use super::wire::{self, EventKind, HostError, HostErrorKind, PendingState};
use crate::core::inbox::{Answerer, PluginTask, Verdict};
use crate::daemon::{Daemon, Req};
use crate::errors::{Code, RpcError};
use crate::ids::hex;
use crate::lanes::controller::{DispatchRequest, Dispatched};
use crate::ledger::Op;
use crate::limits;
use crate::reactor::TimerId;

/// Where a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Pending,
    Answered,
    Expired,
    Cancelled,
    Orphaned,
}

impl State {
    /// plugin.request.get's state.
    pub fn inbox_name(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Answered => "answered",
            State::Expired => "expired",
            State::Cancelled | State::Orphaned => "orphaned",
        }
    }

    fn parse(s: &str) -> State {
        match s {
            "pending" => State::Pending,
            "answered" => State::Answered,
            "expired" => State::Expired,
            "cancelled" => State::Cancelled,
            _ => State::Orphaned,
        }
    }

    fn stored(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Answered => "answered",
            State::Expired => "expired",
            State::Cancelled => "cancelled",
            State::Orphaned => "orphaned",
        }
    }
}

/// One task request.
#[derive(Debug, Clone)]
pub struct Request {
    pub request_id: String,
    pub plugin: String,
    pub plugin_name: String,
    /// The plugin's wire id and run, while it waits for the answer.
    pub wire: Option<(String, u64)>,
    pub params: String,
    pub digest: String,
    pub last_event: Option<(EventKind, String)>,
    pub state: State,
    pub created_at: String,
    pub expires_at: String,
    /// The dispatch's timeout while an allowed request's dispatch is in
    /// flight.
    pub dispatching: Option<TimerId>,
}

/// The requests in memory: every pending one and the latest finished ones.
#[derive(Default)]
pub struct Table {
    pub by_id: HashMap<String, Request>,
    order: VecDeque<String>,
}

/// How many finished requests stay in memory; older ones are read from the
/// ledger by plugin.request.get.
const KEEP_FINISHED: usize = 1024;

impl Table {
    /// Loads the stored requests; those a stop cut off are orphaned.
    pub fn load(&mut self, conn: &Connection) {
        let Ok(mut stmt) = conn.prepare(
            "SELECT request_id, plugin, plugin_name, params, digest, last_event, state, created_at, expires_at FROM plugin_requests ORDER BY created_at DESC LIMIT 1024",
        ) else {
            return;
        };
        let rows = stmt.query_map([], row_to_request);
        if let Ok(rows) = rows {
            for mut r in rows.flatten() {
                if r.state == State::Pending {
                    r.state = State::Orphaned;
                }
                self.order.push_front(r.request_id.clone());
                self.by_id.insert(r.request_id.clone(), r);
            }
        }
    }

    fn insert(&mut self, r: Request) {
        self.order.push_back(r.request_id.clone());
        self.by_id.insert(r.request_id.clone(), r);
        while self.order.len() > KEEP_FINISHED {
            let Some(old) = self.order.front().cloned() else {
                break;
            };
            if self
                .by_id
                .get(&old)
                .is_some_and(|r| r.state == State::Pending || r.dispatching.is_some())
            {
                break;
            }
            self.order.pop_front();
            self.by_id.remove(&old);
        }
    }

    /// The plugin's unanswered task requests: those waiting for the
    /// operator and those whose dispatch is in flight.
    fn pending_of(&self, plugin: &str) -> usize {
        self.by_id
            .values()
            .filter(|r| {
                r.plugin == plugin && (r.state == State::Pending || r.dispatching.is_some())
            })
            .count()
    }
}

fn row_to_request(r: &rusqlite::Row) -> rusqlite::Result<Request> {
    let last: Option<String> = r.get(5)?;
    let last_event = last.and_then(|t| {
        let v: Value = serde_json::from_str(&t).ok()?;
        Some((
            EventKind::from_name(v["kind"].as_str()?)?,
            v["subject"].as_str()?.to_string(),
        ))
    });
    Ok(Request {
        request_id: r.get(0)?,
        plugin: r.get(1)?,
        plugin_name: r.get(2)?,
        wire: None,
        params: r.get(3)?,
        digest: r.get(4)?,
        last_event,
        state: State::parse(&r.get::<_, String>(6)?),
        created_at: r.get(7)?,
        expires_at: r.get(8)?,
        dispatching: None,
    })
}

fn state_op(request_id: &str, state: State) -> Op {
    Op::Exec {
        sql: "UPDATE plugin_requests SET state = ?2 WHERE request_id = ?1",
        params: vec![
            request_id.to_string().into(),
            state.stored().to_string().into(),
        ],
    }
}

/// tasks.create.
pub fn create(d: &mut Daemon, plugin: &str, run_no: u64, wid: &str, request: TaskRequest) {
    if d.plugins.tasks.pending_of(plugin) >= limits::PLUGIN_MAX_PENDING_TASKS {
        host::reply(
            d,
            plugin,
            run_no,
            wid,
            Err(HostError::of(HostErrorKind::TooManyPending)),
        );
        return;
    }
    if let Err(e) = host::take_task_budget(d, plugin) {
        host::reply(d, plugin, run_no, wid, Err(e));
        return;
    }
    let params = match serde_json::to_string(&request) {
        Ok(p) => p,
        Err(_) => {
            host::reply(d, plugin, run_no, wid, Err(HostError::internal()));
            return;
        }
    };
    let digest = hex(ring::digest::digest(&ring::digest::SHA256, params.as_bytes()).as_ref());
    let request_id = format!("plugin_{}", crate::ids::uuid_v4());
    let now = crate::clock::now_ms();
    let created_at = crate::clock::format_ts(now);
    let expires_at = crate::clock::format_ts(now + d.cfg.plugins.task_expiry_ms as i64);
    let last_event = host::last_event(d, plugin);
    let plugin_name = d
        .plugins
        .plugins
        .get(plugin)
        .map(|p| p.name())
        .unwrap_or_else(|| plugin.to_string());
    let last_json = last_event
        .as_ref()
        .map(|(k, s)| json!({"kind": k.name(), "subject": s}).to_string());
    let op = Op::Exec {
        sql: "INSERT INTO plugin_requests (request_id, plugin, plugin_name, params, digest, last_event, state, created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', ?7, ?8)",
        params: vec![
            request_id.clone().into(),
            plugin.to_string().into(),
            plugin_name.clone().into(),
            params.clone().into(),
            digest.clone().into(),
            last_json
                .map(Into::into)
                .unwrap_or(rusqlite::types::Value::Null),
            created_at.clone().into(),
            expires_at.clone().into(),
        ],
    };
    let r = Request {
        request_id: request_id.clone(),
        plugin: plugin.to_string(),
        plugin_name,
        wire: Some((wid.to_string(), run_no)),
        params,
        digest,
        last_event,
        state: State::Pending,
        created_at,
        expires_at,
        dispatching: None,
    };
    let summary = summary(&r.plugin_name, &request);
    // The request counts as pending from now, so a burst cannot pass the
    // limit of 3 while the first ones are being committed.
    d.plugins.tasks.insert(r);
    let (owner, wid) = (plugin.to_string(), wid.to_string());
    d.write(vec![op], move |d, res| {
        if let Err(e) = res {
            crate::error!("plugin {owner}: a task request was not stored: {e:?}");
            d.plugins.tasks.by_id.remove(&request_id);
            host::reply(
                d,
                &owner,
                run_no,
                &wid,
                Err(HostError::of(HostErrorKind::Unavailable)),
            );
            return;
        }
        // Withdrawn (tasks.cancel, the run ended) while it was committed:
        // it never reaches the inbox.
        let Some(r) = d
            .plugins
            .tasks
            .by_id
            .get(&request_id)
            .filter(|r| r.state == State::Pending)
        else {
            return;
        };
        let task = PluginTask {
            plugin: owner.clone(),
            summary,
            digest: r.digest.clone(),
        };
        if let Err(e) = crate::daemon::router::sessions::add_plugin_task(d, &request_id, task, now)
        {
            crate::error!(
                "plugin {owner}: task request {request_id} could not enter the inbox: {e:?}"
            );
            settle(
                d,
                &request_id,
                State::Orphaned,
                Some(Err(HostError::of(HostErrorKind::Unavailable))),
                Vec::new(),
            );
            return;
        }
        crate::info!("plugin {owner} asks for a task: request {request_id} waits for the operator");
    });
}

/// The inbox item's one line: the plugin's name, the repository, and the
/// task's name or the first line of its text, cut to
/// `PLUGIN_TASK_SUMMARY_MAX_CHARS`.
fn summary(plugin_name: &str, t: &TaskRequest) -> String {
    let title = t
        .name
        .as_deref()
        .unwrap_or_else(|| t.task.lines().next().unwrap_or_default());
    let full = format!("{plugin_name}: {title} in {}", t.repo);
    if full.chars().count() <= limits::PLUGIN_TASK_SUMMARY_MAX_CHARS {
        return full;
    }
    let mut cut: String = full
        .chars()
        .take(limits::PLUGIN_TASK_SUMMARY_MAX_CHARS - 1)
        .collect();
    cut.push('…');
    cut
}

/// The inbox's answer to a pending request (the router's `settle`):
/// the timer's is `approval-expired`, an operator's deny `approval-denied`,
/// an allow goes to [`resolve`]. True when the plugin's call still waited
/// for it.
pub fn on_answer(d: &mut Daemon, request_id: &str, verdict: Verdict, by: &Answerer) -> bool {
    let waiting = d
        .plugins
        .tasks
        .by_id
        .get(request_id)
        .is_some_and(|r| r.state == State::Pending && r.wire.is_some());
    match (verdict, by) {
        (_, Answerer::Timeout) => finish(d, request_id, State::Expired),
        (Verdict::Allow, _) => resolve(d, request_id, true),
        (Verdict::Deny, _) => resolve(d, request_id, false),
        (Verdict::Cancel, _) => settle(
            d,
            request_id,
            State::Orphaned,
            Some(Err(HostError::of(HostErrorKind::Unavailable))),
            Vec::new(),
        ),
    }
    waiting
}

/// The operator's answer to a request: see the module comment.
pub fn resolve(d: &mut Daemon, request_id: &str, allowed: bool) {
    if !allowed {
        finish(d, request_id, State::Answered);
        return;
    }
    dispatch(d, request_id);
}

/// An allowed request becomes a lane: exactly the stored request is
/// dispatched (its digest is what the operator approved). The request is
/// `answered` from this moment (stored so, and refused by tasks.cancel as
/// `not-pending` `answered`), but its call waits for the dispatch, which
/// counts toward too-many-pending until it lands, and is bounded by
/// `plugins.task_dispatch_timeout_ms`. While it is in flight the request is
/// in the plugin's record (`starting`), so that plugin.remove and a later
/// start know what a daemon stop cut off.
fn dispatch(d: &mut Daemon, request_id: &str) {
    let Some(r) = d.plugins.tasks.by_id.get_mut(request_id) else {
        return;
    };
    if r.state != State::Pending {
        return;
    }
    r.state = State::Answered;
    let plugin = r.plugin.clone();
    let stored = match serde_json::from_str::<Value>(&r.params) {
        Ok(Value::Object(m)) => calls::task_request(&m).ok().map(DispatchRequest::from),
        _ => None,
    };
    let rid = request_id.to_string();
    let bound = Duration::from_millis(d.cfg.plugins.task_dispatch_timeout_ms);
    let again = rid.clone();
    let timer = d
        .reactor
        .schedule(bound, move |d| landed(d, &again, Landing::TimedOut));
    if let Some(r) = d.plugins.tasks.by_id.get_mut(&rid) {
        r.dispatching = Some(timer);
    }
    let stored_rid = rid.clone();
    d.write(vec![state_op(&rid, State::Answered)], move |_, res| {
        if let Err(e) = res {
            crate::error!("task request {stored_rid}: its answer was not stored: {e:?}");
        }
    });
    if let Some(p) = d.plugins.plugins.get_mut(&plugin) {
        p.rec.starting.retain(|x| x != &rid);
        p.rec.starting.insert(0, rid.clone());
        // Allowed while a removal with stopTasks stops the plugin: that
        // removal aborts this dispatch too.
        if p.rec.removal.is_some() && p.removal.stop_tasks {
            p.removal.aborting.insert(rid.clone());
        }
    }
    host::persist(d);
    let Some(task) = stored else {
        crate::error!("task request {rid}: the stored request cannot be read back");
        landed(d, &rid, Landing::Failed);
        return;
    };
    let guard = DropGuard {
        inbox: Some(d.inbox.clone()),
        rid: rid.clone(),
    };
    crate::daemon::router::lanes::dispatch(d, task, move |d, res| {
        guard.disarm();
        landed(d, &rid, Landing::Answered(res));
    });
}

/// How a dispatch ended.
enum Landing {
    /// The lanes answered: a lane, or the daemon's refusal.
    Answered(Result<Dispatched, RpcError>),
    /// It could not even be asked for, or its answer was lost.
    Failed,
    /// `plugins.task_dispatch_timeout_ms` passed first.
    TimedOut,
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
                landed(d, &rid, Landing::Failed);
            });
        }
    }
}

/// A dispatch landed, failed or timed out. The first of these answers the
/// plugin's call; a lane that starts after its request was already ended
/// (the timeout answered, the plugin is being removed) is closed at once,
/// its worktree kept: nobody asked for it any more.
fn landed(d: &mut Daemon, rid: &str, how: Landing) {
    let started = match &how {
        Landing::Answered(Ok(l)) => Some((l.lane.clone(), l.session.clone())),
        _ => None,
    };
    let Some(r) = d.plugins.tasks.by_id.get_mut(rid) else {
        if let Some((lane, _)) = &started {
            crate::info!("lane {lane}: its task request {rid} is gone; closing it");
            crate::daemon::router::lanes::stop_for_removal(d, lane);
        }
        return;
    };
    let Some(timer) = r.dispatching.take() else {
        if let Some((lane, _)) = &started {
            crate::info!("lane {lane}: started after its task request {rid} ended; closing it");
            crate::daemon::router::lanes::stop_for_removal(d, lane);
        }
        return;
    };
    d.reactor.cancel(timer);
    let (plugin, waiter) = (r.plugin.clone(), r.wire.clone());
    // A plugin removed with stopTasks has this dispatch aborted: its lane
    // is closed and counted. One removed without (its record is gone, or
    // going) leaves the lane to go on as an ordinary lane.
    let aborted = match d.plugins.plugins.get_mut(&plugin) {
        None => false,
        Some(p) => {
            p.rec.starting.retain(|x| x != rid);
            match (&p.rec.removal, &started) {
                (None, Some((lane, _))) => {
                    // The record keeps the lanes still at work, so it stays
                    // bounded; plugin.get filters again when it reads.
                    let lanes = &d.lanes.map;
                    p.rec
                        .lanes
                        .retain(|l| l != lane && lanes.get(l).is_some_and(host::lane_at_work));
                    p.rec.lanes.insert(0, lane.clone());
                    false
                }
                (None, None) => false,
                (Some(_), _) => p.removal.stop_tasks,
            }
        }
    };
    if aborted {
        host::dispatch_aborted(d, &plugin, rid, started.as_ref().map(|(l, _)| l.as_str()));
    }
    host::persist(d);
    let answer = match (how, started) {
        _ if aborted => Err(HostError::of(HostErrorKind::ShuttingDown)),
        (Landing::Answered(Ok(Dispatched { lane, session, .. })), _) => {
            crate::info!("task request {rid}: dispatched as lane {lane}");
            serde_json::to_value(calls::TaskStarted {
                request_id: rid.to_string(),
                lane,
                session,
            })
            .map_err(|_| HostError::internal())
        }
        (Landing::Answered(Err(e)), _)
            if matches!(e.code, Code::Unavailable | Code::InternalError) =>
        {
            crate::warn!("task request {rid}: the dispatch failed: {}", e.message);
            Err(HostError::of(HostErrorKind::Unavailable))
        }
        (Landing::Answered(Err(e)), _) => {
            crate::info!(
                "task request {rid}: the daemon refused the task: {}",
                e.code.as_str()
            );
            Err(HostError::of(HostErrorKind::TaskRefused(
                e.code.as_str().into(),
            )))
        }
        (Landing::Failed, _) => Err(HostError::of(HostErrorKind::Unavailable)),
        (Landing::TimedOut, _) => {
            crate::warn!(
                "task request {rid}: the dispatch did not end in {} ms; answered unavailable",
                d.cfg.plugins.task_dispatch_timeout_ms
            );
            Err(HostError::of(HostErrorKind::Unavailable))
        }
    };
    if let Some((wid, run_no)) = waiter {
        let line = answer.and_then(|v| wire::encode_response(&wid, &v));
        // Once the record that lists the lane is on disk (host::persist
        // above); a record that could not be written is logged, and the
        // lane is in the ledger either way.
        host::when_saved(d, move |d, _| host::reply(d, &plugin, run_no, &wid, line));
    }
}

/// Whether a request's dispatch is in flight.
pub fn dispatching(d: &Daemon, rid: &str) -> bool {
    d.plugins
        .tasks
        .by_id
        .get(rid)
        .is_some_and(|r| r.dispatching.is_some())
}

/// The stored request of `rid` as a dispatch would take it, and when it
/// was made, when it is still in memory.
pub fn stored_request(d: &Daemon, rid: &str) -> Option<(DispatchRequest, String)> {
    let r = d.plugins.tasks.by_id.get(rid)?;
    let Ok(Value::Object(m)) = serde_json::from_str::<Value>(&r.params) else {
        return None;
    };
    Some((calls::task_request(&m).ok()?.into(), r.created_at.clone()))
}

fn finish(d: &mut Daemon, request_id: &str, state: State) {
    let error = match state {
        State::Expired => HostError::of(HostErrorKind::ApprovalExpired),
        State::Answered => HostError::of(HostErrorKind::ApprovalDenied),
        State::Cancelled => HostError::of(HostErrorKind::RequestCancelled),
        State::Pending | State::Orphaned => HostError::internal(),
    };
    settle(d, request_id, state, Some(Err(error)), Vec::new());
}

/// Ends a pending request in `state`: stores it with `more` ops in one
/// batch, then answers the waiting call with `answer` (a result's params,
/// or a failure).
fn settle(
    d: &mut Daemon,
    request_id: &str,
    state: State,
    answer: Option<Result<Value, HostError>>,
    mut more: Vec<Op>,
) {
    let Some(r) = d.plugins.tasks.by_id.get_mut(request_id) else {
        return;
    };
    if r.state != State::Pending {
        return;
    }
    r.state = state;
    let waiter = r.wire.clone().map(|w| (r.plugin.clone(), w));
    let rid = request_id.to_string();
    more.insert(0, state_op(request_id, state));
    d.write(more, move |d, res| {
        if let Err(e) = res {
            crate::error!("task request {rid}: its state was not stored: {e:?}");
        }
        if let (Some((plugin, (wid, run_no))), Some(answer)) = (waiter, answer) {
            let line = answer.and_then(|v| wire::encode_response(&wid, &v));
            host::reply(d, &plugin, run_no, &wid, line);
        }
    });
}

/// Withdraws the inbox item of a request nobody waits for any more; its
/// ledger row goes into the request's own batch.
fn withdraw(d: &mut Daemon, request_id: &str, why: &str, surface: &'static str) -> Vec<Op> {
    let mut ops = Vec::new();
    crate::daemon::router::sessions::close(
        d,
        request_id,
        Verdict::Cancel,
        Answerer::Daemon(why.to_string()),
        surface,
        false,
        None,
        &mut ops,
    );
    ops
}

/// tasks.cancel (API 1.1).
pub fn cancel(d: &mut Daemon, plugin: &str, run_no: u64, wid: &str, target: &str) {
    let mine = |r: &&Request| {
        r.plugin == plugin
            && r.wire
                .as_ref()
                .is_some_and(|(w, g)| w == target && *g == run_no)
    };
    let found = d
        .plugins
        .tasks
        .by_id
        .values()
        .filter(mine)
        .max_by(|a, b| a.created_at.cmp(&b.created_at))
        .map(|r| (r.request_id.clone(), r.state));
    match found {
        Some((rid, State::Pending)) => {
            let Some(r) = d.plugins.tasks.by_id.get_mut(&rid) else {
                return;
            };
            r.state = State::Cancelled;
            let mut ops = withdraw(d, &rid, "the plugin withdrew it", "plugin");
            ops.insert(0, state_op(&rid, State::Cancelled));
            let (owner, wid, target) = (plugin.to_string(), wid.to_string(), target.to_string());
            d.write(ops, move |d, res| {
                if let Err(e) = res {
                    crate::error!("task request {rid}: its withdrawal was not stored: {e:?}");
                }
                host::reply(
                    d,
                    &owner,
                    run_no,
                    &target,
                    Err(HostError::of(HostErrorKind::RequestCancelled)),
                );
                let line = wire::encode_response(&wid, &TaskCancelled::new(&rid));
                host::reply(d, &owner, run_no, &wid, line);
            });
        }
        Some((_, state)) => {
            // A request the daemon withdrew (its inbox item could not be
            // made, or was withdrawn) already got its answer, `unavailable`:
            // `answered`, never `cancelled`, which only the plugin does.
            let s = match state {
                State::Answered | State::Orphaned => PendingState::Answered,
                State::Expired => PendingState::Expired,
                State::Cancelled => PendingState::Cancelled,
                State::Pending => PendingState::Unknown,
            };
            host::reply(
                d,
                plugin,
                run_no,
                wid,
                Err(HostError::of(HostErrorKind::NotPending(s))),
            );
        }
        None => host::reply(
            d,
            plugin,
            run_no,
            wid,
            Err(HostError::of(HostErrorKind::NotPending(
                PendingState::Unknown,
            ))),
        ),
    }
}

/// A run ended: its pending requests have nobody to answer, and leave the
/// inbox.
pub fn orphan_run(d: &mut Daemon, plugin: &str, run_no: u64) {
    let ids: Vec<String> = d
        .plugins
        .tasks
        .by_id
        .values()
        .filter(|r| {
            r.plugin == plugin
                && r.state == State::Pending
                && r.wire.as_ref().is_some_and(|(_, g)| *g == run_no)
        })
        .map(|r| r.request_id.clone())
        .collect();
    let mut ops = Vec::new();
    for id in ids {
        if let Some(r) = d.plugins.tasks.by_id.get_mut(&id) {
            r.state = State::Orphaned;
            r.wire = None;
            ops.push(state_op(&id, State::Orphaned));
            ops.extend(withdraw(d, &id, "the plugin's run ended", "daemon"));
        }
    }
    if !ops.is_empty() {
        d.write(ops, |_, res| {
            if let Err(e) = res {
                crate::error!("orphaned task requests were not stored: {e:?}");
            }
        });
    }
}

/// plugin.request.get's result for a request.
fn result_of(r: &Request, plugin_name: Option<String>) -> Value {
    let last = r.last_event.as_ref().map(|(k, s)| {
        if k.is_lane() {
            json!({"kind": k.name(), "lane": s})
        } else {
            json!({"kind": k.name(), "session": s})
        }
    });
    json!({
        "requestId": r.request_id,
        "plugin": r.plugin,
        "pluginName": plugin_name.unwrap_or_else(|| r.plugin.clone()),
        "call": "tasks.create",
        "params": serde_json::from_str::<Value>(&r.params).unwrap_or(Value::Null),
        "digest": r.digest,
        "lastEvent": last,
        "state": r.state.inbox_name(),
        "createdAt": r.created_at,
        "expiresAt": r.expires_at,
    })
}

/// plugin.request.get: from memory, or from the ledger for an old one.
pub fn get(d: &mut Daemon, req: Req, request_id: String) {
    if let Some(r) = d.plugins.tasks.by_id.get(&request_id) {
        let name = d.plugins.plugins.get(&r.plugin).map(|p| p.name());
        let v = result_of(r, name);
        d.answer(req, Ok(v));
        return;
    }
    let inbox = d.inbox.clone();
    let again = req.clone();
    let queued = d.ledger.read(Box::new(move |conn| {
        let row = conn
            .query_row(
                "SELECT request_id, plugin, plugin_name, params, digest, last_event, state, created_at, expires_at FROM plugin_requests WHERE request_id = ?1",
                [&request_id],
                row_to_request,
            )
            .ok();
        inbox.run(move |d| {
            let answer = match row {
                Some(mut r) => {
                    if r.state == State::Pending {
                        r.state = State::Orphaned;
                    }
                    let name = d.plugins.plugins.get(&r.plugin).map(|p| p.name()).or(Some(r.plugin_name.clone()));
                    Ok(result_of(&r, name))
                }
                None => Err(RpcError::new(Code::NotFound, "no such request")),
            };
            d.answer(req, answer);
        });
    }));
    if queued.is_err() {
        d.answer(
            again,
            Err(RpcError::new(
                Code::Unavailable,
                "the ledger reader is busy; try again",
            )),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::summary;
    use crate::limits;
    use crate::plugins::calls::{Acceptance, TaskRequest};

    fn request(task: &str, name: Option<&str>) -> TaskRequest {
        TaskRequest {
            repo: "/srv/work/shop".into(),
            task: task.into(),
            builder: "claude".into(),
            verifier: "codex".into(),
            acceptance: Acceptance {
                name: "unit tests".into(),
                command: "npm test".into(),
            },
            name: name.map(str::to_string),
            base: None,
        }
    }

    #[test]
    fn the_summary_names_the_plugin_the_task_and_the_repo_and_is_bounded() {
        assert_eq!(
            summary("Night Shift", &request("Fix it.\nThen test it.", None)),
            "Night Shift: Fix it. in /srv/work/shop"
        );
        assert_eq!(
            summary("Night Shift", &request("Fix it.", Some("login fix"))),
            "Night Shift: login fix in /srv/work/shop"
        );
        let long = summary("Night Shift", &request(&"é".repeat(4000), None));
        assert_eq!(long.chars().count(), limits::PLUGIN_TASK_SUMMARY_MAX_CHARS);
        assert!(long.ends_with('…'));
    }
}
