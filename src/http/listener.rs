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
//!   idle keep-alive connection, in a mio poll. It accepts, refuses past
//!   `http.max_connections` with 503 `too_many_connections` problem+json,
//!   sets TCP_NODELAY and bounded read and write waits on each socket, and
//!   hands a connection to the handler pool when it has bytes to read;
//! - `http.threads` handler threads `http-N` take connections from a bounded
//!   queue, serve requests while the client keeps sending (at most
//!   `HTTP_REQUESTS_PER_TURN` in a row), and give the connection back to the
//!   poller through a bounded queue and its waker. An idle connection thus
//!   costs no thread, and a slow client holds one for at most the read
//!   timeout;
//! - an SSE watch moves its connection to its own writer thread
//!   `http-sse-N` ([`super::sse`]), at most `HTTP_MAX_STREAMS` of them.
//!
//! Every open connection, idle, being served or streaming, holds one slot of
//! `http.max_connections` until its socket is closed.

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::Shared;
use super::problem::{Code, Problem};
use super::wire::{self, Reader, Response};
use crate::limits;

/// One open connection and the slot it holds.
pub struct Conn {
    pub r: Reader<TcpStream>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    /// The caller class of the peer process, classified at the
    /// connection's first request that asks for it (`Ctx::caller`).
    pub class: std::cell::OnceCell<crate::procs::CallerClass>,
    _slot: Slot,
}

impl Conn {
    pub fn stream(&self) -> &TcpStream {
        &self.r.inner
    }
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
    for n in 0..threads {
        let rx = work_rx.clone();
        let back = back_tx.clone();
        let shared = shared.clone();
        let waker = waker.clone();
        std::thread::Builder::new()
            .name(format!("http-{n}"))
            .spawn(move || {
                for conn in rx {
                    if let Some(conn) = serve(&shared, conn) {
                        if back.try_send(conn).is_ok() {
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
        work_tx,
        back_rx,
        idle: HashMap::new(),
        next: 2,
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

struct Poller {
    poll: Poll,
    listener: TcpListener,
    shared: Arc<Shared>,
    work_tx: Sender<Conn>,
    back_rx: Receiver<Conn>,
    idle: HashMap<usize, (Conn, Instant)>,
    next: usize,
    stop: Arc<AtomicBool>,
}

impl Poller {
    fn run(&mut self) {
        let mut events = Events::with_capacity(256);
        loop {
            let now = Instant::now();
            let timeout = self
                .idle
                .values()
                .map(|(_, d)| d.saturating_duration_since(now))
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
                    Token(t) => {
                        if let Some((conn, _)) = self.idle.remove(&t) {
                            let _ = self
                                .poll
                                .registry()
                                .deregister(&mut SourceFd(&conn.stream().as_raw_fd()));
                            self.dispatch(conn);
                        }
                    }
                }
            }
            while let Ok(conn) = self.back_rx.try_recv() {
                if conn.r.buffered() > 0 {
                    self.dispatch(conn)
                } else {
                    self.park(conn)
                }
            }
            let now = Instant::now();
            let expired: Vec<usize> = self
                .idle
                .iter()
                .filter(|(_, (_, d))| *d <= now)
                .map(|(t, _)| *t)
                .collect();
            for t in expired {
                if let Some((conn, _)) = self.idle.remove(&t) {
                    let _ = self
                        .poll
                        .registry()
                        .deregister(&mut SourceFd(&conn.stream().as_raw_fd()));
                }
            }
        }
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

    fn admit(&mut self, stream: TcpStream, peer: SocketAddr) {
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
        self.park(Conn {
            r: Reader::new(stream),
            peer,
            local,
            class: std::cell::OnceCell::new(),
            _slot: slot,
        });
    }

    /// Watches an idle connection until it has bytes or its idle time ends.
    fn park(&mut self, conn: Conn) {
        if self.stop.load(Ordering::Acquire) {
            return;
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
            self.idle.insert(
                t,
                (
                    conn,
                    Instant::now() + Duration::from_millis(limits::HTTP_IDLE_MS),
                ),
            );
        }
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

/// Answers a connection the daemon will not serve, then closes it.
fn refuse(mut stream: TcpStream, p: &Problem) {
    let _ = stream.set_write_timeout(Some(Duration::from_millis(limits::HTTP_WRITE_TIMEOUT_MS)));
    let mut r = Response::problem(p);
    r.headers.push(("Cache-Control", "no-store".into()));
    let _ = wire::write_response(&mut stream, &r, false, true);
    let _ = stream.flush();
    let _ = stream.shutdown(std::net::Shutdown::Write);
}
