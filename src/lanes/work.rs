//! The lanes' blocking work (issue 5; issue 11, "jobs for worker threads"):
//! every git command and acceptance check the controller asks for, as a
//! typed [`Job`], run on the `lane-worker` threads, and the branch-head
//! reads of [`HeadsJob`], run on the `lane-heads` thread so that they never
//! wait behind an acceptance command. Each job's outcome goes back as a
//! typed [`Report`] through the sink the router gives [`Workers::start`];
//! the router hands it to `Lanes::on_report`. Nothing here knows the
//! daemon or the lanes' state: a job carries everything it needs, and the
//! [`Env`] says how the daemon's git runs now.
//!
//! Both queues are bounded (`LANE_JOB_QUEUE`, `LANE_HEADS_QUEUE`); a full
//! one refuses the job at once with a typed error rather than waiting,
//! and the controller decides what a refused job means for its lane.

use crossbeam_channel::{Sender, TrySendError, bounded};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::MergeMode;
use crate::errors::{Code, RpcError};
use crate::isolation::Hidden;
use crate::lanes::check::{self, Isolation, Outcome};
use crate::lanes::controller::{DispatchRequest, NewLane, ReplyKey};
use crate::lanes::git;
use crate::limits;

/// Blocking work for a lane worker. Lane jobs name their lane, so that
/// the report (or the refusal) goes back to it.
#[derive(Debug, Clone, PartialEq)]
pub enum Job {
    /// Which repository `asked` is a worktree of (a dispatch named a
    /// folder the daemon does not know); reports [`Report::RepositoryOf`].
    RepositoryOf {
        asked: PathBuf,
        req: Box<DispatchRequest>,
        to: ReplyKey,
    },
    /// Resolve the base and make the new lane's branch and worktree;
    /// reports [`Report::WorktreeMade`].
    MakeWorktree(Box<NewLane>),
    /// Remove a worktree and branch a dispatch made and could not use.
    UndoWorktree {
        repo: PathBuf,
        worktree: PathBuf,
        branch: String,
    },
    /// List the folders under `dir` (state/lanes) with the repository
    /// each is a worktree of; reports [`Report::Found`].
    Reclaim { dir: PathBuf },
    /// Remove a daemon-owned checkout; reports [`Report::CheckoutRemoved`].
    RemoveCheckout {
        repo: Option<PathBuf>,
        checkout: PathBuf,
    },
    /// Commit what the builder left in the worktree; reports
    /// [`Report::Committed`].
    CommitWork { lane: String, worktree: PathBuf },
    /// Put the checkout at `commit` and run the acceptance command there;
    /// reports [`Report::Checked`].
    Check {
        lane: String,
        repo: PathBuf,
        checkout: PathBuf,
        commit: String,
        command: String,
        timeout: Duration,
        isolation: Isolation,
    },
    /// The diff the verifier reads, and the checkout put back at exactly
    /// the commit it judges; reports [`Report::Diffed`].
    Diff {
        lane: String,
        repo: PathBuf,
        checkout: PathBuf,
        base_commit: String,
        commit: String,
        second: bool,
    },
    /// Merge `commit` into `base`; reports [`Report::Merged`].
    Merge {
        lane: String,
        repo: PathBuf,
        base: String,
        commit: String,
        mode: MergeMode,
        message: String,
    },
    /// Remove an archived lane's worktree; reports
    /// [`Report::WorktreeRemoved`].
    RemoveWorktree {
        lane: String,
        repo: PathBuf,
        worktree: PathBuf,
    },
    /// Each repository with its worktrees (repos.list); reports
    /// [`Report::ReposListed`].
    ListRepos { repos: Vec<PathBuf>, to: ReplyKey },
    /// The top folder of the worktree at `path` (repos.add); reports
    /// [`Report::Toplevel`].
    Toplevel { path: PathBuf, to: ReplyKey },
}

/// The lanes' branches by repository (`(lane, branch)` each), to read on
/// the heads thread; `to` waits for the read when a reader asked for it.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadsJob {
    pub branches: HashMap<PathBuf, Vec<(String, String)>>,
    pub to: Option<ReplyKey>,
}

/// What the lanes' branches point at: `(lane, commit)`, the commit None
/// when the branch or its repository is gone.
pub type Heads = Vec<(String, Option<String>)>;

/// A repository as repos.list shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RepoListing {
    pub path: PathBuf,
    pub exists: bool,
    /// Each worktree with the branch checked out there.
    pub worktrees: Vec<(PathBuf, Option<String>)>,
}

/// What a job did, handed to `Lanes::on_report` on the reactor.
#[derive(Debug)]
pub enum Report {
    RepositoryOf {
        asked: PathBuf,
        main: Option<PathBuf>,
        req: Box<DispatchRequest>,
        to: ReplyKey,
    },
    /// The base and its commit, or why the worktree was not made.
    WorktreeMade {
        lane: Box<NewLane>,
        made: Result<(String, String), RpcError>,
    },
    Found(Vec<(PathBuf, Option<PathBuf>)>),
    CheckoutRemoved {
        checkout: PathBuf,
        result: Result<(), String>,
    },
    /// The lane's commit, or why it could not be made.
    Committed {
        lane: String,
        result: Result<String, String>,
    },
    Checked {
        lane: String,
        checkout: PathBuf,
        result: Result<Outcome, String>,
    },
    Diffed {
        lane: String,
        checkout: PathBuf,
        commit: String,
        second: bool,
        result: Result<String, String>,
    },
    /// Base's new commit, or why the merge failed.
    Merged {
        lane: String,
        result: Result<String, String>,
    },
    WorktreeRemoved {
        lane: String,
        worktree: PathBuf,
        result: Result<(), String>,
    },
    ReposListed {
        repos: Vec<RepoListing>,
        to: ReplyKey,
    },
    Toplevel {
        result: Result<PathBuf, String>,
        to: ReplyKey,
    },
    /// A branch-head read is in.
    Heads {
        heads: Heads,
        to: Option<ReplyKey>,
    },
    /// The ledger reader read the verifier's last turn (`Effect::ReadAnswer`
    /// of the controller; the reader is the ledger's thread, not a lane
    /// worker).
    Answer {
        lane: String,
        session: String,
        text: String,
    },
}

/// How the daemon's git runs at the time a job is queued (the `git`
/// module comment), and what a contained acceptance command hides.
pub struct Env {
    pub git: git::Git,
    pub hidden: Hidden,
}

/// Where the workers hand their reports.
pub type Sink = Arc<dyn Fn(Report) + Send + Sync>;

/// The lane workers and the heads thread, started once the ledger's lanes
/// are read.
pub struct Workers {
    jobs: Sender<(Job, Env)>,
    heads: Sender<HeadsJob>,
}

impl Workers {
    /// Starts `LANE_WORKERS` lane workers and the heads thread.
    pub fn start(sink: Sink) -> std::io::Result<Workers> {
        let (tx, rx) = bounded::<(Job, Env)>(limits::LANE_JOB_QUEUE);
        for n in 0..limits::LANE_WORKERS {
            let (rx, sink) = (rx.clone(), sink.clone());
            std::thread::Builder::new()
                .name(format!("lane-worker-{n}"))
                .spawn(move || {
                    for (job, env) in rx {
                        if let Some(r) = run(job, &env) {
                            sink(r);
                        }
                    }
                })?;
        }
        let (htx, hrx) = bounded::<HeadsJob>(limits::LANE_HEADS_QUEUE);
        std::thread::Builder::new()
            .name("lane-heads".into())
            .spawn(move || {
                for job in hrx {
                    let heads = read_heads(job.branches);
                    sink(Report::Heads { heads, to: job.to });
                }
            })?;
        Ok(Workers {
            jobs: tx,
            heads: htx,
        })
    }

    /// Queues `job`; a full queue refuses it at once, with the job back
    /// (boxed: a refusal is rare, and the job is large).
    pub fn submit(&self, job: Job, env: Env) -> Result<(), Box<(Job, RpcError)>> {
        match self.jobs.try_send((job, env)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full((job, _))) => Err(Box::new((job, busy()))),
            Err(TrySendError::Disconnected((job, _))) => Err(Box::new((
                job,
                RpcError::new(Code::Unavailable, "the lane workers stopped"),
            ))),
        }
    }

    /// Queues a branch-head read; a full queue hands it back.
    pub fn read_heads(&self, job: HeadsJob) -> Result<(), HeadsJob> {
        self.heads.try_send(job).map_err(TrySendError::into_inner)
    }
}

/// The refusal of a job while no worker runs (before the lanes are read,
/// or when the threads could not start).
pub fn not_running() -> RpcError {
    RpcError::new(Code::Unavailable, "the lane workers are not running")
}

fn busy() -> RpcError {
    RpcError::new(Code::Unavailable, "the lane workers are busy; try again")
}

/// Does the job (blocking); None for a job nobody waits on.
pub fn run(job: Job, env: &Env) -> Option<Report> {
    let g = &env.git;
    Some(match job {
        Job::RepositoryOf { asked, req, to } => {
            // A worktree's top folder, not any folder inside one.
            let main = git::toplevel(g, &asked)
                .ok()
                .filter(|top| top.canonicalize().unwrap_or(top.clone()) == asked)
                .and_then(|_| git::repository_of(g, &asked).ok());
            Report::RepositoryOf {
                asked,
                main,
                req,
                to,
            }
        }
        Job::MakeWorktree(lane) => {
            let made = make_worktree(g, &lane);
            Report::WorktreeMade { lane, made }
        }
        Job::UndoWorktree {
            repo,
            worktree,
            branch,
        } => {
            let _ = git::remove_worktree(g, &repo, &worktree);
            let _ = git::delete_branch(g, &repo, &branch);
            return None;
        }
        Job::Reclaim { dir } => {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                return Some(Report::Found(Vec::new()));
            };
            Report::Found(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| {
                        let co = e.path();
                        let repo = git::repository_of(g, &co)
                            .ok()
                            .map(|r| r.canonicalize().unwrap_or(r));
                        (co, repo)
                    })
                    .collect(),
            )
        }
        Job::RemoveCheckout { repo, checkout } => {
            let result = match repo {
                Some(repo) => git::remove_worktree(g, &repo, &checkout).map_err(|e| e.to_string()),
                None => std::fs::remove_dir_all(&checkout).map_err(|e| {
                    format!(
                        "unable to remove {}: {}",
                        checkout.display(),
                        crate::errors::io_cause(&e)
                    )
                }),
            };
            Report::CheckoutRemoved { checkout, result }
        }
        Job::CommitWork { lane, worktree } => Report::Committed {
            lane,
            result: git::commit_all(
                g,
                &worktree,
                "lane: commit the work the builder left uncommitted\n\nomniconfluxd commits what a builder's turn leaves in the worktree so that the\nacceptance check and the verifier judge exactly one commit.",
            )
            .map(|(head, _)| head)
            .map_err(|e| e.to_string()),
        },
        Job::Check {
            lane,
            repo,
            checkout,
            commit,
            command,
            timeout,
            isolation,
        } => {
            let result = git::checkout_exactly(g, &repo, &checkout, &commit)
                .map_err(|e| e.to_string())
                .and_then(|()| {
                    check::run(&check::Spec {
                        git: g,
                        checkout: &checkout,
                        command: &command,
                        timeout,
                        isolation: &isolation,
                        hidden: &env.hidden,
                        tail_bytes: limits::LANE_CHECK_TAIL_BYTES,
                    })
                });
            Report::Checked {
                lane,
                checkout,
                result,
            }
        }
        Job::Diff {
            lane,
            repo,
            checkout,
            base_commit,
            commit,
            second,
        } => {
            let result = git::diff(g, &repo, &base_commit, &commit, limits::LANE_DIFF_MAX_BYTES)
                .and_then(|diff| {
                    // The verifier reads the same daemon-owned checkout the
                    // check ran in, put back at exactly the commit it judges.
                    git::checkout_exactly(g, &repo, &checkout, &commit).map(|()| diff)
                })
                .map_err(|e| e.to_string());
            Report::Diffed {
                lane,
                checkout,
                commit,
                second,
                result,
            }
        }
        Job::Merge {
            lane,
            repo,
            base,
            commit,
            mode,
            message,
        } => Report::Merged {
            lane,
            result: git::merge(g, &repo, &base, &commit, mode, &message).map_err(|e| e.to_string()),
        },
        Job::RemoveWorktree {
            lane,
            repo,
            worktree,
        } => {
            let result = git::remove_worktree(g, &repo, &worktree).map_err(|e| e.to_string());
            Report::WorktreeRemoved {
                lane,
                worktree,
                result,
            }
        }
        Job::ListRepos { repos, to } => Report::ReposListed {
            repos: repos
                .into_iter()
                .map(|r| RepoListing {
                    worktrees: git::worktrees(g, &r).unwrap_or_default(),
                    exists: r.is_dir(),
                    path: r,
                })
                .collect(),
            to,
        },
        Job::Toplevel { path, to } => Report::Toplevel {
            result: git::toplevel(g, &path).map_err(|e| e.to_string()),
            to,
        },
    })
}

/// The base (the main worktree's branch when the dispatch named none) and
/// its commit, once the lane's branch and worktree are made there.
fn make_worktree(g: &git::Git, l: &NewLane) -> Result<(String, String), RpcError> {
    let repo = &l.dispatch.repo;
    let base = match l
        .dispatch
        .base
        .clone()
        .or_else(|| git::current_branch(g, repo))
    {
        Some(b) => b,
        None => {
            return Err(RpcError::new(
                Code::BaseUnknown,
                "the main worktree has no branch checked out; name a base",
            ));
        }
    };
    let Some(base_commit) = git::commit_of(g, repo, &format!("refs/heads/{base}")) else {
        return Err(RpcError::new(
            Code::BaseUnknown,
            format!("no branch {base} in the repository"),
        ));
    };
    let (branch, wt) = (&l.branch, &l.worktree);
    if !git::valid_branch_name(g, repo, branch) {
        return Err(RpcError::invalid_params(format!(
            "{branch} is not a branch name git accepts"
        )));
    }
    if git::branch_exists(g, repo, branch) || wt.exists() {
        return Err(RpcError::new(
            Code::NameTaken,
            format!(
                "the branch {branch} or the worktree {} exists",
                wt.display()
            ),
        ));
    }
    git::add_worktree(g, repo, wt, branch, &base_commit)
        .map_err(|e| RpcError::new(Code::Unavailable, e.to_string()))?;
    Ok((base, base_commit))
}

/// What each lane's branch points at now (blocking: the heads thread).
/// Reading refs runs nothing a repository configures, so this git runs on
/// the host (hooks off all the same): the heads thread has no daemon to
/// ask how agents run.
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
