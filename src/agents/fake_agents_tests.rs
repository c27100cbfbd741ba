//! Drives the scripted fake agents of `tests/fixtures/` as real child
//! processes through the transport cores, so the fakes the daemon's
//! integration tests will use are proven to speak what the cores (and,
//! through the recording replays, the real agents) speak.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use super::acp::{AcpClient, AcpConfig};
use super::stream_json::StreamJsonClient;
use super::{AgentEvent, Decision, EndReason, Entry, Step, ToolStatus, Violation};

/// How long a test waits for the next line; generous, never a measure.
const WAIT: Duration = Duration::from_secs(30);

trait Core {
    fn feed(&mut self, line: &[u8]) -> Result<Step, Violation>;
    fn exited(&mut self, code: Option<i32>) -> Step;
    fn interrupt_now(&mut self) -> Step;
    fn answer(&mut self, key: &str, d: Decision) -> Step;
    fn send(&mut self, text: &str) -> Step;
}

impl Core for AcpClient {
    fn feed(&mut self, line: &[u8]) -> Result<Step, Violation> {
        self.on_line(line)
    }
    fn exited(&mut self, code: Option<i32>) -> Step {
        self.on_exit(code)
    }
    fn interrupt_now(&mut self) -> Step {
        self.interrupt()
    }
    fn answer(&mut self, key: &str, d: Decision) -> Step {
        self.answer_permission(key, d).expect("open request")
    }
    fn send(&mut self, text: &str) -> Step {
        self.prompt(text.to_string()).expect("prompt")
    }
}

impl Core for StreamJsonClient {
    fn feed(&mut self, line: &[u8]) -> Result<Step, Violation> {
        self.on_line(line)
    }
    fn exited(&mut self, code: Option<i32>) -> Step {
        self.on_exit(code)
    }
    fn interrupt_now(&mut self) -> Step {
        self.interrupt()
    }
    fn answer(&mut self, key: &str, d: Decision) -> Step {
        self.answer_permission(key, d).expect("open request")
    }
    fn send(&mut self, text: &str) -> Step {
        self.prompt(text.to_string()).expect("prompt")
    }
}

struct Fake {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Vec<u8>>,
}

impl Fake {
    fn spawn(file: &str, script: &str) -> Fake {
        let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests", "fixtures", file]
            .iter()
            .collect();
        let mut child = Command::new("python3")
            .arg(path)
            .env("FAKE_SCRIPT", script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut buf = Vec::new();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        if tx.send(buf).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Fake {
            child,
            stdin,
            lines,
        }
    }

    fn write(&mut self, step: &Step) {
        for w in &step.writes {
            self.stdin.write_all(w).expect("write to the fake");
        }
        self.stdin.flush().expect("flush");
    }

    /// Feeds every line into `core`, writes what it answers, lets `react`
    /// act on each event, until `done` holds for the events so far. Ends
    /// with the agent's exit when its stdout closes first.
    fn drive<C: Core>(
        &mut self,
        core: &mut C,
        events: &mut Vec<AgentEvent>,
        react: &mut dyn FnMut(&mut C, &AgentEvent) -> Option<Step>,
        done: &dyn Fn(&[AgentEvent]) -> bool,
    ) -> Result<(), Violation> {
        while !done(events) {
            let step = match self.lines.recv_timeout(WAIT) {
                Ok(line) => core.feed(&line)?,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().expect("wait");
                    let s = core.exited(status.code());
                    events.extend(s.events);
                    return Ok(());
                }
                Err(e) => panic!("the fake agent said nothing: {e}; events so far {events:?}"),
            };
            self.write(&step);
            for e in step.events {
                if let Some(answer) = react(core, &e) {
                    self.write(&answer);
                    events.extend(answer.events);
                }
                events.push(e);
            }
        }
        Ok(())
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ends(events: &[AgentEvent]) -> Vec<EndReason> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::TurnEnded { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

fn ended_n(n: usize) -> impl Fn(&[AgentEvent]) -> bool {
    move |ev| ends(ev).len() >= n
}

/// A fake and its core, started with the prompt "hello"; the events of
/// starting are the first of the scenario.
fn acp(script: &str) -> (Fake, AcpClient, Vec<AgentEvent>) {
    let mut fake = Fake::spawn("fake_acp_agent.py", script);
    let mut core = AcpClient::new(AcpConfig {
        worktree: PathBuf::from("/tmp"),
        reopen: None,
    });
    let s = core.start(Some("hello".into())).expect("start");
    fake.write(&s);
    (fake, core, s.events)
}

fn cc(script: &str) -> (Fake, StreamJsonClient, Vec<AgentEvent>) {
    let mut fake = Fake::spawn("fake_stream_json_agent.py", script);
    let mut core = StreamJsonClient::new();
    let s = core.start(Some("hello".into())).expect("start");
    fake.write(&s);
    (fake, core, s.events)
}

/// What a scenario does in answer to an event.
#[derive(Clone, Copy)]
enum Reaction {
    Nothing,
    Interrupt,
    Answer(DecisionKind),
}

#[derive(Clone, Copy)]
enum DecisionKind {
    Allow,
    Deny,
}

fn run<C: Core>(
    (mut fake, mut core, mut events): (Fake, C, Vec<AgentEvent>),
    rule: &dyn Fn(&AgentEvent) -> Reaction,
    turns: usize,
) -> Vec<AgentEvent> {
    let mut react = |c: &mut C, e: &AgentEvent| match rule(e) {
        Reaction::Nothing => None,
        Reaction::Interrupt => Some(c.interrupt_now()),
        Reaction::Answer(k) => {
            let AgentEvent::PermissionRequest(p) = e else {
                return None;
            };
            let d = match k {
                DecisionKind::Allow => Decision::Allow,
                DecisionKind::Deny => Decision::Deny {
                    message: Some("no".into()),
                },
            };
            Some(c.answer(&p.agent_request_key, d))
        }
    };
    fake.drive(&mut core, &mut events, &mut react, &ended_n(turns))
        .expect("no violation");
    events
}

fn on_permission(k: DecisionKind) -> impl Fn(&AgentEvent) -> Reaction {
    move |e| match e {
        AgentEvent::PermissionRequest(_) => Reaction::Answer(k),
        _ => Reaction::Nothing,
    }
}

fn interrupt_on(pred: fn(&AgentEvent) -> bool) -> impl Fn(&AgentEvent) -> Reaction {
    move |e| {
        if pred(e) {
            Reaction::Interrupt
        } else {
            Reaction::Nothing
        }
    }
}

/// Runs one scenario against both fakes: [acp events, stream-json events].
fn scenario(
    script: &str,
    rule: &dyn Fn(&AgentEvent) -> Reaction,
    turns: usize,
) -> [Vec<AgentEvent>; 2] {
    [run(acp(script), rule, turns), run(cc(script), rule, turns)]
}

#[test]
fn default_turn_echoes() {
    for ev in scenario("[]", &|_| Reaction::Nothing, 1) {
        assert!(
            ev.contains(&AgentEvent::Transcript(Entry::Text {
                text: "echo: hello".into()
            })),
            "{ev:?}"
        );
        assert_eq!(ends(&ev), vec![EndReason::Completed]);
        assert!(ev.iter().any(|e| matches!(e, AgentEvent::Ready { .. })));
    }
}

#[test]
fn allow() {
    let script = r#"[[{"text":"let me"},{"permission":{"id":"t1"}},{"text":"done"}]]"#;
    for ev in scenario(script, &on_permission(DecisionKind::Allow), 1) {
        let completed = ev.iter().any(|e| {
            matches!(e, AgentEvent::Transcript(Entry::Tool(t)) if t.status == Some(ToolStatus::Completed))
        });
        assert!(completed, "{ev:?}");
        assert_eq!(ends(&ev), vec![EndReason::Completed]);
    }
}

#[test]
fn deny() {
    let script = r#"[[{"permission":{"id":"t1"}}]]"#;
    let [a, b] = scenario(script, &on_permission(DecisionKind::Deny), 1);
    assert_eq!(ends(&a), vec![EndReason::Completed]);
    assert!(a.iter().any(
        |e| matches!(e, AgentEvent::Transcript(Entry::Text { text }) if text.contains("prefer not"))
    ));
    assert_eq!(ends(&b), vec![EndReason::Completed]);
    let failed = b.iter().any(|e| {
        matches!(e, AgentEvent::Transcript(Entry::Tool(t)) if t.status == Some(ToolStatus::Failed)
            && t.result == Some(serde_json::json!("no")))
    });
    assert!(failed, "{b:?}");
}

#[test]
fn interrupt_while_streaming() {
    let script = r#"[[{"text":"partial"},{"stall":30},{"text":"never"}]]"#;
    let rule = interrupt_on(|e| matches!(e, AgentEvent::Transcript(Entry::Text { .. })));
    for ev in scenario(script, &rule, 1) {
        assert_eq!(ends(&ev), vec![EndReason::Interrupted], "{ev:?}");
        assert!(!ev.contains(&AgentEvent::Transcript(Entry::Text {
            text: "never".into()
        })));
    }
}

#[test]
fn interrupt_during_permission() {
    let script = r#"[[{"permission":{"id":"t1"}},{"text":"never"}]]"#;
    let rule = interrupt_on(|e| matches!(e, AgentEvent::PermissionRequest(_)));
    for ev in scenario(script, &rule, 1) {
        assert_eq!(ends(&ev), vec![EndReason::Interrupted], "{ev:?}");
        assert!(ev.iter().any(|e| matches!(
            e,
            AgentEvent::PermissionClosed {
                delivered: true,
                ..
            }
        )));
    }
}

#[test]
fn rate_limit() {
    for ev in scenario(r#"[[{"ratelimit":true}]]"#, &|_| Reaction::Nothing, 1) {
        assert_eq!(ends(&ev), vec![EndReason::UsageLimited], "{ev:?}");
    }
}

#[test]
fn queue() {
    let script = r#"[[{"text":"one"},{"stall":0.5}],[{"text":"two"}]]"#;
    let starts = |ev: &[AgentEvent]| {
        ev.iter()
            .filter(|e| matches!(e, AgentEvent::TurnStarted { .. }))
            .count()
    };
    // The second prompt is given as soon as the first turn speaks.
    let (mut f, mut c, mut ev) = acp(script);
    let mut sent = false;
    let mut react = |c: &mut AcpClient, e: &AgentEvent| {
        if sent || !matches!(e, AgentEvent::Transcript(Entry::Text { .. })) {
            return None;
        }
        sent = true;
        Some(c.send("second"))
    };
    f.drive(&mut c, &mut ev, &mut react, &ended_n(2))
        .expect("no violation");
    assert_eq!(starts(&ev), 2);
    assert_eq!(ends(&ev), vec![EndReason::Completed, EndReason::Completed]);

    let (mut f, mut c, mut ev) = cc(script);
    let mut sent = false;
    let mut react = |c: &mut StreamJsonClient, e: &AgentEvent| {
        if sent || !matches!(e, AgentEvent::Transcript(Entry::Text { .. })) {
            return None;
        }
        sent = true;
        Some(c.send("second"))
    };
    f.drive(&mut c, &mut ev, &mut react, &ended_n(2))
        .expect("no violation");
    assert_eq!(starts(&ev), 2);
    assert_eq!(ends(&ev), vec![EndReason::Completed, EndReason::Completed]);
    assert!(ev.contains(&AgentEvent::Transcript(Entry::Text { text: "two".into() })));
}

#[test]
fn invalid_line_is_a_violation() {
    let script = r#"[[{"text":"a"},{"invalid":"this is not JSON"}]]"#;
    let (mut f, mut c, _) = acp(script);
    let v = f
        .drive(&mut c, &mut Vec::new(), &mut |_, _| None, &ended_n(1))
        .expect_err("violation");
    assert!(v.turn_was_active);
    let (mut f, mut c, _) = cc(script);
    let v = f
        .drive(&mut c, &mut Vec::new(), &mut |_, _| None, &ended_n(1))
        .expect_err("violation");
    assert!(v.turn_was_active);
}

#[test]
fn crash_fails_the_turn() {
    for ev in scenario(r#"[[{"text":"a"},{"exit":3}]]"#, &|_| Reaction::Nothing, 1) {
        let detail = ev.iter().find_map(|e| match e {
            AgentEvent::TurnEnded {
                reason: EndReason::Failed,
                detail,
            } => detail.clone(),
            _ => None,
        });
        assert_eq!(
            detail.as_deref(),
            Some("the agent exited with status 3"),
            "{ev:?}"
        );
    }
}
