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
//! The records in plugins.json are written off the reactor, on the store's
//! `plugin-records` thread ([`persist`]): at most one write runs; changes
//! made while it runs are written by the next one, which takes the records
//! as they are when it starts, so the last state is the one on disk. An
//! answer that follows a change of the records ([`when_saved`]) goes out
//! only once a write that holds the change has returned from its fsyncs;
//! when that write fails the answer is `unavailable`, and the change stands
//! in the running daemon (it is not rolled back) until the next write that
//! succeeds. plugin.install copies and hashes the folder on the store's
//! `plugin-install` thread ([`stage`]); deciding what to do with the copy
//! and moving it into place stays here, in one step, so that no other
//! request sees half of an install.

use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::calls::{
    self, Call, StorageDeleted, StorageKeys, StorageUsage, StorageValue, StorageWritten, Subscribed,
};
use super::manifest::{Manifest, Problem, Snapshot};
use super::process::{self, Isolation};
use super::store::{self, Copy, Record, Store, Waiting};
use super::tasks;
use super::text;
use super::views;
use super::wire::{
    self, EventKind, HostError, HostErrorKind, HostRequest, Incoming, LineError, Method,
    Permission, ShutdownReason,
};
use crate::children::{ChildId, ExitStatus, Output, PipeLimits, WriteRefused};
use crate::daemon::{Daemon, Req};
use crate::errors::{Code, RpcError};
use crate::ledger::{Appended, Op};
use crate::limits;
use crate::procs::{Owner, signal_name};
use crate::reactor::TimerId;

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
    Remove { req: Req },
}

enum HostCall {
    Initialize,
    Ping,
    Command {
        req: Req,
        command: String,
        timer: TimerId,
    },
    Shutdown,
}

/// One process of a plugin.
pub struct Run {
    pub child: ChildId,
    pub pid: i32,
    pub run_no: u64,
    pub initialized: bool,
    next_id: u64,
    host_pending: HashMap<String, HostCall>,
    inflight: HashSet<String>,
    kinds: Vec<EventKind>,
    dropped: u64,
    tokens: f64,
    refilled: Instant,
    list_second: (u64, u32),
    rate_refusals: VecDeque<Instant>,
    refusals: VecDeque<Instant>,
    fault: Option<Fault>,
    stopping: Option<ShutdownReason>,
    timers: Vec<TimerId>,
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
    restart_timer: Option<TimerId>,
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
    parked: Option<Option<Req>>,
    timer: Option<TimerId>,
}

/// A plugin that was just installed.
pub fn new_plugin(rec: Record) -> Plugin {
    Plugin::new(rec)
}

/// Clears the crash count (plugin.enable) and a failure.
pub fn clear_crashes(p: &mut Plugin) {
    p.crashes.clear();
    if matches!(p.phase, Phase::Failed(_) | Phase::Restarting(_)) {
        p.phase = Phase::Idle;
    }
}

impl Plugin {
    fn new(rec: Record) -> Plugin {
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
            restart_timer: None,
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

    /// Counts `n` ledger records written now against the hour's budget.
    /// Storage writes are not refused when the budget is spent (only task
    /// requests are), so the deque keeps at most the budget's newest
    /// entries: more would not change what [`Self::records_left`] answers.
    fn note_records(&mut self, n: usize) {
        let now = Instant::now();
        for _ in 0..n {
            self.ledger_records.push_back(now);
        }
        while self.ledger_records.len() > limits::PLUGIN_LEDGER_RECORDS_PER_HOUR {
            self.ledger_records.pop_front();
        }
    }
}

/// The host's state.
pub struct Host {
    pub store: Option<Store>,
    pub plugins: BTreeMap<String, Plugin>,
    pub isolation: Isolation,
    pub tasks: tasks::Table,
    by_child: HashMap<ChildId, String>,
    lanes_copy: Option<(Instant, Vec<calls::LaneItem>)>,
    next_run_no: u64,
    watching: bool,
    records: RecordWrites,
    installs: Installs,
}

/// What runs after a write of the records: `Ok` once it is durable.
pub type AfterSave = Box<dyn FnOnce(&mut Daemon, Result<(), String>)>;

/// The writes of plugins.json (module comment). What waits for a write
/// is an answer to a request (a socket method, a plugin's task request, a
/// removal), so the lists are bounded by the requests that can be in
/// flight, not by how often the records change.
#[derive(Default)]
struct RecordWrites {
    /// The `plugin-records` thread, started on the first write.
    worker: Option<store::Worker>,
    /// A write runs; what waits for it.
    running: Option<Vec<AfterSave>>,
    /// The records changed since the running write copied them; what waits
    /// for the write after it.
    next: Option<Vec<AfterSave>>,
    /// How many changes were asked for, ever ([`records_asked`]).
    asked: u64,
}

/// What runs once plugin.install's copy is made (or failed).
type AfterStage = Box<dyn FnOnce(&mut Daemon, Result<(PathBuf, Snapshot), Problem>)>;

/// plugin.install's copies in the making (module comment).
#[derive(Default)]
struct Installs {
    /// The `plugin-install` thread, started on the first install.
    worker: Option<store::Worker>,
    /// Copies queued or in the making, by ticket.
    waiting: HashMap<u64, AfterStage>,
    next_ticket: u64,
}

impl Drop for Host {
    /// The last step of a stop, after the reactor is gone: a write that
    /// runs is finished, and changes no write has taken yet are written
    /// here, so that a stop that ran out of time loses no record.
    fn drop(&mut self) {
        if let Some(w) = &mut self.records.worker {
            w.finish();
        }
        if self.records.next.is_some() || self.records.running.is_some() {
            if let Some(store) = &self.store {
                let recs = self.plugins.values().map(|p| p.rec.clone()).collect();
                if let Err(e) = store.save(recs) {
                    crate::error!("{e}");
                }
            }
        }
    }
}

/// Loads the store's records and each plugin's storage from the ledger.
pub fn load(paths: &crate::config::Paths) -> Host {
    let isolation = Isolation::pending();
    let store = match Store::open(&paths.state_dir) {
        Ok(s) => Some(s),
        Err(e) => {
            crate::error!("{e}; plugins are unavailable");
            None
        }
    };
    let mut host = Host {
        store: None,
        plugins: BTreeMap::new(),
        isolation,
        tasks: tasks::Table::default(),
        by_child: HashMap::new(),
        lanes_copy: None,
        next_run_no: 0,
        watching: false,
        records: RecordWrites::default(),
        installs: Installs::default(),
    };
    let Some(store) = store else { return host };
    store.sweep();
    let mut changed = false;
    for mut rec in store.load() {
        verify_record(&store, &mut rec, &mut changed);
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

/// Checks an approval's integrity and the approved copy's files; a failure
/// makes the copy wait again (store-changed, files-changed).
fn verify_record(store: &Store, rec: &mut Record, changed: &mut bool) {
    let Some(a) = rec.approval.clone() else {
        return;
    };
    let dir = store.copy_dir(&rec.plugin, Copy::Approved);
    let kind = if !store.verify(&rec.plugin, &a) {
        "store-changed"
    } else if store::raw_hash(&dir) != a.snapshot_hash {
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
        if store.demote_approved(&rec.plugin).is_ok() {
            rec.waiting = Some(Waiting {
                kind: kind.into(),
                snapshot_hash: store::raw_hash(&store.copy_dir(&rec.plugin, Copy::Waiting)),
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

/// The records changed: they are written on the `plugin-records` thread
/// (module comment). A failed write is logged.
pub fn persist(d: &mut Daemon) {
    d.plugins.records.asked += 1;
    if d.plugins.store.is_none() {
        return;
    }
    if d.plugins.records.running.is_some() {
        d.plugins.records.next.get_or_insert_with(Vec::new);
    } else {
        start_write(d, Vec::new());
    }
}

/// How many changes of the records were asked for so far: a caller that
/// sees it move knows the records changed under it.
pub fn records_asked(d: &Daemon) -> u64 {
    d.plugins.records.asked
}

/// Runs `then` once every change of the records asked for so far is on
/// disk, or with the error of the write that was to hold it. With no
/// store, at once with an error; with nothing to write, at once.
pub fn when_saved(d: &mut Daemon, then: impl FnOnce(&mut Daemon, Result<(), String>) + 'static) {
    if d.plugins.store.is_none() {
        return then(d, Err("the plugin store cannot be used".into()));
    }
    let w = &mut d.plugins.records;
    if let Some(v) = w.next.as_mut().or(w.running.as_mut()) {
        v.push(Box::new(then));
    } else {
        then(d, Ok(()));
    }
}

/// [`persist`], then `then` as in [`when_saved`].
pub fn persist_then(d: &mut Daemon, then: impl FnOnce(&mut Daemon, Result<(), String>) + 'static) {
    persist(d);
    when_saved(d, then);
}

/// Starts a write of the records as they are now; `waiters` wait for it.
fn start_write(d: &mut Daemon, waiters: Vec<AfterSave>) {
    let Some(store) = &d.plugins.store else {
        return;
    };
    let root = store.root.clone();
    let recs: Vec<Record> = d.plugins.plugins.values().map(|p| p.rec.clone()).collect();
    let inbox = d.inbox.clone();
    let job: store::Job = Box::new(move || {
        let written = store::write_records(&root, recs);
        inbox.run(move |d| records_written(d, written));
    });
    let w = &mut d.plugins.records;
    if w.worker.is_none() {
        match store::Worker::spawn("plugin-records", limits::PLUGIN_RECORD_WRITES) {
            Ok(t) => w.worker = Some(t),
            Err(e) => crate::error!("unable to start the plugin-records thread: {e}"),
        }
    }
    // At most one write runs, so the queue has room unless the thread is
    // gone; then the write fails, reported on the next turn of the loop
    // rather than into the middle of the change that asked for it.
    let queued = match &w.worker {
        Some(t) => t.queue(job),
        None => Err("the plugin-records thread is not running".into()),
    };
    w.running = Some(waiters);
    if let Err(e) = queued {
        w.worker = None;
        let why = format!("unable to write the plugin records: {e}");
        d.reactor
            .schedule(Duration::ZERO, move |d| records_written(d, Err(why)));
    }
}

/// A write of the records returned: the next one starts, if the records
/// changed meanwhile, then what waited for this one runs.
fn records_written(d: &mut Daemon, result: Result<(), String>) {
    let waiters = d.plugins.records.running.take().unwrap_or_default();
    if let Err(e) = &result {
        crate::error!("{e}");
    }
    if let Some(next) = d.plugins.records.next.take() {
        start_write(d, next);
    }
    for then in waiters {
        then(d, result.clone());
    }
}

/// Whether no write of the records runs or waits.
fn records_idle(d: &Daemon) -> bool {
    d.plugins.records.running.is_none() && d.plugins.records.next.is_none()
}

/// Copies the folder at `src` into the store and checks the copy, on the
/// `plugin-install` thread; `then` runs here with the staging folder and
/// its snapshot. Refused (`unavailable`) when the thread cannot take it.
pub fn stage(
    d: &mut Daemon,
    src: PathBuf,
    then: impl FnOnce(&mut Daemon, Result<(PathBuf, Snapshot), Problem>) + 'static,
) -> Result<(), RpcError> {
    let Some(store) = &d.plugins.store else {
        return Err(RpcError::new(
            Code::Unavailable,
            "the plugin store cannot be used; the log says why",
        ));
    };
    let i = &mut d.plugins.installs;
    if i.waiting.len() >= limits::PLUGIN_INSTALLS_IN_FLIGHT {
        return Err(RpcError::new(
            Code::Unavailable,
            format!(
                "{} plugin installs are being copied; try again",
                limits::PLUGIN_INSTALLS_IN_FLIGHT
            ),
        ));
    }
    if let Err(e) = install_worker(i) {
        crate::error!("{e}");
        return Err(RpcError::new(
            Code::Unavailable,
            "the plugin install thread cannot be started; the log says why",
        ));
    }
    i.next_ticket += 1;
    let ticket = i.next_ticket;
    let root = store.root.clone();
    let inbox = d.inbox.clone();
    let job: store::Job = Box::new(move || {
        let staged = store::stage(&root, &src);
        inbox.run(move |d| {
            if let Some(then) = d.plugins.installs.waiting.remove(&ticket) {
                then(d, staged);
            }
        });
    });
    let queued = match &i.worker {
        Some(t) => t.queue(job),
        None => Err("the plugin-install thread is not running".into()),
    };
    match queued {
        Ok(()) => {
            i.waiting.insert(ticket, Box::new(then));
            Ok(())
        }
        Err(e) => {
            crate::error!("unable to copy a plugin folder: {e}");
            Err(RpcError::new(
                Code::Unavailable,
                "the plugin install thread cannot take the copy; the log says why",
            ))
        }
    }
}

/// Deletes a copy the store no longer needs (a staging folder an install
/// did not keep, a copy an install or an approval replaced, a copy
/// discarded, a plugin removed) on the `plugin-install` thread. One
/// that cannot be queued is left to the sweep at the next start, which
/// deletes every `.staging-` and `.retired-` folder.
pub fn discard_copy(d: &mut Daemon, dir: PathBuf) {
    let name = dir.display().to_string();
    let job: store::Job = Box::new(move || {
        let gone = std::fs::remove_dir_all(&dir);
        if let Some(e) = gone
            .as_ref()
            .err()
            .filter(|e| e.kind() != std::io::ErrorKind::NotFound)
        {
            crate::warn!(
                "unable to delete {}: {}",
                dir.display(),
                crate::errors::io_cause(e)
            );
        }
    });
    let i = &mut d.plugins.installs;
    let queued = install_worker(i).and_then(|()| match &i.worker {
        Some(t) => t.queue(job),
        None => Err("the plugin-install thread is not running".into()),
    });
    if let Err(e) = queued {
        crate::warn!("{name} is left for the next start to delete: {e}");
    }
}

/// Starts the `plugin-install` thread unless it runs.
fn install_worker(i: &mut Installs) -> Result<(), String> {
    if i.worker.as_ref().is_some_and(store::Worker::stopped) {
        i.worker = None;
    }
    if i.worker.is_none() {
        // Room for every copy in flight and the deletion each may ask for;
        // deletions queued beyond that wait for the next start's sweep.
        let t = store::Worker::spawn("plugin-install", 2 * limits::PLUGIN_INSTALLS_IN_FLIGHT)
            .map_err(|e| format!("unable to start the plugin-install thread: {e}"))?;
        i.worker = Some(t);
    }
    Ok(())
}

/// Starts every approved, enabled plugin and the watch, and finishes
/// removals a stop cut off. Called once the daemon is ready.
/// The machine's isolation probe answered: decide how plugins run and
/// start them.
pub fn isolation_known(d: &mut Daemon, probe: &crate::isolation::Probe) {
    d.plugins.isolation = Isolation::decide(&d.cfg.plugins, probe);
    match &d.plugins.isolation.missing {
        None => crate::info!("plugins run isolated with bubblewrap"),
        Some(why) => crate::warn!("plugins run without isolation: {why}"),
    }
    start_all(d);
}

pub fn start_all(d: &mut Daemon) {
    let ids: Vec<String> = d.plugins.plugins.keys().cloned().collect();
    for id in ids {
        if d.plugins
            .plugins
            .get(&id)
            .is_some_and(|p| p.rec.removal.is_some())
        {
            finish_removal(d, &id, None);
        } else {
            start(d, &id);
        }
    }
}

/// Starts the plugin when it can run and does not.
pub fn start(d: &mut Daemon, id: &str) {
    // Before the isolation probe answers, nothing starts; `isolation_known`
    // starts every plugin then.
    if d.is_stopping() || !d.plugins.isolation.probed {
        return;
    }
    let running = d
        .plugins
        .plugins
        .values()
        .filter(|p| p.run.is_some())
        .count();
    let max_running = d.cfg.plugins.max_running;
    let Some(p) = d.plugins.plugins.get_mut(id) else {
        return;
    };
    if p.run.is_some() || p.rec.removal.is_some() || !p.rec.enabled {
        return;
    }
    let Some(loaded) = &p.approved else { return };
    if !loaded.manifest.is_runnable() {
        return;
    }
    if let Some(t) = p.restart_timer.take() {
        d.reactor.cancel(t);
    }
    // A copy that changed on disk since its approval waits again.
    let Some(store) = &d.plugins.store else {
        return;
    };
    let copy = store.copy_dir(id, Copy::Approved);
    if store::raw_hash(&copy) != loaded.hash {
        let mut changed = false;
        verify_record(store, &mut p.rec, &mut changed);
        p.approved = None;
        p.phase = Phase::Idle;
        persist(d);
        return;
    }
    if running >= max_running {
        crate::warn!("plugin {id} not started: {max_running} plugins run already");
        p.phase = Phase::Failed("run-limit");
        return;
    }
    let main = loaded.manifest.main.clone();
    let init = wire::Initialize {
        platform: wire::Platform::current(),
        plugin_id: id.to_string(),
        plugin_version: loaded.manifest.version.clone(),
        permissions: loaded.manifest.permissions.clone(),
    };
    let work = match store.work_dir(id) {
        Ok(w) => w,
        Err(e) => {
            crate::error!(
                "plugin {id}: unable to make its working directory: {}",
                crate::errors::io_cause(&e)
            );
            spawn_failed(d, id);
            return;
        }
    };
    let hidden = match d.plugins.isolation.bwrap {
        Some(_) => crate::isolation::hidden_for(d),
        None => crate::isolation::Hidden::default(),
    };
    let cmd = process::command(
        &d.cfg.plugins,
        &d.plugins.isolation,
        &process::Spec {
            copy: &copy,
            work: &work,
            main: &main,
            hidden: &hidden,
        },
    );
    let cmd = match cmd {
        Ok(c) => c,
        Err(why) => {
            crate::error!("plugin {id}: {why}");
            spawn_failed(d, id);
            return;
        }
    };
    let pipe_limits = PipeLimits {
        max_line: limits::PLUGIN_MAX_LINE + 1,
        max_queued: limits::PLUGIN_STDIN_QUEUE_BYTES,
        stderr_tail: limits::PLUGIN_STDERR_TAIL_MAX * 4,
    };
    let spawned = d.children.spawn(
        d.reactor.poll.registry(),
        &mut d.roots,
        cmd,
        Owner::Plugin(id.to_string()),
        pipe_limits,
    );
    let (child, pid) = match spawned {
        Ok(x) => x,
        Err(e) => {
            crate::error!("plugin {id}: {}", crate::children::spawn_error(&main, &e));
            spawn_failed(d, id);
            return;
        }
    };
    d.plugins.next_run_no += 1;
    let run_no = d.plugins.next_run_no;
    d.plugins.by_child.insert(child, id.to_string());
    let Some(p) = d.plugins.plugins.get_mut(id) else {
        return;
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
        inflight: HashSet::new(),
        kinds: Vec::new(),
        dropped: 0,
        tokens: limits::PLUGIN_RATE_BURST as f64,
        refilled: Instant::now(),
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
    send_request(d, id, HostRequest::Initialize(init), HostCall::Initialize);
    let timeout = Duration::from_millis(d.cfg.plugins.initialize_timeout_ms);
    let owner = id.to_string();
    let t = d.reactor.schedule(timeout, move |d| {
        if run_mut(d, &owner, run_no).is_some_and(|r| !r.initialized) {
            fault(d, &owner, run_no, Fault::InitializeTimeout);
        }
    });
    add_timer(d, id, t);
    ensure_watch(d);
}

fn spawn_failed(d: &mut Daemon, id: &str) {
    let Some(p) = d.plugins.plugins.get_mut(id) else {
        return;
    };
    p.last_exit = Some(LastExit {
        at: crate::clock::now_ts(),
        code: None,
        signal: None,
        fault: Some(Fault::SpawnFailed),
    });
    crashed(d, id, Fault::SpawnFailed);
}

fn add_timer(d: &mut Daemon, id: &str, t: TimerId) {
    if let Some(r) = d.plugins.plugins.get_mut(id).and_then(|p| p.run.as_mut()) {
        r.timers.push(t);
    }
}

/// The plugin's current run, when it is run `run_no`.
fn run_mut<'a>(d: &'a mut Daemon, id: &str, run_no: u64) -> Option<&'a mut Run> {
    d.plugins
        .plugins
        .get_mut(id)?
        .run
        .as_mut()
        .filter(|r| r.run_no == run_no)
}

/// Writes one line to the plugin; a queue that is full means the plugin
/// reads nothing: the fault flood.
fn write_line(d: &mut Daemon, id: &str, line: &str) {
    let Some(run) = d.plugins.plugins.get(id).and_then(|p| p.run.as_ref()) else {
        return;
    };
    let (child, run_no) = (run.child, run.run_no);
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    if let Err(WriteRefused::Full) = d.children.write(d.reactor.poll.registry(), child, &bytes) {
        fault(d, id, run_no, Fault::Flood);
    }
}

fn send_request(d: &mut Daemon, id: &str, req: HostRequest, call: HostCall) -> Option<String> {
    let run = d.plugins.plugins.get_mut(id)?.run.as_mut()?;
    run.next_id += 1;
    let hid = wire::host_request_id(run.next_id);
    run.host_pending.insert(hid.clone(), call);
    let line = req.encode(&hid);
    write_line(d, id, &line);
    Some(hid)
}

/// Routes a plugin child's output (called for every readiness, also with
/// nothing read, so that a queue that drained can take the dropped notice).
pub fn on_output(d: &mut Daemon, child: ChildId, out: Vec<Output>) {
    let Some(id) = d.plugins.by_child.get(&child).cloned() else {
        return;
    };
    d.children
        .finish_pending_close(d.reactor.poll.registry(), child);
    for o in out {
        let Some(run_no) = d
            .plugins
            .plugins
            .get(&id)
            .and_then(|p| p.run.as_ref())
            .filter(|r| r.child == child && r.fault.is_none())
            .map(|r| r.run_no)
        else {
            break;
        };
        match o {
            Output::Line(line) => on_line(d, &id, run_no, &line),
            Output::LineTooLong => fault(d, &id, run_no, Fault::OversizedLine),
            Output::StdoutClosed => {
                let exited = d
                    .plugins
                    .plugins
                    .get_mut(&id)
                    .and_then(|p| p.run.as_mut())
                    .and_then(|r| {
                        r.stdout_closed = true;
                        r.exited
                    });
                if let Some(status) = exited {
                    finish_exit(d, child, status);
                    return;
                }
                let owner = id.clone();
                let t = d.reactor.schedule(
                    Duration::from_millis(limits::PLUGIN_STDOUT_CLOSED_GRACE_MS),
                    move |d| {
                        if run_mut(d, &owner, run_no).is_some() {
                            fault(d, &owner, run_no, Fault::StdoutClosed);
                        }
                    },
                );
                add_timer(d, &id, t);
            }
            Output::StdinClosed => {}
        }
    }
    flush_dropped(d, &id);
}

/// Sends the pending events.dropped notice when the queue has room.
fn flush_dropped(d: &mut Daemon, id: &str) {
    let Some(run) = d.plugins.plugins.get_mut(id).and_then(|p| p.run.as_mut()) else {
        return;
    };
    if run.dropped == 0 {
        return;
    }
    let line = wire::encode_events_dropped(run.dropped);
    if d.children.queued(run.child) + line.len() < limits::PLUGIN_EVENT_QUEUE_BYTES {
        run.dropped = 0;
        write_line(d, id, &line);
    }
}

fn on_line(d: &mut Daemon, id: &str, run_no: u64, line: &[u8]) {
    match wire::parse_line(line) {
        Ok(Incoming::Request {
            id: wid,
            method,
            params,
        }) => on_request(d, id, run_no, wid, method, params),
        Ok(Incoming::Response { id: hid, result }) => on_answer(d, id, run_no, &hid, Ok(result)),
        Ok(Incoming::Failure { id: hid, error }) => on_answer(d, id, run_no, &hid, Err(error)),
        Err(LineError::Answer { id: wid, error }) => {
            if run_mut(d, id, run_no).is_some_and(|r| r.inflight.contains(&wid)) {
                refuse(d, id, run_no, &wid, HostError::id_in_use(), false);
            } else {
                refuse(d, id, run_no, &wid, error, false);
            }
        }
        Err(LineError::Fault { fault: f, detail }) => {
            crate::warn!("plugin {id}: {detail}");
            fault(d, id, run_no, Fault::of_wire(f));
        }
    }
}

/// Answers a plugin request with a failure that is not counted as in flight.
fn refuse(d: &mut Daemon, id: &str, run_no: u64, wid: &str, error: HostError, was_inflight: bool) {
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
    let Some(run) = run_mut(d, id, run_no) else {
        return;
    };
    if was_inflight {
        run.inflight.remove(wid);
    }
    let now = Instant::now();
    let mut verdict = None;
    if counts {
        run.refusals.push_back(now);
        while run
            .refusals
            .front()
            .is_some_and(|t| now - *t > Duration::from_millis(limits::PLUGIN_REFUSALS_WINDOW_MS))
        {
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
    write_line(d, id, &line);
    if let Some(f) = verdict {
        fault(d, id, run_no, f);
    }
}

/// Answers a request the plugin made (success or failure) and frees its id.
pub fn reply(d: &mut Daemon, id: &str, run_no: u64, wid: &str, answer: Result<String, HostError>) {
    match answer {
        Ok(line) => {
            let Some(run) = run_mut(d, id, run_no) else {
                return;
            };
            if !run.inflight.remove(wid) {
                return;
            }
            write_line(d, id, &line);
        }
        Err(e) => {
            if run_mut(d, id, run_no).is_some_and(|r| r.inflight.contains(wid)) {
                refuse(d, id, run_no, wid, e, true);
            }
        }
    }
}

fn respond<T: serde::Serialize>(d: &mut Daemon, id: &str, run_no: u64, wid: &str, result: &T) {
    let line = wire::encode_response(wid, result);
    reply(d, id, run_no, wid, line);
}

fn on_request(
    d: &mut Daemon,
    id: &str,
    run_no: u64,
    wid: String,
    method: Method,
    params: Map<String, Value>,
) {
    let Some(run) = run_mut(d, id, run_no) else {
        return;
    };
    if run.inflight.contains(&wid) {
        refuse(d, id, run_no, &wid, HostError::id_in_use(), false);
        return;
    }
    if run.stopping.is_some() {
        refuse(
            d,
            id,
            run_no,
            &wid,
            HostError::of(HostErrorKind::ShuttingDown),
            false,
        );
        return;
    }
    if !run.initialized {
        refuse(
            d,
            id,
            run_no,
            &wid,
            HostError::of(HostErrorKind::NotInitialized),
            false,
        );
        return;
    }
    if run.inflight.len() >= limits::PLUGIN_MAX_UNANSWERED {
        refuse(
            d,
            id,
            run_no,
            &wid,
            HostError::of(HostErrorKind::Busy),
            false,
        );
        return;
    }
    let now = Instant::now();
    let refill = (now - run.refilled).as_secs_f64() * limits::PLUGIN_RATE_PER_SECOND as f64;
    run.tokens = (run.tokens + refill).min(limits::PLUGIN_RATE_BURST as f64);
    run.refilled = now;
    if run.tokens < 1.0 {
        refuse(
            d,
            id,
            run_no,
            &wid,
            HostError::new(
                HostErrorKind::RateLimited,
                "More than 50 requests a second for too long",
            ),
            false,
        );
        return;
    }
    run.tokens -= 1.0;
    run.inflight.insert(wid.clone());
    let has = d
        .plugins
        .plugins
        .get(id)
        .is_some_and(|p| p.has(method.permission()));
    if !has {
        reply(
            d,
            id,
            run_no,
            &wid,
            Err(HostError::permission_denied(method.permission())),
        );
        return;
    }
    let call = match Call::parse(method, &params) {
        Ok(c) => c,
        Err(e) => {
            reply(d, id, run_no, &wid, Err(e));
            return;
        }
    };
    if method.is_list() {
        let second = d.started.elapsed().as_secs();
        let Some(run) = run_mut(d, id, run_no) else {
            return;
        };
        if run.list_second.0 != second {
            run.list_second = (second, 0);
        }
        run.list_second.1 += 1;
        if run.list_second.1 > limits::PLUGIN_LIST_CALLS_PER_SECOND {
            reply(
                d,
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
    serve_call(d, id, run_no, &wid, call);
}

fn serve_call(d: &mut Daemon, id: &str, run_no: u64, wid: &str, call: Call) {
    match call {
        Call::EventsSubscribe { kinds } => {
            if let Some(r) = run_mut(d, id, run_no) {
                r.kinds = kinds.clone();
            }
            respond(d, id, run_no, wid, &Subscribed { kinds });
        }
        Call::EventsUnsubscribe => {
            if let Some(r) = run_mut(d, id, run_no) {
                r.kinds.clear();
            }
            respond(d, id, run_no, wid, &calls::Unsubscribed { kinds: [] });
        }
        Call::SessionsList { cursor, limit } => {
            let items = views::session_items(d);
            let page = page_after(items, cursor.as_deref(), views::session_cursor);
            let answer = page.and_then(|(mut items, more)| {
                let more = more || items.len() as u64 > limit;
                items.truncate(limit as usize);
                wire::encode_page(wid, "sessions", &items, more, views::session_cursor)
                    .map(|(l, _)| l)
            });
            reply(d, id, run_no, wid, answer);
        }
        Call::SessionsGet { session } => {
            let answer = match views::session_item(d, &session) {
                Some(item) => wire::encode_response(wid, &item),
                None => Err(HostError::new(
                    HostErrorKind::NotFound,
                    &format!("No session {session} on this daemon"),
                )),
            };
            reply(d, id, run_no, wid, answer);
        }
        Call::SeatsList { cursor } => {
            let items = views::seat_items(d);
            let answer = page_after(items, cursor.as_deref(), views::seat_cursor).and_then(
                |(items, more)| {
                    wire::encode_page(wid, "seats", &items, more, views::seat_cursor)
                        .map(|(l, _)| l)
                },
            );
            reply(d, id, run_no, wid, answer);
        }
        Call::LanesList { cursor } => {
            let fresh = d.plugins.lanes_copy.as_ref().is_some_and(|(t, _)| {
                t.elapsed() < Duration::from_millis(limits::PLUGIN_LANES_COPY_MS)
            });
            if !fresh {
                crate::daemon::router::lanes::keep_heads_fresh(d);
                let items = views::lane_items(d);
                d.plugins.lanes_copy = Some((Instant::now(), items));
            }
            let items = d
                .plugins
                .lanes_copy
                .as_ref()
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            let answer =
                page_after(items, cursor.as_deref(), |l| l.cursor()).and_then(|(items, more)| {
                    wire::encode_page(wid, "lanes", &items, more, |l| l.cursor()).map(|(l, _)| l)
                });
            reply(d, id, run_no, wid, answer);
        }
        Call::StorageGet { key } => {
            let value = d
                .plugins
                .plugins
                .get(id)
                .and_then(|p| p.storage.get(&key).cloned());
            respond(d, id, run_no, wid, &StorageValue { key, value });
        }
        Call::StorageList => {
            let Some(p) = d.plugins.plugins.get(id) else {
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
            respond(d, id, run_no, wid, &StorageKeys { keys, bytes });
        }
        Call::StorageSet { key, value } => storage_set(d, id, run_no, wid, key, value),
        Call::StorageDelete { key } => storage_delete(d, id, run_no, wid, key),
        Call::TasksCreate(request) => tasks::create(d, id, run_no, wid, request),
        Call::TasksCancel { id: target } => tasks::cancel(d, id, run_no, wid, &target),
    }
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

fn storage_set(d: &mut Daemon, id: &str, run_no: u64, wid: &str, key: String, value: String) {
    let Some(p) = d.plugins.plugins.get_mut(id) else {
        return;
    };
    let old = p.storage.get(&key).map(String::len);
    if let Err(e) = p.storage_usage().after_set(old, value.len()) {
        reply(d, id, run_no, wid, Err(e));
        return;
    }
    p.note_records(1);
    let previous = p.storage.insert(key.clone(), value.clone());
    let bytes = value.len();
    let op = Op::Exec {
        sql: "INSERT OR REPLACE INTO plugin_storage (plugin, key, value) VALUES (?1, ?2, ?3)",
        params: vec![
            id.to_string().into(),
            key.clone().into(),
            value.clone().into(),
        ],
    };
    let (owner, wid) = (id.to_string(), wid.to_string());
    d.write(vec![op], move |d, r| match r {
        Ok(_) => respond(d, &owner, run_no, &wid, &StorageWritten { key, bytes }),
        Err(e) => {
            crate::error!("plugin {owner}: storage.set was not committed: {e}");
            if let Some(p) = d.plugins.plugins.get_mut(&owner) {
                if p.storage.get(&key) == Some(&value) {
                    match previous {
                        Some(v) => p.storage.insert(key, v),
                        None => p.storage.remove(&key),
                    };
                }
            }
            reply(
                d,
                &owner,
                run_no,
                &wid,
                Err(HostError::of(HostErrorKind::Unavailable)),
            );
        }
    });
}

fn storage_delete(d: &mut Daemon, id: &str, run_no: u64, wid: &str, key: String) {
    let Some(p) = d.plugins.plugins.get_mut(id) else {
        return;
    };
    let Some(previous) = p.storage.remove(&key) else {
        respond(
            d,
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
    p.note_records(1);
    let op = Op::Exec {
        sql: "DELETE FROM plugin_storage WHERE plugin = ?1 AND key = ?2",
        params: vec![id.to_string().into(), key.clone().into()],
    };
    let (owner, wid) = (id.to_string(), wid.to_string());
    d.write(vec![op], move |d, r| match r {
        Ok(_) => respond(
            d,
            &owner,
            run_no,
            &wid,
            &StorageDeleted { key, deleted: true },
        ),
        Err(e) => {
            crate::error!("plugin {owner}: storage.delete was not committed: {e}");
            if let Some(p) = d.plugins.plugins.get_mut(&owner) {
                p.storage.entry(key).or_insert(previous);
            }
            reply(
                d,
                &owner,
                run_no,
                &wid,
                Err(HostError::of(HostErrorKind::Unavailable)),
            );
        }
    });
}

/// Takes a task request's share of the plugin's limits: 20 a day and 3 of
/// the hour's ledger records. `Err` is the rate-limited answer.
pub fn take_task_budget(d: &mut Daemon, id: &str) -> Result<(), HostError> {
    let Some(p) = d.plugins.plugins.get_mut(id) else {
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
    let now = Instant::now();
    p.task_times.push_back(now);
    p.note_records(limits::PLUGIN_LEDGER_RECORDS_PER_TASK);
    Ok(())
}

/// The last event delivered to the plugin in this run.
pub fn last_event(d: &Daemon, id: &str) -> Option<(EventKind, String)> {
    d.plugins.plugins.get(id)?.run.as_ref()?.last_event.clone()
}

fn on_answer(
    d: &mut Daemon,
    id: &str,
    run_no: u64,
    hid: &str,
    answer: Result<Map<String, Value>, wire::PluginError>,
) {
    let Some(run) = run_mut(d, id, run_no) else {
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
            let want = d
                .plugins
                .plugins
                .get(id)
                .and_then(|p| p.approved.as_ref())
                .map(|l| l.manifest.api.clone());
            match api {
                Err(()) => fault(d, id, run_no, Fault::InitializeFailed),
                Ok(api) if Some(&api) != want.as_ref() => fault(d, id, run_no, Fault::ApiMismatch),
                Ok(_) => {
                    let Some(p) = d.plugins.plugins.get_mut(id) else {
                        return;
                    };
                    p.phase = Phase::Running;
                    if let Some(r) = p.run.as_mut() {
                        r.initialized = true;
                    }
                    crate::info!("plugin {id} is running");
                    schedule_ping(d, id, run_no);
                }
            }
        }
        HostCall::Ping => {
            if let Some(r) = run_mut(d, id, run_no) {
                if r.ping_due.as_deref() == Some(hid) {
                    r.ping_due = None;
                }
            }
        }
        HostCall::Command {
            req,
            command,
            timer,
        } => {
            d.reactor.cancel(timer);
            if let Some(r) = run_mut(d, id, run_no) {
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
            d.answer(req, result);
        }
        HostCall::Shutdown => {}
    }
}

fn schedule_ping(d: &mut Daemon, id: &str, run_no: u64) {
    let every = Duration::from_millis(d.cfg.plugins.ping_interval_ms);
    schedule_ping_in(d, id, run_no, every);
}

fn schedule_ping_in(d: &mut Daemon, id: &str, run_no: u64, after: Duration) {
    let owner = id.to_string();
    let t = d.reactor.schedule(after, move |d| ping(d, &owner, run_no));
    add_timer(d, id, t);
}

fn ping(d: &mut Daemon, id: &str, run_no: u64) {
    let Some(run) = run_mut(d, id, run_no) else {
        return;
    };
    if run.stopping.is_some() || run.fault.is_some() || run.stdout_closed {
        return;
    }
    let Some(hid) = send_request(d, id, HostRequest::Ping, HostCall::Ping) else {
        return;
    };
    if let Some(r) = run_mut(d, id, run_no) {
        r.ping_due = Some(hid.clone());
    }
    let owner = id.to_string();
    let timeout = Duration::from_millis(d.cfg.plugins.ping_timeout_ms);
    let t = d.reactor.schedule(timeout, move |d| {
        if run_mut(d, &owner, run_no).is_some_and(|r| r.ping_due.as_deref() == Some(hid.as_str())) {
            fault(d, &owner, run_no, Fault::Unresponsive);
        } else {
            // "ping every 30 seconds" (seed 000): the next one is due an
            // interval after this one was sent, and its answer window has
            // already used part of that interval.
            let every = Duration::from_millis(d.cfg.plugins.ping_interval_ms);
            schedule_ping_in(d, &owner, run_no, every.saturating_sub(timeout));
        }
    });
    add_timer(d, id, t);
}

/// Ends a run for a fault: the process group is killed now.
pub fn fault(d: &mut Daemon, id: &str, run_no: u64, f: Fault) {
    let Some(run) = run_mut(d, id, run_no) else {
        return;
    };
    if run.fault.is_some() || run.stopping.is_some() {
        return;
    }
    run.fault = Some(f);
    let child = run.child;
    crate::warn!("plugin {id}: fault {}; stopping it", f.name());
    d.children.signal(child, libc::SIGKILL);
}

/// Asks a running plugin to stop (seed 000, shutdown).
pub fn stop(d: &mut Daemon, id: &str, reason: ShutdownReason) {
    let Some(p) = d.plugins.plugins.get_mut(id) else {
        return;
    };
    if let Some(t) = p.restart_timer.take() {
        d.reactor.cancel(t);
    }
    let Some(run) = p.run.as_mut() else { return };
    if run.stopping.is_some() {
        return;
    }
    let (run_no, child) = (run.run_no, run.child);
    if run.fault.is_some() {
        run.stopping = Some(reason);
        return;
    }
    p.phase = Phase::Stopping;
    send_request(d, id, HostRequest::Shutdown(reason), HostCall::Shutdown);
    if let Some(r) = run_mut(d, id, run_no) {
        r.stopping = Some(reason);
    }
    d.children.close_stdin(d.reactor.poll.registry(), child);
    let owner = id.to_string();
    let t = d.reactor.schedule(
        Duration::from_millis(limits::PLUGIN_SHUTDOWN_TERM_MS),
        move |d| {
            let Some(r) = run_mut(d, &owner, run_no) else {
                return;
            };
            let child = r.child;
            d.children.signal(child, libc::SIGTERM);
            let again = owner.clone();
            let t = d.reactor.schedule(
                Duration::from_millis(limits::PLUGIN_SHUTDOWN_KILL_MS),
                move |d| {
                    if let Some(r) = run_mut(d, &again, run_no) {
                        let child = r.child;
                        d.children.signal(child, libc::SIGKILL);
                    }
                },
            );
            add_timer(d, &owner, t);
        },
    );
    add_timer(d, id, t);
}

/// A plugin process was reaped. What it wrote before it exited is read
/// first: the run ends when its stdout has closed too (or 1 s later, when
/// a descendant holds it open).
pub fn on_exit(d: &mut Daemon, child: ChildId, status: ExitStatus) {
    let Some(id) = d.plugins.by_child.get(&child).cloned() else {
        return;
    };
    if d.children.stdout_open(child) {
        let Some(run) = d.plugins.plugins.get_mut(&id).and_then(|p| p.run.as_mut()) else {
            return;
        };
        run.exited = Some(status);
        let t = d.reactor.schedule(
            Duration::from_millis(limits::PLUGIN_STDOUT_CLOSED_GRACE_MS),
            move |d| {
                if d.plugins.by_child.contains_key(&child) {
                    finish_exit(d, child, status);
                }
            },
        );
        add_timer(d, &id, t);
        return;
    }
    finish_exit(d, child, status);
}

fn finish_exit(d: &mut Daemon, child: ChildId, status: ExitStatus) {
    let Some(id) = d.plugins.by_child.remove(&child) else {
        return;
    };
    d.children.drain_stderr(d.reactor.poll.registry(), child);
    let raw_tail = d.children.stderr_tail(child);
    d.children.remove(d.reactor.poll.registry(), child);
    let note = d.plugins.isolation.missing.clone();
    let Some(p) = d.plugins.plugins.get_mut(&id) else {
        return;
    };
    let Some(run) = p.run.take() else { return };
    for t in &run.timers {
        d.reactor.cancel(*t);
    }
    let mut tail = text::stderr_tail(&raw_tail);
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
    let run_no = run.run_no;
    for (_, call) in run.host_pending {
        if let HostCall::Command { req, timer, .. } = call {
            d.reactor.cancel(timer);
            d.answer(
                req,
                Err(RpcError::new(
                    Code::PluginNotRunning,
                    "the plugin stopped before it answered",
                )),
            );
        }
    }
    tasks::orphan_run(d, &id, run_no);
    match fault {
        Some(f) => crashed(d, &id, f),
        None => {
            let Some(p) = d.plugins.plugins.get_mut(&id) else {
                return;
            };
            p.phase = Phase::Idle;
            match std::mem::replace(&mut p.after_stop, AfterStop::Nothing) {
                AfterStop::Nothing => {}
                AfterStop::Start => start(d, &id),
                AfterStop::Remove { req } => finish_removal(d, &id, Some(req)),
            }
        }
    }
}

/// Counts a crash and schedules the restart, or gives up.
fn crashed(d: &mut Daemon, id: &str, f: Fault) {
    let limit = d.cfg.plugins.crash_limit as usize;
    let base = d.cfg.plugins.restart_backoff_ms;
    let stopping = d.is_stopping();
    let Some(p) = d.plugins.plugins.get_mut(id) else {
        return;
    };
    p.crashes.push_back(Instant::now());
    let n = p.crashes();
    match std::mem::replace(&mut p.after_stop, AfterStop::Nothing) {
        AfterStop::Remove { req } => {
            finish_removal(d, id, Some(req));
            return;
        }
        AfterStop::Start => {
            p.phase = Phase::Idle;
            start(d, id);
            return;
        }
        AfterStop::Nothing => {}
    }
    if !p.rec.enabled || stopping {
        p.phase = Phase::Idle;
        return;
    }
    if n >= limit {
        crate::warn!("plugin {id}: {n} crashes in 10 minutes; giving up (crash-limit)");
        p.phase = Phase::Failed("crash-limit");
        return;
    }
    p.phase = Phase::Restarting(f);
    let delay = base
        .saturating_mul(1u64 << (n.saturating_sub(1)).min(16))
        .min(limits::PLUGIN_RESTART_BACKOFF_MAX_MS);
    let owner = id.to_string();
    let t = d.reactor.schedule(Duration::from_millis(delay), move |d| {
        if let Some(p) = d.plugins.plugins.get_mut(&owner) {
            p.restart_timer = None;
            if matches!(p.phase, Phase::Restarting(_)) {
                p.phase = Phase::Idle;
                start(d, &owner);
            }
        }
    });
    if let Some(p) = d.plugins.plugins.get_mut(id) {
        p.restart_timer = Some(t);
    }
}

/// A lane neither merged nor closed (seed 000, plugin.get lanes).
pub fn lane_at_work(l: &crate::lanes::controller::Lane) -> bool {
    use crate::lanes::machine::Stage;
    !l.archived && !matches!(l.machine.stage, Stage::Merged | Stage::Closed)
}

/// plugin.get's `lanes`, computed when it is read: the lanes of the
/// plugin's record at work, newest first, at most 50.
pub fn lanes_at_work(d: &Daemon, rec: &Record) -> Vec<String> {
    let mut live: Vec<&crate::lanes::controller::Lane> = rec
        .lanes
        .iter()
        .filter_map(|l| d.lanes.map.get(l))
        .filter(|l| lane_at_work(l))
        .collect();
    live.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(b.id.cmp(&a.id)));
    live.into_iter()
        .take(limits::PLUGIN_GET_LIST_MAX)
        .map(|l| l.id.clone())
        .collect()
}

/// A dispatch plugin.remove aborts has landed with `lane`, or ended
/// without one: the lane is closed and its sessions counted in `stopped`,
/// and the worktree it left is listed. The last one lets a removal that
/// waited for it finish.
pub fn dispatch_aborted(d: &mut Daemon, id: &str, rid: &str, lane: Option<&str>) {
    let mut stopped = 0;
    let worktree = match lane {
        Some(lane) => {
            let wt = d.lanes.map.get(lane).map(|l| l.worktree.clone());
            stopped = crate::daemon::router::lanes::stop_for_removal(d, lane);
            wt
        }
        None => tasks::stored_request(d, rid)
            .map(|(t, _)| crate::lanes::controller::planned_worktree(&d.cfg.lanes, &t)),
    };
    let created = tasks::stored_request(d, rid)
        .map(|(_, c)| c)
        .unwrap_or_default();
    let Some(p) = d.plugins.plugins.get_mut(id) else {
        return;
    };
    p.stopped_sessions += stopped;
    if let Some(w) = worktree.filter(|w| w.exists()) {
        p.removal.worktrees.push((created, w.display().to_string()));
    }
    p.removal.aborting.remove(rid);
    if p.removal.aborting.is_empty() {
        if let Some(t) = p.removal.timer.take() {
            d.reactor.cancel(t);
        }
        if let Some(req) = p.removal.parked.take() {
            finish_removal(d, id, req);
        }
    }
}

/// A dispatch cut off by a daemon stop, aborted by plugin.remove: nothing
/// runs any more, but its lane may have started and its worktree may be
/// there. Read from the request as the host stored it.
pub fn abort_cut_off(d: &mut Daemon, id: &str, rid: &str) {
    let Some((task, _)) = tasks::stored_request(d, rid) else {
        return;
    };
    let wt = crate::lanes::controller::planned_worktree(&d.cfg.lanes, &task);
    let lane = d
        .lanes
        .map
        .values()
        .find(|l| !l.archived && l.worktree == wt)
        .map(|l| l.id.clone());
    dispatch_aborted(d, id, rid, lane.as_deref());
}

/// Removes what is left of a plugin once its process is gone, and answers
/// plugin.remove. A step that fails leaves it remove-pending; so does a
/// dispatch it aborts that does not end within
/// `plugins.remove_abort_timeout_ms`:
/// the reply is then `plugin-remove-pending`, and the removal finishes by
/// itself once the dispatch ends (it is bounded by
/// `plugins.task_dispatch_timeout_ms`).
pub fn finish_removal(d: &mut Daemon, id: &str, req: Option<Req>) {
    if let Some(p) = d.plugins.plugins.get_mut(id)
        && !p.removal.aborting.is_empty()
    {
        p.removal.parked = Some(req);
        if p.removal.timer.is_none() {
            let owner = id.to_string();
            let t = d.reactor.schedule(
                Duration::from_millis(d.cfg.plugins.remove_abort_timeout_ms),
                move |d| abort_timed_out(d, &owner),
            );
            if let Some(p) = d.plugins.plugins.get_mut(id) {
                p.removal.timer = Some(t);
            }
        }
        return;
    }
    let Some(store) = &d.plugins.store else {
        return;
    };
    match store.retire_plugin(id) {
        Ok(retired) => {
            if let Some(old) = retired {
                discard_copy(d, old);
            }
            let op = Op::Exec {
                sql: "DELETE FROM plugin_storage WHERE plugin = ?1",
                params: vec![id.to_string().into()],
            };
            let owner = id.to_string();
            d.write(vec![op], move |d, r| {
                if let Err(e) = r {
                    crate::error!("plugin {owner}: its storage was not deleted: {e}; it stays remove-pending");
                    if let Some(p) = d.plugins.plugins.get_mut(&owner) {
                        p.rec.removal = Some("remove-failed".into());
                    }
                    persist_then(d, move |d, _| {
                        if let Some(req) = req {
                            d.answer(req, Err(RpcError::new(Code::Unavailable, "the plugin's data could not be deleted; it stays remove-pending")));
                        }
                    });
                    return;
                }
                let (stopped, mut worktrees) = d
                    .plugins
                    .plugins
                    .remove(&owner)
                    .map_or((0, Vec::new()), |p| (p.stopped_sessions, p.removal.worktrees));
                crate::info!("plugin {owner} removed");
                // Newest requests first, each worktree once, at most 50.
                worktrees.sort_by(|a, b| b.0.cmp(&a.0));
                let mut listed: Vec<String> = Vec::new();
                for (_, w) in worktrees {
                    if !listed.contains(&w) && listed.len() < limits::PLUGIN_REMOVE_WORKTREES_MAX {
                        listed.push(w);
                    }
                }
                // The folder and the storage are gone whatever the record
                // says, so the answer is the removal's even when the record
                // could not be written (the log says so; the record left
                // on disk says remove-pending, and the next start finishes
                // the removal).
                persist_then(d, move |d, _| {
                    if let Some(req) = req {
                        d.answer(req, Ok(serde_json::json!({"plugin": owner, "removed": true, "stopped": stopped.min(limits::PLUGIN_REMOVE_STOPPED_MAX), "worktrees": listed})));
                    }
                });
            });
        }
        Err(e) => {
            crate::error!(
                "plugin {id}: unable to delete its folder: {}; it stays remove-pending",
                crate::errors::io_cause(&e)
            );
            if let Some(p) = d.plugins.plugins.get_mut(id) {
                p.rec.removal = Some("remove-failed".into());
            }
            persist_then(d, move |d, _| {
                if let Some(req) = req {
                    d.answer(
                        req,
                        Err(RpcError::new(
                            Code::Unavailable,
                            "the plugin's folder could not be deleted; it stays remove-pending",
                        )),
                    );
                }
            });
        }
    }
}

/// A dispatch the removal aborts did not end in time: the plugin stays
/// remove-pending (reason `remove-failed`) and the removal finishes by
/// itself once it ends.
fn abort_timed_out(d: &mut Daemon, id: &str) {
    let Some(p) = d.plugins.plugins.get_mut(id) else {
        return;
    };
    p.removal.timer = None;
    p.rec.removal = Some("remove-failed".into());
    let n = p.removal.aborting.len();
    let req = p.removal.parked.as_mut().and_then(Option::take);
    crate::warn!(
        "plugin {id}: {n} aborted dispatch(es) did not end in {} ms; it stays remove-pending",
        d.cfg.plugins.remove_abort_timeout_ms
    );
    persist_then(d, move |d, _| {
        if let Some(req) = req {
            d.answer(
                req,
                Err(RpcError::new(
                    Code::PluginRemovePending,
                    format!("{n} dispatch(es) of the plugin did not end when aborted; it stays remove-pending and the daemon finishes the removal when they end"),
                )),
            );
        }
    });
}

/// Offers committed events to the running plugins (module comment).
pub fn offer_events(d: &mut Daemon, events: &[Appended]) {
    if !d.plugins.plugins.values().any(|p| {
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
        let ids: Vec<String> = d
            .plugins
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
            deliver(d, &id, &line, event.kind, &event.subject);
        }
    }
}

fn deliver(d: &mut Daemon, id: &str, line: &str, kind: EventKind, subject: &str) {
    flush_dropped(d, id);
    let Some(run) = d.plugins.plugins.get_mut(id).and_then(|p| p.run.as_mut()) else {
        return;
    };
    if run.dropped > 0
        || d.children.queued(run.child) + line.len() + 1 > limits::PLUGIN_EVENT_QUEUE_BYTES
    {
        run.dropped += 1;
        return;
    }
    run.last_event = Some((kind, subject.to_string()));
    write_line(d, id, line);
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

/// Sends command.run and answers `req` when the plugin does.
pub fn run_command(d: &mut Daemon, id: &str, req: Req, command: String, input: Option<String>) {
    let Some(run) = d.plugins.plugins.get_mut(id).and_then(|p| p.run.as_mut()) else {
        return;
    };
    run.commands += 1;
    let run_no = run.run_no;
    let owner = id.to_string();
    let full = format!("{id}.{command}");
    // The timer needs the host id, which the send makes: send first with a
    // placeholder timer, then put the real one in.
    let placeholder = d.reactor.schedule(Duration::ZERO, |_| {});
    d.reactor.cancel(placeholder);
    let Some(hid) = send_request(
        d,
        id,
        HostRequest::CommandRun { command, input },
        HostCall::Command {
            req,
            command: full,
            timer: placeholder,
        },
    ) else {
        return;
    };
    let h = hid.clone();
    let bound = d.cfg.plugins.command_timeout_ms;
    let t = d.reactor.schedule(Duration::from_millis(bound), move |d| {
        let Some(r) = run_mut(d, &owner, run_no) else {
            return;
        };
        if let Some(HostCall::Command { req, .. }) = r.host_pending.remove(&h) {
            r.commands = r.commands.saturating_sub(1);
            d.answer(
                req,
                Err(RpcError::new(
                    Code::PluginTimeout,
                    format!("the plugin did not answer command.run in {bound} ms"),
                )),
            );
        }
    });
    if let Some(HostCall::Command { timer, .. }) =
        run_mut(d, id, run_no).and_then(|r| r.host_pending.get_mut(&hid))
    {
        *timer = t;
    }
}

/// Counts each running plugin's processes and memory (module comment of
/// [`super::process`]); runs while any plugin runs.
fn ensure_watch(d: &mut Daemon) {
    if d.plugins.watching {
        return;
    }
    d.plugins.watching = true;
    let every = Duration::from_millis(d.cfg.plugins.watch_interval_ms);
    d.reactor.schedule(every, watch);
}

fn watch(d: &mut Daemon) {
    d.plugins.watching = false;
    let runs: Vec<(String, u64, i32)> = d
        .plugins
        .plugins
        .iter()
        .filter_map(|(k, p)| {
            p.run
                .as_ref()
                .filter(|r| r.fault.is_none())
                .map(|r| (k.clone(), r.run_no, r.pid))
        })
        .collect();
    if runs.is_empty() {
        return;
    }
    let pids: Vec<i32> = runs.iter().map(|r| r.2).collect();
    let usage = process::sample(&pids);
    let max_procs = d.cfg.plugins.max_processes;
    let max_mem = d.cfg.plugins.memory_mb.saturating_mul(1024 * 1024);
    for (id, run_no, pid) in runs {
        let Some(u) = usage.get(&pid) else { continue };
        if u.processes > max_procs {
            fault(d, &id, run_no, Fault::Processes);
        } else if u.rss_bytes > max_mem {
            fault(d, &id, run_no, Fault::Memory);
        }
    }
    ensure_watch(d);
}

/// Begins the daemon's stop for the plugins: `shutdown {reason:
/// daemon-stop}` to each.
pub fn stop_all(d: &mut Daemon) {
    let ids: Vec<String> = d.plugins.plugins.keys().cloned().collect();
    for id in ids {
        stop(d, &id, ShutdownReason::DaemonStop);
    }
}

/// True when no plugin process is left and no write of the records runs
/// or waits.
pub fn all_stopped(d: &Daemon) -> bool {
    d.plugins.by_child.is_empty() && records_idle(d)
}

/// Kills what is left of every plugin: the last step of a daemon stop.
pub fn kill_all(d: &mut Daemon) {
    let children: Vec<ChildId> = d.plugins.by_child.keys().copied().collect();
    for c in children {
        d.children.signal(c, libc::SIGKILL);
    }
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
            p.note_records(1);
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
