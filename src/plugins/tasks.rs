//! Task requests of plugins: tasks.create, tasks.cancel (API 1.1) and
//! plugin.request.get (seed 000; seed 001; issues 4 and 10).
//!
//! tasks.create is checked (permission and params by the host, then here:
//! too-many-pending at 3 unanswered requests, 20 a day, 3 of the hour's 60
//! ledger records), stored in the ledger with the SHA-256 of its params as
//! stored (`digest`, the inbox item's scopeIdentity) under its request id
//! `plugin_<uuid>`, and once stored put in the daemon's approvals inbox
//! under the same id (an `AddApproval` effect, which the router hands to
//! the inbox: high risk, `plugins.task_expiry_ms` (30 minutes), then
//! denied by the timer). The inbox owns the deadline; the operator answers
//! with approvals.answer, and the router hands the inbox's answer to
//! [`Host::on_task_answer`]: a deny answers `approval-denied`, the timer
//! `approval-expired`, and an allow dispatches the request.
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
//! plugin.remove with stopTasks aborts a dispatch in flight (an `Abort`
//! effect, then `Host::abort_landed`): its lane is closed and the call, if
//! anyone still waits, gets `shutting-down`.
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
//!
//! Shape (issue 11): the functions here are methods of the plugin host
//! (`impl Host`), with its context and effects (module comment of
//! [`super::host`]): the request's ledger rows with a typed [`Ack`], the
//! inbox item to add or withdraw (a withdrawal's rows go into the
//! request's own batch), the dispatch as a typed `DispatchRequest` whose
//! `Dispatched` comes back to [`Host::landed`], and its timeout as the
//! host's timer `Dispatch`.

use rusqlite::Connection;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use super::calls::{self, TaskCancelled, TaskRequest};
use super::effects::{Aborted, Ack as HostAck, Cx, Effect, ReplyKey, Saved, TimerKey, Withdraw};
use super::host::Host;
use super::wire::{self, EventKind, HostError, HostErrorKind, PendingState};
use crate::core::inbox::{Answerer, PluginTask, Verdict};
use crate::errors::{Code, RpcError};
use crate::ids::hex;
use crate::lanes::controller::{DispatchRequest, Dispatched};
use crate::ledger::Op;
use crate::limits;

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
    /// An allowed request's dispatch is in flight (its timeout is the
    /// host's timer `Dispatch`).
    pub dispatching: bool,
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

    /// The stored request of `rid` as a dispatch would take it, while it
    /// is in memory.
    pub fn stored_request(&self, rid: &str) -> Option<DispatchRequest> {
        let r = self.by_id.get(rid)?;
        let Ok(Value::Object(m)) = serde_json::from_str::<Value>(&r.params) else {
            return None;
        };
        Some(calls::task_request(&m).ok()?.into())
    }

    /// Whether a request's dispatch is in flight.
    pub fn dispatching(&self, rid: &str) -> bool {
        self.by_id.get(rid).is_some_and(|r| r.dispatching)
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
                .is_some_and(|r| r.state == State::Pending || r.dispatching)
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
            .filter(|r| r.plugin == plugin && (r.state == State::Pending || r.dispatching))
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
        dispatching: false,
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

/// What waits for a ledger batch of the task requests.
#[derive(Debug, Clone, PartialEq)]
pub enum Ack {
    /// tasks.create's request is stored: it goes into the inbox.
    Stored {
        rid: String,
        plugin: String,
        run_no: u64,
        wid: String,
        summary: String,
        created_ms: i64,
    },
    /// A request ended: its call, if one waits, gets `answer`.
    Settled {
        rid: String,
        waiter: Option<(String, String, u64)>,
        answer: Option<Result<Value, HostError>>,
    },
    /// An allowed request is stored `answered`.
    Answered { rid: String },
    /// tasks.cancel withdrew `target`'s request.
    Cancelled {
        rid: String,
        plugin: String,
        run_no: u64,
        wid: String,
        target: String,
    },
    /// The requests of a run that ended are stored orphaned.
    Orphaned,
}

/// How a dispatch ended.
#[derive(Debug)]
pub enum Landing {
    /// The lanes answered: a lane, or the daemon's refusal.
    Answered(Result<Dispatched, RpcError>),
    /// It could not even be asked for, or its answer was lost.
    Failed,
    /// `plugins.task_dispatch_timeout_ms` passed first.
    TimedOut,
}

impl Host {
    /// tasks.create.
    pub(super) fn task_create(
        &mut self,
        plugin: &str,
        run_no: u64,
        wid: &str,
        request: TaskRequest,
        cx: &Cx,
    ) {
        if self.tasks.pending_of(plugin) >= limits::PLUGIN_MAX_PENDING_TASKS {
            let e = HostError::of(HostErrorKind::TooManyPending);
            self.reply(plugin, run_no, wid, Err(e));
            return;
        }
        if let Err(e) = self.take_task_budget(plugin, cx.now) {
            self.reply(plugin, run_no, wid, Err(e));
            return;
        }
        let params = match serde_json::to_string(&request) {
            Ok(p) => p,
            Err(_) => {
                self.reply(plugin, run_no, wid, Err(HostError::internal()));
                return;
            }
        };
        let digest = hex(ring::digest::digest(&ring::digest::SHA256, params.as_bytes()).as_ref());
        let request_id = format!("plugin_{}", crate::ids::uuid_v4());
        let now = crate::clock::now_ms();
        let created_at = crate::clock::format_ts(now);
        let expires_at = crate::clock::format_ts(now + cx.cfg.task_expiry_ms as i64);
        let last_event = self.last_event(plugin);
        let plugin_name = self
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
            dispatching: false,
        };
        let summary = summary(&r.plugin_name, &request);
        // The request counts as pending from now, so a burst cannot pass
        // the limit of 3 while the first ones are being committed.
        self.tasks.insert(r);
        let ack = Ack::Stored {
            rid: request_id,
            plugin: plugin.to_string(),
            run_no,
            wid: wid.to_string(),
            summary,
            created_ms: now,
        };
        self.task_ledger(vec![op], Vec::new(), ack);
    }

    fn task_ledger(&mut self, ops: Vec<Op>, withdraw: Vec<Withdraw>, ack: Ack) {
        self.emit(Effect::Ledger {
            ops,
            withdraw,
            ack: HostAck::Task(ack),
        });
    }

    /// A batch of the task requests committed, or not.
    pub(super) fn task_committed(&mut self, ack: Ack, res: Result<(), String>) {
        match ack {
            Ack::Stored {
                rid,
                plugin,
                run_no,
                wid,
                summary,
                created_ms,
            } => {
                if let Err(e) = res {
                    crate::error!("plugin {plugin}: a task request was not stored: {e}");
                    self.tasks.by_id.remove(&rid);
                    let e = HostError::of(HostErrorKind::Unavailable);
                    self.reply(&plugin, run_no, &wid, Err(e));
                    return;
                }
                // Withdrawn (tasks.cancel, the run ended) while it was
                // committed: it never reaches the inbox.
                let Some(r) = self
                    .tasks
                    .by_id
                    .get(&rid)
                    .filter(|r| r.state == State::Pending)
                else {
                    return;
                };
                let task = PluginTask {
                    plugin,
                    summary,
                    digest: r.digest.clone(),
                };
                self.emit(Effect::AddApproval {
                    rid,
                    task,
                    created_ms,
                });
            }
            Ack::Settled {
                rid,
                waiter,
                answer,
            } => {
                if let Err(e) = res {
                    crate::error!("task request {rid}: its state was not stored: {e}");
                }
                if let (Some((plugin, wid, run_no)), Some(answer)) = (waiter, answer) {
                    let line = answer.and_then(|v| wire::encode_response(&wid, &v));
                    self.reply(&plugin, run_no, &wid, line);
                }
            }
            Ack::Answered { rid } => {
                if let Err(e) = res {
                    crate::error!("task request {rid}: its answer was not stored: {e}");
                }
            }
            Ack::Cancelled {
                rid,
                plugin,
                run_no,
                wid,
                target,
            } => {
                if let Err(e) = res {
                    crate::error!("task request {rid}: its withdrawal was not stored: {e}");
                }
                let e = HostError::of(HostErrorKind::RequestCancelled);
                self.reply(&plugin, run_no, &target, Err(e));
                let line = wire::encode_response(&wid, &TaskCancelled::new(&rid));
                self.reply(&plugin, run_no, &wid, line);
            }
            Ack::Orphaned => {
                if let Err(e) = res {
                    crate::error!("orphaned task requests were not stored: {e}");
                }
            }
        }
    }

    /// The request is in the approvals inbox and waits for the operator.
    pub fn inbox_added(&self, rid: &str) {
        if let Some(r) = self.tasks.by_id.get(rid) {
            crate::info!(
                "plugin {} asks for a task: request {rid} waits for the operator",
                r.plugin
            );
        }
    }

    /// The request could not enter the approvals inbox (`why`).
    pub fn inbox_refused(&mut self, rid: &str, why: &str) {
        let plugin = self.tasks.by_id.get(rid).map(|r| r.plugin.clone());
        crate::error!(
            "plugin {}: task request {rid} could not enter the inbox: {why}",
            plugin.unwrap_or_default()
        );
        let e = HostError::of(HostErrorKind::Unavailable);
        self.settle(rid, State::Orphaned, Some(Err(e)), Vec::new(), Vec::new());
    }

    /// The inbox's answer to a pending request: the timer's is
    /// `approval-expired`, an operator's deny `approval-denied`, an allow
    /// dispatches the request. True when the plugin's call still waited
    /// for it.
    pub fn on_task_answer(
        &mut self,
        request_id: &str,
        verdict: Verdict,
        by: &Answerer,
        cx: &Cx,
    ) -> bool {
        let waiting = self
            .tasks
            .by_id
            .get(request_id)
            .is_some_and(|r| r.state == State::Pending && r.wire.is_some());
        match (verdict, by) {
            (_, Answerer::Timeout) => self.finish(request_id, State::Expired),
            (Verdict::Allow, _) => self.dispatch(request_id, cx),
            (Verdict::Deny, _) => self.finish(request_id, State::Answered),
            (Verdict::Cancel, _) => self.settle(
                request_id,
                State::Orphaned,
                Some(Err(HostError::of(HostErrorKind::Unavailable))),
                Vec::new(),
                Vec::new(),
            ),
        }
        waiting
    }

    /// An allowed request becomes a lane: exactly the stored request is
    /// dispatched (its digest is what the operator approved). The request
    /// is `answered` from this moment (stored so, and refused by
    /// tasks.cancel as `not-pending` `answered`), but its call waits for
    /// the dispatch, which counts toward too-many-pending until it lands,
    /// and is bounded by `plugins.task_dispatch_timeout_ms`. While it is in
    /// flight the request is in the plugin's record (`starting`), so that
    /// plugin.remove and a later start know what a daemon stop cut off.
    fn dispatch(&mut self, request_id: &str, cx: &Cx) {
        let Some(r) = self.tasks.by_id.get_mut(request_id) else {
            return;
        };
        if r.state != State::Pending {
            return;
        }
        r.state = State::Answered;
        r.dispatching = true;
        let plugin = r.plugin.clone();
        let rid = request_id.to_string();
        let stored = self.tasks.stored_request(&rid);
        let bound = Duration::from_millis(cx.cfg.task_dispatch_timeout_ms);
        self.emit(Effect::Timer {
            key: TimerKey::Dispatch { rid: rid.clone() },
            after: bound,
        });
        let ack = Ack::Answered { rid: rid.clone() };
        self.task_ledger(vec![state_op(&rid, State::Answered)], Vec::new(), ack);
        if let Some(p) = self.plugins.get_mut(&plugin) {
            p.rec.starting.retain(|x| x != &rid);
            p.rec.starting.insert(0, rid.clone());
            // Allowed while a removal with stopTasks stops the plugin: that
            // removal aborts this dispatch too.
            if p.rec.removal.is_some() && p.removal.stop_tasks {
                p.removal.aborting.insert(rid.clone());
            }
        }
        self.persist();
        let Some(request) = stored else {
            crate::error!("task request {rid}: the stored request cannot be read back");
            self.landed(&rid, Landing::Failed, cx);
            return;
        };
        self.emit(Effect::Dispatch { rid, request });
    }

    /// A dispatch landed, failed or timed out. The first of these answers
    /// the plugin's call; a lane that starts after its request was already
    /// ended (the timeout answered, the plugin is being removed) is closed
    /// at once, its worktree kept: nobody asked for it any more.
    pub fn landed(&mut self, rid: &str, how: Landing, cx: &Cx) {
        let started = match &how {
            Landing::Answered(Ok(l)) => Some((l.lane.clone(), l.session.clone())),
            _ => None,
        };
        let Some(r) = self.tasks.by_id.get_mut(rid) else {
            if let Some((lane, _)) = started {
                crate::info!("lane {lane}: its task request {rid} is gone; closing it");
                self.emit(Effect::CloseLane { lane });
            }
            return;
        };
        if !std::mem::take(&mut r.dispatching) {
            if let Some((lane, _)) = started {
                crate::info!("lane {lane}: started after its task request {rid} ended; closing it");
                self.emit(Effect::CloseLane { lane });
            }
            return;
        }
        let (plugin, waiter) = (r.plugin.clone(), r.wire.clone());
        self.emit(Effect::CancelTimer(TimerKey::Dispatch {
            rid: rid.to_string(),
        }));
        // A plugin removed with stopTasks has this dispatch aborted: its
        // lane is closed and counted. One removed without (its record is
        // gone, or going) leaves the lane to go on as an ordinary lane.
        let aborted = match self.plugins.get_mut(&plugin) {
            None => false,
            Some(p) => {
                p.rec.starting.retain(|x| x != rid);
                match (&p.rec.removal, &started) {
                    (None, Some((lane, _))) => {
                        // The record keeps the lanes still at work, so it
                        // stays bounded; plugin.get filters again when it
                        // reads.
                        p.rec
                            .lanes
                            .retain(|l| l != lane && cx.views.lane_at_work(l).is_some());
                        p.rec.lanes.insert(0, lane.clone());
                        false
                    }
                    (None, None) => false,
                    (Some(_), _) => p.removal.stop_tasks,
                }
            }
        };
        if aborted {
            let how = match &started {
                Some((lane, _)) => Aborted::Lane(lane.clone()),
                None => Aborted::NoLane(self.tasks.stored_request(rid)),
            };
            self.emit(Effect::Abort {
                plugin: plugin.clone(),
                rid: rid.to_string(),
                how,
            });
        }
        self.persist();
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
                    cx.cfg.task_dispatch_timeout_ms
                );
                Err(HostError::of(HostErrorKind::Unavailable))
            }
        };
        if let Some((wid, run_no)) = waiter {
            let line = answer.and_then(|v| wire::encode_response(&wid, &v));
            // Once the record that lists the lane is on disk (the persist
            // above); a record that could not be written is logged, and the
            // lane is in the ledger either way.
            self.when_saved(Saved::Plugin {
                plugin,
                run_no,
                wid,
                line,
            });
        }
    }

    fn finish(&mut self, request_id: &str, state: State) {
        let error = match state {
            State::Expired => HostError::of(HostErrorKind::ApprovalExpired),
            State::Answered => HostError::of(HostErrorKind::ApprovalDenied),
            State::Cancelled => HostError::of(HostErrorKind::RequestCancelled),
            State::Pending | State::Orphaned => HostError::internal(),
        };
        self.settle(request_id, state, Some(Err(error)), Vec::new(), Vec::new());
    }

    /// Ends a pending request in `state`: stores it with `more` ops (and
    /// the inbox rows of `withdraw`) in one batch, then answers the waiting
    /// call with `answer` (a result's params, or a failure).
    fn settle(
        &mut self,
        request_id: &str,
        state: State,
        answer: Option<Result<Value, HostError>>,
        mut more: Vec<Op>,
        withdraw: Vec<Withdraw>,
    ) {
        let Some(r) = self.tasks.by_id.get_mut(request_id) else {
            return;
        };
        if r.state != State::Pending {
            return;
        }
        r.state = state;
        let waiter = r
            .wire
            .clone()
            .map(|(wid, run_no)| (r.plugin.clone(), wid, run_no));
        more.insert(0, state_op(request_id, state));
        let ack = Ack::Settled {
            rid: request_id.to_string(),
            waiter,
            answer,
        };
        self.task_ledger(more, withdraw, ack);
    }

    /// tasks.cancel (API 1.1).
    pub(super) fn task_cancel(&mut self, plugin: &str, run_no: u64, wid: &str, target: &str) {
        let mine = |r: &&Request| {
            r.plugin == plugin
                && r.wire
                    .as_ref()
                    .is_some_and(|(w, g)| w == target && *g == run_no)
        };
        let found = self
            .tasks
            .by_id
            .values()
            .filter(mine)
            .max_by(|a, b| a.created_at.cmp(&b.created_at))
            .map(|r| (r.request_id.clone(), r.state));
        let state = match found {
            Some((rid, State::Pending)) => {
                let Some(r) = self.tasks.by_id.get_mut(&rid) else {
                    return;
                };
                r.state = State::Cancelled;
                let ops = vec![state_op(&rid, State::Cancelled)];
                let withdraw = vec![Withdraw {
                    rid: rid.clone(),
                    why: "the plugin withdrew it".into(),
                    surface: "plugin",
                }];
                let ack = Ack::Cancelled {
                    rid,
                    plugin: plugin.to_string(),
                    run_no,
                    wid: wid.to_string(),
                    target: target.to_string(),
                };
                self.task_ledger(ops, withdraw, ack);
                return;
            }
            // A request the daemon withdrew (its inbox item could not be
            // made, or was withdrawn) already got its answer,
            // `unavailable`: `answered`, never `cancelled`, which only the
            // plugin does.
            Some((_, State::Answered | State::Orphaned)) => PendingState::Answered,
            Some((_, State::Expired)) => PendingState::Expired,
            Some((_, State::Cancelled)) => PendingState::Cancelled,
            None => PendingState::Unknown,
        };
        let e = HostError::of(HostErrorKind::NotPending(state));
        self.reply(plugin, run_no, wid, Err(e));
    }

    /// A run ended: its pending requests have nobody to answer, and leave
    /// the inbox.
    pub(super) fn orphan_run(&mut self, plugin: &str, run_no: u64) {
        let ids: Vec<String> = self
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
        let mut withdraw = Vec::new();
        for id in ids {
            if let Some(r) = self.tasks.by_id.get_mut(&id) {
                r.state = State::Orphaned;
                r.wire = None;
                ops.push(state_op(&id, State::Orphaned));
                withdraw.push(Withdraw {
                    rid: id,
                    why: "the plugin's run ended".into(),
                    surface: "daemon",
                });
            }
        }
        if !ops.is_empty() {
            self.task_ledger(ops, withdraw, Ack::Orphaned);
        }
    }

    /// plugin.request.get: from memory, or from the ledger for an old one
    /// ([`Self::request_read`] answers then).
    pub fn task_get(&mut self, to: ReplyKey, request_id: String) {
        if let Some(r) = self.tasks.by_id.get(&request_id) {
            let name = self.plugins.get(&r.plugin).map(|p| p.name());
            let v = result_of(r, name);
            self.reply_to(to, Ok(v));
            return;
        }
        self.emit(Effect::ReadRequest {
            to,
            rid: request_id,
        });
    }

    /// An old request as the ledger has it (`None`: no such request).
    pub fn request_read(&mut self, to: ReplyKey, row: Option<Request>) {
        let answer = match row {
            Some(mut r) => {
                if r.state == State::Pending {
                    r.state = State::Orphaned;
                }
                let name = self
                    .plugins
                    .get(&r.plugin)
                    .map(|p| p.name())
                    .or(Some(r.plugin_name.clone()));
                Ok(result_of(&r, name))
            }
            None => Err(RpcError::new(Code::NotFound, "no such request")),
        };
        self.reply_to(to, answer);
    }
}

/// Reads one stored request (plugin.request.get of an old one), on the
/// ledger's reader.
pub fn read_request(conn: &Connection, request_id: &str) -> Option<Request> {
    conn.query_row(
        "SELECT request_id, plugin, plugin_name, params, digest, last_event, state, created_at, expires_at FROM plugin_requests WHERE request_id = ?1",
        [request_id],
        row_to_request,
    )
    .ok()
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
