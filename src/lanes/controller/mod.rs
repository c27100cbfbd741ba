//! The lane controller: carries out what the stage machine decides, on the
//! reactor thread (issue 5). It owns every lane's record, asks the lane
//! workers for git and acceptance work, asks for builder and verifier
//! sessions, and learns what agents did from the committed `turn.end` and
//! `session.end` events of their sessions, exactly as any other reader of
//! the ledger would.
//!
//! Shape (DESIGN.md, "How subsystems talk"; issue 11): [`Lanes`] changes
//! only through its methods, which take `&mut self` and a read-only
//! [`Cx`] (the config, the time, the seat registry and a typed view of the
//! sessions) and return [`Effect`]s: ledger writes with a typed [`Ack`],
//! [`Job`]s for the lane workers and branch-head reads for the heads
//! thread (`lanes::work`), a [`Timer`] with a typed key, and what the
//! lanes ask of other subsystems: a session started ([`SessionStart`],
//! answered by [`Lanes::spawned`] under its [`Spawn`] key), a prompt
//! ([`Lanes::prompted`] under its [`Prompted`] key), a kill, a merge
//! approval in the inbox, and answers to whoever asked through an opaque
//! [`ReplyKey`] that the router maps. What the lanes hear comes back as
//! typed calls: worker reports ([`Lanes::on_report`]), commits
//! ([`Lanes::written`]), turn and session ends ([`Lanes::heard`]), the
//! merge answer, the seats probed, the sessions restored, the isolation
//! probe. The router in the daemon (daemon/router/lanes.rs) carries the
//! effects out; nothing here knows the daemon, the sessions module, the
//! approvals inbox or a surface, so the controller's glue is tested in
//! memory below.
//!
//! Files: this one holds the context, the lanes' state and the stage
//! loop (what each machine action and each report does); `effects` the
//! typed effects and keys; `record` the lane as stored; `dispatch` dispatch
//! and repositories; `restart` resuming after a restart; `heads` the
//! branch heads; `checkouts` the daemon-owned checkouts; `tests` the
//! controller driven in memory.
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
//! verify.list and lanes.get read the branches before they answer
//! ([`Lanes::fresh_heads`]). The plugin wire's lanes.list is answered at
//! once from what was read last, which is kept fresh: the branch is set
//! when the daemon commits on it, read again when a builder's turn or
//! session ends (an agent may commit), at start, and by the plugin host's
//! read of the list when the last read is older than `LANE_HEADS_FRESH_MS`
//! ([`Lanes::keep_heads_fresh`]; the host keeps its copy as long). A
//! branch or repository that is gone reads null, and a verdict then is
//! stale.
//!
//! Dispatch takes a [`DispatchRequest`], into which the plugin wire's
//! tasks.create and the socket's task.dispatch turn their params, and
//! answers a [`Dispatched`] lane or the refusal. It takes a repository the
//! daemon knows or a worktree of one (a lane's worktree, or any other git
//! reports as the repository's), and works on the repository. A dispatch
//! without a name is named after the first line of its task
//! (`default_name`). A dispatch refused because the lane workers are busy
//! or not running answers `unavailable`, as before the lane workers were
//! asked through effects; one whose worker pool died after it was queued
//! now answers that refusal too rather than never.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::{Family, FileConfig, LanesSection};
use crate::core::seats::{Seats, Status};
use crate::errors::{Code, RpcError};
use crate::isolation::Probe;
use crate::lanes::check::{Isolation, Outcome};
use crate::lanes::machine::{Action, Input, Machine, Stage};
use crate::lanes::pool::{Pool, Returned};
use crate::lanes::verdict;
use crate::lanes::work::{Heads, HeadsJob, Job, RepoListing, Report};
use crate::ledger::{Op, WriteError};
use crate::limits;
use rusqlite::types::Value as Sql;

/// Which side of a lane a session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Builder,
    Verifier,
}

/// A session as the lanes see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionView<'a> {
    /// The agent is gone.
    pub ended: bool,
    /// The agent is set up and takes input.
    pub ready: bool,
    /// The agent's own session id, once it gave one.
    pub agent_session_id: Option<&'a str>,
}

/// The sessions, read-only, as the lanes need them.
pub trait SessionsView {
    /// `sid` as it is now; None for a session the daemon does not know.
    fn session(&self, sid: &str) -> Option<SessionView<'_>>;
}

/// What a lane method reads besides the lanes: the config, the time, the
/// seat registry and the sessions.
pub struct Cx<'a> {
    pub cfg: &'a FileConfig,
    /// The daemon's state directory: checkouts go under `lanes/` there.
    pub state_dir: &'a Path,
    /// Now, in milliseconds since the epoch (records and events).
    pub now_ms: i64,
    /// Now, monotonic (how old the branch heads are).
    pub now: Instant,
    pub seats: &'a Seats,
    pub sessions: &'a dyn SessionsView,
}

impl Cx<'_> {
    fn alive(&self, sid: &str) -> bool {
        self.sessions.session(sid).is_some_and(|s| !s.ended)
    }

    /// Whether a seat can take work now.
    fn seat_ready(&self, harness: &str) -> bool {
        self.seats
            .get(harness)
            .is_some_and(|s| s.status == Some(Status::Ready))
    }

    /// The first ready seat, in registry order, of none of the families
    /// `not` (nor `auto`), other than `skip`: failover and second
    /// opinions.
    fn other_ready_seat(&self, skip: Option<&str>, not: &[Family]) -> Option<SeatRef> {
        self.seats
            .list
            .iter()
            .find(|s| {
                Some(s.cfg.harness.as_str()) != skip
                    && s.status == Some(Status::Ready)
                    && !not.contains(&s.cfg.family())
                    && s.cfg.family() != Family::Auto
            })
            .map(|s| seat_ref(&s.cfg))
    }

    fn ts(&self) -> String {
        crate::clock::format_ts(self.now_ms)
    }
}

type Fx = Vec<Effect>;

/// Every lane the daemon knows. Only `map` is open, for the surfaces'
/// views to read; everything else changes through the methods.
#[derive(Default)]
pub struct Lanes {
    pub map: HashMap<String, Lane>,
    by_session: HashMap<String, (String, Role)>,
    /// Repositories added with repos.add (the config's are read live).
    added_repos: Vec<PathBuf>,
    /// The daemon-owned checkouts: spares per repository, and which are in
    /// use by a job or a verifier session.
    pool: Pool,
    /// Verifier sessions running in a checkout: the checkout is in use
    /// until the session ends.
    checkout_sessions: HashMap<String, PathBuf>,
    /// When the branch heads were last read, and whether a read runs.
    heads_read: Option<Instant>,
    heads_reading: bool,
    /// A read was asked for while one ran (a branch may have moved after
    /// that one began): read again once it is in.
    heads_again: bool,
    /// Whether acceptance commands can run isolated here; the daemon's
    /// isolation probe answers once after start.
    isolation: Option<Probe>,
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
    to_resume: HashSet<String>,
    resumed: bool,
}

fn lane_err(code: Code, msg: impl Into<String>) -> RpcError {
    RpcError::new(code, msg)
}

pub fn not_found(id: &str) -> RpcError {
    lane_err(Code::LaneNotFound, format!("no lane {id}"))
}

impl Lanes {
    /// The lane a session builds or verifies.
    pub fn lane_of_session(&self, sid: &str) -> Option<&str> {
        self.by_session.get(sid).map(|(l, _)| l.as_str())
    }

    /// The lanes lanes.list and verify.list show: not archived, newest
    /// first.
    pub fn listed(&self) -> Vec<&Lane> {
        let mut v: Vec<&Lane> = self.map.values().filter(|l| !l.archived).collect();
        v.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(b.id.cmp(&a.id)));
        v
    }

    /// The repositories lanes may work on: the config's and those added.
    pub fn known_repos(&self, cfg: &FileConfig) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = cfg.repo.iter().map(|r| PathBuf::from(&r.path)).collect();
        v.extend(self.added_repos.iter().cloned());
        v.sort();
        v.dedup();
        v
    }

    /// The ledger's lanes and repositories are here (the workers run):
    /// once isolation, the sessions and the seats are known too, every
    /// lane resumes.
    pub fn loaded(&mut self, cx: &Cx, rows: Vec<String>, repos: Vec<String>) -> Vec<Effect> {
        let mut fx = Vec::new();
        self.added_repos = repos.into_iter().map(PathBuf::from).collect();
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
                            self.by_session.insert(s.clone(), (l.id.clone(), role));
                        }
                    }
                    self.to_resume.insert(l.id.clone());
                    self.map.insert(l.id.clone(), l);
                }
                Err(e) => crate::error!(
                    "a lane record in the ledger cannot be read ({e}); it is left as it is"
                ),
            }
        }
        self.loaded = true;
        self.refresh_heads(&mut fx);
        // Checkouts under state/lanes/ that no live lane holds, left by the
        // last run, are put back in their repository's pool: see
        // `reclaimed`.
        fx.push(Effect::Job(Job::Reclaim {
            dir: cx.state_dir.join("lanes"),
        }));
        self.resume_all(cx, &mut fx);
        fx
    }

    /// Feeds one input to a lane's machine and carries out what it says.
    pub fn step(&mut self, cx: &Cx, id: &str, input: Input) -> Result<Vec<Effect>, RpcError> {
        let mut fx = Vec::new();
        self.step_in(cx, &mut fx, id, input)?;
        Ok(fx)
    }

    /// lanes.close: the lane is closed, its worktree removed when
    /// `remove_worktree`; a lane that cannot be closed now keeps its
    /// earlier choice.
    pub fn close(
        &mut self,
        cx: &Cx,
        id: &str,
        remove_worktree: bool,
    ) -> Result<Vec<Effect>, RpcError> {
        let l = self.map.get_mut(id).ok_or_else(|| not_found(id))?;
        // The archive step reads the choice, so it is set first and taken
        // back when the lane cannot be closed now.
        let before = std::mem::replace(&mut l.remove_worktree, remove_worktree);
        let r = self.step(cx, id, Input::OperatorClose);
        if r.is_err() {
            if let Some(l) = self.map.get_mut(id) {
                l.remove_worktree = before;
            }
        }
        r
    }

    fn step_in(&mut self, cx: &Cx, fx: &mut Fx, id: &str, input: Input) -> Result<(), RpcError> {
        let Some(l) = self.map.get_mut(id) else {
            return Err(not_found(id));
        };
        match l.machine.step(input) {
            Ok(actions) => {
                self.run_actions(cx, fx, id, actions);
                Ok(())
            }
            Err(nn) => Err(lane_err(
                Code::LaneNotWaiting,
                format!("lane {id} is at {}", nn.stage.name()),
            )),
        }
    }

    fn run_actions(&mut self, cx: &Cx, fx: &mut Fx, id: &str, actions: Vec<Action>) {
        let mut ops = Vec::new();
        let mut after: Vec<Action> = Vec::new();
        for a in actions {
            match a {
                Action::Stage(stage) => {
                    if let Some(l) = self.map.get_mut(id) {
                        l.machine.stage = stage;
                        l.stage_since_ms = cx.now_ms;
                        // A reason says why the lane waits for the operator;
                        // it is stale once the lane moves on.
                        if !stage.waits_for_operator() {
                            l.reason = None;
                        }
                        let since = crate::clock::format_ts(l.stage_since_ms);
                        ops.push(event(
                            cx,
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
                    ops.push(event(cx, "lane.verdict", json!({"lane": id, "commit": commit, "verdict": verdict, "round": round, "defects": defects})));
                }
                other => after.push(other),
            }
        }
        // The checkout is taken before the record is written, so that the
        // record names every checkout a lane holds; it is given back once
        // the lane's verdict is in or it left the loop.
        if after
            .iter()
            .any(|a| matches!(a, Action::RunCheck { .. } | Action::Verify { .. }))
        {
            self.lane_checkout(cx, id);
        } else if self
            .map
            .get(id)
            .is_some_and(|l| l.checkout.is_some() && !holds_checkout(l.machine.stage))
        {
            self.release_checkout(fx, id);
        }
        self.persist(fx, id, ops);
        for a in after {
            self.act(cx, fx, id, a);
        }
        self.try_verifier(cx, fx, id);
    }

    /// A lane waiting for its verifier asks for it when the seat is ready
    /// and not verifying another lane ("waiting-verifier while the verifier
    /// seat is busy or not ready", issue 5); otherwise it looks again later.
    fn try_verifier(&mut self, cx: &Cx, fx: &mut Fx, id: &str) {
        let Some(l) = self.map.get(id) else { return };
        if !matches!(
            l.machine.stage,
            Stage::WaitingVerifier | Stage::SecondOpinion
        ) || l.archived
        {
            return;
        }
        let second = l.machine.stage == Stage::SecondOpinion;
        let seat = pick_verifier(cx, l, second);
        let busy = self.map.values().any(|o| {
            o.id != id
                && o.machine.stage == Stage::Verifying
                && o.verifier.harness == seat.harness
                && o.verifier_session.as_deref().is_some_and(|s| cx.alive(s))
        });
        if cx.seat_ready(&seat.harness) && !busy {
            let _ = self.step_in(cx, fx, id, Input::VerifierReady);
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
            fx.push(Effect::Timer {
                after: Duration::from_secs(limits::LANE_VERIFIER_RETRY_SECS),
                timer: Timer::TryVerifier { lane: id.into() },
            });
        }
    }

    /// A lane's timer is due.
    pub fn timer(&mut self, cx: &Cx, timer: Timer) -> Vec<Effect> {
        let mut fx = Vec::new();
        match timer {
            Timer::TryVerifier { lane } => self.try_verifier(cx, &mut fx, &lane),
        }
        fx
    }

    /// Writes the lane's row, with `ops` in the same batch.
    fn persist(&self, fx: &mut Fx, id: &str, ops: Vec<Op>) {
        self.persist_then(fx, id, ops, Ack::Record { lane: id.into() });
    }

    /// [`Self::persist`], with `ack` waiting for the commit.
    fn persist_then(&self, fx: &mut Fx, id: &str, mut ops: Vec<Op>, ack: Ack) {
        let Some(l) = self.map.get(id) else { return };
        let text = serde_json::to_string(l).unwrap_or_default();
        ops.push(Op::Exec {
            sql: "INSERT INTO lanes (id, archived, record) VALUES (?1, ?2, ?3)
              ON CONFLICT (id) DO UPDATE SET archived = excluded.archived, record = excluded.record",
            params: vec![Sql::Text(id.into()), Sql::Integer(i64::from(l.archived)), Sql::Text(text)],
        });
        fx.push(Effect::Write { ops, ack });
    }

    fn broken(&mut self, cx: &Cx, fx: &mut Fx, id: &str, why: String) {
        crate::warn!("lane {id}: {why}; sent back to the operator");
        if let Some(l) = self.map.get_mut(id) {
            l.reason = Some(why);
        }
        let _ = self.step_in(cx, fx, id, Input::Broken);
    }

    fn act(&mut self, cx: &Cx, fx: &mut Fx, id: &str, a: Action) {
        let Some(l) = self.map.get(id).cloned() else {
            return;
        };
        let lane = id.to_string();
        let done = match a {
            Action::CommitWork => {
                fx.push(Effect::Job(Job::CommitWork {
                    lane,
                    worktree: l.worktree,
                }));
                Ok(())
            }
            Action::RunCheck { commit } => self.run_check(cx, fx, &l, commit),
            Action::Verify {
                commit,
                second_opinion,
            } => {
                self.start_verifier(cx, fx, &l, commit, second_opinion);
                Ok(())
            }
            Action::PromptBuilder { text } => {
                self.prompt_builder(cx, fx, id, text);
                Ok(())
            }
            Action::RequestMergeApproval { commit } => {
                self.request_merge_approval(fx, id, &commit);
                Ok(())
            }
            Action::Merge { commit } => {
                let message = format!(
                    "Merge lane {}: {}\n\nVerified by {} on {commit}.",
                    l.id, l.task.name, l.verifier.harness
                );
                fx.push(Effect::Job(Job::Merge {
                    lane,
                    repo: l.repo,
                    base: l.base,
                    commit,
                    mode: cx.cfg.lanes.merge(),
                    message,
                }));
                Ok(())
            }
            Action::Archive => {
                self.archive(cx, fx, id);
                Ok(())
            }
            Action::Stage(_) | Action::RecordVerdict { .. } => Ok(()),
        };
        if let Err(e) = done {
            self.broken(cx, fx, id, e.message);
        }
    }

    fn run_check(
        &mut self,
        cx: &Cx,
        fx: &mut Fx,
        l: &Lane,
        commit: String,
    ) -> Result<(), RpcError> {
        let isolation = match &self.isolation {
            Some(Ok(bwrap)) => Isolation::Bwrap(bwrap.clone()),
            _ if !cx.cfg.lanes.require_isolation => Isolation::Unisolated,
            _ => {
                return Err(lane_err(
                    Code::IsolationMissing,
                    "the acceptance command cannot run isolated here",
                ));
            }
        };
        let Some(checkout) = self.lane_checkout(cx, &l.id) else {
            return Ok(());
        };
        self.pool.use_start(&checkout);
        fx.push(Effect::Job(Job::Check {
            lane: l.id.clone(),
            repo: l.repo.clone(),
            checkout,
            commit,
            command: l.task.acceptance_command.clone(),
            timeout: Duration::from_secs(cx.cfg.lanes.check_timeout_secs),
            isolation,
        }));
        Ok(())
    }

    /// Puts the lane's checkout at the commit to judge and reads the diff;
    /// the verifier is asked for once both are done (`spawn_verifier`).
    fn start_verifier(&mut self, cx: &Cx, fx: &mut Fx, l: &Lane, commit: String, second: bool) {
        let Some(checkout) = self.lane_checkout(cx, &l.id) else {
            return;
        };
        self.pool.use_start(&checkout);
        fx.push(Effect::Job(Job::Diff {
            lane: l.id.clone(),
            repo: l.repo.clone(),
            checkout,
            base_commit: l.base_commit.clone(),
            commit,
            second,
        }));
    }

    fn spawn_verifier(
        &mut self,
        cx: &Cx,
        fx: &mut Fx,
        id: &str,
        commit: &str,
        diff: &str,
        second: bool,
    ) {
        let Some(l) = self.map.get(id) else {
            return;
        };
        // The lane may have left verifying while its checkout was moved
        // (the operator closed it): then the checkout is no longer its to
        // show.
        let Some(cwd) = l
            .checkout
            .clone()
            .filter(|_| l.machine.stage == Stage::Verifying && !l.archived)
        else {
            return;
        };
        let seat = pick_verifier(cx, l, second);
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
        let start = SessionStart {
            harness: seat.harness,
            cwd: cwd.clone(),
            prompt,
            name: format!("verify {}", l.task.name),
        };
        // The verifier reads the checkout until its session ends, even past
        // the lane's verdict: the checkout goes back to the pool only then.
        self.pool.use_start(&cwd);
        fx.push(Effect::Spawn {
            start,
            then: Spawn::Verifier {
                lane: id.into(),
                checkout: cwd,
            },
        });
    }

    /// Sends the builder its next turn: into its live session when it has
    /// one, else into a new session of a ready seat in the same worktree.
    fn prompt_builder(&mut self, cx: &Cx, fx: &mut Fx, id: &str, text: String) {
        let Some(l) = self.map.get_mut(id) else {
            return;
        };
        l.checks += 1;
        let check_id = format!("check-{}", l.checks);
        let sid = l.builder_session.clone();
        let reopened = l.builder_reopened.clone();
        let task = l.task.task.clone();
        self.persist(fx, id, Vec::new());
        if let Some(sid) = sid.filter(|s| cx.alive(s)) {
            // A session the restart reopened without its agent's history
            // has never seen the task: it gets it as a new builder session
            // would.
            let sent = if reopened.is_some_and(|asid| !kept_history(cx, &sid, &asid)) {
                format!("{text}\n\nThe task:\n{task}")
            } else {
                text.clone()
            };
            fx.push(Effect::Prompt {
                session: sid.clone(),
                text: sent.clone(),
                then: Prompted::Rework {
                    lane: id.into(),
                    session: sid,
                    rework: Rework {
                        id: check_id,
                        lane: id.into(),
                        text: sent,
                    },
                    original: text,
                },
            });
            return;
        }
        let rework = Rework {
            id: check_id,
            lane: id.into(),
            text: text.clone(),
        };
        self.restart_builder(cx, fx, id, text, Some(rework));
    }

    /// A session took a prompt of the lanes, or refused it.
    pub fn prompted(&mut self, cx: &Cx, then: Prompted, taken: bool) -> Vec<Effect> {
        let mut fx = Vec::new();
        match then {
            Prompted::Resume { lane } if taken => {
                if let Some(l) = self.map.get_mut(&lane) {
                    l.builder_reopened = None;
                }
            }
            Prompted::Resume { lane } => {
                self.restart_builder(cx, &mut fx, &lane, RESUMED.into(), None)
            }
            Prompted::Rework {
                lane,
                session,
                rework,
                ..
            } if taken => {
                if let Some(l) = self.map.get_mut(&lane) {
                    l.builder_reopened = None;
                }
                fx.push(record_check(cx, &session, &rework));
            }
            Prompted::Rework {
                lane,
                rework,
                original,
                ..
            } => {
                let rework = Rework {
                    text: original.clone(),
                    ..rework
                };
                self.restart_builder(cx, &mut fx, &lane, original, Some(rework));
            }
        }
        fx
    }

    /// Starts a builder session in the lane's worktree: the lane's seat when
    /// it is ready, otherwise another ready seat of a family other than the
    /// verifier's (failover). With none, the lane goes to the operator.
    /// `rework` is recorded on the new session's stream once it exists.
    fn restart_builder(
        &mut self,
        cx: &Cx,
        fx: &mut Fx,
        id: &str,
        text: String,
        rework: Option<Rework>,
    ) {
        let Some(l) = self.map.get(id) else {
            return;
        };
        let seat = if cx.seat_ready(&l.builder.harness) {
            Some(l.builder.clone())
        } else {
            cx.other_ready_seat(None, &[l.verifier.family])
        };
        let Some(seat) = seat else {
            self.broken(cx, fx, id, "no ready seat can continue building".into());
            return;
        };
        let start = SessionStart {
            harness: seat.harness.clone(),
            cwd: l.worktree.clone(),
            prompt: format!("{}\n\nThe task:\n{}", text, l.task.task),
            name: l.task.name.clone(),
        };
        fx.push(Effect::Spawn {
            start,
            then: Spawn::Builder {
                lane: id.into(),
                seat,
                rework,
            },
        });
    }

    /// A session the lanes asked for started (its id), or could not.
    pub fn spawned(&mut self, cx: &Cx, then: Spawn, r: Result<String, RpcError>) -> Vec<Effect> {
        let mut fx = Vec::new();
        match (then, r) {
            (Spawn::FirstBuilder(made), r) => self.created(cx, &mut fx, *made, r),
            (Spawn::Builder { lane, seat, rework }, Ok(sid)) => {
                self.by_session
                    .insert(sid.clone(), (lane.clone(), Role::Builder));
                if let Some(c) = &rework {
                    fx.push(record_check(cx, &sid, c));
                }
                if let Some(l) = self.map.get_mut(&lane) {
                    l.builder_session = Some(sid);
                    l.builder = seat;
                    // A new session is told the task in its first prompt.
                    l.builder_reopened = None;
                }
                self.persist(&mut fx, &lane, Vec::new());
            }
            (Spawn::Builder { lane, .. }, Err(e)) => self.broken(
                cx,
                &mut fx,
                &lane,
                format!("the builder could not start: {}", e.message),
            ),
            (Spawn::Verifier { lane, checkout }, Ok(sid)) => {
                if cx.alive(&sid) {
                    self.checkout_sessions.insert(sid.clone(), checkout);
                } else {
                    self.checkout_used(&mut fx, &checkout);
                }
                self.by_session
                    .insert(sid.clone(), (lane.clone(), Role::Verifier));
                if let Some(l) = self.map.get_mut(&lane) {
                    l.verifier_session = Some(sid);
                }
                self.persist(&mut fx, &lane, Vec::new());
            }
            (Spawn::Verifier { lane, checkout }, Err(e)) => {
                self.checkout_used(&mut fx, &checkout);
                crate::warn!("lane {lane}: the verifier could not start: {}", e.message);
                let _ = self.step_in(cx, &mut fx, &lane, Input::VerifierFailed);
            }
        }
        fx
    }

    fn archive(&mut self, cx: &Cx, fx: &mut Fx, id: &str) {
        let Some(l) = self.map.get_mut(id) else {
            return;
        };
        l.archived = true;
        let sessions: Vec<String> = [l.builder_session.clone(), l.verifier_session.clone()]
            .into_iter()
            .flatten()
            .collect();
        let merged = l.machine.stage == Stage::Merged;
        let (repo, worktree, remove) = (
            l.repo.clone(),
            l.worktree.clone(),
            merged || l.remove_worktree,
        );
        for s in sessions {
            self.by_session.remove(&s);
            if cx.alive(&s) {
                fx.push(Effect::Kill { session: s });
            }
        }
        self.release_checkout(fx, id);
        self.persist(fx, id, Vec::new());
        if remove {
            fx.push(Effect::Job(Job::RemoveWorktree {
                lane: id.into(),
                repo,
                worktree,
            }));
        }
    }

    /// Puts the lane's pass in the approvals inbox; the operator's allow
    /// merges exactly `commit`, a deny (or the timeout's fallback) sends
    /// the lane back. `lanes.merge` stays the operator's direct way.
    fn request_merge_approval(&mut self, fx: &mut Fx, id: &str, commit: &str) {
        let Some(l) = self.map.get_mut(id) else {
            return;
        };
        l.reason = Some(format!(
            "a pass on {commit} waits for the operator's approval in the inbox"
        ));
        let ask = MergeAsk {
            approval: format!("{id}-merge-{}", l.machine.verdicts),
            lane: id.to_string(),
            summary: format!(
                "merge lane {id} ({}) from {} into {}",
                l.task.name, l.branch, l.base
            ),
            commit: commit.to_string(),
        };
        self.persist(fx, id, Vec::new());
        fx.push(Effect::AskMerge(ask));
    }

    /// The operator answered a lane's merge approval. Says whether the
    /// lane took it (it still waits at its pass on that commit).
    pub fn merge_answered(
        &mut self,
        cx: &Cx,
        id: &str,
        commit: &str,
        answer: MergeAnswer,
    ) -> (bool, Vec<Effect>) {
        let waiting = self.map.get(id).is_some_and(|l| {
            l.machine.stage == Stage::Pass && l.machine.commit.as_deref() == Some(commit)
        });
        if !waiting {
            return (false, Vec::new());
        }
        let mut fx = Vec::new();
        let taken = match answer {
            MergeAnswer::Allow => self.step_in(cx, &mut fx, id, Input::OperatorMerge),
            MergeAnswer::Refuse => {
                if let Some(l) = self.map.get_mut(id) {
                    l.reason = Some("the operator did not allow the merge".into());
                }
                self.step_in(cx, &mut fx, id, Input::MergeDenied)
            }
        };
        (taken.is_ok(), fx)
    }

    /// Closes a lane whose plugin is removed with stopTasks; says how many
    /// of its sessions were still running and are now stopped.
    pub fn stop_for_removal(&mut self, cx: &Cx, id: &str) -> (usize, Vec<Effect>) {
        let Some(l) = self.map.get(id) else {
            return (0, Vec::new());
        };
        if l.archived {
            return (0, Vec::new());
        }
        let live = [&l.builder_session, &l.verifier_session]
            .into_iter()
            .flatten()
            .filter(|s| cx.alive(s))
            .count();
        crate::info!("lane {id}: closed because the plugin that asked for it is removed");
        let mut fx = Vec::new();
        let _ = self.step_in(cx, &mut fx, id, Input::OperatorClose);
        (live, fx)
    }

    /// Committed turn and session ends, in commit order: the lane learns of
    /// its builder's and verifier's turns and exits.
    pub fn heard(&mut self, cx: &Cx, events: &[Heard]) -> Vec<Effect> {
        let mut fx = Vec::new();
        for ev in events {
            if let Heard::SessionEnded { session } = ev {
                if let Some(co) = self.checkout_sessions.remove(session) {
                    self.checkout_used(&mut fx, &co);
                }
            }
        }
        for ev in events {
            let sid = ev.session();
            let Some((lid, role)) = self.by_session.get(sid).cloned() else {
                continue;
            };
            if self.to_resume.contains(&lid) {
                continue;
            }
            // A builder's turn may have committed or moved its branch.
            if role == Role::Builder {
                self.refresh_heads(&mut fx);
            }
            let at = |s: Stage| self.map.get(&lid).is_some_and(|l| l.machine.stage == s);
            match (role, ev) {
                (
                    Role::Builder,
                    Heard::TurnEnded {
                        reason: TurnEnd::Completed,
                        ..
                    },
                ) if at(Stage::Building) => {
                    let _ = self.step_in(cx, &mut fx, &lid, Input::BuilderIdle);
                }
                (
                    Role::Builder,
                    Heard::TurnEnded {
                        reason: TurnEnd::Failed | TurnEnd::UsageLimited,
                        ..
                    }
                    | Heard::SessionEnded { .. },
                ) if at(Stage::Building) => {
                    self.by_session.remove(sid);
                    if cx.alive(sid) {
                        fx.push(Effect::Kill {
                            session: sid.into(),
                        });
                    }
                    // The failed seat is skipped: its family stays allowed.
                    if let Some(l) = self.map.get_mut(&lid) {
                        l.builder_session = None;
                    }
                    crate::warn!("lane {lid}: the builder's session {sid} failed; failing over");
                    self.failover(cx, &mut fx, &lid);
                }
                (
                    Role::Verifier,
                    Heard::TurnEnded {
                        reason: TurnEnd::Completed,
                        ..
                    },
                ) => fx.push(Effect::ReadAnswer {
                    lane: lid,
                    session: sid.into(),
                }),
                (Role::Verifier, _) if at(Stage::Verifying) => {
                    self.finish_verifier(cx, &mut fx, sid);
                    let _ = self.step_in(cx, &mut fx, &lid, Input::VerifierFailed);
                }
                _ => {}
            }
        }
        fx
    }

    fn failover(&mut self, cx: &Cx, fx: &mut Fx, id: &str) {
        let Some(l) = self.map.get(id) else {
            return;
        };
        let failed = l.builder.harness.clone();
        match cx.other_ready_seat(Some(&failed), &[l.verifier.family]) {
            Some(seat) => {
                if let Some(l) = self.map.get_mut(id) {
                    l.builder = seat;
                }
                self.restart_builder(cx, fx, id, "The agent that worked on this task before you stopped. Continue the task in this worktree; its work so far is here.".into(), None);
            }
            None => self.broken(
                cx,
                fx,
                id,
                format!(
                    "the builder {failed} failed and no other ready seat of an allowed family can take over"
                ),
            ),
        }
    }

    fn finish_verifier(&mut self, cx: &Cx, fx: &mut Fx, sid: &str) {
        if let Some((lid, _)) = self.by_session.remove(sid) {
            if let Some(l) = self.map.get_mut(&lid) {
                if l.verifier_session.as_deref() == Some(sid) {
                    l.verifier_session = None;
                }
            }
        }
        if cx.alive(sid) {
            fx.push(Effect::Kill {
                session: sid.into(),
            });
        }
    }

    /// The verifier's last turn, as the router read it from the ledger.
    fn answer_read(&mut self, cx: &Cx, fx: &mut Fx, lane: &str, session: &str, text: String) {
        self.finish_verifier(cx, fx, session);
        if self
            .map
            .get(lane)
            .is_some_and(|l| l.machine.stage == Stage::Verifying)
        {
            let _ = self.step_in(cx, fx, lane, Input::VerifierAnswered(text));
        }
    }

    /// The ledger reader could not take the read of a verifier's answer.
    pub fn answer_unread(&mut self, cx: &Cx, lane: &str) -> Vec<Effect> {
        let mut fx = Vec::new();
        self.broken(
            cx,
            &mut fx,
            lane,
            "the ledger reader is busy; the verifier's answer could not be read".into(),
        );
        fx
    }

    /// A lane write committed, or the ledger refused it.
    pub fn written(&mut self, ack: Ack, r: Result<(), WriteError>) -> Vec<Effect> {
        match (ack, r) {
            (Ack::Record { .. } | Ack::Rework, Ok(())) => Vec::new(),
            (Ack::Record { lane }, Err(e)) => {
                record_refused(&lane, &e);
                Vec::new()
            }
            (Ack::Rework, Err(e)) => {
                crate::error!("a check.rework record was not stored: {e:?}");
                Vec::new()
            }
            (Ack::Dispatched { to, dispatched }, r) => {
                if let Err(e) = &r {
                    record_refused(&dispatched.lane, e);
                }
                vec![dispatch_answer(
                    to,
                    r.map(|()| dispatched).map_err(RpcError::from),
                )]
            }
            (Ack::RepoAdded { repo, to }, r) => {
                let r = r.map(|()| {
                    if !self.added_repos.contains(&repo) {
                        self.added_repos.push(repo.clone());
                    }
                    repo
                });
                vec![Effect::Answer {
                    to,
                    answer: Answer::RepoAdded(r.map_err(RpcError::from)),
                }]
            }
        }
    }

    /// A job's report from a lane worker or the heads thread.
    pub fn on_report(&mut self, cx: &Cx, report: Report) -> Vec<Effect> {
        let mut fx = Vec::new();
        match report {
            Report::RepositoryOf {
                asked,
                main,
                req,
                to,
            } => match main.map(|m| m.canonicalize().unwrap_or(m)) {
                Some(main) if main != asked && self.knows(cx, &main) => {
                    let mut req = *req;
                    req.repo = main;
                    self.dispatch_in(cx, &mut fx, req, to);
                }
                _ => fx.push(dispatch_answer(to, Err(unknown_repo(&asked)))),
            },
            Report::WorktreeMade { lane, made } => match made {
                Ok((base, base_commit)) => self.create(
                    &mut fx,
                    Made {
                        lane: *lane,
                        base,
                        base_commit,
                    },
                ),
                Err(e) => fx.push(dispatch_answer(lane.to, Err(e))),
            },
            Report::Found(found) => self.reclaimed(cx, &mut fx, found),
            Report::CheckoutRemoved { checkout, result } => match result {
                Ok(()) => crate::info!("checkout {}: removed", checkout.display()),
                Err(e) => crate::warn!("checkout {}: {e}", checkout.display()),
            },
            Report::Committed { lane, result } => match result {
                Ok(head) => {
                    // The daemon moved the branch itself: its head is known.
                    if let Some(l) = self.map.get_mut(&lane) {
                        l.head = Some(Some(head.clone()));
                    }
                    let _ = self.step_in(cx, &mut fx, &lane, Input::Committed { head });
                }
                Err(e) => self.broken(cx, &mut fx, &lane, e),
            },
            Report::Checked {
                lane,
                checkout,
                result,
            } => {
                self.checkout_used(&mut fx, &checkout);
                match result {
                    Ok(outcome) => {
                        if let Some(l) = self.map.get_mut(&lane) {
                            l.last_check = Some(outcome.clone());
                        }
                        let _ = self.step_in(cx, &mut fx, &lane, Input::Checked(outcome));
                    }
                    Err(e) => self.broken(cx, &mut fx, &lane, e),
                }
            }
            Report::Diffed {
                lane,
                checkout,
                commit,
                second,
                result,
            } => {
                self.checkout_used(&mut fx, &checkout);
                match result {
                    Ok(diff) => self.spawn_verifier(cx, &mut fx, &lane, &commit, &diff, second),
                    Err(e) => self.broken(cx, &mut fx, &lane, e),
                }
            }
            Report::Merged { lane, result } => {
                let input = match result {
                    Ok(base_head) => Input::Merged { base_head },
                    Err(e) => {
                        if let Some(l) = self.map.get_mut(&lane) {
                            l.reason = Some(e.clone());
                        }
                        crate::warn!("lane {lane}: merge failed: {e}");
                        Input::MergeFailed(e)
                    }
                };
                let _ = self.step_in(cx, &mut fx, &lane, input);
            }
            Report::WorktreeRemoved {
                lane,
                worktree,
                result,
            } => match result {
                Ok(()) => crate::info!("lane {lane}: worktree {} removed", worktree.display()),
                Err(e) => crate::warn!("lane {lane}: {e}"),
            },
            Report::ReposListed { repos, to } => fx.push(Effect::Answer {
                to,
                answer: Answer::Repos(Ok(repos)),
            }),
            Report::Toplevel { result, to } => match result {
                Ok(top) => {
                    if !self.added_repos.contains(&top)
                        && self.added_repos.len() >= limits::LANE_MAX_REPOS
                    {
                        fx.push(Effect::Answer {
                            to,
                            answer: Answer::RepoAdded(Err(lane_err(
                                Code::Unavailable,
                                format!(
                                    "the daemon knows {} repositories already",
                                    limits::LANE_MAX_REPOS
                                ),
                            ))),
                        });
                    } else {
                        let op = Op::Exec {
                            sql: "INSERT INTO repos (path, added_at) VALUES (?1, ?2) ON CONFLICT (path) DO NOTHING",
                            params: vec![Sql::Text(top.display().to_string()), Sql::Text(cx.ts())],
                        };
                        // Known to dispatch only once the ledger has it.
                        fx.push(Effect::Write {
                            ops: vec![op],
                            ack: Ack::RepoAdded { repo: top, to },
                        });
                    }
                }
                Err(e) => fx.push(Effect::Answer {
                    to,
                    answer: Answer::RepoAdded(Err(lane_err(Code::RepoUnknown, e))),
                }),
            },
            Report::Heads { heads, to: None } => {
                self.heads_reading = false;
                self.store_heads(cx, heads);
                if std::mem::take(&mut self.heads_again) {
                    self.refresh_heads(&mut fx);
                }
            }
            Report::Answer {
                lane,
                session,
                text,
            } => self.answer_read(cx, &mut fx, &lane, &session, text),
            Report::Heads {
                heads,
                to: Some(to),
            } => {
                self.store_heads(cx, heads);
                fx.push(Effect::Answer {
                    to,
                    answer: Answer::HeadsFresh,
                });
            }
        }
        fx
    }

    /// A job could not be queued (`e`: the workers are busy, stopped or
    /// not running): the lane it was for goes to the operator, a dispatch
    /// or a repository request is refused with `e`.
    pub fn job_refused(&mut self, cx: &Cx, job: Job, e: RpcError) -> Vec<Effect> {
        let mut fx = Vec::new();
        match job {
            Job::RepositoryOf { to, .. } => fx.push(dispatch_answer(to, Err(e))),
            Job::MakeWorktree(lane) => fx.push(dispatch_answer(lane.to, Err(e))),
            Job::UndoWorktree { worktree, .. } => crate::warn!(
                "worktree {}: left in place: {}",
                worktree.display(),
                e.message
            ),
            Job::Reclaim { .. } => crate::warn!(
                "the checkouts of the last run are left as they are: {}",
                e.message
            ),
            Job::RemoveCheckout { checkout, .. } => crate::warn!(
                "checkout {}: left in place: {}",
                checkout.display(),
                e.message
            ),
            Job::CommitWork { lane, .. } | Job::Merge { lane, .. } => {
                self.broken(cx, &mut fx, &lane, e.message)
            }
            Job::Check { lane, checkout, .. } | Job::Diff { lane, checkout, .. } => {
                self.checkout_used(&mut fx, &checkout);
                self.broken(cx, &mut fx, &lane, e.message);
            }
            Job::RemoveWorktree { lane, worktree, .. } => crate::warn!(
                "lane {lane}: worktree {} left in place: {}",
                worktree.display(),
                e.message
            ),
            Job::ListRepos { to, .. } => fx.push(Effect::Answer {
                to,
                answer: Answer::Repos(Err(e)),
            }),
            Job::Toplevel { to, .. } => fx.push(Effect::Answer {
                to,
                answer: Answer::RepoAdded(Err(e)),
            }),
        }
        fx
    }
}

/// A lane's record the ledger refused: the daemon says so and goes on with
/// the lane in memory.
fn record_refused(lane: &str, e: &WriteError) {
    crate::error!("lane {lane}: the ledger refused its record: {e:?}");
}

/// The seat that judges: the lane's verifier, except that a second opinion
/// goes to a ready seat of a third family when there is one (issue 5).
fn pick_verifier(cx: &Cx, l: &Lane, second: bool) -> SeatRef {
    if second {
        if let Some(s) = cx.other_ready_seat(None, &[l.builder.family, l.verifier.family]) {
            return s;
        }
    }
    l.verifier.clone()
}

/// Whether a session the restart reopened with agent session `asid` came
/// back in that session, with its history: its agent is set up and kept
/// that id (a new agent session, after an agent that cannot load or that
/// refused to, has another one). Not set up yet counts as not kept.
fn kept_history(cx: &Cx, sid: &str, asid: &str) -> bool {
    cx.sessions
        .session(sid)
        .is_some_and(|s| s.ready && s.agent_session_id == Some(asid))
}

fn event(cx: &Cx, kind: &str, data: Value) -> Op {
    Op::Event {
        stream: STREAM.into(),
        kind: kind.into(),
        ts: cx.ts(),
        data: data.to_string(),
    }
}

/// The `check.rework` record on the builder's session stream: what the
/// lane sent the builder, never an event kind a plugin receives.
fn record_check(cx: &Cx, sid: &str, r: &Rework) -> Effect {
    Effect::Write {
        ops: vec![Op::Event {
            stream: sid.to_string(),
            kind: "check.rework".into(),
            ts: cx.ts(),
            data: json!({"id": r.id, "lane": r.lane, "text": r.text}).to_string(),
        }],
        ack: Ack::Rework,
    }
}

mod checkouts;
mod dispatch;
mod effects;
mod heads;
mod record;
mod restart;
#[cfg(test)]
mod tests;

pub use dispatch::{
    Dispatch, DispatchRequest, Dispatched, Made, NewLane, default_name, planned_worktree, slug,
    worktree_path,
};
pub use effects::{
    Ack, Answer, Effect, Heard, MergeAnswer, MergeAsk, Prompted, ReplyKey, Rework, SessionStart,
    Spawn, Timer, TurnEnd,
};
pub use record::{Lane, STREAM, SeatRef, Task, head_and_stale, read_at_start, seat_ref};

use checkouts::holds_checkout;
use dispatch::{dispatch_answer, unknown_repo};
use restart::RESUMED;
