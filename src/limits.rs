//! Every bound of the daemon in one place: queues, lines, pages, rates and
//! timeouts, each next to the sentence of the specification or issue it comes
//! from. Code refers to these names; a number in code elsewhere is a defect.

// ---- daemon socket (seed 004, "Framing"; issue 2, "The daemon socket") ----

/// "The maximum line length is 16 MiB. [...] If a line is longer than 16 MiB,
/// the receiver closes the connection." (seed 004, Framing)
pub const SOCKET_MAX_LINE: usize = 16 * 1024 * 1024;

/// "Bounded: connections (refuse beyond the limit with a clear error)" (issue
/// 2). The default of `socket.max_connections`; the command line, shell
/// scripts and a few apps need far fewer.
pub const SOCKET_MAX_CONNECTIONS: usize = 64;
/// The ceiling a config file may raise `socket.max_connections` to: each
/// connection may hold a partial line of up to `SOCKET_MAX_LINE`.
pub const SOCKET_MAX_CONNECTIONS_CEILING: usize = 1024;

/// "requests in flight per connection" (issue 2). Past it the daemon stops
/// reading that connection until answers go out: a pipelining client is
/// slowed, never refused, and nothing it sent is lost.
pub const SOCKET_MAX_IN_FLIGHT: usize = 64;

/// "bytes queued to a connection (a client that does not read is
/// disconnected, never allowed to grow memory or slow others)" (issue 2).
/// Large enough for a page of events or a burst of notifications.
pub const SOCKET_MAX_QUEUED_BYTES: usize = 8 * 1024 * 1024;

/// How many bytes one read call takes from a socket; also the initial read
/// buffer. Lines longer than this grow the buffer up to `SOCKET_MAX_LINE`.
pub const SOCKET_READ_CHUNK: usize = 64 * 1024;

/// `events.list` pages: "`events.list {stream, after_seq, limit}` pages them"
/// (issue 2). Default and maximum page length.
pub const EVENTS_PAGE_DEFAULT: usize = 100;
pub const EVENTS_PAGE_MAX: usize = 1000;

/// Live event subscriptions one socket connection may hold.
pub const SOCKET_MAX_SUBSCRIPTIONS: usize = 16;

// ---- reactor and workers (DESIGN.md, "Threads and ownership") ----

/// "Every queue is bounded" (DESIGN.md): the channel from worker threads to
/// the reactor. A full channel makes the sending worker wait; the reactor
/// drains it in batches on every wake-up.
pub const REACTOR_INBOX: usize = 4096;

/// How many reactor messages are handled per wake-up before the loop polls
/// its sockets again, so that a flood from workers cannot starve clients.
pub const REACTOR_BATCH: usize = 1024;

/// How long a clean stop waits for in-flight ledger commits and replies to
/// drain before it exits anyway ("finish or refuse in-flight requests").
pub const SHUTDOWN_DRAIN_MS: u64 = 5_000;

// ---- ledger (issue 2, "The ledger") ----

/// Batches queued to the writer thread. When it is full the reactor refuses
/// new writes with `ledger-busy` rather than buffering without bound.
pub const LEDGER_QUEUE: usize = 1024;

/// Operations committed in one transaction at most: group commit takes every
/// queued batch up to this many operations per fsync.
pub const LEDGER_GROUP_MAX_OPS: usize = 8192;

/// Read requests queued to the ledger reader thread.
pub const LEDGER_READ_QUEUE: usize = 256;

/// SQLite's busy timeout for the reader: the writer holds its lock only for
/// the length of one commit.
pub const LEDGER_BUSY_TIMEOUT_MS: u64 = 5_000;

/// The largest `data` document one event may carry; larger payloads (a whole
/// tool result) belong in their own tables, not in the event stream.
pub const EVENT_MAX_DATA_BYTES: usize = 1024 * 1024;

// ---- plugin host (seed 000) ----

// ---- agent transports (issue 3) ----
