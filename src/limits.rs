//! Every bound of the daemon in one place: queues, lines, pages, rates and
//! timeouts, each next to the sentence of the specification or issue it comes
//! from. Code refers to these names; a number in code elsewhere is a defect.

// ---- daemon socket (seed 004, "Framing"; issue 2, "The daemon socket") ----

/// "The maximum line length is 16 MiB. [...] If a line is longer than 16 MiB,
/// the receiver closes the connection." (seed 004, Framing)
pub const SOCKET_MAX_LINE: usize = 16 * 1024 * 1024;

// ---- plugin host (seed 000) ----

// ---- agent transports (issue 3) ----
