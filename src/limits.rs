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

/// Streams one `events.subscribe` may name; a connection holds one
/// subscription, which a second call replaces.
pub const EVENTS_SUBSCRIBE_MAX_STREAMS: usize = 16;

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

/// Statements the ledger writer keeps prepared. Each record table's
/// statement is prepared once and kept, as are the writer's own (BEGIN,
/// COMMIT, ROLLBACK, a batch's SAVEPOINT and RELEASE, the event and stream
/// inserts): about 35 in all, where rusqlite keeps 16 and would parse the
/// least recently used again whenever a workload mixes more kinds of write
/// than that.
pub const LEDGER_WRITER_STATEMENTS: usize = 64;

/// Operations committed in one transaction at most: group commit takes every
/// queued batch up to this many operations per fsync.
pub const LEDGER_GROUP_MAX_OPS: usize = 8192;

/// Zeros the writer adds to the end of the WAL at a time, while its queue is
/// empty (see `ledger::writer`). One step is one write and one fdatasync
/// under SQLite's write lock, so a batch that arrives during a step waits
/// for one such write (about 0.4 ms on the development VM's disk); 16 steps
/// reach the default size. Smaller steps cost more fdatasyncs at start for
/// the same file, larger ones a longer wait.
pub const LEDGER_WAL_PRESIZE_STEP: u64 = 256 * 1024;

/// How long the writer's queue stays empty before it presizes the WAL: the
/// daemon's first requests after a start come well within it (ready in
/// about 4 ms here), so the zeros do not take a pinned core from them.
pub const LEDGER_WAL_PRESIZE_IDLE: std::time::Duration = std::time::Duration::from_millis(200);

/// The longest WAL the writer presizes: SQLite's automatic checkpoint
/// starts the log again after `wal_autocheckpoint` frames (1000 by default:
/// 4,120,032 bytes with 4096-byte pages). A ledger made with larger pages
/// is presized to this much only, rather than writing tens of MiB of zeros
/// at every start.
pub const LEDGER_WAL_PRESIZE_MAX: u64 = 8 * 1024 * 1024;

/// Read requests queued to the ledger reader thread.
pub const LEDGER_READ_QUEUE: usize = 256;

/// SQLite's busy timeout for the reader: the writer holds its lock only for
/// the length of one commit.
pub const LEDGER_BUSY_TIMEOUT_MS: u64 = 5_000;

/// How long after start the ledger's integrity check begins: start-up and
/// the first requests must not wait for a full scan ("with a million events
/// in the ledger, at most twice the empty-ledger figure", issue 2).
pub const LEDGER_CHECK_DELAY_MS: u64 = 2_000;

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

/// "busy: 16 requests of the plugin are unanswered." (seed 000, busy)
pub const PLUGIN_MAX_UNANSWERED: usize = 16;

/// "The plugin's budget of requests is empty (50 a second, 200 at once)"
/// (seed 000, rate-limited): a token bucket of 200 refilled at 50 a second.
pub const PLUGIN_RATE_PER_SECOND: u64 = 50;
/// See [`PLUGIN_RATE_PER_SECOND`].
pub const PLUGIN_RATE_BURST: u64 = 200;

/// "or it made more than 10 list calls in the current second" (seed 000,
/// rate-limited).
pub const PLUGIN_LIST_CALLS_PER_SECOND: u32 = 10;

/// "or 20 task requests in 24 hours" (seed 000, rate-limited).
pub const PLUGIN_TASKS_PER_DAY: usize = 20;
/// See [`PLUGIN_TASKS_PER_DAY`].
pub const PLUGIN_TASK_WINDOW_MS: u64 = 24 * 3600 * 1000;

/// "or fewer than 3 of the 60 ledger records of the last hour are left for a
/// task request" (seed 000, rate-limited). Every storage write and every task
/// request's records count against the 60; a task request needs 3.
pub const PLUGIN_LEDGER_RECORDS_PER_HOUR: usize = 60;
/// See [`PLUGIN_LEDGER_RECORDS_PER_HOUR`].
pub const PLUGIN_LEDGER_RECORDS_PER_TASK: usize = 3;
/// See [`PLUGIN_LEDGER_RECORDS_PER_HOUR`].
pub const PLUGIN_LEDGER_WINDOW_MS: u64 = 3600 * 1000;

/// "too-many-pending: 3 task requests of the plugin are unanswered." (seed
/// 000); also "at most 3 at a time" of plugin.get's starting.
pub const PLUGIN_MAX_PENDING_TASKS: usize = 3;

/// "approval-expired: The operator did not answer in 30 minutes." (seed 000)
/// The default of `plugins.task_expiry_ms`.
pub const PLUGIN_TASK_EXPIRY_MS: u64 = 30 * 60 * 1000;

/// "The response comes when the operator answered and the daemon dispatched
/// or refused the task, or when the request expired: up to 30 minutes for
/// the answer and up to 15 more for the dispatch." (seed 000, tasks.create)
/// The default of `plugins.task_dispatch_timeout_ms`: a dispatch still in
/// flight then is answered `unavailable`.
pub const PLUGIN_TASK_DISPATCH_MS: u64 = 15 * 60 * 1000;

/// "The reply is sent when its processes are gone and the folder is
/// deleted. [...] When a step fails, or an abort does not reply in time,
/// the plugin is left remove-pending." (seed 000, plugin.remove) The page
/// gives no time: a removal waits this long for the dispatches in flight it
/// aborts, as long as a plugin's command may take. The default of
/// `plugins.remove_abort_timeout_ms`.
pub const PLUGIN_REMOVE_ABORT_MS: u64 = 30_000;

/// "The whole of a task request a plugin made, for the app's inbox card: the
/// inbox item itself holds only a summary." (seed 000, plugin.request.get)
/// The summary (plugin name, repository, task name or first line) is cut to
/// this many characters; the whole request stays in plugin.request.get.
pub const PLUGIN_TASK_SUMMARY_MAX_CHARS: usize = 200;

/// "The plugin read too slowly: more than 1 MiB of messages waited for it,
/// and the host left out the next count events." (seed 000, events.dropped)
pub const PLUGIN_EVENT_QUEUE_BYTES: usize = 1024 * 1024;

/// The whole bound of a plugin's stdin queue: the 1 MiB events may fill,
/// plus room for the answers to its 16 unanswered requests and the host's
/// own requests, each at most one line. Past it the plugin is not reading
/// at all and is stopped with the fault `flood`.
pub const PLUGIN_STDIN_QUEUE_BYTES: usize =
    PLUGIN_EVENT_QUEUE_BYTES + (PLUGIN_MAX_UNANSWERED + 8) * (PLUGIN_MAX_LINE + 1);

/// "Since Linux 2.6.11, the pipe capacity is 16 pages (i.e., 65,536 bytes
/// in a system with a page size of 4096 bytes)." (pipe(7)) What a wake-up
/// writes to one child (agent or plugin) leaves in one write at its end
/// (children.rs) until this much waits; past it, it is written at once, so
/// that the stdin bounds above count what the child has not read, not the
/// size of one wake-up's output.
pub const CHILD_STDIN_WRITE_THROUGH_BYTES: usize = 64 * 1024;

/// "Sent every 30 seconds." (seed 000, ping) The default of
/// `plugins.ping_interval_ms`.
pub const PLUGIN_PING_INTERVAL_MS: u64 = 30_000;
/// "Any response or failure within 10 seconds shows the plugin is alive."
/// (seed 000, ping) The default of `plugins.ping_timeout_ms`.
pub const PLUGIN_PING_TIMEOUT_MS: u64 = 10_000;
/// The page gives initialize no deadline; the ping's 10 seconds is what the
/// host waits for any answer, so it waits as long for the first.
pub const PLUGIN_INITIALIZE_TIMEOUT_MS: u64 = 10_000;

/// "The host closes the plugin's input after this message, sends SIGTERM to
/// what is left two seconds later and ends it by force three seconds after
/// that." (seed 000, shutdown)
pub const PLUGIN_SHUTDOWN_TERM_MS: u64 = 2_000;
/// See [`PLUGIN_SHUTDOWN_TERM_MS`].
pub const PLUGIN_SHUTDOWN_KILL_MS: u64 = 3_000;

/// "plugin-timeout: The plugin did not answer command.run in 30 seconds."
/// (seed 000) The default of `plugins.command_timeout_ms`.
pub const PLUGIN_COMMAND_TIMEOUT_MS: u64 = 30_000;
/// "busy [...] For plugin.command.run: 4 commands of the plugin are
/// unanswered." (seed 000)
pub const PLUGIN_MAX_COMMANDS_IN_FLIGHT: usize = 4;

/// "plugin-limit: 20 plugins are installed." (seed 000)
pub const PLUGIN_MAX_INSTALLED: usize = 20;

/// Writes of plugins.json queued to the `plugin-records` thread: "Blocking
/// file work runs on workers; plugin records [...] are written by a
/// worker, never fsynced on the reactor" (issue 11). One runs at a time;
/// changes made meanwhile are taken by the next write, so the queue never
/// holds more than the one.
pub const PLUGIN_RECORD_WRITES: usize = 1;

/// plugin.install copies being made at once on the `plugin-install` thread
/// ("`plugin.install` copies and hashes a folder tree", issue 11, off the
/// reactor). One more is refused with `unavailable`; each copy may be up to
/// `PLUGIN_FOLDER_MAX_BYTES`, so a few queued already keep the thread busy
/// for seconds.
pub const PLUGIN_INSTALLS_IN_FLIGHT: usize = 4;

/// "crashes: Crashes in the last 10 minutes." (seed 000, plugin.get) The
/// window of the crash count and of `crash-limit`.
pub const PLUGIN_CRASH_WINDOW_MS: u64 = 10 * 60 * 1000;
/// The page names `crash-limit` without a number: 5 crashes in the window
/// is a plugin that will not get better by itself. `plugins.crash_limit`.
pub const PLUGIN_CRASH_LIMIT: u32 = 5;
/// The first delay before a restart, doubled after every crash in the
/// window, at most [`PLUGIN_RESTART_BACKOFF_MAX_MS`].
pub const PLUGIN_RESTART_BACKOFF_MS: u64 = 1_000;
/// See [`PLUGIN_RESTART_BACKOFF_MS`].
pub const PLUGIN_RESTART_BACKOFF_MAX_MS: u64 = 60_000;

/// How long a plugin may live on after closing its stdout before the host
/// calls it the fault `stdout-closed` (an exit within it is `exit`).
pub const PLUGIN_STDOUT_CLOSED_GRACE_MS: u64 = 1_000;

/// The page names the faults `flood` and `refusals` without numbers. A
/// plugin that keeps sending after 200 `rate-limited` answers in 10 seconds
/// floods; one that earns 64 refusals of a malformed or forbidden request
/// in a minute is broken.
pub const PLUGIN_FLOOD_REFUSALS: u32 = 200;
/// See [`PLUGIN_FLOOD_REFUSALS`].
pub const PLUGIN_FLOOD_WINDOW_MS: u64 = 10_000;
/// See [`PLUGIN_FLOOD_REFUSALS`].
pub const PLUGIN_MAX_REFUSALS: u32 = 64;
/// See [`PLUGIN_FLOOD_REFUSALS`].
pub const PLUGIN_REFUSALS_WINDOW_MS: u64 = 60_000;

/// The issue: "RLIMIT_AS with a default node can start under, about 1 GiB".
/// `plugins.memory_mb`.
pub const PLUGIN_MEMORY_MB: u64 = 1024;
/// Processes in one plugin's tree; `plugins.max_processes`.
pub const PLUGIN_MAX_PROCESSES: usize = 32;
/// How often the process count and memory of each plugin is read from
/// /proc; `plugins.watch_interval_ms`.
pub const PLUGIN_WATCH_INTERVAL_MS: u64 = 1_000;

/// "The host answers from a copy it reads from the daemon at most once in 5
/// seconds." (seed 000, lanes.list)
pub const PLUGIN_LANES_COPY_MS: u64 = 5_000;

/// plugin.get: "lanes [...] at most 50" and "starting [...] at most 50".
pub const PLUGIN_GET_LIST_MAX: usize = 50;

/// "stopped: from 0 to 10,000. How many sessions the removal stopped."
/// (seed 000, plugin.remove)
pub const PLUGIN_REMOVE_STOPPED_MAX: usize = 10_000;

/// "worktrees: at most 50 items [...] The worktrees that aborted dispatches
/// left, those of the newest requests first, as many as fit one frame."
/// (seed 000, plugin.remove) 50 paths of 4,096 characters fit a frame.
pub const PLUGIN_REMOVE_WORKTREES_MAX: usize = 50;

/// plugin.get waiting.diff: "paths: The first 20 paths that were added,
/// removed or changed".
pub const PLUGIN_DIFF_PATHS_MAX: usize = 20;

/// The daemon socket's frame for plugin.list, plugin.commands and
/// plugin.remove's worktrees: "as many as fit one frame". The page's own
/// bounds (20 plugins, 256 commands, 50 worktrees) are far below the socket
/// line, so a page is always whole.
pub const PLUGIN_COMMANDS_PAGE_MAX: usize = 256;

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

// ---- lanes (issue 5) ----

/// "rework with up to 50 cited defects" (issue 5); lane.verdict `defects`
/// is "from 0 to 50" (seed 000).
pub const LANE_MAX_DEFECTS: usize = 50;

/// The longest text of one cited defect; the verdict block is read by the
/// daemon and re-sent to the builder, so it is bounded like a message.
pub const LANE_DEFECT_MAX_CHARS: usize = 2000;

/// "its exit status and the tail of its output kept" (issue 5): how much of
/// the acceptance command's output is kept and cited in a rework.
pub const LANE_CHECK_TAIL_BYTES: usize = 16 * 1024;

/// The diff a verifier is shown, at most; a longer one is cut at a line end
/// and says so.
pub const LANE_DIFF_MAX_BYTES: usize = 256 * 1024;

/// "After the configured number of rounds (default 3) the lane stops at cap"
/// (issue 5).
pub const LANE_DEFAULT_ROUNDS: u32 = 3;

/// Verifier answers that are not a verdict before the lane is sent back:
/// the first, then the "second-opinion" (issue 5: "asked once more, or of
/// another seat of a third family").
pub const LANE_VERIFY_ATTEMPTS: u32 = 2;

/// Lane jobs (git, acceptance commands) queued to the lane workers, and how
/// many workers run them.
pub const LANE_JOB_QUEUE: usize = 64;
pub const LANE_WORKERS: usize = 2;

/// Reads of the lanes' branch heads queued to their own worker thread (one
/// `git for-each-ref` per repository each, milliseconds), so that a read
/// never waits behind acceptance commands on the lane workers. A reader
/// that finds the queue full gets the heads read last.
pub const LANE_HEADS_QUEUE: usize = 4;

/// Spare daemon-owned checkouts kept per repository between lanes. A lane
/// takes one for its check and its verifier and gives it back after the
/// verdict; the next lane of that repository moves it to its commit with
/// `checkout --force` and `clean`, which touch only what differs, instead
/// of paying a full checkout (and later a removal) of every file: on a
/// repository of 10,000 files that is most of what a round costs the
/// daemon (issue 5, "at most 50 ms of daemon time per round"). Lanes run
/// one at a time per verifier seat, so a few spares cover lanes checking
/// while another is verified; each spare is a whole checkout on disk,
/// which is why the pool is bounded. Beyond it a returned checkout is
/// removed.
pub const LANE_SPARE_CHECKOUTS: usize = 2;

/// Transcript entries read back to find a verifier's answer: a verifier
/// session has one turn, far shorter than this.
pub const LANE_VERIFIER_ENTRIES: usize = 4096;

/// How often a lane waiting for a busy or unready verifier seat looks
/// again. Seats change state on probes and as other lanes finish.
pub const LANE_VERIFIER_RETRY_SECS: u64 = 10;

/// How old the branch heads of lanes.list and verify.list may be before a
/// read of the list reads them again, on a lane worker (seed 000,
/// lanes[].head: "the commit the lane's branch points at now"). The plugin
/// host keeps its copy of lanes.list as long.
pub const LANE_HEADS_FRESH_MS: u64 = 5_000;

/// The longest task name (seed 000, tasks.create name:
/// `^[A-Za-z0-9][A-Za-z0-9 ._-]{0,47}$`); a name taken from the task's
/// first line is cut to it.
pub const LANE_NAME_MAX_CHARS: usize = 48;

/// Repositories added with repos.add (the config may name more).
pub const LANE_MAX_REPOS: usize = 256;

/// verify.list pages: default and most lanes per page.
pub const LANE_PAGE_DEFAULT: usize = 50;
pub const LANE_PAGE_MAX: usize = 500;

/// The acceptance command's time limit when the config names none.
pub const LANE_CHECK_TIMEOUT_SECS: u64 = 30 * 60;
// ---- sessions and inbox (issue 3) ----

/// "so that no agent waits forever unnoticed" (issue 3): the default of
/// `approvals.timeout`, in seconds. Fifteen minutes is long enough for an
/// operator who steps away briefly, short enough that a forgotten request
/// is resolved by its declared fallback within the hour.
pub const APPROVAL_TIMEOUT_DEFAULT_S: u64 = 900;
/// The longest `approvals.timeout` a config may set: one week.
pub const APPROVAL_TIMEOUT_MAX_S: u64 = 7 * 24 * 3600;

/// The most bytes of an answer's `reason`, and of one question's answer
/// (its labels together), in `sessions.respond` (seed 004, "Answering an
/// interaction"; the seed gives no bound): a choice or a line typed on a
/// phone, like the reason `approvals.answer` takes.
pub const RESPOND_TEXT_MAX: usize = 4096;

/// Resolved approvals the inbox keeps in memory for `approvals.get` and
/// `approvals.list {all: true}`; older ones are in the ledger only. Pending
/// requests are bounded per agent by `AGENT_PENDING_REQUESTS` and per
/// plugin by `PLUGIN_MAX_PENDING_TASKS`.
pub const INBOX_RESOLVED_KEPT: usize = 256;

/// The bytes of an approval's exact action (`target`: the command, paths,
/// URL or input it would run on) shown in approvals.list and approvals.get
/// and kept in the ledger: enough for any command a person reads before
/// allowing it, while a tool input of megabytes (a whole file written)
/// does not ride along in every list. Past it the text is cut and marked
/// `truncated`; the whole input is in the transcript.
pub const APPROVAL_TARGET_MAX: usize = 8 * 1024;

/// Sessions one daemon holds at once, ended ones included ("200 sessions on
/// one daemon", issue 3, with room). A spawn past it is refused with
/// `too-many-sessions`.
pub const MAX_SESSIONS: usize = 1024;

/// Ended sessions kept in memory for `sessions.get`, `sessions.list` and
/// transcript reads; older ended ones are evicted (the ledger keeps them),
/// so ended sessions do not fill `MAX_SESSIONS` and refuse every spawn of a
/// long run. A quarter of `MAX_SESSIONS` leaves the rest for live ones.
/// The default and the most `[agents] ended_kept` may set.
pub const SESSIONS_ENDED_KEPT: usize = 256;

/// "An agent that [...] stalls [...] ends the turn failed" (issue 3): the
/// seconds a running turn may go without a line from its agent when the
/// seat sets no `stall_timeout`. Time while an approval waits on the
/// operator does not count.
pub const AGENT_STALL_DEFAULT_S: u64 = 900;

/// Tool calls of the running turn whose announced title, kind and input an
/// ACP core remembers, so that a `session/request_permission` carrying a
/// partial toolCall is labelled from "everything the agent said about that
/// tool call" (issue 10, item 10). Forgotten at the turn's end; past the
/// bound the oldest is forgotten first (a request for it is then labelled
/// from what it carries, an unknown kind ranking high).
pub const AGENT_TOOL_CALLS_REMEMBERED: usize = 256;

/// How long a stopped agent (kill, a protocol violation, a stall, a daemon
/// stop) gets between SIGTERM and SIGKILL of its process group.
pub const AGENT_KILL_GRACE_MS: u64 = 3_000;

/// stdin bytes queued to one agent that does not read (prompts and answers
/// are small; a whole file read answer is the largest).
pub const AGENT_STDIN_QUEUED: usize = 32 * 1024 * 1024;

/// The tail of an agent's stderr kept for the log when it ends badly.
pub const AGENT_STDERR_TAIL: usize = 4_096;

/// The largest file an agent may read or write through ACP fs/* (the
/// answer must fit one line of `AGENT_MAX_LINE` once escaped).
pub const AGENT_FS_MAX_BYTES: u64 = 4 * 1024 * 1024;

/// "sessions.input {session_id, text}": the longest prompt taken, in bytes,
/// so that one prompt line stays far under the agent's line bound.
pub const PROMPT_MAX_BYTES: usize = 1024 * 1024;

/// "session.rename" names: at most 128 characters, no control characters.
pub const SESSION_NAME_MAX: usize = 128;

/// Transcript entries of the running turn kept in memory to send deltas
/// (seed 004, Transcripts: "the node can change the last entries"); idle
/// sessions keep none. Past it older entries of the turn are only in the
/// ledger and later changes to them send no delta.
pub const TRANSCRIPT_TURN_CACHE: usize = 512;

/// `inputPreview` of a tool entry: the first characters of its input.
pub const TRANSCRIPT_PREVIEW_CHARS: usize = 200;

/// `sessions.transcriptView` and a first `transcript.subscribe` result: the
/// most entries one answer carries (the newest).
pub const TRANSCRIPT_PAGE_MAX: usize = 5_000;

/// Live transcript subscriptions one socket connection, or one relay
/// channel of the uplink, may hold.
pub const TRANSCRIPT_SUBS_PER_CONN: usize = 64;

/// "memory per idle session <= 64 KiB" (issue 3, Figures): a line reader
/// (agent stdout, socket connection) whose buffer grew past this for one
/// long line gives the memory back once the line is consumed.
pub const LINE_BUFFER_IDLE_KEEP: usize = 16 * 1024;

/// The nice value of the start-up probe threads and the programs they run
/// (src/probe_thread.rs): below the reactor, which answers the first
/// requests ("start to ready", issue 2), yet a share of a busy core.
pub const PROBE_NICE: i32 = 10;

/// Seat probes: how long `command --version` may run before the seat is
/// degraded ("bounded", issue 3).
pub const SEAT_PROBE_TIMEOUT_MS: u64 = 5_000;

/// Seat detection reads `gemini --help` to learn its ACP flag ("decide by
/// the probe, e.g. `gemini --help` output, bounded", issue 9): the first
/// bytes kept, the rest read and dropped. Help texts are a few KiB.
pub const SEAT_HELP_MAX_BYTES: usize = 64 * 1024;
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
/// A path parameter (a session, input, approval, plugin, command or
/// request id): `maxLength: 128` in vendor-schemas/openapi.yaml. Every
/// id the daemon makes is far shorter (a UUIDv7 is 36); a longer one is
/// 400, not 404 (issue 10, item 30).
pub const HTTP_PATH_ID_MAX: usize = 128;
/// One chunk-size line or trailer line of a chunked body.
pub const HTTP_CHUNK_LINE_MAX: usize = 1024;

/// `http.max_connections` default: "bound the number of open connections
/// (refuse beyond it with 503 problem+json)" (issue 6). Open connections
/// include idle keep-alive ones and SSE streams, so the default leaves
/// room for `HTTP_MAX_STREAMS` streams (the issue's figure: "100 SSE
/// subscribers on one busy session") plus 64 request connections. An idle
/// connection costs a socket and its read buffer, no thread.
pub const HTTP_MAX_CONNECTIONS: usize = HTTP_MAX_STREAMS + 64;
/// The ceiling a config may raise `http.max_connections` to.
pub const HTTP_MAX_CONNECTIONS_CEILING: usize = 4096;
/// `http.threads` default: the handler threads `http-N` (issue 6, "a bounded
/// pool of handler threads").
pub const HTTP_THREADS: usize = 4;
pub const HTTP_THREADS_CEILING: usize = 64;

/// SSE streams open at once, each on its own writer thread `http-sse-N`;
/// counted inside `http.max_connections`. Past it a watch is refused with
/// 503 `too_many_streams` before any header is sent.
///
/// Sized for "100 SSE subscribers on one busy session" (issue 6) with
/// room for watches of other sessions and collection watches. One writer
/// thread per stream is kept rather than one thread multiplexing
/// non-blocking writes: the payload memory of a watcher is already bounded
/// by the spec (a watch reads the topic's shared replay buffer, "Session
/// streams read the existing replay buffer rather than maintaining
/// additional payload queues"; its mailbox is one wake), so what a thread
/// adds is its stack, `HTTP_SSE_STACK` of address space of which only the
/// touched pages are resident, and its batch while it is being written
/// (at most one `HTTP_RESPONSE_MAX` frame, transient). Measured by
/// tests/bench/http_bench.rs (`http_sse_watchers_rss`, 2 cores): 100
/// attached watchers of one session cost 3.0 MiB of VmRSS over none, 31
/// KiB each (touched stack, socket, the reset batch it wrote), and 100
/// threads; while the session streams flat out the 100 cost 26.6 MiB over
/// none (batches being written at once and malloc's per-thread arenas),
/// so 192 streams stay within about 55 MiB. One multiplexing writer would
/// save the threads, at the price of an event loop that also had to run
/// snapshot captures without blocking the others.
pub const HTTP_MAX_STREAMS: usize = 192;

/// The stack of an SSE writer thread `http-sse-N`: it formats batches and
/// waits; it never recurses into outside data (a snapshot is built on the
/// reactor and arrives as text). A quarter of the platform's 2 MiB
/// default, so `HTTP_MAX_STREAMS` writers reserve at most 96 MiB of
/// address space (resident: only what they touch).
pub const HTTP_SSE_STACK: usize = 512 * 1024;

/// An idle keep-alive connection is closed after this long.
pub const HTTP_IDLE_MS: u64 = 30_000;
/// One blocking read on a handler thread may wait this long. Handler
/// threads read only bytes already buffered (heads and bodies are read by
/// the poller), so this is a backstop, not a wait a client can cause.
pub const HTTP_READ_TIMEOUT_MS: u64 = 10_000;
/// The whole of one request head (request line and headers) must arrive
/// within this long after its first byte, however many reads it takes;
/// past it the connection is closed. Heads are read on the poller
/// (src/http/listener.rs), so a trickling head costs a buffer, not a
/// handler thread; the deadline keeps it from costing a slot for ever.
/// 15 s is far beyond what a real client needs for at most
/// `HTTP_HEAD_MAX` bytes.
pub const HTTP_HEAD_DEADLINE_MS: u64 = 15_000;
/// The whole body of one request must arrive within this long after its
/// head did; past it the answer is 408 `request_timeout` and the
/// connection is closed. Bodies are read on the poller
/// (src/http/listener.rs), so a stalled body costs its buffer, not a
/// handler thread (an outside review: four authorised PUTs that sent
/// one byte of a 60,000-byte body held all four handlers, and every
/// other request waited). 20 s carries the largest body,
/// `HTTP_INPUT_BODY_MAX` (6 MiB), at 2.5 Mbit/s and a 64 KiB JSON body
/// at 26 kbit/s; the listener is loopback by default.
pub const HTTP_BODY_DEADLINE_MS: u64 = 20_000;
/// Bytes the listener sets aside at once for bodies over `HTTP_BODY_MAX`
/// (only an input's PUT takes one, up to `HTTP_INPUT_BODY_MAX`) whose
/// rest is still arriving, from their head until a handler is done with
/// them: a declared length is set aside whole, a chunked body its limit.
/// Without it `http.max_connections` token holders each stalled short of
/// a 6 MiB input would make the daemon hold 1.5 GiB for the body
/// deadline. 64 MiB is ten of the largest inputs arriving at once; past
/// it such a request is answered 503 `unavailable` with Retry-After and
/// closed. Bodies within `HTTP_BODY_MAX` are not counted: the connection
/// bound bounds them (256 x 64 KiB = 16 MiB at the defaults).
pub const HTTP_LARGE_BODIES_HELD: usize = 64 * 1024 * 1024;
/// Connections one peer address may hold that no request has yet proven
/// with the bearer token, waiting for a head on the poller (issue 10,
/// item 32: "256 silent connections hold every slot for 30 s and everyone
/// else gets 503"). The peer's next connection closes its oldest such
/// one. A browser opens at most 6 connections to an origin and an app a
/// handful, so 32 never touches a real client; loopback callers all share
/// 127.0.0.1 and so this one share.
pub const HTTP_UNPROVEN_PER_PEER: usize = 32;
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
/// How long a handler with no other connection waiting keeps a keep-alive
/// connection it just answered, for the client's next request, before
/// giving it back to the poller (issue 11: "a handler could keep a busy
/// connection until it goes idle"); while other connections may be
/// waiting, the bound on a whole turn's waiting (http/listener.rs, "Busy
/// connections"). A client that sends its next request at once, as a
/// busy one does, needs well under a millisecond on loopback; an idle one
/// costs the thread at most this long.
pub const HTTP_BUSY_LINGER_MS: u64 = 1;

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
/// How often a waiting SSE writer looks whether its client closed the
/// connection (issue 10, item 24: "closed watchers are reaped only by a
/// keepalive write", so dead watchers held a session's slots). A dead
/// watcher's slot is free within about this long; each look is a
/// non-blocking read, a few syscalls a second per stream.
pub const SSE_PEER_CHECK_MS: u64 = 1_000;

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

/// Watchers of one topic (a ledger stream or a session). Past it a new
/// watch is refused with 503 `too_many_streams`. Issue 6's figure is "100
/// SSE subscribers on one busy session"; a publication costs one
/// `try_send` of a wake per watcher and no payload copy (the watchers read
/// the topic's one replay buffer), so 128 bounds the reactor's work per
/// event at 128 wakes while leaving the rest of `HTTP_MAX_STREAMS` to
/// other sessions.
pub const SSE_TOPIC_SUBSCRIBERS: usize = 128;

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

/// "There are at most 32 waiting inputs per session." (seed 002, Input
/// admission and outcomes). Past it a new input is rejected durably with
/// 429 `queue_full`; "a duplicate consumes no slot".
pub const HTTP_INPUTS_WAITING: usize = 32;
/// The Retry-After of a 429 that names no other (`queue_full`,
/// `too_many_sessions`): "Admission or rate limit; includes Retry-After
/// where a later new intent can succeed" (seed 002). What frees room is a
/// turn ending or a session stopping, which nothing predicts; 5 s lets a
/// client poll gently without the daemon promising a time.
pub const HTTP_RETRY_429_S: u64 = 5;

/// "Input admission has a 72,200,000-byte limit, room for ten encoded
/// images." (seed 002). Images are not taken yet, so a message's text is
/// bounded by the agents' own prompt bound, `PROMPT_MAX_BYTES`; the body
/// may carry that text JSON-escaped (six bytes per byte at worst).
pub const HTTP_INPUT_BODY_MAX: usize = 6 * PROMPT_MAX_BYTES + 4096;

/// "Default entry count is 100, maximum 200, with a 256 KiB content
/// budget." (seed 002, Durable history)
pub const HTTP_HISTORY_DEFAULT: usize = 100;
pub const HTTP_HISTORY_MAX: usize = 200;
pub const HTTP_HISTORY_BYTES: usize = 256 * 1024;

/// "tail, default 100 and maximum 200, selects the recent history window.
/// The byte bound can shorten the window." (seed 002, Creation)
pub const HTTP_TAIL_DEFAULT: usize = 100;
pub const HTTP_TAIL_MAX: usize = 200;

/// Live sessions whose recent history `GET /sessions/{id}` keeps on the
/// reactor (`http::sessions::HistoryCache`), least recently read first
/// out: enough for the sessions a dashboard polls at once, while the
/// memory stays bounded (at most this many tails of `HTTP_TAIL_MAX`
/// entries, each within `HTTP_HISTORY_BYTES`: 64 x 256 KiB = 16 MiB at
/// the very worst, a few KiB each for ordinary sessions).
pub const HTTP_HISTORY_CACHE: usize = 64;

/// Serialised `GET /sessions/{id}` answers that handler threads serve
/// without the reactor (`http::snapshots`), keyed by path and tail. Not
/// from the spec, which sets no figure: issue 11 asks that "reads of
/// committed state need not wait for the reactor", and one per session
/// and tail a dashboard polls at once is the same 64 as the history
/// cache above, whose tails bound each answer (at most 64 answers of a
/// `HTTP_TAIL_MAX` tail, as that cache holds).
pub const HTTP_SNAPSHOTS: usize = 64;

/// One history entry's text inline in a page or an event; longer text is
/// cut there (`content_complete: false`) and stays whole in the ledger
/// ("A large group uses content references rather than growing a response
/// past its bound", seed 002).
pub const HTTP_ENTRY_TEXT_MAX: usize = 16 * 1024;

/// Sessions that keep a live topic (replay buffer and watchers) for the
/// session watch. Each holds at most `SSE_REPLAY_BYTES`; one nobody
/// watches is dropped first (its next watch resets under a new
/// generation, as a restarted actor would).
pub const SSE_SESSION_TOPICS: usize = 64;

/// Collection watches at once (`GET /sessions` as SSE), each with a queue
/// of at most `SSE_QUEUE_EVENTS` / `SSE_QUEUE_BYTES` ("The bus queue holds
/// at most 256 events and 1 MiB per subscriber", seed 002), so at most
/// 32 MiB of queues in all: unlike session watches, each has its own
/// payload queue, hence a bound well under `HTTP_MAX_STREAMS`.
pub const SSE_COLLECTION_WATCHES: usize = 32;

/// "activity [...] contains up to 12 lines [...]. Each line has at most 256
/// Unicode scalar values and 1,024 UTF-8 bytes" (seed 002, Session
/// representations).
pub const HTTP_ACTIVITY_LINES: usize = 12;
pub const HTTP_ACTIVITY_LINE_CHARS: usize = 256;

/// "pending_inputs, at most 32 bounded input summaries" (seed 002): the
/// same bound as the waiting queue; a summary's preview is at most this
/// many characters.
pub const HTTP_INPUT_PREVIEW_CHARS: usize = 256;

/// Creation and input decisions remembered: "Its admission record remains
/// for seven days after that point" (seed 002); older terminal records are
/// purged at start. Also bounds the in-memory index: past this many
/// records a new identity is refused with 429 until old ones expire.
pub const HTTP_DECISIONS_MAX: usize = 100_000;

// ---- end-to-end encryption (seed 004, "Noise parameters", "Sealed records") ----

/// "Message 1 is 96 bytes: ephemeral key (32), encrypted static key (48),
/// and the tag of the empty payload (16)." (seed 004, Noise parameters). A
/// message 1 of any other length is dropped before any Diffie-Hellman.
pub const E2EE_MSG1_LEN: usize = 96;

/// "Message 2 is 48 bytes: ephemeral key (32) and the tag of the empty
/// payload (16)." (seed 004, Noise parameters)
pub const E2EE_MSG2_LEN: usize = 48;

/// "Each record holds at most 65519 bytes of plaintext." (seed 004, Sealed
/// records): with its 16-byte tag a record's ciphertext is at most 65535
/// bytes, the largest `uint16_be` length.
pub const E2EE_RECORD_MAX_PLAINTEXT: usize = 65_519;

// ---- trust log (seed 004, "Locked mode"; issue 14) ----

/// "The decoder limits are 1 MiB per field, 4096 items per list, and 65536
/// entries per chain." (seed 004, Entry encoding). A chain carries each
/// entry as one field, so an entry's whole wire form is held to this bound
/// too: an entry no chain could carry is refused on its own as well.
pub const TRUSTLOG_MAX_FIELD: usize = 1024 * 1024;
/// The same sentence: signers, disablements, replacements and co-signs of
/// one entry, each at most this many.
pub const TRUSTLOG_MAX_LIST: usize = 4096;
/// The same sentence: entries in one chain, in files and in assembly.
pub const TRUSTLOG_MAX_CHAIN: usize = 65_536;

/// "If the list is longer than 4096 hashes, the caller cuts it and sets
/// truncated." (seed 004, Distribution): `known` in `trustlog.sync`.
pub const TRUSTLOG_SYNC_KNOWN_MAX: usize = 4096;

/// "The disablement commitment is Argon2id with the salt
/// argus-trustlog-disablement-v1, time 1, memory 64 MiB, 4 threads, and a
/// 32-byte output. A secret is 32 random bytes." (seed 004, Chain rules).
/// These are part of the contract, not tunables: another value computes
/// another commitment and no genesis would match.
pub const TRUSTLOG_ARGON2_SALT: &[u8] = b"argus-trustlog-disablement-v1";
pub const TRUSTLOG_ARGON2_TIME: u32 = 1;
/// In KiB, as Argon2 counts memory: 64 MiB.
pub const TRUSTLOG_ARGON2_MEMORY_KIB: u32 = 64 * 1024;
pub const TRUSTLOG_ARGON2_LANES: u32 = 4;
pub const TRUSTLOG_ARGON2_OUTPUT: usize = 32;
pub const TRUSTLOG_SECRET_LEN: usize = 32;

// ---- locked mode on the node (seed 004, "Locked mode control"; issue 14) ----

/// Disable entries a trust sync checks, at most. "The disablement
/// commitment is Argon2id with ... memory 64 MiB" (seed 004, Chain rules):
/// each costs one evaluation, and anyone can sign one, so a gateway could
/// send thousands to stall the lock worker. A winning branch holds one
/// disable entry; four leave room for forks.
pub const LOCK_SYNC_DISABLES: usize = 4;

/// `lock.*` calls waiting while one changes the log (DESIGN.md: "Every
/// queue is bounded"). They run one at a time, in order, so that each
/// signs against the tip the one before it committed; past this many the
/// call is refused with `busy`.
pub const LOCK_QUEUE: usize = 64;
/// Jobs queued to the lock worker thread: the start-up load and the one
/// change in flight (Argon2id commitments, chain verification).
pub const LOCK_WORKER_QUEUE: usize = 4;
/// `gen_disablements` of `lock.init` ("the count of disablement secrets to
/// create"; the seed gives no bound). Each is one Argon2id evaluation at
/// 64 MiB on the worker; Tailscale's tailnet lock makes about ten.
pub const LOCK_MAX_DISABLEMENTS: u32 = 16;
/// Keys in `signers` and `devices` of `lock.init`, and in `revoked` and
/// `replaces` of `lock.revokeSignerStart`: the decoder's list bound
/// ("4096 items per list", seed 004, Entry encoding).
pub const LOCK_MAX_KEYS: usize = TRUSTLOG_MAX_LIST;

// ---- gateway role (seed 004, "Wire format", "Connecting a client",
// ---- "Pairing a new device", "Relay channels"; issue 12) ----

/// "The gateway serves plain HTTP on :8443 by default" (seed 004,
/// Transports): the port of a `[gateway] listen` address given without one.
pub const GATEWAY_PORT: u16 = 8443;

/// "The read limit is 16 MiB per WebSocket message" and "The maximum line
/// length is 16 MiB" (seed 004, Transports and Framing).
pub const GATEWAY_MAX_MESSAGE: usize = 16 * 1024 * 1024;
pub const GATEWAY_MAX_LINE: usize = 16 * 1024 * 1024;

/// WebSocket connections held at once, `/node` and `/client` together (the
/// default of `gateway.max_connections`). Each holds one reader thread and
/// one writer thread ("no thread per connection without a cap", issue 12);
/// past the cap a new connection is closed at accept. The figure
/// holds 1,000 idle clients.
pub const GATEWAY_MAX_CONNECTIONS: usize = 2048;
/// The ceiling a config file may raise it to: two threads a connection.
pub const GATEWAY_MAX_CONNECTIONS_CEILING: usize = 16_384;

/// A connection's read buffer ("the read buffer sized for many idle
/// connections", issue 12; tungstenite's default is 128 KiB), for the
/// handshake and then for frame headers and small payloads: a larger
/// payload is read from the socket straight into its message
/// (src/gateway/ws.rs), so it costs no extra calls.
pub const GATEWAY_READ_BUFFER: usize = 4 * 1024;

/// Stack of each connection thread. A reader parses envelopes (serde_json
/// recurses at most 128 levels) and a writer only copies bytes; only the
/// pages a thread touches count against memory.
pub const GATEWAY_THREAD_STACK: usize = 256 * 1024;

/// How long a new connection may take to send its whole handshake before it
/// is closed, so that a silent socket does not hold its slot.
pub const GATEWAY_HANDSHAKE_MS: u64 = 10_000;
/// Handshakes one peer address may have under way at once; past it a new
/// connection from that address is closed. Without it, silent sockets
/// from one address could hold every slot of `gateway.max_connections`
/// for `GATEWAY_HANDSHAKE_MS` at a time. Behind a reverse proxy every
/// client shares its address; a handshake takes milliseconds, so this
/// many at once still admits bursts of reconnecting clients.
pub const GATEWAY_HANDSHAKES_PER_PEER: usize = 64;

/// "If the gateway cannot write a frame to a client in time, it closes the
/// whole connection" (seed 004, Slow readers). The default of
/// `gateway.write_timeout_ms`: one frame (at most 16 MiB) must be written
/// within it, or the connection is closed.
pub const GATEWAY_WRITE_TIMEOUT_MS: u64 = 10_000;

/// Frames of one message a connection's reader keeps room for until the
/// next: the batch is reused, so a burst of small frames costs no
/// allocation each, and a message of many frames gives its room back (an
/// idle connection may hold at most 64 KiB, issue 12).
pub const GATEWAY_BATCH_KEPT: usize = 64;

/// Frames queued to one connection's writer. Relay frames are bounded per
/// channel (below) and node events per client, so this is reached only by a
/// peer that sends requests and never reads their answers, or a node that
/// falls behind all its clients: the connection is closed (Slow readers).
pub const GATEWAY_OUTBOX_FRAMES: usize = 8192;

/// "The gateway keeps a queue of 64 frames per channel and direction. If a
/// queue is full, the gateway closes the channel. It never drops one frame"
/// (seed 004, Limits and teardown).
pub const GATEWAY_CHANNEL_QUEUE: usize = 64;
/// Bytes of one channel's frames queued in one direction: 64 frames of up
/// to 16 MiB would be 1 GiB, so a channel past this is closed as on a full
/// queue.
pub const GATEWAY_CHANNEL_QUEUE_BYTES: usize = 32 * 1024 * 1024;

/// "The client already holds 64 channels" (seed 004, Opening a channel).
pub const GATEWAY_CHANNELS_PER_CLIENT: usize = 64;

/// "If the event buffer of a client (64 events) is full, the gateway drops
/// the event for that client" (seed 004, Roster events).
pub const GATEWAY_CLIENT_EVENTS: usize = 64;

/// "A node that reconnects within 30 seconds of a disconnect produces
/// online [...] After 30 seconds, the gateway removes it" (seed 004, Roster
/// events). Fixed by the protocol, not configurable.
pub const GATEWAY_ROSTER_GRACE_MS: u64 = 30_000;

/// How long a new uplink has to answer `node.identify` before it is closed.
pub const GATEWAY_IDENTIFY_MS: u64 = 10_000;

/// "The token stays pending in memory for 60 seconds" and "The call blocks
/// until a device connects with the token, or until 60 seconds pass" (seed
/// 004, Pairing a new device).
pub const GATEWAY_PAIR_PENDING_MS: u64 = 60_000;
/// Pairings pending at once; past it `clients.pairStart` is refused.
pub const GATEWAY_PAIRS_PENDING: usize = 16;
/// "A client token is 32 random bytes" (seed 004, Pairing a new device);
/// the master token generated at first start is as long.
pub const GATEWAY_TOKEN_BYTES: usize = 32;
/// Paired devices the gateway stores; past it `clients.pairStart` is
/// refused until one is removed.
pub const GATEWAY_CLIENTS_MAX: usize = 1024;

/// Trust-log entries the gateway holds (seed 004, Distribution: "The
/// gateway keeps the entries in memory"; the seed gives no bound): a
/// chain's decoder limit ("65536 entries per chain").
pub const GATEWAY_TRUSTLOG_ENTRIES: usize = TRUSTLOG_MAX_CHAIN;
/// Bytes of wire form those entries may take: their base64 in a
/// `trustlog.sync` answer to a caller that knows nothing (about 4/3 of
/// this, plus three bytes an entry) must fit in one 16 MiB line.
pub const GATEWAY_TRUSTLOG_BYTES: usize = 8 * 1024 * 1024;

/// Messages from connection threads to the gateway thread. A full queue
/// makes the sending reader wait, which slows only its own peer.
pub const GATEWAY_INBOX: usize = 4096;

/// Bytes a writer gathers into one WebSocket message from frames already
/// queued ("A WebSocket message does not always hold exactly one frame",
/// seed 004, Framing), so that a burst of small frames costs one write.
pub const GATEWAY_WRITE_BATCH: usize = 256 * 1024;
/// Frames in one such message: each is one or two `writev` slices, and a
/// `writev` takes at most 1024 (IOV_MAX).
pub const GATEWAY_WRITE_BATCH_FRAMES: usize = 500;

/// Bytes of relay frames a connection's reader writes straight to the
/// other side's socket in one message when that side's writer is idle
/// (src/gateway/conn.rs, Direct writes), gathered from where the frames
/// are: as much as the writer puts in one message, since the hop to the
/// writer thread costs a wake-up and a switch at any size (it was 16 KiB
/// while a direct write copied its frames into one buffer; the 64 KiB
/// relay figure went through the hop).
pub const GATEWAY_DIRECT_WRITE: usize = GATEWAY_WRITE_BATCH;

/// Connections to the standalone gateway's unix socket at once, each served
/// by its own thread (`server.info`, `server.stop`, `clients.*` for
/// `omniconfluxd pair`).
pub const GATEWAY_SOCKET_CONNECTIONS: usize = 16;

/// How long the accept thread waits after a failed accept (out of file
/// descriptors, say) before it tries again, instead of spinning.
pub const GATEWAY_ACCEPT_BACKOFF_MS: u64 = 100;

// ---- tmux panes (issue 15; seed 004, Features › Sessions) ----

/// "Bound every output you read" (issue 15): `list-panes -a` of a server,
/// about 200 bytes a pane, so room for thousands of panes.
pub const TMUX_LIST_MAX_BYTES: usize = 4 * 1024 * 1024;
/// A pane's captured screen: the seed's largest terminal is 1000 × 1000
/// cells; as UTF-8 of up to 4 bytes a cell, with the line ends.
pub const TMUX_CAPTURE_MAX_BYTES: usize = 4 * 1000 * 1000 + 1000;
/// What of a tmux call's stderr is kept: its first line names the error.
pub const TMUX_STDERR_MAX_BYTES: usize = 4096;
/// A tmux call that has not answered in this long is killed and fails: a
/// wedged server must not hold a worker for ever.
pub const TMUX_CALL_TIMEOUT_MS: u64 = 5_000;
/// Panes of one server looked at per scan ("Discovery of 100 panes",
/// issue 15, with room to spare); the rest are not listed.
pub const TMUX_PANES_MAX: usize = 1024;
/// "blocking tmux calls run on worker threads (bounded)" (issue 15).
pub const TMUX_WORKERS: usize = 2;
/// Jobs queued to the tmux workers; a full queue refuses the request
/// with `unavailable` rather than queueing without bound.
pub const TMUX_JOBS_QUEUED: usize = 64;
/// Requests waiting on a scan or a pane call at once; past it a request is
/// refused with `unavailable`.
pub const TMUX_WAITERS_MAX: usize = 256;
/// "rescans are driven by [...] a bounded, idle-free interval" (issue 15):
/// while someone watches the sessions, a scan every 2 s; a scan younger
/// than this answers `sessions.list` and the pane methods.
pub const TMUX_RESCAN_MS: u64 = 2_000;
/// The prompt line a screen-read `awaiting_input` session shows as its
/// `interaction.message` (seed 004: "its interaction field describes the
/// request"): one screen line, cut at this many characters so that a
/// 1000-column pane does not make a long session event.
pub const TMUX_PROMPT_LINE_MAX: usize = 256;
/// Processes read from /proc per scan, and looked at in one pane's tree.
pub const PROC_SCAN_MAX: usize = 65_536;
pub const PROC_TREE_MAX: usize = 4096;
/// Bytes of /proc/PID/cmdline read to name a process: its first two
/// arguments are all discovery needs.
pub const PROC_CMDLINE_MAX_BYTES: usize = 4096;
/// Entries of a Claude Code project directory looked at for the newest
/// transcript.
pub const TRANSCRIPT_DIR_SCAN_MAX: usize = 4096;
/// The end of a transcript file read for the session's status: its last
/// records, which say whether a turn runs.
pub const TRANSCRIPT_TAIL_BYTES: usize = 64 * 1024;
/// Directories walked up from a session's cwd to find its `.git`.
pub const GIT_WALK_MAX: usize = 64;
/// `sessions.key`: keys per call, and the longest key name (tmux's longest
/// names, `C-M-S-BSpace` and the like, are far shorter).
pub const TMUX_KEYS_MAX: usize = 64;
pub const TMUX_KEY_NAME_MAX: usize = 32;
/// "paths holds [...] at most 200" (seed 004, host.completeDir); entries
/// of the directory read to find them.
pub const COMPLETE_DIR_MAX: usize = 200;
pub const COMPLETE_DIR_SCAN_MAX: usize = 16_384;
/// "One output chunk holds at most 32 KiB" (seed 004, Terminals).
pub const TERMINAL_CHUNK_BYTES: usize = 32 * 1024;
/// "The default size is 80×24. The maximum is 1000 in each direction."
/// (seed 004, Terminals)
pub const TERMINAL_DEFAULT_COLS: u16 = 80;
pub const TERMINAL_DEFAULT_ROWS: u16 = 24;
pub const TERMINAL_MAX_SIZE: u16 = 1000;
/// Terminals open at once across all connections: each holds two threads
/// (three with a viewer pane's feed), a pseudo-terminal and a tmux client.
pub const TERMINALS_MAX: usize = 16;
/// Input chunks queued to a terminal's writer; a full queue refuses
/// terminal.input rather than grow.
pub const TERMINAL_INPUT_QUEUE: usize = 64;
/// The largest `data` of one terminal.input, decoded.
pub const TERMINAL_INPUT_MAX_BYTES: usize = 64 * 1024;
/// "For a session without a pane, the node first creates a viewer pane"
/// (seed 004, Terminals): the bytes of transcript one viewer pane's feed
/// file holds at most, and the events it reads from the ledger at a time
/// (src/tmux/viewer.rs).
pub const VIEWER_FEED_MAX_BYTES: usize = 16 * 1024 * 1024;
pub const VIEWER_FEED_PAGE: usize = 500;

// The uplink: the node's side of the gateway (issue 13; seed 004, "Connecting
// a client", "Relay channels", "End-to-end encryption").

/// "The wait starts at 500 ms and doubles up to 15 seconds. After a
/// successful connection, the wait goes back to 500 ms" (seed 004,
/// Reconnect: the client default, which the node's dialing follows).
pub const UPLINK_BACKOFF_FIRST_MS: u64 = 500;
pub const UPLINK_BACKOFF_MAX_MS: u64 = 15_000;
/// "The client default is a ping every 15 seconds with a 5-second timeout,
/// and a close after two failed pings in a row" (seed 004, Keepalive): the
/// uplink pings the gateway as often, and closes after two intervals plus
/// the timeout without hearing anything at all from it.
pub const UPLINK_PING_MS: u64 = 15_000;
pub const UPLINK_PING_TIMEOUT_MS: u64 = 5_000;
/// Connecting and the WebSocket handshake, together.
pub const UPLINK_CONNECT_MS: u64 = 10_000;
/// How long one write to the gateway may take before the uplink is closed
/// ("a partial frame corrupts the stream", seed 004, Slow readers).
pub const UPLINK_WRITE_TIMEOUT_MS: u64 = 10_000;
/// Lines queued for the uplink's writer. Full means the gateway does not
/// read: the uplink is closed (a dropped frame would break a channel's
/// Noise nonce order) and dialed again.
pub const UPLINK_OUTBOX_FRAMES: usize = 4096;
/// A terminal's output on a relay channel is queued only while the uplink's
/// outbox holds fewer frames than this; past it the terminal is closed
/// (`terminal.exited` `slow`), so that no terminal fills the outbox and
/// closes the uplink for every channel ("a slow reader never slows the
/// agents or another reader", DESIGN.md; issue 15: "a slow reader drops or
/// is closed, never slows the pane"). The gateway queues 64 frames per
/// channel (seed 004, Limits and teardown); this many chunks of at most
/// `TERMINAL_CHUNK_BYTES` (sealed and in base64, about 44 KiB a frame) are
/// under 3 MiB.
pub const UPLINK_TERMINAL_BACKLOG: usize = 64;
/// `session.event` notifications of one channel waiting in the uplink's
/// outbox: "If the event buffer of a subscriber (64 events) is full, the
/// node drops the event for that subscriber" (seed 004, Features ›
/// Sessions). A channel's start (its snapshot) is not counted.
pub const UPLINK_CHANNEL_EVENTS: usize = 64;
/// Channels one uplink holds at once; a frame that would open one more is
/// dropped, as the seed drops every frame it cannot serve. The gateway
/// allows 64 per client.
pub const UPLINK_CHANNELS: usize = 1024;
/// Requests of one channel being served at once; past it a request is
/// answered `busy`. The gateway queues at most 64 frames per channel and
/// direction (seed 004, Limits and teardown), so a client that waits for
/// its answers never meets this.
pub const UPLINK_CHANNEL_IN_FLIGHT: usize = 64;

// ---- transcripts of discovered Claude Code sessions (issue 15; seed 004, Transcripts) ----

/// "The node reads the transcript every second" (seed 004, Transcripts),
/// while someone subscribes to it; no timer runs otherwise.
pub const TRANSCRIPT_POLL_MS: u64 = 1_000;
/// Bytes of a transcript file read by one job: a larger file is read on
/// by the next poll (or the next request), so no job holds a worker for
/// long however big the file.
pub const TRANSCRIPT_READ_PER_JOB: usize = 16 * 1024 * 1024;
/// One record (line) of a transcript file; a longer one is skipped whole
/// rather than buffered: the largest Claude Code writes are tool results
/// it has already cut far below this.
pub const TRANSCRIPT_LINE_MAX: usize = 4 * 1024 * 1024;
/// Entries kept of one transcript file; past it new entries are not kept
/// (a file that large is far beyond any one client's list).
pub const TRANSCRIPT_FILE_ENTRIES_MAX: usize = 50_000;
/// A tool call's input and result kept for `sessions.toolDetail`; longer
/// ones are cut at a character boundary.
pub const TRANSCRIPT_TOOL_DETAIL_MAX: usize = 64 * 1024;
/// Parsed transcript files kept without a subscriber, so a second view
/// reads only what was appended; a file with subscribers is always kept.
pub const TRANSCRIPT_FILES_IDLE_MAX: usize = 8;
/// Transcript files followed at once (with subscribers or waiting
/// requests); past it a new one is refused with `unavailable`.
pub const TRANSCRIPT_FILES_MAX: usize = 64;
/// Prompts kept of one session's queue, and tasks of its task list.
pub const TRANSCRIPT_QUEUE_MAX: usize = 256;
pub const TRANSCRIPT_TASKS_MAX: usize = 1024;
/// The wakelock's probe (`systemd-inhibit ... true` at start) is given this
/// long before it counts as failed: logind answers in milliseconds, a bus
/// that hangs must not leave the probe thread waiting for ever.
pub const WAKELOCK_PROBE_MS: u64 = 5_000;
/// A wakelock's until is checked at least this often, so that a far date
/// costs one wake-up an hour (and 9999-12-31T23:59:59Z none).
pub const WAKELOCK_RECHECK_MS: u64 = 3_600_000;
