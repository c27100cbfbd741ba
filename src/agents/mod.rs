//! Agent transports (issue 3): the vocabulary the daemon's core uses to talk
//! about an agent, whatever wire the agent speaks.
//!
//! Each transport is an I/O-free state machine (a "core"): the reactor owns
//! the child's pipes, hands every complete stdout line to `on_line`, and
//! writes the lines every call returns in `Step::writes` to the child's
//! stdin, in order. No core starts a thread, a process or a timer; that is
//! what lets the recordings in `tests/` be replayed through them byte for
//! byte.
//!
//! - `acp`: Agent Client Protocol v1 (JSON-RPC 2.0 over stdio), client side.
//! - `stream_json`: Claude Code's `-p --input-format stream-json
//!   --output-format stream-json --verbose --permission-prompt-tool stdio`.
//!
//! Nothing here knows a JSON field name of a surface; the names of turn
//! modes, end reasons and actions are the plugin wire's (seed 000, event
//! kinds turn.start, turn.end, approval.request) because the core emits
//! those events as they are.
//!
//! A `Violation` means the agent broke its transport's protocol (a line that
//! is not a message of the transport, an answer to a request never made, a
//! line over `limits::AGENT_MAX_LINE`). The core is then closed: it ends the
//! turn it was running (the caller records turn.end `failed` when
//! `Violation::turn_was_active`) and the caller stops the agent, because a
//! peer that lost its framing cannot be trusted with the next line either.

pub mod acp;
pub mod stream_json;

#[cfg(test)]
mod fake_agents_tests;

use serde_json::Value;

/// How the daemon drives a session's agent (seed 000, `data.transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Acp,
    StreamJson,
}

impl Transport {
    pub fn wire_name(self) -> &'static str {
        match self {
            Transport::Acp => "acp",
            Transport::StreamJson => "stream-json",
        }
    }

    pub fn from_wire_name(name: &str) -> Option<Transport> {
        match name {
            "acp" => Some(Transport::Acp),
            "stream-json" => Some(Transport::StreamJson),
            _ => None,
        }
    }
}

/// turn.end `reason` (seed 000).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    Completed,
    Failed,
    Interrupted,
    UsageLimited,
}

impl EndReason {
    pub fn wire_name(self) -> &'static str {
        match self {
            EndReason::Completed => "completed",
            EndReason::Failed => "failed",
            EndReason::Interrupted => "interrupted",
            EndReason::UsageLimited => "usage-limited",
        }
    }
}

/// What a tool call or permission request wants to do: ACP's ToolKind
/// (`switch_mode` folds into `Other`). approval.request `action` uses
/// `wire_name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionKind {
    Read,
    Edit,
    Execute,
    Fetch,
    Search,
    Delete,
    Move,
    Think,
    Other,
}

impl ActionKind {
    pub fn wire_name(self) -> &'static str {
        match self {
            ActionKind::Read => "read",
            ActionKind::Edit => "edit",
            ActionKind::Execute => "execute",
            ActionKind::Fetch => "fetch",
            ActionKind::Search => "search",
            ActionKind::Delete => "delete",
            ActionKind::Move => "move",
            ActionKind::Think => "think",
            ActionKind::Other => "other",
        }
    }

    /// ACP ToolKind names; anything unknown is `Other` so that a newer agent
    /// still gets its request into the inbox.
    pub fn from_acp(name: &str) -> ActionKind {
        match name {
            "read" => ActionKind::Read,
            "edit" => ActionKind::Edit,
            "execute" => ActionKind::Execute,
            "fetch" => ActionKind::Fetch,
            "search" => ActionKind::Search,
            "delete" => ActionKind::Delete,
            "move" => ActionKind::Move,
            "think" => ActionKind::Think,
            _ => ActionKind::Other,
        }
    }
}

/// Where a tool call stands (ACP ToolCallStatus).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolStatus {
    Pending,
    InProgress,
    Completed,
    Failed,
}

impl ToolStatus {
    fn from_acp(name: &str) -> Option<ToolStatus> {
        match name {
            "pending" => Some(ToolStatus::Pending),
            "in_progress" => Some(ToolStatus::InProgress),
            "completed" => Some(ToolStatus::Completed),
            "failed" => Some(ToolStatus::Failed),
            _ => None,
        }
    }
}

/// One tool entry of the transcript. The first entry for an `id` is the
/// call; later entries for the same id carry only what changed (a status, a
/// result), so every field but `id` is optional. Input and result are kept
/// whole as the agent sent them: the transcript is the record, not a view.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolEntry {
    pub id: String,
    pub title: Option<String>,
    pub kind: Option<ActionKind>,
    pub input: Option<Value>,
    pub status: Option<ToolStatus>,
    pub result: Option<Value>,
}

/// A transcript entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// The prompt the daemon gave (recorded when its turn starts).
    User {
        text: String,
    },
    /// Text of the agent's answer, as the agent chunked it.
    Text {
        text: String,
    },
    Thinking {
        text: String,
    },
    Tool(ToolEntry),
    TurnEnd {
        reason: EndReason,
    },
    /// Something the agent or its harness reported that is neither answer
    /// nor tool: a plan, an API retry, "[Request interrupted by user]".
    System {
        text: String,
    },
}

/// What the agent said it can do (ACP initialize; for stream-json, what the
/// CLI always can).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Can reopen a session with its history replayed (ACP session/load).
    pub load_session: bool,
    /// Can reopen a session without replay (ACP session/resume, `--resume`).
    pub resume_session: bool,
}

/// One choice the agent offered for a permission (ACP PermissionOption).
#[derive(Debug, Clone, PartialEq)]
pub struct PermissionOption {
    pub id: String,
    pub name: String,
    pub kind: OptionKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionKind {
    AllowOnce,
    AllowAlways,
    RejectOnce,
    RejectAlways,
}

/// The agent asks the operator and waits.
#[derive(Debug, Clone, PartialEq)]
pub struct PermissionRequest {
    /// Names the request in `answer_permission`; opaque to the caller.
    pub agent_request_key: String,
    pub tool_call_id: Option<String>,
    /// What the operator reads: stream-json's "display name: description",
    /// ACP's title of the call.
    pub title: String,
    /// The tool's name, which `[[approvals.rule]]` `tool` matches:
    /// stream-json's `tool_name` (`Bash`); ACP names no tool (its kind is
    /// the action), so there the title of the call stands for it.
    pub tool: String,
    pub action: ActionKind,
    pub input: Value,
    /// Empty when the transport offers only allow and deny (stream-json).
    pub options: Vec<PermissionOption>,
    /// What the operator is asked: a permission, or (Claude Code's
    /// `AskUserQuestion` and `ExitPlanMode`) a question or a plan.
    pub interaction: Interaction,
}

/// What a request asks of the operator (seed 004, Interaction `kind`).
/// Every kind is one inbox item, allowed or denied; a question's allow
/// carries the answers and any kind's allow may switch the permission
/// mode ([`Grant`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Interaction {
    /// Use a tool with this input, or not.
    #[default]
    Permission,
    /// Questions the agent asks, each answered with option labels.
    Question(Vec<Question>),
    /// The agent's plan, to approve (leave plan mode) or not. Empty when
    /// the agent named none (it keeps it in a file of its own).
    Plan(String),
}

impl Interaction {
    /// seed 004's Interaction `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Interaction::Permission => "permission",
            Interaction::Question(_) => "question",
            Interaction::Plan(_) => "plan",
        }
    }
}

/// One question of a question interaction (Claude Code's `AskUserQuestion`
/// input, cc-question).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Question {
    pub header: String,
    pub question: String,
    pub multi_select: bool,
    /// The options' labels, which are what an answer names.
    pub options: Vec<String>,
    /// Same order as `options`.
    pub option_descriptions: Vec<String>,
}

/// Claude Code's permission modes an answer may switch a session to
/// (seed 004 RespondParams `set_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermissionMode {
    AcceptEdits,
    Default,
    Auto,
}

impl PermissionMode {
    /// The name on seed 004's wire and Claude Code's (`set_permission_mode`).
    pub fn wire_name(self) -> &'static str {
        match self {
            PermissionMode::AcceptEdits => "acceptEdits",
            PermissionMode::Default => "default",
            PermissionMode::Auto => "auto",
        }
    }

    pub fn from_wire_name(name: &str) -> Option<PermissionMode> {
        match name {
            "acceptEdits" => Some(PermissionMode::AcceptEdits),
            "default" => Some(PermissionMode::Default),
            "auto" => Some(PermissionMode::Auto),
            _ => None,
        }
    }
}

/// What an allow carries beyond yes: a question's answers, a mode to
/// switch to once allowed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grant {
    /// Question text -> the chosen labels (one unless multi-select), in
    /// the order the questions were asked.
    pub answers: Vec<(String, Vec<String>)>,
    pub set_mode: Option<PermissionMode>,
}

/// The operator's answer to a permission request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// An allow with answers or a mode switch; a transport that carries
    /// neither (ACP) takes it as a plain allow, and the surfaces refuse a
    /// grant the session's transport cannot carry before it gets here.
    AllowWith(Grant),
    /// `message` goes to the agent where the transport carries one.
    Deny {
        message: Option<String>,
    },
    /// Withdrawn without a yes or no (the turn was interrupted, the request
    /// expired).
    Cancel,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    pub model: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// seed 000 seats[].signIn, where an agent reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignInState {
    SignedIn,
    SignedOut,
}

/// A file the agent asks the daemon to read or write (ACP fs/*). The path
/// has passed the lexical confinement check (`acp::confine`); the caller
/// canonicalizes it, checks again that it is inside the worktree (symlinks),
/// does the I/O and answers with `AcpClient::answer_fs_read` or
/// `answer_fs_write`.
#[derive(Debug, Clone, PartialEq)]
pub enum FsRequest {
    Read {
        key: String,
        path: std::path::PathBuf,
    },
    Write {
        key: String,
        path: std::path::PathBuf,
        content: String,
    },
}

/// The agent's harness retries a failed model API call itself (Claude Code's
/// `system` `api_retry` line, cc-ratelimit): which try comes next and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    pub attempt: u64,
    pub max_retries: u64,
    /// The HTTP status that failed the call (429 when rate limited).
    pub error_status: Option<u64>,
    /// The harness's word for the failure (`rate_limit`, ...).
    pub error: Option<String>,
    pub retry_delay_ms: Option<u64>,
}

/// What the daemon learns from the agent.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    /// The agent's session exists. `agent_session_id` is what to store for
    /// reopening it after a daemon restart.
    Ready {
        agent_session_id: String,
        capabilities: Capabilities,
    },
    /// The agent could not set up a session (initialize or session/new
    /// failed); the caller ends the session.
    SetupFailed {
        detail: String,
    },
    /// The agent was given a prompt of `chars` characters. Always one the
    /// core sent when no turn ran, so the session's turn.start says
    /// `prompt` (core::sessions).
    TurnStarted {
        chars: usize,
    },
    Transcript(Entry),
    PermissionRequest(PermissionRequest),
    /// A permission request is over without the operator's answer:
    /// `delivered` is true when the core answered the agent itself
    /// (cancelled, on interrupt), false when the request vanished (the
    /// turn ended, the agent withdrew it, the agent exited).
    PermissionClosed {
        agent_request_key: String,
        delivered: bool,
    },
    Fs(FsRequest),
    TurnEnded {
        reason: EndReason,
        detail: Option<String>,
    },
    Usage(Usage),
    SignIn(SignInState),
    /// Some: the harness is retrying a failed API call and the turn makes
    /// no progress until it succeeds; None: output resumed (or the turn
    /// ended), the retrying is over.
    Retrying(Option<Retry>),
}

/// The result of every call into a core: what happened, and the lines to
/// write to the agent's stdin (each ends with `\n`), in order.
#[derive(Debug, Default, PartialEq)]
pub struct Step {
    pub events: Vec<AgentEvent>,
    pub writes: Vec<Vec<u8>>,
}

impl Step {
    fn event(&mut self, e: AgentEvent) {
        self.events.push(e);
    }

    fn write(&mut self, v: &Value) {
        let mut line = v.to_string().into_bytes();
        line.push(b'\n');
        self.writes.push(line);
    }
}

/// The agent broke its transport's protocol; see the module comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub reason: String,
    /// A turn was running: the caller records turn.end `failed`.
    pub turn_was_active: bool,
}

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandError {
    /// `limits::AGENT_PROMPT_QUEUE` prompts already wait.
    QueueFull,
    /// No open request has that key (already answered, withdrawn, or never).
    UnknownRequest,
    /// The agent offered no option of the kind the decision needs (ACP).
    NoMatchingOption,
    /// The core was closed by a violation or the agent's exit.
    Closed,
    /// `start` was called twice.
    AlreadyStarted,
}

impl std::fmt::Display for CommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CommandError::QueueFull => "the session's prompt queue is full",
            CommandError::UnknownRequest => "no open agent request has that key",
            CommandError::NoMatchingOption => "the agent offered no option for that decision",
            CommandError::Closed => "the agent transport is closed",
            CommandError::AlreadyStarted => "the agent transport was already started",
        })
    }
}

impl std::error::Error for CommandError {}

/// Parses one agent line as a JSON object, enforcing the line bound. The
/// line may still carry its `\n` (or `\r\n`).
fn parse_line(line: &[u8]) -> Result<serde_json::Map<String, Value>, String> {
    if line.len() > crate::limits::AGENT_MAX_LINE {
        return Err(format!("a line of {} bytes is over the bound", line.len()));
    }
    let trimmed = line.strip_suffix(b"\n").unwrap_or(line);
    let trimmed = trimmed.strip_suffix(b"\r").unwrap_or(trimmed);
    match serde_json::from_slice::<Value>(trimmed) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err("a line that is not a JSON object".to_string()),
        Err(e) => Err(format!("a line that is not JSON ({e})")),
    }
}

/// Counts a prompt's length as turn.start `chars`: Unicode scalar values.
fn prompt_chars(text: &str) -> usize {
    text.chars().count()
}
