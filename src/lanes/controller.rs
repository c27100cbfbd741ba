//! The lane controller: carries out what the stage machine decides, on the
//! reactor thread (issue 5). It owns every lane's record, hands blocking git
//! and acceptance work to the `lane-worker` threads, starts builder and
//! verifier sessions, and learns what agents did from the committed
//! `turn.end` and `session.end` events of their sessions, exactly as any
//! other reader of the ledger would.
//!
//! Records: each lane is one row of `lanes` (its whole state as JSON,
//! written in the same batch as the event that changed it), and its events
//! go to the `lanes` stream: lane.start, lane.stage, lane.verdict with the
//! lane id in `data.lane`. Rework sent to a builder is also recorded on the
//! builder's session stream as a `check.rework` record with a `check-N` id:
//! not an event kind of the plugin API, so no plugin ever receives it.
//!
//! Restart: every lane not archived is loaded before the sessions of the
//! last run are reopened, so that its verifier session (a verification cut
//! off by the stop starts over) is ended rather than reopened only to be
//! stopped. The lanes resume once the isolation probe, the reopened
//! sessions and the seats' first probe are known (a seat is not ready
//! before its probe answers, and a lane must not wait or go to the
//! operator for that alone). Each lane goes on where it was: a lane at
//! building (whose turn the stop cut off) prompts its builder to continue,
//! with the task, in its reopened session or else in a new session in the
//! worktree; an interrupted acceptance runs again; a verification starts
//! over; a merge is retried (merging is idempotent); each is recorded as a
//! lane.stage event with a new `since`. A builder session reopened without
//! its agent's history (an agent without session/load, or one that refused
//! to load, gets a brand-new agent session) gets the task again with its
//! next prompt, as a new builder session would.
//!
//! Heads: `lanes[].head` is the commit the lane's branch points at, read
//! with git on a thread of its own (`lane-heads`), never on the reactor nor
//! behind the acceptance commands of the lane workers. The daemon socket's
//! verify.list and lanes.get read the branches before they answer. The
//! plugin wire's lanes.list is answered at once from what was read last,
//! which is kept fresh: the branch is set when the daemon commits on it,
//! read again when a builder's turn or session ends (an agent may commit),
//! at start, and by any read of the list when the last read is older than
//! `LANE_HEADS_FRESH_MS` (the plugin host keeps its copy as long). A branch
//! or repository that is gone reads null, and a verdict then is stale.
//!
//! Dispatch takes a [`DispatchRequest`], into which the plugin wire's
//! tasks.create and the socket's task.dispatch turn their params, and
//! answers a [`Dispatched`] lane or the refusal. It takes a repository the
//! daemon knows or a worktree of one (a lane's worktree, or any other git
//! reports as the repository's), and works on the repository. A dispatch
//! without a name is named after the first line of its task
//! (`default_name`). Builders and verifiers are started with the typed
//! `sessions::spawn`, and sessions are read through their typed summary.

use crossbeam_channel::{Sender, TrySendError, bounded};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::cell::Cell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::Family;
use crate::core::sessions::{Spawned, State};
use crate::daemon::Daemon;
use crate::errors::{Code, RpcError};
use crate::isolation::Probe;
use crate::lanes::check::{self, Isolation, Outcome};
use crate::lanes::git;
use crate::lanes::machine::{Action, Input, Machine, Stage};
use crate::lanes::pool::{Pool, Returned};
use crate::lanes::verdict;
use crate::ledger::{Appended, Op};
use crate::limits;
use rusqlite::types::Value as Sql;

/// The stream every lane event goes to (DESIGN.md: "one for all lanes").
pub const STREAM: &str = "lanes";

/// A seat as a lane records it (seed 000, lanes[].builder / verifier).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeatRef {
    pub harness: String,
    pub provider: String,
    pub family: Family,
    pub model: Option<String>,
}

impl SeatRef {
    /// As lane.start and lane events carry it: a model that is not a plain
    /// model name (seed 000) is null, as the page says.
    pub fn to_json(&self) -> Value {
        let model = self
            .model
            .as_deref()
            .filter(|m| crate::config::valid_model_name(m));
        json!({"harness": self.harness, "provider": self.provider, "family": self.family, "model": model})
    }
}

/// What the lane was asked to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub task: String,
    pub acceptance_name: String,
    pub acceptance_command: String,
    pub name: String,
}

/// One lane, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Lane {
    pub id: String,
    pub repo: PathBuf,
    pub base: String,
    /// base's commit when the lane was dispatched: the diff's start.
    pub base_commit: String,
    pub branch: String,
    pub worktree: PathBuf,
    pub task: Task,
    pub builder: SeatRef,
    pub builder_session: Option<String>,
    pub verifier: SeatRef,
    pub verifier_session: Option<String>,
    pub machine: Machine,
    pub created_ms: i64,
    pub stage_since_ms: i64,
    pub last_check: Option<Outcome>,
    /// Why the lane waits for the operator, for lanes.get and the log.
    pub reason: Option<String>,
    /// Rework records sent to the builder: the N of `check-N`.
    pub checks: u32,
    pub archived: bool,
    /// lanes.close asked to remove the worktree.
    pub remove_worktree: bool,
    /// The daemon-owned checkout the lane holds from its check to its
    /// verdict (`lanes::pool`), under state/lanes/; None while it holds
    /// none. Kept in the record so that a restart knows which checkouts
    /// are a live lane's.
    #[serde(default)]
    pub checkout: Option<PathBuf>,
    /// The agent session id the builder's session was reopened with at
    /// this start. The next prompt to that session carries the task again
    /// unless its agent came back in that very session, with its history
    /// (an agent without session/load gets a brand-new one). None once the
    /// session has been told the task in this run.
    #[serde(skip)]
    pub builder_reopened: Option<String>,
    /// The commit the lane's branch points at, as last read (`Some(None)`:
    /// the branch or the repository is gone); None until first read.
    #[serde(skip)]
    pub head: Option<Option<String>>,
}

/// Which side of a lane a session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Builder,
    Verifier,
}

type Job = Box<dyn FnOnce() + Send>;

/// Every lane the daemon knows, and the lane workers.
#[derive(Default)]
pub struct Lanes {
    pub map: HashMap<String, Lane>,
    by_session: HashMap<String, (String, Role)>,
    /// Repositories added with repos.add (the config's are read live).
    pub added_repos: Vec<PathBuf>,
    /// The daemon-owned checkouts: spares per repository, and which are in
    /// use by a job or a verifier session.
    pub pool: Pool,
    /// Verifier sessions running in a checkout: the checkout is in use
    /// until the session ends.
    checkout_sessions: HashMap<String, PathBuf>,
    jobs: Option<Sender<Job>>,
    /// The thread that reads branch heads (`LANE_HEADS_QUEUE`).
    heads_jobs: Option<Sender<Job>>,
    /// Where the heads thread hands the branch heads it read back.
    inbox: Option<crate::reactor::Inbox>,
    /// When the branch heads were last read, and whether a read runs;
    /// cells, so that reading the list can ask for a fresh read.
    heads_read: Cell<Option<Instant>>,
    heads_reading: Cell<bool>,
    /// A read was asked for while one ran (a branch may have moved after
    /// that one began): read again once it is in.
    heads_again: Cell<bool>,
    /// Whether acceptance commands can run isolated here; the daemon's
    /// isolation probe answers once after start.
    pub isolation: Option<Probe>,
    /// The lanes and repositories of the ledger are loaded.
    loaded: bool,
    /// The sessions of the last run are reopened (or ended).
    sessions_restored: bool,
    /// The seats' first probe answered, so a seat that is not ready now
    /// really is not.
    seats_probed: bool,
    /// The lanes of the last run, until they are resumed. Until then the
    /// turn and session ends the sessions module records for their sessions
    /// at start (the turns the stop cut off) are the restart's doing, not
    /// an agent's, and `resume` decides. A lane dispatched in this run
    /// meanwhile is not among them: it is neither resumed nor held back.
    to_resume: std::collections::HashSet<String>,
    resumed: bool,
}

fn lane_err(code: Code, msg: impl Into<String>) -> RpcError {
    RpcError::new(code, msg)
}

impl Lanes {
    /// Starts the lane workers; called once at start.
    pub fn start_workers(&mut self) -> std::io::Result<()> {
        let (tx, rx) = bounded::<Job>(limits::LANE_JOB_QUEUE);
        for n in 0..limits::LANE_WORKERS {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("lane-worker-{n}"))
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                })?;
        }
        self.jobs = Some(tx);
        let (tx, rx) = bounded::<Job>(limits::LANE_HEADS_QUEUE);
        std::thread::Builder::new()
            .name("lane-heads".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })?;
        self.heads_jobs = Some(tx);
        Ok(())
    }

    /// Whether a job can be queued now. The reactor is the only sender, so a
    /// queue with room now still has room at the next `job` call.
    pub fn workers_ready(&self) -> Result<(), RpcError> {
        match &self.jobs {
            None => Err(lane_err(
                Code::Unavailable,
                "the lane workers are not running",
            )),
            Some(tx) if tx.is_full() => Err(lane_err(
                Code::Unavailable,
                "the lane workers are busy; try again",
            )),
            Some(_) => Ok(()),
        }
    }

    /// The lane a session builds or verifies.
    pub fn lane_of_session(&self, sid: &str) -> Option<&str> {
        self.by_session.get(sid).map(|(l, _)| l.as_str())
    }

    /// The lanes lanes.list and verify.list show: not archived, newest
    /// first. Heads read longer than `LANE_HEADS_FRESH_MS` ago are read
    /// again in the background for the next reader.
    pub fn listed(&self) -> Vec<&Lane> {
        let fresh = self
            .heads_read
            .get()
            .is_some_and(|t| t.elapsed() < Duration::from_millis(limits::LANE_HEADS_FRESH_MS));
        if !fresh {
            self.refresh_heads();
        }
        let mut v: Vec<&Lane> = self.map.values().filter(|l| !l.archived).collect();
        v.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(b.id.cmp(&a.id)));
        v
    }

    /// Reads the commit the branch of every lane not archived points at,
    /// on the heads thread (one `git for-each-ref` per repository); one
    /// such read at a time (one asked for meanwhile follows it), and none
    /// when the thread's queue is full (the next reader asks again).
    pub fn refresh_heads(&self) {
        if self.heads_reading.get() {
            self.heads_again.set(true);
            return;
        }
        let (Some(tx), Some(inbox)) = (&self.heads_jobs, &self.inbox) else {
            return;
        };
        let branches = self.branches(None);
        let inbox = inbox.clone();
        let job: Job = Box::new(move || {
            let heads = read_heads(branches);
            inbox.run(move |d| {
                d.lanes.heads_reading.set(false);
                store_heads(d, heads);
                if d.lanes.heads_again.replace(false) {
                    d.lanes.refresh_heads();
                }
            });
        });
        if tx.try_send(job).is_ok() {
            self.heads_reading.set(true);
        }
    }

    /// The branch of every lane not archived, and of lane `also` (lanes.get
    /// shows archived lanes too), by repository.
    fn branches(&self, also: Option<&str>) -> HashMap<PathBuf, Vec<(String, String)>> {
        let mut by_repo: HashMap<PathBuf, Vec<(String, String)>> = HashMap::new();
        for l in self
            .map
            .values()
            .filter(|l| !l.archived || Some(l.id.as_str()) == also)
        {
            by_repo
                .entry(l.repo.clone())
                .or_default()
                .push((l.id.clone(), l.branch.clone()));
        }
        by_repo
    }
}

type Heads = Vec<(String, Option<String>)>;

/// What each lane's branch points at now (blocking: the heads thread).
/// Reading refs runs nothing a repository configures, so this git runs on
/// the host (hooks off all the same): the heads thread has no daemon to ask
/// how agents run.
fn read_heads(by_repo: HashMap<PathBuf, Vec<(String, String)>>) -> Heads {
    let mut heads = Vec::new();
    let g = git::Git::host();
    for (repo, lanes) in by_repo {
        let branches: Vec<String> = lanes.iter().map(|(_, b)| b.clone()).collect();
        let found = git::branch_heads(&g, &repo, &branches);
        heads.extend(
            lanes
                .into_iter()
                .map(|(id, b)| (id, found.get(&b).cloned())),
        );
    }
    heads
}

fn store_heads(d: &mut Daemon, heads: Heads) {
    d.lanes.heads_read.set(Some(Instant::now()));
    for (id, head) in heads {
        if let Some(l) = d.lanes.map.get_mut(&id) {
            l.head = Some(head);
        }
    }
}

/// Reads the branch head of every lane not archived and of lane `also` on
/// the heads thread, then runs `then` on the reactor: the daemon socket's
/// lane reads answer with the branches as they are. When the thread cannot
/// take the read now (its queue is full, or it is not running), `then`
/// runs at once on the heads read last.
pub fn fresh_heads(
    d: &mut Daemon,
    also: Option<&str>,
    then: impl FnOnce(&mut Daemon) + Send + 'static,
) {
    let (Some(tx), Some(inbox)) = (&d.lanes.heads_jobs, &d.lanes.inbox) else {
        return then(d);
    };
    if tx.is_full() {
        return then(d);
    }
    let branches = d.lanes.branches(also);
    let inbox = inbox.clone();
    let job: Job = Box::new(move || {
        let heads = read_heads(branches);
        inbox.run(move |d| {
            store_heads(d, heads);
            then(d);
        });
    });
    // The reactor is the only sender: a queue with room above still has
    // room here, so the job (and the answer in it) is not lost.
    if tx.try_send(job).is_err() {
        crate::error!("the lanes' branches could not be read: the heads thread stopped");
    }
}

/// Runs `work` on a lane worker; its result comes back to `then` on the
/// reactor. A full queue is reported at once rather than waited on.
pub fn job<T: Send + 'static>(
    d: &mut Daemon,
    work: impl FnOnce() -> T + Send + 'static,
    then: impl FnOnce(&mut Daemon, T) + Send + 'static,
) -> Result<(), RpcError> {
    let Some(tx) = &d.lanes.jobs else {
        return Err(lane_err(
            Code::Unavailable,
            "the lane workers are not running",
        ));
    };
    let inbox = d.inbox.clone();
    let boxed: Job = Box::new(move || {
        let out = work();
        inbox.run(move |d| then(d, out));
    });
    match tx.try_send(boxed) {
        Ok(()) => Ok(()),
        Err(TrySendError::Full(_)) => Err(lane_err(
            Code::Unavailable,
            "the lane workers are busy; try again",
        )),
        Err(TrySendError::Disconnected(_)) => {
            Err(lane_err(Code::Unavailable, "the lane workers stopped"))
        }
    }
}

/// Reads the lanes not archived and the added repositories; called once at
/// start, on the reader thread. Their rows are handed to [`loaded`].
pub fn read_at_start(conn: &rusqlite::Connection) -> rusqlite::Result<(Vec<String>, Vec<String>)> {
    let mut stmt = conn.prepare("SELECT record FROM lanes WHERE archived = 0")?;
    let lanes = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut stmt = conn.prepare("SELECT path FROM repos ORDER BY added_at")?;
    let repos = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok((lanes, repos))
}

/// The ledger's lanes and repositories are here: start the workers and,
/// once isolation is known too, resume every lane.
pub fn loaded(d: &mut Daemon, rows: Vec<String>, repos: Vec<String>) {
    d.lanes.inbox = Some(d.inbox.clone());
    if let Err(e) = d.lanes.start_workers() {
        crate::error!("unable to start the lane workers: {e}; lanes are unavailable");
        return;
    }
    d.lanes.added_repos = repos.into_iter().map(PathBuf::from).collect();
    for text in rows {
        match serde_json::from_str::<Lane>(&text) {
            Ok(mut l) => {
                // A checkout recorded by a lane past its verdict is no
                // longer its own: the scan below takes it back.
                if !l.archived && !holds_checkout(l.machine.stage) {
                    l.checkout = None;
                }
                for (s, role) in [
                    (&l.builder_session, Role::Builder),
                    (&l.verifier_session, Role::Verifier),
                ] {
                    if let Some(s) = s {
                        d.lanes.by_session.insert(s.clone(), (l.id.clone(), role));
                    }
                }
                d.lanes.to_resume.insert(l.id.clone());
                d.lanes.map.insert(l.id.clone(), l);
            }
            Err(e) => crate::error!(
                "a lane record in the ledger cannot be read ({e}); it is left as it is"
            ),
        }
    }
    d.lanes.loaded = true;
    d.lanes.refresh_heads();
    reclaim(d);
    resume_all(d);
}

/// Checkouts under state/lanes/ that no live lane holds, left by the last
/// run (a lane archived as the daemon stopped, a give-back that did not
/// happen, a checkout of the per-lane kind older daemons made) are put back
/// in their repository's pool rather than removed: a full checkout is the
/// very cost the pool saves, and `git::checkout_exactly` makes whatever
/// state a stop left there exact before any lane uses it. The pool's bound
/// still holds (the rest are removed), and so are checkouts of a
/// repository the daemon no longer knows, or that git does not recognize.
fn reclaim(d: &mut Daemon) {
    let dir = d.paths.state_dir.join("lanes");
    let g = daemon_git(d);
    let queued = job(
        d,
        move || -> Vec<(PathBuf, Option<PathBuf>)> {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                return Vec::new();
            };
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| {
                    let co = e.path();
                    let repo = git::repository_of(&g, &co)
                        .ok()
                        .map(|r| r.canonicalize().unwrap_or(r));
                    (co, repo)
                })
                .collect()
        },
        |d, found| {
            let held: std::collections::HashSet<PathBuf> = d
                .lanes
                .map
                .values()
                .filter_map(|l| l.checkout.clone())
                .chain(d.lanes.pool.known())
                .collect();
            let known: Vec<PathBuf> = known_repos(d)
                .into_iter()
                .map(|r| r.canonicalize().unwrap_or(r))
                .collect();
            for (co, repo) in found {
                if held.contains(&co) {
                    continue;
                }
                match repo {
                    Some(repo) if known.contains(&repo) => {
                        let r = d.lanes.pool.give(&repo, &co);
                        if r == Returned::Pooled {
                            crate::info!(
                                "checkout {}: left by the last run, kept for the next lane of {}",
                                co.display(),
                                repo.display()
                            );
                        }
                        returned(d, repo, co, r);
                    }
                    repo => remove_checkout(d, repo, co),
                }
            }
        },
    );
    if let Err(e) = queued {
        crate::warn!(
            "the checkouts of the last run are left as they are: {}",
            e.message
        );
    }
}

/// Stages in which a lane holds its checkout: from its check to its
/// verdict. The verifier reads the checkout while the lane verifies.
fn holds_checkout(stage: Stage) -> bool {
    matches!(
        stage,
        Stage::Checking
            | Stage::WaitingVerifier
            | Stage::Verifying
            | Stage::VerifyFailed
            | Stage::SecondOpinion
    )
}

/// The lane's checkout: the one it holds, else a spare of its repository,
/// else a new path (made by the first `checkout_exactly` on it).
fn lane_checkout(d: &mut Daemon, id: &str) -> Option<PathBuf> {
    let l = d.lanes.map.get(id)?;
    if let Some(co) = &l.checkout {
        return Some(co.clone());
    }
    let co = match d.lanes.pool.take(&l.repo) {
        Some(co) => {
            crate::info!("lane {id}: reuses checkout {}", co.display());
            co
        }
        None => {
            let co = d
                .paths
                .state_dir
                .join("lanes")
                .join(crate::ids::prefixed_id("co-"));
            crate::info!("lane {id}: new checkout {}", co.display());
            co
        }
    };
    d.lanes.map.get_mut(id)?.checkout = Some(co.clone());
    Some(co)
}

/// The lane lets its checkout go (its verdict is in, or it left the loop).
fn release_checkout(d: &mut Daemon, id: &str) {
    let Some(l) = d.lanes.map.get_mut(id) else {
        return;
    };
    let Some(co) = l.checkout.take() else { return };
    let repo = l.repo.clone();
    crate::info!("lane {id}: gives back checkout {}", co.display());
    let r = d.lanes.pool.give(&repo, &co);
    returned(d, repo, co, r);
}

/// A job or session that used `co` is done.
fn checkout_used(d: &mut Daemon, co: &Path) {
    if let Some((repo, r)) = d.lanes.pool.use_end(co) {
        returned(d, repo, co.to_path_buf(), r);
    }
}

fn returned(d: &mut Daemon, repo: PathBuf, co: PathBuf, r: Returned) {
    match r {
        Returned::Deferred => {}
        Returned::Pooled => crate::info!(
            "checkout {}: kept for the next lane of {}",
            co.display(),
            repo.display()
        ),
        Returned::Remove => remove_checkout(d, Some(repo), co),
    }
}

fn remove_checkout(d: &mut Daemon, repo: Option<PathBuf>, co: PathBuf) {
    let shown = co.display().to_string();
    let left = shown.clone();
    let g = daemon_git(d);
    let queued = job(
        d,
        move || match repo {
            Some(repo) => git::remove_worktree(&g, &repo, &co),
            None => std::fs::remove_dir_all(&co).map_err(|e| {
                git::GitError(format!(
                    "unable to remove {}: {}",
                    co.display(),
                    crate::errors::io_cause(&e)
                ))
            }),
        },
        move |_, r| match r {
            Ok(()) => crate::info!("checkout {shown}: removed"),
            Err(e) => crate::warn!("checkout {shown}: {e}"),
        },
    );
    if let Err(e) = queued {
        crate::warn!("checkout {left}: left in place: {}", e.message);
    }
}

/// How the daemon's git runs now (`git` module comment): in the agents'
/// kind of namespace while agents are contained, else on the host.
pub fn daemon_git(d: &Daemon) -> git::Git {
    match d.core.sessions.sandbox(d.cfg.agents.isolation()) {
        crate::isolation::AgentSandbox::Namespace(bwrap) => git::Git::contained(
            bwrap,
            crate::isolation::hidden_for(d),
            &d.paths.state_dir.join("lanes"),
        ),
        _ => git::Git::host(),
    }
}

/// The daemon's isolation probe answered.
pub fn isolation_known(d: &mut Daemon, probe: &Probe) {
    if let Err(why) = probe {
        crate::warn!("acceptance commands cannot run isolated: {why}");
    }
    d.lanes.isolation = Some(probe.clone());
    resume_all(d);
}

/// The sessions of the last run that no lane will use again, so that the
/// restart does not reopen them: every lane's verifier session, since a
/// verification cut off by the stop starts over with a new verifier, and
/// one past its verdict was done with. The lanes forget them here.
pub fn sessions_not_needed(d: &mut Daemon) -> std::collections::HashSet<String> {
    let mut out = std::collections::HashSet::new();
    for l in d.lanes.map.values_mut() {
        if let Some(sid) = l.verifier_session.take() {
            d.lanes.by_session.remove(&sid);
            out.insert(sid);
        }
    }
    out
}

/// The sessions of the last run are reopened: each lane notes the agent
/// session its builder's session was reopened with (before the agent has
/// said anything), and the lanes resume when the rest is known.
pub fn sessions_restored(d: &mut Daemon) {
    let Daemon { lanes, core, .. } = d;
    for l in lanes.map.values_mut() {
        l.builder_reopened = l
            .builder_session
            .as_deref()
            .and_then(|sid| core.sessions.summary(sid))
            .filter(|s| s.state != State::Ended)
            .and_then(|s| s.agent_session_id.map(str::to_string));
    }
    d.lanes.sessions_restored = true;
    resume_all(d);
}

/// The seats' probe answered.
pub fn seats_probed(d: &mut Daemon) {
    d.lanes.seats_probed = true;
    resume_all(d);
}

/// Lanes resume once their records, the isolation probe, the reopened
/// sessions and the seats' first probe are all known: a lane resumed
/// before the probe would find every seat not ready, wait for its verifier
/// or go to the operator for that alone.
fn resume_all(d: &mut Daemon) {
    let seats_known = d.lanes.seats_probed || !d.core.seats.probing();
    if !d.lanes.loaded
        || d.lanes.isolation.is_none()
        || !d.lanes.sessions_restored
        || !seats_known
        || d.lanes.resumed
    {
        return;
    }
    d.lanes.resumed = true;
    let mut ids: Vec<String> = std::mem::take(&mut d.lanes.to_resume)
        .into_iter()
        .filter(|id| d.lanes.map.get(id).is_some_and(|l| !l.archived))
        .collect();
    ids.sort();
    for id in ids {
        resume(d, &id);
    }
}

/// Picks a lane up after a restart; see the module comment.
fn resume(d: &mut Daemon, id: &str) {
    let Some(l) = d.lanes.map.get(id) else { return };
    let stage = l.machine.stage;
    crate::info!("lane {id}: resuming at {}", stage.name());
    match stage {
        // The turn the stop cut off ended with it: the builder is asked to
        // go on, in its reopened session when there is one, with the task
        // (the agent may have come back without its history).
        Stage::Building | Stage::Rework => {
            let text = "The daemon restarted while you worked on this task. Continue it in this worktree; your earlier work is here.";
            let prompt = format!("{text}\n\nThe task:\n{}", l.task.task);
            let reopened = l.builder_session.clone().filter(|s| session_alive(d, s));
            let sent = reopened
                .is_some_and(|sid| crate::daemon::router::sessions::input(d, &sid, prompt).is_ok());
            if sent {
                if let Some(l) = d.lanes.map.get_mut(id) {
                    l.builder_reopened = None;
                }
            } else {
                restart_builder(d, id, text.into());
            }
        }
        Stage::Idle => run_actions(d, id, vec![Action::Stage(Stage::Idle), Action::CommitWork]),
        Stage::Checking => {
            let commit = l.machine.commit.clone().unwrap_or_default();
            run_actions(
                d,
                id,
                vec![Action::Stage(Stage::Checking), Action::RunCheck { commit }],
            );
        }
        // The old verifier session was not reopened
        // (`sessions_not_needed`): the verification starts over.
        Stage::WaitingVerifier | Stage::Verifying | Stage::SecondOpinion => {
            let st = if stage == Stage::SecondOpinion {
                Stage::SecondOpinion
            } else {
                Stage::WaitingVerifier
            };
            run_actions(d, id, vec![Action::Stage(st)]);
        }
        Stage::Merging => {
            let commit = l.machine.commit.clone().unwrap_or_default();
            run_actions(
                d,
                id,
                vec![Action::Stage(Stage::Merging), Action::Merge { commit }],
            );
        }
        // A pending approval does not survive a restart (it resolves
        // undelivered), so a pass that waited for one asks again.
        Stage::Pass if l.machine.require_merge_approval => {
            if let Some(commit) = l.machine.commit.clone() {
                request_merge_approval(d, id, &commit);
            }
        }
        _ => {}
    }
}

/// Feeds one input to a lane's machine and carries out what it says.
pub fn step(d: &mut Daemon, id: &str, input: Input) -> Result<(), RpcError> {
    let Some(l) = d.lanes.map.get_mut(id) else {
        return Err(not_found(id));
    };
    match l.machine.step(input) {
        Ok(actions) => {
            run_actions(d, id, actions);
            Ok(())
        }
        Err(nn) => Err(lane_err(
            Code::LaneNotWaiting,
            format!("lane {id} is at {}", nn.stage.name()),
        )),
    }
}

pub fn not_found(id: &str) -> RpcError {
    lane_err(Code::LaneNotFound, format!("no lane {id}"))
}

fn run_actions(d: &mut Daemon, id: &str, actions: Vec<Action>) {
    let mut ops = Vec::new();
    let mut after: Vec<Action> = Vec::new();
    for a in actions {
        match a {
            Action::Stage(stage) => {
                if let Some(l) = d.lanes.map.get_mut(id) {
                    l.machine.stage = stage;
                    l.stage_since_ms = crate::clock::now_ms();
                    // A reason says why the lane waits for the operator; it
                    // is stale once the lane moves on.
                    if !stage.waits_for_operator() {
                        l.reason = None;
                    }
                    let since = crate::clock::format_ts(l.stage_since_ms);
                    ops.push(event(
                        "lane.stage",
                        json!({"lane": id, "stage": stage.name(), "since": since}),
                    ));
                    crate::info!("lane {id}: {}", stage.name());
                }
            }
            Action::RecordVerdict {
                commit,
                verdict,
                round,
                defects,
            } => {
                ops.push(event("lane.verdict", json!({"lane": id, "commit": commit, "verdict": verdict, "round": round, "defects": defects})));
            }
            other => after.push(other),
        }
    }
    // The checkout is taken before the record is written, so that the
    // record names every checkout a lane holds; it is given back once the
    // lane's verdict is in or it left the loop.
    if after
        .iter()
        .any(|a| matches!(a, Action::RunCheck { .. } | Action::Verify { .. }))
    {
        lane_checkout(d, id);
    } else if d
        .lanes
        .map
        .get(id)
        .is_some_and(|l| l.checkout.is_some() && !holds_checkout(l.machine.stage))
    {
        release_checkout(d, id);
    }
    persist(d, id, ops);
    for a in after {
        act(d, id, a);
    }
    try_verifier(d, id);
}

/// A lane waiting for its verifier asks for it when the seat is ready and
/// not verifying another lane ("waiting-verifier while the verifier seat is
/// busy or not ready", issue 5); otherwise it looks again later.
fn try_verifier(d: &mut Daemon, id: &str) {
    let Some(l) = d.lanes.map.get(id) else { return };
    if !matches!(
        l.machine.stage,
        Stage::WaitingVerifier | Stage::SecondOpinion
    ) || l.archived
    {
        return;
    }
    let second = l.machine.stage == Stage::SecondOpinion;
    let seat = pick_verifier(d, l, second);
    let busy = d.lanes.map.values().any(|o| {
        o.id != id
            && o.machine.stage == Stage::Verifying
            && o.verifier.harness == seat.harness
            && o.verifier_session
                .as_deref()
                .is_some_and(|s| session_alive(d, s))
    });
    if seat_ready(d, &seat.harness) && !busy {
        let _ = step(d, id, Input::VerifierReady);
    } else {
        if busy {
            crate::info!(
                "lane {id}: its verifier {} is verifying another lane; looking again in {} s",
                seat.harness,
                limits::LANE_VERIFIER_RETRY_SECS
            );
        } else {
            crate::info!(
                "lane {id}: its verifier {} is not ready; looking again in {} s",
                seat.harness,
                limits::LANE_VERIFIER_RETRY_SECS
            );
        }
        let lid = id.to_string();
        d.reactor.schedule(
            Duration::from_secs(limits::LANE_VERIFIER_RETRY_SECS),
            move |d| try_verifier(d, &lid),
        );
    }
}

/// The seat that judges: the lane's verifier, except that a second opinion
/// goes to a ready seat of a third family when there is one (issue 5).
fn pick_verifier(d: &Daemon, l: &Lane, second: bool) -> SeatRef {
    if second {
        let third = d.core.seats.list.iter().find(|s| {
            s.status == Some(crate::core::seats::Status::Ready)
                && s.cfg.family() != l.builder.family
                && s.cfg.family() != l.verifier.family
                && s.cfg.family() != Family::Auto
        });
        if let Some(s) = third {
            return seat_ref(&s.cfg);
        }
    }
    l.verifier.clone()
}

fn event(kind: &str, data: Value) -> Op {
    Op::Event {
        stream: STREAM.into(),
        kind: kind.into(),
        ts: crate::clock::now_ts(),
        data: data.to_string(),
    }
}

/// Writes the lane's row, with `ops` in the same batch.
fn persist(d: &mut Daemon, id: &str, mut ops: Vec<Op>) {
    let Some(l) = d.lanes.map.get(id) else { return };
    let text = serde_json::to_string(l).unwrap_or_default();
    ops.push(Op::Exec {
        sql: "INSERT INTO lanes (id, archived, record) VALUES (?1, ?2, ?3)
              ON CONFLICT (id) DO UPDATE SET archived = excluded.archived, record = excluded.record",
        params: vec![Sql::Text(id.into()), Sql::Integer(i64::from(l.archived)), Sql::Text(text)],
    });
    let id = id.to_string();
    d.write(ops, move |_, r| {
        if let Err(e) = r {
            crate::error!("lane {id}: the ledger refused its record: {e:?}");
        }
    });
}

fn broken(d: &mut Daemon, id: &str, why: String) {
    crate::warn!("lane {id}: {why}; sent back to the operator");
    if let Some(l) = d.lanes.map.get_mut(id) {
        l.reason = Some(why);
    }
    let _ = step(d, id, Input::Broken);
}

fn act(d: &mut Daemon, id: &str, a: Action) {
    let Some(l) = d.lanes.map.get(id).cloned() else {
        return;
    };
    let lid = id.to_string();
    let g = daemon_git(d);
    let queued = match a {
        Action::CommitWork => job(
            d,
            move || {
                git::commit_all(
                    &g,
                    &l.worktree,
                    "lane: commit the work the builder left uncommitted\n\nomniconfluxd commits what a builder's turn leaves in the worktree so that the\nacceptance check and the verifier judge exactly one commit.",
                )
            },
            move |d, r| match r {
                Ok((head, _)) => {
                    // The daemon moved the branch itself: its head is known.
                    if let Some(l) = d.lanes.map.get_mut(&lid) {
                        l.head = Some(Some(head.clone()));
                    }
                    let _ = step(d, &lid, Input::Committed { head });
                }
                Err(e) => broken(d, &lid, e.to_string()),
            },
        ),
        Action::RunCheck { commit } => run_check(d, &l, commit),
        Action::Verify {
            commit,
            second_opinion,
        } => start_verifier(d, &l, commit, second_opinion),
        Action::PromptBuilder { text } => {
            prompt_builder(d, id, text);
            Ok(())
        }
        Action::RequestMergeApproval { commit } => {
            request_merge_approval(d, id, &commit);
            Ok(())
        }
        Action::Merge { commit } => {
            let mode = d.cfg.lanes.merge();
            let message = format!(
                "Merge lane {}: {}\n\nVerified by {} on {commit}.",
                l.id, l.task.name, l.verifier.harness
            );
            job(
                d,
                move || git::merge(&g, &l.repo, &l.base, &commit, mode, &message),
                move |d, r| {
                    let input = match r {
                        Ok(base_head) => Input::Merged { base_head },
                        Err(e) => {
                            if let Some(l) = d.lanes.map.get_mut(&lid) {
                                l.reason = Some(e.to_string());
                            }
                            crate::warn!("lane {lid}: merge failed: {e}");
                            Input::MergeFailed(e.to_string())
                        }
                    };
                    let _ = step(d, &lid, input);
                },
            )
        }
        Action::Archive => {
            archive(d, id);
            Ok(())
        }
        Action::Stage(_) | Action::RecordVerdict { .. } => Ok(()),
    };
    if let Err(e) = queued {
        broken(d, id, e.message);
    }
}

fn run_check(d: &mut Daemon, l: &Lane, commit: String) -> Result<(), RpcError> {
    let isolation = match &d.lanes.isolation {
        Some(Ok(bwrap)) => Isolation::Bwrap(bwrap.clone()),
        _ if !d.cfg.lanes.require_isolation => Isolation::Unisolated,
        _ => {
            return Err(lane_err(
                Code::IsolationMissing,
                "the acceptance command cannot run isolated here",
            ));
        }
    };
    let Some(checkout) = lane_checkout(d, &l.id) else {
        return Ok(());
    };
    let repo = l.repo.clone();
    let command = l.task.acceptance_command.clone();
    let timeout = Duration::from_secs(d.cfg.lanes.check_timeout_secs);
    let lid = l.id.clone();
    let hidden = match isolation {
        Isolation::Bwrap(_) => crate::isolation::hidden_for(d),
        Isolation::Unisolated => crate::isolation::Hidden::default(),
    };
    let (used, undo) = (checkout.clone(), checkout.clone());
    let g = daemon_git(d);
    d.lanes.pool.use_start(&used);
    let queued = job(
        d,
        move || -> Result<Outcome, String> {
            git::checkout_exactly(&g, &repo, &checkout, &commit).map_err(|e| e.to_string())?;
            check::run(&check::Spec {
                git: &g,
                checkout: &checkout,
                command: &command,
                timeout,
                isolation: &isolation,
                hidden: &hidden,
                tail_bytes: limits::LANE_CHECK_TAIL_BYTES,
            })
        },
        move |d, r| {
            checkout_used(d, &used);
            match r {
                Ok(outcome) => {
                    if let Some(l) = d.lanes.map.get_mut(&lid) {
                        l.last_check = Some(outcome.clone());
                    }
                    let _ = step(d, &lid, Input::Checked(outcome));
                }
                Err(e) => broken(d, &lid, e),
            }
        },
    );
    if queued.is_err() {
        checkout_used(d, &undo);
    }
    queued
}

/// Whether a seat can take work now.
fn seat_ready(d: &Daemon, harness: &str) -> bool {
    d.core
        .seats
        .get(harness)
        .is_some_and(|s| s.status == Some(crate::core::seats::Status::Ready))
}

fn session_alive(d: &Daemon, sid: &str) -> bool {
    d.core
        .sessions
        .summary(sid)
        .is_some_and(|s| s.state != State::Ended)
}

/// Asks the verifier to judge the commit when its seat is ready and not
/// verifying another lane; otherwise the lane waits and is tried again.
fn start_verifier(d: &mut Daemon, l: &Lane, commit: String, second: bool) -> Result<(), RpcError> {
    let Some(checkout) = lane_checkout(d, &l.id) else {
        return Ok(());
    };
    let (repo, base_commit, lid) = (l.repo.clone(), l.base_commit.clone(), l.id.clone());
    let diff_commit = commit.clone();
    let (used, undo) = (checkout.clone(), checkout.clone());
    let g = daemon_git(d);
    d.lanes.pool.use_start(&used);
    let queued = job(
        d,
        move || -> Result<String, String> {
            let diff = git::diff(
                &g,
                &repo,
                &base_commit,
                &diff_commit,
                limits::LANE_DIFF_MAX_BYTES,
            )
            .map_err(|e| e.to_string())?;
            // The verifier reads the same daemon-owned checkout the check
            // ran in, put back at exactly the commit it judges.
            git::checkout_exactly(&g, &repo, &checkout, &diff_commit).map_err(|e| e.to_string())?;
            Ok(diff)
        },
        move |d, r| {
            checkout_used(d, &used);
            match r {
                Ok(diff) => spawn_verifier(d, &lid, &commit, &diff, second),
                Err(e) => broken(d, &lid, e),
            }
        },
    );
    if queued.is_err() {
        checkout_used(d, &undo);
    }
    queued
}

fn spawn_verifier(d: &mut Daemon, id: &str, commit: &str, diff: &str, second: bool) {
    let Some(l) = d.lanes.map.get(id).cloned() else {
        return;
    };
    // The lane may have left verifying while its checkout was moved (the
    // operator closed it): then the checkout is no longer its to show.
    let Some(cwd) = l
        .checkout
        .clone()
        .filter(|_| l.machine.stage == Stage::Verifying && !l.archived)
    else {
        return;
    };
    let seat = pick_verifier(d, &l, second);
    let check = l
        .last_check
        .as_ref()
        .map(|o| format!("{} (it passed).", o.summary()))
        .unwrap_or_default();
    let prompt = format!(
        "You verify another agent's work. Do not change any file.\n\nThe task it was given:\n{}\n\nThe acceptance check `{}` ({}): {}\n\nThe change, as a diff from the base branch {} to commit {}:\n```diff\n{}\n```\n\nJudge whether the change does the task correctly and completely.{}\n\n{}",
        l.task.task,
        l.task.acceptance_name,
        l.task.acceptance_command,
        check,
        l.base,
        commit,
        diff,
        if second {
            " An earlier answer could not be read; follow the format exactly."
        } else {
            ""
        },
        verdict::instructions()
    );
    let params = crate::core::sessions::SpawnRequest {
        harness: seat.harness.clone(),
        cwd: cwd.display().to_string(),
        prompt: Some(prompt),
        model: None,
        name: Some(format!("verify {}", l.task.name)),
    };
    let lid = id.to_string();
    // The verifier reads the checkout until its session ends, even past
    // the lane's verdict: the checkout goes back to the pool only then.
    d.lanes.pool.use_start(&cwd);
    crate::daemon::router::sessions::spawn(d, params, move |d, r| match r {
        Ok(Spawned { session_id: sid }) => {
            if session_alive(d, &sid) {
                d.lanes.checkout_sessions.insert(sid.clone(), cwd);
            } else {
                checkout_used(d, &cwd);
            }
            d.lanes
                .by_session
                .insert(sid.clone(), (lid.clone(), Role::Verifier));
            if let Some(l) = d.lanes.map.get_mut(&lid) {
                l.verifier_session = Some(sid);
            }
            persist(d, &lid, Vec::new());
        }
        Err(e) => {
            checkout_used(d, &cwd);
            crate::warn!("lane {lid}: the verifier could not start: {}", e.message);
            let _ = step(d, &lid, Input::VerifierFailed);
        }
    });
}

/// Sends the builder its next turn: into its live session when it has one,
/// else into a new session of a ready seat in the same worktree.
fn prompt_builder(d: &mut Daemon, id: &str, text: String) {
    let Some(l) = d.lanes.map.get_mut(id) else {
        return;
    };
    l.checks += 1;
    let check_id = format!("check-{}", l.checks);
    let sid = l.builder_session.clone();
    let reopened = l.builder_reopened.clone();
    let task = l.task.task.clone();
    persist(d, id, Vec::new());
    if let Some(sid) = sid.filter(|s| session_alive(d, s)) {
        // A session the restart reopened without its agent's history has
        // never seen the task: it gets it as a new builder session would.
        let text = if reopened.is_some_and(|asid| !kept_history(d, &sid, &asid)) {
            format!("{text}\n\nThe task:\n{task}")
        } else {
            text.clone()
        };
        let record = json!({"id": check_id, "lane": id, "text": text});
        if crate::daemon::router::sessions::input(d, &sid, text).is_ok() {
            if let Some(l) = d.lanes.map.get_mut(id) {
                l.builder_reopened = None;
            }
            record_check(d, &sid, &record);
            return;
        }
    }
    let record = json!({"id": check_id, "lane": id, "text": text});
    restart_builder_with(d, id, text, Some(record));
}

/// Whether a session the restart reopened with agent session `asid` came
/// back in that session, with its history: its agent is set up and kept
/// that id (a new agent session, after an agent that cannot load or that
/// refused to, has another one). Not set up yet counts as not kept.
fn kept_history(d: &Daemon, sid: &str, asid: &str) -> bool {
    d.core
        .sessions
        .summary(sid)
        .is_some_and(|s| s.ready && s.agent_session_id == Some(asid))
}

/// The `check.rework` record on the builder's session stream: what the lane
/// sent the builder, never an event kind a plugin receives.
fn record_check(d: &mut Daemon, sid: &str, record: &Value) {
    let op = Op::Event {
        stream: sid.to_string(),
        kind: "check.rework".into(),
        ts: crate::clock::now_ts(),
        data: record.to_string(),
    };
    d.write(vec![op], |_, r| {
        if let Err(e) = r {
            crate::error!("a check.rework record was not stored: {e:?}");
        }
    });
}

/// Starts a builder session in the lane's worktree: the lane's seat when it
/// is ready, otherwise another ready seat of a family other than the
/// verifier's (failover). With none, the lane goes to the operator.
fn restart_builder(d: &mut Daemon, id: &str, text: String) {
    restart_builder_with(d, id, text, None);
}

/// As [`restart_builder`], recording `check` on the new session's stream
/// once it exists.
fn restart_builder_with(d: &mut Daemon, id: &str, text: String, check: Option<Value>) {
    let Some(l) = d.lanes.map.get(id).cloned() else {
        return;
    };
    let seat = if seat_ready(d, &l.builder.harness) {
        Some(l.builder.clone())
    } else {
        d.core
            .seats
            .list
            .iter()
            .find(|s| {
                s.status == Some(crate::core::seats::Status::Ready)
                    && s.cfg.family() != l.verifier.family
                    && s.cfg.family() != Family::Auto
            })
            .map(|s| seat_ref(&s.cfg))
    };
    let Some(seat) = seat else {
        broken(d, id, "no ready seat can continue building".into());
        return;
    };
    let prompt = format!("{}\n\nThe task:\n{}", text, l.task.task);
    let params = crate::core::sessions::SpawnRequest {
        harness: seat.harness.clone(),
        cwd: l.worktree.display().to_string(),
        prompt: Some(prompt),
        model: None,
        name: Some(l.task.name.clone()),
    };
    let lid = id.to_string();
    crate::daemon::router::sessions::spawn(d, params, move |d, r| match r {
        Ok(Spawned { session_id: sid }) => {
            d.lanes
                .by_session
                .insert(sid.clone(), (lid.clone(), Role::Builder));
            if let Some(c) = &check {
                record_check(d, &sid, c);
            }
            if let Some(l) = d.lanes.map.get_mut(&lid) {
                l.builder_session = Some(sid);
                l.builder = seat;
                // A new session is told the task in its first prompt.
                l.builder_reopened = None;
            }
            persist(d, &lid, Vec::new());
        }
        Err(e) => broken(
            d,
            &lid,
            format!("the builder could not start: {}", e.message),
        ),
    });
}

pub fn seat_ref(cfg: &crate::config::SeatConfig) -> SeatRef {
    SeatRef {
        harness: cfg.harness.clone(),
        provider: cfg.provider.clone(),
        family: cfg.family(),
        model: cfg.model.clone(),
    }
}

fn archive(d: &mut Daemon, id: &str) {
    let Some(l) = d.lanes.map.get_mut(id) else {
        return;
    };
    l.archived = true;
    let sessions: Vec<String> = [l.builder_session.clone(), l.verifier_session.clone()]
        .into_iter()
        .flatten()
        .collect();
    let merged = l.machine.stage == Stage::Merged;
    let (repo, wt, remove) = (
        l.repo.clone(),
        l.worktree.clone(),
        merged || l.remove_worktree,
    );
    for s in &sessions {
        d.lanes.by_session.remove(s);
        if session_alive(d, s) {
            let _ = crate::daemon::router::sessions::kill(d, s);
        }
    }
    release_checkout(d, id);
    persist(d, id, Vec::new());
    if remove {
        let lid = id.to_string();
        let shown = wt.display().to_string();
        let g = daemon_git(d);
        let _ = job(
            d,
            move || git::remove_worktree(&g, &repo, &wt),
            move |_, r| match r {
                Ok(()) => crate::info!("lane {lid}: worktree {shown} removed"),
                Err(e) => crate::warn!("lane {lid}: {e}"),
            },
        );
    }
}

/// Puts the lane's pass in the approvals inbox; the operator's allow
/// merges exactly `commit`, a deny (or the timeout's fallback) sends the
/// lane back. `lanes.merge` stays the operator's direct way.
fn request_merge_approval(d: &mut Daemon, id: &str, commit: &str) {
    let Some(l) = d.lanes.map.get_mut(id) else {
        return;
    };
    l.reason = Some(format!(
        "a pass on {commit} waits for the operator's approval in the inbox"
    ));
    let approval = format!("{id}-merge-{}", l.machine.verdicts);
    let merge = crate::core::inbox::LaneMerge {
        lane: id.to_string(),
        summary: format!(
            "merge lane {id} ({}) from {} into {}",
            l.task.name, l.branch, l.base
        ),
        commit: commit.to_string(),
    };
    persist(d, id, Vec::new());
    if let Err(e) = crate::daemon::router::sessions::add_lane_merge(d, &approval, merge) {
        crate::warn!(
            "lane {id}: its merge could not enter the inbox ({e:?}); it waits for lanes.merge"
        );
    }
}

/// The operator answered a lane's merge approval. Returns whether the lane
/// took it (it still waits at its pass on that commit).
pub fn on_merge_answer(
    d: &mut Daemon,
    id: &str,
    commit: &str,
    verdict: crate::core::inbox::Verdict,
) -> bool {
    let waiting = d.lanes.map.get(id).is_some_and(|l| {
        l.machine.stage == Stage::Pass && l.machine.commit.as_deref() == Some(commit)
    });
    if !waiting {
        return false;
    }
    match verdict {
        crate::core::inbox::Verdict::Allow => step(d, id, Input::OperatorMerge).is_ok(),
        _ => {
            if let Some(l) = d.lanes.map.get_mut(id) {
                l.reason = Some("the operator did not allow the merge".into());
            }
            step(d, id, Input::MergeDenied).is_ok()
        }
    }
}

/// Closes a lane whose plugin is removed with stopTasks; returns how many
/// of its sessions were still running and are now stopped.
pub fn stop_for_removal(d: &mut Daemon, id: &str) -> usize {
    let Some(l) = d.lanes.map.get(id) else {
        return 0;
    };
    if l.archived {
        return 0;
    }
    let live = [&l.builder_session, &l.verifier_session]
        .into_iter()
        .flatten()
        .filter(|s| session_alive(d, s))
        .count();
    crate::info!("lane {id}: closed because the plugin that asked for it is removed");
    let _ = step(d, id, Input::OperatorClose);
    live
}

/// Every committed event passes here: the lane learns of its builder's and
/// verifier's turns and exits.
pub fn on_events(d: &mut Daemon, events: &[Appended]) {
    for ev in events.iter().filter(|e| e.kind == "session.end") {
        if let Some(co) = d.lanes.checkout_sessions.remove(&ev.stream) {
            checkout_used(d, &co);
        }
    }
    for ev in events {
        if ev.kind != "turn.end" && ev.kind != "session.end" {
            continue;
        }
        let Some((lid, role)) = d.lanes.by_session.get(&ev.stream).cloned() else {
            continue;
        };
        if d.lanes.to_resume.contains(&lid) {
            continue;
        }
        // A builder's turn may have committed or moved its branch.
        if role == Role::Builder {
            d.lanes.refresh_heads();
        }
        let reason = serde_json::from_str::<Value>(&ev.data)
            .ok()
            .and_then(|v| v["reason"].as_str().map(str::to_string));
        match (role, ev.kind.as_str(), reason.as_deref()) {
            (Role::Builder, "turn.end", Some("completed"))
                if d.lanes
                    .map
                    .get(&lid)
                    .is_some_and(|l| l.machine.stage == Stage::Building) =>
            {
                let _ = step(d, &lid, Input::BuilderIdle);
            }
            (Role::Builder, "turn.end", Some("failed" | "usage-limited"))
            | (Role::Builder, "session.end", _)
                if d.lanes
                    .map
                    .get(&lid)
                    .is_some_and(|l| l.machine.stage == Stage::Building) =>
            {
                let sid = ev.stream.clone();
                d.lanes.by_session.remove(&sid);
                if session_alive(d, &sid) {
                    let _ = crate::daemon::router::sessions::kill(d, &sid);
                }
                // The failed seat is skipped: its family stays allowed.
                if let Some(l) = d.lanes.map.get_mut(&lid) {
                    l.builder_session = None;
                }
                crate::warn!("lane {lid}: the builder's session {sid} failed; failing over");
                failover(d, &lid);
            }
            (Role::Verifier, "turn.end", Some("completed")) => read_answer(d, &lid, &ev.stream),
            (Role::Verifier, "turn.end", _) | (Role::Verifier, "session.end", _)
                if d.lanes
                    .map
                    .get(&lid)
                    .is_some_and(|l| l.machine.stage == Stage::Verifying) =>
            {
                finish_verifier(d, &ev.stream);
                let _ = step(d, &lid, Input::VerifierFailed);
            }
            _ => {}
        }
    }
}

fn failover(d: &mut Daemon, id: &str) {
    let Some(l) = d.lanes.map.get(id).cloned() else {
        return;
    };
    let failed = l.builder.harness.clone();
    let next = d
        .core
        .seats
        .list
        .iter()
        .find(|s| {
            s.cfg.harness != failed
                && s.status == Some(crate::core::seats::Status::Ready)
                && s.cfg.family() != l.verifier.family
                && s.cfg.family() != Family::Auto
        })
        .map(|s| seat_ref(&s.cfg));
    match next {
        Some(seat) => {
            if let Some(l) = d.lanes.map.get_mut(id) {
                l.builder = seat;
            }
            restart_builder(d, id, "The agent that worked on this task before you stopped. Continue the task in this worktree; its work so far is here.".into());
        }
        None => broken(
            d,
            id,
            format!(
                "the builder {failed} failed and no other ready seat of an allowed family can take over"
            ),
        ),
    }
}

fn finish_verifier(d: &mut Daemon, sid: &str) {
    if let Some((lid, _)) = d.lanes.by_session.remove(sid) {
        if let Some(l) = d.lanes.map.get_mut(&lid) {
            if l.verifier_session.as_deref() == Some(sid) {
                l.verifier_session = None;
            }
        }
    }
    if session_alive(d, sid) {
        let _ = crate::daemon::router::sessions::kill(d, sid);
    }
}

/// Reads the verifier's last turn from the ledger and hands it to the lane.
fn read_answer(d: &mut Daemon, id: &str, sid: &str) {
    let inbox = d.inbox.clone();
    let (lid, sid) = (id.to_string(), sid.to_string());
    let queued = d.ledger.read(Box::new(move |conn| {
        let text =
            crate::core::transcript::read_entries(conn, &sid, 0, limits::LANE_VERIFIER_ENTRIES)
                .map(|entries| last_turn_text(&entries))
                .unwrap_or_default();
        inbox.run(move |d| {
            finish_verifier(d, &sid);
            if d.lanes
                .map
                .get(&lid)
                .is_some_and(|l| l.machine.stage == Stage::Verifying)
            {
                let _ = step(d, &lid, Input::VerifierAnswered(text));
            }
        });
    }));
    if queued.is_err() {
        broken(
            d,
            id,
            "the ledger reader is busy; the verifier's answer could not be read".into(),
        );
    }
}

/// The text the agent wrote after the last user entry.
fn last_turn_text(entries: &[Value]) -> String {
    let start = entries
        .iter()
        .rposition(|e| e["kind"] == "user")
        .map_or(0, |i| i + 1);
    entries[start..]
        .iter()
        .filter(|e| e["kind"] == "text")
        .filter_map(|e| e["text"].as_str())
        .collect::<Vec<_>>()
        .join("")
}

/// The task's name when the dispatch names none: "the first line of task"
/// (seed 000, tasks.create name). Leading blank lines are skipped (a line
/// with no text names nothing), the line is trimmed, and a line longer
/// than the longest name a dispatch may give (`LANE_NAME_MAX_CHARS`) is cut
/// at its last space within that length, or at that length when it has
/// none.
pub fn default_name(task: &str) -> String {
    let line = task
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default();
    if line.chars().count() <= limits::LANE_NAME_MAX_CHARS {
        return line.to_string();
    }
    let cut: String = line.chars().take(limits::LANE_NAME_MAX_CHARS).collect();
    match cut.rfind(char::is_whitespace) {
        Some(i) if !cut[..i].trim().is_empty() => cut[..i].trim_end().to_string(),
        _ => cut,
    }
}

/// A task's short name as a branch and folder name: lowercase letters,
/// digits and hyphens.
pub fn slug(name: &str) -> String {
    let mut s = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('-') && !s.is_empty() {
            s.push('-');
        }
        if s.len() >= 48 {
            break;
        }
    }
    s.trim_end_matches('-').to_string()
}

/// The repositories lanes may work on: the config's and those added.
pub fn known_repos(d: &Daemon) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = d.cfg.repo.iter().map(|r| PathBuf::from(&r.path)).collect();
    v.extend(d.lanes.added_repos.iter().cloned());
    v.sort();
    v.dedup();
    v
}

/// The name `task.dispatch` gives a task that names none.
fn task_name(req: &DispatchRequest) -> String {
    req.name.clone().unwrap_or_else(|| default_name(&req.task))
}

/// Where `task.dispatch` of `req` puts its worktree: plugin.remove lists
/// the worktrees its aborted dispatches left (seed 000, plugin.remove).
pub fn planned_worktree(d: &Daemon, req: &DispatchRequest) -> PathBuf {
    let repo = req.repo.canonicalize().unwrap_or_else(|_| req.repo.clone());
    worktree_path(d, &repo, &slug(&task_name(req)))
}

/// Where a lane's worktree goes: `<repo>-wt/<name>` unless the config names a
/// root (then `<root>/<repo name>/<name>`).
pub fn worktree_path(d: &Daemon, repo: &Path, slug: &str) -> PathBuf {
    let repo_name = repo
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "repo".into());
    if d.cfg.lanes.worktree_root.is_empty() {
        repo.with_file_name(format!("{repo_name}-wt")).join(slug)
    } else {
        PathBuf::from(&d.cfg.lanes.worktree_root)
            .join(repo_name)
            .join(slug)
    }
}

/// What a dispatch asks for, whichever surface it came from (the plugin
/// wire's tasks.create, the socket's task.dispatch), its members already
/// checked against the wire's patterns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatchRequest {
    /// A repository the daemon knows, or a worktree of one.
    pub repo: PathBuf,
    /// What the builder is asked to do.
    pub task: String,
    /// The builder's harness.
    pub builder: String,
    /// The verifier's harness.
    pub verifier: String,
    /// The acceptance check's name.
    pub acceptance_name: String,
    /// The acceptance check's command line.
    pub acceptance_command: String,
    /// The task's name; [`default_name`] of the task when absent.
    pub name: Option<String>,
    /// The branch the lane starts from; the main worktree's when absent.
    pub base: Option<String>,
}

/// A lane a dispatch started, its builder's session running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatched {
    pub lane: String,
    pub session: String,
    pub branch: String,
    pub worktree: PathBuf,
}

/// A validated dispatch, ready to create.
pub struct Dispatch {
    pub repo: PathBuf,
    pub task: Task,
    pub builder: SeatRef,
    pub verifier: SeatRef,
    pub base: Option<String>,
}

/// Checks what can be checked on the reactor (repository known, seats ready
/// and of different families, isolation), then creates the worktree on a
/// worker and starts the builder. `then` gets the lane or the refusal, whose
/// stable code the plugin host passes on as task-refused's reason.
pub fn dispatch(
    d: &mut Daemon,
    req: DispatchRequest,
    then: impl FnOnce(&mut Daemon, Result<Dispatched, RpcError>) + Send + 'static,
) {
    let refuse = |code, msg: String| Err(lane_err(code, msg));
    let repo = req.repo.canonicalize().unwrap_or_else(|_| req.repo.clone());
    let known = |d: &Daemon, repo: &Path| {
        known_repos(d)
            .iter()
            .any(|r| r.canonicalize().unwrap_or_else(|_| r.clone()) == repo)
    };
    if !known(d, &repo) {
        // A worktree of a known repository stands for its repository
        // (seed 000: "a repository or worktree the daemon already lists");
        // a lane's own is known here, any other is asked of git.
        let unknown = |repo: &Path| {
            lane_err(
                Code::RepoUnknown,
                format!(
                    "{} is not a repository the daemon knows, nor a worktree of one; add it with repos.add",
                    repo.display()
                ),
            )
        };
        let of_lane = d
            .lanes
            .map
            .values()
            .find(|l| {
                l.worktree
                    .canonicalize()
                    .unwrap_or_else(|_| l.worktree.clone())
                    == repo
            })
            .map(|l| l.repo.canonicalize().unwrap_or_else(|_| l.repo.clone()));
        if let Some(main) = of_lane {
            if !known(d, &main) {
                return then(d, Err(unknown(&repo)));
            }
            let mut req = req;
            req.repo = main;
            return dispatch(d, req, then);
        }
        if let Err(e) = d.lanes.workers_ready() {
            return then(d, Err(e));
        }
        let asked = repo.clone();
        let g = daemon_git(d);
        let queued = job(
            d,
            move || {
                // A worktree's top folder, not any folder inside one.
                let top = git::toplevel(&g, &asked).ok()?;
                if top.canonicalize().unwrap_or(top) != asked {
                    return None;
                }
                git::repository_of(&g, &asked).ok()
            },
            move |d, main| match main.map(|m| m.canonicalize().unwrap_or(m)) {
                Some(main) if main != repo && known(d, &main) => {
                    let mut req = req;
                    req.repo = main;
                    dispatch(d, req, then);
                }
                _ => then(d, Err(unknown(&repo))),
            },
        );
        if let Err(e) = queued {
            // Only a worker pool that died can refuse after `workers_ready`.
            crate::error!(
                "task.dispatch could not reach the lane workers: {}",
                e.message
            );
        }
        return;
    }
    let check = (|| -> Result<Dispatch, RpcError> {
        let seat = |h: &str| -> Result<SeatRef, RpcError> {
            match d.core.seats.get(h) {
                None => Err(lane_err(Code::SeatNotFound, format!("no seat {h}"))),
                Some(s) if s.status != Some(crate::core::seats::Status::Ready) => Err(lane_err(
                    Code::SeatNotReady,
                    format!("seat {h} is not ready"),
                )),
                Some(s) => Ok(seat_ref(&s.cfg)),
            }
        };
        let builder = seat(&req.builder)?;
        let verifier = seat(&req.verifier)?;
        if builder.family == verifier.family
            || builder.family == Family::Auto
            || verifier.family == Family::Auto
        {
            return refuse(
                Code::SameFamily,
                format!(
                    "the verifier must be of another provider family than the builder ({})",
                    builder.family.name()
                ),
            );
        }
        match &d.lanes.isolation {
            Some(Ok(_)) => {}
            _ if !d.cfg.lanes.require_isolation => {}
            Some(Err(why)) => {
                return refuse(
                    Code::IsolationMissing,
                    format!("the acceptance command cannot run isolated here: {why}"),
                );
            }
            None => {
                return refuse(
                    Code::IsolationMissing,
                    "isolation is still being probed; try again".into(),
                );
            }
        }
        let name = task_name(&req);
        if slug(&name).is_empty() {
            return Err(RpcError::invalid_params(
                "name must hold a letter or a digit",
            ));
        }
        Ok(Dispatch {
            repo,
            task: Task {
                task: req.task.clone(),
                acceptance_name: req.acceptance_name.clone(),
                acceptance_command: req.acceptance_command.clone(),
                name,
            },
            builder,
            verifier,
            base: req.base.clone(),
        })
    })();
    let p = match check.and_then(|p| d.lanes.workers_ready().map(|()| p)) {
        Ok(p) => p,
        Err(e) => return then(d, Err(e)),
    };
    let id = crate::ids::prefixed_id("t-");
    let s = slug(&p.task.name);
    let branch = format!("{}/{s}", d.cfg.lanes.branch_prefix);
    let worktree = worktree_path(d, &p.repo, &s);
    let (repo, base) = (p.repo.clone(), p.base.clone());
    let (b2, w2) = (branch.clone(), worktree.clone());
    let g = daemon_git(d);
    let queued = job(
        d,
        move || -> Result<(String, String), RpcError> {
            let base = match base.or_else(|| git::current_branch(&g, &repo)) {
                Some(b) => b,
                None => {
                    return Err(lane_err(
                        Code::BaseUnknown,
                        "the main worktree has no branch checked out; name a base",
                    ));
                }
            };
            let Some(base_commit) = git::commit_of(&g, &repo, &format!("refs/heads/{base}")) else {
                return Err(lane_err(
                    Code::BaseUnknown,
                    format!("no branch {base} in the repository"),
                ));
            };
            if !git::valid_branch_name(&g, &repo, &b2) {
                return Err(RpcError::invalid_params(format!(
                    "{b2} is not a branch name git accepts"
                )));
            }
            if git::branch_exists(&g, &repo, &b2) || w2.exists() {
                return Err(lane_err(
                    Code::NameTaken,
                    format!("the branch {b2} or the worktree {} exists", w2.display()),
                ));
            }
            git::add_worktree(&g, &repo, &w2, &b2, &base_commit)
                .map_err(|e| lane_err(Code::Unavailable, e.to_string()))?;
            Ok((base, base_commit))
        },
        move |d, r| match r {
            Ok((base, base_commit)) => create(d, id, p, base, base_commit, branch, worktree, then),
            Err(e) => then(d, Err(e)),
        },
    );
    if let Err(e) = queued {
        // Only a worker pool that died can refuse after `workers_ready`.
        crate::error!(
            "task.dispatch could not reach the lane workers: {}",
            e.message
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn create(
    d: &mut Daemon,
    id: String,
    p: Dispatch,
    base: String,
    base_commit: String,
    branch: String,
    worktree: PathBuf,
    then: impl FnOnce(&mut Daemon, Result<Dispatched, RpcError>) + 'static,
) {
    let params = crate::core::sessions::SpawnRequest {
        harness: p.builder.harness.clone(),
        cwd: worktree.display().to_string(),
        prompt: Some(format!(
            "{}\n\nWork in this worktree on branch {branch}. When you are done the daemon runs `{}` and another agent reviews your change.",
            p.task.task, p.task.acceptance_command
        )),
        model: None,
        name: Some(p.task.name.clone()),
    };
    let max_rounds = d.cfg.lanes.max_rounds;
    let approval = d.cfg.lanes.require_merge_approval;
    crate::daemon::router::sessions::spawn(d, params, move |d, r| {
        let sid = match r {
            Ok(Spawned { session_id }) => session_id,
            Err(e) => {
                let (repo, wt, br) = (p.repo.clone(), worktree.clone(), branch.clone());
                let g = daemon_git(d);
                let _ = job(
                    d,
                    move || {
                        let _ = git::remove_worktree(&g, &repo, &wt);
                        let _ = git::delete_branch(&g, &repo, &br);
                    },
                    |_, ()| {},
                );
                return then(d, Err(e));
            }
        };
        let now = crate::clock::now_ms();
        // The daemon made the branch at the base's commit just now.
        let base_commit_at_start = base_commit.clone();
        let lane = Lane {
            id: id.clone(),
            repo: p.repo,
            base,
            base_commit,
            branch: branch.clone(),
            worktree: worktree.clone(),
            task: p.task,
            builder: p.builder,
            builder_session: Some(sid.clone()),
            verifier: p.verifier,
            verifier_session: None,
            machine: Machine::new(max_rounds, approval),
            created_ms: now,
            stage_since_ms: now,
            last_check: None,
            reason: None,
            checks: 0,
            archived: false,
            remove_worktree: false,
            checkout: None,
            builder_reopened: None,
            head: Some(Some(base_commit_at_start)),
        };
        let start = event(
            "lane.start",
            json!({"lane": id, "session": sid, "builder": lane.builder.to_json(), "verifier": lane.verifier.to_json()}),
        );
        let stage = event(
            "lane.stage",
            json!({"lane": id, "stage": "building", "since": crate::clock::format_ts(now)}),
        );
        d.lanes
            .by_session
            .insert(sid.clone(), (id.clone(), Role::Builder));
        d.lanes.map.insert(id.clone(), lane);
        persist(d, &id, vec![start, stage]);
        crate::info!("lane {id}: dispatched on {branch} with session {sid}");
        then(
            d,
            Ok(Dispatched {
                lane: id,
                session: sid,
                branch,
                worktree,
            }),
        );
    });
}

/// The commit the lane's branch points at (seed 000, lanes[].head), as
/// last read or moved by the daemon, null when the branch or the
/// repository is gone; and whether the latest verdict is on another
/// commit than that (`stale`; a verdict with the branch gone is stale).
/// Before the first read (just after a start) the commit the lane works on
/// stands in.
pub fn head_and_stale(l: &Lane) -> (Option<String>, bool) {
    let head = match &l.head {
        Some(h) => h.clone(),
        None => l.machine.commit.clone(),
    };
    let stale = match &l.machine.last_verdict {
        Some((_, c)) => head.as_deref() != Some(c.as_str()),
        None => false,
    };
    (head, stale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lanes::machine::VerdictKind;

    #[test]
    fn the_default_name_is_the_first_line_with_text() {
        assert_eq!(
            default_name("Add feature.txt\nwith the word feature"),
            "Add feature.txt"
        );
        assert_eq!(
            default_name("\n  \n  Fix the login page  \nmore"),
            "Fix the login page"
        );
        assert_eq!(default_name("one"), "one");
        // Cut to the longest name a dispatch may give, at a space.
        let long = "Make the remember me checkbox on the login page keep the session";
        let name = default_name(long);
        assert_eq!(name, "Make the remember me checkbox on the login page");
        assert!(name.chars().count() <= limits::LANE_NAME_MAX_CHARS);
        // A line without a space within the bound is cut at the bound.
        let word = "x".repeat(100);
        assert_eq!(default_name(&word), "x".repeat(limits::LANE_NAME_MAX_CHARS));
        // Characters, not bytes: no cut inside a character.
        let wide = "\u{e9}".repeat(60);
        assert_eq!(
            default_name(&wide).chars().count(),
            limits::LANE_NAME_MAX_CHARS
        );
    }

    fn lane() -> Lane {
        let seat = SeatRef {
            harness: "b".into(),
            provider: "p".into(),
            family: Family::Anthropic,
            model: None,
        };
        Lane {
            id: "t-000000000001".into(),
            repo: "/r".into(),
            base: "main".into(),
            base_commit: "a".repeat(40),
            branch: "omni/x".into(),
            worktree: "/r-wt/x".into(),
            task: Task {
                task: "t".into(),
                acceptance_name: "n".into(),
                acceptance_command: "true".into(),
                name: "x".into(),
            },
            builder: seat.clone(),
            builder_session: None,
            verifier: seat,
            verifier_session: None,
            machine: Machine::new(3, false),
            created_ms: 0,
            stage_since_ms: 0,
            last_check: None,
            reason: None,
            checks: 0,
            archived: false,
            remove_worktree: false,
            checkout: None,
            builder_reopened: None,
            head: None,
        }
    }

    #[test]
    fn head_is_the_branch_and_a_verdict_on_another_commit_is_stale() {
        let (c1, c2) = ("1".repeat(40), "2".repeat(40));
        let mut l = lane();
        // Not read yet: the commit the lane works on stands in.
        l.machine.commit = Some(c1.clone());
        assert_eq!(head_and_stale(&l), (Some(c1.clone()), false));
        l.machine.last_verdict = Some((VerdictKind::Pass, c1.clone()));
        l.head = Some(Some(c1.clone()));
        assert_eq!(head_and_stale(&l), (Some(c1.clone()), false));
        // The branch moved on after the verdict.
        l.head = Some(Some(c2.clone()));
        assert_eq!(head_and_stale(&l), (Some(c2), true));
        // The branch is gone.
        l.head = Some(None);
        assert_eq!(head_and_stale(&l), (None, true));
        // No verdict: never stale.
        l.machine.last_verdict = None;
        assert_eq!(head_and_stale(&l), (None, false));
        // The head is not stored with the lane: it is read again at start.
        let text = serde_json::to_string(&l).unwrap();
        assert!(!text.contains("\"head\""), "{text}");
        let back: Lane = serde_json::from_str(&text).unwrap();
        assert_eq!(back.head, None);
    }
}
