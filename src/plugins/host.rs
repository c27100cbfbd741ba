//! The plugin host: every installed plugin's record and run, the wire
//! exchange with each plugin process, its limits and its faults (seed 000;
//! issue 4). Owned by the reactor thread as `Daemon::plugins`; every
//! function here runs there, one event at a time.
//!
//! A run: spawn ([`super::process`]) → `initialize` (the plugin's requests
//! get `not-initialized` until it answers) → `running`, with a `ping` every
//! `plugins.ping_interval_ms` → a stop: `shutdown {reason}`, stdin closed,
//! SIGTERM to the process group 2 s later, SIGKILL 3 s after that. A fault
//! ends the run at once with SIGKILL to the group, is counted as a crash,
//! and the plugin is `restarting` with the fault as reason until its restart
//! (1 s, doubled per crash in the last 10 minutes, at most 60 s), or
//! `failed` with `crash-limit` after `plugins.crash_limit` crashes in 10
//! minutes, or with `run-limit` when `plugins.max_running` plugins run.
//!
//! The plugin's requests are checked in this order: the id is not in use
//! (`invalid-request`), the plugin is not being stopped (`shutting-down`),
//! it answered initialize (`not-initialized`), fewer than 16 of its requests
//! are unanswered (`busy`), its budget of 50 a second and 200 at once has a
//! token (`rate-limited`), the call's permission (`permission-denied`), the
//! params (`invalid-params`), then the call's own limits.
//!
//! Decisions where the page is silent (also in omniconflux-plugin(7)):
//! - Faults: `exit` an exit the host did not ask for after initialize;
//!   `load-refused` an exit before the answer to initialize (the runtime
//!   refused main: a syntax error, a missing module); `stdout-closed` stdout
//!   closed while the process lives on for 1 s; `flood` 200 `rate-limited`
//!   answers in 10 s, or answers that cannot be queued because the plugin
//!   reads nothing; `refusals` 64 answers of invalid-request,
//!   method-not-found, invalid-params, permission-denied, not-initialized or
//!   busy in a minute; `memory` the tree's resident memory over
//!   `plugins.memory_mb`, or an exit whose error output says an allocation
//!   failed; `processes` more than `plugins.max_processes` processes in the
//!   tree.
//! - A response to a host request the host no longer waits for (a
//!   command.run that timed out) is ignored.
//! - The approved copy is hashed before every start; a change on disk while
//!   the plugin runs is noticed at its next start (files-changed), not at
//!   once: the process already read its files and stays bounded by what
//!   was approved, and only the daemon's user can write the copy.
//! - Events: a committed ledger event is offered when its kind is an API
//!   kind, its data has the kind's members, and it was committed on a
//!   stream the daemon itself writes that kind to: a session kind on a
//!   session's stream (`s-` and 12 hex, its session id), a lane kind on the
//!   `lanes` stream (its lane is `data.lane`). What an operator appends
//!   with events.append on another stream (`x-...`) is never offered: a
//!   plugin reacts to what sessions and lanes did, not to text someone
//!   wrote that looks like it. Only the members the page lists for the kind
//!   are sent. `approval.*` is sent only when `data.requestId` is the
//!   session's own `<session>-aN`.
//! - The ledger-record budget: each storage.set and storage.delete is one
//!   record, a task request three (the request, its answer, its dispatch);
//!   only a task request is refused for it.
//!
//! The records in plugins.json are written off the reactor, by a job for
//! the `plugin-records` worker ([`Host::persist`]): at most one write
//! runs; changes made while it runs are written by the next one, which
//! takes the records as they are when it starts, so the last state is the
//! one on disk. An answer that follows a change of the records
//! ([`Host::when_saved`]) goes out only once a write that holds the change
//! has returned from its fsyncs; when that write fails the answer is
//! `unavailable`, and the change stands in the running daemon (it is not
//! rolled back) until the next write that succeeds. plugin.install copies
//! and hashes the folder in a job for the `plugin-install` worker
//! ([`Host::stage`]); deciding what to do with the copy and moving it into
//! place stays on the reactor, in one step, so that no other request sees
//! half of an install. The approved copy's hash before each start is a job
//! too (`plugin-check` worker): the start goes on when the hash is back,
//! after checking again that the plugin is still to run.
//!
//! Shape (DESIGN.md, "How subsystems talk"; issue 11): [`Host`] changes
//! only through its methods, which take `&mut self` and a read-only
//! [`Cx`] (the `[plugins]` config, the time, whether the daemon stops, a
//! view of the plugins' stdin pipes and typed views of sessions, seats and
//! lanes) and queue [`Effect`]s, which the caller takes with
//! [`Host::take_effects`] after each call: writes and signals to a plugin
//! process, spawns, timers with a typed [`TimerKey`], ledger batches with a
//! typed [`Ack`] handed back to [`Host::committed`] after the commit,
//! replies to an opaque [`ReplyKey`] the router maps to where the answer
//! goes, jobs for worker threads (their [`Report`]s come back through
//! [`Host::on_report`]), and requests to other subsystems (a task's
//! dispatch as a lane, a lane closed for a removal, a task request into
//! the approvals inbox). Nothing here knows the daemon or a surface; the
//! router in `daemon/router/plugins.rs` applies the effects and calls back.

use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::calls::{
    self, Call, LaneItem, StorageDeleted, StorageKeys, StorageUsage, StorageWritten, Subscribed,
};
use super::effects::{
    Aborted, Ack, ApproveRequest, Cx, Effect, Job, ReplyKey, Report, Saved, SpawnSpec, TimerKey,
    Views, Withdraw,
};
use super::manifest::Manifest;
use super::process::{self, Isolation};
use super::store::{self, Copy, Record, Store, Waiting};
use super::tasks;
use super::text;
use super::wire::{
    self, EventKind, HostError, HostErrorKind, HostRequest, Incoming, LineError, Method, Params,
    Permission, ShutdownReason,
};
use crate::children::{ChildId, ExitStatus, Output, Outputs, PipeLimits};
use crate::config::PluginsSection;
use crate::errors::{Code, RpcError};
use crate::isolation::Hidden;
use crate::ledger::{Appended, Op};
use crate::limits;
use crate::procs::signal_name;

/// Why a run ended against the host's will.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Exit,
    LoadRefused,
    StdoutClosed,
    InvalidMessage,
    OversizedLine,
    Flood,
    Refusals,
    Memory,
    Processes,
    InitializeTimeout,
    InitializeFailed,
    ApiMismatch,
    Unresponsive,
    SpawnFailed,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::Exit => "exit",
            Fault::LoadRefused => "load-refused",
            Fault::StdoutClosed => "stdout-closed",
            Fault::InvalidMessage => "invalid-message",
            Fault::OversizedLine => "oversized-line",
            Fault::Flood => "flood",
            Fault::Refusals => "refusals",
            Fault::Memory => "memory",
            Fault::Processes => "processes",
            Fault::InitializeTimeout => "initialize-timeout",
            Fault::InitializeFailed => "initialize-failed",
            Fault::ApiMismatch => "api-mismatch",
            Fault::Unresponsive => "unresponsive",
            Fault::SpawnFailed => "spawn-failed",
        }
    }

    fn of_wire(f: wire::Fault) -> Fault {
        match f {
            wire::Fault::OversizedLine => Fault::OversizedLine,
            wire::Fault::InvalidMessage => Fault::InvalidMessage,
        }
    }
}

/// Where a plugin is in its life, apart from its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Idle,
    Starting,
    Running,
    Stopping,
    Restarting(Fault),
    Failed(&'static str),
}

/// The approved copy, loaded.
pub struct Loaded {
    pub manifest: Manifest,
    pub json: Value,
    pub hash: String,
    pub files_count: u64,
    pub files_bytes: u64,
}

/// How the plugin's last process ended.
#[derive(Debug, Clone)]
pub struct LastExit {
    pub at: String,
    pub code: Option<i32>,
    pub signal: Option<String>,
    pub fault: Option<Fault>,
}

/// What to do once a run has stopped.
pub enum AfterStop {
    Nothing,
    Start,
    Remove { to: ReplyKey },
}

enum HostCall {
    Initialize,
    Ping,
    Command { to: ReplyKey, command: String },
    Shutdown,
}

/// The ids of a run's unanswered requests. A request is taken only while
/// fewer than `PLUGIN_MAX_UNANSWERED` (16) are, so this is a scan of a few
/// short strings, which costs less than hashing the id at each of the three
/// looks a request takes (issue 11).
#[derive(Default)]
struct Unanswered(Vec<String>);

impl Unanswered {
    fn contains(&self, wid: &str) -> bool {
        self.0.iter().any(|w| w == wid)
    }

    /// Adds `wid`, which the caller found not there and within the bound.
    fn insert(&mut self, wid: String) {
        self.0.push(wid);
    }

    fn remove(&mut self, wid: &str) -> bool {
        match self.0.iter().position(|w| w == wid) {
            Some(i) => {
                self.0.swap_remove(i);
                true
            }
            None => false,
        }
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// One process of a plugin.
pub struct Run {
    pub child: ChildId,
    pub pid: i32,
    pub run_no: u64,
    pub initialized: bool,
    next_id: u64,
    host_pending: HashMap<String, HostCall>,
    inflight: Unanswered,
    kinds: Vec<EventKind>,
    dropped: u64,
    tokens: f64,
    refilled: Instant,
    list_second: (u64, u32),
    rate_refusals: VecDeque<Instant>,
    refusals: VecDeque<Instant>,
    fault: Option<Fault>,
    stopping: Option<ShutdownReason>,
    timers: Vec<TimerKey>,
    ping_due: Option<String>,
    pub last_event: Option<(EventKind, String)>,
    pub commands: usize,
    stdout_closed: bool,
    exited: Option<ExitStatus>,
}

/// One installed plugin.
pub struct Plugin {
    pub rec: Record,
    pub approved: Option<Loaded>,
    pub phase: Phase,
    pub run: Option<Run>,
    crashes: VecDeque<Instant>,
    pub last_exit: Option<LastExit>,
    pub stderr_tail: String,
    pub storage: BTreeMap<String, String>,
    ledger_records: VecDeque<Instant>,
    task_times: VecDeque<Instant>,
    restart_timer: bool,
    /// The approved copy is being hashed before a start.
    checking: bool,
    /// Answers that wait for the check ([`Host::start_and_answer`]).
    check_waiters: Vec<(ReplyKey, Value)>,
    pub after_stop: AfterStop,
    /// Sessions plugin.remove stopped with the plugin's lanes (its reply's
    /// `stopped`).
    pub stopped_sessions: usize,
    /// What plugin.remove with stopTasks waits for and reports.
    pub removal: Removal,
}

/// A removal's dispatches: those it aborts, and what they left.
#[derive(Default)]
pub struct Removal {
    /// Whether the removal stops the plugin's tasks (stopTasks).
    pub stop_tasks: bool,
    /// Requests whose dispatch was in flight at plugin.remove: the removal
    /// ends when each has landed (its lane closed) or timed out.
    pub aborting: HashSet<String>,
    /// The worktrees aborted dispatches left, with their request's
    /// creation time (the reply lists the newest requests' first).
    pub worktrees: Vec<(String, String)>,
    /// The process is gone and the removal waits only for `aborting`; the
    /// request to answer then.
    parked: Option<Option<ReplyKey>>,
    timer: bool,
}

/// Clears the crash count (plugin.enable) and a failure.
pub fn clear_crashes(p: &mut Plugin) {
    p.crashes.clear();
    if matches!(p.phase, Phase::Failed(_) | Phase::Restarting(_)) {
        p.phase = Phase::Idle;
    }
}

impl Plugin {
    /// A plugin that was just installed.
    pub fn new(rec: Record) -> Plugin {
        Plugin {
            rec,
            approved: None,
            phase: Phase::Idle,
            run: None,
            crashes: VecDeque::new(),
            last_exit: None,
            stderr_tail: String::new(),
            storage: BTreeMap::new(),
            ledger_records: VecDeque::new(),
            task_times: VecDeque::new(),
            restart_timer: false,
            checking: false,
            check_waiters: Vec::new(),
            stopped_sessions: 0,
            removal: Removal::default(),
            after_stop: AfterStop::Nothing,
        }
    }

    /// plugin.list's state and reason.
    pub fn state(&self) -> (&'static str, Option<&'static str>) {
        if let Some(r) = &self.rec.removal {
            return (
                "remove-pending",
                Some(if r == "remove-failed" {
                    "remove-failed"
                } else {
                    "removing"
                }),
            );
        }
        let Some(loaded) = &self.approved else {
            let reason = match self.rec.waiting.as_ref().map(|w| w.kind.as_str()) {
                Some("files-changed") => "files-changed",
                Some("store-changed") => "store-changed",
                _ => "first-approval",
            };
            return ("pending-approval", Some(reason));
        };
        if !loaded.manifest.is_runnable() {
            return ("incompatible", Some("api-unsupported"));
        }
        if !self.rec.enabled {
            return ("disabled", Some("disabled"));
        }
        match self.phase {
            Phase::Idle => ("starting", None),
            Phase::Starting => ("starting", None),
            Phase::Running | Phase::Stopping => ("running", None),
            Phase::Restarting(f) => ("restarting", Some(f.name())),
            Phase::Failed(r) => ("failed", Some(r)),
        }
    }

    pub fn crashes(&mut self) -> usize {
        let window = Duration::from_millis(limits::PLUGIN_CRASH_WINDOW_MS);
        while self.crashes.front().is_some_and(|t| t.elapsed() > window) {
            self.crashes.pop_front();
        }
        self.crashes.len()
    }

    pub fn storage_usage(&self) -> StorageUsage {
        StorageUsage {
            keys: self.storage.len(),
            bytes: self.storage.values().map(String::len).sum(),
        }
    }

    pub fn name(&self) -> String {
        self.approved
            .as_ref()
            .map(|l| l.manifest.name.clone())
            .unwrap_or_else(|| self.rec.plugin.clone())
    }

    fn has(&self, p: Permission) -> bool {
        self.approved
            .as_ref()
            .is_some_and(|l| l.manifest.permissions.contains(&p))
    }

    /// Ledger records left in the last hour.
    fn records_left(&mut self) -> usize {
        let window = Duration::from_millis(limits::PLUGIN_LEDGER_WINDOW_MS);
        while self
            .ledger_records
            .front()
            .is_some_and(|t| t.elapsed() > window)
        {
            self.ledger_records.pop_front();
        }
        limits::PLUGIN_LEDGER_RECORDS_PER_HOUR.saturating_sub(self.ledger_records.len())
    }

    /// Counts `n` ledger records written at `now` against the hour's
    /// budget. Storage writes are not refused when the budget is spent
    /// (only task requests are), so the deque keeps at most the budget's
    /// newest entries: more would not change what [`Self::records_left`]
    /// answers.
    fn note_records(&mut self, n: usize, now: Instant) {
        for _ in 0..n {
            self.ledger_records.push_back(now);
        }
        while self.ledger_records.len() > limits::PLUGIN_LEDGER_RECORDS_PER_HOUR {
            self.ledger_records.pop_front();
        }
    }
}

/// The records' writes (module comment). What waits for a write is an
/// answer to a request (a socket method, a plugin's task request, a
/// removal), so the lists are bounded by the requests that can be in
/// flight, not by how often the records change.
#[derive(Default)]
struct RecordWrites {
    /// A write runs; what waits for it.
    running: Option<Vec<Saved>>,
    /// The records changed since the running write copied them; what waits
    /// for the write after it.
    next: Option<Vec<Saved>>,
    /// How many changes were asked for, ever ([`Host::records_asked`]).
    asked: u64,
}

/// The host's state.
pub struct Host {
    pub store: Option<Store>,
    pub plugins: BTreeMap<String, Plugin>,
    pub isolation: Isolation,
    /// What the daemon hides from every sandbox, known with the isolation.
    hidden: Hidden,
    pub tasks: tasks::Table,
    /// Each run's plugin id, shared: a request looks it up and holds it
    /// while the host changes, and a count costs less than a copy.
    by_child: crate::reactor::IdMap<ChildId, std::rc::Rc<str>>,
    lanes_copy: Option<(Instant, Vec<LaneItem>)>,
    next_run_no: u64,
    watching: bool,
    records: RecordWrites,
    /// plugin.install's copies in the making, by ticket: who asked.
    installs: HashMap<u64, (ReplyKey, &'static str)>,
    /// plugin.approve's checks of the waiting copy, by ticket.
    approving: HashMap<u64, (ReplyKey, ApproveRequest)>,
    next_ticket: u64,
    out: Vec<Effect>,
}

/// Loads the store's records and each plugin's storage from the ledger.
pub fn load(paths: &crate::config::Paths) -> Host {
    let store = match Store::open(&paths.state_dir) {
        Ok(s) => Some(s),
        Err(e) => {
            crate::error!("{e}; plugins are unavailable");
            None
        }
    };
    let mut host = Host::new(None);
    let Some(store) = store else { return host };
    store.sweep();
    let mut changed = false;
    for mut rec in store.load() {
        verify_record(&store, &mut rec, None, &mut changed);
        let mut p = Plugin::new(rec);
        p.approved = p
            .rec
            .approval
            .clone()
            .and_then(|a| loaded_of(&store, &p.rec.plugin, &a));
        host.plugins.insert(p.rec.plugin.clone(), p);
    }
    // At start, before the reactor serves anyone: written here and now.
    if changed {
        let recs = host.plugins.values().map(|p| p.rec.clone()).collect();
        if let Err(e) = store.save(recs) {
            crate::error!("{e}");
        }
    }
    if let Ok(conn) = rusqlite::Connection::open_with_flags(
        &paths.ledger,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    ) {
        if let Ok(mut stmt) = conn.prepare("SELECT plugin, key, value FROM plugin_storage") {
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ))
            });
            if let Ok(rows) = rows {
                for (plugin, key, value) in rows.flatten() {
                    if let Some(p) = host.plugins.get_mut(&plugin) {
                        p.storage.insert(key, value);
                    }
                }
            }
        }
        host.tasks.load(&conn);
    }
    host.store = Some(store);
    host
}

/// Checks an approval's integrity and the approved copy's files (`hash`:
/// the copy's, when a job hashed it already); a failure makes the copy
/// wait again (store-changed, files-changed).
fn verify_record(store: &Store, rec: &mut Record, hash: Option<&str>, changed: &mut bool) {
    let Some(a) = rec.approval.clone() else {
        return;
    };
    let dir = store.copy_dir(&rec.plugin, Copy::Approved);
    let hash = hash.map_or_else(|| store::raw_hash(&dir), str::to_string);
    let kind = if !store.verify(&rec.plugin, &a) {
        "store-changed"
    } else if hash != a.snapshot_hash {
        "files-changed"
    } else {
        return;
    };
    crate::warn!(
        "plugin {}: the approved copy waits for approval again ({kind})",
        rec.plugin
    );
    rec.approval = None;
    if dir.is_dir() && rec.waiting.is_none() {
        // The copy moves as it is: its hash is the one just taken.
        if store.demote_approved(&rec.plugin).is_ok() {
            rec.waiting = Some(Waiting {
                kind: kind.into(),
                snapshot_hash: hash,
                installed_by: None,
                installed_at: crate::clock::now_ts(),
            });
        }
    } else {
        let _ = store.remove_copy(&rec.plugin, Copy::Approved);
        if let Some(w) = &mut rec.waiting {
            if w.kind == "install" {
                w.kind = kind.into();
                w.installed_by = None;
            }
        }
    }
    *changed = true;
}

/// The approved copy of `id`, loaded for running.
pub fn loaded_of(store: &Store, id: &str, a: &store::Approval) -> Option<Loaded> {
    let dir = store.copy_dir(id, Copy::Approved);
    let bytes = std::fs::read(dir.join(super::manifest::MANIFEST_FILE)).ok()?;
    let manifest = Manifest::parse(&bytes).ok()?;
    let json: Value = serde_json::from_slice(&bytes).ok()?;
    let entries = store::raw_entries(&dir);
    let files: Vec<_> = entries.iter().filter(|e| e.mode != 0o120000).collect();
    Some(Loaded {
        manifest,
        json,
        hash: a.snapshot_hash.clone(),
        files_count: files.len() as u64,
        files_bytes: files.iter().map(|e| e.size).sum(),
    })
}

/// The unsaved answer of [`Saved::Answer`].
fn unsaved() -> RpcError {
    RpcError::new(
        Code::Unavailable,
        "the plugin record could not be written; the log says why",
    )
}

impl Host {
    /// A host with `store` and no plugin, isolation not known yet.
    pub fn new(store: Option<Store>) -> Host {
        Host {
            store,
            plugins: BTreeMap::new(),
            isolation: Isolation::pending(),
            hidden: Hidden::default(),
            tasks: tasks::Table::default(),
            by_child: Default::default(),
            lanes_copy: None,
            next_run_no: 0,
            watching: false,
            records: RecordWrites::default(),
            installs: HashMap::new(),
            approving: HashMap::new(),
            next_ticket: 0,
            out: Vec::new(),
        }
    }

    /// The effects the last calls queued, in order; the caller applies
    /// them (module comment).
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.out)
    }

    /// Takes back the emptied vector [`Host::take_effects`] handed out, to
    /// collect the next call's effects without allocating (one allocation
    /// of every plugin request, issue 11), unless effects emitted since
    /// already took a new one.
    pub fn recycle_effects(&mut self, fx: Vec<Effect>) {
        if self.out.is_empty() && fx.is_empty() {
            self.out = fx;
        }
    }

    pub(super) fn emit(&mut self, e: Effect) {
        self.out.push(e);
    }

    fn timer(&mut self, key: TimerKey, after: Duration) {
        self.emit(Effect::Timer { key, after });
    }

    /// A timer of the run `run_no` of `id`: cancelled when the run ends.
    fn run_timer(&mut self, id: &str, key: TimerKey, after: Duration) {
        if let Some(r) = self.plugins.get_mut(id).and_then(|p| p.run.as_mut()) {
            r.timers.push(key.clone());
        }
        self.timer(key, after);
    }

    pub(super) fn reply_to(&mut self, to: ReplyKey, result: Result<Value, RpcError>) {
        self.emit(Effect::Reply { to, result });
    }

    fn ledger(&mut self, ops: Vec<Op>, withdraw: Vec<Withdraw>, ack: Ack) {
        self.emit(Effect::Ledger { ops, withdraw, ack });
    }

    /// The records changed: a job writes them (module comment).
    pub fn persist(&mut self) {
        self.records.asked += 1;
        if self.store.is_none() {
            return;
        }
        if self.records.running.is_some() {
            self.records.next.get_or_insert_with(Vec::new);
        } else {
            self.start_write(Vec::new());
        }
    }

    /// How many changes of the records were asked for so far: a caller that
    /// sees it move knows the records changed under it.
    pub fn records_asked(&self) -> u64 {
        self.records.asked
    }

    /// Runs `then` once every change of the records asked for so far is on
    /// disk, or with the error of the write that was to hold it. With no
    /// store, at once as failed; with nothing to write, at once.
    pub fn when_saved(&mut self, then: Saved) {
        if self.store.is_none() {
            return self.saved(then, false);
        }
        let w = &mut self.records;
        if let Some(v) = w.next.as_mut().or(w.running.as_mut()) {
            v.push(then);
        } else {
            self.saved(then, true);
        }
    }

    /// [`Self::persist`], then [`Self::when_saved`].
    pub fn persist_then(&mut self, then: Saved) {
        self.persist();
        self.when_saved(then);
    }

    fn saved(&mut self, then: Saved, ok: bool) {
        match then {
            Saved::Answer { to, value } => {
                self.reply_to(to, if ok { Ok(value) } else { Err(unsaved()) })
            }
            Saved::Reply { to, result } => self.reply_to(to, result),
            Saved::Plugin {
                plugin,
                run_no,
                wid,
                line,
            } => self.reply(&plugin, run_no, &wid, line),
        }
    }

    /// Starts a write of the records as they are now; `waiters` wait for it.
    fn start_write(&mut self, waiters: Vec<Saved>) {
        let Some(store) = &self.store else {
            return;
        };
        let root = store.root.clone();
        let records: Vec<Record> = self.plugins.values().map(|p| p.rec.clone()).collect();
        self.records.running = Some(waiters);
        self.emit(Effect::Job(Job::WriteRecords { root, records }));
    }

    /// A write of the records returned: the next one starts, if the records
    /// changed meanwhile, then what waited for this one runs.
    fn records_written(&mut self, result: Result<(), String>) {
        let waiters = self.records.running.take().unwrap_or_default();
        if let Err(e) = &result {
            crate::error!("{e}");
        }
        if let Some(next) = self.records.next.take() {
            self.start_write(next);
        }
        for then in waiters {
            self.saved(then, result.is_ok());
        }
    }

    /// Whether no write of the records runs or waits.
    fn records_idle(&self) -> bool {
        self.records.running.is_none() && self.records.next.is_none()
    }

    /// Writes the records here and now when a change has not been written:
    /// the last step of a stop, once the reactor and the records' worker
    /// are gone.
    pub fn save_at_exit(&self) {
        if self.records_idle() {
            return;
        }
        if let Some(store) = &self.store {
            let recs = self.plugins.values().map(|p| p.rec.clone()).collect();
            if let Err(e) = store.save(recs) {
                crate::error!("{e}");
            }
        }
    }

    /// Has a job copy the folder at `src` into the store and check the
    /// copy (plugin.install); the router hands the result to the socket
    /// method with [`Self::staged`]. Refused (`unavailable`) when no store
    /// is usable or too many copies are in the making.
    /// The plugin store, or `unavailable` when it could not be opened.
    pub fn usable_store(&self) -> Result<&Store, RpcError> {
        self.store.as_ref().ok_or_else(|| {
            RpcError::new(
                Code::Unavailable,
                "the plugin store cannot be used; the log says why",
            )
        })
    }

    pub fn stage(
        &mut self,
        to: ReplyKey,
        installed_by: &'static str,
        src: PathBuf,
    ) -> Result<(), RpcError> {
        let store = self.usable_store()?;
        if self.installs.len() >= limits::PLUGIN_INSTALLS_IN_FLIGHT {
            return Err(RpcError::new(
                Code::Unavailable,
                format!(
                    "{} plugin installs are being copied; try again",
                    limits::PLUGIN_INSTALLS_IN_FLIGHT
                ),
            ));
        }
        let root = store.root.clone();
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        self.installs.insert(ticket, (to, installed_by));
        self.emit(Effect::Job(Job::Stage { ticket, root, src }));
        Ok(())
    }

    /// Has a job check the waiting copy plugin.approve names (its folder
    /// and hash: a tree of up to 32 MiB is not read on the reactor); the
    /// router hands the result to the socket method with
    /// [`Self::checked_waiting`]. Refused (`unavailable`) as
    /// [`Self::stage`] is.
    pub fn check_waiting(&mut self, to: ReplyKey, a: ApproveRequest) -> Result<(), RpcError> {
        let store = self.usable_store()?;
        if self.approving.len() >= limits::PLUGIN_INSTALLS_IN_FLIGHT {
            return Err(RpcError::new(
                Code::Unavailable,
                format!(
                    "{} plugin approvals are being checked; try again",
                    limits::PLUGIN_INSTALLS_IN_FLIGHT
                ),
            ));
        }
        let dir = store.copy_dir(&a.plugin, Copy::Waiting);
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        self.approving.insert(ticket, (to, a));
        self.emit(Effect::Job(Job::CheckWaiting { ticket, dir }));
        Ok(())
    }

    /// The check of approval `ticket` is done: who asked, and for what.
    pub fn checked_waiting(&mut self, ticket: u64) -> Option<(ReplyKey, ApproveRequest)> {
        self.approving.remove(&ticket)
    }

    /// The copy of install `ticket` is made: who asked for it.
    pub fn staged(&mut self, ticket: u64) -> Option<(ReplyKey, &'static str)> {
        self.installs.remove(&ticket)
    }

    /// Deletes a copy the store no longer needs (a staging folder an
    /// install did not keep, a copy an install or an approval replaced, a
    /// copy discarded, a plugin removed) in a job. One that cannot be
    /// queued is left to the sweep at the next start, which deletes every
    /// `.staging-` and `.retired-` folder.
    pub fn discard_copy(&mut self, dir: PathBuf) {
        self.emit(Effect::Job(Job::Discard { dir }));
    }

    /// A worker's report.
    pub fn on_report(&mut self, report: Report, cx: &Cx) {
        match report {
            Report::RecordsWritten(r) => self.records_written(r),
            // The router takes staged and checked copies to the socket
            // method itself.
            Report::Staged { .. } | Report::Checked { .. } => {}
            Report::Hashed { plugin, hash } => self.hashed(&plugin, &hash, cx),
            Report::Sampled(usage) => self.watched(&usage, cx),
            Report::RequestRead { to, row } => self.request_read(to, row),
        }
    }

    /// A job could not be queued (its worker could not be started, or is
    /// busy or gone): `why`.
    pub fn job_refused(&mut self, job: Job, why: String, cx: &Cx) {
        match job {
            Job::WriteRecords { .. } => {
                self.records_written(Err(format!("unable to write the plugin records: {why}")))
            }
            Job::Stage { ticket, .. } => {
                crate::error!("unable to copy a plugin folder: {why}");
                if let Some((to, _)) = self.installs.remove(&ticket) {
                    self.reply_to(
                        to,
                        Err(RpcError::new(
                            Code::Unavailable,
                            "the plugin install thread cannot take the copy; the log says why",
                        )),
                    );
                }
            }
            Job::CheckWaiting { ticket, .. } => {
                crate::error!("unable to check a plugin's waiting copy: {why}");
                if let Some((to, _)) = self.approving.remove(&ticket) {
                    self.reply_to(
                        to,
                        Err(RpcError::new(
                            Code::Unavailable,
                            "the plugin install thread cannot take the check; the log says why",
                        )),
                    );
                }
            }
            Job::Discard { dir } => {
                crate::warn!(
                    "{} is left for the next start to delete: {why}",
                    dir.display()
                )
            }
            Job::Sample { .. } => {
                // Counted again at the next interval.
                crate::warn!("unable to count the plugins' processes: {why}");
                self.watching = false;
                self.ensure_watch(cx);
            }
            Job::Hash { plugin, .. } => {
                crate::error!("plugin {plugin}: unable to check its approved copy: {why}");
                if self.plugins.get(&plugin).is_some_and(|p| p.checking) {
                    let waiters = self.end_check(&plugin);
                    self.spawn_failed(&plugin, cx);
                    for (to, value) in waiters {
                        self.answer_state(&plugin, to, value);
                    }
                }
            }
        }
    }

    /// The machine's isolation probe answered: decide how plugins run
    /// (with what `hidden` hides from each sandbox) and start them.
    pub fn isolation_known(&mut self, probe: &crate::isolation::Probe, hidden: Hidden, cx: &Cx) {
        self.isolation = Isolation::decide(cx.cfg, probe);
        self.hidden = hidden;
        match &self.isolation.missing {
            None => crate::info!("plugins run isolated with bubblewrap"),
            Some(why) => crate::warn!("plugins run without isolation: {why}"),
        }
        self.start_all(cx);
    }

    /// Starts every approved, enabled plugin, and finishes removals a stop
    /// cut off.
    fn start_all(&mut self, cx: &Cx) {
        let ids: Vec<String> = self.plugins.keys().cloned().collect();
        for id in ids {
            if self
                .plugins
                .get(&id)
                .is_some_and(|p| p.rec.removal.is_some())
            {
                self.finish_removal(&id, None, cx);
            } else {
                self.start(&id, cx);
            }
        }
    }

    /// Whether the plugin is to start now: it can run and does not.
    fn startable(&self, id: &str, cx: &Cx) -> bool {
        // Before the isolation probe answers, nothing starts;
        // `isolation_known` starts every plugin then.
        if cx.stopping || !self.isolation.probed {
            return false;
        }
        let Some(p) = self.plugins.get(id) else {
            return false;
        };
        p.run.is_none()
            && p.rec.removal.is_none()
            && p.rec.enabled
            && p.approved
                .as_ref()
                .is_some_and(|l| l.manifest.is_runnable())
            && self.store.is_some()
    }

    /// Starts the plugin when it can run and does not: its approved copy
    /// is hashed first, by a job ([`Self::hashed`] goes on).
    pub fn start(&mut self, id: &str, cx: &Cx) {
        if !self.startable(id, cx) {
            return;
        }
        let Some(store) = &self.store else { return };
        let dir = store.copy_dir(id, Copy::Approved);
        let Some(p) = self.plugins.get_mut(id) else {
            return;
        };
        if std::mem::take(&mut p.restart_timer) {
            self.emit(Effect::CancelTimer(TimerKey::Restart {
                plugin: id.to_string(),
            }));
        }
        let Some(p) = self.plugins.get_mut(id) else {
            return;
        };
        if std::mem::replace(&mut p.checking, true) {
            return;
        }
        self.emit(Effect::Job(Job::Hash {
            plugin: id.to_string(),
            dir,
        }));
    }

    /// Starts the plugin as [`Self::start`] does, and answers `to` with
    /// `value` and the plugin's `state` once the start is decided (once the
    /// approved copy's hash is back, when it is checked) and the records
    /// are written: plugin.enable's answer says `pending-approval` for a
    /// copy that changed on disk, as it did when the hash was taken on the
    /// reactor.
    pub fn start_and_answer(&mut self, id: &str, to: ReplyKey, value: Value, cx: &Cx) {
        self.start(id, cx);
        match self.plugins.get_mut(id) {
            Some(p) if p.checking => p.check_waiters.push((to, value)),
            _ => self.answer_state(id, to, value),
        }
    }

    fn answer_state(&mut self, id: &str, to: ReplyKey, mut value: Value) {
        let state = self.plugins.get(id).map_or("disabled", |p| p.state().0);
        if let Value::Object(m) = &mut value {
            m.insert("state".into(), state.into());
        }
        self.when_saved(Saved::Answer { to, value });
    }

    /// The check of `id` is over: what waited for it, to answer once the
    /// start is decided.
    fn end_check(&mut self, id: &str) -> Vec<(ReplyKey, Value)> {
        match self.plugins.get_mut(id) {
            Some(p) => {
                p.checking = false;
                std::mem::take(&mut p.check_waiters)
            }
            None => Vec::new(),
        }
    }

    /// The approved copy's hash is known: a copy that changed on disk since
    /// its approval waits again; else the plugin starts, if it is still to.
    fn hashed(&mut self, id: &str, hash: &str, cx: &Cx) {
        if !self.plugins.get(id).is_some_and(|p| p.checking) {
            return;
        }
        let waiters = self.end_check(id);
        self.start_checked(id, hash, cx);
        for (to, value) in waiters {
            self.answer_state(id, to, value);
        }
    }

    fn start_checked(&mut self, id: &str, hash: &str, cx: &Cx) {
        if !self.startable(id, cx) {
            return;
        }
        let running = self.plugins.values().filter(|p| p.run.is_some()).count();
        let (Some(store), Some(p)) = (&self.store, self.plugins.get_mut(id)) else {
            return;
        };
        let Some(loaded) = &p.approved else { return };
        if hash != loaded.hash {
            let mut changed = false;
            verify_record(store, &mut p.rec, Some(hash), &mut changed);
            p.approved = None;
            p.phase = Phase::Idle;
            self.persist();
            return;
        }
        if running >= cx.cfg.max_running {
            crate::warn!(
                "plugin {id} not started: {} plugins run already",
                cx.cfg.max_running
            );
            p.phase = Phase::Failed("run-limit");
            return;
        }
        let main = loaded.manifest.main.clone();
        let copy = store.copy_dir(id, Copy::Approved);
        let work = match store.work_dir(id) {
            Ok(w) => w,
            Err(e) => {
                crate::error!(
                    "plugin {id}: unable to make its working directory: {}",
                    crate::errors::io_cause(&e)
                );
                self.spawn_failed(id, cx);
                return;
            }
        };
        p.phase = Phase::Starting;
        self.emit(Effect::Spawn {
            plugin: id.to_string(),
            spec: SpawnSpec { copy, work, main },
        });
    }

    /// The command that starts a plugin (`Err`: why it cannot start), and
    /// the bounds of its pipes.
    pub fn command(
        &self,
        cfg: &PluginsSection,
        spec: &SpawnSpec,
    ) -> Result<(std::process::Command, PipeLimits), String> {
        let none = Hidden::default();
        let hidden = match self.isolation.bwrap {
            Some(_) => &self.hidden,
            None => &none,
        };
        let cmd = process::command(
            cfg,
            &self.isolation,
            &process::Spec {
                copy: &spec.copy,
                work: &spec.work,
                main: &spec.main,
                hidden,
            },
        )?;
        let limits = PipeLimits {
            max_line: limits::PLUGIN_MAX_LINE + 1,
            max_queued: limits::PLUGIN_STDIN_QUEUE_BYTES,
            stderr_tail: limits::PLUGIN_STDERR_TAIL_MAX * 4,
        };
        Ok((cmd, limits))
    }

    /// The plugin's process started as `child` (`pid`), or could not
    /// (`Err`: the log line).
    pub fn spawned(&mut self, id: &str, started: Result<(ChildId, i32), String>, cx: &Cx) {
        let (child, pid) = match started {
            Ok(x) => x,
            Err(why) => {
                crate::error!("plugin {id}: {why}");
                self.spawn_failed(id, cx);
                return;
            }
        };
        self.next_run_no += 1;
        let run_no = self.next_run_no;
        self.by_child.insert(child, id.into());
        let Some(p) = self.plugins.get_mut(id) else {
            return;
        };
        let Some(loaded) = &p.approved else { return };
        let init = wire::Initialize {
            platform: wire::Platform::current(),
            plugin_id: id.to_string(),
            plugin_version: loaded.manifest.version.clone(),
            permissions: loaded.manifest.permissions.clone(),
        };
        p.stderr_tail.clear();
        p.phase = Phase::Starting;
        p.run = Some(Run {
            child,
            pid,
            run_no,
            initialized: false,
            next_id: 0,
            host_pending: HashMap::new(),
            inflight: Unanswered::default(),
            kinds: Vec::new(),
            dropped: 0,
            tokens: limits::PLUGIN_RATE_BURST as f64,
            refilled: cx.now,
            list_second: (0, 0),
            rate_refusals: VecDeque::new(),
            refusals: VecDeque::new(),
            fault: None,
            stopping: None,
            timers: Vec::new(),
            ping_due: None,
            last_event: None,
            commands: 0,
            stdout_closed: false,
            exited: None,
        });
        crate::info!("plugin {id} started (pid {pid})");
        self.send_request(id, HostRequest::Initialize(init), HostCall::Initialize);
        let timeout = Duration::from_millis(cx.cfg.initialize_timeout_ms);
        self.run_timer(
            id,
            TimerKey::Initialize {
                plugin: id.to_string(),
                run_no,
            },
            timeout,
        );
        self.ensure_watch(cx);
    }

    fn spawn_failed(&mut self, id: &str, cx: &Cx) {
        let Some(p) = self.plugins.get_mut(id) else {
            return;
        };
        p.last_exit = Some(LastExit {
            at: crate::clock::now_ts(),
            code: None,
            signal: None,
            fault: Some(Fault::SpawnFailed),
        });
        self.crashed(id, Fault::SpawnFailed, cx);
    }

    /// The plugin's current run, when it is run `run_no`.
    fn run_mut(&mut self, id: &str, run_no: u64) -> Option<&mut Run> {
        self.plugins
            .get_mut(id)?
            .run
            .as_mut()
            .filter(|r| r.run_no == run_no)
    }

    /// Bytes queued to `child`'s stdin, with those this call queued.
    fn queued(&self, child: ChildId, cx: &Cx) -> usize {
        let mine: usize = self
            .out
            .iter()
            .map(|e| match e {
                Effect::Write { child: c, bytes } if *c == child => bytes.len(),
                _ => 0,
            })
            .sum();
        cx.pipes.queued(child) + mine
    }

    /// Writes one line to the plugin; a queue that is full means the
    /// plugin reads nothing: the fault flood ([`Self::write_refused`]).
    fn write_line(&mut self, id: &str, line: &str) {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        self.write_bytes(id, bytes);
    }

    /// [`Self::write_line`] of a line the caller no longer needs: its
    /// buffer takes the line feed and is written, not copied.
    fn write_owned(&mut self, id: &str, line: String) {
        let mut bytes = line.into_bytes();
        bytes.push(b'\n');
        self.write_bytes(id, bytes);
    }

    fn write_bytes(&mut self, id: &str, bytes: Vec<u8>) {
        let Some(run) = self.plugins.get(id).and_then(|p| p.run.as_ref()) else {
            return;
        };
        let child = run.child;
        self.emit(Effect::Write { child, bytes });
    }

    /// A write to `child` found its stdin queue full: the fault flood.
    pub fn write_refused(&mut self, child: ChildId) {
        let Some(id) = self.by_child.get(&child).cloned() else {
            return;
        };
        let Some(run_no) = self
            .plugins
            .get(&*id)
            .and_then(|p| p.run.as_ref())
            .filter(|r| r.child == child)
            .map(|r| r.run_no)
        else {
            return;
        };
        self.fault(&id, run_no, Fault::Flood);
    }

    fn send_request(&mut self, id: &str, req: HostRequest, call: HostCall) -> Option<String> {
        let run = self.plugins.get_mut(id)?.run.as_mut()?;
        run.next_id += 1;
        let hid = wire::host_request_id(run.next_id);
        run.host_pending.insert(hid.clone(), call);
        let line = req.encode(&hid);
        self.write_owned(id, line);
        Some(hid)
    }

    /// Routes a plugin child's output (called for every readiness, also
    /// with nothing read, so that a queue that drained can take the
    /// dropped notice).
    pub fn on_output(&mut self, child: ChildId, out: &Outputs, cx: &Cx) {
        let Some(id) = self.by_child.get(&child).cloned() else {
            return;
        };
        for o in out.iter() {
            let Some(run_no) = self
                .plugins
                .get(&*id)
                .and_then(|p| p.run.as_ref())
                .filter(|r| r.child == child && r.fault.is_none())
                .map(|r| r.run_no)
            else {
                break;
            };
            match o {
                Output::Line(line) => self.on_line(&id, run_no, line, cx),
                Output::LineTooLong => self.fault(&id, run_no, Fault::OversizedLine),
                Output::StdoutClosed => {
                    let exited = self
                        .plugins
                        .get_mut(&*id)
                        .and_then(|p| p.run.as_mut())
                        .and_then(|r| {
                            r.stdout_closed = true;
                            r.exited
                        });
                    if let Some(status) = exited {
                        self.finish_exit(child, status);
                        return;
                    }
                    self.run_timer(
                        &id,
                        TimerKey::StdoutClosed {
                            plugin: id.to_string(),
                            run_no,
                        },
                        Duration::from_millis(limits::PLUGIN_STDOUT_CLOSED_GRACE_MS),
                    );
                }
                Output::StdinClosed => {}
            }
        }
        self.flush_dropped(&id, cx);
    }

    /// Sends the pending events.dropped notice when the queue has room.
    fn flush_dropped(&mut self, id: &str, cx: &Cx) {
        let Some(run) = self.plugins.get(id).and_then(|p| p.run.as_ref()) else {
            return;
        };
        if run.dropped == 0 {
            return;
        }
        let line = wire::encode_events_dropped(run.dropped);
        if self.queued(run.child, cx) + line.len() < limits::PLUGIN_EVENT_QUEUE_BYTES {
            if let Some(r) = self.plugins.get_mut(id).and_then(|p| p.run.as_mut()) {
                r.dropped = 0;
            }
            self.write_owned(id, line);
        }
    }

    fn on_line(&mut self, id: &str, run_no: u64, line: &[u8], cx: &Cx) {
        match wire::parse_line(line) {
            Ok(Incoming::Request {
                id: wid,
                method,
                params,
            }) => self.on_request(id, run_no, wid, method, params, cx),
            Ok(Incoming::Response { id: hid, result }) => {
                self.on_answer(id, run_no, &hid, Ok(result), cx)
            }
            Ok(Incoming::Failure { id: hid, error }) => {
                self.on_answer(id, run_no, &hid, Err(error), cx)
            }
            Err(LineError::Answer { id: wid, error }) => {
                if self
                    .run_mut(id, run_no)
                    .is_some_and(|r| r.inflight.contains(&wid))
                {
                    self.refuse(id, run_no, &wid, HostError::id_in_use(), false, cx.now);
                } else {
                    self.refuse(id, run_no, &wid, error, false, cx.now);
                }
            }
            Err(LineError::Fault { fault: f, detail }) => {
                crate::warn!("plugin {id}: {detail}");
                self.fault(id, run_no, Fault::of_wire(f));
            }
        }
    }

    /// Answers a plugin request with a failure that is not counted as in
    /// flight.
    fn refuse(
        &mut self,
        id: &str,
        run_no: u64,
        wid: &str,
        error: HostError,
        was_inflight: bool,
        now: Instant,
    ) {
        let counts = matches!(
            error.kind(),
            HostErrorKind::InvalidRequest
                | HostErrorKind::MethodNotFound
                | HostErrorKind::InvalidParams
                | HostErrorKind::PermissionDenied(_)
                | HostErrorKind::NotInitialized
                | HostErrorKind::Busy
        );
        let rate = matches!(error.kind(), HostErrorKind::RateLimited);
        let line = wire::encode_failure(wid, &error);
        let Some(run) = self.run_mut(id, run_no) else {
            return;
        };
        if was_inflight {
            run.inflight.remove(wid);
        }
        let mut verdict = None;
        if counts {
            run.refusals.push_back(now);
            while run.refusals.front().is_some_and(|t| {
                now - *t > Duration::from_millis(limits::PLUGIN_REFUSALS_WINDOW_MS)
            }) {
                run.refusals.pop_front();
            }
            if run.refusals.len() >= limits::PLUGIN_MAX_REFUSALS as usize {
                verdict = Some(Fault::Refusals);
            }
        }
        if rate {
            run.rate_refusals.push_back(now);
            while run
                .rate_refusals
                .front()
                .is_some_and(|t| now - *t > Duration::from_millis(limits::PLUGIN_FLOOD_WINDOW_MS))
            {
                run.rate_refusals.pop_front();
            }
            if run.rate_refusals.len() >= limits::PLUGIN_FLOOD_REFUSALS as usize {
                verdict = Some(Fault::Flood);
            }
        }
        self.write_owned(id, line);
        if let Some(f) = verdict {
            self.fault(id, run_no, f);
        }
    }

    /// Answers a request the plugin made (success or failure) and frees
    /// its id.
    pub fn reply(&mut self, id: &str, run_no: u64, wid: &str, answer: Result<String, HostError>) {
        match answer {
            Ok(line) => {
                let Some(run) = self.run_mut(id, run_no) else {
                    return;
                };
                if !run.inflight.remove(wid) {
                    return;
                }
                self.write_owned(id, line);
            }
            Err(e) => {
                if self
                    .run_mut(id, run_no)
                    .is_some_and(|r| r.inflight.contains(wid))
                {
                    self.refuse(id, run_no, wid, e, true, Instant::now());
                }
            }
        }
    }

    fn respond<T: serde::Serialize>(&mut self, id: &str, run_no: u64, wid: &str, result: &T) {
        let line = wire::encode_response(wid, result);
        self.reply(id, run_no, wid, line);
    }

    fn on_request(
        &mut self,
        id: &str,
        run_no: u64,
        wid: String,
        method: Method,
        params: Params,
        cx: &Cx,
    ) {
        let now = cx.now;
        let Some(run) = self.run_mut(id, run_no) else {
            return;
        };
        let refusal = if run.inflight.contains(&wid) {
            Some(HostError::id_in_use())
        } else if run.stopping.is_some() {
            Some(HostError::of(HostErrorKind::ShuttingDown))
        } else if !run.initialized {
            Some(HostError::of(HostErrorKind::NotInitialized))
        } else if run.inflight.len() >= limits::PLUGIN_MAX_UNANSWERED {
            Some(HostError::of(HostErrorKind::Busy))
        } else {
            let refill = (now - run.refilled).as_secs_f64() * limits::PLUGIN_RATE_PER_SECOND as f64;
            run.tokens = (run.tokens + refill).min(limits::PLUGIN_RATE_BURST as f64);
            run.refilled = now;
            (run.tokens < 1.0).then(|| {
                HostError::new(
                    HostErrorKind::RateLimited,
                    "More than 50 requests a second for too long",
                )
            })
        };
        if let Some(e) = refusal {
            self.refuse(id, run_no, &wid, e, false, now);
            return;
        }
        run.tokens -= 1.0;
        run.inflight.insert(wid.clone());
        let has = self
            .plugins
            .get(id)
            .is_some_and(|p| p.has(method.permission()));
        if !has {
            self.reply(
                id,
                run_no,
                &wid,
                Err(HostError::permission_denied(method.permission())),
            );
            return;
        }
        let call = match params {
            Params::Checked(call) => call,
            Params::Object(params) => match Call::parse(method, &params) {
                Ok(c) => c,
                Err(e) => {
                    self.reply(id, run_no, &wid, Err(e));
                    return;
                }
            },
        };
        if method.is_list() {
            let second = now.saturating_duration_since(cx.started).as_secs();
            let Some(run) = self.run_mut(id, run_no) else {
                return;
            };
            if run.list_second.0 != second {
                run.list_second = (second, 0);
            }
            run.list_second.1 += 1;
            if run.list_second.1 > limits::PLUGIN_LIST_CALLS_PER_SECOND {
                self.reply(
                    id,
                    run_no,
                    &wid,
                    Err(HostError::new(
                        HostErrorKind::RateLimited,
                        "more than 10 list calls in this second",
                    )),
                );
                return;
            }
        }
        self.serve_call(id, run_no, &wid, call, cx);
    }

    fn serve_call(&mut self, id: &str, run_no: u64, wid: &str, call: Call, cx: &Cx) {
        match call {
            Call::EventsSubscribe { kinds } => {
                if let Some(r) = self.run_mut(id, run_no) {
                    r.kinds = kinds.clone();
                }
                self.respond(id, run_no, wid, &Subscribed { kinds });
            }
            Call::EventsUnsubscribe => {
                if let Some(r) = self.run_mut(id, run_no) {
                    r.kinds.clear();
                }
                self.respond(id, run_no, wid, &calls::Unsubscribed { kinds: [] });
            }
            Call::SessionsList { cursor, limit } => {
                let items = cx.views.session_items();
                let page = page_after(items, cursor.as_deref(), session_cursor);
                let answer = page.and_then(|(mut items, more)| {
                    let more = more || items.len() as u64 > limit;
                    items.truncate(limit as usize);
                    wire::encode_page(wid, "sessions", &items, more, session_cursor).map(|(l, _)| l)
                });
                self.reply(id, run_no, wid, answer);
            }
            Call::SessionsGet { session } => {
                let answer = match cx.views.session_item(&session) {
                    Some(item) => wire::encode_response(wid, &item),
                    None => Err(HostError::new(
                        HostErrorKind::NotFound,
                        &format!("No session {session} on this daemon"),
                    )),
                };
                self.reply(id, run_no, wid, answer);
            }
            Call::SeatsList { cursor } => {
                let items = cx.views.seat_items();
                let answer =
                    page_after(items, cursor.as_deref(), seat_cursor).and_then(|(items, more)| {
                        wire::encode_page(wid, "seats", &items, more, seat_cursor).map(|(l, _)| l)
                    });
                self.reply(id, run_no, wid, answer);
            }
            Call::LanesList { cursor } => {
                let fresh = self.lanes_copy.as_ref().is_some_and(|(t, _)| {
                    cx.now.saturating_duration_since(*t)
                        < Duration::from_millis(limits::PLUGIN_LANES_COPY_MS)
                });
                if !fresh {
                    self.lanes_copy = Some((cx.now, cx.views.lane_items()));
                    self.emit(Effect::FreshenLaneHeads);
                }
                let items = self
                    .lanes_copy
                    .as_ref()
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default();
                let answer = page_after(items, cursor.as_deref(), |l| l.cursor()).and_then(
                    |(items, more)| {
                        wire::encode_page(wid, "lanes", &items, more, |l| l.cursor())
                            .map(|(l, _)| l)
                    },
                );
                self.reply(id, run_no, wid, answer);
            }
            Call::StorageGet { key } => {
                let value = self.plugins.get(id).and_then(|p| p.storage.get(&key));
                let line = wire::encode_storage_value(wid, &key, value.map(String::as_str));
                self.reply(id, run_no, wid, line);
            }
            Call::StorageList => {
                let Some(p) = self.plugins.get(id) else {
                    return;
                };
                let keys: Vec<StorageWritten> = p
                    .storage
                    .iter()
                    .map(|(k, v)| StorageWritten {
                        key: k.clone(),
                        bytes: v.len(),
                    })
                    .collect();
                let bytes = keys.iter().map(|k| k.bytes).sum();
                self.respond(id, run_no, wid, &StorageKeys { keys, bytes });
            }
            Call::StorageSet { key, value } => {
                self.storage_set(id, run_no, wid, key, value, cx.now)
            }
            Call::StorageDelete { key } => self.storage_delete(id, run_no, wid, key, cx.now),
            Call::TasksCreate(request) => self.task_create(id, run_no, wid, request, cx),
            Call::TasksCancel { id: target } => self.task_cancel(id, run_no, wid, &target),
        }
    }

    fn storage_set(
        &mut self,
        id: &str,
        run_no: u64,
        wid: &str,
        key: String,
        value: String,
        now: Instant,
    ) {
        let Some(p) = self.plugins.get_mut(id) else {
            return;
        };
        let old = p.storage.get(&key).map(String::len);
        if let Err(e) = p.storage_usage().after_set(old, value.len()) {
            self.reply(id, run_no, wid, Err(e));
            return;
        }
        p.note_records(1, now);
        let previous = p.storage.insert(key.clone(), value.clone());
        let op = Op::Exec {
            sql: "INSERT OR REPLACE INTO plugin_storage (plugin, key, value) VALUES (?1, ?2, ?3)",
            params: vec![
                id.to_string().into(),
                key.clone().into(),
                value.clone().into(),
            ],
        };
        let ack = Ack::StorageSet {
            plugin: id.to_string(),
            run_no,
            wid: wid.to_string(),
            key,
            value,
            previous,
        };
        self.ledger(vec![op], Vec::new(), ack);
    }

    fn storage_delete(&mut self, id: &str, run_no: u64, wid: &str, key: String, now: Instant) {
        let Some(p) = self.plugins.get_mut(id) else {
            return;
        };
        let Some(previous) = p.storage.remove(&key) else {
            self.respond(
                id,
                run_no,
                wid,
                &StorageDeleted {
                    key,
                    deleted: false,
                },
            );
            return;
        };
        p.note_records(1, now);
        let op = Op::Exec {
            sql: "DELETE FROM plugin_storage WHERE plugin = ?1 AND key = ?2",
            params: vec![id.to_string().into(), key.clone().into()],
        };
        let ack = Ack::StorageDelete {
            plugin: id.to_string(),
            run_no,
            wid: wid.to_string(),
            key,
            previous,
        };
        self.ledger(vec![op], Vec::new(), ack);
    }

    /// A batch of the host committed (`Ok`), or the ledger refused it.
    pub fn committed(&mut self, ack: Ack, result: Result<(), String>) {
        match ack {
            Ack::StorageSet {
                plugin,
                run_no,
                wid,
                key,
                value,
                previous,
            } => match result {
                Ok(()) => {
                    let bytes = value.len();
                    self.respond(&plugin, run_no, &wid, &StorageWritten { key, bytes })
                }
                Err(e) => {
                    crate::error!("plugin {plugin}: storage.set was not committed: {e}");
                    if let Some(p) = self.plugins.get_mut(&plugin) {
                        if p.storage.get(&key) == Some(&value) {
                            match previous {
                                Some(v) => p.storage.insert(key, v),
                                None => p.storage.remove(&key),
                            };
                        }
                    }
                    let e = HostError::of(HostErrorKind::Unavailable);
                    self.reply(&plugin, run_no, &wid, Err(e));
                }
            },
            Ack::StorageDelete {
                plugin,
                run_no,
                wid,
                key,
                previous,
            } => match result {
                Ok(()) => self.respond(
                    &plugin,
                    run_no,
                    &wid,
                    &StorageDeleted { key, deleted: true },
                ),
                Err(e) => {
                    crate::error!("plugin {plugin}: storage.delete was not committed: {e}");
                    if let Some(p) = self.plugins.get_mut(&plugin) {
                        p.storage.entry(key).or_insert(previous);
                    }
                    let e = HostError::of(HostErrorKind::Unavailable);
                    self.reply(&plugin, run_no, &wid, Err(e));
                }
            },
            Ack::Removed { plugin, to } => self.removal_committed(plugin, to, result),
            Ack::Task(ack) => self.task_committed(ack, result),
        }
    }

    /// Takes a task request's share of the plugin's limits: 20 a day and 3
    /// of the hour's ledger records. `Err` is the rate-limited answer.
    pub(super) fn take_task_budget(&mut self, id: &str, now: Instant) -> Result<(), HostError> {
        let Some(p) = self.plugins.get_mut(id) else {
            return Err(HostError::internal());
        };
        let day = Duration::from_millis(limits::PLUGIN_TASK_WINDOW_MS);
        while p.task_times.front().is_some_and(|t| t.elapsed() > day) {
            p.task_times.pop_front();
        }
        if p.task_times.len() >= limits::PLUGIN_TASKS_PER_DAY {
            return Err(HostError::new(
                HostErrorKind::RateLimited,
                "20 task requests in 24 hours",
            ));
        }
        if p.records_left() < limits::PLUGIN_LEDGER_RECORDS_PER_TASK {
            return Err(HostError::new(
                HostErrorKind::RateLimited,
                "too few of the hour's 60 ledger records are left for a task request",
            ));
        }
        p.task_times.push_back(now);
        p.note_records(limits::PLUGIN_LEDGER_RECORDS_PER_TASK, now);
        Ok(())
    }

    /// The last event delivered to the plugin in this run.
    pub fn last_event(&self, id: &str) -> Option<(EventKind, String)> {
        self.plugins.get(id)?.run.as_ref()?.last_event.clone()
    }

    fn on_answer(
        &mut self,
        id: &str,
        run_no: u64,
        hid: &str,
        answer: Result<Map<String, Value>, wire::PluginError>,
        cx: &Cx,
    ) {
        let Some(run) = self.run_mut(id, run_no) else {
            return;
        };
        let Some(call) = run.host_pending.remove(hid) else {
            return;
        };
        match call {
            HostCall::Initialize => {
                let api = answer
                    .map_err(|_| ())
                    .and_then(|r| wire::parse_initialize_result(&r).map_err(|_| ()));
                let want = self
                    .plugins
                    .get(id)
                    .and_then(|p| p.approved.as_ref())
                    .map(|l| l.manifest.api.clone());
                match api {
                    Err(()) => self.fault(id, run_no, Fault::InitializeFailed),
                    Ok(api) if Some(&api) != want.as_ref() => {
                        self.fault(id, run_no, Fault::ApiMismatch)
                    }
                    Ok(_) => {
                        let Some(p) = self.plugins.get_mut(id) else {
                            return;
                        };
                        p.phase = Phase::Running;
                        if let Some(r) = p.run.as_mut() {
                            r.initialized = true;
                        }
                        crate::info!("plugin {id} is running");
                        let every = Duration::from_millis(cx.cfg.ping_interval_ms);
                        self.schedule_ping(id, run_no, every);
                    }
                }
            }
            HostCall::Ping => {
                if let Some(r) = self.run_mut(id, run_no) {
                    if r.ping_due.as_deref() == Some(hid) {
                        r.ping_due = None;
                    }
                }
            }
            HostCall::Command { to, command } => {
                self.emit(Effect::CancelTimer(TimerKey::Command {
                    plugin: id.to_string(),
                    run_no,
                    hid: hid.to_string(),
                }));
                if let Some(r) = self.run_mut(id, run_no) {
                    r.commands = r.commands.saturating_sub(1);
                }
                let result = match answer {
                    Ok(r) => match wire::parse_command_result(&r) {
                        Ok(t) => Ok(
                            serde_json::json!({"command": command, "text": text::clean_command_text(&t)}),
                        ),
                        Err(_) => Err(RpcError::new(
                            Code::PluginError,
                            "the plugin answered command.run with a result that is not valid",
                        )),
                    },
                    Err(e) => Err(RpcError::new(
                        Code::PluginError,
                        format!("the plugin failed: {}: {}", e.code, e.client_message()),
                    )),
                };
                self.reply_to(to, result);
            }
            HostCall::Shutdown => {}
        }
    }

    fn schedule_ping(&mut self, id: &str, run_no: u64, after: Duration) {
        let key = TimerKey::Ping {
            plugin: id.to_string(),
            run_no,
        };
        self.run_timer(id, key, after);
    }

    fn ping(&mut self, id: &str, run_no: u64, cx: &Cx) {
        let Some(run) = self.run_mut(id, run_no) else {
            return;
        };
        if run.stopping.is_some() || run.fault.is_some() || run.stdout_closed {
            return;
        }
        let Some(hid) = self.send_request(id, HostRequest::Ping, HostCall::Ping) else {
            return;
        };
        if let Some(r) = self.run_mut(id, run_no) {
            r.ping_due = Some(hid.clone());
        }
        let timeout = Duration::from_millis(cx.cfg.ping_timeout_ms);
        let key = TimerKey::PingTimeout {
            plugin: id.to_string(),
            run_no,
            hid,
        };
        self.run_timer(id, key, timeout);
    }

    /// A timer of the host fired.
    pub fn on_timer(&mut self, key: TimerKey, cx: &Cx) {
        match key {
            TimerKey::Initialize { plugin, run_no } => {
                if self
                    .run_mut(&plugin, run_no)
                    .is_some_and(|r| !r.initialized)
                {
                    self.fault(&plugin, run_no, Fault::InitializeTimeout);
                }
            }
            TimerKey::StdoutClosed { plugin, run_no } => {
                if self.run_mut(&plugin, run_no).is_some() {
                    self.fault(&plugin, run_no, Fault::StdoutClosed);
                }
            }
            TimerKey::ExitGrace { plugin, child } => {
                let status = self
                    .plugins
                    .get(&plugin)
                    .and_then(|p| p.run.as_ref())
                    .filter(|r| r.child == child)
                    .and_then(|r| r.exited);
                if let (true, Some(status)) = (self.by_child.contains_key(&child), status) {
                    self.finish_exit(child, status);
                }
            }
            TimerKey::Ping { plugin, run_no } => self.ping(&plugin, run_no, cx),
            TimerKey::PingTimeout {
                plugin,
                run_no,
                hid,
            } => {
                if self
                    .run_mut(&plugin, run_no)
                    .is_some_and(|r| r.ping_due.as_deref() == Some(hid.as_str()))
                {
                    self.fault(&plugin, run_no, Fault::Unresponsive);
                } else if self.run_mut(&plugin, run_no).is_some() {
                    // "ping every 30 seconds" (seed 000): the next one is
                    // due an interval after this one was sent, and its
                    // answer window has already used part of that interval.
                    let every = Duration::from_millis(cx.cfg.ping_interval_ms);
                    let timeout = Duration::from_millis(cx.cfg.ping_timeout_ms);
                    self.schedule_ping(&plugin, run_no, every.saturating_sub(timeout));
                }
            }
            TimerKey::Term { plugin, run_no } => {
                let Some(r) = self.run_mut(&plugin, run_no) else {
                    return;
                };
                let child = r.child;
                self.emit(Effect::Signal {
                    child,
                    signal: libc::SIGTERM,
                });
                self.run_timer(
                    &plugin,
                    TimerKey::Kill {
                        plugin: plugin.clone(),
                        run_no,
                    },
                    Duration::from_millis(limits::PLUGIN_SHUTDOWN_KILL_MS),
                );
            }
            TimerKey::Kill { plugin, run_no } => {
                if let Some(r) = self.run_mut(&plugin, run_no) {
                    let child = r.child;
                    self.emit(Effect::Signal {
                        child,
                        signal: libc::SIGKILL,
                    });
                }
            }
            TimerKey::Command {
                plugin,
                run_no,
                hid,
            } => {
                let Some(r) = self.run_mut(&plugin, run_no) else {
                    return;
                };
                if let Some(HostCall::Command { to, .. }) = r.host_pending.remove(&hid) {
                    r.commands = r.commands.saturating_sub(1);
                    let bound = cx.cfg.command_timeout_ms;
                    self.reply_to(
                        to,
                        Err(RpcError::new(
                            Code::PluginTimeout,
                            format!("the plugin did not answer command.run in {bound} ms"),
                        )),
                    );
                }
            }
            TimerKey::Restart { plugin } => {
                if let Some(p) = self.plugins.get_mut(&plugin) {
                    p.restart_timer = false;
                    if matches!(p.phase, Phase::Restarting(_)) {
                        p.phase = Phase::Idle;
                        self.start(&plugin, cx);
                    }
                }
            }
            TimerKey::RemoveAbort { plugin } => self.abort_timed_out(&plugin, cx),
            TimerKey::Dispatch { rid } => self.landed(&rid, tasks::Landing::TimedOut, cx),
            TimerKey::Watch => self.watch_due(),
        }
    }

    /// Ends a run for a fault: the process group is killed now.
    pub fn fault(&mut self, id: &str, run_no: u64, f: Fault) {
        let Some(run) = self.run_mut(id, run_no) else {
            return;
        };
        if run.fault.is_some() || run.stopping.is_some() {
            return;
        }
        run.fault = Some(f);
        let child = run.child;
        crate::warn!("plugin {id}: fault {}; stopping it", f.name());
        self.emit(Effect::Signal {
            child,
            signal: libc::SIGKILL,
        });
    }

    /// Asks a running plugin to stop (seed 000, shutdown).
    pub fn stop(&mut self, id: &str, reason: ShutdownReason) {
        let Some(p) = self.plugins.get_mut(id) else {
            return;
        };
        if std::mem::take(&mut p.restart_timer) {
            self.emit(Effect::CancelTimer(TimerKey::Restart {
                plugin: id.to_string(),
            }));
        }
        let Some(run) = self.plugins.get_mut(id).and_then(|p| p.run.as_mut()) else {
            return;
        };
        if run.stopping.is_some() {
            return;
        }
        let (run_no, child) = (run.run_no, run.child);
        if run.fault.is_some() {
            run.stopping = Some(reason);
            return;
        }
        if let Some(p) = self.plugins.get_mut(id) {
            p.phase = Phase::Stopping;
        }
        self.send_request(id, HostRequest::Shutdown(reason), HostCall::Shutdown);
        if let Some(r) = self.run_mut(id, run_no) {
            r.stopping = Some(reason);
        }
        self.emit(Effect::CloseStdin(child));
        self.run_timer(
            id,
            TimerKey::Term {
                plugin: id.to_string(),
                run_no,
            },
            Duration::from_millis(limits::PLUGIN_SHUTDOWN_TERM_MS),
        );
    }

    /// A plugin process was reaped. What it wrote before it exited is read
    /// first: the run ends when its stdout has closed too (or 1 s later,
    /// when a descendant holds it open).
    pub fn on_exit(&mut self, child: ChildId, status: ExitStatus, cx: &Cx) {
        let Some(id) = self.by_child.get(&child).cloned() else {
            return;
        };
        if cx.pipes.stdout_open(child) {
            let Some(run) = self.plugins.get_mut(&*id).and_then(|p| p.run.as_mut()) else {
                return;
            };
            run.exited = Some(status);
            let key = TimerKey::ExitGrace {
                plugin: id.to_string(),
                child,
            };
            self.run_timer(
                &id,
                key,
                Duration::from_millis(limits::PLUGIN_STDOUT_CLOSED_GRACE_MS),
            );
            return;
        }
        self.finish_exit(child, status);
    }

    /// The run of `child` is over: the router reads its error output and
    /// forgets it ([`Effect::Reap`]), then [`Self::reaped`] goes on.
    fn finish_exit(&mut self, child: ChildId, status: ExitStatus) {
        let Some(plugin) = self.by_child.remove(&child) else {
            return;
        };
        self.emit(Effect::Reap {
            plugin: plugin.to_string(),
            child,
            status,
        });
    }

    /// What is left of a run once its child is forgotten: `raw_tail` is
    /// the end of its error output.
    pub fn reaped(&mut self, id: &str, status: ExitStatus, raw_tail: &[u8], cx: &Cx) {
        let note = self.isolation.missing.clone();
        let Some(p) = self.plugins.get_mut(id) else {
            return;
        };
        let Some(run) = p.run.take() else { return };
        let mut tail = text::stderr_tail(raw_tail);
        if let Some(why) = note {
            tail = format!("[omniconfluxd] this plugin ran without isolation: {why}\n{tail}");
            tail = text::tail_bytes(&tail, limits::PLUGIN_STDERR_TAIL_MAX).to_string();
        }
        let fault = match (run.fault, run.stopping) {
            (Some(f), _) => Some(f),
            (None, Some(_)) => None,
            (None, None) if process::looks_out_of_memory(&tail) => Some(Fault::Memory),
            (None, None) if !run.initialized => Some(Fault::LoadRefused),
            (None, None) => Some(Fault::Exit),
        };
        let fault = match fault {
            Some(Fault::Exit | Fault::LoadRefused) if process::looks_out_of_memory(&tail) => {
                Some(Fault::Memory)
            }
            f => f,
        };
        p.stderr_tail = tail;
        p.last_exit = Some(LastExit {
            at: crate::clock::now_ts(),
            code: status.code,
            signal: status.signal.map(signal_name),
            fault,
        });
        crate::info!(
            "plugin {id} exited ({}){}",
            status
                .code
                .map(|c| format!("code {c}"))
                .or_else(|| status.signal.map(signal_name))
                .unwrap_or_default(),
            fault
                .map(|f| format!(" with fault {}", f.name()))
                .unwrap_or_default()
        );
        for key in run.timers {
            self.emit(Effect::CancelTimer(key));
        }
        let run_no = run.run_no;
        for (hid, call) in run.host_pending {
            if let HostCall::Command { to, .. } = call {
                self.emit(Effect::CancelTimer(TimerKey::Command {
                    plugin: id.to_string(),
                    run_no,
                    hid,
                }));
                self.reply_to(
                    to,
                    Err(RpcError::new(
                        Code::PluginNotRunning,
                        "the plugin stopped before it answered",
                    )),
                );
            }
        }
        self.orphan_run(id, run_no);
        match fault {
            Some(f) => self.crashed(id, f, cx),
            None => {
                let Some(p) = self.plugins.get_mut(id) else {
                    return;
                };
                p.phase = Phase::Idle;
                match std::mem::replace(&mut p.after_stop, AfterStop::Nothing) {
                    AfterStop::Nothing => {}
                    AfterStop::Start => self.start(id, cx),
                    AfterStop::Remove { to } => self.finish_removal(id, Some(to), cx),
                }
            }
        }
    }

    /// Counts a crash and schedules the restart, or gives up.
    fn crashed(&mut self, id: &str, f: Fault, cx: &Cx) {
        let limit = cx.cfg.crash_limit as usize;
        let base = cx.cfg.restart_backoff_ms;
        let Some(p) = self.plugins.get_mut(id) else {
            return;
        };
        p.crashes.push_back(Instant::now());
        let n = p.crashes();
        match std::mem::replace(&mut p.after_stop, AfterStop::Nothing) {
            AfterStop::Remove { to } => {
                self.finish_removal(id, Some(to), cx);
                return;
            }
            AfterStop::Start => {
                p.phase = Phase::Idle;
                self.start(id, cx);
                return;
            }
            AfterStop::Nothing => {}
        }
        if !p.rec.enabled || cx.stopping {
            p.phase = Phase::Idle;
            return;
        }
        if n >= limit {
            crate::warn!("plugin {id}: {n} crashes in 10 minutes; giving up (crash-limit)");
            p.phase = Phase::Failed("crash-limit");
            return;
        }
        p.phase = Phase::Restarting(f);
        p.restart_timer = true;
        let delay = base
            .saturating_mul(1u64 << (n.saturating_sub(1)).min(16))
            .min(limits::PLUGIN_RESTART_BACKOFF_MAX_MS);
        self.timer(
            TimerKey::Restart {
                plugin: id.to_string(),
            },
            Duration::from_millis(delay),
        );
    }

    /// A dispatch a removal aborts has ended: `stopped` sessions stopped
    /// with its lane, and the worktree it left, if any. The last one lets a
    /// removal that waited for it finish.
    pub fn abort_landed(
        &mut self,
        id: &str,
        rid: &str,
        stopped: usize,
        worktree: Option<PathBuf>,
        cx: &Cx,
    ) {
        let created = self
            .tasks
            .by_id
            .get(rid)
            .map(|r| r.created_at.clone())
            .unwrap_or_default();
        let Some(p) = self.plugins.get_mut(id) else {
            return;
        };
        p.stopped_sessions += stopped;
        if let Some(w) = worktree.filter(|w| w.exists()) {
            p.removal.worktrees.push((created, w.display().to_string()));
        }
        p.removal.aborting.remove(rid);
        if p.removal.aborting.is_empty() {
            if std::mem::take(&mut p.removal.timer) {
                self.emit(Effect::CancelTimer(TimerKey::RemoveAbort {
                    plugin: id.to_string(),
                }));
            }
            let Some(p) = self.plugins.get_mut(id) else {
                return;
            };
            if let Some(to) = p.removal.parked.take() {
                self.finish_removal(id, to, cx);
            }
        }
    }

    /// A dispatch cut off by a daemon stop, aborted by plugin.remove:
    /// nothing runs any more, but its lane may have started and its
    /// worktree may be there. Read from the request as the host stored it.
    pub fn abort_cut_off(&mut self, id: &str, rid: &str) {
        let Some(request) = self.tasks.stored_request(rid) else {
            return;
        };
        self.emit(Effect::Abort {
            plugin: id.to_string(),
            rid: rid.to_string(),
            how: Aborted::CutOff(request),
        });
    }

    /// Removes what is left of a plugin once its process is gone, and
    /// answers plugin.remove. A step that fails leaves it remove-pending;
    /// so does a dispatch it aborts that does not end within
    /// `plugins.remove_abort_timeout_ms`: the reply is then
    /// `plugin-remove-pending`, and the removal finishes by itself once the
    /// dispatch ends (it is bounded by `plugins.task_dispatch_timeout_ms`).
    pub fn finish_removal(&mut self, id: &str, to: Option<ReplyKey>, cx: &Cx) {
        if let Some(p) = self.plugins.get_mut(id)
            && !p.removal.aborting.is_empty()
        {
            p.removal.parked = Some(to);
            if !std::mem::replace(&mut p.removal.timer, true) {
                self.timer(
                    TimerKey::RemoveAbort {
                        plugin: id.to_string(),
                    },
                    Duration::from_millis(cx.cfg.remove_abort_timeout_ms),
                );
            }
            return;
        }
        let Some(store) = &self.store else {
            return;
        };
        match store.retire_plugin(id) {
            Ok(retired) => {
                if let Some(old) = retired {
                    self.discard_copy(old);
                }
                let op = Op::Exec {
                    sql: "DELETE FROM plugin_storage WHERE plugin = ?1",
                    params: vec![id.to_string().into()],
                };
                let ack = Ack::Removed {
                    plugin: id.to_string(),
                    to,
                };
                self.ledger(vec![op], Vec::new(), ack);
            }
            Err(e) => {
                crate::error!(
                    "plugin {id}: unable to delete its folder: {}; it stays remove-pending",
                    crate::errors::io_cause(&e)
                );
                if let Some(p) = self.plugins.get_mut(id) {
                    p.rec.removal = Some("remove-failed".into());
                }
                self.persist();
                if let Some(to) = to {
                    self.when_saved(Saved::Reply {
                        to,
                        result: Err(RpcError::new(
                            Code::Unavailable,
                            "the plugin's folder could not be deleted; it stays remove-pending",
                        )),
                    });
                }
            }
        }
    }

    /// The removal's deletion of the plugin's storage committed, or not.
    fn removal_committed(&mut self, owner: String, to: Option<ReplyKey>, r: Result<(), String>) {
        if let Err(e) = r {
            crate::error!(
                "plugin {owner}: its storage was not deleted: {e}; it stays remove-pending"
            );
            if let Some(p) = self.plugins.get_mut(&owner) {
                p.rec.removal = Some("remove-failed".into());
            }
            self.persist();
            if let Some(to) = to {
                self.when_saved(Saved::Reply {
                    to,
                    result: Err(RpcError::new(
                        Code::Unavailable,
                        "the plugin's data could not be deleted; it stays remove-pending",
                    )),
                });
            }
            return;
        }
        let (stopped, mut worktrees) = self.plugins.remove(&owner).map_or((0, Vec::new()), |p| {
            (p.stopped_sessions, p.removal.worktrees)
        });
        crate::info!("plugin {owner} removed");
        // Newest requests first, each worktree once, at most 50.
        worktrees.sort_by(|a, b| b.0.cmp(&a.0));
        let mut listed: Vec<String> = Vec::new();
        for (_, w) in worktrees {
            if !listed.contains(&w) && listed.len() < limits::PLUGIN_REMOVE_WORKTREES_MAX {
                listed.push(w);
            }
        }
        // The folder and the storage are gone whatever the record says, so
        // the answer is the removal's even when the record could not be
        // written (the log says so; the record left on disk says
        // remove-pending, and the next start finishes the removal).
        self.persist();
        if let Some(to) = to {
            let stopped = stopped.min(limits::PLUGIN_REMOVE_STOPPED_MAX);
            self.when_saved(Saved::Reply {
                to,
                result: Ok(serde_json::json!({"plugin": owner, "removed": true, "stopped": stopped, "worktrees": listed})),
            });
        }
    }

    /// A dispatch the removal aborts did not end in time: the plugin stays
    /// remove-pending (reason `remove-failed`) and the removal finishes by
    /// itself once it ends.
    fn abort_timed_out(&mut self, id: &str, cx: &Cx) {
        let Some(p) = self.plugins.get_mut(id) else {
            return;
        };
        if !std::mem::take(&mut p.removal.timer) {
            return;
        }
        p.rec.removal = Some("remove-failed".into());
        let n = p.removal.aborting.len();
        let to = p.removal.parked.as_mut().and_then(Option::take);
        crate::warn!(
            "plugin {id}: {n} aborted dispatch(es) did not end in {} ms; it stays remove-pending",
            cx.cfg.remove_abort_timeout_ms
        );
        self.persist();
        if let Some(to) = to {
            self.when_saved(Saved::Reply {
                to,
                result: Err(RpcError::new(
                    Code::PluginRemovePending,
                    format!("{n} dispatch(es) of the plugin did not end when aborted; it stays remove-pending and the daemon finishes the removal when they end"),
                )),
            });
        }
    }

    /// Offers committed events to the running plugins (module comment).
    pub fn offer_events(&mut self, events: &[Appended], cx: &Cx) {
        if !self.plugins.values().any(|p| {
            p.run
                .as_ref()
                .is_some_and(|r| r.initialized && !r.kinds.is_empty())
        }) {
            return;
        }
        for ev in events {
            let Some(event) = map_event(ev) else { continue };
            let Some(line) = wire::encode_event(&event) else {
                continue;
            };
            let ids: Vec<String> = self
                .plugins
                .iter()
                .filter(|(_, p)| {
                    p.has(Permission::EventsRead)
                        && p.run.as_ref().is_some_and(|r| {
                            r.initialized
                                && r.stopping.is_none()
                                && r.fault.is_none()
                                && r.kinds.contains(&event.kind)
                        })
                })
                .map(|(k, _)| k.clone())
                .collect();
            for id in ids {
                self.deliver(&id, &line, event.kind, &event.subject, cx);
            }
        }
    }

    fn deliver(&mut self, id: &str, line: &str, kind: EventKind, subject: &str, cx: &Cx) {
        self.flush_dropped(id, cx);
        let Some(run) = self.plugins.get(id).and_then(|p| p.run.as_ref()) else {
            return;
        };
        let full = run.dropped > 0
            || self.queued(run.child, cx) + line.len() + 1 > limits::PLUGIN_EVENT_QUEUE_BYTES;
        let Some(run) = self.plugins.get_mut(id).and_then(|p| p.run.as_mut()) else {
            return;
        };
        if full {
            run.dropped += 1;
            return;
        }
        run.last_event = Some((kind, subject.to_string()));
        self.write_line(id, line);
    }

    /// Sends command.run and answers `to` when the plugin does. The socket
    /// method checked that the plugin runs; a plugin that does not (it
    /// cannot happen in the same reactor step) is answered
    /// `plugin-not-running` rather than never.
    pub fn run_command(
        &mut self,
        id: &str,
        to: ReplyKey,
        command: String,
        input: Option<String>,
        cx: &Cx,
    ) {
        let Some(run) = self.plugins.get_mut(id).and_then(|p| p.run.as_mut()) else {
            let gone = RpcError::new(
                Code::PluginNotRunning,
                "the command's plugin is not running",
            );
            return self.reply_to(to, Err(gone));
        };
        run.commands += 1;
        let run_no = run.run_no;
        let full = format!("{id}.{command}");
        let call = HostCall::Command { to, command: full };
        let Some(hid) = self.send_request(id, HostRequest::CommandRun { command, input }, call)
        else {
            return;
        };
        let key = TimerKey::Command {
            plugin: id.to_string(),
            run_no,
            hid,
        };
        self.timer(key, Duration::from_millis(cx.cfg.command_timeout_ms));
    }

    /// Counts each running plugin's processes and memory (module comment of
    /// [`super::process`]); runs while any plugin runs. `watching` holds
    /// while the watch's timer is set or its count runs: one at a time.
    fn ensure_watch(&mut self, cx: &Cx) {
        if std::mem::replace(&mut self.watching, true) {
            return;
        }
        self.timer(
            TimerKey::Watch,
            Duration::from_millis(cx.cfg.watch_interval_ms),
        );
    }

    /// The watch is due: a job walks /proc (every process of the machine,
    /// which is file work the reactor does not wait for) and counts each
    /// running plugin's tree; [`Self::watched`] judges the count.
    fn watch_due(&mut self) {
        let roots: Vec<i32> = self.watched_runs().map(|r| r.2).collect();
        if roots.is_empty() {
            self.watching = false;
            return;
        }
        self.emit(Effect::Job(Job::Sample { roots }));
    }

    fn watched_runs(&self) -> impl Iterator<Item = (String, u64, i32)> + '_ {
        self.plugins.iter().filter_map(|(k, p)| {
            p.run
                .as_ref()
                .filter(|r| r.fault.is_none())
                .map(|r| (k.clone(), r.run_no, r.pid))
        })
    }

    /// What the watch counted, by root pid: a tree over its bounds is a
    /// fault. The watch goes on while a plugin runs.
    fn watched(&mut self, usage: &HashMap<i32, process::Usage>, cx: &Cx) {
        self.watching = false;
        let runs: Vec<(String, u64, i32)> = self.watched_runs().collect();
        if runs.is_empty() {
            return;
        }
        let max_procs = cx.cfg.max_processes;
        let max_mem = cx.cfg.memory_mb.saturating_mul(1024 * 1024);
        for (id, run_no, pid) in runs {
            let Some(u) = usage.get(&pid) else { continue };
            if u.processes > max_procs {
                self.fault(&id, run_no, Fault::Processes);
            } else if u.rss_bytes > max_mem {
                self.fault(&id, run_no, Fault::Memory);
            }
        }
        self.ensure_watch(cx);
    }

    /// Begins the daemon's stop for the plugins: `shutdown {reason:
    /// daemon-stop}` to each.
    pub fn stop_all(&mut self) {
        let ids: Vec<String> = self.plugins.keys().cloned().collect();
        for id in ids {
            self.stop(&id, ShutdownReason::DaemonStop);
        }
    }

    /// True when no plugin process is left and no write of the records
    /// runs or waits.
    pub fn all_stopped(&self) -> bool {
        self.by_child.is_empty() && self.records_idle()
    }
}

/// plugin.get's `lanes`, computed when it is read: the lanes of the
/// plugin's record at work, newest first, at most 50.
pub fn lanes_at_work(views: &dyn Views, rec: &Record) -> Vec<String> {
    let mut live: Vec<(i64, &String)> = rec
        .lanes
        .iter()
        .filter_map(|l| views.lane_at_work(l).map(|created| (created, l)))
        .collect();
    live.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(a.1)));
    live.into_iter()
        .take(limits::PLUGIN_GET_LIST_MAX)
        .map(|(_, l)| l.clone())
        .collect()
}

/// A sessions.list item's cursor: its session id.
fn session_cursor(item: &Value) -> String {
    item["session"].as_str().unwrap_or_default().to_string()
}

/// A seats.list item's cursor: its harness id.
fn seat_cursor(item: &Value) -> String {
    item["harness"].as_str().unwrap_or_default().to_string()
}

/// The items after `cursor` (an item's cursor), and whether any are left
/// out by a page bound the caller applies. An unknown cursor is
/// invalid-params: "name something the daemon does not know, such as a
/// cursor".
fn page_after<T>(
    items: Vec<T>,
    cursor: Option<&str>,
    cursor_of: impl Fn(&T) -> String,
) -> Result<(Vec<T>, bool), HostError> {
    match cursor {
        None => Ok((items, false)),
        Some(c) => match items.iter().position(|i| cursor_of(i) == c) {
            Some(at) => Ok((items.into_iter().skip(at + 1).collect(), false)),
            None => Err(HostError::invalid_params(
                "cursor names no item of the daemon",
            )),
        },
    }
}

/// The members each kind's data carries (seed 000, Event kinds).
fn data_members(kind: EventKind) -> &'static [&'static str] {
    match kind {
        EventKind::SessionStart => &["harness", "provider", "transport", "flags"],
        EventKind::SessionEnd => &["code", "signal"],
        EventKind::TurnStart => &["turn", "mode", "chars"],
        EventKind::TurnEnd => &["reason"],
        EventKind::ApprovalRequest => &["requestId", "action", "risk"],
        EventKind::ApprovalResolved => &["requestId", "decision", "delivered"],
        EventKind::LaneStart => &["session", "builder", "verifier"],
        EventKind::LaneStage => &["stage", "since"],
        EventKind::LaneVerdict => &["commit", "verdict", "round", "defects"],
    }
}

/// The one ledger stream of every lane's events (DESIGN.md, "Ledger").
const LANES_STREAM: &str = "lanes";

/// A ledger event as the page's event, or None when it is not one (module
/// comment, "Events").
pub fn map_event(ev: &Appended) -> Option<wire::Event> {
    let kind = EventKind::from_name(&ev.kind)?;
    if ev.seq < 1 || !calls::is_timestamp(&ev.ts) {
        return None;
    }
    let Value::Object(raw) = serde_json::from_str::<Value>(&ev.data).ok()? else {
        return None;
    };
    let subject = if kind.is_lane() {
        let lane = raw.get("lane")?.as_str()?;
        (ev.stream == LANES_STREAM && calls::is_lane_id(lane)).then(|| lane.to_string())?
    } else {
        crate::ids::is_prefixed_id(&ev.stream, "s-").then(|| ev.stream.clone())?
    };
    let mut data = Map::new();
    for m in data_members(kind) {
        data.insert((*m).to_string(), raw.get(*m)?.clone());
    }
    if matches!(
        kind,
        EventKind::ApprovalRequest | EventKind::ApprovalResolved
    ) {
        let rid = data.get("requestId")?.as_str()?;
        let n = rid.strip_prefix(subject.as_str())?.strip_prefix("-a")?;
        if n.is_empty()
            || n.starts_with('0')
            || !n.bytes().all(|b| b.is_ascii_digit())
            || rid.len() > 128
        {
            return None;
        }
    }
    Some(wire::Event {
        kind,
        ts: ev.ts.clone(),
        seq: ev.seq as u64,
        subject,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::map_event;
    use crate::ledger::Appended;

    fn ev(stream: &str, kind: &str, data: &str) -> Appended {
        Appended {
            stream: stream.into(),
            seq: 3,
            kind: kind.into(),
            ts: "2026-11-14T09:31:07.412Z".into(),
            data: data.into(),
        }
    }

    #[test]
    fn the_ledger_record_count_stays_within_the_hour_budget() {
        let rec = crate::plugins::store::Record {
            plugin: "p".into(),
            enabled: true,
            approval: None,
            waiting: None,
            removal: None,
            lanes: Vec::new(),
            starting: Vec::new(),
        };
        let mut p = super::Plugin::new(rec);
        for _ in 0..1000 {
            p.note_records(1, std::time::Instant::now());
        }
        assert_eq!(
            p.ledger_records.len(),
            crate::limits::PLUGIN_LEDGER_RECORDS_PER_HOUR
        );
        assert_eq!(p.records_left(), 0);
    }

    #[test]
    fn only_session_and_lane_streams_are_offered() {
        let sid = "s-4f9a1c2b7d3e";
        let e = map_event(&ev(sid, "turn.end", r#"{"reason":"completed","secret":1}"#)).unwrap();
        assert_eq!((e.subject.as_str(), e.data.len()), (sid, 1));
        assert!(map_event(&ev("x-s1", "turn.end", r#"{"reason":"completed"}"#)).is_none());
        assert!(map_event(&ev("lanes", "turn.end", r#"{"reason":"completed"}"#)).is_none());
        let lane =
            r#"{"lane":"t-0c1d2e3f4a5b","stage":"building","since":"2026-11-14T09:31:07.412Z"}"#;
        assert_eq!(
            map_event(&ev("lanes", "lane.stage", lane)).unwrap().subject,
            "t-0c1d2e3f4a5b"
        );
        assert!(map_event(&ev(sid, "lane.stage", lane)).is_none());
        assert!(map_event(&ev("x-lanes", "lane.stage", lane)).is_none());
        let own = format!(r#"{{"requestId":"{sid}-a1","action":"execute","risk":"high"}}"#);
        assert!(map_event(&ev(sid, "approval.request", &own)).is_some());
        assert!(map_event(&ev("s-000000000000", "approval.request", &own)).is_none());
        let task = r#"{"requestId":"plugin_3b0c5a52-6d0f-4f0e-9d5c-1f2a3b4c5d6e","action":"task","risk":"high"}"#;
        assert!(map_event(&ev(sid, "approval.request", task)).is_none());
    }
}

/// The host's glue, in memory: no thread, no process, no socket. A plugin
/// "runs" as child 7; what it writes is fed to [`Host::on_output`], and
/// what the host asks of the daemon is read from its effects.
#[cfg(test)]
mod glue_tests {
    use super::*;
    use crate::config::FileConfig;
    use crate::core::inbox::{Answerer, Verdict};
    use crate::lanes::controller::Dispatched;
    use crate::plugins::effects::Pipes;
    use serde_json::json;

    const CHILD: ChildId = 7;

    struct NoPipes;

    impl Pipes for NoPipes {
        fn queued(&self, _: ChildId) -> usize {
            0
        }
        fn stdout_open(&self, _: ChildId) -> bool {
            false
        }
    }

    /// Lanes at work: `t-...` ones only.
    struct FewViews;

    impl Views for FewViews {
        fn session_items(&self) -> Vec<Value> {
            Vec::new()
        }
        fn session_item(&self, _: &str) -> Option<Value> {
            None
        }
        fn seat_items(&self) -> Vec<Value> {
            Vec::new()
        }
        fn lane_items(&self) -> Vec<LaneItem> {
            Vec::new()
        }
        fn lane_at_work(&self, lane: &str) -> Option<i64> {
            lane.starts_with("t-").then_some(1)
        }
    }

    fn cfg() -> PluginsSection {
        FileConfig::default().plugins
    }

    fn cx(cfg: &PluginsSection) -> Cx<'_> {
        Cx {
            cfg,
            stopping: false,
            started: Instant::now(),
            now: Instant::now(),
            pipes: &NoPipes,
            views: &FewViews,
        }
    }

    /// The lines the effects write to the plugin, parsed.
    fn written(fx: &[Effect]) -> Vec<Value> {
        fx.iter()
            .filter_map(|e| match e {
                Effect::Write { child, bytes } if *child == CHILD => {
                    Some(serde_json::from_slice(bytes).expect("a JSON line"))
                }
                _ => None,
            })
            .collect()
    }

    fn feed(h: &mut Host, c: &PluginsSection, line: Value) -> Vec<Effect> {
        let bytes = serde_json::to_vec(&line).unwrap();
        let mut out = Outputs::default();
        out.push(Output::Line(&bytes));
        h.on_output(CHILD, &out, &cx(c));
        h.take_effects()
    }

    /// A host whose plugin `pal` (with `permissions`) runs and answered
    /// initialize.
    fn running(c: &PluginsSection, permissions: &[&str]) -> Host {
        let mut json = json!({
            "manifestVersion": 1, "api": "1.1", "id": "pal", "name": "P",
            "version": "1.0.0", "description": "d", "main": "main.py",
            "permissions": permissions,
        });
        if permissions.contains(&"commands.add") {
            json["commands"] = json!([{"id": "hold", "title": "Hold"}]);
        }
        let manifest = Manifest::parse(&serde_json::to_vec(&json).unwrap()).unwrap();
        let mut p = Plugin::new(Record::new("pal"));
        p.approved = Some(Loaded {
            manifest,
            json,
            hash: "0".repeat(64),
            files_count: 1,
            files_bytes: 1,
        });
        let mut h = Host::new(None);
        h.plugins.insert("pal".into(), p);
        h.spawned("pal", Ok((CHILD, 100)), &cx(c));
        let fx = h.take_effects();
        let init = written(&fx);
        assert_eq!(init[0]["method"], "initialize", "{fx:?}");
        assert!(fx.contains(&Effect::Timer {
            key: TimerKey::Initialize {
                plugin: "pal".into(),
                run_no: 1
            },
            after: Duration::from_millis(c.initialize_timeout_ms),
        }));
        let fx = feed(&mut h, c, json!({"id": "h-1", "result": {"api": "1.1"}}));
        assert!(
            fx.iter().any(|e| matches!(
                e,
                Effect::Timer {
                    key: TimerKey::Ping { .. },
                    ..
                }
            )),
            "{fx:?}"
        );
        assert_eq!(h.plugins["pal"].state().0, "running");
        h
    }

    fn ledger(fx: Vec<Effect>) -> (Vec<Op>, Vec<Withdraw>, Ack) {
        let mut found = fx.into_iter().filter_map(|e| match e {
            Effect::Ledger { ops, withdraw, ack } => Some((ops, withdraw, ack)),
            _ => None,
        });
        let one = found.next().expect("a ledger batch");
        assert!(found.next().is_none());
        one
    }

    #[test]
    fn storage_set_is_answered_only_once_committed_and_undone_when_not() {
        let c = cfg();
        let mut h = running(&c, &["storage.own"]);
        let set =
            json!({"id": "1", "method": "storage.set", "params": {"key": "k", "value": "v1"}});
        let fx = feed(&mut h, &c, set);
        assert!(
            written(&fx).is_empty(),
            "nothing is answered before the commit"
        );
        let (ops, withdraw, ack) = ledger(fx);
        assert_eq!(ops.len(), 1);
        assert!(withdraw.is_empty());
        // A read sees the value at once (the host's copy is the truth the
        // next commit makes durable).
        let get = json!({"id": "2", "method": "storage.get", "params": {"key": "k"}});
        let fx = feed(&mut h, &c, get);
        assert_eq!(
            written(&fx),
            [json!({"id": "2", "result": {"key": "k", "value": "v1"}})]
        );
        h.committed(ack, Ok(()));
        assert_eq!(
            written(&h.take_effects()),
            [json!({"id": "1", "result": {"key": "k", "bytes": 2}})]
        );

        // A batch the ledger refuses: unavailable, and the value is undone.
        let set =
            json!({"id": "3", "method": "storage.set", "params": {"key": "k", "value": "v2"}});
        let (_, _, ack) = ledger(feed(&mut h, &c, set));
        assert_eq!(h.plugins["pal"].storage["k"], "v2");
        h.committed(ack, Err("the ledger is read-only".into()));
        let out = written(&h.take_effects());
        assert_eq!(out[0]["id"], "3");
        assert_eq!(out[0]["error"]["code"], "unavailable", "{out:?}");
        assert_eq!(h.plugins["pal"].storage["k"], "v1");
    }

    #[test]
    fn a_command_not_answered_in_time_is_a_timeout_and_its_late_answer_is_ignored() {
        let c = cfg();
        let mut h = running(&c, &["commands.add"]);
        let to = ReplyKey(9);
        h.run_command("pal", to, "hold".into(), None, &cx(&c));
        let fx = h.take_effects();
        let sent = written(&fx);
        assert_eq!(sent[0]["method"], "command.run");
        let hid = sent[0]["id"].as_str().unwrap().to_string();
        let key = TimerKey::Command {
            plugin: "pal".into(),
            run_no: 1,
            hid: hid.clone(),
        };
        assert!(fx.contains(&Effect::Timer {
            key: key.clone(),
            after: Duration::from_millis(c.command_timeout_ms),
        }));
        assert_eq!(h.plugins["pal"].run.as_ref().unwrap().commands, 1);
        h.on_timer(key, &cx(&c));
        let fx = h.take_effects();
        let [
            Effect::Reply {
                to: t,
                result: Err(e),
            },
        ] = fx.as_slice()
        else {
            panic!("{fx:?}");
        };
        assert_eq!((*t, e.code), (to, Code::PluginTimeout));
        assert_eq!(h.plugins["pal"].run.as_ref().unwrap().commands, 0);
        // The plugin answers after all: nobody waits for it any more.
        let fx = feed(&mut h, &c, json!({"id": hid, "result": {"text": "late"}}));
        assert!(
            !fx.iter().any(|e| matches!(e, Effect::Reply { .. })),
            "{fx:?}"
        );
    }

    #[test]
    fn a_command_answered_in_time_cancels_its_timer_and_answers_the_operator() {
        let c = cfg();
        let mut h = running(&c, &["commands.add"]);
        h.run_command("pal", ReplyKey(1), "hold".into(), None, &cx(&c));
        let hid = written(&h.take_effects())[0]["id"].clone();
        let fx = feed(&mut h, &c, json!({"id": hid, "result": {"text": "held"}}));
        assert!(fx.contains(&Effect::CancelTimer(TimerKey::Command {
            plugin: "pal".into(),
            run_no: 1,
            hid: hid.as_str().unwrap().into(),
        })));
        assert!(fx.contains(&Effect::Reply {
            to: ReplyKey(1),
            result: Ok(json!({"command": "pal.hold", "text": "held"})),
        }));
    }

    fn task(id: &str) -> Value {
        json!({"id": id, "method": "tasks.create", "params": {
            "repo": "/srv/work/shop", "task": "Fix the login.", "builder": "claude",
            "verifier": "codex", "acceptance": {"name": "unit tests", "command": "npm test"},
        }})
    }

    /// A task request stored and in the inbox: its request id.
    fn pending_task(h: &mut Host, c: &PluginsSection, wid: &str) -> String {
        let fx = feed(h, c, task(wid));
        assert!(written(&fx).is_empty());
        let (ops, _, ack) = ledger(fx);
        assert_eq!(ops.len(), 1);
        h.committed(ack, Ok(()));
        let fx = h.take_effects();
        let [Effect::AddApproval { rid, task, .. }] = fx.as_slice() else {
            panic!("{fx:?}");
        };
        assert_eq!(task.summary, "P: Fix the login. in /srv/work/shop");
        assert_eq!(task.plugin, "pal");
        rid.clone()
    }

    #[test]
    fn a_task_request_goes_through_the_inbox_to_a_lane_and_answers_the_plugin() {
        let c = cfg();
        let mut h = running(&c, &["tasks.create"]);
        let rid = pending_task(&mut h, &c, "t1");
        assert_eq!(h.tasks.by_id[&rid].state, tasks::State::Pending);

        // The operator allows it: answered at once, dispatched, bounded.
        let by = Answerer::Operator { pid: 1 };
        assert!(h.on_task_answer(&rid, Verdict::Allow, &by, &cx(&c)));
        let fx = h.take_effects();
        assert_eq!(h.tasks.by_id[&rid].state, tasks::State::Answered);
        assert!(h.tasks.dispatching(&rid));
        assert_eq!(h.plugins["pal"].rec.starting, std::slice::from_ref(&rid));
        assert!(fx.contains(&Effect::Timer {
            key: TimerKey::Dispatch { rid: rid.clone() },
            after: Duration::from_millis(c.task_dispatch_timeout_ms),
        }));
        let request = fx
            .iter()
            .find_map(|e| match e {
                Effect::Dispatch { rid: r, request } if *r == rid => Some(request.clone()),
                _ => None,
            })
            .expect("a dispatch");
        assert_eq!(
            (request.repo.as_path(), request.builder.as_str()),
            (std::path::Path::new("/srv/work/shop"), "claude")
        );
        assert!(written(&fx).is_empty(), "the call waits for the lane");
        // tasks.cancel now says it is answered.
        let fx = feed(
            &mut h,
            &c,
            json!({"id": "c1", "method": "tasks.cancel", "params": {"id": "t1"}}),
        );
        assert_eq!(written(&fx)[0]["error"]["data"]["state"], "answered");

        // The lane starts: the plugin's call gets it, the record lists it.
        let lane = Dispatched {
            lane: "t-0c1d2e3f4a5b".into(),
            session: "s-4f9a1c2b7d3e".into(),
            branch: "b".into(),
            worktree: "/w".into(),
        };
        h.landed(&rid, tasks::Landing::Answered(Ok(lane)), &cx(&c));
        let fx = h.take_effects();
        assert!(fx.contains(&Effect::CancelTimer(TimerKey::Dispatch {
            rid: rid.clone()
        })));
        assert_eq!(
            written(&fx),
            [json!({"id": "t1", "result": {
                "requestId": rid, "lane": "t-0c1d2e3f4a5b", "session": "s-4f9a1c2b7d3e"
            }})]
        );
        assert!(!h.tasks.dispatching(&rid));
        assert!(h.plugins["pal"].rec.starting.is_empty());
        assert_eq!(h.plugins["pal"].rec.lanes, ["t-0c1d2e3f4a5b"]);

        // The timeout that was cancelled cannot answer twice; a lane that
        // lands after its request ended is closed.
        h.on_timer(TimerKey::Dispatch { rid: rid.clone() }, &cx(&c));
        assert!(written(&h.take_effects()).is_empty());
        let late = Dispatched {
            lane: "t-111111111111".into(),
            session: "s-222222222222".into(),
            branch: "b".into(),
            worktree: "/w".into(),
        };
        h.landed(&rid, tasks::Landing::Answered(Ok(late)), &cx(&c));
        assert_eq!(
            h.take_effects(),
            [Effect::CloseLane {
                lane: "t-111111111111".into()
            }]
        );
    }

    #[test]
    fn a_denied_expired_or_refused_task_request_answers_the_plugin_typed() {
        let c = cfg();
        let mut h = running(&c, &["tasks.create"]);
        let by = Answerer::Operator { pid: 1 };
        for (wid, verdict, by, code) in [
            ("d1", Verdict::Deny, by.clone(), "approval-denied"),
            ("e1", Verdict::Deny, Answerer::Timeout, "approval-expired"),
        ] {
            let rid = pending_task(&mut h, &c, wid);
            assert!(h.on_task_answer(&rid, verdict, &by, &cx(&c)));
            let (ops, _, ack) = ledger(h.take_effects());
            assert_eq!(ops.len(), 1);
            h.committed(ack, Ok(()));
            let out = written(&h.take_effects());
            assert_eq!(
                (&out[0]["id"], &out[0]["error"]["code"]),
                (&json!(wid), &json!(code))
            );
        }
        // The lanes refuse the dispatch: task-refused with the daemon's code.
        let rid = pending_task(&mut h, &c, "r1");
        assert!(h.on_task_answer(&rid, Verdict::Allow, &by, &cx(&c)));
        h.take_effects();
        let refused = RpcError::new(Code::RepoUnknown, "no such repository");
        h.landed(&rid, tasks::Landing::Answered(Err(refused)), &cx(&c));
        let out = written(&h.take_effects());
        assert_eq!(out[0]["error"]["code"], "task-refused", "{out:?}");
    }

    #[test]
    fn a_run_that_ends_orphans_its_pending_requests_in_one_batch_with_their_inbox_items() {
        let c = cfg();
        let mut h = running(&c, &["tasks.create"]);
        let rid = pending_task(&mut h, &c, "t1");
        h.on_exit(
            CHILD,
            ExitStatus {
                code: Some(1),
                signal: None,
            },
            &cx(&c),
        );
        let fx = h.take_effects();
        assert_eq!(
            fx,
            [Effect::Reap {
                plugin: "pal".into(),
                child: CHILD,
                status: ExitStatus {
                    code: Some(1),
                    signal: None
                },
            }]
        );
        h.reaped(
            "pal",
            ExitStatus {
                code: Some(1),
                signal: None,
            },
            b"boom\n",
            &cx(&c),
        );
        let fx = h.take_effects();
        let (ops, withdraw, ack) = fx
            .iter()
            .find_map(|e| match e {
                Effect::Ledger { ops, withdraw, ack } => Some((ops, withdraw, ack)),
                _ => None,
            })
            .expect("a ledger batch");
        assert_eq!(ops.len(), 1);
        assert_eq!(
            withdraw.as_slice(),
            [Withdraw {
                rid: rid.clone(),
                why: "the plugin's run ended".into(),
                surface: "daemon",
            }]
        );
        assert_eq!(ack, &Ack::Task(tasks::Ack::Orphaned));
        assert_eq!(h.tasks.by_id[&rid].state, tasks::State::Orphaned);
        // The exit is a crash: a restart after the backoff.
        assert!(fx.contains(&Effect::Timer {
            key: TimerKey::Restart {
                plugin: "pal".into()
            },
            after: Duration::from_millis(c.restart_backoff_ms),
        }));
        assert_eq!(h.plugins["pal"].state(), ("restarting", Some("exit")));
        // What it wrote last, after the note that it ran unisolated.
        let tail = &h.plugins["pal"].stderr_tail;
        assert!(tail.starts_with("[omniconfluxd] this plugin ran without isolation"));
        assert!(tail.ends_with("\nboom\n"), "{tail}");
    }

    #[test]
    fn a_plugin_that_reads_nothing_is_killed_for_flood_and_a_stop_escalates() {
        let c = cfg();
        let mut h = running(&c, &["storage.own"]);
        h.write_refused(CHILD);
        assert_eq!(
            h.take_effects(),
            [Effect::Signal {
                child: CHILD,
                signal: libc::SIGKILL
            }]
        );
        // A second host: the stop sequence, shutdown then TERM then KILL.
        let mut h = running(&c, &["storage.own"]);
        h.stop("pal", ShutdownReason::Disabled);
        let fx = h.take_effects();
        assert_eq!(written(&fx)[0]["method"], "shutdown");
        assert!(fx.contains(&Effect::CloseStdin(CHILD)));
        let term = TimerKey::Term {
            plugin: "pal".into(),
            run_no: 1,
        };
        assert!(fx.contains(&Effect::Timer {
            key: term.clone(),
            after: Duration::from_millis(limits::PLUGIN_SHUTDOWN_TERM_MS),
        }));
        h.on_timer(term, &cx(&c));
        let fx = h.take_effects();
        assert_eq!(
            fx[0],
            Effect::Signal {
                child: CHILD,
                signal: libc::SIGTERM
            }
        );
        assert!(matches!(
            &fx[1],
            Effect::Timer {
                key: TimerKey::Kill { .. },
                ..
            }
        ));
    }

    #[test]
    fn the_watch_counts_on_a_worker_and_a_tree_over_its_bound_is_killed() {
        let c = cfg();
        let mut h = running(&c, &["storage.own"]);
        h.on_timer(TimerKey::Watch, &cx(&c));
        assert_eq!(
            h.take_effects(),
            [Effect::Job(Job::Sample { roots: vec![100] })]
        );
        let over = process::Usage {
            processes: c.max_processes + 1,
            rss_bytes: 0,
        };
        let usage = HashMap::from([(100, over)]);
        h.on_report(Report::Sampled(usage), &cx(&c));
        let fx = h.take_effects();
        assert_eq!(
            fx[0],
            Effect::Signal {
                child: CHILD,
                signal: libc::SIGKILL
            }
        );
        // The watch goes on while a plugin runs: one timer at a time.
        assert!(fx.contains(&Effect::Timer {
            key: TimerKey::Watch,
            after: Duration::from_millis(c.watch_interval_ms),
        }));
        h.on_output(CHILD, &Outputs::default(), &cx(&c));
        assert!(
            !h.take_effects()
                .iter()
                .any(|e| matches!(e, Effect::Timer { .. }))
        );
    }

    #[test]
    fn records_are_written_one_at_a_time_and_answers_wait_for_the_write_that_holds_them() {
        let dir = std::env::temp_dir().join(format!("host-glue-{}", std::process::id()));
        let store = Store::open(&dir).expect("a store");
        let mut h = Host::new(Some(store));
        h.plugins
            .insert("pal".into(), Plugin::new(Record::new("pal")));
        h.persist();
        let fx = h.take_effects();
        assert!(matches!(
            fx.as_slice(),
            [Effect::Job(Job::WriteRecords { .. })]
        ));
        // Changed again while it runs: one more write, after this one.
        h.plugins.get_mut("pal").unwrap().rec.enabled = false;
        h.persist_then(Saved::Answer {
            to: ReplyKey(1),
            value: json!({"ok": true}),
        });
        assert!(h.take_effects().is_empty());
        assert!(!h.all_stopped());
        let c = cfg();
        h.on_report(Report::RecordsWritten(Ok(())), &cx(&c));
        let fx = h.take_effects();
        let [Effect::Job(Job::WriteRecords { records, .. })] = fx.as_slice() else {
            panic!("{fx:?}");
        };
        assert!(
            !records[0].enabled,
            "the second write takes the records as they are now"
        );
        // It fails: the answer that waited for it says so.
        h.on_report(Report::RecordsWritten(Err("disk full".into())), &cx(&c));
        let fx = h.take_effects();
        let [Effect::Reply { to, result: Err(e) }] = fx.as_slice() else {
            panic!("{fx:?}");
        };
        assert_eq!((*to, e.code), (ReplyKey(1), Code::Unavailable));
        assert!(h.all_stopped());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
