//! ACP v1 client side (Agent Client Protocol, protocolVersion 1: initialize,
//! session/new, session/load, session/resume, session/prompt, session/cancel,
//! session/update, session/request_permission, fs/read_text_file,
//! fs/write_text_file), as an I/O-free core: JSON-RPC 2.0, one object a line.
//!
//! What the core owns:
//! - the handshake: initialize with the capabilities we really serve (fs
//!   read and write confined to the session's worktree; no terminal), then
//!   session/new, or, when the caller gives a stored agent session id after
//!   a daemon restart, session/resume (preferred: no replay) or session/load
//!   (its history replay is not re-recorded: the ledger has it), falling back
//!   to session/new when the agent offers neither or refuses;
//! - exactly one session/prompt in flight. Further prompts wait in the
//!   core's queue (`limits::AGENT_PROMPT_QUEUE`) and are sent when the turn
//!   ends; their turn.start mode is `prompt`, since the agent never saw them
//!   queued (the recorded example agent fails the running prompt with -32603
//!   when a second arrives, so a second is never sent);
//! - approval labels from everything the agent said about a tool call: the
//!   title, kind and rawInput announced in `tool_call` and
//!   `tool_call_update` updates of the running turn are remembered by
//!   toolCallId (at most `limits::AGENT_TOOL_CALLS_REMEMBERED`), and a
//!   `session/request_permission` whose toolCall leaves one out (adapters
//!   such as claude-code-acp send it without `kind`) takes it from there;
//!   what the request itself carries wins. A kind no one announced stays
//!   `other`, which the risk gate ranks high;
//! - interrupt: session/cancel, then every open permission answered
//!   `cancelled`; the turn ends `interrupted` whatever the agent answers
//!   (the recorded example agent answers `end_turn` when cancelled while a
//!   permission waits). Queued prompts stay queued: interrupt stops a turn,
//!   not the session's plan.
//!
//! Turn end reasons (the man page copies this table):
//!
//! | agent's answer to session/prompt     | turn.end reason |
//! | ------------------------------------ | --------------- |
//! | any answer after we sent interrupt   | interrupted     |
//! | stopReason `end_turn`                | completed       |
//! | stopReason `cancelled`               | interrupted     |
//! | stopReason `max_tokens`              | failed          |
//! | stopReason `max_turn_requests`       | failed          |
//! | stopReason `refusal`                 | failed          |
//! | any other stopReason                 | failed          |
//! | JSON-RPC error with rate-limit signs | usage-limited   |
//! | any other JSON-RPC error             | failed          |
//! | the agent exits mid-turn             | failed          |
//!
//! max_tokens, max_turn_requests and refusal are `failed` because the work
//! asked for was not done and the operator must look; `usage-limited` is
//! kept for the provider refusing to serve (so the daemon can wait and
//! retry), which none of those is. The stop reason itself is the detail.
//! Rate-limit signs: error code 429, or "rate limit", "rate_limit",
//! "ratelimit", "429", "quota" or "usage limit" in the error's message or
//! data.
//!
//! Lenience: a malformed envelope (not JSON-RPC 2.0, an answer to an id we
//! never sent, a session/update for another session) is a `Violation`; a
//! well-framed message whose payload we do not understand (an unknown update
//! kind, a tool call without an id) is ignored, so that newer agents work.
//! An agent request with bad params or an unknown method gets a JSON-RPC
//! error answer.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::path::{Component, Path, PathBuf};

use serde_json::{Map, Value, json};

use super::{
    ActionKind, AgentEvent, Capabilities, CommandError, Decision, EndReason, Entry, FsRequest,
    OptionKind, PermissionOption, PermissionRequest, SignInState, Step, ToolEntry, ToolStatus,
    Usage, Violation, parse_line, prompt_chars,
};
use crate::jsonscan::Scan;
use crate::limits::{AGENT_PENDING_REQUESTS, AGENT_PROMPT_QUEUE, AGENT_TOOL_CALLS_REMEMBERED};

/// The protocol version we speak.
const PROTOCOL_VERSION: u64 = 1;

/// What the caller knows when it starts the agent.
#[derive(Debug, Clone)]
pub struct AcpConfig {
    /// The session's worktree: session/new `cwd`, and the only folder the
    /// agent may read or write through fs/*. Absolute.
    pub worktree: PathBuf,
    /// The agent session id stored before a daemon restart, to reopen.
    pub reopen: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Created,
    Initializing,
    Opening,
    Ready,
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outstanding {
    Initialize,
    NewSession,
    Reopen,
    Prompt,
}

#[derive(Debug)]
enum AgentRequestKind {
    Permission(Vec<PermissionOption>),
    FsRead {
        line: Option<u64>,
        limit: Option<u64>,
    },
    FsWrite,
}

/// What the agent announced about one tool call of the running turn.
#[derive(Debug, Default)]
struct ToolFacts {
    title: Option<String>,
    kind: Option<ActionKind>,
    input: Option<Value>,
}

#[derive(Debug)]
struct AgentRequest {
    id: Value,
    kind: AgentRequestKind,
}

/// The ACP client core of one session.
#[derive(Debug)]
pub struct AcpClient {
    cfg: AcpConfig,
    phase: Phase,
    next_id: u64,
    outstanding: HashMap<u64, Outstanding>,
    session_id: Option<String>,
    capabilities: Capabilities,
    auth_offered: bool,
    /// Session updates are the replay of session/load while this is set.
    replaying: bool,
    prompt_in_flight: Option<u64>,
    interrupting: bool,
    queue: VecDeque<String>,
    agent_requests: HashMap<String, AgentRequest>,
    /// Tool calls of the running turn by toolCallId, and their order of
    /// arrival (oldest first) for the bound.
    tool_calls: HashMap<String, ToolFacts>,
    tool_order: VecDeque<String>,
}

impl AcpClient {
    pub fn new(cfg: AcpConfig) -> AcpClient {
        AcpClient {
            cfg,
            phase: Phase::Created,
            next_id: 0,
            outstanding: HashMap::new(),
            session_id: None,
            capabilities: Capabilities::default(),
            auth_offered: false,
            replaying: false,
            prompt_in_flight: None,
            interrupting: false,
            queue: VecDeque::new(),
            agent_requests: HashMap::new(),
            tool_calls: HashMap::new(),
            tool_order: VecDeque::new(),
        }
    }

    pub fn agent_session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    pub fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    pub fn turn_active(&self) -> bool {
        self.prompt_in_flight.is_some()
    }

    /// Prompts waiting in the core's queue.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Begins the handshake; `prompt`, if any, is the first turn, sent as
    /// soon as the session exists.
    pub fn start(&mut self, prompt: Option<String>) -> Result<Step, CommandError> {
        match self.phase {
            Phase::Created => {}
            Phase::Closed => return Err(CommandError::Closed),
            _ => return Err(CommandError::AlreadyStarted),
        }
        let mut step = Step::default();
        if let Some(p) = prompt {
            self.queue.push_back(p);
        }
        self.phase = Phase::Initializing;
        self.request(
            &mut step,
            Outstanding::Initialize,
            "initialize",
            json!({
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": {
                    "fs": {"readTextFile": true, "writeTextFile": true},
                    "terminal": false
                },
                "clientInfo": {"name": "omniconfluxd", "version": env!("CARGO_PKG_VERSION")}
            }),
        );
        Ok(step)
    }

    /// Gives the agent a prompt now if it is idle, or queues it.
    pub fn prompt(&mut self, text: String) -> Result<Step, CommandError> {
        if self.phase == Phase::Closed {
            return Err(CommandError::Closed);
        }
        if self.queue.len() >= AGENT_PROMPT_QUEUE {
            return Err(CommandError::QueueFull);
        }
        self.queue.push_back(text);
        let mut step = Step::default();
        self.pump(&mut step);
        Ok(step)
    }

    /// Cancels the running turn (nothing to do when none runs).
    pub fn interrupt(&mut self) -> Step {
        let mut step = Step::default();
        if self.prompt_in_flight.is_none() || self.interrupting {
            return step;
        }
        self.interrupting = true;
        let sid = self.session_id.clone().unwrap_or_default();
        step.write(
            &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}),
        );
        // The spec asks the client to answer every open permission of the
        // turn with `cancelled` once it has cancelled.
        for key in self.permission_keys() {
            if let Some(req) = self.agent_requests.remove(&key) {
                write_result(
                    &mut step,
                    &req.id,
                    json!({"outcome": {"outcome": "cancelled"}}),
                );
                step.event(AgentEvent::PermissionClosed {
                    agent_request_key: key,
                    delivered: true,
                });
            }
        }
        step
    }

    /// Answers a permission request with the option the agent offered for
    /// the decision: allow -> its `allow_once` option (never `allow_always`:
    /// the operator allowed this one call); deny -> `reject_once`, else
    /// `reject_always`; cancel -> outcome `cancelled`.
    pub fn answer_permission(
        &mut self,
        key: &str,
        decision: Decision,
    ) -> Result<Step, CommandError> {
        let options = match self.agent_requests.get(key) {
            Some(AgentRequest {
                kind: AgentRequestKind::Permission(o),
                ..
            }) => o,
            _ => return Err(CommandError::UnknownRequest),
        };
        let outcome = match decision {
            Decision::Cancel => json!({"outcome": "cancelled"}),
            Decision::Allow | Decision::AllowWith(_) => {
                let id = pick(options, &[OptionKind::AllowOnce])
                    .ok_or(CommandError::NoMatchingOption)?;
                json!({"outcome": "selected", "optionId": id})
            }
            Decision::Deny { .. } => {
                let id = pick(options, &[OptionKind::RejectOnce, OptionKind::RejectAlways])
                    .ok_or(CommandError::NoMatchingOption)?;
                json!({"outcome": "selected", "optionId": id})
            }
        };
        let mut step = Step::default();
        if let Some(req) = self.agent_requests.remove(key) {
            write_result(&mut step, &req.id, json!({"outcome": outcome}));
        }
        Ok(step)
    }

    /// Answers fs/read_text_file with the whole file's text (or why it could
    /// not be read); the core applies the request's `line` and `limit`.
    pub fn answer_fs_read(
        &mut self,
        key: &str,
        file: Result<String, String>,
    ) -> Result<Step, CommandError> {
        let (line, limit) = match self.agent_requests.get(key) {
            Some(AgentRequest {
                kind: AgentRequestKind::FsRead { line, limit },
                ..
            }) => (*line, *limit),
            _ => return Err(CommandError::UnknownRequest),
        };
        let mut step = Step::default();
        if let Some(req) = self.agent_requests.remove(key) {
            match file {
                Ok(text) => write_result(
                    &mut step,
                    &req.id,
                    json!({"content": slice_lines(&text, line, limit)}),
                ),
                Err(msg) => write_error(&mut step, &req.id, -32603, &msg),
            }
        }
        Ok(step)
    }

    /// Answers fs/write_text_file once the caller wrote (or failed to).
    pub fn answer_fs_write(
        &mut self,
        key: &str,
        done: Result<(), String>,
    ) -> Result<Step, CommandError> {
        if !matches!(
            self.agent_requests.get(key),
            Some(AgentRequest {
                kind: AgentRequestKind::FsWrite,
                ..
            })
        ) {
            return Err(CommandError::UnknownRequest);
        }
        let mut step = Step::default();
        if let Some(req) = self.agent_requests.remove(key) {
            match done {
                Ok(()) => write_result(&mut step, &req.id, Value::Null),
                Err(msg) => write_error(&mut step, &req.id, -32603, &msg),
            }
        }
        Ok(step)
    }

    /// The agent's process is gone: a running turn ends (`interrupted` if we
    /// had asked for it, else `failed`), open requests vanish.
    pub fn on_exit(&mut self, code: Option<i32>) -> Step {
        let mut step = Step::default();
        if self.phase == Phase::Closed {
            return step;
        }
        let detail = match code {
            Some(c) => format!("the agent exited with status {c}"),
            None => "the agent was killed by a signal".to_string(),
        };
        if matches!(self.phase, Phase::Initializing | Phase::Opening) {
            step.event(AgentEvent::SetupFailed {
                detail: detail.clone(),
            });
        }
        if self.prompt_in_flight.is_some() {
            let reason = if self.interrupting {
                EndReason::Interrupted
            } else {
                EndReason::Failed
            };
            self.end_turn(&mut step, reason, Some(detail));
        } else {
            self.close_requests(&mut step);
        }
        self.phase = Phase::Closed;
        self.queue.clear();
        step
    }

    /// Feeds one complete line the agent wrote on stdout.
    pub fn on_line(&mut self, line: &[u8]) -> Result<Step, Violation> {
        if self.phase == Phase::Closed {
            return Err(Violation {
                reason: "a line after the transport closed".into(),
                turn_was_active: false,
            });
        }
        match self.on_chunk_line(line) {
            Some(step) => Ok(step),
            None => self.on_any_line(line),
        }
    }

    /// The general path: any line, parsed into a `Value` tree.
    fn on_any_line(&mut self, line: &[u8]) -> Result<Step, Violation> {
        let mut msg = parse_line(line).map_err(|r| self.violate(r))?;
        if msg.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(self.violate("a message without jsonrpc \"2.0\"".into()));
        }
        // Taken out, not cloned: a streamed chunk's params are most of the
        // line, and there is one per chunk. An answer has no params.
        let params = msg.remove("params").unwrap_or(Value::Null);
        let mut step = Step::default();
        match (msg.get("method"), msg.get("id")) {
            (Some(Value::String(method)), Some(id)) if is_request_id(id) => {
                self.on_agent_request(&mut step, id.clone(), method, params)?;
            }
            (Some(Value::String(method)), None) => {
                self.on_notification(&mut step, method, &params)?;
            }
            (None, Some(id)) => self.on_response(&mut step, id, &msg)?,
            _ => {
                return Err(self
                    .violate("a message that is neither request, notification nor answer".into()));
            }
        }
        Ok(step)
    }

    /// The fast path of the line an agent writes most: a streamed text
    /// chunk of our session, read by [`scan_chunk`] instead of into a
    /// `Value` tree (most of the daemon's cost per chunk was building and
    /// dropping that tree, then serde's typed parse). `None` for anything
    /// else, and for any chunk it is not sure of (a member it does not
    /// know, an escaped session id, a number it leaves to serde, a load
    /// replay, another session): the general path then parses the line
    /// again and decides, so what the agent sees, the transcript and every
    /// violation stay those of the general path. The scan takes only lines
    /// that are valid JSON with exactly the members of a chunk, so nothing
    /// it accepts would fail there.
    fn on_chunk_line(&self, line: &[u8]) -> Option<Step> {
        let (kind, text) = self.text_chunk(line)?;
        Some(chunk_step(kind, text.into_owned()))
    }

    /// The text of `line` when it is a text or thought chunk of this
    /// session that [`on_line`](Self::on_line) would turn into one
    /// transcript entry and nothing else, borrowed from the line where it
    /// has no escapes. It changes no state, so a caller that takes the
    /// chunk from here (the session core, to grow the running entry without
    /// an owned copy) need not call `on_line` for it.
    pub fn text_chunk<'a>(&self, line: &'a [u8]) -> Option<(ChunkKind, Cow<'a, str>)> {
        if line.len() > crate::limits::AGENT_MAX_LINE
            || self.replaying
            || self.phase == Phase::Closed
        {
            return None;
        }
        let trimmed = line.strip_suffix(b"\n").unwrap_or(line);
        let trimmed = trimmed.strip_suffix(b"\r").unwrap_or(trimmed);
        let c = scan_chunk(trimmed)?;
        let ours = self.session_id.as_deref().or(self.cfg.reopen.as_deref());
        if c.jsonrpc != b"2.0"
            || c.method != b"session/update"
            || Some(c.session_id) != ours.map(str::as_bytes)
            || c.content_type != b"text"
        {
            return None;
        }
        let kind = match c.session_update {
            b"agent_message_chunk" => ChunkKind::Text,
            b"agent_thought_chunk" => ChunkKind::Thinking,
            _ => return None,
        };
        Some((kind, c.text()?))
    }

    fn violate(&mut self, reason: String) -> Violation {
        let turn_was_active = self.prompt_in_flight.is_some();
        self.phase = Phase::Closed;
        self.prompt_in_flight = None;
        self.queue.clear();
        self.agent_requests.clear();
        Violation {
            reason,
            turn_was_active,
        }
    }

    fn request(&mut self, step: &mut Step, what: Outstanding, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.outstanding.insert(id, what);
        step.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    /// Sends the next queued prompt when the session is ready and idle.
    fn pump(&mut self, step: &mut Step) {
        if self.phase != Phase::Ready || self.prompt_in_flight.is_some() {
            return;
        }
        let Some(text) = self.queue.pop_front() else {
            return;
        };
        let sid = self.session_id.clone().unwrap_or_default();
        let id = self.request(
            step,
            Outstanding::Prompt,
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]}),
        );
        self.prompt_in_flight = Some(id);
        self.interrupting = false;
        step.event(AgentEvent::TurnStarted {
            chars: prompt_chars(&text),
        });
        step.event(AgentEvent::Transcript(Entry::User { text }));
    }

    fn open_session(&mut self, step: &mut Step) {
        self.phase = Phase::Opening;
        let cwd = self.cfg.worktree.to_string_lossy().into_owned();
        let reopen = self.cfg.reopen.clone();
        if let Some(sid) = reopen {
            let method = if self.capabilities.resume_session {
                Some("session/resume")
            } else if self.capabilities.load_session {
                self.replaying = true;
                Some("session/load")
            } else {
                None
            };
            if let Some(method) = method {
                self.request(
                    step,
                    Outstanding::Reopen,
                    method,
                    json!({"sessionId": sid, "cwd": cwd, "mcpServers": []}),
                );
                return;
            }
            step.event(AgentEvent::Transcript(Entry::System {
                text: format!("the agent cannot reopen session {sid}; a new session was started"),
            }));
        }
        self.request(
            step,
            Outstanding::NewSession,
            "session/new",
            json!({"cwd": cwd, "mcpServers": []}),
        );
    }

    fn became_ready(&mut self, step: &mut Step, sid: String) {
        self.session_id = Some(sid.clone());
        self.phase = Phase::Ready;
        self.replaying = false;
        step.event(AgentEvent::Ready {
            agent_session_id: sid,
            capabilities: self.capabilities,
        });
        if self.auth_offered {
            step.event(AgentEvent::SignIn(SignInState::SignedIn));
        }
        self.pump(step);
    }

    fn setup_failed(&mut self, step: &mut Step, detail: String) {
        step.event(AgentEvent::SetupFailed { detail });
        self.phase = Phase::Closed;
        self.queue.clear();
    }

    fn on_response(
        &mut self,
        step: &mut Step,
        id: &Value,
        msg: &Map<String, Value>,
    ) -> Result<(), Violation> {
        let Some(what) = id.as_u64().and_then(|n| self.outstanding.remove(&n)) else {
            return Err(self.violate(format!("an answer to id {id}, which we never sent")));
        };
        let outcome = match (msg.get("result"), msg.get("error")) {
            (Some(r), None) => Ok(r),
            (None, Some(e)) => Err(e),
            _ => {
                return Err(self.violate(format!(
                    "the answer to id {id} has not exactly one of result and error"
                )));
            }
        };
        match (what, outcome) {
            (Outstanding::Initialize, Ok(r)) => {
                let version = r.get("protocolVersion").and_then(Value::as_u64);
                if version != Some(PROTOCOL_VERSION) {
                    self.setup_failed(
                        step,
                        format!("the agent speaks ACP version {version:?}; we speak 1"),
                    );
                    return Ok(());
                }
                let caps = r.get("agentCapabilities");
                self.capabilities = Capabilities {
                    load_session: caps
                        .and_then(|c| c.get("loadSession"))
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                    resume_session: caps
                        .and_then(|c| c.get("sessionCapabilities"))
                        .and_then(|c| c.get("resume"))
                        .is_some_and(Value::is_object),
                };
                self.auth_offered = r
                    .get("authMethods")
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty());
                self.open_session(step);
            }
            (Outstanding::NewSession, Ok(r)) => match r.get("sessionId").and_then(Value::as_str) {
                Some(sid) => self.became_ready(step, sid.to_string()),
                None => return Err(self.violate("session/new answered without a sessionId".into())),
            },
            (Outstanding::Reopen, Ok(_)) => {
                let sid = self.cfg.reopen.clone().unwrap_or_default();
                self.became_ready(step, sid);
            }
            (Outstanding::Initialize | Outstanding::NewSession, Err(e)) => {
                if e.get("code").and_then(Value::as_i64) == Some(-32000) {
                    // -32000 is ACP's auth_required.
                    step.event(AgentEvent::SignIn(SignInState::SignedOut));
                }
                self.setup_failed(step, error_text(e));
            }
            (Outstanding::Reopen, Err(e)) => {
                self.replaying = false;
                self.cfg.reopen = None;
                step.event(AgentEvent::Transcript(Entry::System {
                    text: format!(
                        "the agent refused to reopen its session ({}); a new session was started",
                        error_text(e)
                    ),
                }));
                self.open_session(step);
            }
            (Outstanding::Prompt, Ok(r)) => {
                if let Some(u) = r.get("usage") {
                    let tokens = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
                    step.event(AgentEvent::Usage(Usage {
                        model: None,
                        input_tokens: tokens("inputTokens"),
                        output_tokens: tokens("outputTokens"),
                    }));
                }
                let stop = r.get("stopReason").and_then(Value::as_str).unwrap_or("");
                let (reason, detail) = if self.interrupting {
                    (EndReason::Interrupted, None)
                } else {
                    match stop {
                        "end_turn" => (EndReason::Completed, None),
                        "cancelled" => (EndReason::Interrupted, None),
                        "" => (
                            EndReason::Failed,
                            Some("the agent gave no stopReason".to_string()),
                        ),
                        other => (EndReason::Failed, Some(other.to_string())),
                    }
                };
                self.end_turn(step, reason, detail);
                self.pump(step);
            }
            (Outstanding::Prompt, Err(e)) => {
                let text = error_text(e);
                let reason = if self.interrupting {
                    EndReason::Interrupted
                } else if usage_limited(e) {
                    EndReason::UsageLimited
                } else {
                    EndReason::Failed
                };
                self.end_turn(step, reason, Some(text));
                self.pump(step);
            }
        }
        Ok(())
    }

    /// Adds what `t` says about its tool call to what is known of it.
    fn remember_tool(&mut self, t: &ToolEntry) {
        if !self.tool_calls.contains_key(&t.id) {
            if self.tool_order.len() >= AGENT_TOOL_CALLS_REMEMBERED
                && let Some(old) = self.tool_order.pop_front()
            {
                self.tool_calls.remove(&old);
            }
            self.tool_order.push_back(t.id.clone());
        }
        let facts = self.tool_calls.entry(t.id.clone()).or_default();
        if t.title.is_some() {
            facts.title.clone_from(&t.title);
        }
        // `other` says nothing more than no kind: it does not hide a kind
        // announced before.
        if t.kind.is_some_and(|k| k != ActionKind::Other) || facts.kind.is_none() {
            facts.kind = t.kind.or(facts.kind);
        }
        if t.input.is_some() {
            facts.input.clone_from(&t.input);
        }
    }

    fn end_turn(&mut self, step: &mut Step, reason: EndReason, detail: Option<String>) {
        self.prompt_in_flight = None;
        self.interrupting = false;
        self.tool_calls.clear();
        self.tool_order.clear();
        self.close_requests(step);
        step.event(AgentEvent::Transcript(Entry::TurnEnd { reason }));
        step.event(AgentEvent::TurnEnded { reason, detail });
    }

    /// Permissions still open when their turn is over can no longer be
    /// answered usefully; the inbox is told they vanished.
    fn close_requests(&mut self, step: &mut Step) {
        for key in self.permission_keys() {
            self.agent_requests.remove(&key);
            step.event(AgentEvent::PermissionClosed {
                agent_request_key: key,
                delivered: false,
            });
        }
    }

    /// Open permission requests, in a stable order so that the lines we
    /// write do not depend on hash order.
    fn permission_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .agent_requests
            .iter()
            .filter(|(_, r)| matches!(r.kind, AgentRequestKind::Permission(_)))
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    fn check_session(&mut self, params: &Value) -> Result<(), Violation> {
        let ours = self.session_id.as_deref().or(self.cfg.reopen.as_deref());
        let theirs = params.get("sessionId").and_then(Value::as_str);
        if theirs.is_some() && theirs == ours {
            Ok(())
        } else {
            Err(self.violate(format!("a message for session {theirs:?}, not ours")))
        }
    }

    fn on_agent_request(
        &mut self,
        step: &mut Step,
        id: Value,
        method: &str,
        params: Value,
    ) -> Result<(), Violation> {
        let key = id.to_string();
        if self.agent_requests.contains_key(&key) {
            return Err(self.violate(format!("a second request with the open id {key}")));
        }
        if self.agent_requests.len() >= AGENT_PENDING_REQUESTS {
            return Err(self.violate("more open requests than the daemon holds".into()));
        }
        match method {
            "session/request_permission" => {
                self.check_session(&params)?;
                let tool = params.get("toolCall").cloned().unwrap_or(Value::Null);
                let options: Vec<PermissionOption> = params
                    .get("options")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(parse_option).collect())
                    .unwrap_or_default();
                if self.interrupting {
                    // Asked after we cancelled: the spec's answer is cancelled.
                    write_result(step, &id, json!({"outcome": {"outcome": "cancelled"}}));
                    return Ok(());
                }
                // The request's toolCall is a ToolCallUpdate: what it
                // carries is the newest word on the call, and the rest comes
                // from the call's announcements (module comment).
                let tool_call_id = tool
                    .get("toolCallId")
                    .and_then(Value::as_str)
                    .map(String::from);
                if let Some(entry) = tool_entry(&tool) {
                    self.remember_tool(&entry);
                }
                let known = tool_call_id.as_ref().and_then(|id| self.tool_calls.get(id));
                let title = known
                    .and_then(|k| k.title.clone())
                    .unwrap_or_else(|| "permission".to_string());
                let request = PermissionRequest {
                    agent_request_key: key.clone(),
                    tool: title.clone(),
                    title,
                    action: known.and_then(|k| k.kind).unwrap_or(ActionKind::Other),
                    input: known.and_then(|k| k.input.clone()).unwrap_or(Value::Null),
                    tool_call_id,
                    options: options.clone(),
                    interaction: crate::agents::Interaction::Permission,
                };
                self.agent_requests.insert(
                    key,
                    AgentRequest {
                        id,
                        kind: AgentRequestKind::Permission(options),
                    },
                );
                step.event(AgentEvent::PermissionRequest(request));
            }
            "fs/read_text_file" | "fs/write_text_file" => {
                self.check_session(&params)?;
                let Some(raw) = params.get("path").and_then(Value::as_str) else {
                    write_error(step, &id, -32602, "path is missing");
                    return Ok(());
                };
                let path = match confine(&self.cfg.worktree, raw) {
                    Ok(p) => p,
                    Err(why) => {
                        write_error(step, &id, -32602, &why);
                        return Ok(());
                    }
                };
                if method == "fs/read_text_file" {
                    let n = |k: &str| params.get(k).and_then(Value::as_u64);
                    let kind = AgentRequestKind::FsRead {
                        line: n("line"),
                        limit: n("limit"),
                    };
                    self.agent_requests
                        .insert(key.clone(), AgentRequest { id, kind });
                    step.event(AgentEvent::Fs(FsRequest::Read { key, path }));
                } else {
                    let Some(content) = params.get("content").and_then(Value::as_str) else {
                        write_error(step, &id, -32602, "content is missing");
                        return Ok(());
                    };
                    let content = content.to_string();
                    self.agent_requests.insert(
                        key.clone(),
                        AgentRequest {
                            id,
                            kind: AgentRequestKind::FsWrite,
                        },
                    );
                    step.event(AgentEvent::Fs(FsRequest::Write { key, path, content }));
                }
            }
            _ => write_error(step, &id, -32601, &format!("method not found: {method}")),
        }
        Ok(())
    }

    fn on_notification(
        &mut self,
        step: &mut Step,
        method: &str,
        params: &Value,
    ) -> Result<(), Violation> {
        if method != "session/update" {
            return Ok(());
        }
        self.check_session(params)?;
        if self.replaying {
            return Ok(());
        }
        let Some(update) = params.get("update") else {
            return Ok(());
        };
        let text = || {
            update
                .get("content")
                .filter(|c| c.get("type").and_then(Value::as_str) == Some("text"))
                .and_then(|c| c.get("text"))
                .and_then(Value::as_str)
                .map(String::from)
        };
        let entry = match update.get("sessionUpdate").and_then(Value::as_str) {
            Some("agent_message_chunk") => text().map(|text| Entry::Text { text }),
            Some("agent_thought_chunk") => text().map(|text| Entry::Thinking { text }),
            Some("tool_call") | Some("tool_call_update") => tool_entry(update).map(|t| {
                self.remember_tool(&t);
                Entry::Tool(t)
            }),
            Some("plan") => Some(Entry::System {
                text: render_plan(update),
            }),
            // user_message_chunk outside a load replay would repeat the
            // prompt we recorded when the turn started; the rest
            // (available_commands_update, current_mode_update, ...) is not
            // transcript.
            _ => None,
        };
        if let Some(e) = entry {
            step.event(AgentEvent::Transcript(e));
        }
        Ok(())
    }
}

/// The step of a streamed text chunk: its one transcript entry.
fn chunk_step(kind: ChunkKind, text: String) -> Step {
    let entry = match kind {
        ChunkKind::Text => Entry::Text { text },
        ChunkKind::Thinking => Entry::Thinking { text },
    };
    let mut step = Step::default();
    step.event(AgentEvent::Transcript(entry));
    step
}

/// Which entry a streamed text chunk grows ([`AcpClient::text_chunk`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkKind {
    Text,
    Thinking,
}

/// The members of a `session/update` line carrying a content chunk, as
/// [`scan_chunk`] finds them: raw, escapes not decoded.
struct ScannedChunk<'a> {
    jsonrpc: &'a [u8],
    method: &'a [u8],
    session_id: &'a [u8],
    session_update: &'a [u8],
    content_type: &'a [u8],
    /// With its quotes, for serde to decode when it holds escapes.
    text: &'a [u8],
    text_escaped: bool,
}

impl<'a> ScannedChunk<'a> {
    /// The chunk's text: borrowed from the line, or decoded by serde when
    /// it holds escapes (`None` for an escape serde refuses).
    fn text(&self) -> Option<Cow<'a, str>> {
        if self.text_escaped {
            return serde_json::from_slice::<String>(self.text)
                .ok()
                .map(Cow::Owned);
        }
        // Between its quotes, UTF-8 (the scan checked the line).
        std::str::from_utf8(&self.text[1..self.text.len() - 1])
            .ok()
            .map(Cow::Borrowed)
    }
}

/// Reads `line` as one `session/update` notification carrying a content
/// chunk: `{"jsonrpc", "method", "params": {"sessionId", "update":
/// {"sessionUpdate", "content": {"type", "text", "annotations"?,
/// "_meta"?}, "_meta"?}, "_meta"?}}` in any order, with the validating
/// scan of [`crate::jsonscan`] instead of serde (serde's typed parse of
/// these lines was a third of the daemon's work on a streaming agent).
/// `None` unless every member is one of those, none is repeated, all but
/// the optional ones are there, the names and the short strings hold no
/// escape, and the line is valid JSON and UTF-8: then a serde parse would
/// read the same members, so the general path gets every other line and
/// decides it (the test below holds the two to each other).
fn scan_chunk(line: &[u8]) -> Option<ScannedChunk<'_>> {
    /// A short string that holds no escape.
    fn plain<'a>(s: &mut Scan<'a>, seen: &mut u16, bit: u16) -> Option<&'a [u8]> {
        once(seen, bit)?;
        let raw = s.string()?;
        (!raw.contains(&b'\\')).then_some(raw)
    }
    /// Marks member `bit` seen; `None` when it was already.
    fn once(seen: &mut u16, bit: u16) -> Option<()> {
        (*seen & bit == 0).then(|| *seen |= bit)
    }
    const JSONRPC: u16 = 1;
    const METHOD: u16 = 1 << 1;
    const PARAMS: u16 = 1 << 2;
    const SESSION_ID: u16 = 1 << 3;
    const UPDATE: u16 = 1 << 4;
    const SESSION_UPDATE: u16 = 1 << 5;
    const CONTENT: u16 = 1 << 6;
    const TYPE: u16 = 1 << 7;
    const TEXT: u16 = 1 << 8;
    const REQUIRED: u16 = (1 << 9) - 1;
    // One bit for each `_meta` (three objects have one) and `annotations`.
    const META_PARAMS: u16 = 1 << 9;
    const META_UPDATE: u16 = 1 << 10;
    const META_CONTENT: u16 = 1 << 11;
    const ANNOTATIONS: u16 = 1 << 12;

    let mut seen = 0u16;
    let (mut jsonrpc, mut method, mut session_id) = (&[][..], &[][..], &[][..]);
    let (mut session_update, mut content_type) = (&[][..], &[][..]);
    let (mut text, mut text_escaped) = (&[][..], false);
    let mut s = Scan::new(line);
    s.ws()?;
    s.object(|s, name| match name {
        b"jsonrpc" => plain(s, &mut seen, JSONRPC).map(|v| jsonrpc = v),
        b"method" => plain(s, &mut seen, METHOD).map(|v| method = v),
        b"params" => {
            once(&mut seen, PARAMS)?;
            s.object(|s, name| match name {
                b"sessionId" => plain(s, &mut seen, SESSION_ID).map(|v| session_id = v),
                b"_meta" => once(&mut seen, META_PARAMS).and_then(|()| s.value(2)),
                b"update" => {
                    once(&mut seen, UPDATE)?;
                    s.object(|s, name| match name {
                        b"sessionUpdate" => {
                            plain(s, &mut seen, SESSION_UPDATE).map(|v| session_update = v)
                        }
                        b"_meta" => once(&mut seen, META_UPDATE).and_then(|()| s.value(3)),
                        b"content" => {
                            once(&mut seen, CONTENT)?;
                            s.object(|s, name| match name {
                                b"type" => plain(s, &mut seen, TYPE).map(|v| content_type = v),
                                b"text" => {
                                    once(&mut seen, TEXT)?;
                                    (text, text_escaped) = s.quoted()?;
                                    Some(())
                                }
                                b"annotations" => {
                                    once(&mut seen, ANNOTATIONS).and_then(|()| s.value(4))
                                }
                                b"_meta" => once(&mut seen, META_CONTENT).and_then(|()| s.value(4)),
                                _ => None,
                            })
                        }
                        _ => None,
                    })
                }
                _ => None,
            })
        }
        _ => None,
    })?;
    s.ws()?;
    (seen & REQUIRED == REQUIRED && s.at_valid_end()).then_some(ScannedChunk {
        jsonrpc,
        method,
        session_id,
        session_update,
        content_type,
        text,
        text_escaped,
    })
}

/// Checks, without touching the disk, that `path` names something inside
/// `worktree`: absolute, no `..` component at all (lexical resolution of
/// `..` would disagree with the kernel's once a symlink is involved), no
/// NUL. Returns the path with `.` components removed. Symlinks are the
/// caller's: it canonicalizes the result and checks again.
pub fn confine(worktree: &Path, path: &str) -> Result<PathBuf, String> {
    if path.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(format!("the path {path} is not absolute"));
    }
    let mut clean = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => return Err(format!("the path {path} contains `..`")),
            Component::CurDir => {}
            other => clean.push(other.as_os_str()),
        }
    }
    if !worktree.is_absolute() || !clean.starts_with(worktree) {
        return Err(format!("the path {path} is outside the session's worktree"));
    }
    Ok(clean)
}

fn is_request_id(id: &Value) -> bool {
    id.is_string() || id.is_number()
}

fn write_result(step: &mut Step, id: &Value, result: Value) {
    step.write(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
}

fn write_error(step: &mut Step, id: &Value, code: i64, message: &str) {
    step.write(&json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}));
}

fn pick(options: &[PermissionOption], kinds: &[OptionKind]) -> Option<String> {
    kinds
        .iter()
        .find_map(|k| options.iter().find(|o| o.kind == *k).map(|o| o.id.clone()))
}

fn parse_option(v: &Value) -> Option<PermissionOption> {
    let kind = match v.get("kind")?.as_str()? {
        "allow_once" => OptionKind::AllowOnce,
        "allow_always" => OptionKind::AllowAlways,
        "reject_once" => OptionKind::RejectOnce,
        "reject_always" => OptionKind::RejectAlways,
        _ => return None,
    };
    Some(PermissionOption {
        id: v.get("optionId")?.as_str()?.to_string(),
        name: v
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        kind,
    })
}

fn tool_entry(update: &Value) -> Option<ToolEntry> {
    let s = |k: &str| update.get(k).and_then(Value::as_str);
    Some(ToolEntry {
        id: s("toolCallId")?.to_string(),
        title: s("title").map(String::from),
        kind: s("kind").map(ActionKind::from_acp),
        input: update.get("rawInput").cloned(),
        status: s("status").and_then(ToolStatus::from_acp),
        // rawOutput is what the tool returned; content is its display form,
        // kept when there is nothing rawer.
        result: update
            .get("rawOutput")
            .or_else(|| update.get("content"))
            .cloned(),
    })
}

fn render_plan(update: &Value) -> String {
    let items: Vec<String> = update
        .get("entries")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| {
                    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("");
                    format!("[{}] {}", s("status"), s("content"))
                })
                .collect()
        })
        .unwrap_or_default();
    format!("plan: {}", items.join("; "))
}

fn error_text(e: &Value) -> String {
    let code = e.get("code").and_then(Value::as_i64).unwrap_or(0);
    let msg = e.get("message").and_then(Value::as_str).unwrap_or("error");
    format!("{msg} ({code})")
}

fn usage_limited(e: &Value) -> bool {
    if e.get("code").and_then(Value::as_i64) == Some(429) {
        return true;
    }
    let text = format!(
        "{} {}",
        e.get("message").unwrap_or(&Value::Null),
        e.get("data").unwrap_or(&Value::Null)
    )
    .to_lowercase();
    [
        "rate limit",
        "rate_limit",
        "ratelimit",
        "429",
        "quota",
        "usage limit",
    ]
    .iter()
    .any(|s| text.contains(s))
}

/// ACP's `line` is 1-based; `limit` counts lines.
fn slice_lines(text: &str, line: Option<u64>, limit: Option<u64>) -> String {
    let skip = line.map_or(0, |l| l.saturating_sub(1)) as usize;
    let take = limit.map_or(usize::MAX, |l| l as usize);
    text.split_inclusive('\n').skip(skip).take(take).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recording(name: &str) -> Vec<(String, Value)> {
        let path = format!(
            "{}/tests/fixtures/recordings/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).expect("recording");
        text.lines()
            .filter_map(|l| {
                let rest = l.split_once("] ")?.1;
                let (dir, json) = rest.split_once(' ')?;
                if dir != "C->A" && dir != "A->C" {
                    return None;
                }
                Some((
                    dir.to_string(),
                    serde_json::from_str(json).expect("recorded JSON"),
                ))
            })
            .collect()
    }

    fn client() -> AcpClient {
        AcpClient::new(AcpConfig {
            worktree: PathBuf::from("/srv/work/demo"),
            reopen: None,
        })
    }

    fn parsed(writes: &[Vec<u8>]) -> Vec<Value> {
        writes
            .iter()
            .map(|w| serde_json::from_slice(w).expect("we write JSON"))
            .collect()
    }

    /// Replays a recording: agent lines go into the core; every client line
    /// of the recording must either be what the core wrote by itself, or is
    /// an operator action (`act`) whose writes must then equal it. Returns
    /// every event, in order.
    fn replay(
        name: &str,
        act: &mut dyn FnMut(&mut AcpClient, &Value, &[AgentEvent]) -> Step,
    ) -> Vec<AgentEvent> {
        replay_with(name, act, &|_| false)
    }

    /// `stands_in` names a write of ours that takes the place of an earlier
    /// recorded client line (the queued prompt, sent later than the
    /// recorded client sent it); it is not compared.
    fn replay_with(
        name: &str,
        act: &mut dyn FnMut(&mut AcpClient, &Value, &[AgentEvent]) -> Step,
        stands_in: &dyn Fn(&Value) -> bool,
    ) -> Vec<AgentEvent> {
        let mut c = client();
        let mut produced: VecDeque<Value> = VecDeque::new();
        let mut events = Vec::new();
        let first = c.start(Some("hello".into())).expect("start");
        produced.extend(parsed(&first.writes));
        for (dir, msg) in recording(name) {
            if dir == "A->C" {
                let line = serde_json::to_vec(&msg).expect("json");
                let step = c.on_line(&line).expect("recorded agent lines are valid");
                produced.extend(parsed(&step.writes).into_iter().filter(|w| !stands_in(w)));
                events.extend(step.events);
                continue;
            }
            if produced.is_empty() {
                let step = act(&mut c, &msg, &events);
                produced.extend(parsed(&step.writes));
                events.extend(step.events);
            }
            let Some(ours) = produced.pop_front() else {
                continue;
            };
            if msg["method"] == "initialize" {
                // We serve no terminal and name ourselves; the rest matches.
                assert_eq!(
                    ours["params"]["protocolVersion"],
                    msg["params"]["protocolVersion"]
                );
                assert_eq!(
                    ours["params"]["clientCapabilities"]["fs"],
                    msg["params"]["clientCapabilities"]["fs"]
                );
                assert_eq!(ours["params"]["clientCapabilities"]["terminal"], false);
                assert_eq!(ours["id"], msg["id"]);
            } else {
                assert_eq!(
                    ours, msg,
                    "{name}: the core wrote something else than the recorded client"
                );
            }
        }
        assert!(
            produced.is_empty(),
            "{name}: unrecorded writes {produced:?}"
        );
        events
    }

    fn permission_key(events: &[AgentEvent]) -> String {
        events
            .iter()
            .rev()
            .find_map(|e| match e {
                AgentEvent::PermissionRequest(p) => Some(p.agent_request_key.clone()),
                _ => None,
            })
            .expect("a permission request")
    }

    fn ended(events: &[AgentEvent]) -> Vec<EndReason> {
        events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::TurnEnded { reason, .. } => Some(*reason),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn replays_allow() {
        let events = replay("acp-zed-example-allow.log", &mut |c, msg, ev| {
            assert_eq!(msg["result"]["outcome"]["optionId"], "allow");
            c.answer_permission(&permission_key(ev), Decision::Allow)
                .expect("answer")
        });
        assert!(
            matches!(&events[0], AgentEvent::Ready { agent_session_id, .. } if agent_session_id == "dz7a6gndsb")
        );
        assert_eq!(events[1], AgentEvent::TurnStarted { chars: 5 });
        let p = events
            .iter()
            .find_map(|e| match e {
                AgentEvent::PermissionRequest(p) => Some(p),
                _ => None,
            })
            .expect("permission");
        assert_eq!(p.action, ActionKind::Edit);
        assert_eq!(p.tool_call_id.as_deref(), Some("call_2"));
        assert_eq!(
            p.input["content"],
            "{\"database\": {\"host\": \"new-host\"}}"
        );
        assert_eq!(p.options.len(), 2);
        let tools: Vec<&ToolEntry> = events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::Transcript(Entry::Tool(t)) => Some(t),
                _ => None,
            })
            .collect();
        assert_eq!(tools.len(), 4);
        assert_eq!(tools[0].kind, Some(ActionKind::Read));
        assert_eq!(tools[1].status, Some(ToolStatus::Completed));
        assert_eq!(
            tools[1].result.as_ref().map(|r| r["content"].is_string()),
            Some(true)
        );
        let texts = events
            .iter()
            .filter(|e| matches!(e, AgentEvent::Transcript(Entry::Text { .. })))
            .count();
        assert_eq!(texts, 3);
        assert_eq!(ended(&events), vec![EndReason::Completed]);
    }

    #[test]
    fn replays_reject() {
        let events = replay("acp-zed-example-reject.log", &mut |c, msg, ev| {
            assert_eq!(msg["result"]["outcome"]["optionId"], "reject");
            c.answer_permission(&permission_key(ev), Decision::Deny { message: None })
                .expect("answer")
        });
        assert_eq!(ended(&events), vec![EndReason::Completed]);
    }

    #[test]
    fn replays_cancel_while_streaming() {
        let events = replay("acp-zed-example-cancel.log", &mut |c, msg, _| {
            assert_eq!(msg["method"], "session/cancel");
            c.interrupt()
        });
        assert_eq!(ended(&events), vec![EndReason::Interrupted]);
    }

    #[test]
    fn replays_cancel_during_permission_as_interrupted_despite_end_turn() {
        let events = replay(
            "acp-zed-example-cancel-during-permission.log",
            &mut |c, msg, _| {
                assert_eq!(msg["method"], "session/cancel");
                c.interrupt()
            },
        );
        let key = permission_key(&events);
        assert!(events.contains(&AgentEvent::PermissionClosed {
            agent_request_key: key,
            delivered: true
        }));
        assert_eq!(ended(&events), vec![EndReason::Interrupted]);
    }

    #[test]
    fn replays_queue_without_a_second_prompt_in_flight() {
        let mut c_steps = 0;
        let second = json!({"jsonrpc":"2.0","id":3,"method":"session/prompt",
            "params":{"sessionId":"5fi0n9a8foo","prompt":[{"type":"text","text":"second while busy"}]}});
        let events = replay_with(
            "acp-zed-example-queue.log",
            &mut |c, msg, ev| {
                c_steps += 1;
                if msg["method"] == "session/prompt" {
                    // The recorded client sent a second prompt while busy;
                    // we queue it and write nothing now.
                    let s = c.prompt("second while busy".into()).expect("queued");
                    assert!(s.writes.is_empty());
                    assert_eq!(c.queued(), 1);
                    Step::default()
                } else {
                    c.answer_permission(&permission_key(ev), Decision::Allow)
                        .expect("answer")
                }
            },
            &|w| *w == second,
        );
        // The example agent fails the first prompt (-32603) when the second
        // arrives; here that error ends turn 1 failed and the queued prompt
        // goes out as id 3, which the agent's end_turn completes.
        assert_eq!(
            ended(&events),
            vec![EndReason::Failed, EndReason::Completed]
        );
        let starts = events
            .iter()
            .filter(|e| matches!(e, AgentEvent::TurnStarted { .. }))
            .count();
        assert_eq!(starts, 2);
        assert_eq!(c_steps, 2);
    }

    fn ready_client() -> AcpClient {
        let mut c = client();
        c.start(None).expect("start");
        c.on_line(br#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{"loadSession":true}}}"#)
            .expect("init");
        c.on_line(br#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s1"}}"#)
            .expect("new");
        c
    }

    /// Issue 10 item 10: claude-code-acp announces `kind: execute` in its
    /// tool_call update and asks with a toolCall that has no kind or title.
    #[test]
    fn a_partial_permission_request_takes_what_the_call_announced() {
        let mut c = ready_client();
        c.prompt("go".into()).expect("prompt");
        c.on_line(br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"tool_call","toolCallId":"t1","title":"`rm -rf build`","kind":"execute","status":"pending","rawInput":{"command":"rm -rf build"}}}}"#)
            .expect("update");
        c.on_line(br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"tool_call_update","toolCallId":"t1","kind":"other"}}}"#)
            .expect("update");
        let s = c
            .on_line(br#"{"jsonrpc":"2.0","id":7,"method":"session/request_permission","params":{"sessionId":"s1","toolCall":{"toolCallId":"t1"},"options":[]}}"#)
            .expect("request");
        let p = s
            .events
            .iter()
            .find_map(|e| match e {
                AgentEvent::PermissionRequest(p) => Some(p.clone()),
                _ => None,
            })
            .expect("a permission request");
        assert_eq!(p.action, ActionKind::Execute, "`other` hides no kind");
        assert_eq!(p.title, "`rm -rf build`");
        assert_eq!(p.input, json!({"command": "rm -rf build"}));
        // What the request carries wins; a call never announced is `other`.
        let s = c
            .on_line(br#"{"jsonrpc":"2.0","id":8,"method":"session/request_permission","params":{"sessionId":"s1","toolCall":{"toolCallId":"t1","title":"Run it","rawInput":{"command":"ls"}},"options":[]}}"#)
            .expect("request");
        assert!(s.events.iter().any(|e| matches!(e, AgentEvent::PermissionRequest(p)
            if p.title == "Run it" && p.input == json!({"command": "ls"}) && p.action == ActionKind::Execute)));
        let s = c
            .on_line(br#"{"jsonrpc":"2.0","id":9,"method":"session/request_permission","params":{"sessionId":"s1","toolCall":{"toolCallId":"t2"},"options":[]}}"#)
            .expect("request");
        assert!(
            s.events
                .iter()
                .any(|e| matches!(e, AgentEvent::PermissionRequest(p)
            if p.action == ActionKind::Other && p.title == "permission"))
        );
    }

    fn end_reason_for(answer: &str) -> (EndReason, Option<String>) {
        let mut c = ready_client();
        c.prompt("go".into()).expect("prompt");
        let s = c.on_line(answer.as_bytes()).expect("answer");
        s.events
            .iter()
            .find_map(|e| match e {
                AgentEvent::TurnEnded { reason, detail } => Some((*reason, detail.clone())),
                _ => None,
            })
            .expect("turn ended")
    }

    #[test]
    fn maps_stop_reasons() {
        let r = |stop: &str| {
            end_reason_for(&format!(
                r#"{{"jsonrpc":"2.0","id":2,"result":{{"stopReason":"{stop}"}}}}"#
            ))
            .0
        };
        assert_eq!(r("end_turn"), EndReason::Completed);
        assert_eq!(r("cancelled"), EndReason::Interrupted);
        assert_eq!(r("max_tokens"), EndReason::Failed);
        assert_eq!(r("max_turn_requests"), EndReason::Failed);
        assert_eq!(r("refusal"), EndReason::Failed);
        let e =
            |err: &str| end_reason_for(&format!(r#"{{"jsonrpc":"2.0","id":2,"error":{err}}}"#)).0;
        assert_eq!(
            e(r#"{"code":-32603,"message":"Internal error"}"#),
            EndReason::Failed
        );
        assert_eq!(
            e(r#"{"code":429,"message":"slow down"}"#),
            EndReason::UsageLimited
        );
        assert_eq!(
            e(r#"{"code":-32603,"message":"Rate limit exceeded"}"#),
            EndReason::UsageLimited
        );
    }

    #[test]
    fn queue_is_bounded_and_sent_in_order() {
        let mut c = ready_client();
        let first = c.prompt("one".into()).expect("prompt");
        assert_eq!(
            parsed(&first.writes)[0]["params"]["prompt"][0]["text"],
            "one"
        );
        for i in 0..AGENT_PROMPT_QUEUE {
            assert!(c.prompt(format!("q{i}")).expect("queued").writes.is_empty());
        }
        assert_eq!(c.prompt("over".into()), Err(CommandError::QueueFull));
        let s = c
            .on_line(br#"{"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}"#)
            .expect("end");
        let w = parsed(&s.writes);
        assert_eq!(w[0]["id"], 3);
        assert_eq!(w[0]["params"]["prompt"][0]["text"], "q0");
        assert!(s.events.contains(&AgentEvent::TurnStarted { chars: 2 }));
    }

    #[test]
    fn reopens_with_load_and_skips_the_replay() {
        let mut c = AcpClient::new(AcpConfig {
            worktree: PathBuf::from("/w"),
            reopen: Some("old".into()),
        });
        c.start(None).expect("start");
        let s = c
            .on_line(br#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{"loadSession":true}}}"#)
            .expect("init");
        let w = parsed(&s.writes);
        assert_eq!(w[0]["method"], "session/load");
        assert_eq!(
            w[0]["params"],
            json!({"sessionId": "old", "cwd": "/w", "mcpServers": []})
        );
        let replayed = c
            .on_line(br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"old","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"old"}}}}"#)
            .expect("replay");
        assert!(replayed.events.is_empty());
        let s = c
            .on_line(br#"{"jsonrpc":"2.0","id":1,"result":null}"#)
            .expect("loaded");
        assert!(
            matches!(&s.events[0], AgentEvent::Ready { agent_session_id, .. } if agent_session_id == "old")
        );
    }

    #[test]
    fn reopens_with_resume_when_offered() {
        let mut c = AcpClient::new(AcpConfig {
            worktree: PathBuf::from("/w"),
            reopen: Some("old".into()),
        });
        c.start(None).expect("start");
        let s = c
            .on_line(br#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{"loadSession":true,"sessionCapabilities":{"resume":{}}}}}"#)
            .expect("init");
        assert_eq!(parsed(&s.writes)[0]["method"], "session/resume");
    }

    #[test]
    fn violations() {
        for bad in [
            &b"not json"[..],
            br#"[1,2]"#,
            br#"{"id":0,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":77,"result":{}}"#,
            br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"other","update":{}}}"#,
        ] {
            let mut c = ready_client();
            c.prompt("go".into()).expect("prompt");
            let v = c.on_line(bad).expect_err("violation");
            assert!(v.turn_was_active, "{v:?}");
            assert_eq!(c.prompt("again".into()), Err(CommandError::Closed));
        }
        let mut c = ready_client();
        let huge = vec![b' '; crate::limits::AGENT_MAX_LINE + 1];
        assert!(c.on_line(&huge).is_err());
    }

    #[test]
    fn unknown_methods_and_updates() {
        let mut c = ready_client();
        let s = c
            .on_line(br#"{"jsonrpc":"2.0","id":"t","method":"terminal/create","params":{}}"#)
            .expect("ok");
        assert_eq!(parsed(&s.writes)[0]["error"]["code"], -32601);
        let s = c
            .on_line(br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"brand_new"}}}"#)
            .expect("ok");
        assert_eq!(s, Step::default());
    }

    /// The typed serde parse the chunk scan replaced, kept as its oracle:
    /// `&str` fields fail on an escaped string, the text is a `Cow`.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ChunkLine<'a> {
        jsonrpc: &'a str,
        method: &'a str,
        #[serde(borrow)]
        params: ChunkParams<'a>,
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct ChunkParams<'a> {
        session_id: &'a str,
        #[serde(borrow)]
        update: ChunkUpdate<'a>,
        #[serde(rename = "_meta", default)]
        _meta: Option<Value>,
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct ChunkUpdate<'a> {
        session_update: &'a str,
        #[serde(borrow)]
        content: ChunkContent<'a>,
        #[serde(rename = "_meta", default)]
        _meta: Option<Value>,
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ChunkContent<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        #[serde(borrow)]
        text: Cow<'a, str>,
        #[serde(rename = "annotations", default)]
        _annotations: Option<Value>,
        #[serde(rename = "_meta", default)]
        _meta: Option<Value>,
    }

    fn serde_chunk(line: &[u8]) -> Option<(String, String, String, String, String, String)> {
        let m: ChunkLine<'_> = serde_json::from_slice(line).ok()?;
        let u = m.params.update;
        Some((
            m.jsonrpc.into(),
            m.method.into(),
            m.params.session_id.into(),
            u.session_update.into(),
            u.content.kind.into(),
            u.content.text.into_owned(),
        ))
    }

    fn scanned_chunk(line: &[u8]) -> Option<(String, String, String, String, String, String)> {
        let c = scan_chunk(line)?;
        let s = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
        let text = c.text()?.into_owned();
        Some((
            s(c.jsonrpc),
            s(c.method),
            s(c.session_id),
            s(c.session_update),
            s(c.content_type),
            text,
        ))
    }

    /// Where the chunk scan reads a line, serde's typed parse reads the
    /// same members from it; where it gives up, serde either refuses the
    /// line too or the general path takes it (named below).
    #[test]
    fn the_chunk_scan_agrees_with_serde() {
        let head =
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":"#;
        let line = |update: &str| format!("{head}{update}}}}}");
        let agreed: Vec<String> = vec![
            line(r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}"#),
            line(r#"{"content":{"text":"a\n\"b\" \u00e9 \ud83d\ude00 \/","type":"text"},"sessionUpdate":"x"}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"","annotations":{"audience":["user"],"priority":1},"_meta":null},"_meta":{"a":[true,false,null,-3]}}"#),
            "{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":{\"sessionId\":\"é\",\"update\":{\"sessionUpdate\":\"u\",\"content\":{\"type\":\"text\",\"text\":\"ça € 😀\"}}}}".into(),
            r#" { "params" : { "update" : { "content" : { "text" : "x" , "type" : "text" } , "sessionUpdate" : "u" } , "_meta" : [ ] , "sessionId" : "s" } , "method" : "m" , "jsonrpc" : "2.0" } 	"#.into(),
        ];
        // serde reads these, the scan leaves them to the general path.
        let left: Vec<String> = vec![
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"x","_meta":1.5}}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"x","_meta":12345678901234567890}}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"x","_meta":{"k\u0031":1}}}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"x","_meta":"\u0041"}}"#),
            r#"["2.0","session/update",{"sessionId":"s","update":{"sessionUpdate":"u","content":{"type":"text","text":"x"}}}]"#.into(),
            r#"{"json\u0072pc":"2.0","method":"m","params":{"sessionId":"s","update":{"sessionUpdate":"u","content":{"type":"text","text":"x"}}}}"#.into(),
        ];
        // Neither reads these.
        let refused: Vec<String> = vec![
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"x","extra":1}}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"a","text":"b"}}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"x","_meta":1,"_meta":2}}"#),
            line(r#"{"sessionUpdate":"a","sessionUpdate":"b","content":{"type":"text","text":"x"}}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":7}}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"\ud800"}}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"\q"}}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"\u12"}}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"tab	in"}}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text"}}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"te\u0078t","text":"x"}}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"x"},"_meta":tru}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"x"}} "#) + "x",
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"x",}}"#),
            line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"x\"}}"#),
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"sessionId":"s","update":{"sessionUpdate":"u","content":{"type":"text","text":"x"}}}}"#.into(),
            r#"{"jsonrpc":"2.0","method":"m","params":{"sessionId":"s","update":{"sessionUpdate":"u","content":{"type":"text","text":"x"}}}"#.into(),
            r#"{"jsonrpc":"2.0","method":"m"}"#.into(),
            String::new(),
        ];
        for l in &agreed {
            let scanned = scanned_chunk(l.as_bytes());
            assert!(scanned.is_some(), "{l}");
            assert_eq!(scanned, serde_chunk(l.as_bytes()), "{l}");
        }
        for l in &left {
            assert_eq!(scanned_chunk(l.as_bytes()), None, "{l}");
            assert!(serde_chunk(l.as_bytes()).is_some(), "{l}");
        }
        for l in &refused {
            assert_eq!(scanned_chunk(l.as_bytes()), None, "{l}");
            assert_eq!(serde_chunk(l.as_bytes()), None, "{l}");
        }
        // Invalid UTF-8 in the text, and a lone byte past ASCII.
        for bad in [&b"\xC3("[..], b"\xFF"] {
            let mut l =
                line(r#"{"sessionUpdate":"a","content":{"type":"text","text":"@"}}"#).into_bytes();
            let at = l.iter().position(|&b| b == b'@').unwrap();
            l.splice(at..=at, bad.iter().copied());
            assert_eq!(scanned_chunk(&l), None);
            assert_eq!(serde_chunk(&l), None);
        }
        // Every text chunk a real agent wrote in the recordings is read by
        // the scan, as serde reads it.
        let mut chunks = 0;
        for name in [
            "allow",
            "cancel",
            "cancel-during-permission",
            "queue",
            "reject",
        ] {
            let path = format!(
                "{}/tests/fixtures/recordings/acp-zed-example-{name}.log",
                env!("CARGO_MANIFEST_DIR")
            );
            let text = std::fs::read_to_string(&path).expect("recording");
            for l in text.lines().filter_map(|l| l.split_once("] A->C ")) {
                let l = l.1.as_bytes();
                if serde_chunk(l).is_some_and(|c| c.4 == "text") {
                    assert_eq!(scanned_chunk(l), serde_chunk(l));
                    chunks += 1;
                }
            }
        }
        assert!(chunks > 0);
    }

    /// The chunk fast path takes exactly the lines it is sure of, and what
    /// it makes of them is what the general path makes: every line here,
    /// fed to a fresh client, gives the same step or violation both ways.
    #[test]
    fn chunk_fast_path_agrees_with_the_general_path() {
        let head =
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":"#;
        let line = |update: &str| format!("{head}{update}}}}}\n");
        let cases: Vec<(String, bool)> = vec![
            (line(r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}"#), true),
            (line(r#"{"sessionUpdate":"agent_thought_chunk","content":{"type":"text","text":"hm"}}"#), true),
            (line(r#"{"content":{"text":"a\n\"b\" \u00e9","type":"text"},"sessionUpdate":"agent_message_chunk"}"#), true),
            (line(r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x","annotations":null,"_meta":{"k":[1]}},"_meta":null}"#), true),
            (format!("{}\r\n", line(r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"crlf"}}"#).trim_end()), true),
            // Everything below leaves the fast path.
            (line(r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"image","data":"AA==","mimeType":"image/png"}}"#), false),
            (line(r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x","extra":1}}"#), false),
            (line(r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x","_meta":1e400}}"#), false),
            (line(r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"\ud800"}}"#), false),
            (line(r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a","text":"b"}}"#), false),
            (line(r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":7}}"#), false),
            (line(r#"{"sessionUpdate":"user_message_chunk","content":{"type":"text","text":"me"}}"#), false),
            (line(r#"{"sessionUpdate":"agent_message_chunk"}"#), false),
            (r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"other","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}}"#.to_string(), false),
            (r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s\u0031","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}}"#.to_string(), false),
            (r#"{"jsonrpc":"1.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}}"#.to_string(), false),
            (r#"{"jsonrpc":"2.0","id":null,"method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}}"#.to_string(), false),
            (r#"{"jsonrpc":"2.0","method":"session/other","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}}"#.to_string(), false),
            (r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}} x"#.to_string(), false),
        ];
        for (line, fast) in cases {
            let c = ready_client();
            assert_eq!(c.on_chunk_line(line.as_bytes()).is_some(), fast, "{line}");
            // The borrowed chunk the session core takes is the entry the
            // general path makes, and nothing else.
            if let Some((kind, text)) = c.text_chunk(line.as_bytes()) {
                assert_eq!(
                    ready_client().on_any_line(line.as_bytes()),
                    Ok(chunk_step(kind, text.into_owned())),
                    "{line}"
                );
            }
            let (mut a, mut b) = (ready_client(), ready_client());
            assert_eq!(
                a.on_line(line.as_bytes()),
                b.on_any_line(line.as_bytes()),
                "{line}"
            );
        }
    }

    #[test]
    fn confinement() {
        let wt = Path::new("/srv/work/demo");
        assert_eq!(
            confine(wt, "/srv/work/demo/a/./b.txt"),
            Ok(PathBuf::from("/srv/work/demo/a/b.txt"))
        );
        assert!(confine(wt, "/srv/work/demo/../x").is_err());
        assert!(confine(wt, "/srv/work/demo/a/../../demo/x").is_err());
        assert!(confine(wt, "/srv/work/demo2/x").is_err());
        assert!(confine(wt, "/etc/passwd").is_err());
        assert!(confine(wt, "relative/x").is_err());
        assert!(confine(wt, "/srv/work/demo/a\0b").is_err());
        assert!(confine(Path::new("rel"), "/rel/x").is_err());
        assert_eq!(
            confine(wt, "/srv/work/demo"),
            Ok(PathBuf::from("/srv/work/demo"))
        );
    }

    #[test]
    fn fs_requests_are_confined_and_sliced() {
        let mut c = ready_client();
        let s = c
            .on_line(br#"{"jsonrpc":"2.0","id":5,"method":"fs/read_text_file","params":{"sessionId":"s1","path":"/etc/passwd"}}"#)
            .expect("ok");
        assert!(s.events.is_empty());
        assert_eq!(parsed(&s.writes)[0]["error"]["code"], -32602);
        let s = c
            .on_line(br#"{"jsonrpc":"2.0","id":6,"method":"fs/read_text_file","params":{"sessionId":"s1","path":"/srv/work/demo/f","line":2,"limit":2}}"#)
            .expect("ok");
        let AgentEvent::Fs(FsRequest::Read { key, path }) = &s.events[0] else {
            panic!("{s:?}")
        };
        assert_eq!(path, Path::new("/srv/work/demo/f"));
        let a = c
            .answer_fs_read(key, Ok("1\n2\n3\n4\n".into()))
            .expect("answer");
        assert_eq!(
            parsed(&a.writes)[0],
            json!({"jsonrpc":"2.0","id":6,"result":{"content":"2\n3\n"}})
        );
        let s = c
            .on_line(br#"{"jsonrpc":"2.0","id":7,"method":"fs/write_text_file","params":{"sessionId":"s1","path":"/srv/work/demo/g","content":"x"}}"#)
            .expect("ok");
        let AgentEvent::Fs(FsRequest::Write { key, content, .. }) = &s.events[0] else {
            panic!("{s:?}")
        };
        assert_eq!(content, "x");
        let a = c.answer_fs_write(key, Ok(())).expect("answer");
        assert_eq!(
            parsed(&a.writes)[0],
            json!({"jsonrpc":"2.0","id":7,"result":null})
        );
    }

    #[test]
    fn exit_mid_turn_fails_the_turn_and_withdraws_permissions() {
        let mut c = ready_client();
        c.prompt("go".into()).expect("prompt");
        c.on_line(br#"{"jsonrpc":"2.0","id":9,"method":"session/request_permission","params":{"sessionId":"s1","toolCall":{"toolCallId":"t"},"options":[]}}"#)
            .expect("ok");
        let s = c.on_exit(Some(3));
        assert!(s.events.contains(&AgentEvent::PermissionClosed {
            agent_request_key: "9".into(),
            delivered: false
        }));
        assert_eq!(ended(&s.events), vec![EndReason::Failed]);
        assert_eq!(
            c.answer_permission("9", Decision::Allow),
            Err(CommandError::UnknownRequest)
        );
    }
}
