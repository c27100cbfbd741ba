//! `omniconfluxd serve`: the daemon's state and its event loop (DESIGN.md,
//! "Threads and ownership"; issue 2, "What a user gets").
//!
//! [`Daemon`] is owned by the reactor thread. Everything that changes state
//! happens in one of its handlers, one at a time, so no state needs a lock.
//! Writes go to the ledger writer as batches with a continuation that runs
//! here once the batch is committed: a reply, an event fan-out, anything
//! acknowledged, happens only after the commit.
//!
//! A subsystem converted to the shape of DESIGN.md ("How subsystems
//! talk"; the seats, the sessions and the approvals inbox so far) changes
//! only through its own methods
//! and returns effects ([`effects`]); [`router`] applies them and delivers
//! its domain events, in order and without re-entrancy, and is where one
//! subsystem's change reaches another.
//!
//! Surfaces: the daemon socket is driven here; every other surface (HTTP,
//! the gateway, the uplink's relay channels) is a row of [`SURFACES`] that
//! hears committed events, committed session rounds and the stop. A request from any surface is a [`Req`]
//! whose [`ReplyTo`] says where [`Daemon::answer`] sends the result, so the
//! method tables and the subsystems behind them never know which surface
//! asked.
//!
//! Start-up order: mark inherited descriptors close-on-exec (no child
//! gets them), block signals, read the config, become child subreaper,
//! open the ledger, bind the socket, start the signal thread, tell the
//! service manager READY=1. Stop order (SIGTERM, SIGINT, `server.stop`):
//! STOPPING=1, close the listener and remove the socket file, answer new
//! requests with `shutting-down`, wait for queued commits and replies (at
//! most `SHUTDOWN_DRAIN_MS`), join the ledger threads, exit 0.

use mio::{Events, Token};
use serde_json::Value;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::children::{ChildId, Children, ExitStatus, Outputs};
use crate::config::{self, FileConfig, Paths};
use crate::errors::{Code, RpcError};
use crate::ledger::{self, Appended, Batch, Ledger, Op, WriteError};
use crate::limits;
use crate::procs::{CallerClass, Owner, Roots};
use crate::reactor::{Inbox, LISTENER, Msg, Reactor, WAKER};
use crate::socket::{self, CloseReason, Server, rpc};

pub mod effects;
pub mod router;

/// Where the answer to a request goes (DESIGN.md, "How subsystems talk").
/// A surface that runs the socket's methods adds a variant here and its arm
/// in [`Daemon::answer`]; the methods and the subsystems behind them only
/// hand the `Req` back.
#[derive(Clone, Debug)]
pub enum ReplyTo {
    /// A daemon socket connection, and the request's JSON-RPC id.
    Socket { conn: Token, id: Value },
    /// An HTTP handler thread blocked on its one-slot reply channel; it
    /// maps an error to its problem itself (`http::problem::from_rpc`).
    Http(crate::http::Answer<Result<Value, RpcError>>),
    /// A relay channel of the uplink (issue 13): the link (one per
    /// connection to the gateway), the channel and the request's id.
    Relay { link: u64, chan: String, id: Value },
}

/// What the daemon tells a surface that runs beside the socket, one row
/// of [`SURFACES`] each. The socket is the reactor's own and is driven
/// here directly; its watches hear the same things after these rows.
pub struct Hooks {
    /// Committed ledger events, in commit order.
    pub events: fn(&mut Daemon, &[Appended]),
    /// A committed round of a session, with its transcript delta.
    pub session: fn(&mut Daemon, &str, Option<&crate::core::transcript::Delta>),
    /// The daemon begins to stop: stop accepting, end streams.
    pub stop: fn(&mut Daemon),
    /// Whether it still has answers or streams to finish before exit.
    pub busy: fn(&Daemon) -> bool,
}

/// The surfaces beside the socket. Adding one is a module under src/, its
/// state in a field of [`Daemon`] started in [`Daemon::serve`], a
/// [`ReplyTo`] variant with its arm in [`Daemon::answer`], and a row here.
const SURFACES: &[Hooks] = &[
    crate::http::HOOKS,
    crate::gateway::in_node::HOOKS,
    crate::uplink::HOOKS,
];

/// Who sent a request and where its answer goes.
#[derive(Clone, Debug)]
pub struct Req {
    pub to: ReplyTo,
    pub class: CallerClass,
}

impl Req {
    /// The socket connection the request came on, when it came on one:
    /// what subscriptions are kept against.
    pub fn conn(&self) -> Option<Token> {
        match &self.to {
            ReplyTo::Socket { conn, .. } => Some(*conn),
            ReplyTo::Http(_) | ReplyTo::Relay { .. } => None,
        }
    }
}

/// What waits for a ledger batch to commit.
pub type AfterCommit = Box<dyn FnOnce(&mut Daemon, Result<Vec<Appended>, WriteError>)>;

/// Why `serve` could not run; `main` turns it into one line and exit code.
#[derive(Debug)]
pub enum ServeError {
    Config(config::ConfigError),
    Startup(String),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Config(e) => write!(f, "invalid configuration: {e}"),
            ServeError::Startup(s) => f.write_str(s),
        }
    }
}

pub struct Daemon {
    pub cfg: FileConfig,
    pub paths: Paths,
    pub node_name: String,
    pub instance_id: String,
    pub started_at_ms: i64,
    pub started: Instant,
    pub reactor: Reactor,
    pub inbox: Inbox,
    pub ledger: Ledger,
    pub socket: Server,
    pub roots: Roots,
    pub children: Children,
    /// The plugin host (issue 4).
    pub plugins: crate::plugins::host::Host,
    /// Seats, sessions and the approvals inbox (issue 3).
    pub core: crate::core::Core,
    /// Lanes (issue 5).
    pub lanes: crate::lanes::controller::Lanes,
    /// The HTTP API when `[http] listen` or `serve --http` turns it on.
    pub http: Option<crate::http::Http>,
    /// Locked mode: the trust log, pin and flags, and `lock.*` (issue 14).
    pub lock: crate::daemon::router::lock::Node,
    /// The gateway role when `[gateway] listen` or `serve --gateway` turns
    /// it on (issue 12); its own threads, not the reactor's.
    pub gateway: Option<crate::gateway::Gateway>,
    /// Sessions in tmux panes (issue 15).
    pub tmux: router::tmux::Routes,
    /// The uplink when `[uplink] url` or a gateway in the node turns it on
    /// (issue 13): its threads move lines, its channels live here.
    pub uplink: Option<crate::uplink::Uplink>,
    router: router::Router,
    pending: HashMap<u64, AfterCommit>,
    next_ticket: u64,
    dirty: crate::reactor::IdSet<Token>,
    pump: Vec<Token>,
    stopping: Option<Instant>,
}

impl Daemon {
    /// Runs the daemon until it is stopped. Returns once everything queued
    /// was committed and the socket file is gone.
    pub fn serve(flags: &config::PathFlags) -> Result<(), ServeError> {
        crate::isolation::close_inherited_on_exec().map_err(|e| {
            ServeError::Startup(format!(
                "unable to keep inherited descriptors from child processes: {}",
                crate::errors::io_cause(&e)
            ))
        })?;
        crate::signals::block()
            .map_err(|e| ServeError::Startup(format!("unable to block signals: {e}")))?;
        let env = config::Env::from_process();
        let (cfg, paths) = config::load_effective(flags, &env).map_err(ServeError::Config)?;
        crate::log::set_level(cfg.log_level());
        if let Err(e) = crate::procs::become_subreaper() {
            return Err(ServeError::Startup(format!(
                "unable to become child subreaper: {e}"
            )));
        }
        let reactor = Reactor::new()
            .map_err(|e| ServeError::Startup(format!("unable to create the event loop: {e}")))?;
        let inbox = reactor.inbox();
        let commit_inbox = inbox.clone();
        let ledger = Ledger::open(
            &paths.ledger,
            Box::new(move |c| {
                commit_inbox.send(Msg::Committed(c));
            }),
        )
        .map_err(|e| ServeError::Startup(e.0))?;
        if let Some(reason) = &ledger.corrupt {
            crate::error!("{}", corrupt_line(&paths.ledger, &reason.0));
        }
        let mut socket = Server::bind(&paths.socket, cfg.socket.clone())
            .map_err(|e| ServeError::Startup(e.to_string()))?;
        socket
            .register(reactor.poll.registry(), LISTENER)
            .map_err(|e| ServeError::Startup(format!("unable to watch the socket: {e}")))?;
        let signal_inbox = inbox.clone();
        crate::signals::spawn(move |sig| {
            signal_inbox.send(Msg::Signal(sig));
        })
        .map_err(|e| ServeError::Startup(format!("unable to start the signal thread: {e}")))?;
        let node_name = if cfg.daemon.node_name.is_empty() {
            host_name()
        } else {
            cfg.daemon.node_name.clone()
        };
        let plugins = crate::plugins::host::load(&paths);
        let core_cfg = cfg.clone();
        let instance_id = crate::ids::uuid_v4();
        let http = crate::http::Http::start(&cfg.http, &paths, inbox.clone(), &instance_id)
            .map_err(ServeError::Startup)?;
        let gateway = crate::gateway::in_node::start(&cfg, &paths).map_err(ServeError::Startup)?;
        let tmux = router::tmux::Routes::start(inbox.clone());
        let uplink = crate::uplink::start(&cfg, &paths, &inbox, gateway.as_ref())
            .map_err(ServeError::Startup)?;
        let mut d = Daemon {
            cfg,
            paths,
            node_name,
            instance_id,
            started_at_ms: crate::clock::now_ms(),
            started: Instant::now(),
            reactor,
            inbox,
            ledger,
            socket,
            roots: Roots::default(),
            children: Children::default(),
            plugins,
            core: crate::core::Core::new(&core_cfg),
            lanes: Default::default(),
            http,
            lock: Default::default(),
            gateway,
            tmux,
            uplink,
            router: router::Router::default(),
            pending: HashMap::new(),
            next_ticket: 0,
            dirty: Default::default(),
            pump: Vec::new(),
            stopping: None,
        };
        crate::info!(
            "omniconfluxd {} serving on {} with ledger {}",
            env!("CARGO_PKG_VERSION"),
            d.paths.socket.display(),
            d.paths.ledger.display()
        );
        crate::notify::notify("READY=1");
        d.start_integrity_check();
        let probed = crate::isolation::probe_later(d.inbox.clone(), |d, probe| {
            router::plugins::isolation_known(d, &probe);
            router::lanes::isolation_known(d, &probe);
            router::sessions::isolation_known(d, &probe);
        });
        if let Err(e) = probed {
            crate::error!(
                "unable to start the isolation probe: {e}; plugins run without isolation"
            );
            let none: crate::isolation::Probe = Err("the probe could not run".into());
            router::plugins::isolation_known(&mut d, &none);
            router::lanes::isolation_known(&mut d, &none);
            router::sessions::isolation_known(&mut d, &none);
        }
        router::seats(&mut d, crate::core::seats::Seats::probe);
        d.read_lanes_at_start();
        crate::daemon::router::lock::start(&mut d);
        d.run();
        router::plugins::finish(&mut d);
        // No child outlives the daemon: whatever the owners' own stop
        // sequences left running is killed with its process group.
        for id in d.children.ids() {
            d.children.signal(id, libc::SIGKILL);
        }
        let Daemon { ledger, .. } = d;
        ledger.close();
        crate::info!("stopped");
        Ok(())
    }

    fn run(&mut self) {
        let mut events = Events::with_capacity(256);
        loop {
            // Written before the loop started, or in a wake-up whose poll
            // failed.
            if self.children.has_unflushed() {
                self.flush_written();
            }
            let mut timeout = self.reactor.poll_timeout();
            if let Some(deadline) = self.stopping {
                if self.drained() || Instant::now() >= deadline {
                    if !self.drained() {
                        crate::warn!(
                            "stopping with {} commits and {} bytes of replies not done",
                            self.pending.len(),
                            self.socket.queued_bytes()
                        );
                    }
                    return;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                timeout = Some(timeout.map_or(left, |t| t.min(left)));
            }
            if self.reactor.has_pending() || !self.pump.is_empty() {
                timeout = Some(Duration::ZERO);
            }
            if let Err(e) = self.reactor.poll.poll(&mut events, timeout) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    crate::error!("the event loop failed: {e}; stopping");
                    self.begin_stop("the event loop failed");
                }
                continue;
            }
            // Every unit of work that may change state counts a change
            // before it runs (reactor.rs, `Inbox::changed`).
            if events.iter().any(|ev| ev.token() != WAKER) {
                self.inbox.changed();
            }
            for ev in events.iter() {
                match ev.token() {
                    WAKER => {}
                    LISTENER => {
                        let roots = &self.roots;
                        self.socket.accept_all(self.reactor.poll.registry(), |s| {
                            socket::classify_stream(s, roots)
                        });
                    }
                    t if Children::owns_token(t) => {
                        let closed = ev.is_read_closed() || ev.is_error();
                        if let Some((id, out)) =
                            self.children
                                .on_ready(self.reactor.poll.registry(), t, closed)
                        {
                            self.on_child_output(id, out);
                        }
                    }
                    t => {
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            self.on_readable(t);
                        }
                        if ev.is_writable() {
                            self.dirty.insert(t);
                        }
                    }
                }
            }
            for msg in self.reactor.drain() {
                self.on_msg(msg);
            }
            for task in self.reactor.due_timers() {
                self.inbox.changed();
                task(self);
            }
            if !self.pump.is_empty() {
                self.inbox.changed();
            }
            for t in std::mem::take(&mut self.pump) {
                if self.socket.wants_pump(t) {
                    self.on_readable(t);
                }
            }
            // Once per wake-up: every batch committed in it sends one merged
            // transcript delta per subscriber, and what it wrote to each
            // connection and child leaves in one write.
            crate::socket::watches::flush_deltas(self);
            self.flush_written();
        }
    }

    /// Writes what this wake-up queued to children and connections. A
    /// child found closed is told to its owner, and anything that queues is
    /// written too: this repeats until nothing is queued, and ends because
    /// each child's stdin closes at most once.
    fn flush_written(&mut self) {
        loop {
            for (id, out) in self.children.flush_queued(self.reactor.poll.registry()) {
                self.on_child_output(id, out);
            }
            self.flush_dirty();
            if !self.children.has_unflushed() {
                break;
            }
        }
    }

    /// Nothing left to finish: no commit waits, no request (a ledger read
    /// included) is unanswered, and every answer is written.
    fn drained(&self) -> bool {
        self.pending.is_empty()
            && self.socket.in_flight() == 0
            && self.socket.queued_bytes() == 0
            && self.plugins.all_stopped()
            && !SURFACES.iter().any(|s| (s.busy)(self))
    }

    fn on_msg(&mut self, msg: Msg) {
        if !matches!(msg, Msg::Read(_)) {
            self.inbox.changed();
        }
        match msg {
            Msg::Read(task) => task(self),
            Msg::Signal(sig) => self.on_signal(sig),
            Msg::Run(task) => task(self),
            Msg::Report(report) => router::report(self, report),
            Msg::Committed(list) => {
                for c in list {
                    if let Ok(appended) = &c.result {
                        self.publish(appended);
                    }
                    if let Err(WriteError::Corrupt) = &c.result {
                        self.mark_ledger_corrupt(
                            "sqlite reported the database corrupt during a write".into(),
                        );
                    }
                    if let Some(k) = self.pending.remove(&c.ticket) {
                        k(self, c.result);
                    }
                }
            }
        }
    }

    fn on_signal(&mut self, sig: libc::c_int) {
        match sig {
            libc::SIGTERM | libc::SIGINT => {
                let name = if sig == libc::SIGTERM {
                    "SIGTERM"
                } else {
                    "SIGINT"
                };
                self.begin_stop(name);
            }
            libc::SIGHUP => self.reload(),
            libc::SIGCHLD => self.reap_children(),
            _ => {}
        }
    }

    /// Reaps every exited child of the reactor thread: the agents and
    /// plugins it started, and descendants re-parented to the daemon as
    /// subreaper (the kernel attaches them to the thread-group leader, which
    /// is this thread). It never waits on pid -1: processes a worker thread
    /// starts (git, probes) are that worker's to wait for, and a wait on -1
    /// here would steal their exit status.
    fn reap_children(&mut self) {
        let mut pids = self.children.pids();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        if let Ok(list) = std::fs::read_to_string(format!("/proc/self/task/{tid}/children")) {
            pids.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            let mut status = 0;
            // SAFETY: waitpid on one pid with WNOHANG and a valid status pointer.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r != pid {
                continue;
            }
            self.roots.remove(pid);
            if let Some(id) = self.children.exited(pid) {
                self.on_child_exit(id, ExitStatus::from_wait(status));
            }
        }
    }

    /// Routes what a child's pipes produced to the child's owner.
    fn on_child_output(&mut self, id: ChildId, out: Outputs) {
        match self.children.owner(id) {
            // Also with nothing read: a drained stdin queue matters to it.
            Some(Owner::Plugin(_)) => router::plugins::on_output(self, id, &out),
            Some(Owner::Session(_)) if !out.is_empty() => {
                router::sessions::on_output(self, id, &out)
            }
            _ => {}
        }
        self.children.recycle(out);
    }

    /// Routes a reaped child's exit to its owner.
    fn on_child_exit(&mut self, id: ChildId, status: ExitStatus) {
        match self.children.owner(id).cloned() {
            Some(Owner::Plugin(_)) => router::plugins::on_exit(self, id, status),
            Some(Owner::Session(_)) => router::sessions::on_exit(self, id, status),
            None => {}
        }
    }

    fn reload(&mut self) {
        let path = self.paths.config.clone();
        let new = if path.exists() {
            match config::load(&path) {
                Ok(c) => c,
                Err(e) => {
                    crate::error!(
                        "unable to reload configuration: {e}; keeping the running configuration"
                    );
                    return;
                }
            }
        } else {
            FileConfig::default()
        };
        let report = config::diff(&self.cfg, &new);
        crate::log::set_level(new.log_level());
        self.socket.limits = new.socket.clone();
        let restart_keys = report.needs_restart.clone();
        // Keys that need a restart keep their running values until then.
        let mut applied = new;
        applied.daemon.state_dir = self.cfg.daemon.state_dir.clone();
        applied.daemon.socket = self.cfg.daemon.socket.clone();
        applied.daemon.node_name = self.cfg.daemon.node_name.clone();
        applied.http = self.cfg.http.clone();
        applied.gateway = self.cfg.gateway.clone();
        applied.uplink = self.cfg.uplink.clone();
        self.cfg = applied;
        // SIGHUP: the new seats (or a new detection), probed.
        self.core.seats.reconfigure(&self.cfg);
        router::seats(self, crate::core::seats::Seats::probe);
        if report.applied.is_empty() && restart_keys.is_empty() {
            crate::info!("reloaded {}: nothing changed", path.display());
        } else {
            crate::info!(
                "reloaded {}: applied [{}]; needs a restart [{}]",
                path.display(),
                report.applied.join(", "),
                restart_keys.join(", ")
            );
        }
    }

    /// Begins a clean stop; see the module comment for the order.
    pub fn begin_stop(&mut self, why: &str) {
        self.begin_stop_within(why, Duration::from_millis(limits::SHUTDOWN_DRAIN_MS));
    }

    /// Begins a clean stop that waits at most `drain` for in-flight work.
    pub fn begin_stop_within(&mut self, why: &str, drain: Duration) {
        if self.stopping.is_some() {
            return;
        }
        crate::info!("stopping ({why})");
        crate::notify::notify("STOPPING=1");
        self.socket.stop_listening(self.reactor.poll.registry());
        // Plugins get their shutdown and the page's 2 + 3 seconds before the
        // last step of the stop kills what is left.
        router::plugins::with(self, |h, _| h.stop_all());
        // Agents are asked to exit, and their exits are not recorded as
        // session ends, so that resumable sessions are reopened at the
        // next start.
        router::sessions::stop_all(self);
        for s in SURFACES {
            (s.stop)(self);
        }
        let plugin_ms = Duration::from_millis(
            limits::PLUGIN_SHUTDOWN_TERM_MS + limits::PLUGIN_SHUTDOWN_KILL_MS + 1_000,
        );
        self.stopping = Some(Instant::now() + drain.max(plugin_ms));
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.is_some()
    }

    fn on_readable(&mut self, t: Token) {
        match self.socket.read_lines(t) {
            Ok(lines) => {
                for line in lines {
                    self.on_line(t, &line);
                }
                // A half-closed client with nothing pending is closed after
                // the flush at the end of this turn of the loop.
                self.dirty.insert(t);
            }
            Err(reason) => self.close_conn(t, reason),
        }
    }

    fn on_line(&mut self, conn: Token, line: &[u8]) {
        match rpc::parse(line) {
            Ok(rpc::Frame::Request { id, method, params }) => {
                let Some(c) = self.socket.conns.get_mut(&conn) else {
                    return;
                };
                c.in_flight += 1;
                let req = Req {
                    to: ReplyTo::Socket { conn, id },
                    class: c.class.clone(),
                };
                if self.stopping.is_some() && method != "ping" {
                    self.answer(
                        req,
                        Err(RpcError::new(Code::ShuttingDown, "the daemon is stopping")),
                    );
                    return;
                }
                crate::socket::methods::dispatch(self, req, &method, params);
            }
            Ok(rpc::Frame::Notification { .. }) | Ok(rpc::Frame::Response) => {}
            Err(refusal) => {
                let bytes = rpc::error(&refusal.id, &refusal.error, None);
                self.send(conn, &bytes);
            }
        }
    }

    /// Answers a request where its [`ReplyTo`] says.
    pub fn answer(&mut self, req: Req, result: Result<Value, RpcError>) {
        match req.to {
            ReplyTo::Socket { conn, id } => {
                let bytes = match &result {
                    Ok(v) => rpc::reply(&id, v),
                    Err(e) => rpc::error(&id, e, None),
                };
                self.answer_socket(conn, &bytes);
            }
            ReplyTo::Http(answer) => answer.send(result),
            ReplyTo::Relay { .. } => crate::uplink::channels::answer(self, req, result),
        }
    }

    /// Queues a socket reply and frees its request's in-flight slot.
    fn answer_socket(&mut self, conn: Token, bytes: &[u8]) {
        let Some(c) = self.socket.conns.get_mut(&conn) else {
            return;
        };
        c.in_flight = c.in_flight.saturating_sub(1);
        self.send(conn, bytes);
        if self.socket.wants_pump(conn) {
            self.pump.push(conn);
        }
    }

    /// Queues bytes to a connection, closing it if it does not read.
    pub fn send(&mut self, conn: Token, bytes: &[u8]) {
        match self.socket.queue(conn, bytes) {
            Ok(()) => {
                self.dirty.insert(conn);
            }
            Err(reason) => self.close_conn(conn, reason),
        }
    }

    /// [`send`](Self::send) of one line given in pieces (a line whose
    /// tail many connections share), queued without joining them first.
    pub fn send_parts(&mut self, conn: Token, parts: &[&[u8]]) {
        match self.socket.queue_parts(conn, parts) {
            Ok(()) => {
                self.dirty.insert(conn);
            }
            Err(reason) => self.close_conn(conn, reason),
        }
    }

    fn flush_dirty(&mut self) {
        for t in std::mem::take(&mut self.dirty) {
            if let Err(reason) = self.socket.flush(t) {
                self.close_conn(t, reason);
            } else if self.socket.finished(t) {
                self.close_conn(t, CloseReason::Eof);
            }
        }
    }

    fn close_conn(&mut self, t: Token, reason: CloseReason) {
        router::tmux::conn_closed(self, t);
        if let Some(c) = self.socket.close(self.reactor.poll.registry(), t) {
            match reason {
                CloseReason::Eof => {}
                other => crate::debug!("closed connection of pid {}: {other:?}", c.peer_pid),
            }
        }
        self.dirty.remove(&t);
    }

    /// A round of session `sid` was committed (`router::sessions`):
    /// each surface hears it, those of [`SURFACES`] first, then the
    /// socket's watchers.
    pub fn session_committed(
        &mut self,
        sid: &str,
        delta: Option<crate::core::transcript::Delta>,
        change: Option<crate::core::sessions::Change>,
    ) {
        for s in SURFACES {
            (s.session)(self, sid, delta.as_ref());
        }
        // The uplink's channels hear the change kind, which the rows'
        // hook does not carry.
        crate::uplink::channels::on_session(self, sid, change);
        router::tmux::session_committed(self, sid);
        crate::socket::watches::on_committed(self, sid, delta, change);
    }

    /// Ended sessions the core forgot (`Sessions::evict_ended`): the
    /// relay channels and the socket's watchers hear `removed` with each
    /// one's last state, and its transcript subscriptions go.
    pub fn sessions_forgotten(&mut self, gone: &[crate::core::sessions::Session]) {
        for s in gone {
            crate::debug!("session {}: ended, no longer held in memory", s.id);
            let view = crate::socket::views::session(s, &self.node_name);
            crate::uplink::channels::on_removed(self, &view);
            crate::socket::watches::on_removed(self, &s.id, view);
        }
    }

    /// Queues `ops` for the ledger; `then` runs here after the commit, or at
    /// once with the error when the ledger refuses the batch.
    pub fn write(
        &mut self,
        ops: Vec<Op>,
        then: impl FnOnce(&mut Daemon, Result<Vec<Appended>, WriteError>) + 'static,
    ) {
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        match self.ledger.submit(Batch { ticket, ops }) {
            Ok(()) => {
                self.pending.insert(ticket, Box::new(then));
            }
            Err(e) => then(self, Err(e)),
        }
    }

    /// Hands committed events to whoever follows them: the plugins, the
    /// lanes, the surfaces of [`SURFACES`], then the socket's subscribers.
    fn publish(&mut self, events: &[Appended]) {
        router::plugins::with(self, |h, cx| h.offer_events(events, cx));
        router::lanes::on_events(self, events);
        for s in SURFACES {
            (s.events)(self, events);
        }
        crate::socket::watches::publish(self, events);
    }

    fn mark_ledger_corrupt(&mut self, reason: String) {
        if self.ledger.corrupt.is_none() {
            crate::error!("{}", corrupt_line(&self.paths.ledger, &reason));
            self.ledger.mark_corrupt(reason);
        }
    }

    /// Runs SQLite's quick check on the reader thread a moment after the
    /// daemon is ready, so that neither start-up nor the first requests wait
    /// for a scan of a large ledger; a failure turns the ledger read-only.
    fn start_integrity_check(&mut self) {
        self.reactor
            .schedule(Duration::from_millis(limits::LEDGER_CHECK_DELAY_MS), |d| {
                d.run_integrity_check()
            });
    }

    /// Hands the ledger's lanes to the lane controller once the reader has
    /// them, then tells the router, which reopens the sessions of the last
    /// run once the registry knows its seats too.
    fn read_lanes_at_start(&mut self) {
        let inbox = self.inbox.clone();
        let queued = self.ledger.read(Box::new(move |conn| {
            let rows = crate::lanes::controller::read_at_start(conn);
            inbox.run(move |d| {
                match rows {
                    Ok((lanes, repos)) => router::lanes::loaded(d, lanes, repos),
                    Err(e) => crate::error!(
                        "unable to read the lanes from the ledger: {}; lanes are unavailable",
                        e.to_string().to_lowercase()
                    ),
                }
                router::lanes_read(d);
            });
        }));
        if queued.is_err() {
            crate::error!(
                "unable to read the lanes from the ledger: the reader is busy; lanes are unavailable"
            );
            router::lanes_read(self);
        }
    }

    fn run_integrity_check(&mut self) {
        if self.ledger.corrupt.is_some() || self.stopping.is_some() {
            return;
        }
        let inbox = self.inbox.clone();
        let _ = self.ledger.read(Box::new(move |conn| {
            if let Err(problem) = ledger::quick_check(conn) {
                inbox.run(move |d| {
                    d.mark_ledger_corrupt(format!("integrity check failed: {problem}"))
                });
            }
        }));
    }
}

fn corrupt_line(path: &std::path::Path, reason: &str) -> String {
    format!(
        "ledger at {} cannot be trusted ({reason}); serving reads only and refusing writes with ledger-corrupt. \
         to recover: stop the daemon, move the file aside (keep it), and start again for a new ledger, \
         or salvage it with `sqlite3 {} .recover`",
        path.display(),
        path.display()
    )
}

fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name = raw.trim();
    if config::valid_node_name(name) {
        name.to_string()
    } else {
        "unknown".into()
    }
}
