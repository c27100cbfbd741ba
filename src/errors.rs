//! The daemon socket's error boundary: every failure a method can answer with
//! is one [`Code`], a stable kebab-case name that programs branch on, carried
//! as `data.code` beside the JSON-RPC integer (DESIGN.md, "Surfaces and their
//! conventions"). omniconfluxd(8) lists them; a new one is added there too.

use std::fmt;

/// Stable error codes of the daemon socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// The line is not valid JSON (seed 004, Framing).
    ParseError,
    /// Not a JSON-RPC 2.0 request object.
    InvalidRequest,
    /// No such method on this surface.
    MethodNotFound,
    /// The params do not fit the method; unknown members are refused.
    InvalidParams,
    /// The caller is not the operator (DESIGN.md, "Who is calling").
    OperatorOnly,
    /// The named thing does not exist.
    NotFound,
    /// The ledger is read-only because it cannot be trusted.
    LedgerCorrupt,
    /// The ledger's queue is full; try again.
    LedgerBusy,
    /// A part of the daemon the call needs failed; the log says why.
    Unavailable,
    /// The daemon is stopping and takes no new work.
    ShuttingDown,
    /// The daemon already serves the maximum number of connections.
    TooManyConnections,
    /// Anything else; the log has the cause.
    InternalError,
    /// Seed 000: no plugin with this id is installed.
    PluginNotFound,
    /// Seed 000: the folder or the installed copy fails a check.
    PluginInvalid,
    /// Seed 000: the plugin's api is not one this host runs.
    PluginIncompatible,
    /// Seed 000: 20 plugins are installed.
    PluginLimit,
    /// Seed 000: the plugin is being removed, or its removal did not finish.
    PluginRemovePending,
    /// Seed 000: no copy waits, or another copy than the one named.
    PluginStaleSnapshot,
    /// Seed 000: the command's plugin is not running.
    PluginNotRunning,
    /// Seed 000: the plugin did not answer command.run in 30 seconds.
    PluginTimeout,
    /// Seed 000: the plugin answered with a failure or an invalid result.
    PluginError,
    /// Seed 000: no plugin that can run has this command.
    CommandNotFound,
    /// Seed 000: 4 commands of the plugin are unanswered.
    Busy,
    /// No seat has that harness id (issue 3, Seats).
    SeatNotFound,
    /// The seat is missing or degraded; `message` says why.
    SeatNotReady,
    /// No session has that id.
    SessionNotFound,
    /// The session's agent is gone; it takes no input.
    SessionEnded,
    /// The session's prompt queue holds its maximum already.
    QueueFull,
    /// The approval was already answered, withdrawn or expired.
    NotPending,
    /// The daemon holds its maximum number of sessions.
    TooManySessions,
    /// The approval's action is not the one the caller answered for.
    ActionMismatch,
    /// task.dispatch: the repository is not one the daemon knows.
    RepoUnknown,
    /// task.dispatch: the verifier is of the builder's provider family.
    SameFamily,
    /// task.dispatch: the base branch does not exist.
    BaseUnknown,
    /// task.dispatch: the lane's branch or worktree exists already.
    NameTaken,
    /// task.dispatch: the acceptance command cannot run isolated here.
    IsolationMissing,
    /// No lane has that id.
    LaneNotFound,
    /// The lane is not at a stage that takes this request.
    LaneNotWaiting,
    /// lock.*: this node holds no trust log.
    LockNoLog,
    /// lock.init: this node holds a trust log already.
    LockExists,
    /// lock.*: this node has no signer key; `message` says why.
    LockNoSignerKey,
    /// lock.*: the entry breaks a rule of the trust log or of the
    /// revoke-signer ceremony; `message` names the rule.
    LockRefused,
    /// Seed 004: the session has no tmux pane (or the text is empty).
    NoTerminalControl,
    /// Seed 004: the session takes no input now (a prompt is pending).
    SessionBusy,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::ParseError => "parse-error",
            Code::InvalidRequest => "invalid-request",
            Code::MethodNotFound => "method-not-found",
            Code::InvalidParams => "invalid-params",
            Code::OperatorOnly => "operator-only",
            Code::NotFound => "not-found",
            Code::LedgerCorrupt => "ledger-corrupt",
            Code::LedgerBusy => "ledger-busy",
            Code::Unavailable => "unavailable",
            Code::ShuttingDown => "shutting-down",
            Code::TooManyConnections => "too-many-connections",
            Code::InternalError => "internal-error",
            Code::PluginNotFound => "plugin-not-found",
            Code::PluginInvalid => "plugin-invalid",
            Code::PluginIncompatible => "plugin-incompatible",
            Code::PluginLimit => "plugin-limit",
            Code::PluginRemovePending => "plugin-remove-pending",
            Code::PluginStaleSnapshot => "plugin-stale-snapshot",
            Code::PluginNotRunning => "plugin-not-running",
            Code::PluginTimeout => "plugin-timeout",
            Code::PluginError => "plugin-error",
            Code::CommandNotFound => "command-not-found",
            Code::Busy => "busy",
            Code::SeatNotFound => "seat-not-found",
            Code::SeatNotReady => "seat-not-ready",
            Code::SessionNotFound => "session-not-found",
            Code::SessionEnded => "session-ended",
            Code::QueueFull => "queue-full",
            Code::NotPending => "not-pending",
            Code::TooManySessions => "too-many-sessions",
            Code::ActionMismatch => "action-mismatch",
            Code::RepoUnknown => "repo-unknown",
            Code::SameFamily => "same-family",
            Code::BaseUnknown => "base-unknown",
            Code::NameTaken => "name-taken",
            Code::IsolationMissing => "isolation-missing",
            Code::LaneNotFound => "lane-not-found",
            Code::LaneNotWaiting => "lane-not-waiting",
            Code::LockNoLog => "lock-no-log",
            Code::LockExists => "lock-exists",
            Code::LockNoSignerKey => "lock-no-signer-key",
            Code::LockRefused => "lock-refused",
            Code::NoTerminalControl => "no-terminal-control",
            Code::SessionBusy => "session-busy",
        }
    }

    /// The JSON-RPC 2.0 integer: the reserved codes where one fits, -32000
    /// (server error) for the daemon's own conditions.
    pub fn rpc(self) -> i64 {
        match self {
            Code::ParseError => -32700,
            Code::InvalidRequest => -32600,
            Code::MethodNotFound => -32601,
            Code::InvalidParams => -32602,
            Code::InternalError => -32603,
            // Each domain condition has its own server-error integer so
            // that a client without data.code can still tell them apart.
            Code::SeatNotFound => -32010,
            Code::SeatNotReady => -32011,
            Code::SessionNotFound => -32012,
            Code::SessionEnded => -32013,
            Code::QueueFull => -32014,
            Code::NotPending => -32015,
            Code::TooManySessions => -32016,
            Code::ActionMismatch => -32017,
            Code::RepoUnknown => -32020,
            Code::SameFamily => -32021,
            Code::BaseUnknown => -32022,
            Code::NameTaken => -32023,
            Code::IsolationMissing => -32024,
            Code::LaneNotFound => -32025,
            Code::LaneNotWaiting => -32026,
            // Seed 004: "-32600 ... A refused operation".
            Code::LockNoLog | Code::LockExists | Code::LockNoSignerKey | Code::LockRefused => {
                -32600
            }
            Code::NoTerminalControl => -32040,
            Code::SessionBusy => -32041,
            _ => -32000,
        }
    }
}

/// A failure answered on the daemon socket: a code and one line for a person.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid_params(message: impl Into<String>) -> RpcError {
        RpcError::new(Code::InvalidParams, message)
    }

    pub fn internal() -> RpcError {
        RpcError::new(
            Code::InternalError,
            "the daemon could not complete the request",
        )
    }
}

/// A ledger refusal as the error every surface maps: the one place a
/// [`WriteError`](crate::ledger::WriteError) becomes a [`Code`], so that the
/// socket, HTTP and the plugin wire name the same condition the same way.
impl From<crate::ledger::WriteError> for RpcError {
    fn from(e: crate::ledger::WriteError) -> RpcError {
        use crate::ledger::WriteError;
        match e {
            WriteError::Corrupt => RpcError::new(
                Code::LedgerCorrupt,
                "the ledger is read-only because it cannot be trusted",
            ),
            WriteError::Busy => {
                RpcError::new(Code::LedgerBusy, "the ledger's queue is full; try again")
            }
            WriteError::Failed(why) => {
                crate::error!("ledger write failed: {why}");
                RpcError::new(Code::Unavailable, "the ledger could not commit the change")
            }
        }
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

/// The cause of an I/O error as one lowercase line, without Rust's
/// "(os error N)" suffix, for messages like "unable to open ledger at PATH:
/// CAUSE".
pub fn io_cause(e: &std::io::Error) -> String {
    let s = e.to_string();
    let s = match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    };
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_lowercase().chain(c).collect(),
        None => s,
    }
}
