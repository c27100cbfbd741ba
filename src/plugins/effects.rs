//! What the plugin host asks of the daemon and what it reads of it
//! (issue 11; DESIGN.md, "How subsystems talk"): the vocabulary between
//! [`super::host::Host`] and the router in `daemon/router/plugins.rs`.
//!
//! Into the host: a read-only [`Cx`] for each call (the `[plugins]`
//! config, the time, whether the daemon stops, the children's stdin queues
//! through [`Pipes`] and sessions, seats and lanes through [`Views`]); a
//! worker's [`Report`]; a fired [`TimerKey`]; a committed batch's [`Ack`].
//! Out of it: [`Effect`]s, in order. Every key is typed, so that the
//! router hands each result back to the method that waits for it, and
//! nothing here holds a continuation or names the daemon or a surface.

use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::calls::LaneItem;
use super::manifest::{Problem, Snapshot};
use super::store::{self, Record};
use super::tasks;
use super::wire::HostError;
use crate::children::{ChildId, ExitStatus};
use crate::config::PluginsSection;
use crate::core::inbox::PluginTask;
use crate::errors::RpcError;
use crate::lanes::controller::DispatchRequest;
use crate::ledger::Op;

/// Where an answer goes, as the router knows it: the host keeps the
/// domain's one opaque key and hands it back in [`Effect::Reply`], so it
/// never names a surface.
pub use crate::core::ReplyKey;

/// What the host reads of the plugins' stdin pipes (the daemon's children).
pub trait Pipes {
    /// Bytes queued to the child's stdin and not written yet.
    fn queued(&self, child: ChildId) -> usize;
    /// Whether the child's stdout is still open.
    fn stdout_open(&self, child: ChildId) -> bool;
}

/// What the host reads of sessions, seats and lanes, typed or as the
/// plugin wire's items (`plugins::views` builds them).
pub trait Views {
    /// sessions.list's items, in creation order.
    fn session_items(&self) -> Vec<Value>;
    /// sessions.get's item.
    fn session_item(&self, session: &str) -> Option<Value>;
    /// seats.list's items, in registry order.
    fn seat_items(&self) -> Vec<Value>;
    /// lanes.list's items, newest first.
    fn lane_items(&self) -> Vec<LaneItem>;
    /// When the lane was made, while it is neither merged nor closed
    /// (seed 000, plugin.get lanes); `None` for another lane.
    fn lane_at_work(&self, lane: &str) -> Option<i64>;
}

/// What a host method reads of the rest of the daemon (module comment).
pub struct Cx<'a> {
    pub cfg: &'a PluginsSection,
    /// The daemon begins to stop: nothing starts any more.
    pub stopping: bool,
    /// When the daemon started (list calls are counted per second of it).
    pub started: Instant,
    pub now: Instant,
    pub pipes: &'a dyn Pipes,
    pub views: &'a dyn Views,
}

/// A timer of the host; one set with a key already set replaces it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TimerKey {
    /// The plugin has not answered initialize in time.
    Initialize { plugin: String, run_no: u64 },
    /// Stdout closed while the process lives on.
    StdoutClosed { plugin: String, run_no: u64 },
    /// The process exited while a descendant holds stdout open.
    ExitGrace { plugin: String, child: ChildId },
    /// The next ping is due.
    Ping { plugin: String, run_no: u64 },
    /// The ping `hid` waits for its answer.
    PingTimeout {
        plugin: String,
        run_no: u64,
        hid: String,
    },
    /// SIGTERM after a shutdown the plugin did not act on.
    Term { plugin: String, run_no: u64 },
    /// SIGKILL after a SIGTERM it did not act on.
    Kill { plugin: String, run_no: u64 },
    /// command.run `hid` waits for its answer.
    Command {
        plugin: String,
        run_no: u64,
        hid: String,
    },
    /// The restart after a crash.
    Restart { plugin: String },
    /// The dispatches a removal aborts did not end in time.
    RemoveAbort { plugin: String },
    /// An allowed task request's dispatch did not land in time.
    Dispatch { rid: String },
    /// The processes and memory of running plugins are counted.
    Watch,
}

/// What waits for a ledger batch of the host, handed back to
/// [`super::host::Host::committed`].
#[derive(Debug, Clone, PartialEq)]
pub enum Ack {
    StorageSet {
        plugin: String,
        run_no: u64,
        wid: String,
        key: String,
        value: String,
        previous: Option<String>,
    },
    StorageDelete {
        plugin: String,
        run_no: u64,
        wid: String,
        key: String,
        previous: String,
    },
    /// A removed plugin's storage is deleted.
    Removed {
        plugin: String,
        to: Option<ReplyKey>,
    },
    /// Task requests (`plugins::tasks`).
    Task(tasks::Ack),
}

/// An inbox item of a task request to withdraw in the same batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Withdraw {
    pub rid: String,
    pub why: String,
    /// Who withdrew it: `plugin` or `daemon`.
    pub surface: &'static str,
}

/// What runs once the records are written (module comment).
#[derive(Debug, Clone, PartialEq)]
pub enum Saved {
    /// Answers `value` once saved, `unavailable` when the write failed.
    Answer { to: ReplyKey, value: Value },
    /// Answers `result` whatever the write did.
    Reply {
        to: ReplyKey,
        result: Result<Value, RpcError>,
    },
    /// Answers a plugin's call whatever the write did.
    Plugin {
        plugin: String,
        run_no: u64,
        wid: String,
        line: Result<String, HostError>,
    },
}

/// Blocking work for a worker thread; each comes back as a [`Report`].
#[derive(Debug, Clone, PartialEq)]
pub enum Job {
    /// plugins.json, on the `plugin-records` worker.
    WriteRecords { root: PathBuf, records: Vec<Record> },
    /// plugin.install's copy, on the `plugin-install` worker.
    Stage {
        ticket: u64,
        root: PathBuf,
        src: PathBuf,
    },
    /// A copy no longer needed, deleted on the `plugin-install` worker;
    /// reports nothing.
    Discard { dir: PathBuf },
    /// The approved copy's hash before a start, on the `plugin-check`
    /// worker.
    Hash { plugin: String, dir: PathBuf },
    /// plugin.approve's check of the waiting copy (its hash included), on
    /// the `plugin-install` worker.
    CheckWaiting { ticket: u64, dir: PathBuf },
    /// The watch's count of each running plugin's tree, by root pid, on
    /// the `plugin-check` worker.
    Sample { roots: Vec<i32> },
}

impl Job {
    /// Runs the job where it blocks nobody; `None` for one that reports
    /// nothing.
    pub fn run(self) -> Option<Report> {
        match self {
            Job::WriteRecords { root, records } => {
                Some(Report::RecordsWritten(store::write_records(&root, records)))
            }
            Job::Stage { ticket, root, src } => Some(Report::Staged {
                ticket,
                staged: store::stage(&root, &src),
            }),
            Job::Discard { dir } => {
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
                None
            }
            Job::Hash { plugin, dir } => Some(Report::Hashed {
                plugin,
                hash: store::raw_hash(&dir),
            }),
            Job::Sample { roots } => Some(Report::Sampled(super::process::sample(&roots))),
            Job::CheckWaiting { ticket, dir } => Some(Report::Checked {
                ticket,
                checked: super::manifest::check_folder(&dir),
            }),
        }
    }
}

/// What a worker hands back for a [`Job`].
#[derive(Debug)]
pub enum Report {
    RecordsWritten(Result<(), String>),
    Staged {
        ticket: u64,
        staged: Result<(PathBuf, Snapshot), Problem>,
    },
    Hashed {
        plugin: String,
        hash: String,
    },
    /// The watch's count, by root pid.
    Sampled(HashMap<i32, super::process::Usage>),
    /// plugin.approve's check of the waiting copy.
    Checked {
        ticket: u64,
        checked: Result<Snapshot, Problem>,
    },
    /// An old task request as the ledger has it (plugin.request.get).
    RequestRead {
        to: ReplyKey,
        row: Option<tasks::Request>,
    },
}

/// plugin.approve's params, checked for their form, while its copy is
/// checked ([`super::host::Host::check_waiting`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ApproveRequest {
    pub plugin: String,
    pub snapshot_hash: String,
    pub permissions: Vec<String>,
    pub commands: Vec<String>,
    pub operator: String,
}

/// What the approved copy's start needs (the command is built by
/// [`super::host::Host::command`] when the router spawns it).
#[derive(Debug, Clone, PartialEq)]
pub struct SpawnSpec {
    pub copy: PathBuf,
    pub work: PathBuf,
    pub main: String,
}

/// How a dispatch a removal aborts ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Aborted {
    /// It started this lane.
    Lane(String),
    /// It ended without a lane; the stored request, when it can be read,
    /// names the worktree it planned.
    NoLane(Option<DispatchRequest>),
    /// A daemon stop cut it off: its lane, if it started, is the one at
    /// the request's planned worktree.
    CutOff(DispatchRequest),
}

/// The host asks this of the daemon, in order.
#[derive(Debug, PartialEq)]
pub enum Effect {
    /// Start the plugin's process; the router answers with
    /// [`super::host::Host::spawned`].
    Spawn {
        plugin: String,
        spec: SpawnSpec,
    },
    /// Queue bytes to a child's stdin; a full queue comes back as
    /// [`super::host::Host::write_refused`].
    Write {
        child: ChildId,
        bytes: Vec<u8>,
    },
    /// Close the child's stdin once its queue is written.
    CloseStdin(ChildId),
    /// Signal the child's process group.
    Signal {
        child: ChildId,
        signal: i32,
    },
    /// The run of `child` is over: the router reads what is left of its
    /// error output, forgets the child and calls [`super::host::Host::reaped`].
    Reap {
        plugin: String,
        child: ChildId,
        status: ExitStatus,
    },
    Timer {
        key: TimerKey,
        after: Duration,
    },
    CancelTimer(TimerKey),
    /// One ledger batch: `ops`, then the inbox rows of `withdraw`; the
    /// commit's result goes to [`super::host::Host::committed`] with `ack`.
    Ledger {
        ops: Vec<Op>,
        withdraw: Vec<Withdraw>,
        ack: Ack,
    },
    Reply {
        to: ReplyKey,
        result: Result<Value, RpcError>,
    },
    Job(Job),
    /// A task request into the approvals inbox; a refusal comes back as
    /// [`super::host::Host::inbox_refused`].
    AddApproval {
        rid: String,
        task: PluginTask,
        created_ms: i64,
    },
    /// Dispatch an allowed task request as a lane; the lanes' answer comes
    /// back as [`super::host::Host::landed`].
    Dispatch {
        rid: String,
        request: DispatchRequest,
    },
    /// The copy of the lanes a lanes.list answers from was taken anew: the
    /// lanes read their branch heads again if the last read is old, so the
    /// next copy shows a branch moved by hand.
    FreshenLaneHeads,
    /// Close a lane that nobody asked for any more (its worktree kept).
    CloseLane {
        lane: String,
    },
    /// A dispatch a removal aborts ended, or was cut off by a stop: the
    /// router closes its lane, and calls [`super::host::Host::abort_landed`] with the
    /// sessions that stopped and the worktree left.
    Abort {
        plugin: String,
        rid: String,
        how: Aborted,
    },
    /// Read an old task request from the ledger for plugin.request.get;
    /// the row comes back as [`super::host::Host::request_read`].
    ReadRequest {
        to: ReplyKey,
        rid: String,
    },
}
