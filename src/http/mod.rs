//! The HTTP API for apps (DESIGN.md, "Surfaces"; issue 6): JSON and SSE over
//! HTTP/1.1 with the mechanisms of seed 002, snake_case names, errors as
//! problem+json with a stable `code`. Off unless `[http] listen` is set or
//! `serve --http ADDR` is given; loopback by default.
//!
//! Pieces, each reusable by the routes phase 2 adds:
//! - [`listener`]: the listening socket, the poller, the handler pool, the
//!   connection bound (and why it is not tiny_http's server);
//! - [`wire`] and [`body`]: HTTP/1.1 framing, bounded while reading;
//! - [`auth`]: bearer token, allowed origins and CORS, Host check;
//! - [`peer`]: the process behind a local TCP peer, for caller classes;
//! - [`problem`], [`etag`], [`pages`], [`uuid7`]: the HTTP rules;
//! - [`sse`]: the streaming core and writers;
//! - [`snapshots`]: reads of committed state answered without the reactor;
//! - [`routes`]: the route table and the handlers.
//!
//! Threads: the listener's poller answers some requests itself, at once
//! ([`at_once`]; src/http/listener.rs, "Reads answered at once"); the
//! rest go to handler threads. Neither ever touches the daemon's state.
//! A handler that needs it runs a closure on the reactor with
//! [`Ctx::reactor`] (the reactor's bounded inbox plus its waker) and
//! blocks on a one-slot reply channel; the closure may answer at once or
//! from a ledger continuation, after the commit. [`Http`] is the
//! reactor's side: it owns the SSE topics and hears every committed event
//! through [`Http::publish`].
//!
//! Order of checks for every request, as seed 002 requires: framing, Host,
//! Origin (before routing or reading a body), route, preflight (no token),
//! bearer token, method, query parameters, `Accept` (406 on JSON-only
//! operations), `If-Match` (400 where not evaluated), `Expect`, caller
//! class for operator-only operations, then the handler, which decodes its
//! body. The body itself is read before any of these checks run on a
//! handler thread, but only for a request that passes the framing, Host,
//! Origin, route, method and bearer checks (src/http/listener.rs,
//! "Bodies"), so that no handler thread ever waits on a peer.

pub mod auth;
pub mod body;
pub mod etag;
pub mod inbox;
pub mod listener;
pub mod pages;
pub mod peer;
pub mod problem;
pub mod routes;
pub mod sessions;
pub mod snapshots;
pub mod sse;
pub mod uuid7;
pub mod wire;

use crossbeam_channel::{RecvTimeoutError, Sender, bounded};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::config::{HttpSection, Paths};
use crate::daemon::Daemon;
use crate::ledger::Appended;
use crate::limits;
use crate::procs::CallerClass;
use crate::reactor::Inbox;
use body::Framing;
use listener::Conn;
use problem::{Code, Problem};
use wire::{Head, HeadError, Response};

/// What handler threads share, read-only but for the counters.
pub struct Shared {
    pub inbox: Inbox,
    pub token: auth::Token,
    pub origins: Vec<String>,
    pub hosts: auth::Hosts,
    pub instance_id: String,
    pub max_connections: usize,
    /// Open connections (slots taken).
    pub conns: AtomicUsize,
    /// SSE streams being written.
    pub streams: AtomicUsize,
    /// Bytes set aside for large bodies (`HTTP_LARGE_BODIES_HELD`).
    pub bodies_held: AtomicUsize,
    /// Requests read and not yet answered; a stop waits for them.
    pub in_flight: AtomicUsize,
    pub stopping: AtomicBool,
    next_stream: AtomicUsize,
    /// Serialised answers handlers serve without the reactor.
    pub snapshots: snapshots::Snapshots,
}

/// The reactor's side of the HTTP API.
pub struct Http {
    pub shared: Arc<Shared>,
    pub addr: SocketAddr,
    listener: listener::Listener,
    /// `GET /events` watches: one topic per watched ledger stream.
    pub event_topics: HashMap<String, sse::Topic>,
    /// Creations, inputs and session watches (see [`sessions`]).
    pub sessions: sessions::Api,
}

impl Http {
    /// Starts the listener when the config asks for one.
    pub fn start(
        cfg: &HttpSection,
        paths: &Paths,
        inbox: crate::reactor::Inbox,
        instance_id: &str,
    ) -> Result<Option<Http>, String> {
        if cfg.listen.is_empty() {
            return Ok(None);
        }
        let addr: SocketAddr = cfg
            .listen
            .parse()
            .map_err(|_| format!("http.listen {:?} is not IP:PORT", cfg.listen))?;
        let token_path = if cfg.token_file.is_empty() {
            paths.state_dir.join("http.token")
        } else {
            cfg.token_file.clone().into()
        };
        let token = auth::Token::load_or_create(&token_path)?;
        let (api, fixes) = sessions::Api::load(&paths.ledger)?;
        if !fixes.is_empty() {
            inbox.run(move |d| {
                d.write(fixes, |_, r| {
                    if let Err(e) = r {
                        crate::error!("unable to record the inputs the last run left: {e:?}");
                    }
                })
            });
        }
        // Bound first: with port 0 the Host check needs the port chosen.
        let (tcp, addr) = listener::bind(addr)?;
        let shared = Arc::new(Shared {
            inbox,
            token,
            origins: cfg.allowed_origins.clone(),
            hosts: auth::Hosts::new(addr, &cfg.public_names),
            instance_id: instance_id.to_string(),
            max_connections: cfg.max_connections,
            conns: AtomicUsize::new(0),
            streams: AtomicUsize::new(0),
            bodies_held: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            next_stream: AtomicUsize::new(0),
            snapshots: snapshots::Snapshots::default(),
        });
        let listener = listener::start(tcp, shared.clone(), cfg.threads, serve, at_once)?;
        crate::info!("serving HTTP on {addr} (token in {})", token_path.display());
        Ok(Some(Http {
            shared,
            addr,
            listener,
            event_topics: HashMap::new(),
            sessions: api,
        }))
    }

    /// Hears every committed event: watched streams get it in their topic.
    pub fn publish(&mut self, events: &[Appended]) {
        if self.event_topics.is_empty() {
            return;
        }
        for ev in events {
            if let Some(topic) = self.event_topics.get_mut(&ev.stream) {
                topic.publish(ev.seq.max(0) as u64, &routes::event_sse_json(ev));
            }
        }
    }

    /// Stops accepting, ends every stream with `failure`, and marks the API
    /// draining. Requests being served finish; [`Http::busy`] says when.
    pub fn stop(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.listener.stop();
        for t in self.event_topics.values_mut() {
            t.close();
        }
        sessions::close_all(&mut self.sessions);
    }

    /// Whether requests are still being answered, or streams still writing
    /// their final `failure` batch.
    pub fn busy(&self) -> bool {
        self.shared.in_flight.load(Ordering::Acquire) > 0
            || self.shared.streams.load(Ordering::Acquire) > 0
    }
}

/// What the daemon tells HTTP (its row of `daemon::SURFACES`).
pub const HOOKS: crate::daemon::Hooks = crate::daemon::Hooks {
    events: publish,
    session: sessions::on_committed,
    stop: |d| {
        if let Some(h) = &mut d.http {
            h.stop();
        }
    },
    busy: |d| d.http.as_ref().is_some_and(Http::busy),
};

/// Hears every committed event (from `Daemon::publish`): `/events`
/// watches, then the sessions' inputs and watches.
fn publish(d: &mut Daemon, events: &[Appended]) {
    let Some(h) = d.http.as_mut() else { return };
    h.publish(events);
    sessions::on_events(d, events);
}

/// A reply channel for a closure run on the reactor. A clone can answer
/// in place of a continuation that never ran (a refused ledger read).
/// [`crate::daemon::ReplyTo::Http`] carries one to the socket's methods.
#[derive(Debug)]
pub struct Answer<T>(Sender<T>);

impl<T> Clone for Answer<T> {
    fn clone(&self) -> Self {
        Answer(self.0.clone())
    }
}

impl<T> Answer<T> {
    pub fn send(self, v: T) {
        // The handler may have given up waiting; nothing to do then.
        let _ = self.0.try_send(v);
    }
}

/// A representation's bytes and ETag, answered as [`Reply::Json`] with
/// `etag` would be.
pub struct Serialised {
    pub body: Arc<[u8]>,
    pub etag: String,
    pub headers: Vec<(&'static str, String)>,
}

/// What a handler answers.
pub enum Reply {
    /// A JSON representation. `etag`: validate it (GET representations).
    Json {
        status: u16,
        body: Value,
        etag: bool,
        headers: Vec<(&'static str, String)>,
    },
    /// A representation serialised once and shared ([`snapshots`]).
    Shared(Serialised),
    /// An SSE stream: the closure writes the events after the head; it runs
    /// on its own writer thread.
    Stream(Box<dyn FnOnce(&mut TcpStream) -> sse::End + Send>),
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Reply {
        Reply::Json {
            status,
            body,
            etag: false,
            headers: Vec::new(),
        }
    }

    /// A representation that carries an ETag and honours If-None-Match.
    pub fn representation(body: Value) -> Reply {
        Reply::Json {
            status: 200,
            body,
            etag: true,
            headers: Vec::new(),
        }
    }
}

/// One request as a handler sees it.
pub struct Ctx<'a> {
    pub shared: &'a Arc<Shared>,
    pub head: &'a Head,
    /// Path parameters by the names in the route template.
    pub params: Vec<(&'static str, String)>,
    /// Decoded query parameters, already checked against the route's list.
    pub query: Vec<(String, String)>,
    pub route: &'static str,
    conn: &'a mut Conn,
    framing: Framing,
    /// The body, read before the handler runs (src/http/listener.rs,
    /// "Bodies"); `None` when there is none to read.
    body: Option<Result<Vec<u8>, body::BodyError>>,
}

impl Ctx<'_> {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn path_param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Decodes the JSON body (at most `HTTP_BODY_MAX` bytes).
    pub fn json<T: DeserializeOwned>(&mut self) -> Result<T, Problem> {
        self.json_within(limits::HTTP_BODY_MAX)
    }

    /// Decodes a JSON body of at most `limit` bytes (the listener read it,
    /// bounded by the same limit: `listener::LARGE_BODIES`).
    pub fn json_within<T: DeserializeOwned>(&mut self, limit: usize) -> Result<T, Problem> {
        if self.framing == Framing::None {
            return Err(Problem::invalid("this request needs a JSON body"));
        }
        body::require_json(self.head)?;
        match &self.body {
            Some(Ok(bytes)) if bytes.len() <= limit => body::decode(bytes),
            Some(Ok(_)) => Err(body::BodyError::TooLarge(limit).problem()),
            Some(Err(e)) => Err(e.problem()),
            None => Err(Problem::invalid("this request needs a JSON body")),
        }
    }

    /// Runs `f` on the reactor thread and waits for what it sends.
    pub fn reactor<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Daemon, Answer<T>) + Send + 'static,
    ) -> Result<T, Problem> {
        reactor_call(self.shared, f)
    }

    /// The caller class of the peer process (see [`peer`]), classified
    /// once per connection: the scan reads every process's fd table
    /// (milliseconds), which per request made it the dominant cost of a
    /// keep-alive client's reads. Keeping it for the connection is as
    /// strict: the processes holding the peer's socket can change only by
    /// fork or fd passing from a holder, so a process comes to hold an
    /// operator's connection only when that operator process gives it (it
    /// could as well relay requests), and a holder added to an agent's
    /// connection does not widen what the agent's class may do. Scoping
    /// (`may_read`) and operator-only checks still run per request.
    pub fn caller(&self) -> Result<CallerClass, Problem> {
        if let Some(c) = self.conn.class.get() {
            return Ok(c.clone());
        }
        let class = self.classify()?;
        let _ = self.conn.class.set(class.clone());
        Ok(class)
    }

    fn classify(&self) -> Result<CallerClass, Problem> {
        let holders = peer::peer_processes(self.conn.peer, self.conn.local);
        if holders.is_empty() {
            return Ok(CallerClass::Unverified);
        }
        self.reactor(move |d, answer| {
            let daemon_pid = std::process::id() as i32;
            let mut class = CallerClass::Operator;
            for h in &holders {
                let alive = || crate::procs::pidfd_alive(&h.pidfd);
                let c = crate::procs::classify(h.pid, daemon_pid, &d.roots, alive);
                let c = crate::procs::in_own_namespace(c, h.pid, alive);
                if !c.is_operator() {
                    class = c;
                    break;
                }
            }
            answer.send(class);
        })
    }
}

use std::io::Write as _;

/// Runs `f` on the reactor and waits (bounded) for its answer.
pub fn reactor_call<T: Send + 'static>(
    shared: &Shared,
    f: impl FnOnce(&mut Daemon, Answer<T>) + Send + 'static,
) -> Result<T, Problem> {
    reactor_send(shared, false, f)
}

/// [`reactor_call`], or when `read`, for a closure that changes nothing
/// another reader could observe, or counts its change first
/// ([`crate::reactor::Msg::Read`]).
pub fn reactor_send<T: Send + 'static>(
    shared: &Shared,
    read: bool,
    f: impl FnOnce(&mut Daemon, Answer<T>) + Send + 'static,
) -> Result<T, Problem> {
    let (tx, rx) = bounded(1);
    let task = move |d: &mut Daemon| f(d, Answer(tx));
    let sent = if read {
        shared.inbox.read(task)
    } else {
        shared.inbox.run(task)
    };
    if !sent {
        return Err(Problem::new(Code::ShuttingDown, "the daemon is stopping"));
    }
    match rx.recv_timeout(Duration::from_millis(limits::HTTP_REACTOR_WAIT_MS)) {
        Ok(v) => Ok(v),
        Err(RecvTimeoutError::Timeout) => {
            Err(Problem::new(Code::Unavailable, "the daemon did not answer in time").retry(1))
        }
        Err(RecvTimeoutError::Disconnected) => {
            Err(Problem::new(Code::ShuttingDown, "the daemon is stopping"))
        }
    }
}

/// Counts a request in flight, until its answer is written; a stop waits
/// until none is. It travels with an answer the poller made at once
/// (src/http/listener.rs, "Reads answered at once") to whichever thread
/// writes its last byte.
pub struct InFlight(Arc<Shared>);

impl InFlight {
    fn new(s: &Arc<Shared>) -> InFlight {
        s.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(s.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1
            && self.0.stopping.load(Ordering::Acquire)
        {
            // The reactor waits for the last answer before it exits: wake
            // it. Never blocking, since the poller may be the one dropping
            // this: when the inbox is full the reactor has work queued and
            // checks again after it.
            self.0.inbox.try_run(|_| {});
        }
    }
}

/// Serves requests on a connection with bytes to read; gives it back to
/// the poller when it should stay open.
fn serve(shared: &Arc<Shared>, mut conn: Conn) -> Option<Conn> {
    for _ in 0..limits::HTTP_REQUESTS_PER_TURN {
        let _held;
        let (head, body) = match conn.staged.take() {
            // `_held` keeps the body's share until it has been served.
            Some(listener::Staged::Ready { head, body, held }) => {
                _held = held;
                (head, Some(body))
            }
            // Not dispatched while its body is read; back to the poller.
            Some(reading @ listener::Staged::Reading { .. }) => {
                conn.staged = Some(reading);
                return Some(conn);
            }
            // The end of an answer made at once that the socket could
            // not take then.
            Some(listener::Staged::Unsent {
                bytes,
                keep,
                in_flight,
            }) => {
                let written = conn.stream().write_all(&bytes);
                drop(in_flight);
                if written.is_err() || !keep {
                    return None;
                }
                if !conn.r.head_ready() {
                    return Some(conn);
                }
                continue;
            }
            Some(listener::Staged::Head(head)) => match listener::stage(shared, &mut conn, head) {
                listener::Stage::Serve(head, body) => (head, body),
                listener::Stage::Wait => return Some(conn),
            },
            None => {
                let head = match conn.r.read_head_timed() {
                    Ok(h) => h,
                    Err(HeadError::Closed) | Err(HeadError::Io(_)) => return None,
                    Err(HeadError::Bad(p)) => {
                        let _ = conn.stream().write_all(&bad_head(&p));
                        return None;
                    }
                };
                match listener::stage(shared, &mut conn, head) {
                    listener::Stage::Serve(head, body) => (head, body),
                    // The rest of the body is read by the poller.
                    listener::Stage::Wait => return Some(conn),
                }
            }
        };
        let guard = InFlight::new(shared);
        let (keep, stream) = handle(shared, &mut conn, &head, body);
        drop(guard);
        if let Some((headers, task)) = stream {
            start_stream(shared, conn, headers, task);
            return None;
        }
        if !keep {
            return None;
        }
        // A next head not yet whole is waited for by the poller, never here.
        if !conn.r.head_ready() {
            return Some(conn);
        }
    }
    Some(conn)
}

/// Answers, on the poller, a connection's request whose head is buffered,
/// when that needs no waiting (src/http/listener.rs, "Reads answered at
/// once"): the same checks and the same answer a handler would give, as
/// bytes the poller writes without blocking. Anything that may wait (a
/// body to read, a caller not yet classified, an operation without an
/// at-once form, or one that declines) goes to a handler with its head.
fn at_once(shared: &Arc<Shared>, conn: &mut Conn) -> listener::AtOnce {
    let head = match conn.r.read_head() {
        Ok(h) => h,
        Err(HeadError::Bad(p)) => {
            return listener::AtOnce::Answered {
                bytes: bad_head(&p),
                keep: false,
                in_flight: InFlight::new(shared),
            };
        }
        Err(HeadError::Closed) | Err(HeadError::Io(_)) => return listener::AtOnce::Close,
    };
    if conn.class.get().is_none() || !matches!(Framing::of(&head), Ok(Framing::None)) {
        return listener::AtOnce::Handler(head);
    }
    let in_flight = InFlight::new(shared);
    let mut origin = None;
    let outcome = match checked(shared, conn, &head, None, &mut origin) {
        Ok(Checked::Preflight(r)) => Outcome::Done(r),
        Ok(Checked::Run(_, mut ctx)) => {
            let answer = routes::at_once(ctx.route, &head.method).and_then(|f| f(&mut ctx));
            match answer {
                Some(a) => Outcome::Replied(a.map(Reply::Shared)),
                None => return listener::AtOnce::Handler(head),
            }
        }
        Err(p) => Outcome::Replied(Err(p)),
    };
    match response_of(shared, &head, true, outcome, origin) {
        Ok((response, keep)) => listener::AtOnce::Answered {
            bytes: wire::response_bytes(&response, false, !keep),
            keep,
            in_flight,
        },
        // Only Reply::Stream starts one, and no at-once form answers it.
        Err(_) => listener::AtOnce::Close,
    }
}

/// The answer to bytes that cannot be a request head (400), after which
/// the connection is closed.
fn bad_head(p: &Problem) -> Vec<u8> {
    wire::response_bytes(&with_common(Response::problem(p), None), false, true)
}

type StreamTask = Box<dyn FnOnce(&mut TcpStream) -> sse::End + Send>;

/// Headers every answer carries.
fn with_common(mut r: Response, origin: Option<&str>) -> Response {
    r.headers.push(("Cache-Control", "no-store".into()));
    r.headers.push(("Vary", "Origin".into()));
    if let Some(o) = origin {
        r.headers.extend(auth::cors_headers(o));
    }
    r
}

/// A stream to start: its response headers and its writer.
type StreamStart = (Vec<(&'static str, String)>, StreamTask);

/// Handles one request on a handler thread; returns whether the
/// connection stays open, or the stream to start.
fn handle(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    head: &Head,
    body: Option<Result<Vec<u8>, body::BodyError>>,
) -> (bool, Option<StreamStart>) {
    // The connection can carry a next request only if this one's body was
    // read whole (or it had none).
    let consumed = match &body {
        Some(b) => b.is_ok(),
        None => body::Framing::of(head).is_ok_and(|f| f == Framing::None),
    };
    let mut origin = None;
    let outcome = match checked(shared, conn, head, body, &mut origin) {
        Ok(Checked::Preflight(r)) => Outcome::Done(r),
        Ok(Checked::Run(op, mut ctx)) => Outcome::Replied((op.handler)(&mut ctx)),
        Err(p) => Outcome::Replied(Err(p)),
    };
    match response_of(shared, head, consumed, outcome, origin) {
        Ok((response, keep)) => {
            let written = wire::write_response(&mut conn.stream(), &response, false, !keep);
            (keep && written.is_ok(), None)
        }
        Err(stream) => (false, Some(stream)),
    }
}

/// A request that passed the checks before its operation.
enum Checked<'a> {
    /// A preflight, answered without the token.
    Preflight(Response),
    /// The operation to run, with its context.
    Run(&'static routes::Op, Ctx<'a>),
}

/// The checks of every request, in the order seed 002 requires (see the
/// top of this file); `origin` is set once the Origin is allowed, for the
/// CORS headers of whatever the answer is.
fn checked<'a>(
    shared: &'a Arc<Shared>,
    conn: &'a mut Conn,
    head: &'a Head,
    body: Option<Result<Vec<u8>, body::BodyError>>,
    origin: &mut Option<&'a str>,
) -> Result<Checked<'a>, Problem> {
    let framing = body::Framing::of(head)?;
    shared.hosts.check(head)?;
    *origin = auth::check_origin(head, &shared.origins)?;
    let (route, params) = routes::find(&head.path)?;
    if head.method == "OPTIONS" {
        return Ok(Checked::Preflight(preflight(route, head, *origin)));
    }
    if !shared.token.verify(head.header("authorization")) {
        return Err(Problem::new(
            Code::Unauthorized,
            "missing or wrong bearer token",
        ));
    }
    conn.proven = true;
    let op = route
        .ops
        .iter()
        .find(|o| o.method == head.method)
        .ok_or_else(|| {
            let mut p = Problem::new(
                Code::MethodNotAllowed,
                format!("{} does not support {}", route.path, head.method),
            );
            p.allow = Some(route.allow());
            p
        })?;
    let query = wire::parse_query(&head.query)?;
    if let Some((k, _)) = query.iter().find(|(k, _)| !op.query.contains(&k.as_str())) {
        return Err(Problem::invalid(format!("unknown query parameter {k}")));
    }
    if !routes::NEGOTIATES.contains(&(route.path, head.method.as_str())) {
        routes::negotiate(head.header("accept"), &["application/json"])?;
    }
    if head.header("if-match").is_some()
        && head.method != "GET"
        && !routes::IF_MATCH.contains(&(route.path, head.method.as_str()))
    {
        return Err(Problem::invalid(format!(
            "{} {} does not evaluate If-Match; send it without",
            head.method, route.path
        )));
    }
    if let Some(e) = head.header("expect") {
        if !e.eq_ignore_ascii_case("100-continue") {
            return Err(Problem::new(
                Code::ExpectationFailed,
                "the only expectation accepted is 100-continue",
            ));
        }
    }
    let ctx = Ctx {
        shared,
        head,
        params,
        query,
        route: route.path,
        conn,
        framing,
        body,
    };
    if op.operator_only {
        let class = ctx.caller()?;
        if !class.is_operator() {
            crate::warn!(
                "refused HTTP {} {} to a caller of class {}",
                head.method,
                route.path,
                class.name()
            );
            return Err(Problem::new(
                Code::OperatorOnly,
                format!(
                    "only the operator may do this; the caller is {}",
                    class.name()
                ),
            ));
        }
    }
    Ok(Checked::Run(op, ctx))
}

enum Outcome {
    /// Answered before the handler (a preflight).
    Done(Response),
    /// The handler's reply.
    Replied(Result<Reply, Problem>),
}

/// The response to a request and whether its connection stays open
/// (`consumed`: its body, if any, was read whole), or the stream to start.
fn response_of(
    shared: &Shared,
    head: &Head,
    consumed: bool,
    outcome: Outcome,
    origin: Option<&str>,
) -> Result<(Response, bool), StreamStart> {
    let stopping = shared.stopping.load(Ordering::Acquire);
    let response = match outcome {
        Outcome::Done(r) => r,
        Outcome::Replied(Ok(Reply::Stream(task))) => {
            let mut headers = vec![
                ("Content-Type", "text/event-stream".to_string()),
                ("Cache-Control", "no-store".into()),
                ("Vary", "Origin, Accept".into()),
                ("X-Accel-Buffering", "no".into()),
            ];
            if let Some(o) = origin {
                headers.extend(auth::cors_headers(o));
            }
            return Err((headers, task));
        }
        Outcome::Replied(Ok(Reply::Json {
            status,
            body,
            etag,
            headers,
        })) => json_response(head, status, &body, etag, headers),
        Outcome::Replied(Ok(Reply::Shared(Serialised {
            body,
            etag,
            headers,
        }))) => bytes_response(head, 200, body.to_vec(), Some(etag), headers),
        Outcome::Replied(Err(p)) => Response::problem(&p),
    };
    let keep = consumed && head.keep_alive() && !stopping;
    Ok((with_common(response, origin), keep))
}

fn json_response(
    head: &Head,
    status: u16,
    body: &Value,
    etag: bool,
    headers: Vec<(&'static str, String)>,
) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let tag = etag.then(|| etag::of(&bytes));
    bytes_response(head, status, bytes, tag, headers)
}

/// A JSON answer of serialised `bytes`, with the ETag `tag` of exactly
/// those bytes when it is a representation.
fn bytes_response(
    head: &Head,
    status: u16,
    bytes: Vec<u8>,
    tag: Option<String>,
    headers: Vec<(&'static str, String)>,
) -> Response {
    let mut r = Response::json(status, Vec::new());
    r.headers.extend(headers);
    if let Some(tag) = tag {
        // Conditional reads. A change's preconditions are its handler's
        // (creation's If-None-Match: *, a conditional DELETE's If-Match).
        if head.method == "GET" {
            if let Some(m) = head.header("if-match") {
                if let Err(p) = etag::require_match(Some(m), &tag) {
                    return Response::problem(&p);
                }
            }
            if etag::none_match_hits(head.header("if-none-match"), &tag) {
                return Response::new(304).header("ETag", tag);
            }
        }
        r.headers.push(("ETag", tag));
    }
    r.with_body(bytes)
}

/// Answers OPTIONS: a CORS preflight from an allowed origin, or the
/// methods of the path. Neither needs the token nor reads anything.
fn preflight(route: &routes::Route, head: &Head, origin: Option<&str>) -> Response {
    let allow = route.allow();
    let mut r = Response::new(204).header("Allow", allow.clone());
    if origin.is_some() && head.header("access-control-request-method").is_some() {
        r = r
            .header("Access-Control-Allow-Methods", allow)
            .header(
                "Access-Control-Allow-Headers",
                auth::ALLOWED_REQUEST_HEADERS,
            )
            .header("Access-Control-Max-Age", "600");
    }
    r
}

/// Moves a connection to its own SSE writer thread.
fn start_stream(
    shared: &Arc<Shared>,
    conn: Conn,
    headers: Vec<(&'static str, String)>,
    task: StreamTask,
) {
    let taken = shared.streams.fetch_add(1, Ordering::AcqRel);
    let release = StreamSlot(shared.clone());
    if taken >= limits::HTTP_MAX_STREAMS {
        let p = Problem::new(
            Code::TooManyStreams,
            "the daemon already serves the maximum number of streams",
        )
        .retry(1);
        let _ = wire::write_response(
            &mut conn.stream(),
            &with_common(Response::problem(&p), None),
            false,
            true,
        );
        return;
    }
    let n = shared.next_stream.fetch_add(1, Ordering::Relaxed);
    let spawned = std::thread::Builder::new()
        .name(format!("http-sse-{n}"))
        .stack_size(limits::HTTP_SSE_STACK)
        .spawn(move || {
            let _release = release;
            let mut stream = match conn.stream().try_clone() {
                Ok(s) => s,
                Err(_) => return,
            };
            let mut head = Vec::new();
            wire::write_status_and_headers(&mut head, 200, &headers);
            head.extend_from_slice(b"Connection: close\r\n\r\n");
            if stream.write_all(&head).is_err() {
                return;
            }
            task(&mut stream);
            drop(conn);
        });
    if let Err(e) = spawned {
        crate::warn!("unable to start an SSE writer thread: {e}");
    }
}

struct StreamSlot(Arc<Shared>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if self.0.streams.fetch_sub(1, Ordering::AcqRel) == 1
            && self.0.stopping.load(Ordering::Acquire)
        {
            // The reactor waits for the last stream before it exits.
            self.0.inbox.run(|_| {});
        }
    }
}
