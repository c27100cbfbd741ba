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

/// "one JSON object per line, at most 65,536 bytes, in UTF-8" (seed 000, The
/// four message shapes). Counted without the line feed that ends the line, in
/// both directions.
pub const PLUGIN_MAX_LINE: usize = 65_536;

/// "matches ^[A-Za-z0-9_.:-]{1,64}$" (seed 000, Request, id).
pub const PLUGIN_WIRE_ID_MAX: usize = 64;

/// "error.code [...] at most 64 characters" (seed 000, Failure).
pub const PLUGIN_ERROR_CODE_MAX: usize = 64;

/// "the host cleans the message and cuts it to 500 characters before a client
/// sees it. What the host itself sends is also valid against hostError, whose
/// message is one line of at most 500 characters." (seed 000, Failure)
pub const PLUGIN_ERROR_MESSAGE_MAX: usize = 500;

/// "events.subscribe [...] kinds: 1 to 9 items" (seed 000, events.subscribe).
pub const PLUGIN_SUBSCRIBE_KINDS_MAX: usize = 9;

/// "limit: integer, from 1 to 500" (seed 000, sessions.list).
pub const PLUGIN_SESSIONS_PAGE_MAX: u64 = 500;

/// "limit [...] default 100" (seed 000, sessions.list).
pub const PLUGIN_SESSIONS_PAGE_DEFAULT: u64 = 100;

/// "cursor: matches ^[a-zA-Z0-9_-]{1,128}$" (seed 000, sessions.list and
/// seats.list); also the length of a session id.
pub const PLUGIN_CURSOR_MAX: usize = 128;

/// "A name, never a path: 1 to 64 characters" (seed 000, storage.get, key).
pub const PLUGIN_STORAGE_KEY_MAX: usize = 64;

/// "Text of at most 16384 characters." (seed 000, storage.set, value)
pub const PLUGIN_STORAGE_VALUE_MAX_CHARS: usize = 16_384;

/// "bytes: integer from 0 to 65,536: The size of the stored value in bytes of
/// UTF-8." (seed 000, storage.set result)
pub const PLUGIN_STORAGE_VALUE_MAX_BYTES: usize = 65_536;

/// "keys: array of objects, at most 128 items" (seed 000, storage.list) and
/// "The plugin's folder holds 128 keys" (seed 000, quota-exceeded).
pub const PLUGIN_STORAGE_MAX_KEYS: usize = 128;

/// "bytes: integer from 0 to 1,048,576: The total of the values in bytes of
/// UTF-8." (seed 000, storage.list)
pub const PLUGIN_STORAGE_MAX_BYTES: usize = 1_048_576;

/// "repo: string, at most 4,096 characters" (seed 000, tasks.create); the
/// same bound holds for every absolute path on the page.
pub const PLUGIN_PATH_MAX: usize = 4_096;

/// "What the builder is asked to do. 1 to 4000 characters, not only spaces."
/// (seed 000, tasks.create, task)
pub const PLUGIN_TASK_TEXT_MAX: usize = 4_000;

/// "acceptance.name: string, 1 to 64 characters" (seed 000, tasks.create).
pub const PLUGIN_ACCEPTANCE_NAME_MAX: usize = 64;

/// "One line of 1 to 900 printable basic Latin characters" (seed 000,
/// tasks.create, acceptance.command).
pub const PLUGIN_ACCEPTANCE_COMMAND_MAX: usize = 900;

/// "The one line the operator typed: at most 1024 characters, no control
/// characters." (seed 000, command.run, input)
pub const PLUGIN_COMMAND_INPUT_MAX: usize = 1_024;

/// "Plain text of at most 16384 characters. Before any client sees it the host
/// cleans it: [...] and the result is cut to 16384 bytes." (seed 000,
/// command.run result, text); the same number bounds both.
pub const PLUGIN_COMMAND_TEXT_MAX: usize = 16_384;

/// "The plugin's error output, cleaned like every text of a plugin, and of
/// that the last 4096 bytes, starting at a character boundary." (seed 000,
/// plugin.get, stderrTail)
pub const PLUGIN_STDERR_TAIL_MAX: usize = 4_096;

/// "plugin.id: string, 3 to 64 characters" (seed 000, initialize).
pub const PLUGIN_ID_MIN: usize = 3;
/// "plugin.id: string, 3 to 64 characters" (seed 000, initialize).
pub const PLUGIN_ID_MAX: usize = 64;

/// "plugin.version: string, at most 64 characters" (seed 000, initialize).
pub const PLUGIN_VERSION_MAX: usize = 64;

/// "commands[].pluginName: at most 48 characters. The name in the plugin's
/// approved manifest." (seed 000, plugin.commands)
pub const PLUGIN_NAME_MAX: usize = 48;

/// "plugins[].description: string, at most 200 characters" (seed 000,
/// plugin.list).
pub const PLUGIN_DESCRIPTION_MAX: usize = 200;

/// "plugins[].publisher: string or null, at most 64 characters" (seed 000,
/// plugin.list).
pub const PLUGIN_PUBLISHER_MAX: usize = 64;

/// "plugins[].commands: integer from 0 to 8. How many commands the manifest
/// declares." (seed 000, plugin.list)
pub const PLUGIN_COMMANDS_MAX: usize = 8;

/// "commands: [...] each item: at most 32 characters, matches
/// ^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$" (seed 000, plugin.approve).
pub const PLUGIN_COMMAND_ID_MAX: usize = 32;

/// "commands[].title: string, at most 48 characters" (seed 000,
/// plugin.commands).
pub const PLUGIN_COMMAND_TITLE_MAX: usize = 48;

/// "commands[].description: string or null, at most 120 characters" (seed
/// 000, plugin.commands).
pub const PLUGIN_COMMAND_DESCRIPTION_MAX: usize = 120;

/// The page names the folder check "too many files" without a number; 2,000
/// entries (files, folders and links) holds a bundled plugin with room, and
/// bounds the walk of a hostile folder.
pub const PLUGIN_FOLDER_MAX_ENTRIES: usize = 2_000;

/// The page names the folder check "too large files" without a number; 32 MiB
/// holds any bundled script or wasm module a plugin needs.
pub const PLUGIN_FILE_MAX_BYTES: u64 = 32 * 1024 * 1024;

/// The page gives no total; 128 MiB bounds what one install copies into the
/// store and hashes.
pub const PLUGIN_FOLDER_MAX_BYTES: u64 = 128 * 1024 * 1024;

/// The page gives no bound for the manifest's `main`; 256 characters holds
/// any real entry path (`dist/main.mjs`) and keeps the approval prompt short.
pub const PLUGIN_MAIN_MAX: usize = 256;

/// The page gives no size for omniconflux-plugin.json; 64 KiB is far more
/// than its bounded members can fill.
pub const PLUGIN_MANIFEST_MAX_BYTES: u64 = 65_536;

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

// ---- HTTP API (seed 002, "HTTP rules" and "SSE delivery and recovery"; issue 6) ----

/// "Ordinary JSON request bodies have a 64 KiB limit." (seed 002, Encoding,
/// limits, and pagination). Enforced while reading, for fixed-length and
/// chunked bodies alike; past it the answer is 413.
pub const HTTP_BODY_MAX: usize = 64 * 1024;

/// "JSON responses and SSE data frames have a 1 MiB limit." (seed 002)
pub const HTTP_RESPONSE_MAX: usize = 1024 * 1024;

/// "Default limit is 50; maximum is 200." (seed 002, pagination)
pub const HTTP_PAGE_DEFAULT: usize = 50;
pub const HTTP_PAGE_MAX: usize = 200;

/// "Each page also respects its encoded byte limit, including JSON
/// escaping." (seed 002). The items of one page stop short of this many
/// encoded bytes, leaving room for the envelope inside `HTTP_RESPONSE_MAX`.
pub const HTTP_PAGE_MAX_BYTES: usize = HTTP_RESPONSE_MAX - 64 * 1024;

/// The request line and headers of one request. The spec names no bound;
/// 16 KiB holds any real request (browsers send well under 8 KiB) and caps
/// what a client can make a handler thread buffer before it is refused.
pub const HTTP_HEAD_MAX: usize = 16 * 1024;
/// Header fields in one request, for the same reason.
pub const HTTP_HEADERS_MAX: usize = 100;
/// One chunk-size line or trailer line of a chunked body.
pub const HTTP_CHUNK_LINE_MAX: usize = 1024;

/// `http.max_connections` default: "bound the number of open connections
/// (refuse beyond it with 503 problem+json)" (issue 6). Open connections
/// include idle keep-alive ones and SSE streams.
pub const HTTP_MAX_CONNECTIONS: usize = 64;
/// The ceiling a config may raise `http.max_connections` to.
pub const HTTP_MAX_CONNECTIONS_CEILING: usize = 4096;
/// `http.threads` default: the handler threads `http-N` (issue 6, "a bounded
/// pool of handler threads").
pub const HTTP_THREADS: usize = 4;
pub const HTTP_THREADS_CEILING: usize = 64;

/// SSE streams open at once, each on its own writer thread `http-sse-N`;
/// counted inside `http.max_connections`. Past it a watch is refused with
/// 503 `too_many_streams` before any header is sent.
pub const HTTP_MAX_STREAMS: usize = 32;

/// An idle keep-alive connection is closed after this long.
pub const HTTP_IDLE_MS: u64 = 30_000;
/// Reading one request's head or body may stall this long before the
/// connection is closed (a slow client holds a handler thread no longer).
pub const HTTP_READ_TIMEOUT_MS: u64 = 10_000;
/// "Sockets have bounded write waits." (seed 002, Collection watch and
/// overload): one blocked write waits at most this long, then the
/// connection is closed.
pub const HTTP_WRITE_TIMEOUT_MS: u64 = 10_000;
/// How long a handler thread waits for the reactor's answer before it
/// answers 503 `unavailable`.
pub const HTTP_REACTOR_WAIT_MS: u64 = 30_000;
/// Requests served back to back on one connection by one handler thread
/// while the client keeps sending, before the connection goes back to the
/// poller so that other connections get their turn.
pub const HTTP_REQUESTS_PER_TURN: usize = 32;

/// The bearer token: "32 random bytes hex" (issue 6).
pub const HTTP_TOKEN_BYTES: usize = 32;

/// "POST /server/shutdown accepts instance_id and timeout_ms, default 5,000
/// and maximum 30,000." (seed 002, Server identity and shutdown)
pub const HTTP_SHUTDOWN_TIMEOUT_DEFAULT_MS: u64 = 5_000;
pub const HTTP_SHUTDOWN_TIMEOUT_MAX_MS: u64 = 30_000;

/// "Both stream kinds send keepalives at least every five seconds when
/// quiet." (seed 002). A little under five so that write time never
/// stretches a gap past it.
pub const SSE_KEEPALIVE_MS: u64 = 4_500;

/// "The replay buffer retains at most 256 events or 992 KiB, whichever
/// bound is reached first." (seed 002, Session watch)
pub const SSE_REPLAY_EVENTS: usize = 256;
pub const SSE_REPLAY_BYTES: usize = 992 * 1024;

/// "The bus queue holds at most 256 events and 1 MiB per subscriber."
/// (seed 002, Collection watch and overload). Past it the subscriber gets
/// `overflow` and is closed.
pub const SSE_QUEUE_EVENTS: usize = 256;
pub const SSE_QUEUE_BYTES: usize = 1024 * 1024;

/// "Mailboxes carry at most one outstanding wake, never full payloads."
/// (seed 002). The capacity of a subscriber's wake channel.
pub const SSE_MAILBOX: usize = 1;

/// Watchers of one topic (one ledger stream now, one session in phase 2).
/// Past it a new watch is refused with 503 `too_many_streams`.
pub const SSE_TOPIC_SUBSCRIBERS: usize = HTTP_MAX_STREAMS;

/// Ledger streams that keep a replay buffer for `GET /events` watches. A
/// buffer nobody watches is dropped first when a new stream needs one;
/// each holds at most `SSE_REPLAY_BYTES`.
pub const SSE_EVENT_TOPICS: usize = 64;

/// "Unknown UUIDv7 identities older than seven days return 410
/// identity_expired [...]; identities more than five minutes ahead return
/// 400 identity_future." (seed 002, Input admission and outcomes)
pub const UUID7_MAX_AGE_MS: i64 = 7 * 24 * 3600 * 1000;
pub const UUID7_MAX_AHEAD_MS: i64 = 5 * 60 * 1000;

/// An event whose `data` is larger than this is shown without it (`data:
/// null, data_omitted: true`) in HTTP pages and frames, so that one event
/// always fits a page, a frame and the replay buffer; the daemon socket's
/// `events.list` still returns it whole.
pub const HTTP_EVENT_INLINE_MAX: usize = 256 * 1024;
