//! Every bound of the daemon in one place: queues, lines, pages, rates and
//! timeouts, each next to the sentence of the specification or issue it comes
//! from. Code refers to these names; a number in code elsewhere is a defect.

// ---- daemon socket (seed 004, "Framing"; issue 2, "The daemon socket") ----

/// "The maximum line length is 16 MiB. [...] If a line is longer than 16 MiB,
/// the receiver closes the connection." (seed 004, Framing)
pub const SOCKET_MAX_LINE: usize = 16 * 1024 * 1024;

// ---- plugin host (seed 000) ----

// ---- agent transports (issue 3) ----

/// "while a turn runs it waits in the session's queue, at most 32" (issue 3).
/// A prompt past the 32nd is refused with `CommandError::QueueFull`; nothing
/// already queued is dropped.
pub const AGENT_PROMPT_QUEUE: usize = 32;

/// The issue gives no line bound for agent stdout; we take the daemon
/// socket's: "The maximum line length is 16 MiB." (seed 004, Framing), so
/// anything a client can hand the daemon can also come back from an agent.
/// A longer line is a protocol violation of the agent.
pub const AGENT_MAX_LINE: usize = SOCKET_MAX_LINE;

/// Requests an agent may hold open towards the daemon at once (permissions,
/// file reads and writes). The issue is silent; every recorded agent waits
/// on one at a time, so 64 leaves room for parallel tool calls while a
/// runaway agent cannot grow the approvals inbox without bound. Past it the
/// agent's line is a protocol violation.
pub const AGENT_PENDING_REQUESTS: usize = 64;
