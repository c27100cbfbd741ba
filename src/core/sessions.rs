//! Sessions: an agent of a seat started in a worktree and driven through
//! its transport core (issue 3, "Sessions" and "Transports"; seed 000,
//! sessions.list and the session, turn and approval events; seed 004,
//! Sessions).
//!
//! A session's agent is a child in its own process group with a
//! constructed environment (the daemon's socket path is not in it). Every
//! line it writes goes through the transport core; what the core reports
//! becomes ledger writes in the session's stream (named by the session id):
//! session.start, turn.start, turn.end, approval.request,
//! approval.resolved, session.end, plus the session row and transcript
//! entries. All lines of one wake-up are one ledger batch; the session's
//! `session.event` and the transcript deltas go out after it commits, the
//! deltas of batches committed together merged into one line per
//! subscriber. A batch of text chunks only rewrites the session row when
//! the transcript got a new entry or the session changed.
//!
//! An agent that breaks its transport (an invalid or oversized line), that
//! stalls in a turn, or that stops reading its stdin ends its turn failed,
//! with the reason in the log and the transcript, and is stopped (SIGTERM
//! to its group, SIGKILL after `AGENT_KILL_GRACE_MS`); the session ends
//! when it exits, with its code and signal. An agent whose stdin queue is
//! full fails its turn once the step whose lines filled it is applied.
//!
//! An agent runs in the namespace of `crate::isolation` unless `[agents]
//! isolation` is `none` or bubblewrap cannot work here (then the log says
//! so once, and `server.info` and `seats.list` report `agent_isolation`).
//! A spawn that arrives before the machine's bubblewrap probe has answered
//! waits for it (a few milliseconds after start), so that no agent starts
//! uncontained only because it came early.
//!
//! A daemon stop SIGTERMs every agent without recording their ends; the
//! next start reopens each live session whose agent gave an agent session
//! id (ACP session/resume or session/load, stream-json `--resume`), after
//! closing the turn that was running as interrupted and withdrawing every
//! pending approval (delivered false). A session the caller of `restore`
//! names as not needed (a lane's verifier, whose verification starts over)
//! ends instead.
//!
//! The driver (DESIGN.md, "How subsystems talk"; issue 11): [`Sessions`]
//! changes only through its methods, which take what they need (the seats,
//! the isolation mode, the time, what the router read of a child) and
//! return [`Effect`]s in the order things happened: the round's ledger
//! records, lines for an agent's stdin, stopping and killing an agent,
//! timers with a typed key ([`Timer`]), an agent's permission request for
//! the approvals inbox, the withdrawal of an approval, a sign-in state for
//! the seats, a start to launch, the read of the last run. Nothing here
//! knows the daemon, a surface, the inbox's state or the lanes; the router
//! (daemon/router/sessions.rs) applies the effects, feeds an agent's lines
//! one at a time, and ends each round with [`Sessions::finish`]. An
//! operator's answer comes back through [`Sessions::answer`], so the
//! re-entrant chain of an answer inside an agent's line is gone: a rule's
//! answer to a request is delivered after the line that asked is handled.
//!
//! What other subsystems and the surfaces get from here is typed, never a
//! surface's JSON: [`Sessions::spawn`] takes a [`SpawnRequest`] and the
//! router answers [`Spawned`]; `input`, `interrupt` and `kill` answer
//! [`Accepted`], a bool and [`Killed`]; a session's [`State`] and
//! [`Summary`] carry no wire names (each surface names the state once, in
//! its own view).

use rusqlite::types::Value as Sql;
use serde::Deserialize;
use serde_json::{Value, json};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::agents::acp::{AcpClient, AcpConfig, ChunkKind};
use crate::agents::stream_json::{self, StreamJsonClient};
use crate::agents::{
    AgentEvent, Capabilities, CommandError, Decision, EndReason, Entry, FsRequest, Interaction,
    PermissionRequest, Retry, Step, Transport, Violation,
};
use crate::children::{ChildId, ExitStatus};
use crate::config::AgentIsolation;
use crate::core::ReplyKey;
use crate::core::approvals;
use crate::core::seats::{Seat, Seats, Status as SeatStatus};
use crate::core::transcript::{Delta, Transcript};
use crate::errors::{Code, RpcError};
use crate::isolation::{AgentSandbox, Hidden};
use crate::ledger::Op;
use crate::limits;
use crate::procs::{CallerClass, signal_name};

const UPSERT_ROW: &str = "INSERT INTO sessions (id, harness, provider, transport, cwd, name, parent, model, created_at, agent_session_id, \
     ended, turn, turn_active, end_reason, exit_code, exit_signal, input_tokens, output_tokens, last_activity, next_request, transcript_len) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21) \
     ON CONFLICT (id) DO UPDATE SET name = excluded.name, model = excluded.model, agent_session_id = excluded.agent_session_id, \
     ended = excluded.ended, turn = excluded.turn, turn_active = excluded.turn_active, end_reason = excluded.end_reason, \
     exit_code = excluded.exit_code, exit_signal = excluded.exit_signal, input_tokens = excluded.input_tokens, \
     output_tokens = excluded.output_tokens, last_activity = excluded.last_activity, next_request = excluded.next_request, \
     transcript_len = excluded.transcript_len";

/// The transport core of a session.
pub enum Driver {
    Acp(AcpClient),
    StreamJson(StreamJsonClient),
}

impl Driver {
    fn start(&mut self, prompt: Option<String>) -> Result<Step, CommandError> {
        match self {
            Driver::Acp(c) => c.start(prompt),
            Driver::StreamJson(c) => c.start(prompt),
        }
    }
    fn prompt(&mut self, text: String) -> Result<Step, CommandError> {
        match self {
            Driver::Acp(c) => c.prompt(text),
            Driver::StreamJson(c) => c.prompt(text),
        }
    }
    fn interrupt(&mut self) -> Step {
        match self {
            Driver::Acp(c) => c.interrupt(),
            Driver::StreamJson(c) => c.interrupt(),
        }
    }
    pub fn answer(&mut self, key: &str, d: Decision) -> Result<Step, CommandError> {
        match self {
            Driver::Acp(c) => c.answer_permission(key, d),
            Driver::StreamJson(c) => c.answer_permission(key, d),
        }
    }
    fn on_line(&mut self, line: &[u8]) -> Result<Step, Violation> {
        match self {
            Driver::Acp(c) => c.on_line(line),
            Driver::StreamJson(c) => c.on_line(line),
        }
    }
    /// A streamed text chunk of the line, borrowed, when the transport
    /// would make it one transcript entry and nothing else (acp's
    /// `text_chunk`): the entry kind and the text.
    fn text_chunk<'a>(&self, line: &'a [u8]) -> Option<(&'static str, Cow<'a, str>)> {
        match self {
            Driver::Acp(c) => c.text_chunk(line).map(|(k, t)| {
                let kind = match k {
                    ChunkKind::Text => "text",
                    ChunkKind::Thinking => "thinking",
                };
                (kind, t)
            }),
            Driver::StreamJson(_) => None,
        }
    }
    fn on_exit(&mut self, code: Option<i32>) -> Step {
        match self {
            Driver::Acp(c) => c.on_exit(code),
            Driver::StreamJson(c) => c.on_exit(code),
        }
    }
    fn queued(&self) -> usize {
        match self {
            Driver::Acp(c) => c.queued(),
            Driver::StreamJson(c) => c.queued(),
        }
    }
}

/// An approval of this session still waiting.
pub struct OpenAsk {
    pub key: String,
    pub approval_id: String,
    /// The request's title (`PermissionRequest::title`).
    pub tool: String,
    /// The tool's own name (`PermissionRequest::tool`).
    pub tool_name: String,
    pub preview: String,
    /// What it asks: a permission, a question, a plan.
    pub interaction: Interaction,
}

pub struct Session {
    pub id: String,
    pub harness: String,
    pub provider: String,
    pub transport: Transport,
    pub cwd: PathBuf,
    pub name: Option<String>,
    pub parent: Option<String>,
    pub model: Option<String>,
    pub created_at: String,
    pub agent_session_id: Option<String>,
    pub capabilities: Capabilities,
    pub ready: bool,
    pub ended: bool,
    pub turn: u64,
    pub turn_active: bool,
    pub end_reason: Option<EndReason>,
    pub exit: Option<ExitStatus>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub last_activity_ms: Option<i64>,
    pub status_since_ms: i64,
    /// The harness retries a failed API call (since when): shown as the
    /// `rate-limited` (429) or `retrying` status label and `retry`.
    pub retry: Option<(Retry, i64)>,
    pub next_request: u64,
    pub open: Vec<OpenAsk>,
    pub transcript: Transcript,
    pub driver: Option<Driver>,
    child: Option<ChildId>,
    /// Exit seen while stdout was still open: finish once it closes.
    exit_pending: Option<ExitStatus>,
    stopping_agent: bool,
    last_line: Instant,
    stall: Duration,
    stall_timer: Option<Timer>,
    last_state: State,
    /// `transcript_len` as last written to the session's row.
    row_transcript_len: usize,
    /// Something of the row changed since the last round was finished.
    changed: bool,
}

/// Where a session is. Each surface names it in its own view, one name
/// per state: the socket's `state` and the plugin wire's `state` (issue 3,
/// seed 000) in [`State::wire_name`], the socket's seed 004 `status` in
/// `to_socket`, and the HTTP API's `phase` in `http::sessions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// The agent is not set up yet (an ACP agent before its handshake).
    Starting,
    /// No turn runs.
    Idle,
    /// A turn runs.
    Running,
    /// A turn waits for the operator to answer an approval.
    AwaitingApproval,
    /// The agent is gone.
    Ended,
}

impl State {
    /// The name the daemon socket's and the plugin wire's `state` give it.
    pub fn wire_name(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Idle => "idle",
            State::Running => "running",
            State::AwaitingApproval => "awaiting-approval",
            State::Ended => "ended",
        }
    }
}

impl Session {
    pub fn state(&self) -> State {
        if self.ended {
            State::Ended
        } else if !self.ready {
            State::Starting
        } else if !self.open.is_empty() {
            State::AwaitingApproval
        } else if self.turn_active {
            State::Running
        } else {
            State::Idle
        }
    }

    pub fn queued(&self) -> usize {
        self.driver.as_ref().map_or(0, Driver::queued)
    }

    /// Whether the daemon is stopping the session's agent (an interrupt's
    /// or an end's cleanup): the agent takes no prompt until it is gone.
    pub fn stopping_agent(&self) -> bool {
        self.stopping_agent
    }

    pub fn can_prompt(&self) -> bool {
        !self.ended
            && self.ready
            && !self.turn_active
            && self.open.is_empty()
            && !self.stopping_agent
    }

    /// What the lanes and the plugin host read of the session.
    pub fn summary(&self) -> Summary<'_> {
        Summary {
            id: &self.id,
            harness: &self.harness,
            provider: &self.provider,
            transport: self.transport,
            cwd: &self.cwd,
            parent: self.parent.as_deref(),
            created_at: &self.created_at,
            agent_session_id: self.agent_session_id.as_deref(),
            state: self.state(),
            ready: self.ready,
            turn: self.turn,
            turn_active: self.turn_active,
            end_reason: self.end_reason,
            pending_approvals: self.open.len(),
            busy: self.queued() > 0 || self.stopping_agent,
        }
    }

    fn row_op(&self) -> Op {
        let text = |s: &Option<String>| s.clone().map(Sql::Text).unwrap_or(Sql::Null);
        Op::Exec {
            sql: UPSERT_ROW,
            params: vec![
                Sql::Text(self.id.clone()),
                Sql::Text(self.harness.clone()),
                Sql::Text(self.provider.clone()),
                Sql::Text(self.transport.wire_name().into()),
                Sql::Text(self.cwd.display().to_string()),
                text(&self.name),
                text(&self.parent),
                text(&self.model),
                Sql::Text(self.created_at.clone()),
                text(&self.agent_session_id),
                Sql::Integer(self.ended as i64),
                Sql::Integer(self.turn as i64),
                Sql::Integer(self.turn_active as i64),
                text(&self.end_reason.map(|r| r.wire_name().to_string())),
                self.exit
                    .and_then(|e| e.code)
                    .map(|c| Sql::Integer(c as i64))
                    .unwrap_or(Sql::Null),
                text(&self.exit.and_then(|e| e.signal).map(signal_name)),
                Sql::Integer(self.input_tokens as i64),
                Sql::Integer(self.output_tokens as i64),
                text(&self.last_activity_ms.map(crate::clock::format_ts)),
                Sql::Integer(self.next_request as i64),
                Sql::Integer(self.transcript.len as i64),
            ],
        }
    }
}

/// A session as other subsystems see it: typed, borrowed from the live
/// session, with no wire names (each surface names it in its own view).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary<'a> {
    pub id: &'a str,
    pub harness: &'a str,
    pub provider: &'a str,
    pub transport: Transport,
    /// The worktree the agent runs in.
    pub cwd: &'a std::path::Path,
    pub parent: Option<&'a str>,
    pub created_at: &'a str,
    /// The agent's own session id, once it gave one.
    pub agent_session_id: Option<&'a str>,
    pub state: State,
    /// The agent is set up and takes input.
    pub ready: bool,
    pub turn: u64,
    pub turn_active: bool,
    pub end_reason: Option<EndReason>,
    pub pending_approvals: usize,
    /// Input is queued for the next turn, or the agent is being stopped:
    /// busy although no turn may run.
    pub busy: bool,
}

/// Every session, in creation order.
#[derive(Default)]
pub struct Sessions {
    map: HashMap<String, Session>,
    order: Vec<String>,
    by_child: HashMap<ChildId, String>,
    stopping: bool,
    /// The machine's bubblewrap probe, once it has answered.
    probe: Option<crate::isolation::Probe>,
    /// Starts waiting for the probe (module comment); with the sessions
    /// held, at most `MAX_SESSIONS`.
    waiting: Vec<(Start, Option<ReplyKey>)>,
    /// A restore asked for before the probe answered: it runs once the
    /// probe has (the sessions not needed).
    restore_waiting: Option<HashSet<String>>,
}

impl Sessions {
    pub fn get(&self, id: &str) -> Option<&Session> {
        self.map.get(id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Session> {
        self.map.get_mut(id)
    }

    /// The summary of session `id`, when the daemon holds it.
    pub fn summary(&self, id: &str) -> Option<Summary<'_>> {
        self.map.get(id).map(Session::summary)
    }

    /// Sessions in creation order.
    pub fn iter(&self) -> impl Iterator<Item = &Session> {
        self.order.iter().filter_map(|id| self.map.get(id))
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Forgets the oldest ended sessions beyond `keep` (the ledger keeps
    /// them): a lookup of one answers session-not-found from then on. Only
    /// sessions whose agent is gone (no child) count as ended here. The
    /// surfaces' subscriptions refer to a session by its id only and drop
    /// those of a session no longer held. The sessions forgotten are
    /// returned, so that the surfaces can say `removed` with their last
    /// state.
    pub fn evict_ended(&mut self, keep: usize) -> Vec<Session> {
        let map = &self.map;
        let gone = oldest_ended_beyond(
            &self.order,
            |id| map.get(id).is_some_and(|s| s.ended && s.child.is_none()),
            keep,
        );
        if gone.is_empty() {
            return Vec::new();
        }
        let set: HashSet<&str> = gone.iter().map(String::as_str).collect();
        self.order.retain(|id| !set.contains(id.as_str()));
        self.by_child.retain(|_, id| !set.contains(id.as_str()));
        gone.iter().filter_map(|id| self.map.remove(id)).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn owner_of(&self, child: ChildId) -> Option<&str> {
        self.by_child.get(&child).map(String::as_str)
    }
}

/// The ids, oldest first, of the ended sessions in `order` beyond the
/// newest `keep` ended ones.
fn oldest_ended_beyond(order: &[String], ended: impl Fn(&str) -> bool, keep: usize) -> Vec<String> {
    let ended: Vec<&String> = order.iter().filter(|id| ended(id)).collect();
    let over = ended.len().saturating_sub(keep);
    ended.into_iter().take(over).cloned().collect()
}

/// The event `kind` in session `sid`'s stream, as a ledger operation.
fn event_op(sid: &str, kind: &str, data: Value) -> Op {
    Op::Event {
        stream: sid.to_string(),
        kind: kind.to_string(),
        ts: crate::clock::now_ts(),
        data: data.to_string(),
    }
}

/// What the session driver asks of the router, in the order it happened
/// (module comment, "The driver").
#[derive(Debug)]
pub enum Effect {
    /// A row or event of the round in hand, for its ledger batch.
    Record(Op),
    /// Lines for the agent's stdin, in order. When its queue is full the
    /// router writes no more of them and tells [`Sessions::stdin_full`]
    /// once the effects in hand are applied.
    Write {
        sid: String,
        child: ChildId,
        lines: Vec<Vec<u8>>,
    },
    /// Close the agent's stdin and SIGTERM its group.
    Stop { child: ChildId },
    /// SIGKILL the agent's group.
    Kill { child: ChildId },
    /// The agent's exit is handled: its pipes go.
    Release { child: ChildId },
    /// Call [`Sessions::on_timer`] with `timer` after `after`; arming a
    /// timer that is armed already moves it.
    Arm { timer: Timer, after: Duration },
    /// The timer is no longer wanted.
    Disarm(Timer),
    /// The agent asks for permission: an item for the approvals inbox.
    Ask(approvals::Ask),
    /// An approval of the session is over without an answer (the turn or
    /// the agent ended, the request vanished): the inbox resolves it
    /// cancelled, `delivered` saying whether the agent heard the cancel.
    Withdraw {
        approval_id: String,
        why: &'static str,
        delivered: bool,
    },
    /// The agent reported its sign-in state: the seat registry's news.
    SignIn {
        harness: String,
        state: crate::agents::SignInState,
    },
    /// Agents can start: prepare `start`'s ([`Sessions::prepare`]) and
    /// run it; `reply` waits for its session.start to be committed.
    Launch {
        start: Start,
        reply: Option<ReplyKey>,
    },
    /// A start that waited is refused.
    NotStarted { reply: ReplyKey, error: RpcError },
    /// Read the live sessions and pending approvals of the last run, then
    /// hand the sessions to [`Sessions::reopen`].
    ReadLastRun { not_needed: HashSet<String> },
}

/// A session's timers, by what they are for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Timer {
    /// Whether the agent wrote anything in turn `turn` lately.
    Stall { sid: String, turn: u64 },
    /// The grace after SIGTERM is over: SIGKILL if the agent is still here.
    Kill { child: ChildId },
    /// The agent exited, but a descendant holds its stdout open: the
    /// session ends anyway.
    ExitGrace { sid: String },
}

/// What a round of a session commits, and what its watchers hear after.
pub struct Finished {
    /// The round's transcript text and the session's row, behind the
    /// round's own records.
    pub ops: Vec<Op>,
    pub delta: Option<Delta>,
    pub change: Option<Change>,
}

/// The event `kind` in session `sid`'s stream.
fn event(sid: &str, kind: &str, data: Value) -> Effect {
    Effect::Record(event_op(sid, kind, data))
}

/// Records a transcript entry of session `s`.
fn entry(s: &mut Session, e: &Entry, ts: Option<&str>, is_error: bool, out: &mut Vec<Effect>) {
    let mut ops = Vec::new();
    s.transcript.push(&s.id, e, ts, is_error, &mut ops);
    out.extend(ops.into_iter().map(Effect::Record));
}

impl Sessions {
    /// The agent's child of session `sid`, while it runs.
    pub fn child_of(&self, sid: &str) -> Option<ChildId> {
        self.map.get(sid).and_then(|s| s.child)
    }

    /// A line the agent of session `sid` wrote, at `now`; false when it
    /// broke its transport, so that no more of its lines are read now.
    pub fn on_line(
        &mut self,
        sid: &str,
        line: &[u8],
        now: Instant,
        now_ms: i64,
    ) -> (Vec<Effect>, bool) {
        let mut out = Vec::new();
        let Some(s) = self.map.get_mut(sid) else {
            return (out, false);
        };
        s.last_line = now;
        s.last_activity_ms = Some(now_ms);
        let Some(drv) = s.driver.as_mut() else {
            return (out, true);
        };
        // Most lines of a busy agent are text chunks growing the running
        // entry: those go straight to the transcript, borrowed from the
        // line, without the Step, the owned text and the session lookups
        // of the general path. The transport's state is the same either
        // way (`text_chunk` changes none); a chunk the transcript cannot
        // grow (the first of an entry) takes the general path.
        if s.child.is_some() {
            if let Some((kind, text)) = drv.text_chunk(line) {
                let mut ops = Vec::new();
                if s.transcript.grow(&s.id, kind, &text, &mut ops) {
                    out.extend(ops.into_iter().map(Effect::Record));
                    return (out, true);
                }
            }
        }
        let Some(drv) = s.driver.as_mut() else {
            return (out, true);
        };
        match drv.on_line(line) {
            Ok(step) => {
                self.step(sid, step, &mut out);
                (out, true)
            }
            Err(v) => {
                self.broke(sid, &v.reason, &mut out);
                (out, false)
            }
        }
    }

    /// The agent of session `sid` wrote a line longer than the bound.
    pub fn line_too_long(&mut self, sid: &str) -> Vec<Effect> {
        let mut out = Vec::new();
        let reason = format!("a line over {} bytes", limits::AGENT_MAX_LINE);
        self.broke(sid, &reason, &mut out);
        out
    }

    /// The agent's stdout closed: its exit, if it came first.
    pub fn take_exit_pending(&mut self, sid: &str) -> Option<ExitStatus> {
        self.map.get_mut(sid).and_then(|s| s.exit_pending.take())
    }

    /// The agent of session `sid` does not read its stdin: its turn fails
    /// and it is stopped.
    pub fn stdin_full(&mut self, sid: &str) -> Vec<Effect> {
        let mut out = Vec::new();
        if self.map.get(sid).is_some_and(|s| s.stopping_agent) {
            return out;
        }
        crate::warn!("session {sid}: the agent does not read its input; stopping it");
        self.fail_turn(sid, "the agent stopped reading its input", &mut out);
        self.stop_agent(sid, &mut out);
        out
    }

    /// The agent broke its transport's protocol.
    fn broke(&mut self, sid: &str, reason: &str, out: &mut Vec<Effect>) {
        crate::warn!("session {sid}: the agent broke its transport with {reason}; stopping it");
        self.fail_turn(
            sid,
            &format!("the agent broke its transport: {reason}"),
            out,
        );
        self.stop_agent(sid, out);
    }

    /// Ends the running turn failed (the daemon's own judgement: a
    /// violation, a stall, an agent that does not read), recording why.
    fn fail_turn(&mut self, sid: &str, why: &str, out: &mut Vec<Effect>) {
        let Some(s) = self.map.get_mut(sid) else {
            return;
        };
        let ts = crate::clock::now_ts();
        entry(
            s,
            &Entry::System {
                text: why.to_string(),
            },
            Some(&ts),
            true,
            out,
        );
        if s.turn_active {
            entry(
                s,
                &Entry::TurnEnd {
                    reason: EndReason::Failed,
                },
                Some(&ts),
                false,
                out,
            );
            end_turn_state(s, EndReason::Failed, out);
        }
        withdraw_open(s, "the turn ended", out);
        s.changed = true;
    }

    /// Applies what a core reported: its lines to the agent's stdin, its
    /// events to the session.
    fn step(&mut self, sid: &str, step: Step, out: &mut Vec<Effect>) {
        let Some(child) = self.child_of(sid) else {
            return;
        };
        if !step.writes.is_empty() {
            out.push(Effect::Write {
                sid: sid.to_string(),
                child,
                lines: step.writes,
            });
        }
        for ev in step.events {
            self.on_event(sid, ev, out);
        }
    }

    fn on_event(&mut self, sid: &str, ev: AgentEvent, out: &mut Vec<Effect>) {
        let Some(s) = self.map.get_mut(sid) else {
            return;
        };
        match ev {
            AgentEvent::Ready {
                agent_session_id,
                capabilities,
            } => {
                s.ready = true;
                s.capabilities = capabilities;
                s.agent_session_id = Some(agent_session_id);
                s.changed = true;
            }
            AgentEvent::SetupFailed { detail } => {
                crate::warn!("session {sid}: the agent could not set up a session: {detail}");
                let ts = crate::clock::now_ts();
                let text = format!("the agent could not set up a session: {detail}");
                entry(s, &Entry::System { text }, Some(&ts), true, out);
                self.stop_agent(sid, out);
            }
            AgentEvent::TurnStarted { chars } => {
                s.turn += 1;
                s.turn_active = true;
                s.end_reason = None;
                s.last_line = Instant::now();
                let (turn, stall) = (s.turn, s.stall);
                // Seed 000 also has mode `queue`, for a prompt the agent
                // had queued itself; the daemon never lets an agent queue
                // (it holds prompts until the turn ends, omniconfluxd(8)
                // sessions.input), so every turn starts with `prompt`.
                out.push(event(
                    sid,
                    "turn.start",
                    json!({"turn": turn, "mode": "prompt", "chars": chars}),
                ));
                s.changed = true;
                arm_stall(s, turn, stall, out);
            }
            AgentEvent::Transcript(e) => {
                if matches!(e, Entry::TurnEnd { .. }) && !s.turn_active {
                    return;
                }
                entry(s, &e, None, false, out);
            }
            AgentEvent::PermissionRequest(req) => permission(s, req, out),
            AgentEvent::PermissionClosed {
                agent_request_key,
                delivered,
            } => {
                let Some(pos) = s.open.iter().position(|a| a.key == agent_request_key) else {
                    return;
                };
                let a = s.open.remove(pos);
                let why = if delivered {
                    "the turn was interrupted"
                } else {
                    "the request vanished"
                };
                out.push(Effect::Withdraw {
                    approval_id: a.approval_id,
                    why,
                    delivered,
                });
                s.changed = true;
            }
            AgentEvent::Fs(req) => {
                if let Some(step) = fs_request(s, req) {
                    self.step(sid, step, out);
                }
            }
            AgentEvent::TurnEnded { reason, detail } => {
                if !s.turn_active {
                    return;
                }
                if let Some(detail) = detail.filter(|_| reason != EndReason::Completed) {
                    crate::info!(
                        "session {sid}: turn {} ended {}: {detail}",
                        s.turn,
                        reason.wire_name()
                    );
                }
                end_turn_state(s, reason, out);
            }
            AgentEvent::Usage(u) => {
                if u.model.is_some() {
                    s.model = u.model;
                }
                s.input_tokens += u.input_tokens;
                s.output_tokens += u.output_tokens;
                s.changed = true;
            }
            AgentEvent::SignIn(state) => out.push(Effect::SignIn {
                harness: s.harness.clone(),
                state,
            }),
            AgentEvent::Retrying(retry) => {
                if retry.is_none() && s.retry.is_none() {
                    return;
                }
                // The first try of a run of retries gives `since`.
                let since = s.retry.as_ref().map_or_else(crate::clock::now_ms, |r| r.1);
                if let Some(r) = &retry {
                    crate::info!(
                        "session {sid}: the agent retries its API call ({} of {}, status {})",
                        r.attempt,
                        r.max_retries,
                        r.error_status
                            .map_or_else(|| "unknown".to_string(), |c| c.to_string())
                    );
                }
                s.retry = retry.map(|r| (r, since));
                s.changed = true;
            }
        }
    }

    /// Hands the operator's `decision` on approval `approval_id` (the
    /// agent's request `key`) to session `sid`'s agent: what that leads
    /// to, or None when the session or its agent is gone. The request is
    /// no longer open unless the agent offered no option for the decision.
    pub fn answer(
        &mut self,
        sid: &str,
        approval_id: &str,
        key: &str,
        decision: Decision,
    ) -> Result<Option<Vec<Effect>>, CommandError> {
        let Some(s) = self.map.get_mut(sid) else {
            return Ok(None);
        };
        let pos = s.open.iter().position(|o| o.approval_id == approval_id);
        let Some(drv) = s.driver.as_mut() else {
            return Ok(None);
        };
        let answered = drv.answer(key, decision);
        if !matches!(answered, Err(CommandError::NoMatchingOption)) {
            if let Some(p) = pos {
                s.open.remove(p);
            }
        }
        let step = answered?;
        s.changed = true;
        let mut out = Vec::new();
        self.step(sid, step, &mut out);
        Ok(Some(out))
    }

    /// A timer of [`Effect::Arm`] fired at `now`.
    pub fn on_timer(&mut self, timer: Timer, now: Instant) -> Vec<Effect> {
        let mut out = Vec::new();
        match timer {
            Timer::Stall { sid, turn } => self.check_stall(&sid, turn, now, &mut out),
            Timer::Kill { child } => {
                if self.by_child.contains_key(&child) {
                    out.push(Effect::Kill { child });
                }
            }
            // The router ends the session (`ended`): it reads the agent's
            // last error output first.
            Timer::ExitGrace { .. } => {}
        }
        out
    }

    fn check_stall(&mut self, sid: &str, turn: u64, now: Instant, out: &mut Vec<Effect>) {
        let Some(s) = self.map.get_mut(sid) else {
            return;
        };
        s.stall_timer = None;
        if !s.turn_active || s.turn != turn || s.ended {
            return;
        }
        let (stall, quiet) = (s.stall, now.saturating_duration_since(s.last_line));
        if !s.open.is_empty() {
            // Waiting on the operator is not the agent stalling.
            arm_stall(s, turn, stall, out);
            return;
        }
        if quiet < stall {
            arm_stall(s, turn, stall - quiet, out);
            return;
        }
        crate::warn!(
            "session {sid}: the agent wrote nothing for {} s in turn {turn}; stopping it",
            stall.as_secs()
        );
        let why = format!("the agent stalled: nothing for {} s", stall.as_secs());
        self.fail_turn(sid, &why, out);
        self.stop_agent(sid, out);
    }

    /// Asks the agent to exit: stdin closed, SIGTERM to its group, SIGKILL
    /// after the grace period.
    fn stop_agent(&mut self, sid: &str, out: &mut Vec<Effect>) {
        let Some(s) = self.map.get_mut(sid) else {
            return;
        };
        let Some(child) = s.child else { return };
        if s.stopping_agent {
            return;
        }
        s.stopping_agent = true;
        out.push(Effect::Stop { child });
        out.push(Effect::Arm {
            timer: Timer::Kill { child },
            after: Duration::from_millis(limits::AGENT_KILL_GRACE_MS),
        });
    }

    /// The agent on `child` exited with `status` (as the agent saw it,
    /// through bubblewrap when contained). While its stdout is still open
    /// the lines it wrote before are still in the pipe: the session ends
    /// when stdout closes, or after the grace period if a descendant holds
    /// it; else it ends now. The session it ran, and what follows.
    pub fn on_exit(
        &mut self,
        child: ChildId,
        status: ExitStatus,
        stdout_open: bool,
        tail: &[u8],
    ) -> Option<(String, Vec<Effect>)> {
        let sid = self.by_child.get(&child)?.clone();
        if stdout_open {
            if let Some(s) = self.map.get_mut(&sid) {
                s.exit_pending = Some(status);
            }
            let grace = Effect::Arm {
                timer: Timer::ExitGrace { sid: sid.clone() },
                after: Duration::from_millis(limits::AGENT_KILL_GRACE_MS),
            };
            return Some((sid, vec![grace]));
        }
        let out = self.ended(&sid, status, tail);
        Some((sid, out))
    }

    /// The agent is gone (`tail`: its last error output): the turn it ran
    /// ends, open approvals are withdrawn, session.end is recorded (not
    /// while the daemon stops: see the module comment).
    pub fn ended(&mut self, sid: &str, status: ExitStatus, tail: &[u8]) -> Vec<Effect> {
        let mut out = Vec::new();
        let Some(s) = self.map.get_mut(sid) else {
            return out;
        };
        let Some(child) = s.child.take() else {
            return out;
        };
        self.by_child.remove(&child);
        out.push(Effect::Release { child });
        if self.stopping {
            return out;
        }
        let Some(s) = self.map.get_mut(sid) else {
            return out;
        };
        if let Some(mut drv) = s.driver.take() {
            let step = drv.on_exit(status.code);
            for ev in step.events {
                if let (AgentEvent::TurnEnded { reason, detail }, Some(s)) =
                    (&ev, self.map.get_mut(sid))
                {
                    if s.turn_active && *reason != EndReason::Interrupted {
                        let why = detail.clone().unwrap_or_else(|| "the agent exited".into());
                        crate::warn!("session {sid}: the agent exited mid-turn ({why})");
                        let ts = crate::clock::now_ts();
                        entry(s, &Entry::System { text: why }, Some(&ts), true, &mut out);
                    }
                }
                self.on_event(sid, ev, &mut out);
            }
        }
        let Some(s) = self.map.get_mut(sid) else {
            return out;
        };
        withdraw_open(s, "the agent exited", &mut out);
        s.ended = true;
        s.exit = Some(status);
        if let Some(t) = s.stall_timer.take() {
            out.push(Effect::Disarm(t));
        }
        let signal = status.signal.map(signal_name);
        let clean = status.code == Some(0) || s.stopping_agent;
        let tail = String::from_utf8_lossy(tail).trim().replace('\n', " | ");
        let how = match (status.code, &signal) {
            (Some(c), _) => format!("with status {c}"),
            (None, Some(sig)) => format!("by {sig}"),
            (None, None) => "for an unknown reason".to_string(),
        };
        if clean || tail.is_empty() {
            crate::info!("session {sid}: the agent exited {how}");
        } else {
            crate::warn!("session {sid}: the agent exited {how}; its last error output: {tail}");
        }
        out.push(event(
            sid,
            "session.end",
            json!({"code": status.code, "signal": signal}),
        ));
        s.changed = true;
        out
    }

    /// `sessions.input`: a prompt now, or queued behind the running turn.
    pub fn input(&mut self, sid: &str, text: String) -> Result<(Accepted, Vec<Effect>), RpcError> {
        check_prompt(&text)?;
        let s = self.map.get_mut(sid).ok_or_else(|| not_found(sid))?;
        if s.ended || s.stopping_agent {
            return Err(RpcError::new(
                Code::SessionEnded,
                format!("session {sid} has ended"),
            ));
        }
        let Some(drv) = s.driver.as_mut() else {
            return Err(RpcError::new(
                Code::SessionEnded,
                format!("session {sid} has ended"),
            ));
        };
        let was_busy = s.turn_active || !s.ready;
        let step = drv.prompt(text).map_err(|e| match e {
            CommandError::QueueFull => RpcError::new(
                Code::QueueFull,
                format!(
                    "session {sid} has {} prompts waiting already",
                    limits::AGENT_PROMPT_QUEUE
                ),
            ),
            other => RpcError::new(Code::SessionEnded, format!("session {sid}: {other}")),
        })?;
        s.changed = true;
        let mut out = Vec::new();
        self.step(sid, step, &mut out);
        let queued = self.map.get(sid).map_or(0, Session::queued);
        let accepted = Accepted {
            queued: was_busy,
            queue_length: queued,
        };
        Ok((accepted, out))
    }

    /// `sessions.interrupt`: the running turn is cancelled, every open
    /// permission answered cancelled; the turn ends interrupted. Answers
    /// whether a turn was running.
    pub fn interrupt(&mut self, sid: &str) -> Result<(bool, Vec<Effect>), RpcError> {
        let s = self.map.get_mut(sid).ok_or_else(|| not_found(sid))?;
        let active = s.turn_active && !s.ended;
        let mut out = Vec::new();
        let Some(drv) = s.driver.as_mut() else {
            return Ok((false, out));
        };
        let step = drv.interrupt();
        self.step(sid, step, &mut out);
        Ok((active, out))
    }

    /// `sessions.kill`: stops the agent; session.end follows its exit.
    pub fn kill(&mut self, sid: &str) -> Result<(Killed, Vec<Effect>), RpcError> {
        let s = self.map.get(sid).ok_or_else(|| not_found(sid))?;
        let mut out = Vec::new();
        if s.ended {
            return Ok((Killed::AlreadyEnded, out));
        }
        self.stop_agent(sid, &mut out);
        Ok((Killed::Stopping, out))
    }

    /// `session.rename`.
    pub fn rename(&mut self, sid: &str, name: &str) -> Result<String, RpcError> {
        let name = clean_name(name)?;
        let s = self.map.get_mut(sid).ok_or_else(|| not_found(sid))?;
        s.name = Some(name.clone());
        s.changed = true;
        Ok(name)
    }

    /// Ends a round of session `sid`: its transcript text and, when the
    /// session changed or its transcript got an entry, its row (not for
    /// every round of text chunks: those change only `last_activity`,
    /// which is written with the next change). `added`: the session is new
    /// to this run of the daemon (spawned or reopened).
    pub fn finish(&mut self, sid: &str, added: bool, now_ms: i64) -> Finished {
        let mut done = Finished {
            ops: Vec::new(),
            delta: None,
            change: added.then_some(Change::Added),
        };
        let Some(s) = self.map.get_mut(sid) else {
            return done;
        };
        done.delta = s.transcript.flush(sid, &mut done.ops);
        let state = s.state();
        if state != s.last_state {
            s.last_state = state;
            s.status_since_ms = now_ms;
            s.changed = true;
        }
        let changed = std::mem::take(&mut s.changed);
        if changed || s.transcript.len != s.row_transcript_len {
            s.row_transcript_len = s.transcript.len;
            done.ops.push(s.row_op());
        }
        if changed && !added {
            done.change = Some(Change::Updated);
        }
        done
    }
}

fn end_turn_state(s: &mut Session, reason: EndReason, out: &mut Vec<Effect>) {
    s.turn_active = false;
    s.end_reason = Some(reason);
    s.retry = None;
    if let Some(t) = s.stall_timer.take() {
        out.push(Effect::Disarm(t));
    }
    out.push(event(
        &s.id,
        "turn.end",
        json!({"reason": reason.wire_name()}),
    ));
    s.changed = true;
}

/// Withdraws every approval of the session still open (delivered false).
fn withdraw_open(s: &mut Session, why: &'static str, out: &mut Vec<Effect>) {
    for a in s.open.drain(..) {
        out.push(Effect::Withdraw {
            approval_id: a.approval_id,
            why,
            delivered: false,
        });
    }
}

fn permission(s: &mut Session, req: PermissionRequest, out: &mut Vec<Effect>) {
    let n = s.next_request;
    s.next_request += 1;
    let approval_id = format!("{}-a{n}", s.id);
    let input_text = req.input.to_string();
    s.open.push(OpenAsk {
        key: req.agent_request_key.clone(),
        approval_id: approval_id.clone(),
        tool: req.title.clone(),
        tool_name: req.tool.clone(),
        preview: crate::core::transcript::preview(&input_text),
        interaction: req.interaction.clone(),
    });
    s.changed = true;
    out.push(Effect::Ask(approvals::Ask {
        session: s.id.clone(),
        id: approval_id,
        request: req,
        cwd: s.cwd.clone(),
    }));
}

/// ACP fs/*: the core checked the path lexically; `agentfs` opens the file
/// beneath a descriptor of the worktree, so no symlink can lead out, and
/// reads only regular files without blocking.
fn fs_request(s: &mut Session, req: FsRequest) -> Option<Step> {
    let Some(Driver::Acp(c)) = s.driver.as_mut() else {
        return None;
    };
    let step = match req {
        FsRequest::Read { key, path } => {
            let r = crate::core::agentfs::read_text(&s.cwd, &path.to_string_lossy());
            c.answer_fs_read(&key, r)
        }
        FsRequest::Write { key, path, content } => {
            let r = crate::core::agentfs::write_text(&s.cwd, &path.to_string_lossy(), &content);
            c.answer_fs_write(&key, r)
        }
    };
    step.ok()
}

fn arm_stall(s: &mut Session, turn: u64, after: Duration, out: &mut Vec<Effect>) {
    let timer = Timer::Stall {
        sid: s.id.clone(),
        turn,
    };
    if let Some(old) = s.stall_timer.replace(timer.clone()) {
        if old != timer {
            out.push(Effect::Disarm(old));
        }
    }
    out.push(Effect::Arm { timer, after });
}

/// What [`Sessions::input`] did with a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// A turn was running or the agent was not set up: the prompt waits.
    pub queued: bool,
    /// Prompts waiting now.
    pub queue_length: usize,
}

/// What [`Sessions::kill`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Killed {
    /// The session had ended already.
    AlreadyEnded,
    /// Its agent is being stopped; session.end follows its exit.
    Stopping,
}

pub fn not_found(sid: &str) -> RpcError {
    RpcError::new(Code::SessionNotFound, format!("unknown session: {sid}"))
}

/// What of the daemon's own environment every agent gets, by exact name:
/// what programs need to find their home, user, shell, locale, time zone
/// and XDG directories, then proxies and certificate authorities (an agent
/// must reach its provider from wherever the operator can), then provider
/// settings that are not under one of `AGENT_ENV_PREFIXES`. TERM is not
/// passed: an agent's stdio are pipes, and a TERM would invite terminal
/// escapes into its protocol stream.
const AGENT_ENV_NAMES: &[&str] = &[
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    // Claude Code's config directory, and Vertex AI's region for it.
    "CLAUDE_CONFIG_DIR",
    "CLOUD_ML_REGION",
];

/// Name prefixes of the daemon's environment every agent gets: the
/// credentials, endpoints and settings of the providers the known agents
/// read from their environment (Claude Code: ANTHROPIC_*, CLAUDE_CODE_*,
/// AWS_* for Bedrock, VERTEX_REGION_* and ANTHROPIC_VERTEX_* for Vertex;
/// Codex: OPENAI_*, AZURE_OPENAI_*, CODEX_*; Gemini CLI: GEMINI_*,
/// GOOGLE_*; opencode: OPENCODE_*, OPENROUTER_*). None of them is
/// OMNICONFLUX_*: the daemon's own settings never reach an agent.
const AGENT_ENV_PREFIXES: &[&str] = &[
    "ANTHROPIC_",
    "CLAUDE_CODE_",
    "AWS_",
    "VERTEX_",
    "OPENAI_",
    "AZURE_OPENAI_",
    "CODEX_",
    "GEMINI_",
    "GOOGLE_",
    "OPENCODE_",
    "OPENROUTER_",
];

/// Whether a variable of the daemon's environment is passed to agents.
fn passed_to_agents(name: &str) -> bool {
    AGENT_ENV_NAMES.contains(&name) || AGENT_ENV_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The constructed environment of an agent: PATH (`search_path`), the
/// daemon's variables that `passed_to_agents` names, XDG_RUNTIME_DIR when
/// the agent has an empty one of its own (`runtime`, only when contained),
/// the session id, then the seat's `env`, which wins. Nothing else of the
/// daemon's environment (its socket, NOTIFY_SOCKET, OMNICONFLUX_*) reaches
/// it.
fn agent_env(
    cmd: &mut Command,
    sid: &str,
    runtime: Option<&std::path::Path>,
    seat_env: &std::collections::BTreeMap<String, String>,
) {
    cmd.env_clear();
    cmd.env("PATH", crate::isolation::search_path());
    for (k, v) in std::env::vars_os() {
        if k.to_str().is_some_and(passed_to_agents) {
            cmd.env(k, v);
        }
    }
    if let Some(r) = runtime {
        cmd.env("XDG_RUNTIME_DIR", r);
    }
    cmd.env("OMNICONFLUX_SESSION", sid);
    for (k, v) in seat_env {
        cmd.env(k, v);
    }
}

/// The params of `sessions.spawn` on the daemon socket, as the wire names
/// them; the socket turns them into a [`SpawnRequest`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpawnParams {
    pub harness: String,
    pub cwd: String,
    pub prompt: Option<String>,
    pub model: Option<String>,
    pub name: Option<String>,
}

/// What a caller of [`Sessions::spawn`] asks for: the socket, the HTTP API and the
/// lanes alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnRequest {
    /// The seat's harness.
    pub harness: String,
    /// The working folder, absolute or `~`-relative, as the caller gave it.
    pub cwd: String,
    /// The first prompt, if any.
    pub prompt: Option<String>,
    /// A model other than the seat's.
    pub model: Option<String>,
    /// The session's name.
    pub name: Option<String>,
}

impl From<SpawnParams> for SpawnRequest {
    fn from(p: SpawnParams) -> Self {
        SpawnRequest {
            harness: p.harness,
            cwd: p.cwd,
            prompt: p.prompt,
            model: p.model,
            name: p.name,
        }
    }
}

/// A session [`Sessions::spawn`] started, once its session.start is
/// committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spawned {
    pub session_id: String,
}

/// Checks a session name (session.rename, sessions.spawn): trimmed, not
/// empty, no control characters, bounded.
pub fn clean_name(name: &str) -> Result<String, RpcError> {
    let n = name.trim();
    if n.is_empty() {
        return Err(RpcError::invalid_params("name must not be blank"));
    }
    if n.chars().any(char::is_control) {
        return Err(RpcError::invalid_params(
            "name must not contain control characters",
        ));
    }
    if n.chars().count() > limits::SESSION_NAME_MAX {
        return Err(RpcError::invalid_params(format!(
            "name must be at most {} characters",
            limits::SESSION_NAME_MAX
        )));
    }
    Ok(n.to_string())
}

fn check_prompt(text: &str) -> Result<(), RpcError> {
    if text.trim().is_empty() {
        return Err(RpcError::invalid_params("the prompt must not be blank"));
    }
    if text.len() > limits::PROMPT_MAX_BYTES {
        return Err(RpcError::invalid_params(format!(
            "the prompt must be at most {} bytes",
            limits::PROMPT_MAX_BYTES
        )));
    }
    Ok(())
}

/// What a new or reopened session starts from; the router hands it back
/// to [`Sessions::prepare`] once agents can start.
#[derive(Debug)]
pub struct Start {
    id: String,
    harness: String,
    cwd: PathBuf,
    name: Option<String>,
    model: Option<String>,
    prompt: Option<String>,
    reopen: Option<String>,
    restored: Option<Restored>,
}

impl Start {
    /// The session's id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// A session row read back at start.
#[derive(Debug, Clone)]
pub struct Restored {
    pub created_at: String,
    pub turn: u64,
    pub turn_active: bool,
    pub end_reason: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub next_request: u64,
    pub transcript_len: usize,
    pub provider: String,
    pub transport: String,
    pub parent: Option<String>,
}

/// An agent ready to start (beside its command): what the session is
/// made of once it runs ([`Sessions::started`]).
pub struct Prepared {
    /// The agent runs in a namespace.
    pub contained: bool,
    /// The seat's command, as a failed start names it.
    pub program: String,
    start: Start,
    seat: Seat,
}

impl Sessions {
    /// `sessions.spawn`: checks the request against the seats and the
    /// bounds. The start to launch once agents can (module comment), with
    /// `reply` answered after its session.start is committed. The router
    /// forgets the oldest ended sessions first ([`Sessions::evict_ended`]),
    /// so that the surfaces hear which.
    pub fn spawn(
        &mut self,
        seats: &Seats,
        p: SpawnRequest,
        isolation: AgentIsolation,
        reply: ReplyKey,
    ) -> Result<Vec<Effect>, RpcError> {
        let seat = seats.get(&p.harness).ok_or_else(|| {
            RpcError::new(
                Code::SeatNotFound,
                format!("no seat has the harness {}", p.harness),
            )
        })?;
        if let Some(st @ (SeatStatus::Missing | SeatStatus::Degraded)) = seat.status {
            let why = seat.reason.clone().unwrap_or_default();
            return Err(RpcError::new(
                Code::SeatNotReady,
                format!("the seat {} is {}: {why}", p.harness, st.wire_name()),
            ));
        }
        if self.len() + self.waiting.len() >= limits::MAX_SESSIONS {
            return Err(RpcError::new(
                Code::TooManySessions,
                format!("the daemon holds {} sessions already", limits::MAX_SESSIONS),
            ));
        }
        let raw = if p.cwd == "~" || p.cwd.starts_with("~/") {
            let home = std::env::var("HOME").unwrap_or_default();
            format!("{home}{}", &p.cwd[1..])
        } else {
            p.cwd.clone()
        };
        if !raw.starts_with('/') {
            return Err(RpcError::invalid_params(format!(
                "cwd must be an absolute path, found {:?}",
                p.cwd
            )));
        }
        let cwd = std::fs::canonicalize(&raw).map_err(|e| {
            RpcError::invalid_params(format!("cwd {raw}: {}", crate::errors::io_cause(&e)))
        })?;
        if !cwd.is_dir() {
            return Err(RpcError::invalid_params(format!(
                "cwd {raw} is not a directory"
            )));
        }
        if let Some(t) = &p.prompt {
            check_prompt(t)?;
        }
        let name = p.name.as_deref().map(clean_name).transpose()?;
        let start = Start {
            id: crate::ids::prefixed_id("s-"),
            harness: p.harness.clone(),
            cwd,
            name,
            model: p.model.clone().or_else(|| seat.cfg.model.clone()),
            prompt: p.prompt.clone(),
            reopen: None,
            restored: None,
        };
        if self.sandbox(isolation) == AgentSandbox::Pending {
            self.hold(start, Some(reply));
            return Ok(Vec::new());
        }
        Ok(vec![Effect::Launch {
            start,
            reply: Some(reply),
        }])
    }

    /// Keeps a start until the bubblewrap probe answers
    /// ([`Sessions::isolation_known`]).
    pub fn hold(&mut self, start: Start, reply: Option<ReplyKey>) {
        self.waiting.push((start, reply));
    }

    /// How agents run now: `[agents] isolation` and the probe.
    pub fn sandbox(&self, isolation: AgentIsolation) -> AgentSandbox {
        AgentSandbox::decide(isolation, self.probe.as_ref())
    }

    /// The machine's bubblewrap probe answered: say how agents run, then
    /// start the sessions that waited for it and the restore, if it waited.
    pub fn isolation_known(
        &mut self,
        isolation: AgentIsolation,
        probe: &crate::isolation::Probe,
    ) -> Vec<Effect> {
        self.probe = Some(probe.clone());
        match self.sandbox(isolation) {
            AgentSandbox::Namespace(bwrap) => {
                crate::info!(
                    "agents run contained, in a namespace of {}",
                    bwrap.display()
                );
                if crate::isolation::runs_as_root() {
                    crate::warn!(
                        "agents run as root: they can write root-owned files such as /etc"
                    );
                }
            }
            AgentSandbox::Uncontained(why) if isolation == AgentIsolation::None => {
                crate::info!("agents run uncontained: {why}")
            }
            AgentSandbox::Uncontained(why) => {
                crate::warn!(
                    "agents run uncontained, with every power of the operator's user: {why}"
                )
            }
            AgentSandbox::Pending => {}
        }
        let stopping = self.stopping;
        let mut out: Vec<Effect> = std::mem::take(&mut self.waiting)
            .into_iter()
            .filter_map(|(start, reply)| match (stopping, reply) {
                (false, reply) => Some(Effect::Launch { start, reply }),
                (true, Some(reply)) => Some(Effect::NotStarted {
                    reply,
                    error: RpcError::new(Code::ShuttingDown, "the daemon is stopping".to_string()),
                }),
                (true, None) => None,
            })
            .collect();
        if let Some(not_needed) = self.restore_waiting.take() {
            out.push(Effect::ReadLastRun { not_needed });
        }
        out
    }

    /// The command that starts `start`'s agent on its seat, as `sandbox`
    /// says (`hidden`: what the namespace hides, when there is one).
    pub fn prepare(
        &self,
        seats: &Seats,
        start: Start,
        sandbox: &AgentSandbox,
        hidden: Option<&Hidden>,
    ) -> Result<(Command, Prepared), RpcError> {
        let Some(seat) = seats.get(&start.harness).cloned() else {
            return Err(RpcError::new(
                Code::SeatNotFound,
                format!("no seat has the harness {}", start.harness),
            ));
        };
        let program = seat
            .program
            .clone()
            .unwrap_or_else(|| PathBuf::from(&seat.cfg.command));
        let (mut cmd, runtime) = agent_command(sandbox, hidden, &program, &start.cwd);
        cmd.args(&seat.cfg.args);
        if seat.transport == Transport::StreamJson {
            cmd.args(stream_json::BASE_ARGS);
            if let Some(m) = &start.model {
                cmd.args(["--model", m]);
            }
            if let Some(r) = &start.reopen {
                cmd.args(stream_json::resume_args(r));
            }
        }
        cmd.current_dir(&start.cwd);
        agent_env(&mut cmd, &start.id, runtime.as_deref(), &seat.cfg.env);
        let prepared = Prepared {
            contained: matches!(sandbox, AgentSandbox::Namespace(_)),
            program: seat.cfg.command.clone(),
            start,
            seat,
        };
        Ok((cmd, prepared))
    }

    /// The agent of `p` runs as `child` (pid `pid`): the session is held,
    /// its session.start recorded (a new one's) and its core started. The
    /// round is the session's first: the router ends it as `added`.
    pub fn started(&mut self, p: Prepared, child: ChildId, pid: i32) -> (String, Vec<Effect>) {
        let Prepared {
            start: st,
            seat,
            contained,
            ..
        } = p;
        let driver = match seat.transport {
            Transport::Acp => Driver::Acp(AcpClient::new(AcpConfig {
                worktree: st.cwd.clone(),
                reopen: st.reopen.clone(),
            })),
            Transport::StreamJson => Driver::StreamJson(StreamJsonClient::new()),
        };
        let now = crate::clock::now_ms();
        let r = st.restored.as_ref();
        let s = Session {
            id: st.id.clone(),
            harness: seat.cfg.harness.clone(),
            provider: r.map_or(seat.cfg.provider.clone(), |r| r.provider.clone()),
            transport: seat.transport,
            cwd: st.cwd.clone(),
            name: st.name.clone(),
            parent: r.and_then(|r| r.parent.clone()),
            model: st.model.clone(),
            created_at: r.map_or_else(crate::clock::now_ts, |r| r.created_at.clone()),
            agent_session_id: st.reopen.clone(),
            capabilities: Capabilities::default(),
            // The CLI of stream-json takes input at once; an ACP agent
            // after its handshake.
            ready: seat.transport == Transport::StreamJson,
            ended: false,
            turn: r.map_or(0, |r| r.turn),
            turn_active: false,
            end_reason: r
                .and_then(|r| r.end_reason.as_deref())
                .and_then(end_reason_from),
            exit: None,
            input_tokens: r.map_or(0, |r| r.input_tokens),
            output_tokens: r.map_or(0, |r| r.output_tokens),
            last_activity_ms: Some(now),
            status_since_ms: now,
            retry: None,
            next_request: r.map_or(1, |r| r.next_request),
            open: Vec::new(),
            transcript: Transcript::restored(r.map_or(0, |r| r.transcript_len)),
            driver: Some(driver),
            child: Some(child),
            exit_pending: None,
            stopping_agent: false,
            last_line: Instant::now(),
            stall: Duration::from_secs(
                seat.cfg
                    .stall_timeout
                    .unwrap_or(limits::AGENT_STALL_DEFAULT_S),
            ),
            stall_timer: None,
            last_state: State::Starting,
            row_transcript_len: usize::MAX,
            changed: true,
        };
        let sid = st.id.clone();
        crate::info!(
            "session {sid}: {} {} (pid {pid}) in {}, {}",
            if st.reopen.is_some() {
                "reopened"
            } else {
                "started"
            },
            seat.cfg.harness,
            st.cwd.display(),
            if contained {
                "contained"
            } else {
                "uncontained"
            }
        );
        let mut out = Vec::new();
        if st.restored.is_none() {
            out.push(event(
                &sid,
                "session.start",
                json!({
                    "harness": s.harness,
                    "provider": s.provider,
                    "transport": s.transport.wire_name(),
                    "flags": flags(s.transport),
                }),
            ));
        }
        self.by_child.insert(child, sid.clone());
        self.order.push(sid.clone());
        self.map.insert(sid.clone(), s);
        let started = self
            .map
            .get_mut(&sid)
            .and_then(|s| s.driver.as_mut())
            .map(|drv| drv.start(st.prompt.clone()));
        match started {
            Some(Ok(step)) => self.step(&sid, step, &mut out),
            Some(Err(e)) => crate::warn!("session {sid}: {e}"),
            None => {}
        }
        (sid, out)
    }

    /// SIGTERM to every agent, and the starts that wait for the probe are
    /// refused; the agents' exits are not recorded (module comment).
    pub fn stop_all(&mut self) -> Vec<Effect> {
        self.stopping = true;
        let mut out: Vec<Effect> = std::mem::take(&mut self.waiting)
            .into_iter()
            .filter_map(|(_, reply)| reply)
            .map(|reply| Effect::NotStarted {
                reply,
                error: RpcError::new(Code::ShuttingDown, "the daemon is stopping".to_string()),
            })
            .collect();
        let ids: Vec<String> = self
            .map
            .iter()
            .filter(|(_, s)| s.child.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        for sid in ids {
            self.stop_agent(&sid, &mut out);
        }
        out
    }

    /// Whether the daemon stops (`stop_all`): no agent starts any more.
    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// Reopens the sessions of the last run (module comment) but those in
    /// `not_needed`, once agents can start: the ledger read to do first.
    pub fn restore(
        &mut self,
        isolation: AgentIsolation,
        not_needed: HashSet<String>,
    ) -> Vec<Effect> {
        if self.sandbox(isolation) == AgentSandbox::Pending {
            self.restore_waiting = Some(not_needed);
            return Vec::new();
        }
        vec![Effect::ReadLastRun { not_needed }]
    }

    /// The live sessions of the last run, read back: each either ends (its
    /// rows) or is reopened (the rows that close its turn, then the start).
    /// The read ran while this run already served requests: a session this
    /// run holds is not the last run's.
    pub fn reopen(
        &mut self,
        seats: &Seats,
        rows: Vec<LiveRow>,
        not_needed: &HashSet<String>,
    ) -> Vec<(String, Vec<Op>, Option<Start>)> {
        let mut out = Vec::new();
        for (id, harness, cwd, name, model, agent_sid, mut restored) in rows {
            if self.map.contains_key(&id) {
                continue;
            }
            let mut ops = Vec::new();
            if restored.turn_active {
                // The turn that ran when the daemon stopped ended with it.
                let mut t = Transcript::restored(restored.transcript_len);
                t.push(
                    &id,
                    &Entry::TurnEnd {
                        reason: EndReason::Interrupted,
                    },
                    None,
                    false,
                    &mut ops,
                );
                // Nobody subscribes to a session not reopened yet: no delta.
                let _ = t.flush(&id, &mut ops);
                restored.transcript_len = t.len;
                restored.turn_active = false;
                restored.end_reason = Some("interrupted".into());
                ops.push(event_op(&id, "turn.end", json!({"reason": "interrupted"})));
            }
            let seat_ok = seats
                .get(&harness)
                .is_some_and(|s| s.transport.wire_name() == restored.transport);
            let needed = !not_needed.contains(&id);
            match (agent_sid, seat_ok && needed) {
                (Some(asid), true) => {
                    let start = Start {
                        id: id.clone(),
                        harness,
                        cwd: PathBuf::from(cwd),
                        name,
                        model,
                        prompt: None,
                        reopen: Some(asid),
                        restored: Some(restored),
                    };
                    out.push((id, ops, Some(start)));
                }
                (asid, _) => {
                    let why = if !needed {
                        "the lane that started it does not need it again"
                    } else if asid.is_none() {
                        "its agent never opened a session"
                    } else {
                        "its seat is gone or changed transport"
                    };
                    crate::warn!(
                        "session {id}: cannot be reopened after the restart ({why}); it has ended"
                    );
                    ops.push(event_op(
                        &id,
                        "session.end",
                        json!({"code": null, "signal": null}),
                    ));
                    ops.push(Op::Exec {
                        sql: "UPDATE sessions SET ended = 1, turn_active = 0, end_reason = coalesce(?2, end_reason), transcript_len = ?3 WHERE id = ?1",
                        params: vec![Sql::Text(id.clone()), restored.end_reason.clone().map(Sql::Text).unwrap_or(Sql::Null), Sql::Integer(restored.transcript_len as i64)],
                    });
                    out.push((id, ops, None));
                }
            }
        }
        out
    }
}

/// The command that starts a seat's agent, in its namespace when agents
/// are contained, and the agent's own empty runtime directory when it has
/// one: the user's runtime directory is then mounted over with an empty,
/// writable tmpfs (crate::isolation), which the agent finds through
/// XDG_RUNTIME_DIR as programs expect. An uncontained agent gets no
/// XDG_RUNTIME_DIR: the operator's would hand it the user's bus.
fn agent_command(
    sandbox: &AgentSandbox,
    hidden: Option<&Hidden>,
    program: &std::path::Path,
    cwd: &std::path::Path,
) -> (Command, Option<PathBuf>) {
    let (AgentSandbox::Namespace(bwrap), Some(hidden)) = (sandbox, hidden) else {
        return (Command::new(program), None);
    };
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|r| r.is_absolute())
        // SAFETY: getuid cannot fail and touches no memory.
        .unwrap_or_else(|| PathBuf::from(format!("/run/user/{}", unsafe { libc::getuid() })));
    let own =
        (hidden.dirs.contains(&runtime) && !hidden.read_only.contains(&runtime)).then_some(runtime);
    (crate::isolation::contain(bwrap, hidden, cwd, program), own)
}

/// The capability flags each transport really has (seed 000 session.start).
fn flags(t: Transport) -> Value {
    match t {
        Transport::Acp => json!({
            "interrupt": true, "steer": false, "queue": false, "fork": false,
            "approvalRouting": true, "mcpPassthrough": false, "usageReporting": false,
        }),
        // `queue` is false: the daemon holds queued prompts itself (see
        // agents::stream_json) and never uses the CLI's own queue.
        Transport::StreamJson => json!({
            "interrupt": true, "steer": false, "queue": false, "fork": false,
            "approvalRouting": true, "mcpPassthrough": false, "usageReporting": true,
        }),
    }
}

fn end_reason_from(s: &str) -> Option<EndReason> {
    match s {
        "completed" => Some(EndReason::Completed),
        "failed" => Some(EndReason::Failed),
        "interrupted" => Some(EndReason::Interrupted),
        "usage-limited" => Some(EndReason::UsageLimited),
        _ => None,
    }
}

/// What a committed round did to a session, as its watchers hear it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// New to this run of the daemon (spawned or reopened).
    Added,
    /// Its row changed.
    Updated,
}

/// Whether a socket caller of `class` may read session `sid` (its row,
/// its `session.event`s, its transcript): the operator every session, a
/// caller inside a session only that one, so that no agent reads what
/// another session does; anyone else (a plugin, which reads sessions
/// through its own wire and permission, or a caller not verified) none.
pub fn may_read(class: &CallerClass, sid: &str) -> bool {
    match class {
        CallerClass::Operator => true,
        CallerClass::AgentSession(Some(own)) => own == sid,
        _ => false,
    }
}

/// A live session row of the last run: id, harness, cwd, name, model,
/// agent session id, and the rest.
pub type LiveRow = (
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Restored,
);

pub fn read_live(conn: &rusqlite::Connection) -> rusqlite::Result<Vec<LiveRow>> {
    let mut stmt = conn.prepare(
        "SELECT id, harness, cwd, name, model, agent_session_id, created_at, turn, turn_active, end_reason, input_tokens, \
         output_tokens, next_request, transcript_len, provider, transport, parent FROM sessions WHERE ended = 0 ORDER BY created_at",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            Restored {
                created_at: r.get(6)?,
                turn: r.get::<_, i64>(7)?.max(0) as u64,
                turn_active: r.get::<_, i64>(8)? != 0,
                end_reason: r.get(9)?,
                input_tokens: r.get::<_, i64>(10)?.max(0) as u64,
                output_tokens: r.get::<_, i64>(11)?.max(0) as u64,
                next_request: r.get::<_, i64>(12)?.max(1) as u64,
                transcript_len: r.get::<_, i64>(13)?.max(0) as usize,
                provider: r.get(14)?,
                transport: r.get(15)?,
                parent: r.get(16)?,
            },
        ))
    })?;
    rows.collect()
}

#[cfg(test)]
mod eviction_tests {
    use super::*;

    #[test]
    fn only_the_oldest_ended_sessions_beyond_the_kept_count_go() {
        let order: Vec<String> = (0..8).map(|i| format!("s-{i}")).collect();
        // s-1, s-3, s-4, s-6 ended; s-0, s-2, s-5, s-7 live.
        let ended = |id: &str| ["s-1", "s-3", "s-4", "s-6"].contains(&id);
        assert_eq!(
            oldest_ended_beyond(&order, ended, 2),
            vec!["s-1".to_string(), "s-3".to_string()]
        );
        assert!(oldest_ended_beyond(&order, ended, 4).is_empty());
        assert_eq!(oldest_ended_beyond(&order, ended, 0).len(), 4);
    }
}

#[cfg(test)]
mod agent_env_tests {
    use super::*;

    #[test]
    fn provider_settings_and_proxies_pass_the_daemons_own_do_not() {
        for k in [
            "ANTHROPIC_API_KEY",
            "CLAUDE_CODE_USE_BEDROCK",
            "AWS_REGION",
            "OPENAI_BASE_URL",
            "GEMINI_API_KEY",
            "GOOGLE_CLOUD_PROJECT",
            "https_proxy",
            "NO_PROXY",
            "NODE_EXTRA_CA_CERTS",
            "HOME",
        ] {
            assert!(passed_to_agents(k), "{k}");
        }
        for k in [
            "OMNICONFLUX_SOCKET",
            "NOTIFY_SOCKET",
            "LISTEN_FDS",
            "XDG_RUNTIME_DIR",
            "DBUS_SESSION_BUS_ADDRESS",
            "SSH_AUTH_SOCK",
            "TERM",
            "GH_TOKEN",
        ] {
            assert!(!passed_to_agents(k), "{k}");
        }
    }
}

/// The driver in memory (issue 11): a session started on a stream-json
/// seat with no process behind it, fed the lines Claude Code printed in a
/// recorded turn (tests/fixtures/recordings/cc-bash-allow), its effects
/// read as the router would apply them.
#[cfg(test)]
mod driver_tests {
    use super::*;
    use crate::config::{FileConfig, SeatConfig};

    const CHILD: ChildId = 7;

    fn seats(transport: &str) -> Seats {
        let seat = SeatConfig {
            harness: "agent".into(),
            command: "agent".into(),
            transport: transport.into(),
            provider: "p".into(),
            family: "local".into(),
            ..SeatConfig::default()
        };
        Seats::from_config(&FileConfig {
            seat: vec![seat],
            ..FileConfig::default()
        })
    }

    /// A session started with `prompt` as if its stream-json agent ran as
    /// `CHILD`, and what the start returned.
    fn started(prompt: &str) -> (Sessions, String, Vec<Effect>) {
        started_on("stream-json", prompt)
    }

    fn started_on(transport: &str, prompt: &str) -> (Sessions, String, Vec<Effect>) {
        let mut ss = Sessions::default();
        let start = Start {
            id: "s-test".into(),
            harness: "agent".into(),
            cwd: std::env::temp_dir(),
            name: None,
            model: None,
            prompt: Some(prompt.into()),
            reopen: None,
            restored: None,
        };
        let sandbox = AgentSandbox::Uncontained("a test".into());
        let (_, prepared) = ss
            .prepare(&seats(transport), start, &sandbox, None)
            .expect("the seat is there");
        let (sid, fx) = ss.started(prepared, CHILD, 4242);
        (ss, sid, fx)
    }

    /// The events the effects record, in order, with their data.
    fn events(fx: &[Effect]) -> Vec<(String, Value)> {
        fx.iter()
            .filter_map(|e| match e {
                Effect::Record(Op::Event { kind, data, .. }) => {
                    Some((kind.clone(), serde_json::from_str(data).unwrap()))
                }
                _ => None,
            })
            .collect()
    }

    fn kinds(fx: &[Effect]) -> Vec<String> {
        events(fx).into_iter().map(|(k, _)| k).collect()
    }

    /// The lines the effects write to the agent, parsed.
    fn writes(fx: &[Effect]) -> Vec<Value> {
        fx.iter()
            .filter_map(|e| match e {
                Effect::Write { child, lines, .. } => {
                    assert_eq!(*child, CHILD);
                    Some(lines)
                }
                _ => None,
            })
            .flatten()
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }

    fn position(fx: &[Effect], f: impl Fn(&Effect) -> bool) -> usize {
        fx.iter().position(f).expect("the effect is there")
    }

    /// The lines Claude Code printed in a recorded turn.
    fn recording(name: &str) -> Vec<Vec<u8>> {
        let path = format!(
            "{}/tests/fixtures/recordings/{name}.jsonl",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(path)
            .expect("the recording")
            .lines()
            .map(|l| l.as_bytes().to_vec())
            .collect()
    }

    /// Feeds `lines`: every effect, in order.
    fn feed(ss: &mut Sessions, sid: &str, lines: &[Vec<u8>]) -> Vec<Effect> {
        let mut all = Vec::new();
        for line in lines {
            let (fx, go_on) = ss.on_line(sid, line, Instant::now(), 0);
            assert!(go_on, "{}", String::from_utf8_lossy(line));
            all.extend(fx);
        }
        all
    }

    /// Feeds the recorded turn up to its permission request: the ask.
    fn until_the_ask(ss: &mut Sessions, sid: &str) -> approvals::Ask {
        let lines = recording("cc-bash-allow");
        let fx = feed(ss, sid, &lines[..3]);
        let mut asks = fx.into_iter().filter_map(|e| match e {
            Effect::Ask(a) => Some(a),
            _ => None,
        });
        let ask = asks
            .next()
            .expect("the permission request goes to the inbox");
        assert!(asks.next().is_none());
        ask
    }

    #[test]
    fn a_recorded_turn_asks_the_inbox_hears_the_answer_and_ends() {
        let (mut ss, sid, fx) = started("please RUN_BASH now");
        assert_eq!(kinds(&fx), ["session.start", "turn.start"]);
        let w = writes(&fx);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0]["type"], "user");
        assert_eq!(w[0]["message"]["content"], "please RUN_BASH now");
        assert!(fx.iter().any(|e| matches!(
            e,
            Effect::Arm {
                timer: Timer::Stall { turn: 1, .. },
                ..
            }
        )));
        assert_eq!(ss.finish(&sid, true, 0).change, Some(Change::Added));
        assert_eq!(ss.get(&sid).unwrap().state(), State::Running);

        let ask = until_the_ask(&mut ss, &sid);
        assert_eq!(ask.id, format!("{sid}-a1"));
        assert_eq!(ask.session, sid);
        assert_eq!(ask.request.tool, "Bash");
        assert_eq!(ask.request.input["command"], "touch mock_created.txt");
        assert_eq!(ss.get(&sid).unwrap().state(), State::AwaitingApproval);
        let done = ss.finish(&sid, false, 0);
        assert_eq!(done.change, Some(Change::Updated));
        assert!(
            done.ops
                .iter()
                .any(|o| matches!(o, Op::Exec { sql, .. } if *sql == UPSERT_ROW))
        );

        // The operator allows: the agent is told, in the recorded shape.
        let fx = ss
            .answer(
                &sid,
                &ask.id,
                &ask.request.agent_request_key,
                Decision::Allow,
            )
            .unwrap()
            .expect("the agent is there");
        let w = writes(&fx);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0]["type"], "control_response");
        assert_eq!(w[0]["response"]["response"]["behavior"], "allow");
        assert_eq!(ss.get(&sid).unwrap().state(), State::Running);

        let rest = feed(&mut ss, &sid, &recording("cc-bash-allow")[3..]);
        assert_eq!(
            events(&rest),
            [("turn.end".to_string(), json!({"reason": "completed"}))]
        );
        assert!(
            rest.iter()
                .any(|e| matches!(e, Effect::Disarm(Timer::Stall { turn: 1, .. })))
        );
        assert_eq!(ss.get(&sid).unwrap().state(), State::Idle);
        assert!(ss.get(&sid).unwrap().can_prompt());
    }

    #[test]
    fn an_answer_the_agent_no_longer_waits_for_is_not_delivered() {
        let (mut ss, sid, _) = started("please RUN_BASH now");
        let ask = until_the_ask(&mut ss, &sid);
        let key = ask.request.agent_request_key.clone();
        assert!(
            ss.answer(&sid, &ask.id, &key, Decision::Allow)
                .unwrap()
                .is_some()
        );
        // A second answer to the same request: the core refuses it.
        assert!(
            ss.answer(&sid, &ask.id, &key, Decision::Deny { message: None })
                .is_err()
        );
        // No such session: nothing to deliver to.
        assert!(matches!(
            ss.answer("s-gone", &ask.id, &key, Decision::Allow),
            Ok(None)
        ));
    }

    #[test]
    fn a_broken_line_fails_the_turn_withdraws_the_ask_and_stops_the_agent() {
        let (mut ss, sid, _) = started("please RUN_BASH now");
        let ask = until_the_ask(&mut ss, &sid);
        let (fx, go_on) = ss.on_line(&sid, b"{not json", Instant::now(), 0);
        assert!(!go_on, "no more of its lines are read");
        assert_eq!(
            events(&fx),
            [("turn.end".to_string(), json!({"reason": "failed"}))]
        );
        let end = position(
            &fx,
            |e| matches!(e, Effect::Record(Op::Event { kind, .. }) if kind == "turn.end"),
        );
        let withdraw = position(
            &fx,
            |e| matches!(e, Effect::Withdraw { approval_id, delivered: false, .. } if *approval_id == ask.id),
        );
        let stop = position(&fx, |e| matches!(e, Effect::Stop { child: CHILD }));
        assert!(end < withdraw && withdraw < stop, "{fx:?}");
        assert!(fx.iter().any(|e| matches!(
            e,
            Effect::Arm {
                timer: Timer::Kill { child: CHILD },
                ..
            }
        )));
        let s = ss.get(&sid).unwrap();
        assert!(s.stopping_agent() && !s.turn_active && s.open.is_empty());
        // Stopped already: a full stdin queue adds nothing.
        assert!(ss.stdin_full(&sid).is_empty());
        // The kill timer finds the agent still there.
        assert!(matches!(
            ss.on_timer(Timer::Kill { child: CHILD }, Instant::now())[..],
            [Effect::Kill { child: CHILD }]
        ));
    }

    #[test]
    fn an_agent_that_exits_mid_turn_ends_its_session_last() {
        let (mut ss, sid, _) = started("please RUN_BASH now");
        let ask = until_the_ask(&mut ss, &sid);
        let status = ExitStatus {
            code: Some(1),
            signal: None,
        };
        // Its stdout is still open: the session ends when it closes.
        let (_, fx) = ss.on_exit(CHILD, status, true, b"").unwrap();
        assert!(matches!(
            &fx[..],
            [Effect::Arm {
                timer: Timer::ExitGrace { .. },
                ..
            }]
        ));
        assert_eq!(ss.take_exit_pending(&sid), Some(status));
        let fx = ss.ended(&sid, status, b"boom");
        assert!(matches!(fx[0], Effect::Release { child: CHILD }));
        assert_eq!(kinds(&fx), ["turn.end", "session.end"]);
        let withdraw = position(
            &fx,
            |e| matches!(e, Effect::Withdraw { approval_id, .. } if *approval_id == ask.id),
        );
        let end = position(
            &fx,
            |e| matches!(e, Effect::Record(Op::Event { kind, .. }) if kind == "session.end"),
        );
        assert!(withdraw < end);
        assert_eq!(ss.get(&sid).unwrap().state(), State::Ended);
        assert_eq!(ss.owner_of(CHILD), None);
        // Its kill timer, if one was armed, finds nothing to kill.
        assert!(
            ss.on_timer(Timer::Kill { child: CHILD }, Instant::now())
                .is_empty()
        );
    }

    #[test]
    fn a_quiet_turn_is_checked_again_then_failed_once_it_stalls() {
        let (mut ss, sid, _) = started("please RUN_BASH now");
        let stall = Duration::from_secs(limits::AGENT_STALL_DEFAULT_S);
        let timer = Timer::Stall {
            sid: sid.clone(),
            turn: 1,
        };
        // Not quiet long enough: armed again for what is left.
        let fx = ss.on_timer(timer.clone(), Instant::now());
        assert!(
            matches!(&fx[..], [Effect::Arm { timer: t, after }] if *t == timer && *after <= stall)
        );
        let fx = ss.on_timer(timer.clone(), Instant::now() + stall);
        assert_eq!(
            events(&fx),
            [("turn.end".to_string(), json!({"reason": "failed"}))]
        );
        assert!(
            fx.iter()
                .any(|e| matches!(e, Effect::Stop { child: CHILD }))
        );
        // A timer of an earlier turn changes nothing.
        let old = Timer::Stall { sid, turn: 0 };
        assert!(ss.on_timer(old, Instant::now() + stall).is_empty());
    }

    #[test]
    fn input_while_a_turn_runs_waits_and_a_stop_refuses_held_starts() {
        let (mut ss, sid, _) = started("please RUN_BASH now");
        let (accepted, fx) = ss.input(&sid, "next".into()).unwrap();
        assert_eq!(
            accepted,
            Accepted {
                queued: true,
                queue_length: 1
            }
        );
        assert!(writes(&fx).is_empty(), "held until the turn ends");
        assert_eq!(
            ss.input(&sid, "  ".into()).unwrap_err().code,
            Code::InvalidParams
        );
        let start = Start {
            id: "s-held".into(),
            harness: "agent".into(),
            cwd: std::env::temp_dir(),
            name: None,
            model: None,
            prompt: None,
            reopen: None,
            restored: None,
        };
        ss.hold(start, Some(ReplyKey(3)));
        let fx = ss.stop_all();
        assert!(matches!(
            &fx[0],
            Effect::NotStarted { reply: ReplyKey(3), error } if error.code == Code::ShuttingDown
        ));
        assert!(
            fx.iter()
                .any(|e| matches!(e, Effect::Stop { child: CHILD }))
        );
        // Ends while the daemon stops are not recorded.
        let status = ExitStatus {
            code: None,
            signal: Some(libc::SIGTERM),
        };
        let fx = ss.ended(&sid, status, b"");
        assert!(matches!(&fx[..], [Effect::Release { child: CHILD }]));
    }

    /// An ACP recording's lines: what the agent wrote (`A->C`) and what
    /// the client wrote (`C->A`), in order.
    fn acp_recording(name: &str) -> Vec<(bool, Vec<u8>)> {
        let path = format!(
            "{}/tests/fixtures/recordings/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(path)
            .expect("the recording")
            .lines()
            .filter_map(|l| {
                let (dir, json) = l.split_once("] ")?.1.split_once(' ')?;
                let from_agent = match dir {
                    "A->C" => true,
                    "C->A" => false,
                    _ => return None,
                };
                Some((from_agent, json.as_bytes().to_vec()))
            })
            .collect()
    }

    #[test]
    fn a_recorded_acp_turn_is_set_up_asks_with_options_and_ends() {
        let (mut ss, sid, fx) = started_on("acp", "hello");
        assert_eq!(writes(&fx)[0]["method"], "initialize");
        assert_eq!(ss.get(&sid).unwrap().state(), State::Starting);
        let rec = acp_recording("acp-zed-example-allow.log");
        let from_agent: Vec<Vec<u8>> = rec
            .iter()
            .filter(|(a, _)| *a)
            .map(|(_, l)| l.clone())
            .collect();
        let mut before = Vec::new();
        let mut fed = 0;
        let ask = loop {
            let fx = feed(&mut ss, &sid, &from_agent[fed..fed + 1]);
            fed += 1;
            let ask = fx.iter().find_map(|e| match e {
                Effect::Ask(a) => Some(a.clone()),
                _ => None,
            });
            before.extend(fx);
            if let Some(a) = ask {
                break a;
            }
        };
        assert_eq!(kinds(&before), ["turn.start"]);
        let s = ss.get(&sid).unwrap();
        assert_eq!(s.agent_session_id.as_deref(), Some("dz7a6gndsb"));
        assert_eq!(s.state(), State::AwaitingApproval);
        assert!(!ask.request.options.is_empty());
        assert_eq!(ask.request.title, "Modifying critical configuration file");

        let fx = ss
            .answer(
                &sid,
                &ask.id,
                &ask.request.agent_request_key,
                Decision::Allow,
            )
            .unwrap()
            .expect("the agent is there");
        // What the recorded client answered.
        let recorded = rec
            .iter()
            .filter(|(a, _)| !*a)
            .map(|(_, l)| serde_json::from_slice::<Value>(l).unwrap())
            .find(|v| v.get("result").is_some_and(|r| r.get("outcome").is_some()))
            .expect("the recorded answer");
        assert_eq!(writes(&fx), [recorded]);

        let rest = feed(&mut ss, &sid, &from_agent[fed..]);
        assert_eq!(
            events(&rest),
            [("turn.end".to_string(), json!({"reason": "completed"}))]
        );
        assert_eq!(ss.get(&sid).unwrap().state(), State::Idle);
    }
}
