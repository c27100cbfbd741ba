//! The lane controller in memory (issue 11): lanes driven with constructed
//! worker reports, session outcomes and committed turn ends, asserting the
//! effects each step returns. No thread, process, socket or ledger: the
//! router's side is played by hand. The end-to-end runs of the same paths
//! are in tests/lanes.rs.

use super::*;
use crate::config::{RepoEntry, SeatConfig};
use crate::lanes::machine::VerdictKind;
use crate::lanes::work::Job;

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

// ---- the world a lane runs in, in memory ----

const C0: &str = "0000000000000000000000000000000000000000";
const C1: &str = "1111111111111111111111111111111111111111";
const C2: &str = "2222222222222222222222222222222222222222";
const C3: &str = "3333333333333333333333333333333333333333";

/// A session as the fake sessions hold it.
#[derive(Clone, Default)]
struct Fake {
    ended: bool,
    ready: bool,
    agent_session_id: Option<String>,
}

#[derive(Default)]
struct FakeSessions(HashMap<String, Fake>);

impl SessionsView for FakeSessions {
    fn session(&self, sid: &str) -> Option<SessionView<'_>> {
        self.0.get(sid).map(|s| SessionView {
            ended: s.ended,
            ready: s.ready,
            agent_session_id: s.agent_session_id.as_deref(),
        })
    }
}

struct World {
    cfg: FileConfig,
    seats: Seats,
    sessions: FakeSessions,
    lanes: Lanes,
    now: Instant,
}

fn seat_cfg(harness: &str, family: &str) -> SeatConfig {
    SeatConfig {
        harness: harness.into(),
        command: harness.into(),
        args: vec![],
        transport: "acp".into(),
        provider: family.into(),
        family: family.into(),
        model: None,
        env: Default::default(),
        stall_timeout: None,
    }
}

impl World {
    /// Repository /r, builder seat `b` (anthropic) and verifier seat `v`
    /// (openai), both ready, isolation known.
    fn new(edit: impl FnOnce(&mut FileConfig)) -> World {
        let mut cfg = FileConfig::default();
        cfg.repo.push(RepoEntry { path: "/r".into() });
        cfg.seat = vec![seat_cfg("b", "anthropic"), seat_cfg("v", "openai")];
        edit(&mut cfg);
        let mut seats = Seats::from_config(&cfg);
        for s in &mut seats.list {
            s.status = Some(Status::Ready);
        }
        let lanes = Lanes {
            isolation: Some(Ok("/usr/bin/bwrap".into())),
            ..Lanes::default()
        };
        World {
            cfg,
            seats,
            sessions: FakeSessions::default(),
            lanes,
            now: Instant::now(),
        }
    }

    /// Runs `f` on the lanes with their context, as the router does.
    fn with<R>(&mut self, f: impl FnOnce(&mut Lanes, &Cx) -> R) -> R {
        let cx = Cx {
            cfg: &self.cfg,
            state_dir: Path::new("/state"),
            now_ms: 1_700_000_000_000,
            now: self.now,
            seats: &self.seats,
            sessions: &self.sessions,
        };
        f(&mut self.lanes, &cx)
    }

    fn session(&mut self, sid: &str, fake: Fake) {
        self.sessions.0.insert(sid.into(), fake);
    }

    fn live(&mut self, sid: &str) {
        self.session(
            sid,
            Fake {
                ready: true,
                ..Fake::default()
            },
        );
    }

    fn end(&mut self, sid: &str) {
        if let Some(s) = self.sessions.0.get_mut(sid) {
            s.ended = true;
        }
    }

    fn set_ready(&mut self, harness: &str, ready: bool) {
        for s in &mut self.seats.list {
            if s.cfg.harness == harness {
                s.status = Some(if ready {
                    Status::Ready
                } else {
                    Status::Degraded
                });
            }
        }
    }

    fn report(&mut self, r: Report) -> Vec<Effect> {
        self.with(|l, cx| l.on_report(cx, r))
    }

    fn turn_ended(&mut self, sid: &str, reason: TurnEnd) -> Vec<Effect> {
        let ev = Heard::TurnEnded {
            session: sid.into(),
            reason,
        };
        self.with(|l, cx| l.heard(cx, &[ev]))
    }

    fn session_ended(&mut self, sid: &str) -> Vec<Effect> {
        self.end(sid);
        let ev = Heard::SessionEnded {
            session: sid.into(),
        };
        self.with(|l, cx| l.heard(cx, &[ev]))
    }

    /// Commits a new lane's first record, `fx` being what its builder's
    /// start gave: the dispatch's answer.
    fn first_record_committed(&mut self, fx: Vec<Effect>) -> Vec<Effect> {
        assert_eq!(sketch(&fx), ["write start stage:building row"]);
        let Ok([Effect::Write { ack, .. }]) = <[Effect; 1]>::try_from(fx) else {
            unreachable!()
        };
        let fx = self.lanes.written(ack, Ok(()));
        assert_eq!(sketch(&fx), ["answer dispatched"]);
        fx
    }

    fn lane(&self, id: &str) -> &Lane {
        &self.lanes.map[id]
    }

    /// Dispatches a task of /r from `b` to `v`, its worktree made at C0 of
    /// main and its builder `s-b` running; the lane's id.
    fn dispatched(&mut self) -> String {
        self.dispatched_as(request(), "s-b")
    }

    /// Dispatches `req`, its builder running as session `sid`.
    fn dispatched_as(&mut self, req: DispatchRequest, sid: &str) -> String {
        let fx = self.with(|l, cx| l.dispatch(cx, req, ReplyKey(1)));
        let new = one_make_worktree(fx);
        let fx = self.report(Report::WorktreeMade {
            lane: new,
            made: Ok(("main".into(), C0.into())),
        });
        let then = one_spawn(fx).1;
        self.live(sid);
        let fx = self.with(|l, cx| l.spawned(cx, then, Ok(sid.into())));
        let fx = self.first_record_committed(fx);
        let Some(Effect::Answer {
            answer: Answer::Dispatched(Ok(d)),
            ..
        }) = fx.last()
        else {
            unreachable!()
        };
        d.lane.clone()
    }

    /// Drives a building lane whose builder is `builder` to its verifier
    /// `verifier` running on `commit`; the checkout it reads.
    fn verifying(&mut self, id: &str, builder: &str, verifier: &str, commit: &str) -> PathBuf {
        self.turn_ended(builder, TurnEnd::Completed);
        let fx = self.report(Report::Committed {
            lane: id.into(),
            result: Ok(commit.into()),
        });
        let checkout = checkout_of(the_job(&fx));
        let fx = self.report(Report::Checked {
            lane: id.into(),
            checkout: checkout.clone(),
            result: Ok(outcome(0, "")),
        });
        assert_eq!(
            sketch(&fx).last().map(String::as_str),
            Some(&*format!("job diff {}", &commit[..1]))
        );
        let fx = self.report(Report::Diffed {
            lane: id.into(),
            checkout: checkout.clone(),
            commit: commit.into(),
            second: false,
            result: Ok("+x".into()),
        });
        let then = one_spawn(fx).1;
        self.live(verifier);
        self.with(|l, cx| l.spawned(cx, then, Ok(verifier.into())));
        checkout
    }

    /// A new daemon's lanes reading `rows` from the ledger, with `edit`
    /// done to the world first; what loading returned.
    fn restarted(rows: Vec<String>, edit: impl FnOnce(&mut World)) -> (World, Vec<Effect>) {
        let mut w = World::new(|_| {});
        edit(&mut w);
        let fx = w.with(|l, cx| l.loaded(cx, rows, vec![]));
        (w, fx)
    }

    fn row(&self, id: &str) -> String {
        serde_json::to_string(self.lane(id)).unwrap()
    }
}

fn request() -> DispatchRequest {
    DispatchRequest {
        repo: "/r".into(),
        task: "Add feature.txt\nwith the word feature".into(),
        builder: "b".into(),
        verifier: "v".into(),
        acceptance_name: "has feature".into(),
        acceptance_command: "test -f feature.txt".into(),
        name: None,
        base: None,
    }
}

fn one_make_worktree(fx: Vec<Effect>) -> Box<NewLane> {
    match <[Effect; 1]>::try_from(fx) {
        Ok([Effect::Job(Job::MakeWorktree(new))]) => new,
        other => panic!("expected one make-worktree job, got {other:?}"),
    }
}

fn one_spawn(fx: Vec<Effect>) -> (SessionStart, Spawn) {
    match <[Effect; 1]>::try_from(fx) {
        Ok([Effect::Spawn { start, then }]) => (start, then),
        other => panic!("expected one spawn, got {other:?}"),
    }
}

/// The job of `fx` (there is one).
fn the_job(fx: &[Effect]) -> &Job {
    let jobs: Vec<&Job> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::Job(j) => Some(j),
            _ => None,
        })
        .collect();
    assert_eq!(jobs.len(), 1, "{fx:?}");
    jobs[0]
}

fn the_prompt(fx: &[Effect]) -> (&str, &Prompted) {
    let v: Vec<_> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::Prompt { text, then, .. } => Some((text.as_str(), then)),
            _ => None,
        })
        .collect();
    assert_eq!(v.len(), 1, "{fx:?}");
    v[0]
}

fn checkout_of(job: &Job) -> PathBuf {
    match job {
        Job::Check { checkout, .. } | Job::Diff { checkout, .. } => checkout.clone(),
        other => panic!("no checkout in {other:?}"),
    }
}

fn outcome(code: i32, tail: &str) -> Outcome {
    Outcome {
        code: Some(code),
        signal: None,
        timed_out: false,
        tail: tail.into(),
    }
}

fn verdict_text(v: &str) -> String {
    format!("I read it.\n```omniconflux-verdict\n{v}\n```\n")
}

const PASS: &str = r#"{"verdict":"pass"}"#;
const REWORK: &str =
    r#"{"verdict":"rework","defects":[{"file":"feature.txt","line":1,"issue":"say fixed"}]}"#;

/// Each effect in a few words, for asserting a step's whole answer.
fn sketch(fx: &[Effect]) -> Vec<String> {
    fx.iter().map(sketch_one).collect()
}

fn sketch_one(e: &Effect) -> String {
    match e {
        Effect::Write { ops, .. } => {
            let parts: Vec<String> = ops
                .iter()
                .map(|op| match op {
                    Op::Exec { .. } => "row".to_string(),
                    Op::Event {
                        stream, kind, data, ..
                    } => {
                        let v: Value = serde_json::from_str(data).unwrap();
                        match kind.as_str() {
                            "lane.stage" => format!("stage:{}", v["stage"].as_str().unwrap()),
                            "lane.verdict" => {
                                format!("verdict:{}", v["verdict"].as_str().unwrap())
                            }
                            "lane.start" => "start".into(),
                            "check.rework" => format!("rework:{stream}"),
                            other => other.into(),
                        }
                    }
                })
                .collect();
            format!("write {}", parts.join(" "))
        }
        Effect::Job(j) => match j {
            Job::RepositoryOf { .. } => "job repository-of".into(),
            Job::MakeWorktree(_) => "job make-worktree".into(),
            Job::UndoWorktree { .. } => "job undo-worktree".into(),
            Job::Reclaim { .. } => "job reclaim".into(),
            Job::RemoveCheckout { .. } => "job remove-checkout".into(),
            Job::CommitWork { .. } => "job commit".into(),
            Job::Check { commit, .. } => format!("job check {}", &commit[..1]),
            Job::Diff { commit, .. } => format!("job diff {}", &commit[..1]),
            Job::Merge { commit, .. } => format!("job merge {}", &commit[..1]),
            Job::RemoveWorktree { .. } => "job remove-worktree".into(),
            Job::ListRepos { .. } => "job list-repos".into(),
            Job::Toplevel { .. } => "job toplevel".into(),
        },
        Effect::ReadHeads(_) => "read-heads".into(),
        Effect::ReadAnswer { session, .. } => format!("read-answer {session}"),
        Effect::Timer { .. } => "timer".into(),
        Effect::Spawn { start, then } => {
            let who = match then {
                Spawn::FirstBuilder(_) => "first-builder",
                Spawn::Builder { .. } => "builder",
                Spawn::Verifier { .. } => "verifier",
            };
            format!("spawn {who} {}", start.harness)
        }
        Effect::Prompt { session, .. } => format!("prompt {session}"),
        Effect::Kill { session } => format!("kill {session}"),
        Effect::AskMerge(ask) => format!("ask-merge {}", &ask.commit[..1]),
        Effect::Answer { answer, .. } => match answer {
            Answer::Dispatched(Ok(_)) => "answer dispatched".into(),
            Answer::Dispatched(Err(e)) => format!("answer refused {}", e.code.as_str()),
            Answer::HeadsFresh => "answer heads".into(),
            Answer::Repos(_) => "answer repos".into(),
            Answer::RepoAdded(_) => "answer repo-added".into(),
        },
    }
}

// ---- one lane through the whole loop ----

#[test]
fn a_lane_goes_from_builder_to_check_to_verifier_to_rework_to_merge() {
    let mut w = World::new(|_| {});
    // Dispatch: the worktree is made on a worker, then the builder is
    // asked for, and the lane exists once its session runs.
    let fx = w.with(|l, cx| l.dispatch(cx, request(), ReplyKey(7)));
    let new = one_make_worktree(fx);
    assert_eq!(new.branch, "omni/add-feature-txt");
    assert_eq!(new.worktree, PathBuf::from("/r-wt/add-feature-txt"));
    assert_eq!(new.to, ReplyKey(7));
    let fx = w.report(Report::WorktreeMade {
        lane: new,
        made: Ok(("main".into(), C0.into())),
    });
    let (start, then) = one_spawn(fx);
    assert_eq!(start.harness, "b");
    assert_eq!(start.cwd, PathBuf::from("/r-wt/add-feature-txt"));
    assert!(start.prompt.starts_with("Add feature.txt\nwith the word feature\n\nWork in this worktree on branch omni/add-feature-txt."), "{}", start.prompt);
    w.live("s-b");
    let fx = w.with(|l, cx| l.spawned(cx, then, Ok("s-b".into())));
    // The answer waits for the lane's first record to commit.
    let fx = w.first_record_committed(fx);
    let Some(Effect::Answer {
        to: ReplyKey(7),
        answer: Answer::Dispatched(Ok(d)),
    }) = fx.last()
    else {
        panic!("{fx:?}")
    };
    assert_eq!(
        (d.session.as_str(), d.branch.as_str()),
        ("s-b", "omni/add-feature-txt")
    );
    let id = d.lane.clone();
    assert_eq!(w.lanes.lane_of_session("s-b"), Some(id.as_str()));
    assert_eq!(w.lane(&id).head, Some(Some(C0.into())));

    // Round 1: the builder's turn ends, its work is committed, the check
    // fails and goes back to the builder in its session.
    let fx = w.turn_ended("s-b", TurnEnd::Completed);
    assert_eq!(
        sketch(&fx),
        ["read-heads", "write stage:idle row", "job commit"]
    );
    let fx = w.report(Report::Committed {
        lane: id.clone(),
        result: Ok(C1.into()),
    });
    assert_eq!(sketch(&fx), ["write stage:checking row", "job check 1"]);
    let checkout = checkout_of(the_job(&fx));
    assert!(checkout.starts_with("/state/lanes"), "{checkout:?}");
    // The record written names the checkout the lane holds.
    assert_eq!(w.lane(&id).checkout.as_ref(), Some(&checkout));
    assert_eq!(w.lane(&id).head, Some(Some(C1.into())));
    let fx = w.report(Report::Checked {
        lane: id.clone(),
        checkout: checkout.clone(),
        result: Ok(outcome(1, "no feature.txt")),
    });
    assert_eq!(
        sketch(&fx),
        [
            "write stage:rework stage:building row",
            "write row",
            "prompt s-b"
        ]
    );
    let (text, then) = the_prompt(&fx);
    assert!(text.starts_with("The acceptance check failed"), "{text}");
    assert!(text.contains("no feature.txt"), "{text}");
    // Out of its check, the lane holds no checkout.
    assert_eq!(w.lane(&id).checkout, None);
    let then = then.clone();
    let fx = w.with(|l, cx| l.prompted(cx, then, true));
    assert_eq!(sketch(&fx), ["write rework:s-b"]);
    let Effect::Write { ops, ack } = &fx[0] else {
        unreachable!()
    };
    assert_eq!(ack, &Ack::Rework);
    let Op::Event { data, .. } = &ops[0] else {
        unreachable!()
    };
    let rec: Value = serde_json::from_str(data).unwrap();
    assert_eq!(
        (rec["id"].as_str(), rec["lane"].as_str()),
        (Some("check-1"), Some(id.as_str()))
    );

    // Round 2: a branch-head read still runs, so none more is asked for;
    // the check passes, the verifier is ready and asked for in the same
    // checkout, which the pool handed back.
    let fx = w.turn_ended("s-b", TurnEnd::Completed);
    assert_eq!(sketch(&fx), ["write stage:idle row", "job commit"]);
    let fx = w.report(Report::Committed {
        lane: id.clone(),
        result: Ok(C2.into()),
    });
    assert_eq!(checkout_of(the_job(&fx)), checkout, "the spare is reused");
    let fx = w.report(Report::Checked {
        lane: id.clone(),
        checkout: checkout.clone(),
        result: Ok(outcome(0, "")),
    });
    assert_eq!(
        sketch(&fx),
        [
            "write stage:waiting-verifier row",
            "write stage:verifying row",
            "job diff 2"
        ]
    );
    let fx = w.report(Report::Diffed {
        lane: id.clone(),
        checkout: checkout.clone(),
        commit: C2.into(),
        second: false,
        result: Ok("+feature".into()),
    });
    let (start, then) = one_spawn(fx);
    assert_eq!((start.harness.as_str(), &start.cwd), ("v", &checkout));
    assert!(
        start.prompt.contains("```diff\n+feature\n```"),
        "{}",
        start.prompt
    );
    assert!(start.prompt.contains("(it passed)."), "{}", start.prompt);
    w.live("s-v");
    let fx = w.with(|l, cx| l.spawned(cx, then, Ok("s-v".into())));
    assert_eq!(sketch(&fx), ["write row"]);
    assert_eq!(w.lane(&id).verifier_session.as_deref(), Some("s-v"));
    // The verifier answers rework: its session is stopped, the defects go
    // to the builder.
    let fx = w.turn_ended("s-v", TurnEnd::Completed);
    assert_eq!(sketch(&fx), ["read-answer s-v"]);
    let fx = w.report(Report::Answer {
        lane: id.clone(),
        session: "s-v".into(),
        text: verdict_text(REWORK),
    });
    assert_eq!(
        sketch(&fx),
        [
            "kill s-v",
            "write verdict:rework stage:rework stage:building row",
            "write row",
            "prompt s-b"
        ]
    );
    let (text, then) = the_prompt(&fx);
    assert!(text.contains("feature.txt:1: say fixed"), "{text}");
    let then = then.clone();
    let fx = w.with(|l, cx| l.prompted(cx, then, true));
    assert_eq!(sketch(&fx), ["write rework:s-b"]);
    // The verifier's session ends: its checkout goes back to the pool.
    assert!(w.session_ended("s-v").is_empty());
    assert_eq!(w.lanes.pool.spares(Path::new("/r")), 1);
    // The heads read is in; one asked for meanwhile follows.
    let fx = w.report(Report::Heads {
        heads: vec![(id.clone(), Some(C2.into()))],
        to: None,
    });
    assert_eq!(sketch(&fx), ["read-heads"]);

    // Round 3: a pass is merged, and the merged lane is archived with
    // its builder stopped and its worktree removed.
    w.turn_ended("s-b", TurnEnd::Completed);
    let fx = w.report(Report::Committed {
        lane: id.clone(),
        result: Ok(C3.into()),
    });
    let checkout = checkout_of(the_job(&fx));
    w.report(Report::Checked {
        lane: id.clone(),
        checkout: checkout.clone(),
        result: Ok(outcome(0, "")),
    });
    let fx = w.report(Report::Diffed {
        lane: id.clone(),
        checkout,
        commit: C3.into(),
        second: false,
        result: Ok("+fixed".into()),
    });
    let then = one_spawn(fx).1;
    w.live("s-v2");
    w.with(|l, cx| l.spawned(cx, then, Ok("s-v2".into())));
    w.turn_ended("s-v2", TurnEnd::Completed);
    let fx = w.report(Report::Answer {
        lane: id.clone(),
        session: "s-v2".into(),
        text: verdict_text(PASS),
    });
    assert_eq!(
        sketch(&fx),
        [
            "kill s-v2",
            "write verdict:pass stage:pass stage:merging row",
            "job merge 3"
        ]
    );
    let fx = w.report(Report::Merged {
        lane: id.clone(),
        result: Ok(C3.into()),
    });
    assert_eq!(
        sketch(&fx),
        [
            "write stage:merged row",
            "kill s-b",
            "write row",
            "job remove-worktree"
        ]
    );
    let l = w.lane(&id);
    assert!(l.archived);
    assert_eq!(l.machine.last_verdict, Some((VerdictKind::Pass, C3.into())));
    assert!(w.lanes.listed().is_empty());
    assert_eq!(w.lanes.lane_of_session("s-b"), None);
}

fn answer_code(fx: &[Effect]) -> Option<&'static str> {
    fx.iter().find_map(|e| match e {
        Effect::Answer {
            answer: Answer::Dispatched(Err(e)),
            ..
        } => Some(e.code.as_str()),
        _ => None,
    })
}

// ---- restarts ----

#[test]
fn a_builder_cut_off_by_a_restart_is_prompted_again_with_its_task() {
    let mut before = World::new(|_| {});
    let id = before.dispatched();
    let row = before.row(&id);
    let (mut w, fx) = World::restarted(vec![row], |w| {
        // The isolation probe and the seats have not answered yet.
        w.lanes.isolation = None;
        w.seats.probe();
    });
    assert_eq!(sketch(&fx), ["read-heads", "job reclaim"]);
    assert!(w.lanes.sessions_not_needed().is_empty());
    // The builder's session came back with agent session a-1, not set up
    // yet.
    w.session(
        "s-b",
        Fake {
            agent_session_id: Some("a-1".into()),
            ..Fake::default()
        },
    );
    assert!(w.with(|l, cx| l.sessions_restored(cx)).is_empty());
    assert_eq!(w.lane(&id).builder_reopened.as_deref(), Some("a-1"));
    // The turn the stop cut off ends as the sessions reopen: the restart's
    // doing, not the agent's, so no failover.
    assert!(w.turn_ended("s-b", TurnEnd::Failed).is_empty());
    let probe: Probe = Ok("/usr/bin/bwrap".into());
    assert!(w.with(|l, cx| l.isolation_known(cx, &probe)).is_empty());
    // Once the seats are probed the lane resumes.
    let fx = w.with(|l, cx| l.seats_probed(cx));
    assert_eq!(sketch(&fx), ["prompt s-b"]);
    let (text, then) = the_prompt(&fx);
    assert_eq!(
        text,
        format!("{RESUMED}\n\nThe task:\nAdd feature.txt\nwith the word feature")
    );
    let then = then.clone();
    assert!(w.with(|l, cx| l.prompted(cx, then, true)).is_empty());
    assert_eq!(w.lane(&id).builder_reopened, None);
    // Resumed only once.
    assert!(w.with(|l, cx| l.seats_probed(cx)).is_empty());
    // The lane hears its builder again.
    let fx = w.turn_ended("s-b", TurnEnd::Completed);
    assert_eq!(sketch(&fx), ["write stage:idle row", "job commit"]);
}

#[test]
fn a_builder_whose_session_did_not_come_back_gets_a_new_one_with_its_task() {
    let mut before = World::new(|_| {});
    let id = before.dispatched();
    let row = before.row(&id);
    for refused in [false, true] {
        let (mut w, _) = World::restarted(vec![row.clone()], |_| {});
        if refused {
            // Reopened, but it refuses the prompt.
            w.live("s-b");
        }
        let fx = w.with(|l, cx| l.sessions_restored(cx));
        let fx = if refused {
            assert_eq!(sketch(&fx), ["prompt s-b"]);
            let then = the_prompt(&fx).1.clone();
            w.with(|l, cx| l.prompted(cx, then, false))
        } else {
            fx
        };
        assert_eq!(sketch(&fx), ["spawn builder b"], "refused: {refused}");
        let (start, then) = one_spawn(fx);
        assert_eq!(start.cwd, PathBuf::from("/r-wt/add-feature-txt"));
        assert_eq!(
            start.prompt,
            format!("{RESUMED}\n\nThe task:\nAdd feature.txt\nwith the word feature")
        );
        w.live("s-b2");
        let fx = w.with(|l, cx| l.spawned(cx, then, Ok("s-b2".into())));
        assert_eq!(sketch(&fx), ["write row"]);
        assert_eq!(w.lane(&id).builder_session.as_deref(), Some("s-b2"));
        assert_eq!(w.lanes.lane_of_session("s-b2"), Some(id.as_str()));
    }
}

#[test]
fn a_verification_cut_off_by_a_restart_starts_over_with_a_new_verifier() {
    let mut before = World::new(|_| {});
    let id = before.dispatched();
    let checkout = before.verifying(&id, "s-b", "s-v", C1);
    assert_eq!(before.lane(&id).machine.stage, Stage::Verifying);
    let row = before.row(&id);
    let (mut w, fx) = World::restarted(vec![row], |_| {});
    assert_eq!(sketch(&fx), ["read-heads", "job reclaim"]);
    // The old verifier is not reopened, and the lane forgets it.
    assert_eq!(
        w.lanes.sessions_not_needed(),
        HashSet::from(["s-v".to_string()])
    );
    assert_eq!(w.lanes.lane_of_session("s-v"), None);
    w.live("s-b");
    let fx = w.with(|l, cx| l.sessions_restored(cx));
    assert_eq!(
        sketch(&fx),
        [
            "write stage:waiting-verifier row",
            "write stage:verifying row",
            "job diff 1"
        ]
    );
    // In the checkout the lane recorded.
    assert_eq!(checkout_of(the_job(&fx)), checkout);
}

#[test]
fn an_interrupted_check_runs_again_and_a_merge_is_retried_after_a_restart() {
    let mut before = World::new(|_| {});
    let id = before.dispatched();
    before.turn_ended("s-b", TurnEnd::Completed);
    before.report(Report::Committed {
        lane: id.clone(),
        result: Ok(C1.into()),
    });
    let checking = before.row(&id);
    let (mut w, _) = World::restarted(vec![checking], |_| {});
    let fx = w.with(|l, cx| l.sessions_restored(cx));
    assert_eq!(sketch(&fx), ["write stage:checking row", "job check 1"]);

    let mut merging = before.lane(&id).clone();
    merging.machine.stage = Stage::Merging;
    merging.checkout = None;
    let (mut w, _) = World::restarted(vec![serde_json::to_string(&merging).unwrap()], |_| {});
    let fx = w.with(|l, cx| l.sessions_restored(cx));
    assert_eq!(sketch(&fx), ["write stage:merging row", "job merge 1"]);

    // A pass that waited for the operator's approval asks again: the
    // approval did not survive the restart.
    let mut pass = merging;
    pass.machine.stage = Stage::Pass;
    pass.machine.require_merge_approval = true;
    let (mut w, _) = World::restarted(vec![serde_json::to_string(&pass).unwrap()], |_| {});
    let fx = w.with(|l, cx| l.sessions_restored(cx));
    assert_eq!(sketch(&fx), ["write row", "ask-merge 1"]);
}

#[test]
fn rework_after_a_restart_carries_the_task_to_a_builder_without_its_history() {
    let mut before = World::new(|_| {});
    let id = before.dispatched();
    before.turn_ended("s-b", TurnEnd::Completed);
    before.report(Report::Committed {
        lane: id.clone(),
        result: Ok(C1.into()),
    });
    let row = before.row(&id);
    // The agent came back in a new agent session (a-2: it could not load
    // a-1), or in a-1 with its history.
    for (now, told) in [("a-2", true), ("a-1", false)] {
        let (mut w, _) = World::restarted(vec![row.clone()], |w| {
            w.session(
                "s-b",
                Fake {
                    agent_session_id: Some("a-1".into()),
                    ..Fake::default()
                },
            );
        });
        let fx = w.with(|l, cx| l.sessions_restored(cx));
        let checkout = checkout_of(the_job(&fx));
        w.session(
            "s-b",
            Fake {
                ready: true,
                agent_session_id: Some(now.into()),
                ..Fake::default()
            },
        );
        let fx = w.report(Report::Checked {
            lane: id.clone(),
            checkout,
            result: Ok(outcome(1, "")),
        });
        let (text, _) = the_prompt(&fx);
        assert_eq!(
            text.contains("\n\nThe task:\nAdd feature.txt\nwith the word feature"),
            told,
            "{now}: {text}"
        );
    }
}

// ---- dispatch ----

#[test]
fn dispatch_refusals_answer_their_stable_code() {
    let refused = |edit: &dyn Fn(&mut World), req: DispatchRequest| {
        let mut w = World::new(|_| {});
        edit(&mut w);
        let fx = w.with(|l, cx| l.dispatch(cx, req, ReplyKey(3)));
        assert_eq!(fx.len(), 1, "{fx:?}");
        answer_code(&fx)
    };
    let none = |_: &mut World| {};
    let req = |b: &str, v: &str| DispatchRequest {
        builder: b.into(),
        verifier: v.into(),
        ..request()
    };
    assert_eq!(refused(&none, req("b", "nope")), Some("seat-not-found"));
    assert_eq!(refused(&none, req("b", "b")), Some("same-family"));
    assert_eq!(
        refused(&|w| w.set_ready("v", false), request()),
        Some("seat-not-ready")
    );
    assert_eq!(
        refused(
            &|w| w.lanes.isolation = Some(Err("no bwrap".into())),
            request()
        ),
        Some("isolation-missing")
    );
    assert_eq!(
        refused(&|w| w.lanes.isolation = None, request()),
        Some("isolation-missing")
    );
    let unnamed = DispatchRequest {
        name: Some("---".into()),
        ..request()
    };
    assert_eq!(refused(&none, unnamed), Some("invalid-params"));
    // The workers cannot take the worktree: unavailable.
    let mut w = World::new(|_| {});
    let new = one_make_worktree(w.with(|l, cx| l.dispatch(cx, request(), ReplyKey(3))));
    let e = RpcError::new(Code::Unavailable, "the lane workers are busy; try again");
    let fx = w.with(|l, cx| l.job_refused(cx, Job::MakeWorktree(new), e));
    assert_eq!(answer_code(&fx), Some("unavailable"));
}

#[test]
fn a_folder_the_daemon_does_not_know_is_asked_of_git_and_a_lane_worktree_stands_for_its_repository()
{
    let mut w = World::new(|_| {});
    let elsewhere = DispatchRequest {
        repo: "/elsewhere".into(),
        ..request()
    };
    let fx = w.with(|l, cx| l.dispatch(cx, elsewhere.clone(), ReplyKey(4)));
    assert_eq!(sketch(&fx), ["job repository-of"]);
    let asked = || Report::RepositoryOf {
        asked: "/elsewhere".into(),
        main: None,
        req: Box::new(elsewhere.clone()),
        to: ReplyKey(4),
    };
    assert_eq!(answer_code(&w.report(asked())), Some("repo-unknown"));
    // Git says it is a worktree of /r.
    let Report::RepositoryOf {
        asked: a, req, to, ..
    } = asked()
    else {
        unreachable!()
    };
    let fx = w.report(Report::RepositoryOf {
        asked: a,
        main: Some("/r".into()),
        req,
        to,
    });
    assert_eq!(one_make_worktree(fx).dispatch.repo, PathBuf::from("/r"));
    // A lane's own worktree is known without git.
    let id = w.dispatched();
    let again = DispatchRequest {
        repo: w.lane(&id).worktree.clone(),
        name: Some("second".into()),
        ..request()
    };
    let new = one_make_worktree(w.with(|l, cx| l.dispatch(cx, again, ReplyKey(5))));
    assert_eq!(new.dispatch.repo, PathBuf::from("/r"));
    assert_eq!(new.worktree, PathBuf::from("/r-wt/second"));
}

#[test]
fn a_builder_that_cannot_start_leaves_no_lane_and_no_worktree() {
    let mut w = World::new(|_| {});
    let new = one_make_worktree(w.with(|l, cx| l.dispatch(cx, request(), ReplyKey(6))));
    let then = one_spawn(w.report(Report::WorktreeMade {
        lane: new,
        made: Ok(("main".into(), C0.into())),
    }))
    .1;
    let e = RpcError::new(Code::SeatNotReady, "seat b is not ready");
    let fx = w.with(|l, cx| l.spawned(cx, then, Err(e)));
    assert_eq!(
        sketch(&fx),
        ["job undo-worktree", "answer refused seat-not-ready"]
    );
    assert!(w.lanes.map.is_empty());
}

// ---- the operator, failover, a busy verifier ----

#[test]
fn a_required_merge_approval_is_asked_and_its_answer_merges_or_sends_back() {
    for allow in [true, false] {
        let mut w = World::new(|c| c.lanes.require_merge_approval = true);
        let id = w.dispatched();
        w.verifying(&id, "s-b", "s-v", C1);
        w.turn_ended("s-v", TurnEnd::Completed);
        let fx = w.report(Report::Answer {
            lane: id.clone(),
            session: "s-v".into(),
            text: verdict_text(PASS),
        });
        assert_eq!(
            sketch(&fx),
            [
                "kill s-v",
                "write verdict:pass stage:pass row",
                "write row",
                "ask-merge 1"
            ]
        );
        let Some(Effect::AskMerge(ask)) = fx.last() else {
            unreachable!()
        };
        assert_eq!(ask.approval, format!("{id}-merge-1"));
        assert_eq!(
            ask.summary,
            format!("merge lane {id} (Add feature.txt) from omni/add-feature-txt into main")
        );
        // An answer about another commit is not this lane's.
        let other = w.with(|l, cx| l.merge_answered(cx, &id, C2, MergeAnswer::Allow));
        assert_eq!(other, (false, vec![]));
        let answer = if allow {
            MergeAnswer::Allow
        } else {
            MergeAnswer::Refuse
        };
        let (taken, fx) = w.with(|l, cx| l.merge_answered(cx, &id, C1, answer));
        assert!(taken);
        if allow {
            assert_eq!(sketch(&fx), ["write stage:merging row", "job merge 1"]);
        } else {
            assert_eq!(sketch(&fx), ["write stage:sent-back row"]);
            assert_eq!(
                w.lane(&id).reason.as_deref(),
                Some("the operator did not allow the merge")
            );
        }
    }
}

#[test]
fn a_failed_builder_hands_over_to_another_ready_seat_or_to_the_operator() {
    for third in [true, false] {
        let mut w = World::new(|c| {
            if third {
                c.seat.push(seat_cfg("b2", "google"));
            }
        });
        for s in &mut w.seats.list {
            s.status = Some(Status::Ready);
        }
        let id = w.dispatched();
        let fx = w.turn_ended("s-b", TurnEnd::UsageLimited);
        if third {
            assert_eq!(sketch(&fx), ["read-heads", "kill s-b", "spawn builder b2"]);
            let (start, then) = one_spawn(fx.into_iter().skip(2).collect());
            assert!(
                start
                    .prompt
                    .starts_with("The agent that worked on this task before you stopped.")
            );
            w.live("s-b2");
            w.with(|l, cx| l.spawned(cx, then, Ok("s-b2".into())));
            assert_eq!(w.lane(&id).builder.harness, "b2");
            assert_eq!(w.lanes.lane_of_session("s-b"), None);
        } else {
            assert_eq!(
                sketch(&fx),
                ["read-heads", "kill s-b", "write stage:sent-back row"]
            );
            assert_eq!(
                w.lane(&id).reason.as_deref(),
                Some(
                    "the builder b failed and no other ready seat of an allowed family can take over"
                )
            );
        }
    }
}

#[test]
fn a_lane_waits_for_its_verifier_seat_while_it_verifies_another_lane() {
    let mut w = World::new(|_| {});
    let first = w.dispatched();
    w.verifying(&first, "s-b", "s-v", C1);
    let second = w.dispatched_as(
        DispatchRequest {
            name: Some("second".into()),
            ..request()
        },
        "s-b2",
    );
    w.turn_ended("s-b2", TurnEnd::Completed);
    let fx = w.report(Report::Committed {
        lane: second.clone(),
        result: Ok(C2.into()),
    });
    let checkout = checkout_of(the_job(&fx));
    let fx = w.report(Report::Checked {
        lane: second.clone(),
        checkout,
        result: Ok(outcome(0, "")),
    });
    assert_eq!(sketch(&fx), ["write stage:waiting-verifier row", "timer"]);
    let Some(Effect::Timer { after, timer }) = fx.last() else {
        unreachable!()
    };
    assert_eq!(
        *after,
        Duration::from_secs(limits::LANE_VERIFIER_RETRY_SECS)
    );
    // Still busy when the timer fires: it waits again.
    let fx = w.with(|l, cx| l.timer(cx, timer.clone()));
    assert_eq!(sketch(&fx), ["timer"]);
    // The first lane's verifier is done: the second lane's turn.
    w.end("s-v");
    let fx = w.with(|l, cx| l.timer(cx, timer.clone()));
    assert_eq!(sketch(&fx), ["write stage:verifying row", "job diff 2"]);
}

#[test]
fn a_refused_job_sends_its_lane_to_the_operator_and_frees_its_checkout() {
    let mut w = World::new(|_| {});
    let id = w.dispatched();
    w.turn_ended("s-b", TurnEnd::Completed);
    let fx = w.report(Report::Committed {
        lane: id.clone(),
        result: Ok(C1.into()),
    });
    let job = the_job(&fx).clone();
    let e = RpcError::new(Code::Unavailable, "the lane workers are busy; try again");
    let fx = w.with(|l, cx| l.job_refused(cx, job, e));
    assert_eq!(sketch(&fx), ["write stage:sent-back row"]);
    assert_eq!(
        w.lane(&id).reason.as_deref(),
        Some("the lane workers are busy; try again")
    );
    // The checkout is free again: back in the pool once released.
    assert_eq!(w.lane(&id).checkout, None);
    assert_eq!(w.lanes.pool.spares(Path::new("/r")), 1);
}

// ---- branch heads and repositories ----

#[test]
fn one_background_head_read_runs_at_a_time_and_only_when_the_last_is_old() {
    let mut w = World::new(|_| {});
    let id = w.dispatched();
    let fresh = |w: &mut World| sketch(&w.with(|l, cx| l.keep_heads_fresh(cx)));
    assert_eq!(fresh(&mut w), ["read-heads"]);
    // Asked for again while it runs: it follows once the first is in.
    assert!(fresh(&mut w).is_empty());
    let heads = |c: &str| Report::Heads {
        heads: vec![(id.clone(), Some(c.into()))],
        to: None,
    };
    assert_eq!(sketch(&w.report(heads(C1))), ["read-heads"]);
    assert_eq!(w.lane(&id).head, Some(Some(C1.into())));
    assert!(w.report(heads(C2)).is_empty());
    // Fresh: no read until LANE_HEADS_FRESH_MS have passed.
    assert!(fresh(&mut w).is_empty());
    w.now += Duration::from_millis(limits::LANE_HEADS_FRESH_MS);
    assert_eq!(fresh(&mut w), ["read-heads"]);
    // The heads thread could not take it: the next reader asks again.
    assert!(w.with(|l, _| l.heads_refused(None)).is_empty());
    assert_eq!(fresh(&mut w), ["read-heads"]);
}

#[test]
fn a_reader_that_waits_for_the_heads_is_answered_when_they_are_read_or_cannot_be() {
    let mut w = World::new(|_| {});
    let id = w.dispatched();
    w.with(|l, cx| l.close(cx, &id, false)).unwrap();
    // An archived lane's branch is read only when that lane is asked for.
    for (also, read) in [(None, false), (Some(id.as_str()), true)] {
        let fx = w.lanes.fresh_heads(also, ReplyKey(9));
        let Ok([Effect::ReadHeads(job)]) = <[Effect; 1]>::try_from(fx) else {
            panic!("one read")
        };
        assert_eq!(job.to, Some(ReplyKey(9)));
        assert_eq!(job.branches.contains_key(Path::new("/r")), read, "{also:?}");
    }
    let fx = w.report(Report::Heads {
        heads: vec![(id.clone(), None)],
        to: Some(ReplyKey(9)),
    });
    assert_eq!(sketch(&fx), ["answer heads"]);
    // The branch is gone: the head reads null.
    assert_eq!(w.lane(&id).head, Some(None));
    let fx = w.with(|l, _| l.heads_refused(Some(ReplyKey(9))));
    assert_eq!(sketch(&fx), ["answer heads"]);
}

#[test]
fn a_dispatch_is_answered_with_the_ledgers_refusal_of_its_first_record() {
    let mut w = World::new(|_| {});
    let fx = w.with(|l, cx| l.dispatch(cx, request(), ReplyKey(3)));
    let new = one_make_worktree(fx);
    let fx = w.report(Report::WorktreeMade {
        lane: new,
        made: Ok(("main".into(), C0.into())),
    });
    let then = one_spawn(fx).1;
    w.live("s-b");
    let fx = w.with(|l, cx| l.spawned(cx, then, Ok("s-b".into())));
    assert_eq!(sketch(&fx), ["write start stage:building row"]);
    let Ok([Effect::Write { ack, .. }]) = <[Effect; 1]>::try_from(fx) else {
        unreachable!()
    };
    match <[Effect; 1]>::try_from(w.lanes.written(ack, Err(WriteError::Busy))) {
        Ok(
            [
                Effect::Answer {
                    to: ReplyKey(3),
                    answer: Answer::Dispatched(Err(e)),
                },
            ],
        ) => assert_eq!(e.code.as_str(), "ledger-busy"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_repository_is_added_once_the_ledger_has_it() {
    let mut w = World::new(|_| {});
    assert_eq!(
        sketch(&w.lanes.add_repo("/s/sub".into(), ReplyKey(2))),
        ["job toplevel"]
    );
    let top = |w: &mut World, result| {
        w.report(Report::Toplevel {
            result,
            to: ReplyKey(2),
        })
    };
    let fx = top(&mut w, Ok("/s".into()));
    assert_eq!(sketch(&fx), ["write row"]);
    let Ok([Effect::Write { ack, .. }]) = <[Effect; 1]>::try_from(fx) else {
        unreachable!()
    };
    // Not known before the commit.
    assert!(!w.lanes.known_repos(&w.cfg).contains(&PathBuf::from("/s")));
    let fx = w.lanes.written(ack, Ok(()));
    assert_eq!(
        fx,
        [Effect::Answer {
            to: ReplyKey(2),
            answer: Answer::RepoAdded(Ok("/s".into()))
        }]
    );
    assert_eq!(
        w.lanes.known_repos(&w.cfg),
        [PathBuf::from("/r"), PathBuf::from("/s")]
    );
    // A folder git does not know, and a full list, are refused.
    let code = |fx: Vec<Effect>| match <[Effect; 1]>::try_from(fx) {
        Ok(
            [
                Effect::Answer {
                    answer: Answer::RepoAdded(Err(e)),
                    ..
                },
            ],
        ) => e.code.as_str(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        code(top(&mut w, Err("not a git repository".into()))),
        "repo-unknown"
    );
    w.lanes.added_repos = (0..limits::LANE_MAX_REPOS)
        .map(|i| PathBuf::from(format!("/x{i}")))
        .collect();
    assert_eq!(code(top(&mut w, Ok("/t".into()))), "unavailable");
    // The ledger refused the row: the refusal is the answer.
    let ack = Ack::RepoAdded {
        repo: "/u".into(),
        to: ReplyKey(2),
    };
    assert_eq!(
        code(w.lanes.written(ack, Err(WriteError::Busy))),
        "ledger-busy"
    );
}
