//! Sessions, turns and approvals through the real daemon (issue 3, "Tests"):
//! the scripted fake agents of tests/fixtures for both transports, every
//! event sequence, interrupts, queueing, a restart with resume, misbehaving
//! agents, an agent that tries to answer its own approval, answers by the
//! operator, a rule and a timeout, and the ACP library's example agent.

mod util;

use serde_json::{Value, json};
use std::path::PathBuf;
use util::{Daemon, Opts, TestDir, run_cli};

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum T {
    Acp,
    Sj,
}

impl T {
    fn name(self) -> &'static str {
        match self {
            T::Acp => "acp",
            T::Sj => "stream-json",
        }
    }
    fn script(self) -> String {
        fixture(match self {
            T::Acp => "fake_acp_agent.py",
            T::Sj => "fake_stream_json_agent.py",
        })
    }
    /// A permission step of this transport's fake.
    fn permission(self, id: &str, kind: &str, input: Value) -> Value {
        match self {
            T::Acp => {
                json!({"permission": {"id": id, "title": format!("{kind} it"), "kind": kind, "input": input}})
            }
            T::Sj => {
                json!({"permission": {"id": id, "name": if kind == "read" { "Read" } else { "Bash" }, "input": input, "description": "d"}})
            }
        }
    }
}

/// A `[[seat]]` running a fake agent with `script`.
fn seat(harness: &str, t: T, script: &Value, env: &[(&str, &str)]) -> String {
    let mut env_s = format!("FAKE_SCRIPT = '{}'", script);
    for (k, v) in env {
        env_s.push_str(&format!(", {k} = '{v}'"));
    }
    format!(
        "[[seat]]\nharness = \"{harness}\"\ncommand = \"python3\"\nargs = [\"{}\"]\ntransport = \"{}\"\nprovider = \"test\"\nfamily = \"local\"\nenv = {{ {env_s} }}\n\n",
        t.script(),
        t.name()
    )
}

struct Rig {
    d: Daemon,
    c: util::Client,
    wt: PathBuf,
    /// Events read while waiting for another, oldest first.
    seen: Vec<Value>,
}

impl Rig {
    fn start(dir: &TestDir, config: String) -> Rig {
        let wt = dir.join("wt");
        std::fs::create_dir_all(&wt).unwrap();
        let d = Daemon::start_with(
            &dir.path,
            Opts {
                config: Some(config),
                ..Opts::default()
            },
        );
        let mut c = d.connect();
        c.call("events.subscribe", json!({}));
        c.call("sessions.subscribe", json!({}));
        Rig {
            d,
            c,
            wt: wt.canonicalize().unwrap(),
            seen: Vec::new(),
        }
    }

    fn spawn(&mut self, harness: &str, prompt: Option<&str>) -> String {
        let mut p = json!({"harness": harness, "cwd": self.wt.display().to_string()});
        if let Some(t) = prompt {
            p["prompt"] = json!(t);
        }
        let r = self.c.call("sessions.spawn", p);
        r["session_id"].as_str().unwrap().to_string()
    }

    /// Waits for the next event of `sid` of `kind`; returns its params.
    fn event(&mut self, sid: &str, kind: &str) -> Value {
        self.event_after(sid, kind, 0)
    }

    /// As `event`, for an event after seq `after` of the stream.
    fn event_after(&mut self, sid: &str, kind: &str, after: i64) -> Value {
        let hit = |p: &Value| {
            p["stream"] == sid && p["kind"] == kind && p["seq"].as_i64().unwrap_or(0) > after
        };
        if let Some(i) = self.seen.iter().position(hit) {
            return self.seen.remove(i);
        }
        loop {
            let n = self.c.next_note("event");
            if hit(&n["params"]) {
                return n["params"].clone();
            }
            self.seen.push(n["params"].clone());
        }
    }

    /// Every event of `sid`'s stream, in order: (kind, data).
    fn stream(&mut self, sid: &str) -> Vec<(String, Value)> {
        let r = self
            .c
            .call("events.list", json!({"stream": sid, "limit": 1000}));
        r["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["kind"].as_str().unwrap().to_string(), e["data"].clone()))
            .collect()
    }

    fn kinds(&mut self, sid: &str) -> Vec<String> {
        self.stream(sid).into_iter().map(|(k, _)| k).collect()
    }

    /// Waits for a session.event of `sid` whose session has `state`.
    fn state(&mut self, sid: &str, state: &str) -> Value {
        // After a restart a session is back once the daemon has read the
        // ledger: until then it is unknown, and its `added` event follows.
        let now = self.c.request("sessions.get", json!({"session_id": sid}));
        if now["result"]["state"] == state {
            return now["result"].clone();
        }
        loop {
            let n = self.c.next_note("session.event");
            let s = &n["params"]["session"];
            if s["id"] == sid && s["state"] == state {
                return s.clone();
            }
        }
    }

    fn entries(&mut self, sid: &str) -> Vec<Value> {
        self.c
            .call("sessions.transcriptView", json!({"session_id": sid}))["entries"]
            .as_array()
            .unwrap()
            .clone()
    }
}

fn every_event_sequence(t: T) {
    let dir = TestDir::new(&format!("seq{}", t.name()));
    let script = json!([[{"think": "hmm"}, {"text": "hi "}, {"text": "there"}, {"tool": {"id": "t1", "name": "Read", "title": "Read a", "kind": "read", "input": {"path": "/a"}, "output": {"ok": 1}}}]]);
    let mut r = Rig::start(&dir, seat("fake", t, &script, &[]));
    let sid = r.spawn("fake", Some("hello"));
    assert!(sid.starts_with("s-") && sid.len() == 14, "{sid}");
    let added = r.c.next_note("session.event");
    assert_eq!(added["params"]["type"], "added");
    assert_eq!(added["params"]["session"]["id"], json!(sid));
    let start = r.event(&sid, "session.start");
    assert_eq!(start["data"]["transport"], t.name());
    assert_eq!(start["data"]["flags"]["interrupt"], true);
    let ts = r.event(&sid, "turn.start");
    assert_eq!(ts["data"], json!({"turn": 1, "mode": "prompt", "chars": 5}));
    assert_eq!(
        r.event(&sid, "turn.end")["data"],
        json!({"reason": "completed"})
    );
    let s = r.state(&sid, "idle");
    assert_eq!(
        (
            s["turn"].clone(),
            s["turn_active"].clone(),
            s["end_reason"].clone(),
            s["pending_approvals"].clone()
        ),
        (json!(1), json!(false), json!("completed"), json!(0))
    );
    assert_eq!(s["can_prompt"], true);
    assert!(s["agent_session_id"].is_string(), "{s}");
    let list = r.c.call("sessions.list", json!({}));
    assert_eq!(list[0]["id"], json!(sid));
    assert_eq!(list[0]["cwd"], json!(r.wt.display().to_string()));

    let entries = r.entries(&sid);
    let kinds: Vec<&str> = entries
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["user", "thinking", "text", "tool", "turn_end"],
        "{entries:?}"
    );
    assert_eq!(entries[2]["text"], "hi there");
    assert!(
        entries[3].get("toolInput").is_none() && entries[3]["toolId"] == "t1",
        "{}",
        entries[3]
    );
    let detail = r.c.call(
        "sessions.toolDetail",
        json!({"session_id": sid, "tool_id": "t1"}),
    );
    assert_eq!(
        serde_json::from_str::<Value>(detail["toolInput"].as_str().unwrap()).unwrap()["path"],
        "/a"
    );
    assert!(detail["result"].is_string(), "{detail}");

    // A transcript subscription: the first answer brings the client up to
    // date, then a delta follows each change.
    let first = r.c.call(
        "transcript.subscribe",
        json!({"sub_id": "x", "session_id": sid, "have_entries": 0}),
    );
    assert_eq!(
        (
            first["from_index"].clone(),
            first["entries"].as_array().unwrap().len()
        ),
        (json!(0), 5)
    );
    let again = r.c.call(
        "transcript.subscribe",
        json!({"sub_id": "x", "session_id": sid, "have_entries": 5}),
    );
    assert_eq!(
        again["from_index"],
        json!(4),
        "the last cached entry ends a turn: {again}"
    );
    let q =
        r.c.call("sessions.input", json!({"session_id": sid, "text": "more"}));
    assert_eq!(q["queued"], false);
    let ts = r.event(&sid, "turn.start");
    assert_eq!(ts["data"]["turn"], 2);
    r.event(&sid, "turn.end");
    let mut got: Vec<Value> = Vec::new();
    while !got
        .iter()
        .any(|e| e["kind"] == "turn_end" && e["id"] == "e7")
    {
        let n = r.c.next_note("transcript.delta");
        assert_eq!(n["params"]["sub_id"], "x");
        got.extend(n["params"]["entries"].as_array().unwrap().iter().cloned());
    }
    assert_eq!(
        r.c.call("transcript.unsubscribe", json!({"sub_id": "x"})),
        Value::Null
    );
    let rn = r.c.call(
        "session.rename",
        json!({"session_id": sid, "name": "  tidy  "}),
    );
    assert_eq!(rn, json!({"name": "tidy", "applied": true}));

    r.c.call("sessions.kill", json!({"session_id": sid}));
    let end = r.event(&sid, "session.end");
    assert!(
        end["data"].get("code").is_some() && end["data"].get("signal").is_some(),
        "{end}"
    );
    let s = r.state(&sid, "ended");
    assert_eq!(s["name"], "tidy");
    assert_eq!(
        r.kinds(&sid),
        [
            "session.start",
            "turn.start",
            "turn.end",
            "turn.start",
            "turn.end",
            "session.end"
        ]
    );
    assert_eq!(
        r.c.error_code("sessions.input", json!({"session_id": sid, "text": "x"})),
        "session-ended"
    );
    assert_eq!(
        r.c.error_code("sessions.get", json!({"session_id": "s-000000000000"})),
        "session-not-found"
    );
    assert_eq!(
        r.c.error_code("sessions.spawn", json!({"harness": "nope", "cwd": "/"})),
        "seat-not-found"
    );
    assert_eq!(
        r.c.error_code(
            "sessions.spawn",
            json!({"harness": "fake", "cwd": "relative"})
        ),
        "invalid-params"
    );
    r.d.stop();
}

#[test]
fn acp_every_event_sequence() {
    every_event_sequence(T::Acp);
}

#[test]
fn stream_json_every_event_sequence() {
    every_event_sequence(T::Sj);
}

fn approvals_by_operator(t: T) {
    let dir = TestDir::new(&format!("appr{}", t.name()));
    let script = json!([
        [t.permission("c1", "execute", json!({"command": "rm -rf /tmp/x"}))],
        [t.permission("c2", "execute", json!({"command": "ls"}))]
    ]);
    let mut r = Rig::start(&dir, seat("fake", t, &script, &[]));
    let sid = r.spawn("fake", Some("go"));
    let req = r.event(&sid, "approval.request");
    let id = format!("{sid}-a1");
    assert_eq!(
        req["data"],
        json!({"requestId": id, "action": "execute", "risk": "high"})
    );
    let s = r.state(&sid, "awaiting-approval");
    assert_eq!(s["pending_approvals"], 1);
    assert_eq!(s["interaction"]["request_id"], json!(id));
    let list = r.c.call("approvals.list", json!({}));
    assert_eq!(list["approvals"][0]["request_id"], json!(id));
    let digest = list["approvals"][0]["digest"].as_str().unwrap().to_string();
    assert_eq!(digest.len(), 64);
    assert_eq!(
        r.c.error_code(
            "approvals.answer",
            json!({"request_id": id, "decision": "allow", "digest": "00"})
        ),
        "action-mismatch"
    );
    let a = r.c.call(
        "approvals.answer",
        json!({"request_id": id, "decision": "allow", "digest": digest}),
    );
    assert_eq!(
        (
            a["decision"].clone(),
            a["delivered"].clone(),
            a["surface"].clone()
        ),
        (json!("allow"), json!(true), json!("socket"))
    );
    assert!(
        a["answered_by"].as_str().unwrap().starts_with("operator"),
        "{a}"
    );
    assert_eq!(
        r.event(&sid, "approval.resolved")["data"],
        json!({"requestId": id, "decision": "allow", "delivered": true})
    );
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "completed");
    // Used once.
    assert_eq!(
        r.c.error_code(
            "approvals.answer",
            json!({"request_id": id, "decision": "deny"})
        ),
        "not-pending"
    );

    r.c.call(
        "sessions.input",
        json!({"session_id": sid, "text": "again"}),
    );
    let id2 = format!("{sid}-a2");
    assert_eq!(
        r.event(&sid, "approval.request")["data"]["requestId"],
        json!(id2)
    );
    let a = r.c.call(
        "approvals.answer",
        json!({"request_id": id2, "decision": "deny", "reason": "not now"}),
    );
    assert_eq!(a["reason"], "not now");
    assert_eq!(
        r.event(&sid, "approval.resolved")["data"]["decision"],
        "deny"
    );
    r.event(&sid, "turn.end");
    let got = r.c.call("approvals.get", json!({"request_id": id2}));
    assert_eq!(got["state"], "resolved");
    assert_eq!(
        r.c.call("approvals.list", json!({"all": true}))["approvals"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    r.d.stop();
}

#[test]
fn acp_approvals_answered_by_the_operator() {
    approvals_by_operator(T::Acp);
}

#[test]
fn stream_json_approvals_answered_by_the_operator() {
    approvals_by_operator(T::Sj);
}

#[test]
fn interrupt_while_streaming_and_while_a_permission_waits() {
    for t in [T::Acp, T::Sj] {
        let dir = TestDir::new(&format!("intr{}", t.name()));
        let script = json!([[{"text": "a"}, {"stall": 30}], [t.permission("c1", "edit", json!({"path": "/x"}))], []]);
        let mut r = Rig::start(&dir, seat("fake", t, &script, &[]));
        let sid = r.spawn("fake", Some("one"));
        r.event(&sid, "turn.start");
        r.state(&sid, "running");
        assert_eq!(
            r.c.call("sessions.interrupt", json!({"session_id": sid}))["interrupted"],
            true
        );
        assert_eq!(
            r.event(&sid, "turn.end")["data"]["reason"],
            "interrupted",
            "{t:?}"
        );
        r.state(&sid, "idle");

        r.c.call("sessions.input", json!({"session_id": sid, "text": "two"}));
        r.event(&sid, "approval.request");
        r.c.call("sessions.interrupt", json!({"session_id": sid}));
        assert_eq!(
            r.event(&sid, "approval.resolved")["data"],
            json!({"requestId": format!("{sid}-a1"), "decision": "cancel", "delivered": true})
        );
        assert_eq!(
            r.event(&sid, "turn.end")["data"]["reason"],
            "interrupted",
            "{t:?}"
        );
        let e = r.entries(&sid);
        assert_eq!(e.last().unwrap()["interrupted"], true);
        // The session goes on.
        r.c.call(
            "sessions.input",
            json!({"session_id": sid, "text": "three"}),
        );
        assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "completed");
        r.d.stop();
    }
}

#[test]
fn prompts_queue_behind_the_running_turn_up_to_32() {
    let dir = TestDir::new("queue");
    let script = json!([[{"stall": 30}]]);
    let mut r = Rig::start(
        &dir,
        format!(
            "{}{}",
            seat("acp", T::Acp, &script, &[]),
            seat("sj", T::Sj, &script, &[])
        ),
    );
    let sid = r.spawn("acp", Some("long"));
    r.event(&sid, "turn.start");
    r.state(&sid, "running");
    let q =
        r.c.call("sessions.input", json!({"session_id": sid, "text": "next"}));
    assert_eq!(q, json!({"queued": true, "queue_length": 1}));
    for n in 2..=32 {
        assert_eq!(
            r.c.call(
                "sessions.input",
                json!({"session_id": sid, "text": format!("p{n}")})
            )["queue_length"],
            n
        );
    }
    assert_eq!(
        r.c.error_code(
            "sessions.input",
            json!({"session_id": sid, "text": "too many"})
        ),
        "queue-full"
    );
    assert_eq!(
        r.c.call("sessions.get", json!({"session_id": sid}))["queued"],
        32
    );
    r.c.call("sessions.interrupt", json!({"session_id": sid}));
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "interrupted");
    let next = r.event(&sid, "turn.start");
    assert_eq!(
        next["data"],
        json!({"turn": 2, "mode": "prompt", "chars": 4})
    );
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "completed");
    r.c.call("sessions.kill", json!({"session_id": sid}));

    // stream-json: the CLI holds the prompt and runs it as a `queue` turn.
    let sid = r.spawn("sj", Some("long"));
    r.event(&sid, "turn.start");
    assert_eq!(
        r.c.call(
            "sessions.input",
            json!({"session_id": sid, "text": "later"})
        )["queued"],
        true
    );
    r.c.call("sessions.interrupt", json!({"session_id": sid}));
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "interrupted");
    assert_eq!(r.event(&sid, "turn.start")["data"]["mode"], "queue");
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "completed");
    r.d.stop();
}

#[test]
fn sessions_survive_a_daemon_restart() {
    let dir = TestDir::new("restart");
    let acp_script = json!([[{"text": "one"}], [json!({"permission": {"id": "c1", "title": "Edit", "kind": "edit", "input": {}}})]]);
    let config = format!(
        "{}{}",
        seat("acp", T::Acp, &acp_script, &[("FAKE_LOAD", "1")]),
        seat("sj", T::Sj, &json!([]), &[])
    );
    let mut r = Rig::start(&dir, config.clone());
    let a = r.spawn("acp", Some("first"));
    r.event(&a, "turn.end");
    let acp_agent_sid = r.state(&a, "idle")["agent_session_id"].clone();
    let s = r.spawn("sj", Some("first"));
    r.event(&s, "turn.end");
    let sj_agent_sid = r.state(&s, "idle")["agent_session_id"].clone();
    // A permission waits when the daemon stops.
    r.c.call("sessions.input", json!({"session_id": a, "text": "second"}));
    r.event(&a, "approval.request");
    r.d.stop();

    let mut r = Rig::start(&dir, config);
    let back = r.state(&a, "idle");
    assert_eq!(back["agent_session_id"], acp_agent_sid);
    assert_eq!(back["turn"], 2);
    let stream = r.stream(&a);
    let tail: Vec<&(String, Value)> = stream.iter().rev().take(2).collect();
    assert!(
        tail.iter().any(|(k, d)| k == "approval.resolved"
            && d["delivered"] == false
            && d["decision"] == "cancel"),
        "{stream:?}"
    );
    assert!(
        tail.iter()
            .any(|(k, d)| k == "turn.end" && d["reason"] == "interrupted"),
        "{stream:?}"
    );
    let last = stream.len() as i64;
    r.c.call("sessions.input", json!({"session_id": a, "text": "third"}));
    assert_eq!(r.event_after(&a, "turn.start", last)["data"]["turn"], 3);
    assert_eq!(
        r.event_after(&a, "turn.end", last)["data"]["reason"],
        "completed"
    );

    r.state(&s, "idle");
    r.c.call("sessions.input", json!({"session_id": s, "text": "again"}));
    assert_eq!(r.event(&s, "turn.end")["data"]["reason"], "completed");
    // The CLI was started with --resume: the same agent session.
    assert_eq!(
        r.c.call("sessions.get", json!({"session_id": s}))["agent_session_id"],
        sj_agent_sid
    );
    assert!(!r.kinds(&s).contains(&"session.end".to_string()));
    r.d.stop();
}

#[test]
fn a_misbehaving_agent_ends_its_turn_failed_and_the_others_go_on() {
    let dir = TestDir::new("misbehave");
    let config = [
        seat(
            "invalid",
            T::Acp,
            &json!([[{"text": "a"}, {"invalid": "this is not json"}]]),
            &[],
        ),
        seat(
            "oversized",
            T::Sj,
            &json!([[{"oversized": 17_000_000}]]),
            &[],
        ),
        seat("crash", T::Acp, &json!([[{"text": "a"}, {"exit": 3}]]), &[]),
        format!(
            "{}stall_timeout = 1\n\n",
            seat("stall", T::Sj, &json!([[{"stall": 60}]]), &[])
        ),
        seat("good", T::Acp, &json!([]), &[]),
    ]
    .concat();
    let mut r = Rig::start(&dir, config);
    let good = r.spawn("good", None);
    r.state(&good, "idle");
    let bad: Vec<String> = ["invalid", "oversized", "crash", "stall"]
        .iter()
        .map(|h| r.spawn(h, Some("go")))
        .collect();
    for sid in &bad {
        assert_eq!(
            r.event(sid, "turn.end")["data"]["reason"],
            "failed",
            "{sid}"
        );
        r.event(sid, "session.end");
    }
    let crash_end = r
        .stream(&bad[2])
        .into_iter()
        .find(|(k, _)| k == "session.end")
        .unwrap()
        .1;
    assert_eq!(crash_end, json!({"code": 3, "signal": null}));
    for (sid, why) in bad.iter().zip([
        "broke its transport",
        "broke its transport",
        "exited",
        "stalled",
    ]) {
        let e = r.entries(sid);
        assert!(
            e.iter()
                .any(|x| x["kind"] == "system" && x["text"].as_str().unwrap_or("").contains(why)),
            "{sid} {why}: {e:?}"
        );
    }
    r.d.wait_log("broke its transport with a line that is not JSON");
    r.d.wait_log("broke its transport with a line over");
    r.d.wait_log("exited mid-turn");
    r.c.call(
        "sessions.input",
        json!({"session_id": good, "text": "still here"}),
    );
    assert_eq!(r.event(&good, "turn.end")["data"]["reason"], "completed");
    r.d.stop();
}

#[test]
fn an_agent_cannot_answer_its_own_approval_even_after_escaping() {
    let dir = TestDir::new("selfappr");
    let socket = dir.join("run/d.sock").display().to_string();
    let helper = fixture("answer_own_approval.py");
    let script = json!([[
        {"spawn": ["python3", helper, "direct"]},
        {"spawn": ["python3", helper, "escape"]},
        {"permission": {"id": "c1", "title": "Run", "kind": "execute", "input": {"command": "curl evil"}}}
    ]]);
    // Uncontained: the namespace would hide the socket (tests/containment.rs);
    // here the classification behind it is tested.
    let mut r = Rig::start(
        &dir,
        format!(
            "[agents]\nisolation = \"none\"\n\n{}",
            seat("fake", T::Acp, &script, &[("OMNI_SOCKET", &socket)])
        ),
    );
    let sid = r.spawn("fake", Some("go"));
    r.event(&sid, "approval.request");
    r.d.wait_log_count("refused approvals.answer", 2);
    let log = r.d.log_text();
    assert!(
        log.contains("from a caller of class agent-session"),
        "{log}"
    );
    let id = format!("{sid}-a1");
    assert_eq!(
        r.c.call("approvals.get", json!({"request_id": id}))["state"],
        "pending"
    );
    r.c.call(
        "approvals.answer",
        json!({"request_id": id, "decision": "allow"}),
    );
    assert_eq!(
        r.event(&sid, "approval.resolved")["data"]["delivered"],
        true
    );
    r.d.stop();
}

#[test]
fn approvals_answered_by_a_rule_and_by_the_timeout() {
    let dir = TestDir::new("rules");
    let wt = dir.join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    let inside = wt
        .canonicalize()
        .unwrap()
        .join("a.txt")
        .display()
        .to_string();
    let script = json!([[
        {"permission": {"id": "r1", "title": "Read a", "kind": "read", "input": {"path": inside}}},
        {"permission": {"id": "e1", "title": "Edit a", "kind": "edit", "input": {"path": inside}}}
    ]]);
    let rules = "[approvals]\ntimeout = 1\nfallback = \"deny\"\n\n[[approvals.rule]]\naction = \"read\"\ninside_worktree = true\nanswer = \"allow\"\n\n";
    let mut r = Rig::start(
        &dir,
        format!("{rules}{}", seat("fake", T::Acp, &script, &[])),
    );
    let sid = r.spawn("fake", Some("go"));
    assert_eq!(r.event(&sid, "approval.request")["data"]["risk"], "low");
    assert_eq!(
        r.event(&sid, "approval.resolved")["data"],
        json!({"requestId": format!("{sid}-a1"), "decision": "allow", "delivered": true})
    );
    let a1 =
        r.c.call("approvals.get", json!({"request_id": format!("{sid}-a1")}));
    assert_eq!(
        (a1["answered_by"].clone(), a1["surface"].clone()),
        (json!("rule 1"), json!("config-rule"))
    );
    assert_eq!(r.event(&sid, "approval.request")["data"]["risk"], "medium");
    assert_eq!(
        r.event(&sid, "approval.resolved")["data"]["decision"],
        "deny"
    );
    let a2 =
        r.c.call("approvals.get", json!({"request_id": format!("{sid}-a2")}));
    assert_eq!(
        (a2["answered_by"].clone(), a2["surface"].clone()),
        (json!("timeout"), json!("timer"))
    );
    r.event(&sid, "turn.end");
    r.d.stop();

    // The other fallback: withdrawn, delivered false, and the agent unblocked.
    let dir = TestDir::new("withdraw");
    let script =
        json!([[{"permission": {"id": "e1", "title": "Edit", "kind": "edit", "input": {}}}]]);
    let mut r = Rig::start(
        &dir,
        format!(
            "[approvals]\ntimeout = 1\nfallback = \"withdraw\"\n\n{}",
            seat("fake", T::Acp, &script, &[])
        ),
    );
    let sid = r.spawn("fake", Some("go"));
    assert_eq!(
        r.event(&sid, "approval.resolved")["data"],
        json!({"requestId": format!("{sid}-a1"), "decision": "cancel", "delivered": false})
    );
    r.event(&sid, "turn.end");
    r.d.stop();
}

#[test]
fn seats_are_probed_and_the_command_line_drives_sessions() {
    let dir = TestDir::new("seatscli");
    let not_exec = dir.join("agent-not-exec");
    std::fs::write(&not_exec, "#!/bin/sh\n").unwrap();
    let script =
        json!([[{"permission": {"id": "c1", "title": "Run", "kind": "execute", "input": {}}}]]);
    let config = format!(
        "{}[[seat]]\nharness = \"gone\"\ncommand = \"/nonexistent/agent\"\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\n\n\
         [[seat]]\nharness = \"blocked\"\ncommand = \"{}\"\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\n",
        seat("fake", T::Acp, &script, &[]),
        not_exec.display()
    );
    let mut r = Rig::start(&dir, config);
    r.d.wait_log("seat fake: ready");
    r.d.wait_log("seat gone: missing");
    r.d.wait_log("seat blocked: degraded");
    let seats = r.c.call("seats.list", json!({}))["seats"].clone();
    assert_eq!(seats[0]["status"], "ready");
    assert_eq!(seats[1]["status"], "missing");
    assert!(
        seats[2]["reason"]
            .as_str()
            .unwrap()
            .contains("not executable"),
        "{seats}"
    );
    assert_eq!(
        r.c.error_code("sessions.spawn", json!({"harness": "gone", "cwd": "/"})),
        "seat-not-ready"
    );

    let sock = r.d.socket.display().to_string();
    let cli = |args: &[&str]| {
        let mut all = vec!["--socket", sock.as_str()];
        all.extend_from_slice(args);
        let (code, out, err) = run_cli(&all);
        assert_eq!(code, 0, "{args:?}: {err}");
        out
    };
    let out = cli(&["seats"]);
    assert!(
        out.contains("fake") && out.contains("ready") && out.contains("missing"),
        "{out}"
    );
    let wt = r.wt.display().to_string();
    let sid = cli(&["sessions", "spawn", "fake", &wt, "hello"])
        .trim()
        .to_string();
    r.event(&sid, "approval.request");
    let out = cli(&["approvals"]);
    assert!(
        out.contains(&format!("{sid}-a1")) && out.contains("high"),
        "{out}"
    );
    let out = cli(&["approvals", "deny", &format!("{sid}-a1"), "no thanks"]);
    assert!(out.contains("deny"), "{out}");
    r.event(&sid, "turn.end");
    let out = cli(&["sessions"]);
    assert!(out.contains(&sid) && out.contains("idle"), "{out}");
    let v: Value = serde_json::from_str(&cli(&["--json", "sessions", "get", &sid])).unwrap();
    assert_eq!(v["turn"], 1);
    assert!(cli(&["sessions", "input", &sid, "more"]).contains("sent"));
    r.event(&sid, "turn.end");
    cli(&["sessions", "interrupt", &sid]);
    cli(&["sessions", "kill", &sid]);
    r.event(&sid, "session.end");
    r.d.stop();
}

/// Where tests/fixtures/install-acp-example.sh puts the example agent.
fn acp_example() -> Option<(PathBuf, PathBuf)> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(".."));
    let base = target.join("acp-example");
    let tsx = base.join("node_modules/.bin/tsx");
    let agent = base
        .join("node_modules/@zed-industries/agent-client-protocol/typescript/examples/agent.ts");
    (tsx.exists() && agent.exists()).then_some((tsx, agent))
}

#[test]
fn an_agent_no_one_on_the_team_wrote() {
    let Some((tsx, agent)) = acp_example() else {
        println!(
            "skipped: the ACP example agent is not installed; run tests/fixtures/install-acp-example.sh first"
        );
        return;
    };
    let dir = TestDir::new("zedexample");
    let config = format!(
        "[[seat]]\nharness = \"example\"\ncommand = \"{}\"\nargs = [\"{}\"]\ntransport = \"acp\"\nprovider = \"zed\"\nfamily = \"local\"\n",
        tsx.display(),
        agent.display()
    );
    let mut r = Rig::start(&dir, config);
    r.d.wait_log("seat example: ready");
    let sid = r.spawn("example", Some("hello"));
    // Allowed.
    let req = r.event(&sid, "approval.request");
    assert_eq!(req["data"]["action"], "edit");
    r.c.call(
        "approvals.answer",
        json!({"request_id": format!("{sid}-a1"), "decision": "allow"}),
    );
    assert_eq!(
        r.event(&sid, "approval.resolved")["data"]["decision"],
        "allow"
    );
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "completed");
    // Rejected.
    r.c.call(
        "sessions.input",
        json!({"session_id": sid, "text": "again"}),
    );
    r.event(&sid, "approval.request");
    r.c.call(
        "approvals.answer",
        json!({"request_id": format!("{sid}-a2"), "decision": "deny"}),
    );
    assert_eq!(
        r.event(&sid, "approval.resolved")["data"]["decision"],
        "deny"
    );
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "completed");
    // Cancelled while the permission waits.
    r.c.call(
        "sessions.input",
        json!({"session_id": sid, "text": "once more"}),
    );
    r.event(&sid, "approval.request");
    r.c.call("sessions.interrupt", json!({"session_id": sid}));
    assert_eq!(
        r.event(&sid, "approval.resolved")["data"],
        json!({"requestId": format!("{sid}-a3"), "decision": "cancel", "delivered": true})
    );
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "interrupted");
    let kinds: Vec<String> = r
        .entries(&sid)
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(
        kinds.contains(&"tool".to_string())
            && kinds.iter().filter(|k| *k == "turn_end").count() == 3,
        "{kinds:?}"
    );
    r.d.stop();
}
