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
//! when it exits, with its code and signal.
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
//! What other subsystems and the surfaces get from here is typed, never a
//! surface's JSON: [`spawn`] takes a [`SpawnRequest`] and answers
//! [`Spawned`]; `input`, `interrupt` and `kill` answer [`Accepted`], a bool
//! and [`Killed`]; a session's [`State`] and [`Summary`] carry no wire
//! names (each surface names the state once, in its own view).

use crate::ledger::WriteError;
use rusqlite::types::Value as Sql;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::agents::acp::{AcpClient, AcpConfig};
use crate::agents::stream_json::{self, StreamJsonClient};
use crate::agents::{
    AgentEvent, Capabilities, CommandError, Decision, EndReason, Entry, FsRequest,
    PermissionRequest, Retry, Step, Transport, Violation,
};
use crate::children::{ChildId, ExitStatus, Output, PipeLimits, WriteRefused};
use crate::core::approvals;
use crate::core::transcript::{Delta, Transcript};
use crate::daemon::Daemon;
use crate::errors::{Code, RpcError};
use crate::ledger::Op;
use crate::limits;
use crate::procs::{CallerClass, Owner, signal_name};
use crate::reactor::TimerId;

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
    pub tool: String,
    pub preview: String,
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
    stall_timer: Option<TimerId>,
    last_state: State,
    /// `transcript_len` as last written to the session's row.
    row_transcript_len: usize,
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
    waiting: Vec<(Start, Reply)>,
    /// A restore asked for before the probe answered: it runs once the
    /// probe has, so that `then` sees the reopened sessions in place.
    restore_waiting: Option<Restore>,
}

impl Sessions {
    pub fn get(&self, id: &str) -> Option<&Session> {
        self.map.get(id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Session> {
        self.map.get_mut(id)
    }

    /// Sessions in creation order.
    /// The summary of session `id`, when the daemon holds it.
    pub fn summary(&self, id: &str) -> Option<Summary<'_>> {
        self.map.get(id).map(Session::summary)
    }

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
    /// those of a session no longer held.
    pub fn evict_ended(&mut self, keep: usize) -> Vec<String> {
        let map = &self.map;
        let gone = oldest_ended_beyond(
            &self.order,
            |id| map.get(id).is_some_and(|s| s.ended && s.child.is_none()),
            keep,
        );
        if gone.is_empty() {
            return gone;
        }
        let set: HashSet<&str> = gone.iter().map(String::as_str).collect();
        self.order.retain(|id| !set.contains(id.as_str()));
        for id in &gone {
            self.map.remove(id);
        }
        self.by_child.retain(|_, id| !set.contains(id.as_str()));
        gone
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn owner_of(&self, child: ChildId) -> Option<&str> {
        self.by_child.get(&child).map(String::as_str)
    }

    /// Hands the operator's `decision` on approval `approval_id` (the
    /// agent's request `key`) to session `sid`'s agent: the step to apply,
    /// or None when the session or its agent is gone. The request is no
    /// longer open unless the agent offered no option for the decision.
    pub fn answer(
        &mut self,
        sid: &str,
        approval_id: &str,
        key: &str,
        decision: Decision,
    ) -> Result<Option<Step>, CommandError> {
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
        answered.map(Some)
    }
}

/// The ids, oldest first, of the ended sessions in `order` beyond the
/// newest `keep` ended ones.
fn oldest_ended_beyond(order: &[String], ended: impl Fn(&str) -> bool, keep: usize) -> Vec<String> {
    let ended: Vec<&String> = order.iter().filter(|id| ended(id)).collect();
    let over = ended.len().saturating_sub(keep);
    ended.into_iter().take(over).cloned().collect()
}

/// What one round of handling a session produced, committed together.
#[derive(Default)]
pub struct Effects {
    pub ops: Vec<Op>,
    pub delta: Option<Delta>,
    pub changed: bool,
}

impl Effects {
    pub fn event(&mut self, sid: &str, kind: &str, data: Value) {
        self.ops.push(Op::Event {
            stream: sid.to_string(),
            kind: kind.to_string(),
            ts: crate::clock::now_ts(),
            data: data.to_string(),
        });
    }
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

/// What a caller of [`spawn`] asks for: the socket, the HTTP API and the
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

/// A session [`spawn`] started, once its session.start is committed.
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

/// What a new or reopened session starts from.
struct Start {
    id: String,
    harness: String,
    cwd: PathBuf,
    name: Option<String>,
    model: Option<String>,
    prompt: Option<String>,
    reopen: Option<String>,
    restored: Option<Restored>,
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

/// `sessions.spawn`: starts the seat's agent; `then` gets `{session_id}`
/// once session.start is committed (the socket adds its view of the
/// session to its answer).
pub fn spawn(
    d: &mut Daemon,
    p: SpawnRequest,
    then: impl FnOnce(&mut Daemon, Result<Spawned, RpcError>) + 'static,
) {
    let checked = (|| -> Result<Start, RpcError> {
        let seat = d.core.seats.get(&p.harness).ok_or_else(|| {
            RpcError::new(
                Code::SeatNotFound,
                format!("no seat has the harness {}", p.harness),
            )
        })?;
        if let Some(
            st @ (crate::core::seats::Status::Missing | crate::core::seats::Status::Degraded),
        ) = seat.status
        {
            let why = seat.reason.clone().unwrap_or_default();
            return Err(RpcError::new(
                Code::SeatNotReady,
                format!("the seat {} is {}: {why}", p.harness, st.wire_name()),
            ));
        }
        for id in d.core.sessions.evict_ended(limits::SESSIONS_ENDED_KEPT) {
            crate::debug!("session {id}: ended, no longer held in memory");
        }
        if d.core.sessions.len() + d.core.sessions.waiting.len() >= limits::MAX_SESSIONS {
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
        Ok(Start {
            id: crate::ids::prefixed_id("s-"),
            harness: p.harness.clone(),
            cwd,
            name,
            model: p.model.clone().or_else(|| seat.cfg.model.clone()),
            prompt: p.prompt.clone(),
            reopen: None,
            restored: None,
        })
    })();
    match checked {
        Ok(start) => launch(d, start, Box::new(then)),
        Err(e) => then(d, Err(e)),
    }
}

type Reply = Box<dyn FnOnce(&mut Daemon, Result<Spawned, RpcError>)>;

/// A restore's arguments: the sessions not to reopen, and what runs after.
type Restore = (HashSet<String>, fn(&mut Daemon));

/// How agents run now: `[agents] isolation` and the probe.
pub fn sandbox(d: &Daemon) -> crate::isolation::AgentSandbox {
    crate::isolation::AgentSandbox::decide(d.cfg.agents.isolation(), d.core.sessions.probe.as_ref())
}

/// The machine's bubblewrap probe answered: say how agents run, then start
/// the sessions that waited for it.
pub fn isolation_known(d: &mut Daemon, probe: &crate::isolation::Probe) {
    d.core.sessions.probe = Some(probe.clone());
    match sandbox(d) {
        crate::isolation::AgentSandbox::Namespace(bwrap) => {
            crate::info!(
                "agents run contained, in a namespace of {}",
                bwrap.display()
            );
            if crate::isolation::runs_as_root() {
                crate::warn!("agents run as root: they can write root-owned files such as /etc");
            }
        }
        crate::isolation::AgentSandbox::Uncontained(why)
            if d.cfg.agents.isolation() == crate::config::AgentIsolation::None =>
        {
            crate::info!("agents run uncontained: {why}")
        }
        crate::isolation::AgentSandbox::Uncontained(why) => {
            crate::warn!("agents run uncontained, with every power of the operator's user: {why}")
        }
        crate::isolation::AgentSandbox::Pending => {}
    }
    for (st, then) in std::mem::take(&mut d.core.sessions.waiting) {
        if d.is_stopping() {
            then(
                d,
                Err(RpcError::new(
                    Code::ShuttingDown,
                    "the daemon is stopping".to_string(),
                )),
            );
        } else {
            launch(d, st, then);
        }
    }
    if let Some((not_needed, then)) = d.core.sessions.restore_waiting.take() {
        restore(d, not_needed, then);
    }
}

/// The command that starts a seat's agent, in its namespace when agents
/// are contained, and the agent's own empty runtime directory when it has
/// one: the user's runtime directory is then mounted over with an empty,
/// writable tmpfs (crate::isolation), which the agent finds through
/// XDG_RUNTIME_DIR as programs expect. An uncontained agent gets no
/// XDG_RUNTIME_DIR: the operator's would hand it the user's bus.
fn agent_command(
    d: &Daemon,
    sandbox: &crate::isolation::AgentSandbox,
    program: &std::path::Path,
    cwd: &std::path::Path,
) -> (Command, Option<PathBuf>) {
    let crate::isolation::AgentSandbox::Namespace(bwrap) = sandbox else {
        return (Command::new(program), None);
    };
    let hidden = crate::isolation::hidden_for(d);
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|r| r.is_absolute())
        // SAFETY: getuid cannot fail and touches no memory.
        .unwrap_or_else(|| PathBuf::from(format!("/run/user/{}", unsafe { libc::getuid() })));
    let own =
        (hidden.dirs.contains(&runtime) && !hidden.read_only.contains(&runtime)).then_some(runtime);
    (crate::isolation::contain(bwrap, &hidden, cwd, program), own)
}

/// Starts the agent of a new or reopened session and records it.
fn launch(d: &mut Daemon, st: Start, then: Reply) {
    let sandbox = sandbox(d);
    if sandbox == crate::isolation::AgentSandbox::Pending {
        d.core.sessions.waiting.push((st, then));
        return;
    }
    let Some(seat) = d.core.seats.get(&st.harness).cloned() else {
        then(
            d,
            Err(RpcError::new(
                Code::SeatNotFound,
                format!("no seat has the harness {}", st.harness),
            )),
        );
        return;
    };
    let program = seat
        .program
        .clone()
        .unwrap_or_else(|| PathBuf::from(&seat.cfg.command));
    let (mut cmd, runtime) = agent_command(d, &sandbox, &program, &st.cwd);
    cmd.args(&seat.cfg.args);
    if seat.transport == Transport::StreamJson {
        cmd.args(stream_json::BASE_ARGS);
        if let Some(m) = &st.model {
            cmd.args(["--model", m]);
        }
        if let Some(r) = &st.reopen {
            cmd.args(stream_json::resume_args(r));
        }
    }
    cmd.current_dir(&st.cwd);
    agent_env(&mut cmd, &st.id, runtime.as_deref(), &seat.cfg.env);
    let limits = PipeLimits {
        max_line: limits::AGENT_MAX_LINE,
        max_queued: limits::AGENT_STDIN_QUEUED,
        stderr_tail: limits::AGENT_STDERR_TAIL,
    };
    let spawned = d.children.spawn(
        d.reactor.poll.registry(),
        &mut d.roots,
        cmd,
        Owner::Session(st.id.clone()),
        limits,
    );
    let (child, pid) = match spawned {
        Ok(c) => c,
        Err(e) => {
            let msg = crate::children::spawn_error(&seat.cfg.command, &e);
            crate::warn!("session {}: {msg}", st.id);
            then(d, Err(RpcError::new(Code::SeatNotReady, msg)));
            return;
        }
    };
    let contained = matches!(sandbox, crate::isolation::AgentSandbox::Namespace(_));
    if contained {
        d.children.set_sandboxed(child);
    }
    let driver = match seat.transport {
        Transport::Acp => Driver::Acp(AcpClient::new(AcpConfig {
            worktree: st.cwd.clone(),
            reopen: st.reopen.clone(),
        })),
        Transport::StreamJson => Driver::StreamJson(StreamJsonClient::new()),
    };
    let now = crate::clock::now_ms();
    let r = st.restored.clone();
    let s = Session {
        id: st.id.clone(),
        harness: seat.cfg.harness.clone(),
        provider: r
            .as_ref()
            .map_or(seat.cfg.provider.clone(), |r| r.provider.clone()),
        transport: seat.transport,
        cwd: st.cwd.clone(),
        name: st.name.clone(),
        parent: r.as_ref().and_then(|r| r.parent.clone()),
        model: st.model.clone(),
        created_at: r
            .as_ref()
            .map_or_else(crate::clock::now_ts, |r| r.created_at.clone()),
        agent_session_id: st.reopen.clone(),
        capabilities: Capabilities::default(),
        // The CLI of stream-json takes input at once; an ACP agent after
        // its handshake.
        ready: seat.transport == Transport::StreamJson,
        ended: false,
        turn: r.as_ref().map_or(0, |r| r.turn),
        turn_active: false,
        end_reason: r
            .as_ref()
            .and_then(|r| r.end_reason.as_deref())
            .and_then(end_reason_from),
        exit: None,
        input_tokens: r.as_ref().map_or(0, |r| r.input_tokens),
        output_tokens: r.as_ref().map_or(0, |r| r.output_tokens),
        last_activity_ms: Some(now),
        status_since_ms: now,
        retry: None,
        next_request: r.as_ref().map_or(1, |r| r.next_request),
        open: Vec::new(),
        transcript: Transcript::restored(r.as_ref().map_or(0, |r| r.transcript_len)),
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
    let mut fx = Effects::default();
    if st.restored.is_none() {
        fx.event(
            &sid,
            "session.start",
            json!({
                "harness": s.harness,
                "provider": s.provider,
                "transport": s.transport.wire_name(),
                "flags": flags(s.transport),
            }),
        );
    }
    fx.changed = true;
    d.core.sessions.by_child.insert(child, sid.clone());
    d.core.sessions.order.push(sid.clone());
    d.core.sessions.map.insert(sid.clone(), s);
    let started = d
        .core
        .sessions
        .map
        .get_mut(&sid)
        .and_then(|s| s.driver.as_mut())
        .map(|drv| drv.start(st.prompt.clone()));
    match started {
        Some(Ok(step)) => handle_step(d, &sid, step, &mut fx),
        Some(Err(e)) => crate::warn!("session {sid}: {e}"),
        None => {}
    }
    // A reopened session is new to this run of the daemon too: `added`.
    let key = sid.clone();
    finish(
        d,
        &key,
        fx,
        true,
        Some(Box::new(
            move |d: &mut Daemon, r: Result<(), WriteError>| {
                if let Err(e) = r {
                    return then(d, Err(RpcError::from(e)));
                }
                then(d, Ok(Spawned { session_id: sid }));
            },
        )),
    );
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

/// Work to do on the reactor once a round's records are committed, given
/// the write's result: on an error nothing was committed, and a caller
/// answering a request answers the error.
pub type After = Box<dyn FnOnce(&mut Daemon, Result<(), WriteError>)>;

/// Commits what a round produced; after the commit, the transcript delta
/// goes to its subscribers and the session's update (or, for a new
/// session, `added`) to the watchers, then `after` runs. When the ledger
/// refuses the records nothing is announced; `after` gets the error.
pub fn finish(d: &mut Daemon, sid: &str, mut fx: Effects, added: bool, after: Option<After>) {
    if let Some(s) = d.core.sessions.map.get_mut(sid) {
        // The round's transcript text goes into this batch, its delta out
        // after the commit.
        if let Some(delta) = s.transcript.flush(sid, &mut fx.ops) {
            Delta::merge(&mut fx.delta, delta);
        }
        let state = s.state();
        if state != s.last_state {
            s.last_state = state;
            s.status_since_ms = crate::clock::now_ms();
            fx.changed = true;
        }
        // The row is rewritten when the session changed or its transcript
        // got an entry (`transcript_len` is what a restart resumes from),
        // not for every round of text chunks: those change only
        // `last_activity`, which is written with the next change.
        if fx.changed || s.transcript.len != s.row_transcript_len {
            s.row_transcript_len = s.transcript.len;
            fx.ops.push(s.row_op());
        }
    }
    if fx.ops.is_empty() {
        if let Some(a) = after {
            a(d, Ok(()));
        }
        return;
    }
    let sid = sid.to_string();
    let (delta, changed) = (fx.delta.take(), fx.changed);
    d.write(fx.ops, move |d, r| {
        if let Err(e) = r {
            crate::error!("session {sid}: the ledger refused its records: {e}");
            if let Some(a) = after {
                a(d, Err(e));
            }
            return;
        }
        let change = match (added, changed) {
            (true, _) => Some(Change::Added),
            (false, true) => Some(Change::Updated),
            (false, false) => None,
        };
        d.session_committed(&sid, delta, change);
        if let Some(a) = after {
            a(d, Ok(()));
        }
    });
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

/// Routes a child's output to its session.
pub fn on_output(d: &mut Daemon, child: ChildId, out: Vec<Output>) {
    let Some(sid) = d.core.sessions.by_child.get(&child).cloned() else {
        return;
    };
    let mut fx = Effects::default();
    // One clock read for the lines of one wake-up, not one per line.
    let (now, now_ms) = (Instant::now(), crate::clock::now_ms());
    for o in out {
        match o {
            Output::Line(line) => {
                let Some(s) = d.core.sessions.map.get_mut(&sid) else {
                    return;
                };
                s.last_line = now;
                s.last_activity_ms = Some(now_ms);
                let Some(drv) = s.driver.as_mut() else {
                    continue;
                };
                match drv.on_line(&line) {
                    Ok(step) => handle_step(d, &sid, step, &mut fx),
                    Err(v) => {
                        broke(d, &sid, &v.reason, &mut fx);
                        break;
                    }
                }
            }
            Output::LineTooLong => {
                let reason = format!("a line over {} bytes", limits::AGENT_MAX_LINE);
                broke(d, &sid, &reason, &mut fx);
                break;
            }
            Output::StdoutClosed => {
                let pending = d
                    .core
                    .sessions
                    .map
                    .get_mut(&sid)
                    .and_then(|s| s.exit_pending.take());
                if let Some(status) = pending {
                    finish(d, &sid, fx, false, None);
                    ended(d, &sid, status);
                    return;
                }
            }
            Output::StdinClosed => {}
        }
    }
    finish(d, &sid, fx, false, None);
}

/// The agent broke its transport's protocol.
fn broke(d: &mut Daemon, sid: &str, reason: &str, fx: &mut Effects) {
    crate::warn!("session {sid}: the agent broke its transport with {reason}; stopping it");
    fail_turn(
        d,
        sid,
        &format!("the agent broke its transport: {reason}"),
        fx,
    );
    stop_agent(d, sid);
}

/// Ends the running turn failed (the daemon's own judgement: a violation,
/// a stall, an agent that does not read), recording why.
fn fail_turn(d: &mut Daemon, sid: &str, why: &str, fx: &mut Effects) {
    let Some(s) = d.core.sessions.map.get_mut(sid) else {
        return;
    };
    let ts = crate::clock::now_ts();
    s.transcript.push(
        sid,
        &Entry::System {
            text: why.to_string(),
        },
        Some(&ts),
        true,
        &mut fx.ops,
    );
    if s.turn_active {
        s.transcript.push(
            sid,
            &Entry::TurnEnd {
                reason: EndReason::Failed,
            },
            Some(&ts),
            false,
            &mut fx.ops,
        );
        end_turn_state(d, sid, EndReason::Failed, fx);
    }
    withdraw_open(d, sid, "the turn ended", fx);
    fx.changed = true;
}

fn end_turn_state(d: &mut Daemon, sid: &str, reason: EndReason, fx: &mut Effects) {
    let Some(s) = d.core.sessions.map.get_mut(sid) else {
        return;
    };
    s.turn_active = false;
    s.end_reason = Some(reason);
    s.retry = None;
    if let Some(t) = s.stall_timer.take() {
        d.reactor.cancel(t);
    }
    fx.event(sid, "turn.end", json!({"reason": reason.wire_name()}));
    fx.changed = true;
}

/// Withdraws every approval of the session still open (delivered false).
fn withdraw_open(d: &mut Daemon, sid: &str, why: &str, fx: &mut Effects) {
    let Some(s) = d.core.sessions.map.get_mut(sid) else {
        return;
    };
    let ids: Vec<String> = s.open.drain(..).map(|a| a.approval_id).collect();
    for id in ids {
        crate::daemon::router::sessions::close(
            d,
            &id,
            crate::core::inbox::Verdict::Cancel,
            crate::core::inbox::Answerer::Daemon(why.into()),
            "daemon",
            false,
            None,
            &mut fx.ops,
        );
    }
}

/// Applies what a core reported: its lines to the agent's stdin, its
/// events to the session.
pub fn handle_step(d: &mut Daemon, sid: &str, step: Step, fx: &mut Effects) {
    let Some(child) = d.core.sessions.map.get(sid).and_then(|s| s.child) else {
        return;
    };
    for w in &step.writes {
        match d.children.write(d.reactor.poll.registry(), child, w) {
            Ok(()) => {}
            Err(WriteRefused::Closed) => break,
            Err(WriteRefused::Full) => {
                crate::warn!("session {sid}: the agent does not read its input; stopping it");
                fail_turn(d, sid, "the agent stopped reading its input", fx);
                stop_agent(d, sid);
                break;
            }
        }
    }
    for ev in step.events {
        on_event(d, sid, ev, fx);
    }
}

fn on_event(d: &mut Daemon, sid: &str, ev: AgentEvent, fx: &mut Effects) {
    let Some(s) = d.core.sessions.map.get_mut(sid) else {
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
            fx.changed = true;
        }
        AgentEvent::SetupFailed { detail } => {
            crate::warn!("session {sid}: the agent could not set up a session: {detail}");
            let ts = crate::clock::now_ts();
            s.transcript.push(
                sid,
                &Entry::System {
                    text: format!("the agent could not set up a session: {detail}"),
                },
                Some(&ts),
                true,
                &mut fx.ops,
            );
            stop_agent(d, sid);
        }
        AgentEvent::TurnStarted { chars } => {
            s.turn += 1;
            s.turn_active = true;
            s.end_reason = None;
            s.last_line = Instant::now();
            let (turn, stall) = (s.turn, s.stall);
            // Seed 000 also has mode `queue`, for a prompt the agent had
            // queued itself; the daemon never lets an agent queue (it holds
            // prompts until the turn ends, omniconfluxd(8) sessions.input),
            // so every turn starts with `prompt`.
            fx.event(
                sid,
                "turn.start",
                json!({"turn": turn, "mode": "prompt", "chars": chars}),
            );
            fx.changed = true;
            arm_stall(d, sid, turn, stall);
        }
        AgentEvent::Transcript(entry) => {
            if matches!(entry, Entry::TurnEnd { .. }) && !s.turn_active {
                return;
            }
            s.transcript.push(sid, &entry, None, false, &mut fx.ops);
        }
        AgentEvent::PermissionRequest(req) => permission(d, sid, req, fx),
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
            crate::daemon::router::sessions::close(
                d,
                &a.approval_id,
                crate::core::inbox::Verdict::Cancel,
                crate::core::inbox::Answerer::Daemon(why.into()),
                "daemon",
                delivered,
                None,
                &mut fx.ops,
            );
            fx.changed = true;
        }
        AgentEvent::Fs(req) => fs_request(d, sid, req, fx),
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
            end_turn_state(d, sid, reason, fx);
        }
        AgentEvent::Usage(u) => {
            if u.model.is_some() {
                s.model = u.model;
            }
            s.input_tokens += u.input_tokens;
            s.output_tokens += u.output_tokens;
            fx.changed = true;
        }
        AgentEvent::SignIn(state) => {
            let h = s.harness.clone();
            d.core.seats.note_sign_in(&h, state);
        }
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
            fx.changed = true;
        }
    }
}

fn permission(d: &mut Daemon, sid: &str, req: PermissionRequest, fx: &mut Effects) {
    let Some(s) = d.core.sessions.map.get_mut(sid) else {
        return;
    };
    let n = s.next_request;
    s.next_request += 1;
    let approval_id = format!("{sid}-a{n}");
    let input_text = req.input.to_string();
    s.open.push(OpenAsk {
        key: req.agent_request_key.clone(),
        approval_id: approval_id.clone(),
        tool: req.title.clone(),
        preview: crate::core::transcript::preview(&input_text),
    });
    fx.changed = true;
    let ask = approvals::Ask {
        session: sid.to_string(),
        id: approval_id,
        request: req,
        cwd: s.cwd.clone(),
    };
    let now = crate::clock::now_ms();
    let effects =
        approvals::add_agent_request(&mut d.core.approvals, &d.cfg, &ask, now, &mut fx.ops);
    crate::daemon::router::sessions::inbox(d, effects, fx);
}

/// ACP fs/*: the core checked the path lexically; `agentfs` opens the file
/// beneath a descriptor of the worktree, so no symlink can lead out, and
/// reads only regular files without blocking.
fn fs_request(d: &mut Daemon, sid: &str, req: FsRequest, fx: &mut Effects) {
    let Some(s) = d.core.sessions.map.get_mut(sid) else {
        return;
    };
    let cwd = s.cwd.clone();
    let Some(Driver::Acp(c)) = s.driver.as_mut() else {
        return;
    };
    let step = match req {
        FsRequest::Read { key, path } => {
            let r = crate::core::agentfs::read_text(&cwd, &path.to_string_lossy());
            c.answer_fs_read(&key, r)
        }
        FsRequest::Write { key, path, content } => {
            let r = crate::core::agentfs::write_text(&cwd, &path.to_string_lossy(), &content);
            c.answer_fs_write(&key, r)
        }
    };
    if let Ok(step) = step {
        handle_step(d, sid, step, fx);
    }
}

fn arm_stall(d: &mut Daemon, sid: &str, turn: u64, after: Duration) {
    let id = sid.to_string();
    let t = d
        .reactor
        .schedule(after, move |d| check_stall(d, &id, turn));
    if let Some(s) = d.core.sessions.map.get_mut(sid) {
        if let Some(old) = s.stall_timer.replace(t) {
            d.reactor.cancel(old);
        }
    }
}

fn check_stall(d: &mut Daemon, sid: &str, turn: u64) {
    let Some(s) = d.core.sessions.map.get_mut(sid) else {
        return;
    };
    s.stall_timer = None;
    if !s.turn_active || s.turn != turn || s.ended {
        return;
    }
    let (stall, quiet) = (s.stall, s.last_line.elapsed());
    if !s.open.is_empty() {
        // Waiting on the operator is not the agent stalling.
        arm_stall(d, sid, turn, stall);
        return;
    }
    if quiet < stall {
        arm_stall(d, sid, turn, stall - quiet);
        return;
    }
    crate::warn!(
        "session {sid}: the agent wrote nothing for {} s in turn {turn}; stopping it",
        stall.as_secs()
    );
    let mut fx = Effects::default();
    fail_turn(
        d,
        sid,
        &format!("the agent stalled: nothing for {} s", stall.as_secs()),
        &mut fx,
    );
    stop_agent(d, sid);
    finish(d, sid, fx, false, None);
}

/// Asks the agent to exit: stdin closed, SIGTERM to its group, SIGKILL
/// after the grace period.
pub fn stop_agent(d: &mut Daemon, sid: &str) {
    let Some(s) = d.core.sessions.map.get_mut(sid) else {
        return;
    };
    let Some(child) = s.child else { return };
    if s.stopping_agent {
        return;
    }
    s.stopping_agent = true;
    d.children.close_stdin(d.reactor.poll.registry(), child);
    d.children.signal(child, libc::SIGTERM);
    d.reactor.schedule(
        Duration::from_millis(limits::AGENT_KILL_GRACE_MS),
        move |d| {
            if d.core.sessions.by_child.contains_key(&child) {
                d.children.signal(child, libc::SIGKILL);
            }
        },
    );
}

/// Routes a reaped agent's exit to its session.
pub fn on_exit(d: &mut Daemon, child: ChildId, status: ExitStatus) {
    let Some(sid) = d.core.sessions.by_child.get(&child).cloned() else {
        return;
    };
    let status = if d.children.is_sandboxed(child) {
        status.through_bwrap()
    } else {
        status
    };
    if d.children.stdout_open(child) {
        // Lines it wrote before exiting are still in the pipe: finish when
        // stdout closes, or after the grace period if a descendant holds it.
        if let Some(s) = d.core.sessions.map.get_mut(&sid) {
            s.exit_pending = Some(status);
        }
        let id = sid.clone();
        d.reactor.schedule(
            Duration::from_millis(limits::AGENT_KILL_GRACE_MS),
            move |d| {
                let pending = d
                    .core
                    .sessions
                    .map
                    .get_mut(&id)
                    .and_then(|s| s.exit_pending.take());
                if let Some(st) = pending {
                    ended(d, &id, st);
                }
            },
        );
        return;
    }
    ended(d, &sid, status);
}

/// The agent is gone: the turn it ran ends, open approvals are withdrawn,
/// session.end is recorded (not while the daemon stops: see the module
/// comment).
fn ended(d: &mut Daemon, sid: &str, status: ExitStatus) {
    let Some(s) = d.core.sessions.map.get_mut(sid) else {
        return;
    };
    let Some(child) = s.child.take() else { return };
    d.core.sessions.by_child.remove(&child);
    let tail = d.children.stderr_tail(child);
    d.children.remove(d.reactor.poll.registry(), child);
    if d.core.sessions.stopping {
        return;
    }
    let Some(s) = d.core.sessions.map.get_mut(sid) else {
        return;
    };
    let mut fx = Effects::default();
    if let Some(mut drv) = s.driver.take() {
        let step = drv.on_exit(status.code);
        for ev in step.events {
            if let AgentEvent::TurnEnded { reason, detail } = &ev {
                if d.core.sessions.get(sid).is_some_and(|s| s.turn_active)
                    && *reason != EndReason::Interrupted
                {
                    let why = detail.clone().unwrap_or_else(|| "the agent exited".into());
                    crate::warn!("session {sid}: the agent exited mid-turn ({why})");
                    if let Some(s) = d.core.sessions.map.get_mut(sid) {
                        let ts = crate::clock::now_ts();
                        s.transcript.push(
                            sid,
                            &Entry::System { text: why },
                            Some(&ts),
                            true,
                            &mut fx.ops,
                        );
                    }
                }
            }
            on_event(d, sid, ev, &mut fx);
        }
    }
    withdraw_open(d, sid, "the agent exited", &mut fx);
    let Some(s) = d.core.sessions.map.get_mut(sid) else {
        return;
    };
    s.ended = true;
    s.exit = Some(status);
    if let Some(t) = s.stall_timer.take() {
        d.reactor.cancel(t);
    }
    let signal = status.signal.map(signal_name);
    let clean = status.code == Some(0) || s.stopping_agent;
    let tail = String::from_utf8_lossy(&tail).trim().replace('\n', " | ");
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
    fx.event(
        sid,
        "session.end",
        json!({"code": status.code, "signal": signal}),
    );
    fx.changed = true;
    finish(d, sid, fx, false, None);
}

/// `sessions.input`: a prompt now, or queued behind the running turn.
/// What [`input`] did with a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// A turn was running or the agent was not set up: the prompt waits.
    pub queued: bool,
    /// Prompts waiting now.
    pub queue_length: usize,
}

/// What [`kill`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Killed {
    /// The session had ended already.
    AlreadyEnded,
    /// Its agent is being stopped; session.end follows its exit.
    Stopping,
}

pub fn input(d: &mut Daemon, sid: &str, text: String) -> Result<Accepted, RpcError> {
    check_prompt(&text)?;
    let s = d
        .core
        .sessions
        .map
        .get_mut(sid)
        .ok_or_else(|| not_found(sid))?;
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
    let mut fx = Effects {
        changed: true,
        ..Effects::default()
    };
    handle_step(d, sid, step, &mut fx);
    let queued = d.core.sessions.get(sid).map_or(0, Session::queued);
    finish(d, sid, fx, false, None);
    Ok(Accepted {
        queued: was_busy,
        queue_length: queued,
    })
}

/// `sessions.interrupt`: the running turn is cancelled, every open
/// permission answered cancelled; the turn ends interrupted. Answers
/// whether a turn was running.
pub fn interrupt(d: &mut Daemon, sid: &str) -> Result<bool, RpcError> {
    let s = d
        .core
        .sessions
        .map
        .get_mut(sid)
        .ok_or_else(|| not_found(sid))?;
    let active = s.turn_active && !s.ended;
    let Some(drv) = s.driver.as_mut() else {
        return Ok(false);
    };
    let step = drv.interrupt();
    let mut fx = Effects::default();
    handle_step(d, sid, step, &mut fx);
    finish(d, sid, fx, false, None);
    Ok(active)
}

/// `sessions.kill`: stops the agent; session.end follows its exit.
pub fn kill(d: &mut Daemon, sid: &str) -> Result<Killed, RpcError> {
    let s = d.core.sessions.map.get(sid).ok_or_else(|| not_found(sid))?;
    if s.ended {
        return Ok(Killed::AlreadyEnded);
    }
    stop_agent(d, sid);
    Ok(Killed::Stopping)
}

pub fn not_found(sid: &str) -> RpcError {
    RpcError::new(Code::SessionNotFound, format!("unknown session: {sid}"))
}

/// SIGTERM to every agent; their exits are not recorded (module comment).
pub fn stop_all(d: &mut Daemon) {
    d.core.sessions.stopping = true;
    for (_, then) in std::mem::take(&mut d.core.sessions.waiting) {
        then(
            d,
            Err(RpcError::new(
                Code::ShuttingDown,
                "the daemon is stopping".to_string(),
            )),
        );
    }
    let ids: Vec<String> = d
        .core
        .sessions
        .map
        .iter()
        .filter(|(_, s)| s.child.is_some())
        .map(|(k, _)| k.clone())
        .collect();
    for sid in ids {
        stop_agent(d, &sid);
    }
}

/// Reads the live sessions and pending approvals of the last run and
/// reopens what can be reopened (module comment), except the sessions in
/// `not_needed`: whoever started them (a lane that starts its verification
/// over) will not use them again, so they end instead of starting an agent
/// only to stop it. `then` runs once the reopened sessions are in place (or
/// the read failed); before the bubblewrap probe answers, agents cannot
/// start, so the restore waits for it (`isolation_known`).
pub fn restore(d: &mut Daemon, not_needed: HashSet<String>, then: fn(&mut Daemon)) {
    if sandbox(d) == crate::isolation::AgentSandbox::Pending {
        d.core.sessions.restore_waiting = Some((not_needed, then));
        return;
    }
    let inbox = d.inbox.clone();
    let queued = d.ledger.read(Box::new(move |conn| {
        let rows = read_live(conn);
        let left = approvals::read_left(conn);
        inbox.run(move |d| {
            match (rows, left) {
                (Ok(rows), Ok(left)) => reopen(d, rows, left, &not_needed),
                (Err(e), _) | (_, Err(e)) => crate::error!(
                    "unable to read the sessions of the last run: {}",
                    e.to_string().to_lowercase()
                ),
            }
            then(d);
        });
    }));
    if queued.is_err() {
        crate::error!("unable to read the sessions of the last run: the ledger reader is busy");
        then(d);
    }
}

type LiveRow = (
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Restored,
);

fn read_live(conn: &rusqlite::Connection) -> rusqlite::Result<Vec<LiveRow>> {
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

fn reopen(d: &mut Daemon, rows: Vec<LiveRow>, left: approvals::Left, not_needed: &HashSet<String>) {
    // The read ran while this run already served requests: what this run
    // created (a session, a request) is live here and is not the last
    // run's.
    let approvals::Left {
        pending,
        mut resolved,
    } = left;
    let pending: Vec<crate::core::inbox::Item> = pending
        .into_iter()
        .filter(|i| d.core.approvals.get(&i.id).is_none())
        .collect();
    let rows: Vec<LiveRow> = rows
        .into_iter()
        .filter(|r| d.core.sessions.get(&r.0).is_none())
        .collect();
    // Every request pending when the daemon stopped resolves undelivered.
    for item in pending {
        let mut fx = Effects::default();
        let stream = item.subject.session().unwrap_or_default().to_string();
        resolved.push(approvals::withdraw_stale(
            item,
            crate::clock::now_ms(),
            &mut fx.ops,
        ));
        finish_plain(d, &stream, fx);
    }
    // The last run's history, then this run's (issue 10, item 11).
    d.core.approvals.restore_resolved(resolved);
    for (id, harness, cwd, name, model, agent_sid, mut restored) in rows {
        let mut fx = Effects::default();
        let was_active = restored.turn_active;
        if was_active {
            // The turn that ran when the daemon stopped ended with it.
            let mut t = Transcript::restored(restored.transcript_len);
            t.push(
                &id,
                &Entry::TurnEnd {
                    reason: EndReason::Interrupted,
                },
                None,
                false,
                &mut fx.ops,
            );
            // Nobody subscribes to a session not reopened yet: no delta.
            let _ = t.flush(&id, &mut fx.ops);
            restored.transcript_len = t.len;
            restored.turn_active = false;
            restored.end_reason = Some("interrupted".into());
            fx.event(&id, "turn.end", json!({"reason": "interrupted"}));
        }
        let seat_ok = d
            .core
            .seats
            .get(&harness)
            .is_some_and(|s| s.transport.wire_name() == restored.transport);
        let needed = !not_needed.contains(&id);
        match (agent_sid, seat_ok && needed) {
            (Some(asid), true) => {
                finish_plain(d, &id, fx);
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
                launch(
                    d,
                    start,
                    Box::new(move |_d, r| {
                        if let Err(e) = r {
                            crate::warn!("session {id}: could not be reopened: {}", e.message);
                        }
                    }),
                );
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
                fx.event(&id, "session.end", json!({"code": null, "signal": null}));
                fx.ops.push(Op::Exec {
                    sql: "UPDATE sessions SET ended = 1, turn_active = 0, end_reason = coalesce(?2, end_reason), transcript_len = ?3 WHERE id = ?1",
                    params: vec![Sql::Text(id.clone()), restored.end_reason.clone().map(Sql::Text).unwrap_or(Sql::Null), Sql::Integer(restored.transcript_len as i64)],
                });
                finish_plain(d, &id, fx);
            }
        }
    }
}

/// Commits ops of something that is not a live session (yet).
fn finish_plain(d: &mut Daemon, what: &str, fx: Effects) {
    if fx.ops.is_empty() {
        return;
    }
    let what = what.to_string();
    d.write(fx.ops, move |_d, r| {
        if let Err(e) = r {
            crate::error!("session {what}: the ledger refused its records: {e}");
        }
    });
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
