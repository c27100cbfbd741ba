//! Dispatch (issue 5, "Dispatch"; seed 000, tasks.create) and the
//! repositories lanes may work on (repos.list, repos.add): the checks made
//! on the reactor, the worktree made by a worker, the builder asked for,
//! and the lane recorded once it runs. See the module comment of the
//! controller for what a dispatch takes.

use super::*;

impl Lanes {
    /// repos.list: each known repository with its worktrees, listed by a
    /// lane worker (`git worktree list` blocks).
    pub fn list_repos(&self, cx: &Cx, to: ReplyKey) -> Vec<Effect> {
        vec![Effect::Job(Job::ListRepos {
            repos: self.known_repos(cx.cfg),
            to,
        })]
    }

    /// repos.add: the top folder of the worktree at `path` (read by a lane
    /// worker) becomes known to dispatch once the ledger has it.
    pub fn add_repo(&self, path: PathBuf, to: ReplyKey) -> Vec<Effect> {
        vec![Effect::Job(Job::Toplevel { path, to })]
    }

    /// Whether `repo` (canonical) is a repository the daemon knows.
    pub(super) fn knows(&self, cx: &Cx, repo: &Path) -> bool {
        self.known_repos(cx.cfg)
            .iter()
            .any(|r| r.canonicalize().unwrap_or_else(|_| r.clone()) == repo)
    }

    /// Checks what can be checked on the reactor (repository known, seats
    /// ready and of different families, isolation), then has a worker
    /// create the worktree and asks for the builder. The lane or the
    /// refusal, whose stable code the plugin host passes on as
    /// task-refused's reason, is answered to `to`.
    pub fn dispatch(&mut self, cx: &Cx, req: DispatchRequest, to: ReplyKey) -> Vec<Effect> {
        let mut fx = Vec::new();
        self.dispatch_in(cx, &mut fx, req, to);
        fx
    }

    pub(super) fn dispatch_in(&mut self, cx: &Cx, fx: &mut Fx, req: DispatchRequest, to: ReplyKey) {
        let repo = req.repo.canonicalize().unwrap_or_else(|_| req.repo.clone());
        if !self.knows(cx, &repo) {
            // A worktree of a known repository stands for its repository
            // (seed 000: "a repository or worktree the daemon already
            // lists"); a lane's own is known here, any other is asked of
            // git.
            let of_lane = self
                .map
                .values()
                .find(|l| {
                    l.worktree
                        .canonicalize()
                        .unwrap_or_else(|_| l.worktree.clone())
                        == repo
                })
                .map(|l| l.repo.canonicalize().unwrap_or_else(|_| l.repo.clone()));
            match of_lane {
                Some(main) if !self.knows(cx, &main) => {
                    fx.push(dispatch_answer(to, Err(unknown_repo(&repo))))
                }
                Some(main) => {
                    let mut req = req;
                    req.repo = main;
                    self.dispatch_in(cx, fx, req, to);
                }
                None => fx.push(Effect::Job(Job::RepositoryOf {
                    asked: repo,
                    req: Box::new(req),
                    to,
                })),
            }
            return;
        }
        match self.checked(cx, &req, repo) {
            Ok(dispatch) => {
                let id = crate::ids::prefixed_id("t-");
                let s = slug(&dispatch.task.name);
                let branch = format!("{}/{s}", cx.cfg.lanes.branch_prefix);
                let worktree = worktree_path(&cx.cfg.lanes, &dispatch.repo, &s);
                fx.push(Effect::Job(Job::MakeWorktree(Box::new(NewLane {
                    to,
                    id,
                    dispatch,
                    branch,
                    worktree,
                }))));
            }
            Err(e) => fx.push(dispatch_answer(to, Err(e))),
        }
    }

    /// The seats, their families, isolation and the name of a dispatch on
    /// the known repository `repo`.
    pub(super) fn checked(
        &self,
        cx: &Cx,
        req: &DispatchRequest,
        repo: PathBuf,
    ) -> Result<Dispatch, RpcError> {
        let seat = |h: &str| -> Result<SeatRef, RpcError> {
            match cx.seats.get(h) {
                None => Err(lane_err(Code::SeatNotFound, format!("no seat {h}"))),
                Some(s) if s.status != Some(Status::Ready) => Err(lane_err(
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
            return Err(lane_err(
                Code::SameFamily,
                format!(
                    "the verifier must be of another provider family than the builder ({})",
                    builder.family.name()
                ),
            ));
        }
        match &self.isolation {
            Some(Ok(_)) => {}
            _ if !cx.cfg.lanes.require_isolation => {}
            Some(Err(why)) => {
                return Err(lane_err(
                    Code::IsolationMissing,
                    format!("the acceptance command cannot run isolated here: {why}"),
                ));
            }
            None => {
                return Err(lane_err(
                    Code::IsolationMissing,
                    "isolation is still being probed; try again",
                ));
            }
        }
        let name = task_name(req);
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
    }

    /// The worktree of a dispatch is made: its builder is asked for.
    pub(super) fn create(&mut self, fx: &mut Fx, made: Made) {
        let l = &made.lane;
        let start = SessionStart {
            harness: l.dispatch.builder.harness.clone(),
            cwd: l.worktree.clone(),
            prompt: format!(
                "{}\n\nWork in this worktree on branch {}. When you are done the daemon runs `{}` and another agent reviews your change.",
                l.dispatch.task.task, l.branch, l.dispatch.task.acceptance_command
            ),
            name: l.dispatch.task.name.clone(),
        };
        fx.push(Effect::Spawn {
            start,
            then: Spawn::FirstBuilder(Box::new(made)),
        });
    }

    /// The builder of a dispatch started: the lane exists (lane.start,
    /// lane.stage building) and is answered; or it could not, and the
    /// worktree and branch made for it are removed.
    pub(super) fn created(
        &mut self,
        cx: &Cx,
        fx: &mut Fx,
        made: Made,
        r: Result<String, RpcError>,
    ) {
        let Made {
            lane:
                NewLane {
                    to,
                    id,
                    dispatch: p,
                    branch,
                    worktree,
                },
            base,
            base_commit,
        } = made;
        let sid = match r {
            Ok(sid) => sid,
            Err(e) => {
                fx.push(Effect::Job(Job::UndoWorktree {
                    repo: p.repo,
                    worktree,
                    branch,
                }));
                fx.push(dispatch_answer(to, Err(e)));
                return;
            }
        };
        let now = cx.now_ms;
        // The daemon made the branch at the base's commit just now.
        let head = Some(Some(base_commit.clone()));
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
            machine: Machine::new(cx.cfg.lanes.max_rounds, cx.cfg.lanes.require_merge_approval),
            created_ms: now,
            stage_since_ms: now,
            last_check: None,
            reason: None,
            checks: 0,
            archived: false,
            remove_worktree: false,
            checkout: None,
            builder_reopened: None,
            head,
        };
        let start = event(
            cx,
            "lane.start",
            json!({"lane": id, "session": sid, "builder": lane.builder.to_json(), "verifier": lane.verifier.to_json()}),
        );
        let stage = event(
            cx,
            "lane.stage",
            json!({"lane": id, "stage": "building", "since": crate::clock::format_ts(now)}),
        );
        self.by_session
            .insert(sid.clone(), (id.clone(), Role::Builder));
        self.map.insert(id.clone(), lane);
        crate::info!("lane {id}: dispatched on {branch} with session {sid}");
        let ack = Ack::Dispatched {
            to,
            dispatched: Dispatched {
                lane: id.clone(),
                session: sid,
                branch,
                worktree,
            },
        };
        self.persist_then(fx, &id, vec![start, stage], ack);
    }
}

/// A lane being dispatched: checked, its id, branch and worktree chosen.
#[derive(Debug, Clone, PartialEq)]
pub struct NewLane {
    pub to: ReplyKey,
    pub id: String,
    pub dispatch: Dispatch,
    pub branch: String,
    pub worktree: PathBuf,
}

/// A dispatched lane whose worktree is made at `base_commit` of `base`.
#[derive(Debug, Clone, PartialEq)]
pub struct Made {
    pub lane: NewLane,
    pub base: String,
    pub base_commit: String,
}

pub(super) fn dispatch_answer(to: ReplyKey, r: Result<Dispatched, RpcError>) -> Effect {
    Effect::Answer {
        to,
        answer: Answer::Dispatched(r),
    }
}

pub(super) fn unknown_repo(repo: &Path) -> RpcError {
    lane_err(
        Code::RepoUnknown,
        format!(
            "{} is not a repository the daemon knows, nor a worktree of one; add it with repos.add",
            repo.display()
        ),
    )
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

/// The name `task.dispatch` gives a task that names none.
fn task_name(req: &DispatchRequest) -> String {
    req.name.clone().unwrap_or_else(|| default_name(&req.task))
}

/// Where `task.dispatch` of `req` puts its worktree: plugin.remove lists
/// the worktrees its aborted dispatches left (seed 000, plugin.remove).
pub fn planned_worktree(cfg: &LanesSection, req: &DispatchRequest) -> PathBuf {
    let repo = req.repo.canonicalize().unwrap_or_else(|_| req.repo.clone());
    worktree_path(cfg, &repo, &slug(&task_name(req)))
}

/// Where a lane's worktree goes: `<repo>-wt/<name>` unless the config names a
/// root (then `<root>/<repo name>/<name>`).
pub fn worktree_path(cfg: &LanesSection, repo: &Path, slug: &str) -> PathBuf {
    let repo_name = repo
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "repo".into());
    if cfg.worktree_root.is_empty() {
        repo.with_file_name(format!("{repo_name}-wt")).join(slug)
    } else {
        PathBuf::from(&cfg.worktree_root).join(repo_name).join(slug)
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
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    pub repo: PathBuf,
    pub task: Task,
    pub builder: SeatRef,
    pub verifier: SeatRef,
    pub base: Option<String>,
}
