//! The lanes' routes (issue 11): where the lane controller's effects are
//! carried out and where what the lanes hear comes from. The controller
//! (`lanes::controller::Lanes`) knows neither the daemon nor the sessions,
//! the approvals inbox or a surface; this file is where those meet it.
//!
//! - Each call builds the controller's read-only context ([`with`]): the
//!   config, the time, the seat registry and the sessions seen through
//!   `SessionsView`.
//! - Jobs go to the lane workers (`lanes::work::Workers`, started once the
//!   ledger's lanes are read), with the daemon's git as it runs now;
//!   their reports come back through the reactor inbox as
//!   `Report::Lanes` and a refused job straight back to the controller.
//! - Sessions asked for, prompts and kills are today's
//!   `core::sessions::{spawn, input, kill}`, a merge approval is
//!   `core::approvals::add_lane_merge`; their outcomes go back to the
//!   controller under the typed key it gave.
//! - Who waits for an answer (a socket request, a plugin's task request)
//!   is kept here under a `ReplyKey`: the controller names only the key.
//!   A key is minted for one kind of answer; an answer that never comes
//!   (the daemon stops first) drops its waiter.
//!
//! What the lanes hear arrives here as calls from the daemon and the
//! router: committed turn and session ends (read out of the events as
//! typed [`Heard`]s), the isolation probe, the seats probed, the sessions
//! of the last run restored, a merge approval answered.

use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::apply;
use crate::daemon::Daemon;
use crate::daemon::effects::Report;
use crate::errors::RpcError;
use crate::lanes::controller::{
    Answer, Cx, DispatchRequest, Dispatched, Effect, Heard, Lanes, MergeAnswer, ReplyKey,
    SessionView, SessionsView, TurnEnd,
};
use crate::lanes::git;
use crate::lanes::machine::Input;
use crate::lanes::work::{self, Env, Job, RepoListing, Workers};
use crate::ledger::Appended;
use crate::reactor::Msg;

type Waiter = Box<dyn FnOnce(&mut Daemon, Answer)>;

/// The router's part for the lanes: the workers, and who waits for an
/// answer under which key. A waiter is a request in flight (a socket or
/// HTTP request, a plugin's task request), so the map is bounded by the
/// bounds on those, and every key gets its answer: each job the lanes
/// hand out for a key reports back or is refused back. Only a worker
/// thread that panicked mid-job would leave its waiter here, unanswered
/// (a plugin's task request then ends at its dispatch timeout).
#[derive(Default)]
pub struct Route {
    workers: Option<Workers>,
    waiting: HashMap<u64, Waiter>,
    next_key: u64,
}

impl Route {
    fn wait(&mut self, w: Waiter) -> ReplyKey {
        self.next_key += 1;
        self.waiting.insert(self.next_key, w);
        ReplyKey(self.next_key)
    }
}

/// The sessions as the lanes see them.
struct SessionsOf<'a>(&'a crate::core::sessions::Sessions);

impl SessionsView for SessionsOf<'_> {
    fn session(&self, sid: &str) -> Option<SessionView<'_>> {
        self.0.summary(sid).map(|s| SessionView {
            ended: s.state == crate::core::sessions::State::Ended,
            ready: s.ready,
            agent_session_id: s.agent_session_id,
        })
    }
}

/// Runs `f` on the lanes with their context.
fn with<R>(d: &mut Daemon, f: impl FnOnce(&mut Lanes, &Cx) -> R) -> R {
    let sessions = SessionsOf(&d.core.sessions);
    let cx = Cx {
        cfg: &d.cfg,
        state_dir: &d.paths.state_dir,
        now_ms: crate::clock::now_ms(),
        now: Instant::now(),
        seats: &d.core.seats,
        sessions: &sessions,
    };
    f(&mut d.lanes, &cx)
}

/// Runs `f` on the lanes and applies what it returns.
fn lanes(d: &mut Daemon, f: impl FnOnce(&mut Lanes, &Cx) -> Vec<Effect>) {
    let fx = with(d, f);
    apply(d, fx);
}

/// How the daemon's git runs now (`git` module comment): in the agents'
/// kind of namespace while agents are contained, else on the host.
fn daemon_git(d: &Daemon) -> git::Git {
    match d.core.sessions.sandbox(d.cfg.agents.isolation()) {
        crate::isolation::AgentSandbox::Namespace(bwrap) => git::Git::contained(
            bwrap,
            crate::isolation::hidden_for(d),
            &d.paths.state_dir.join("lanes"),
        ),
        _ => git::Git::host(),
    }
}

/// The ledger's lanes and repositories are read: the workers start, then
/// the lanes take their records.
pub fn loaded(d: &mut Daemon, rows: Vec<String>, repos: Vec<String>) {
    let inbox = d.inbox.clone();
    let sink: work::Sink = Arc::new(move |r| {
        inbox.send(Msg::Report(Report::Lanes(Box::new(r))));
    });
    match Workers::start(sink) {
        Ok(w) => d.router.lanes.workers = Some(w),
        Err(e) => {
            crate::error!("unable to start the lane workers: {e}; lanes are unavailable");
            return;
        }
    }
    lanes(d, |l, cx| l.loaded(cx, rows, repos));
}

/// A lane worker's, the heads thread's or the ledger reader's report.
pub fn report(d: &mut Daemon, r: work::Report) {
    lanes(d, |l, cx| l.on_report(cx, r));
}

/// The daemon's isolation probe answered.
pub fn isolation_known(d: &mut Daemon, probe: &crate::isolation::Probe) {
    lanes(d, |l, cx| l.isolation_known(cx, probe));
}

/// The seats' probe answered.
pub fn seats_probed(d: &mut Daemon) {
    lanes(d, |l, cx| l.seats_probed(cx));
}

/// The sessions of the last run no lane will use again.
pub fn sessions_not_needed(d: &mut Daemon) -> HashSet<String> {
    d.lanes.sessions_not_needed()
}

/// The sessions of the last run are reopened.
pub fn sessions_restored(d: &mut Daemon) {
    lanes(d, |l, cx| l.sessions_restored(cx));
}

/// Committed events: the turn and session ends go to the lanes.
pub fn on_events(d: &mut Daemon, events: &[Appended]) {
    let heard: Vec<Heard> = events.iter().filter_map(heard).collect();
    if !heard.is_empty() {
        lanes(d, |l, cx| l.heard(cx, &heard));
    }
}

fn heard(ev: &Appended) -> Option<Heard> {
    match ev.kind.as_str() {
        "turn.end" => {
            let reason = serde_json::from_str::<Value>(&ev.data)
                .ok()
                .and_then(|v| {
                    v["reason"].as_str().map(|r| match r {
                        "completed" => TurnEnd::Completed,
                        "failed" => TurnEnd::Failed,
                        "usage-limited" => TurnEnd::UsageLimited,
                        _ => TurnEnd::Other,
                    })
                })
                .unwrap_or(TurnEnd::Other);
            Some(Heard::TurnEnded {
                session: ev.stream.clone(),
                reason,
            })
        }
        "session.end" => Some(Heard::SessionEnded {
            session: ev.stream.clone(),
        }),
        _ => None,
    }
}

/// The operator answered a lane's merge approval; whether the lane took
/// it.
pub fn merge_answered(
    d: &mut Daemon,
    lane: &str,
    commit: &str,
    verdict: crate::core::inbox::Verdict,
) -> bool {
    let answer = match verdict {
        crate::core::inbox::Verdict::Allow => MergeAnswer::Allow,
        _ => MergeAnswer::Refuse,
    };
    let (taken, fx) = with(d, |l, cx| l.merge_answered(cx, lane, commit, answer));
    apply(d, fx);
    taken
}

/// Closes a lane whose plugin is removed with stopTasks; how many of its
/// sessions were still running.
pub fn stop_for_removal(d: &mut Daemon, lane: &str) -> usize {
    let (live, fx) = with(d, |l, cx| l.stop_for_removal(cx, lane));
    apply(d, fx);
    live
}

/// Feeds an operator's input to a lane (lanes.merge, lanes.rework).
pub fn step(d: &mut Daemon, lane: &str, input: Input) -> Result<(), RpcError> {
    let fx = with(d, |l, cx| l.step(cx, lane, input))?;
    apply(d, fx);
    Ok(())
}

/// lanes.close.
pub fn close(d: &mut Daemon, lane: &str, remove_worktree: bool) -> Result<(), RpcError> {
    let fx = with(d, |l, cx| l.close(cx, lane, remove_worktree))?;
    apply(d, fx);
    Ok(())
}

/// Dispatches a task; `then` gets the lane or the refusal.
pub fn dispatch(
    d: &mut Daemon,
    req: DispatchRequest,
    then: impl FnOnce(&mut Daemon, Result<Dispatched, RpcError>) + 'static,
) {
    let to = d.router.lanes.wait(Box::new(move |d, a| {
        if let Answer::Dispatched(r) = a {
            then(d, r);
        }
    }));
    lanes(d, |l, cx| l.dispatch(cx, req, to));
}

/// Reads the branch heads (of lane `also` too), then runs `then`.
pub fn fresh_heads(d: &mut Daemon, also: Option<&str>, then: impl FnOnce(&mut Daemon) + 'static) {
    let to = d.router.lanes.wait(Box::new(move |d, _| then(d)));
    lanes(d, |l, _| l.fresh_heads(also, to));
}

/// Reads the branch heads again in the background when they are old,
/// for readers that answer at once (the plugin wire's lanes.list).
pub fn keep_heads_fresh(d: &mut Daemon) {
    lanes(d, |l, cx| l.keep_heads_fresh(cx));
}

/// repos.list: `then` gets the repositories and their worktrees.
pub fn list_repos(
    d: &mut Daemon,
    then: impl FnOnce(&mut Daemon, Result<Vec<RepoListing>, RpcError>) + 'static,
) {
    let to = d.router.lanes.wait(Box::new(move |d, a| {
        if let Answer::Repos(r) = a {
            then(d, r);
        }
    }));
    lanes(d, |l, cx| l.list_repos(cx, to));
}

/// repos.add: `then` gets the repository once the ledger has it.
pub fn add_repo(
    d: &mut Daemon,
    path: PathBuf,
    then: impl FnOnce(&mut Daemon, Result<PathBuf, RpcError>) + 'static,
) {
    let to = d.router.lanes.wait(Box::new(move |d, a| {
        if let Answer::RepoAdded(r) = a {
            then(d, r);
        }
    }));
    lanes(d, |l, _| l.add_repo(path, to));
}

/// Carries out one effect of the lanes.
pub(super) fn run(d: &mut Daemon, e: Effect) {
    match e {
        Effect::Write { ops, ack } => d.write(ops, move |d, r| {
            lanes(d, |l, _| l.written(ack, r.map(drop)));
        }),
        Effect::Job(job) => start(d, job),
        Effect::ReadHeads(job) => {
            let refused = match &d.router.lanes.workers {
                Some(w) => w.read_heads(job).err(),
                None => Some(job),
            };
            if let Some(job) = refused {
                lanes(d, |l, _| l.heads_refused(job.to));
            }
        }
        Effect::ReadAnswer { lane, session } => read_answer(d, lane, session),
        Effect::Timer { after, timer } => {
            d.reactor.schedule(after, move |d| {
                lanes(d, |l, cx| l.timer(cx, timer));
            });
        }
        Effect::Spawn { start, then } => {
            let req = crate::core::sessions::SpawnRequest {
                harness: start.harness,
                cwd: start.cwd.display().to_string(),
                prompt: Some(start.prompt),
                model: None,
                name: Some(start.name),
            };
            super::sessions::spawn(d, req, move |d, r| {
                let r = r.map(|s| s.session_id);
                lanes(d, |l, cx| l.spawned(cx, then, r));
            });
        }
        Effect::Prompt {
            session,
            text,
            then,
        } => {
            let taken = super::sessions::input(d, &session, text).is_ok();
            lanes(d, |l, cx| l.prompted(cx, then, taken));
        }
        Effect::Kill { session } => {
            let _ = super::sessions::kill(d, &session);
        }
        Effect::AskMerge(ask) => {
            let lane = ask.lane.clone();
            let merge = crate::core::inbox::LaneMerge {
                lane: ask.lane,
                summary: ask.summary,
                commit: ask.commit,
            };
            if let Err(e) = super::sessions::add_lane_merge(d, &ask.approval, merge) {
                crate::warn!(
                    "lane {lane}: its merge could not enter the inbox ({e:?}); it waits for lanes.merge"
                );
            }
        }
        Effect::Answer { to, answer } => {
            if let Some(w) = d.router.lanes.waiting.remove(&to.0) {
                w(d, answer);
            }
        }
    }
}

/// Queues a job on the lane workers with the daemon's git as it runs now;
/// a job they cannot take goes back to the lanes.
fn start(d: &mut Daemon, job: Job) {
    let hidden = match &job {
        Job::Check {
            isolation: crate::lanes::check::Isolation::Bwrap(_),
            ..
        } => crate::isolation::hidden_for(d),
        _ => crate::isolation::Hidden::default(),
    };
    let env = Env {
        git: daemon_git(d),
        hidden,
    };
    let refused = match &d.router.lanes.workers {
        Some(w) => w.submit(job, env).err().map(|b| *b),
        None => Some((job, work::not_running())),
    };
    if let Some((job, e)) = refused {
        lanes(d, |l, cx| l.job_refused(cx, job, e));
    }
}

/// Reads the verifier's last turn on the ledger reader; the text comes
/// back as a report.
fn read_answer(d: &mut Daemon, lane: String, session: String) {
    let inbox = d.inbox.clone();
    let lane2 = lane.clone();
    let queued = d.ledger.read(Box::new(move |conn| {
        let text = crate::core::transcript::read_entries(
            conn,
            &session,
            0,
            crate::limits::LANE_VERIFIER_ENTRIES,
        )
        .map(|entries| last_turn_text(&entries))
        .unwrap_or_default();
        inbox.send(Msg::Report(Report::Lanes(Box::new(work::Report::Answer {
            lane: lane2,
            session,
            text,
        }))));
    }));
    if queued.is_err() {
        lanes(d, |l, cx| l.answer_unread(cx, &lane));
    }
}

/// The text the agent wrote after the last user entry of a transcript
/// (the verifier's answer): the transcript's entries are the sessions'
/// JSON, read here so that the lanes get the text alone.
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn appended(stream: &str, kind: &str, data: Value) -> Appended {
        Appended {
            stream: stream.into(),
            seq: 1,
            kind: kind.into(),
            ts: "2026-01-01T00:00:00.000Z".into(),
            data: data.to_string(),
        }
    }

    #[test]
    fn turn_and_session_ends_reach_the_lanes_typed_and_nothing_else_does() {
        let turn = |reason: Value| heard(&appended("s-1", "turn.end", json!({"reason": reason})));
        let ended = |reason| {
            Some(Heard::TurnEnded {
                session: "s-1".into(),
                reason,
            })
        };
        assert_eq!(turn(json!("completed")), ended(TurnEnd::Completed));
        assert_eq!(turn(json!("failed")), ended(TurnEnd::Failed));
        assert_eq!(turn(json!("usage-limited")), ended(TurnEnd::UsageLimited));
        assert_eq!(turn(json!("cancelled")), ended(TurnEnd::Other));
        assert_eq!(turn(Value::Null), ended(TurnEnd::Other));
        assert_eq!(
            heard(&appended("s-1", "session.end", json!({}))),
            Some(Heard::SessionEnded {
                session: "s-1".into()
            })
        );
        assert_eq!(heard(&appended("s-1", "text", json!({"text": "hi"}))), None);
        assert_eq!(heard(&appended("lanes", "lane.stage", json!({}))), None);
    }

    #[test]
    fn the_verifier_s_answer_is_its_text_after_the_last_prompt() {
        let entries = [
            json!({"kind": "user", "text": "judge this"}),
            json!({"kind": "text", "text": "an earlier turn"}),
            json!({"kind": "user", "text": "judge again"}),
            json!({"kind": "tool", "name": "read"}),
            json!({"kind": "text", "text": "I read it.\n"}),
            json!({"kind": "text", "text": "pass"}),
        ];
        assert_eq!(last_turn_text(&entries), "I read it.\npass");
        assert_eq!(last_turn_text(&entries[..1]), "");
        assert_eq!(last_turn_text(&[]), "");
    }
}
