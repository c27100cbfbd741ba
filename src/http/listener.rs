//! Sockets and threads of the HTTP API (issue 6, "Listener").
//!
//! Why not tiny_http's own server: tiny_http 0.12 accepts in its own thread
//! and hands every connection to a new thread with no cap and no hook in
//! between (`Server::from_listener` takes the listener, not the accepted
//! sockets; `ClientConnection` and `new_request` are private). It also reads
//! header lines without a bound, queues pipelined requests without a bound,
//! and when a request is dropped with an unread fixed-length body it
//! allocates a buffer of the declared Content-Length to drain it, so a 413
//! for a body claiming a terabyte would try to allocate a terabyte. None of
//! that can be bounded from outside, so the daemon accepts and frames
//! HTTP/1.1 itself ([`super::wire`], [`super::body`]) and the dependency was
//! removed. DESIGN.md's tiny_http line should change accordingly.
//!
//! The shape:
//! - one `http-poll` thread owns the listening socket (bound by us) and every
//!   connection that has no whole request head yet, in a mio poll. It
//!   accepts, sets TCP_NODELAY and bounded read and write waits on each
//!   socket, and reads request heads itself, without blocking: a
//!   connection goes to the handler pool only once its buffer holds a
//!   whole head (or more than `HTTP_HEAD_MAX` bytes, or the peer closed
//!   mid-head, both of which the handler answers 400). A head must be
//!   whole `HTTP_HEAD_DEADLINE_MS` after its first byte, or the
//!   connection is closed (issue 10, item 23: before, a connection that
//!   had sent one byte held a handler thread until its head completed or
//!   timed out, so a few dozen connections trickling bytes, no token
//!   needed, starved every authorised request);
//! - `http.threads` handler threads `http-N` take connections from a bounded
//!   queue, serve requests while whole heads are buffered (at most
//!   `HTTP_REQUESTS_PER_TURN` in a row), and give the connection back to the
//!   poller through a bounded queue and its waker. An idle connection thus
//!   costs no thread, and no thread ever waits for a head or a body (see
//!   "Bodies" below);
//! - an SSE watch moves its connection to its own writer thread
//!   `http-sse-N` ([`super::sse`]), at most `HTTP_MAX_STREAMS` of them.
//!
//! Busy connections (issue 11: `GET /sessions/{id}` with 8 keep-alive
//! clients reached 0.52 of a bare tiny_http handler, each request paying
//! handler → poller → handler). After answering, a handler keeps the
//! connection and waits for its next request, within one turn of at most
//! `HTTP_REQUESTS_PER_TURN` such keeps: up to `HTTP_BUSY_LINGER_MS` each
//! time while no other connection can want the thread (another handler is
//! free and none is queued), and, while one may (every handler busy, or
//! one queued), only up to `HTTP_BUSY_LINGER_MS` of waiting in the whole
//! turn. A client that keeps sending thus stays on one thread without the
//! poller's hop, also when there are more busy clients than handlers (the
//! earlier rule kept one only while another handler was free, which 8
//! clients on 4 handlers never saw); the connection goes back to the
//! poller when it is quiet, when its turn ends, or when its waits while
//! others were queued reach the bound. So a slow client that sends just
//! often enough holds a thread at most `HTTP_BUSY_LINGER_MS` of idle
//! waiting per turn while others wait, and a queued connection waits at
//! most that plus the requests of the turns under way.
//!
//! Reads answered at once (issue 11: with busy connections kept by
//! handlers, 8 clients on a core of their own still got 0.53-0.88 of a
//! bare tiny_http handler: every request woke a handler from its wait on
//! its one connection, a context switch and a timer per request, while
//! four other connections waited for a handler). The poller parses each
//! whole head it reads. On a connection whose caller class is known (an
//! earlier request on it needed it, as every session read does), it then
//! itself answers a bodiless request whose answer needs no waiting, the
//! way an event loop serves a static file: a refusal the checks make
//! before the operation, or an operation with an at-once form
//! (`routes::AT_ONCE`: a read a current snapshot answers). It runs the
//! same checks and builds the same bytes a handler would
//! (`super::at_once`), writes them without blocking, and goes on with
//! the connection's next buffered request, at most
//! `HTTP_REQUESTS_PER_TURN` in a row. A request that needs more (a body,
//! the reactor, a stream) goes to a handler with its parsed head
//! ([`Staged::Head`]); an answer the socket does not take whole goes to a
//! handler to finish ([`Staged::Unsent`]), so the poller never waits on a
//! peer. A connection a handler gives back with a whole head buffered is
//! read the same way. Keep-alive reads then cost one poll wake-up for all
//! the connections that have a request, and, past each connection's
//! first request and the handler's turn that follows it, no handler
//! thread.
//!
//! Every open connection, idle, being served or streaming, holds one slot of
//! `http.max_connections` until its socket is closed.
//!
//! Bodies. An outside review found that four token holders sending one
//! byte of a 60,000-byte body held the four handler threads (a body was
//! read on the handler, each read waiting up to 10 s, with no overall
//! bound), and every other request waited. So a handler never reads a
//! body from the peer: after reading a head it takes what body is already
//! buffered ([`stage`], [`super::body::Decoder`], which resumes where it
//! stopped); if the body is whole it serves the request at once, else it
//! gives the connection back to the poller with the parsed head and the
//! decoder, and the poller reads the rest without blocking and hands the
//! request to a handler when the body is whole, failed or ended early. A
//! body must be whole `HTTP_BODY_DEADLINE_MS` after its head; past it the
//! poller answers 408 `request_timeout` and closes. A body is read only
//! for a request that proved the token (and passes Host, Origin, route
//! and method), so no one without the token makes the daemon buffer one;
//! the rest are answered without their body and closed, as before.
//!
//! Why a body is first taken on the handler rather than by the poller
//! before it hands the request over: a request whose body arrived with
//! its head (small bodies mostly do) goes from the poller to a handler
//! once, its head parsed once (by the poller, which hands it over in
//! [`Staged::Head`]) and its body taken from the buffer; only a request
//! whose body has not all arrived pays one more hop back to the poller.
//!
//! Memory: the poller keeps only the decoded body (the decoder consumes
//! chunk framing as it reads), so a connection holds at most its body's
//! limit, plus one read (8 KiB) and one chunk line (`HTTP_CHUNK_LINE_MAX`)
//! of raw bytes, plus the head's buffer (`HTTP_HEAD_MAX` and a read). The
//! limit is `HTTP_BODY_MAX` (64 KiB), or `HTTP_INPUT_BODY_MAX` (6 MiB)
//! for an input's PUT. Per-connection caps alone would let
//! `http.max_connections` token holders stalled short of 6 MiB inputs
//! hold 1.5 GiB, so a body over `HTTP_BODY_MAX` whose rest must be
//! waited for first takes a share of `HTTP_LARGE_BODIES_HELD` (its
//! declared length, or its limit when chunked), kept until a handler is
//! done with it; past the budget it is answered 503 `unavailable` with
//! Retry-After. Worst case at the defaults: 64 MiB of large bodies, plus
//! 256 connections x (64 KiB body + 24 KiB head + 9 KiB raw), about
//! 24 MiB; a token holder can at worst make other large inputs wait, for
//! at most `HTTP_BODY_DEADLINE_MS`.
//!
//! Slots and peers (issue 10, item 32). A connection is *unproven* until
//! one of its requests passes the bearer check. Unproven connections the
//! poller holds (waiting for a head) are the ones a flood consists of, so:
//! - one peer address holds at most `HTTP_UNPROVEN_PER_PEER` of them; its
//!   next connection closes its oldest one;
//! - when every slot is taken, a new connection closes the oldest unproven
//!   connection of the peer holding the most of them, and is refused 503
//!   `too_many_connections` only when no unproven connection waits.
//!
//! Loopback callers all share 127.0.0.1 and so one share: among them the
//! oldest silent connection goes first. A real client sends its head as
//! soon as it connects, and once the head is whole its connection is being
//! served and no longer a candidate; after its first authorised request it
//! never is. Proven (token-holding) connections and streams are never
//! closed to make room: past them the bound refuses as before.

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::body::{BodyError, Decoder, Framing};
use super::problem::{Code, Problem};
use super::wire::{self, Head, Reader, Response};
use super::{InFlight, Shared};
use crate::limits;

/// One open connection and the slot it holds.
pub struct Conn {
    pub r: Reader<TcpStream>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    /// The caller class of the peer process, classified at the
    /// connection's first request that asks for it (`Ctx::caller`).
    pub class: std::cell::OnceCell<crate::procs::CallerClass>,
    /// Whether a request on it passed the bearer check (see "Slots and
    /// peers" above).
    pub proven: bool,
    /// A request whose head was read and whose body is being read, or
    /// has been (see "Bodies" above).
    pub staged: Option<Staged>,
    /// Accept order, for "oldest first".
    serial: u64,
    _slot: Slot,
}

impl Conn {
    pub fn stream(&self) -> &TcpStream {
        &self.r.inner
    }
}

/// A request whose head has been read, and its body.
pub enum Staged {
    /// The body is being read on the poller; past `deadline` the answer
    /// is 408.
    Reading {
        head: Head,
        body: Decoder,
        deadline: Instant,
        held: Option<Held>,
    },
    /// The body is whole (or failed): a handler serves the request.
    Ready {
        head: Head,
        body: Result<Vec<u8>, BodyError>,
        held: Option<Held>,
    },
    /// A head the poller read and could not answer at once: a handler
    /// serves it (see "Reads answered at once" above).
    Head(Head),
    /// The rest of an answer made at once that the socket did not take
    /// without blocking: a handler writes it, then closes the connection
    /// unless `keep`.
    Unsent {
        bytes: Vec<u8>,
        keep: bool,
        in_flight: InFlight,
    },
}

/// What the poller's attempt to answer a buffered request at once came to.
pub enum AtOnce {
    /// Answered: the response's bytes, whether the connection stays open
    /// after them, and the request's count in flight, held until the
    /// last byte is written.
    Answered {
        bytes: Vec<u8>,
        keep: bool,
        in_flight: InFlight,
    },
    /// It needs a handler thread; here is its head.
    Handler(Head),
    /// Nothing to answer: close.
    Close,
}

/// A large body's share of `HTTP_LARGE_BODIES_HELD`, given back when
/// dropped (the request served, or its connection closed).
pub struct Held(Arc<Shared>, usize);

impl Held {
    fn take(shared: &Arc<Shared>, n: usize) -> Option<Held> {
        let before = shared.bodies_held.fetch_add(n, Ordering::AcqRel);
        if before + n > limits::HTTP_LARGE_BODIES_HELD {
            shared.bodies_held.fetch_sub(n, Ordering::AcqRel);
            return None;
        }
        Some(Held(shared.clone(), n))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.bodies_held.fetch_sub(self.1, Ordering::AcqRel);
    }
}

/// Requests whose body may pass `HTTP_BODY_MAX`, with their limit; their
/// handler decodes with the same (`Ctx::json_within`).
const LARGE_BODIES: &[(&str, &str, usize)] = &[(
    "/sessions/{session_id}/inputs/{input_id}",
    "PUT",
    limits::HTTP_INPUT_BODY_MAX,
)];

/// What [`stage`] came to.
pub enum Stage {
    /// Serve the request now. `None`: no body was read, because it has
    /// none or the request is refused before its body (the handler
    /// closes the connection after answering when there was one).
    Serve(Head, Option<Result<Vec<u8>, BodyError>>),
    /// The body is not all here yet: `conn.staged` holds the request;
    /// give the connection to the poller.
    Wait,
}

/// Reads a request's body from what `conn` has buffered, on a handler
/// thread, never waiting on the peer. A body is read only for a request
/// that will get as far as its handler's body: framed without ambiguity,
/// a known Host and Origin, a route and method that exist, the bearer
/// token, and no `Expect` other than `100-continue` (seed 002 orders
/// those checks before the body). Anything else the handler refuses
/// without the body, as before.
pub fn stage(shared: &Arc<Shared>, conn: &mut Conn, head: Head) -> Stage {
    let Ok(framing @ (Framing::Length(_) | Framing::Chunked)) = Framing::of(&head) else {
        return Stage::Serve(head, None);
    };
    let Some(limit) = body_limit(shared, &head) else {
        return Stage::Serve(head, None);
    };
    // It passed the bearer check: its connection is no longer one to
    // close to make room while the body arrives.
    conn.proven = true;
    let mut body = match Decoder::new(framing, limit) {
        Ok(d) => d,
        Err(e) => return Stage::Serve(head, Some(Err(e))),
    };
    match body.advance(&mut conn.r) {
        Ok(true) => return Stage::Serve(head, Some(Ok(body.into_body()))),
        Err(e) => return Stage::Serve(head, Some(Err(e))),
        Ok(false) => {}
    }
    // The rest is read on the poller: a large body first takes its share.
    let held = if limit > limits::HTTP_BODY_MAX {
        let share = match framing {
            Framing::Length(n) => n as usize,
            _ => limit,
        };
        match Held::take(shared, share) {
            Some(h) => Some(h),
            None => return Stage::Serve(head, Some(Err(BodyError::Busy))),
        }
    } else {
        None
    };
    if head
        .header("expect")
        .is_some_and(|e| e.eq_ignore_ascii_case("100-continue"))
    {
        let _ = conn.stream().write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    conn.staged = Some(Staged::Reading {
        head,
        body,
        deadline: Instant::now() + Duration::from_millis(limits::HTTP_BODY_DEADLINE_MS),
        held,
    });
    Stage::Wait
}

/// The body limit of a request that gets as far as its body, else `None`.
fn body_limit(shared: &Shared, head: &Head) -> Option<usize> {
    if head.method == "OPTIONS"
        || head
            .header("expect")
            .is_some_and(|e| !e.eq_ignore_ascii_case("100-continue"))
        || shared.hosts.check(head).is_err()
        || super::auth::check_origin(head, &shared.origins).is_err()
        || !shared.token.verify(head.header("authorization"))
    {
        return None;
    }
    let (route, _) = super::routes::find(&head.path).ok()?;
    route.ops.iter().find(|o| o.method == head.method)?;
    Some(
        LARGE_BODIES
            .iter()
            .find(|(p, m, _)| *p == route.path && *m == head.method)
            .map_or(limits::HTTP_BODY_MAX, |(_, _, l)| *l),
    )
}

/// A slot of `http.max_connections`, given back when dropped.
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.conns.fetch_sub(1, Ordering::AcqRel);
    }
}

const LISTEN: Token = Token(0);
const WAKE: Token = Token(1);

/// The running listener, for stopping it.
pub struct Listener {
    pub addr: SocketAddr,
    waker: Arc<Waker>,
    stop: Arc<AtomicBool>,
}

impl Listener {
    /// Closes the listening socket and every idle connection; handler
    /// threads finish the requests they hold and exit.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
    }
}

/// Binds the listening socket; returns it with the address it got.
pub fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), String> {
    let listener = TcpListener::bind(addr).map_err(|e| {
        format!(
            "unable to listen for HTTP on {addr}: {}",
            crate::errors::io_cause(&e)
        )
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("unable to set up the HTTP listener: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("unable to set up the HTTP listener: {e}"))?;
    Ok((listener, addr))
}

/// Starts the poller and `threads` handler threads on a bound listener.
/// `serve` handles a connection with bytes to read and gives it back when
/// it should stay open.
pub fn start(
    listener: TcpListener,
    shared: Arc<Shared>,
    threads: usize,
    serve: fn(&Arc<Shared>, Conn) -> Option<Conn>,
    at_once: fn(&Arc<Shared>, &mut Conn) -> AtOnce,
) -> Result<Listener, String> {
    let addr = listener
        .local_addr()
        .map_err(|e| format!("unable to set up the HTTP listener: {e}"))?;
    let poll = Poll::new().map_err(|e| format!("unable to create the HTTP poll: {e}"))?;
    let waker = Arc::new(
        Waker::new(poll.registry(), WAKE)
            .map_err(|e| format!("unable to create the HTTP waker: {e}"))?,
    );
    let max = shared.max_connections;
    let (work_tx, work_rx) = bounded::<Conn>(max);
    let (back_tx, back_rx) = bounded::<Conn>(max);
    let stop = Arc::new(AtomicBool::new(false));
    // Handler threads waiting for a connection: one lingers on a busy
    // connection only while another waits, so a connection queued
    // meanwhile is taken at once.
    let free = Arc::new(AtomicUsize::new(0));
    for n in 0..threads {
        let rx = work_rx.clone();
        let back = back_tx.clone();
        let shared = shared.clone();
        let waker = waker.clone();
        let free = free.clone();
        std::thread::Builder::new()
            .name(format!("http-{n}"))
            .spawn(move || {
                loop {
                    free.fetch_add(1, Ordering::AcqRel);
                    let got = rx.recv();
                    free.fetch_sub(1, Ordering::AcqRel);
                    let Ok(conn) = got else { break };
                    let mut next = serve(&shared, conn);
                    // A busy keep-alive client stays on this handler for a
                    // bounded turn (see "Busy connections" above).
                    let mut turn = Turn::default();
                    while let Some(conn) = next.take() {
                        let contended = free.load(Ordering::Acquire) == 0 || !rx.is_empty();
                        let wait = turn.may_wait(contended);
                        let kept = !conn.r.head_pending()
                            && wait.is_some_and(|w| next_head_soon(&conn, w, &mut turn, contended));
                        if kept {
                            next = serve(&shared, conn);
                        } else if back.try_send(conn).is_ok() {
                            let _ = waker.wake();
                        }
                    }
                }
            })
            .map_err(|e| format!("unable to start HTTP handler thread: {e}"))?;
    }
    let mut poller = Poller {
        poll,
        listener,
        shared,
        at_once,
        work_tx,
        back_rx,
        idle: HashMap::new(),
        next: 2,
        serial: 0,
        stop: stop.clone(),
    };
    poller
        .poll
        .registry()
        .register(
            &mut SourceFd(&poller.listener.as_raw_fd()),
            LISTEN,
            Interest::READABLE,
        )
        .map_err(|e| format!("unable to watch the HTTP listener: {e}"))?;
    std::thread::Builder::new()
        .name("http-poll".into())
        .spawn(move || poller.run())
        .map_err(|e| format!("unable to start the HTTP poll thread: {e}"))?;
    Ok(Listener { addr, waker, stop })
}

/// A connection the poller holds until a whole head is buffered.
struct Parked {
    conn: Conn,
    /// When it is closed: `HTTP_IDLE_MS` after it was parked with nothing
    /// buffered, `HTTP_HEAD_DEADLINE_MS` after the first byte of a head.
    deadline: Instant,
    /// Whether `deadline` is already the head's.
    in_head: bool,
}

struct Poller {
    poll: Poll,
    listener: TcpListener,
    shared: Arc<Shared>,
    at_once: fn(&Arc<Shared>, &mut Conn) -> AtOnce,
    work_tx: Sender<Conn>,
    back_rx: Receiver<Conn>,
    idle: HashMap<usize, Parked>,
    next: usize,
    serial: u64,
    stop: Arc<AtomicBool>,
}

/// What reading a parked connection came to.
enum Read {
    /// Nothing more to read for now: keep waiting.
    Wait,
    /// A whole head (or something the handler answers 400): serve it.
    Ready,
    /// Closed or failed with nothing worth answering.
    Gone,
}

impl Poller {
    fn run(&mut self) {
        let mut events = Events::with_capacity(256);
        loop {
            let now = Instant::now();
            let timeout = self
                .idle
                .values()
                .map(|p| p.deadline.saturating_duration_since(now))
                .min();
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    crate::error!("the HTTP poll failed: {e}; the HTTP listener stops");
                    return;
                }
                continue;
            }
            if self.stop.load(Ordering::Acquire) {
                return; // dropping the listener and idle connections closes them
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTEN => self.accept_all(),
                    WAKE => {}
                    Token(t) => self.readable(t),
                }
            }
            // Connections handlers gave back. One with a whole head
            // buffered (its handler's turn ended) is read as if the head
            // had just arrived: answered at once when it can be.
            while let Ok(mut conn) = self.back_rx.try_recv() {
                let ready = conn.staged.is_none() && conn.r.head_ready();
                if let Some(t) = self.park(conn) {
                    if ready {
                        self.readable(t);
                    }
                }
            }
            let now = Instant::now();
            let expired: Vec<usize> = self
                .idle
                .iter()
                .filter(|(_, p)| p.deadline <= now)
                .map(|(t, _)| *t)
                .collect();
            for t in expired {
                if let Some(conn) = self.unpark(t) {
                    if conn.staged.is_some() {
                        body_timed_out(conn);
                    }
                }
            }
        }
    }

    /// Reads what a parked connection sent, without blocking. A whole head
    /// is answered at once when it can be (see "Reads answered at once"
    /// above), up to `HTTP_REQUESTS_PER_TURN` of them; otherwise the
    /// connection goes to a handler.
    fn readable(&mut self, t: usize) {
        let (at_once, shared) = (self.at_once, &self.shared);
        let Some(p) = self.idle.get_mut(&t) else {
            return;
        };
        if p.conn.staged.is_some() {
            return self.read_body(t);
        }
        let mut answered = 0;
        let outcome = loop {
            if p.conn.r.head_ready() {
                if answered == limits::HTTP_REQUESTS_PER_TURN {
                    break Read::Ready;
                }
                answered += 1;
                match at_once(shared, &mut p.conn) {
                    AtOnce::Answered {
                        bytes,
                        keep,
                        in_flight,
                    } => match write_now(p.conn.stream(), &bytes) {
                        Ok(n) if n == bytes.len() && keep => {
                            p.in_head = false;
                            p.deadline =
                                Instant::now() + Duration::from_millis(limits::HTTP_IDLE_MS);
                            continue;
                        }
                        Ok(n) if n == bytes.len() => break Read::Gone,
                        Ok(n) => {
                            let bytes = bytes[n..].to_vec();
                            p.conn.staged = Some(Staged::Unsent {
                                bytes,
                                keep,
                                in_flight,
                            });
                            break Read::Ready;
                        }
                        Err(_) => break Read::Gone,
                    },
                    AtOnce::Handler(head) => {
                        p.conn.staged = Some(Staged::Head(head));
                        break Read::Ready;
                    }
                    AtOnce::Close => break Read::Gone,
                }
            }
            match p.conn.r.fill() {
                // Closed mid-head: the handler answers 400; between
                // requests: nothing to answer.
                Ok(0) if p.conn.r.buffered() > 0 => break Read::Ready,
                Ok(0) => break Read::Gone,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Read::Wait,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break Read::Gone,
            }
        };
        match outcome {
            Read::Wait => {
                if p.conn.r.buffered() > 0 && !p.in_head {
                    p.in_head = true;
                    p.deadline =
                        Instant::now() + Duration::from_millis(limits::HTTP_HEAD_DEADLINE_MS);
                }
            }
            Read::Ready => {
                if let Some(conn) = self.unpark(t) {
                    if conn.stream().set_nonblocking(false).is_ok() {
                        self.dispatch(conn);
                    }
                }
            }
            Read::Gone => {
                self.unpark(t);
            }
        }
    }

    /// Reads what a connection waiting for a body sent, without blocking;
    /// hands it to a handler once the body is whole or failed.
    fn read_body(&mut self, t: usize) {
        let Some(p) = self.idle.get_mut(&t) else {
            return;
        };
        let Some(Staged::Reading { body, .. }) = &mut p.conn.staged else {
            return;
        };
        let result = loop {
            match body.advance(&mut p.conn.r) {
                Ok(true) => break Some(Ok(())),
                Err(e) => break Some(Err(e)),
                Ok(false) => {}
            }
            match p.conn.r.fill() {
                Ok(0) => break Some(Err(BodyError::early_end())),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.unpark(t);
                    return;
                }
            }
        };
        let Some(result) = result else { return };
        let Some(mut conn) = self.unpark(t) else {
            return;
        };
        if let Some(Staged::Reading {
            head, body, held, ..
        }) = conn.staged.take()
        {
            conn.staged = Some(Staged::Ready {
                head,
                body: result.map(|()| body.into_body()),
                held,
            });
        }
        if conn.stream().set_nonblocking(false).is_ok() {
            self.dispatch(conn);
        }
    }

    /// Stops watching a parked connection and gives it back; dropping it
    /// closes it.
    fn unpark(&mut self, t: usize) -> Option<Conn> {
        let p = self.idle.remove(&t)?;
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&p.conn.stream().as_raw_fd()));
        Some(p.conn)
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => self.admit(stream, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Out of descriptors or memory: the connection stays in the
                    // backlog and is accepted when the poll reports it again.
                    crate::warn!(
                        "unable to accept an HTTP connection: {}",
                        crate::errors::io_cause(&e)
                    );
                    return;
                }
            }
        }
    }

    /// The oldest unproven parked connection of `ip`, and how many `ip` has.
    fn unproven_of(&self, ip: IpAddr) -> (usize, Option<usize>) {
        let mut n = 0;
        let mut oldest: Option<(u64, usize)> = None;
        for (t, p) in &self.idle {
            if !p.conn.proven && p.conn.peer.ip() == ip {
                n += 1;
                if oldest.is_none_or(|(s, _)| p.conn.serial < s) {
                    oldest = Some((p.conn.serial, *t));
                }
            }
        }
        (n, oldest.map(|(_, t)| t))
    }

    /// The connection to close to make room: the oldest unproven parked
    /// connection of the peer that has the most of them.
    fn reclaimable(&self) -> Option<usize> {
        let mut per_peer: HashMap<IpAddr, usize> = HashMap::new();
        for p in self.idle.values().filter(|p| !p.conn.proven) {
            *per_peer.entry(p.conn.peer.ip()).or_default() += 1;
        }
        let (ip, _) = per_peer.into_iter().max_by_key(|(_, n)| *n)?;
        self.unproven_of(ip).1
    }

    fn admit(&mut self, stream: TcpStream, peer: SocketAddr) {
        let (held, oldest) = self.unproven_of(peer.ip());
        if held >= limits::HTTP_UNPROVEN_PER_PEER {
            if let Some(t) = oldest {
                self.unpark(t);
            }
        }
        if self.shared.conns.load(Ordering::Acquire) >= self.shared.max_connections {
            if let Some(t) = self.reclaimable() {
                self.unpark(t);
            }
        }
        let taken = self.shared.conns.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(self.shared.clone());
        if taken >= self.shared.max_connections {
            refuse(
                stream,
                &Problem::new(
                    Code::TooManyConnections,
                    "the daemon already serves the maximum number of HTTP connections; try again",
                )
                .retry(1),
            );
            return;
        }
        let Ok(local) = stream.local_addr() else {
            return;
        };
        let set = stream
            .set_nodelay(true)
            .and_then(|()| {
                stream.set_read_timeout(Some(Duration::from_millis(limits::HTTP_READ_TIMEOUT_MS)))
            })
            .and_then(|()| {
                stream.set_write_timeout(Some(Duration::from_millis(limits::HTTP_WRITE_TIMEOUT_MS)))
            });
        if set.is_err() {
            return;
        }
        self.serial += 1;
        self.park(Conn {
            r: Reader::new(stream),
            peer,
            local,
            class: std::cell::OnceCell::new(),
            proven: false,
            staged: None,
            serial: self.serial,
            _slot: slot,
        });
    }

    /// Watches a connection until a whole head is buffered or its time
    /// ends. Its socket is non-blocking while parked. Returns its token,
    /// or `None` when it was closed instead.
    fn park(&mut self, conn: Conn) -> Option<usize> {
        if self.stop.load(Ordering::Acquire) || conn.stream().set_nonblocking(true).is_err() {
            return None;
        }
        let t = self.next;
        self.next = if self.next == usize::MAX {
            2
        } else {
            self.next + 1
        };
        if self
            .poll
            .registry()
            .register(
                &mut SourceFd(&conn.stream().as_raw_fd()),
                Token(t),
                Interest::READABLE,
            )
            .is_ok()
        {
            // Bytes already buffered are the start of a head (a pipelined
            // request cut short): its deadline runs from now. A body's
            // deadline runs from its head.
            let in_head = conn.r.buffered() > 0 || conn.staged.is_some();
            let deadline = match &conn.staged {
                Some(Staged::Reading { deadline, .. }) => *deadline,
                _ if in_head => {
                    Instant::now() + Duration::from_millis(limits::HTTP_HEAD_DEADLINE_MS)
                }
                _ => Instant::now() + Duration::from_millis(limits::HTTP_IDLE_MS),
            };
            self.idle.insert(
                t,
                Parked {
                    conn,
                    deadline,
                    in_head,
                },
            );
            // Read at once what of the body arrived while the connection
            // was on a handler (the registration would report it too, one
            // poll round later).
            if self.idle.get(&t).is_some_and(|p| p.conn.staged.is_some()) {
                self.read_body(t);
            }
        }
        self.idle.contains_key(&t).then_some(t)
    }

    fn dispatch(&mut self, conn: Conn) {
        match self.work_tx.try_send(conn) {
            Ok(()) => {}
            // Cannot happen: the queue holds as many as there are slots.
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                crate::warn!("HTTP handler queue full; closing a connection");
            }
        }
    }
}

/// A handler's turn on one busy connection (see "Busy connections"
/// above): how many times it was kept, and how long the handler waited
/// for it while other connections might have wanted the thread.
#[derive(Default)]
struct Turn {
    kept: usize,
    contended_wait: Duration,
}

impl Turn {
    /// How long the handler may wait for the connection's next request,
    /// or None when the turn is over: after `HTTP_REQUESTS_PER_TURN`
    /// keeps, or, when other connections may be waiting for a handler
    /// (`contended`), once the turn has waited `HTTP_BUSY_LINGER_MS` in
    /// all while they might.
    fn may_wait(&self, contended: bool) -> Option<Duration> {
        let linger = Duration::from_millis(limits::HTTP_BUSY_LINGER_MS);
        if self.kept >= limits::HTTP_REQUESTS_PER_TURN {
            return None;
        }
        let left = if contended {
            linger.saturating_sub(self.contended_wait)
        } else {
            linger
        };
        (!left.is_zero()).then_some(left)
    }
}

/// Whether bytes of a next request arrive on `conn` within `wait` (or the
/// peer closed, which the handler then notices at once), counted in
/// `turn`. A connection waiting for its body is never kept.
fn next_head_soon(conn: &Conn, wait: Duration, turn: &mut Turn, contended: bool) -> bool {
    if conn.staged.is_some() {
        return false;
    }
    let mut fds = [libc::pollfd {
        fd: conn.stream().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    let ts = libc::timespec {
        tv_sec: wait.as_secs() as libc::time_t,
        tv_nsec: wait.subsec_nanos() as libc::c_long,
    };
    let start = Instant::now();
    // SAFETY: `fds` is a valid array of one pollfd for the length passed,
    // the descriptor stays open for the call (the connection is
    // borrowed), `ts` outlives it, and a null signal mask leaves the
    // thread's mask as it is.
    let n = unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    if contended {
        turn.contended_wait += start.elapsed();
    }
    turn.kept += 1;
    n > 0
}

/// Writes what the socket takes of `bytes` now, without blocking (it is
/// non-blocking while parked); returns how much it took.
fn write_now(mut s: &TcpStream, bytes: &[u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < bytes.len() {
        match s.write(&bytes[n..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Answers 408 to a connection whose body did not arrive in time, without
/// blocking the poller (the answer is small and the client, stalled
/// mid-body, reads nothing else), then closes it.
fn body_timed_out(conn: Conn) {
    let p = Problem::new(
        Code::RequestTimeout,
        format!(
            "the request body did not arrive within {} ms",
            limits::HTTP_BODY_DEADLINE_MS
        ),
    );
    let mut r = Response::problem(&p);
    r.headers.push(("Cache-Control", "no-store".into()));
    let _ = wire::write_response(&mut conn.stream(), &r, false, true);
    let _ = conn.stream().shutdown(std::net::Shutdown::Write);
}

/// Answers a connection the daemon will not serve, then closes it.
fn refuse(mut stream: TcpStream, p: &Problem) {
    let _ = stream.set_write_timeout(Some(Duration::from_millis(limits::HTTP_WRITE_TIMEOUT_MS)));
    let mut r = Response::problem(p);
    r.headers.push(("Cache-Control", "no-store".into()));
    let _ = wire::write_response(&mut stream, &r, false, true);
    let _ = stream.flush();
    let _ = stream.shutdown(std::net::Shutdown::Write);
}
