//! The gateway's WebSocket connections (seed 004, "Transports",
//! "Authentication", "Framing", "Keepalive", "Slow readers"; issue 12):
//! the accept thread, and per connection one reader thread and one writer
//! thread, all blocking. The gateway thread ([`super::state`]) owns every
//! decision; these threads only move bytes, relay frames straight from a
//! reader to the other side's writer through the channel table
//! ([`super::relay`]).
//!
//! - `gw-accept` accepts, and closes at once any connection past
//!   `gateway.max_connections` (every connection holds a slot until both
//!   its threads have ended), so threads are bounded: two per connection.
//! - `gw-conn` does the handshake (at most `GATEWAY_HANDSHAKE_MS`, and at
//!   most `GATEWAY_HANDSHAKES_PER_PEER` at once from one address): exactly
//!   two routes, `/node` and `/client` (others: 404 `not found`); the token
//!   from `Authorization: Bearer <token>`, or when that header is absent or
//!   does not start with exactly `Bearer `, from the `token` query
//!   parameter; the gateway thread says whether it is good. A bad token is
//!   answered 401 with the body `unauthorized` and no upgrade (tungstenite
//!   does the handshake). Then the thread becomes the connection's reader:
//!   it reads frames with [`ws::Reader`], splits the text messages,
//!   taken as one byte stream, on `\n`, skips empty lines, closes the
//!   connection when a line passes 16 MiB, answers `ping` and lines that
//!   are no frame itself, forwards relay frames ([`dispatch`]) and hands
//!   every other frame of a message to the gateway thread in one batch.
//!   It blocks only on reading its own socket and, when the gateway
//!   thread's queue (`GATEWAY_INBOX`) is full, on that queue; never on
//!   another connection: a relay frame goes into the other side's outbox,
//!   whose bounds close a channel or a connection instead of waiting.
//! - `gw-write` is the only thread that writes to the socket. It gathers
//!   the lines already queued (up to `GATEWAY_WRITE_BATCH`) into one text
//!   message, which the seed allows, and writes it with a deadline of
//!   `gateway.write_timeout_ms`; past it the connection is closed ("a
//!   partial frame corrupts the stream"). Pongs and the close reply the
//!   reader makes reach the socket through the same queue, so no two
//!   threads ever write to one socket.
//!
//! Direct writes (issue 12, the relay figures). Handing every relay frame
//! to the other side's writer thread costs a wake-up and a switch of
//! threads per burst, more than writing the frames. So a reader first
//! tries to write a run of relay frames for one channel direction (at
//! most `GATEWAY_DIRECT_WRITE` bytes, gathered by one `sendmsg` from
//! where they are) straight to the other side's socket
//! ([`Outbox::try_direct`]): only when that side's outbox is empty
//! and its writer holds nothing half written (the writer lowers the count
//! only once what it took is written, and holds the socket's lock while it
//! writes), only if the lock is free (`try_lock`), and without waiting
//! (`MSG_DONTWAIT`). Otherwise the frames are queued as below. What the
//! socket takes only in part stays with the socket, and a wake-up queued
//! behind it makes the writer finish it, under the same write deadline,
//! before anything else; so per-connection order holds, a reader never
//! waits on another connection's socket, and a slow reader is still
//! closed by its writer's deadline.
//!
//! Queues. A connection's outbox is a [`super::outq`] queue of at most
//! `GATEWAY_OUTBOX_FRAMES`, which holds memory only for what waits in it:
//! an idle connection holds no preallocated slots (a crossbeam `bounded`
//! channel writes all 8,192 when made, 384 KiB a connection, six times
//! the 64 KiB an idle connection may hold, issue 12). The outbox's `len`
//! also counts what the writer has taken and not yet written, which is
//! what a direct write must wait for.
//! Relay frames and node events carry a [`Queued`] counter of their
//! channel's direction or their client's events, which the writer lowers
//! once the frame is written: that is how a reader forwarding a relay
//! frame ([`super::relay`]) knows the seed's 64-frame queue of a channel
//! is full, and the gateway thread that a client's 64 events are waiting.

use crossbeam_channel::{Sender, bounded};
use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tungstenite::http::StatusCode;
use tungstenite::protocol::WebSocketConfig;

use super::relay::{self, Trouble};
use super::state::{Role, RouteKind, ToState};
use super::wire::{self, Frame};
use super::{outq, ws};
use crate::limits;
use crate::socket::framing::{self, LineBuffer};

/// A frame or bytes for a connection's writer.
pub enum Out {
    /// One JSON line, `\n` included, and what to lower once it is written.
    Line(Vec<u8>, Option<Arc<Queued>>),
    /// A relay frame as it arrived, without its `\n` (the writer adds it),
    /// and its channel direction's queue.
    Relay(Vec<u8>, Arc<Queued>),
    /// A whole WebSocket frame the reader made (a pong, the close reply).
    Raw(Vec<u8>),
    /// Nothing to write: wakes the writer, to finish what a direct write
    /// left (module comment), or an in-process link's reader to see that
    /// the link is closed. Counted like the rest, so frames pushed after
    /// it wait behind it.
    Wake,
}

impl Out {
    /// Bytes it adds to a text message.
    fn wire_len(&self) -> usize {
        match self {
            Out::Line(b, _) | Out::Raw(b) => b.len(),
            Out::Relay(b, _) => b.len() + 1,
            Out::Wake => 0,
        }
    }

    /// Lowers the queue it was counted in, once written (or dropped).
    pub fn written(&self) {
        let (q, n) = match self {
            Out::Line(b, Some(q)) | Out::Relay(b, q) => (q, b.len()),
            _ => return,
        };
        q.frames.fetch_sub(1, Ordering::AcqRel);
        q.bytes.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Frames and bytes queued, not yet written: one direction of a channel,
/// or a client's node events.
#[derive(Default)]
pub struct Queued {
    pub frames: AtomicUsize,
    pub bytes: AtomicUsize,
}

/// The queue into one connection's writer, bounded by a count, and for a
/// WebSocket the socket itself, for direct writes (module comment).
#[derive(Clone)]
pub struct Outbox {
    tx: outq::Sender<Out>,
    len: Arc<AtomicUsize>,
    socket: Option<Arc<Mutex<Socket>>>,
}

/// A connection's socket as its writers share it: the `gw-write` thread,
/// and readers writing relay frames directly (module comment).
pub struct Socket {
    tcp: TcpStream,
    /// The end of a message a direct write began and the socket did not
    /// take at once; the writer sends it before anything else.
    rest: Vec<u8>,
}

/// What became of a direct write.
#[derive(Debug, PartialEq)]
pub enum Direct {
    /// Written, or begun and left to the writer to finish.
    Sent,
    /// Not written: queue the frames.
    Queue,
}

/// The outbox is full or its writer is gone: close the connection.
#[derive(Debug)]
pub struct Full;

impl Outbox {
    pub fn new() -> (Outbox, outq::Receiver<Out>, Arc<AtomicUsize>) {
        let (tx, rx) = outq::bounded(limits::GATEWAY_OUTBOX_FRAMES);
        let len = Arc::new(AtomicUsize::new(0));
        (
            Outbox {
                tx,
                len: len.clone(),
                socket: None,
            },
            rx,
            len,
        )
    }

    /// An outbox whose frames may also be written directly to `tcp`, and
    /// the socket as the writer shares it.
    fn with_socket(
        tcp: TcpStream,
    ) -> (
        Outbox,
        outq::Receiver<Out>,
        Arc<AtomicUsize>,
        Arc<Mutex<Socket>>,
    ) {
        let (mut out, rx, len) = Outbox::new();
        let socket = Arc::new(Mutex::new(Socket {
            tcp,
            rest: Vec::new(),
        }));
        out.socket = Some(socket.clone());
        (out, rx, len, socket)
    }

    /// Writes `lines` (relay frames without their `\n`) as one text
    /// message straight to the socket, when nothing is queued or being
    /// written (so order is kept), no other thread holds the socket, they
    /// come to at most `GATEWAY_DIRECT_WRITE` bytes and
    /// `GATEWAY_WRITE_BATCH_FRAMES` frames (one `sendmsg`: the header and
    /// two slices a frame stay under IOV_MAX), and the socket takes
    /// them without waiting. What it takes only in part the writer
    /// finishes before anything else. Never blocks.
    pub fn try_direct(&self, lines: &[Vec<u8>]) -> Direct {
        let Some(socket) = &self.socket else {
            return Direct::Queue;
        };
        let total: usize = lines.iter().map(|l| l.len() + 1).sum();
        if total > limits::GATEWAY_DIRECT_WRITE
            || lines.len() > limits::GATEWAY_WRITE_BATCH_FRAMES
            || self.len.load(Ordering::Acquire) != 0
        {
            return Direct::Queue;
        }
        let Ok(mut sock) = socket.try_lock() else {
            return Direct::Queue;
        };
        // The writer lowers `len` only once what it took is written, under
        // the lock: 0 here means nothing is queued nor half written.
        if self.len.load(Ordering::Acquire) != 0 || !sock.rest.is_empty() {
            return Direct::Queue;
        }
        let (h, n) = ws::header(0x1, total);
        let mut parts = Vec::with_capacity(1 + 2 * lines.len());
        parts.push(IoSlice::new(&h[..n]));
        for l in lines {
            parts.push(IoSlice::new(l));
            parts.push(IoSlice::new(b"\n"));
        }
        let sent = send_now(&sock.tcp, &parts);
        if sent == 0 {
            return Direct::Queue;
        }
        if sent < n + total {
            // Only what the socket did not take is copied.
            let mut rest = Vec::with_capacity(n + total - sent);
            let mut skip = sent;
            for p in &parts {
                let taken = skip.min(p.len());
                rest.extend_from_slice(&p[taken..]);
                skip -= taken;
            }
            sock.rest = rest;
            // Wakes the writer to finish it; counted, so later frames queue
            // behind it. A full outbox closes the connection anyway.
            let _ = self.push(Out::Wake);
        }
        Direct::Sent
    }

    pub fn push(&self, out: Out) -> Result<(), Full> {
        if self.len.fetch_add(1, Ordering::AcqRel) >= limits::GATEWAY_OUTBOX_FRAMES {
            self.len.fetch_sub(1, Ordering::AcqRel);
            return Err(Full);
        }
        self.tx.try_send(out).map_err(|outq::Refused| {
            self.len.fetch_sub(1, Ordering::AcqRel);
            Full
        })
    }

    pub fn line(&self, bytes: Vec<u8>) -> Result<(), Full> {
        self.push(Out::Line(bytes, None))
    }
}

/// Writes what `tcp` takes of `parts` without waiting, gathered from where
/// they are (a 64 KiB frame is not copied into a message first); 0 also
/// when it fails (the writer then meets the failure and closes the
/// connection).
fn send_now(tcp: &TcpStream, parts: &[IoSlice<'_>]) -> usize {
    use std::os::fd::AsRawFd;
    // SAFETY: `IoSlice` is ABI-compatible with `iovec` on unix (its
    // documented guarantee), so `parts` is a live array of `parts.len()`
    // iovecs, each naming a live slice, for the duration of the call; the
    // header names no address and no control data; the descriptor is the
    // one `tcp` owns, open while it is borrowed.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = parts.as_ptr().cast_mut().cast::<libc::iovec>();
        msg.msg_iovlen = parts.len() as _;
        libc::sendmsg(
            tcp.as_raw_fd(),
            &msg,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    usize::try_from(n).unwrap_or(0)
}

/// What the accept and connection threads share.
pub struct Shared {
    pub to_state: Sender<ToState>,
    /// The open channels, for readers to forward relay frames ([`relay`]).
    pub relay: Arc<relay::Table>,
    pub live: AtomicUsize,
    pub max: usize,
    pub write_timeout: Duration,
    pub next_conn: Arc<AtomicU64>,
    pub stopping: AtomicBool,
    /// Handshakes under way per peer address (`GATEWAY_HANDSHAKES_PER_PEER`).
    pub handshaking: Mutex<HashMap<IpAddr, usize>>,
}

/// A peer's place among the handshakes under way, given back when the
/// handshake ends either way.
struct Handshaking(Arc<Shared>, IpAddr);

impl Handshaking {
    fn take(shared: &Arc<Shared>, ip: IpAddr) -> Option<Handshaking> {
        let mut m = shared.handshaking.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= limits::GATEWAY_HANDSHAKES_PER_PEER {
            return None;
        }
        *n += 1;
        Some(Handshaking(shared.clone(), ip))
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        let mut m = self.0.handshaking.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.1);
            }
        }
    }
}

/// A connection's place in `gateway.max_connections`, given back when both
/// its threads are done with it.
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Accepts until the gateway stops (the stop wakes it with one connection
/// of its own).
pub fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stopping.load(Ordering::Acquire) {
            break;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                crate::warn!("gateway: accept failed: {}", crate::errors::io_cause(&e));
                // Out of descriptors, say: wait a little instead of spinning.
                std::thread::sleep(Duration::from_millis(limits::GATEWAY_ACCEPT_BACKOFF_MS));
                continue;
            }
        };
        if shared.live.fetch_add(1, Ordering::AcqRel) >= shared.max {
            shared.live.fetch_sub(1, Ordering::AcqRel);
            crate::debug!("gateway: refused a connection: {} held", shared.max);
            continue;
        }
        let slot = Arc::new(Slot(shared.clone()));
        let spawned = std::thread::Builder::new()
            .name("gw-conn".into())
            .stack_size(limits::GATEWAY_THREAD_STACK)
            .spawn(move || serve(stream, slot));
        if let Err(e) = spawned {
            crate::warn!("gateway: unable to start a connection thread: {e}");
        }
    }
}

/// The stream tungstenite does the handshake on. It reads no further than
/// the blank line that ends the request: tungstenite would keep frames a
/// client sent right behind it in a buffer of its own, and after the
/// handshake the connection's frames are read by [`ws::Reader`] from the
/// socket. So it peeks, and takes what it peeked only up to that line.
struct Side {
    tcp: TcpStream,
    /// How much of `\r\n\r\n` the bytes taken so far end with.
    matched: usize,
}

impl Read for Side {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.tcp.peek(buf)?;
        let mut m = self.matched;
        let mut take = n;
        for (i, &c) in buf[..n].iter().enumerate() {
            m = end_of_head(m, c);
            if m == 4 {
                take = i + 1;
                break;
            }
        }
        let got = self.tcp.read(&mut buf[..take])?;
        for &c in &buf[..got] {
            self.matched = end_of_head(self.matched, c) % 4;
        }
        Ok(got)
    }
}

/// The next state of the search for `\r\n\r\n` (bytes of it matched)
/// after `c`; 4 is found.
fn end_of_head(matched: usize, c: u8) -> usize {
    if c == b"\r\n\r\n"[matched % 4] {
        matched % 4 + 1
    } else {
        usize::from(c == b'\r')
    }
}

impl Write for Side {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tcp.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// tungstenite does only the handshake: its buffers stay small, and the
/// frames after it are [`ws::Reader`]'s.
fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(limits::GATEWAY_READ_BUFFER)
        .write_buffer_size(0)
}

/// The token a handshake offers: the Bearer header, else `?token=`.
fn offered_token(req: &Request) -> String {
    if let Some(h) = req.headers().get("authorization")
        && let Some(t) = h.as_bytes().strip_prefix(b"Bearer ")
    {
        return String::from_utf8_lossy(t).into_owned();
    }
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("token="))
        .map(percent_decode)
        .unwrap_or_default()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn refusal(status: StatusCode, body: &str) -> ErrorResponse {
    let mut r = ErrorResponse::new(Some(body.to_string()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert("content-type", "text/plain".parse().expect("static header"));
    h.insert("content-length", body.len().into());
    h.insert("connection", "close".parse().expect("static header"));
    r
}

/// One connection: the handshake, then its reader; its writer on a thread
/// of its own.
// The handshake callback's error type is tungstenite's `ErrorResponse`.
#[allow(clippy::result_large_err)]
fn serve(tcp: TcpStream, slot: Arc<Slot>) {
    let shared = slot.0.clone();
    let peer = tcp.peer_addr().ok();
    // A peer gets at most so many handshakes at once, so that silent
    // sockets from one address cannot hold every slot.
    let Some(handshaking) = peer.and_then(|p| Handshaking::take(&shared, p.ip())) else {
        crate::debug!("gateway: refused a connection: its peer has too many handshakes open");
        return;
    };
    let _ = tcp.set_nodelay(true);
    let _ = tcp.set_read_timeout(Some(Duration::from_millis(limits::GATEWAY_HANDSHAKE_MS)));
    let Ok(closer) = tcp.try_clone() else { return };
    let mut granted: Option<Role> = None;
    let to_state = shared.to_state.clone();
    let callback = |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        let route = match req.uri().path() {
            "/node" => RouteKind::Node,
            "/client" => RouteKind::Client,
            _ => return Err(refusal(StatusCode::NOT_FOUND, "not found")),
        };
        let (tx, rx) = bounded(1);
        let asked = to_state.send(ToState::Auth {
            route,
            token: offered_token(req),
            reply: tx,
        });
        match asked.ok().and_then(|()| rx.recv().ok()).flatten() {
            Some(role) => {
                granted = Some(role);
                Ok(resp)
            }
            None => Err(refusal(StatusCode::UNAUTHORIZED, "unauthorized")),
        }
    };
    let side = Side { tcp, matched: 0 };
    let ws = match tungstenite::accept_hdr_with_config(side, callback, Some(ws_config())) {
        Ok(ws) => ws,
        Err(_) => {
            let _ = closer.shutdown(Shutdown::Both);
            return;
        }
    };
    drop(handshaking);
    let Some(role) = granted else { return };
    let mut tcp = ws.into_inner().tcp;
    let _ = tcp.set_read_timeout(None);
    let Ok(wtcp) = closer.try_clone() else { return };
    let _ = wtcp.set_write_timeout(Some(shared.write_timeout));
    let (outbox, rx, len, socket) = Outbox::with_socket(wtcp);
    let conn = shared.next_conn.fetch_add(1, Ordering::AcqRel);
    let wslot = slot.clone();
    let timeout = shared.write_timeout;
    let spawned = std::thread::Builder::new()
        .name("gw-write".into())
        .stack_size(limits::GATEWAY_THREAD_STACK)
        .spawn(move || {
            write_loop(&socket, rx, len, timeout);
            drop(wslot);
        });
    if spawned.is_err() {
        let _ = closer.shutdown(Shutdown::Both);
        return;
    }
    let Ok(state_closer) = closer.try_clone() else {
        let _ = closer.shutdown(Shutdown::Both);
        return;
    };
    if shared
        .to_state
        .send(ToState::Open {
            conn,
            role,
            out: outbox.clone(),
            closer: Closer::Tcp(state_closer),
            peer,
        })
        .is_err()
    {
        let _ = closer.shutdown(Shutdown::Both);
        return;
    }
    read_loop(&mut tcp, conn, &outbox, &shared);
    let _ = closer.shutdown(Shutdown::Both);
    let _ = shared.to_state.send(ToState::Closed { conn });
}

/// How the gateway thread ends a connection.
pub enum Closer {
    /// A WebSocket: shutting the socket down ends its reader and writer.
    Tcp(TcpStream),
    /// An in-process node link: the flag ends it, the empty frame wakes
    /// its reader.
    Link(Arc<AtomicBool>, Outbox),
}

impl Closer {
    pub fn close(&self) {
        match self {
            Closer::Tcp(t) => {
                let _ = t.shutdown(Shutdown::Both);
            }
            Closer::Link(closed, wake) => {
                closed.store(true, Ordering::Release);
                let _ = wake.push(Out::Wake);
            }
        }
    }
}

/// The connection must be closed: a line passed 16 MiB, or its outbox is
/// full.
#[derive(Debug)]
pub struct MustClose;

/// Splits lines out of `bytes` and sorts them: what is answered here goes
/// to `outbox`, the rest into `batch`.
///
/// A message of whole lines with no partial line before it (what peers
/// send: one or more frames a message) is cut where it lies, each line
/// copied once; only a message that ends inside a line goes through the
/// line buffer, which costs a second copy and, for long lines, a buffer
/// grown and given back (the 64 KiB relay figure's largest costs).
pub fn take_lines(
    lines: &mut LineBuffer,
    bytes: &[u8],
    outbox: &Outbox,
    batch: &mut Vec<Frame>,
) -> Result<(), MustClose> {
    if lines.pending() == 0 && bytes.last() == Some(&b'\n') {
        let mut rest = bytes;
        while let Some(end) = framing::memchr(rest) {
            if end > limits::GATEWAY_MAX_LINE {
                crate::debug!("gateway: closed a connection: a line passed 16 MiB");
                return Err(MustClose);
            }
            if let Some(line) = framing::content(&rest[..end]) {
                sort(line.to_vec(), outbox, batch)?;
            }
            rest = &rest[end + 1..];
        }
        return Ok(());
    }
    lines.extend(bytes);
    loop {
        match lines.next_line() {
            Ok(Some(line)) => sort(line, outbox, batch)?,
            Ok(None) => return Ok(()),
            Err(_) => {
                crate::debug!("gateway: closed a connection: a line passed 16 MiB");
                return Err(MustClose);
            }
        }
    }
}

/// [`take_lines`] for a message the reader owns, `text` when it came as a
/// text message, which must be UTF-8 (RFC 6455, 8.1; [`ws::Reader`] leaves
/// the check to this): a message that is one relay frame and its `\n`,
/// with no partial line before it (what a client sends), is handed on as
/// it is, without a copy, without searching it for `\n` first
/// ([`wire::relay_chan`] takes only a line with no `\n` in it) and without
/// a UTF-8 pass of its own (the scan's answer says it is UTF-8). Anything
/// else is checked whole, then goes through [`take_lines`].
pub fn take_message(
    lines: &mut LineBuffer,
    mut msg: Vec<u8>,
    text: bool,
    outbox: &Outbox,
    batch: &mut Vec<Frame>,
) -> Result<(), MustClose> {
    if lines.pending() == 0
        && let Some(body) = msg.strip_suffix(b"\n")
    {
        let line = body.strip_suffix(b"\r").unwrap_or(body);
        if let Some(chan) = wire::relay_chan(line) {
            let chan = chan.to_string();
            msg.truncate(line.len());
            batch.push(Frame::Relay { chan, line: msg });
            return Ok(());
        }
    }
    if text && std::str::from_utf8(&msg).is_err() {
        crate::debug!("gateway: closed a connection that sent a text message that is not UTF-8");
        return Err(MustClose);
    }
    take_lines(lines, &msg, outbox, batch)
}

/// Answers `line` here, or puts its frame into `batch`.
fn sort(line: Vec<u8>, outbox: &Outbox, batch: &mut Vec<Frame>) -> Result<(), MustClose> {
    if let Some(chan) = wire::relay_chan(&line) {
        let chan = chan.to_string();
        batch.push(Frame::Relay { chan, line });
        return Ok(());
    }
    match wire::classify(line) {
        // "The peer answers it directly, before any dispatch rule" (seed
        // 004, Keepalive).
        Frame::Ping { id } => outbox
            .line(wire::reply(&id, &serde_json::Value::Null))
            .map_err(|_| MustClose)?,
        Frame::Refused(answer) => outbox.line(answer).map_err(|_| MustClose)?,
        Frame::Notification | Frame::Unroutable => {}
        f => batch.push(f),
    }
    Ok(())
}

/// The gateway thread has stopped: the connection ends.
#[derive(Debug)]
pub struct Stopped;

/// Hands on the frames of one message, taken out of `batch` (whose room
/// the reader keeps for the next): relay frames straight to their
/// channel's other side ([`relay`]), then the rest to the gateway thread in
/// one batch, then what the forwarding found wrong. A relay frame is thus
/// handed on before a request that came before it in the same message,
/// which changes nothing a peer can tell: a request the gateway serves
/// (`relay.close` above all) only ever acts on frames that come after it.
pub fn dispatch(
    conn: u64,
    batch: &mut Vec<Frame>,
    relay: &relay::Table,
    to_state: &Sender<ToState>,
) -> Result<(), Stopped> {
    let mut rest = Vec::new();
    let mut trouble = Vec::new();
    if batch.iter().any(|f| matches!(f, Frame::Relay { .. })) {
        let mut frames = batch.drain(..);
        let relays = std::iter::from_fn(|| {
            loop {
                match frames.next()? {
                    Frame::Relay { chan, line } => return Some((chan, line)),
                    f => rest.push(f),
                }
            }
        });
        relay.forward(conn, relays, &mut trouble);
    } else {
        rest.append(batch);
    }
    batch.shrink_to(limits::GATEWAY_BATCH_KEPT);
    if !rest.is_empty() {
        to_state
            .send(ToState::Frames { conn, frames: rest })
            .map_err(|_| Stopped)?;
    }
    for t in trouble {
        let msg = match t {
            Trouble::Overflow(chan) => ToState::Overflow { chan },
            Trouble::Full(conn) => ToState::Closed { conn },
        };
        to_state.send(msg).map_err(|_| Stopped)?;
    }
    Ok(())
}

/// Reads the connection's messages and hands on their frames. Relay
/// frames of the messages already read are gathered while the next
/// message is whole in the read buffer ([`ws::Reader::ready`]), and
/// handed on together: a burst of small frames then takes the channel
/// table's lock and wakes the other side's writer once, not once a frame.
/// It never waits on the socket with frames not handed on.
fn read_loop(tcp: &mut TcpStream, conn: u64, outbox: &Outbox, shared: &Shared) {
    let mut reader = ws::Reader::new(limits::GATEWAY_READ_BUFFER, limits::GATEWAY_MAX_MESSAGE);
    let mut lines = LineBuffer::new(limits::GATEWAY_MAX_LINE);
    let mut batch = Vec::new();
    loop {
        let ok = match reader.next(tcp) {
            Ok(ws::Event::Message { bytes, text }) => {
                take_message(&mut lines, bytes, text, outbox, &mut batch).is_ok()
            }
            Ok(ws::Event::Ping(p)) => outbox.push(Out::Raw(ws::control(0xA, &p))).is_ok(),
            Ok(ws::Event::Pong) => true,
            Ok(ws::Event::Close(p)) => {
                // The reply echoes the status code (RFC 6455, 5.5.1).
                let code = if p.len() >= 2 { &p[..2] } else { &[][..] };
                let _ = outbox.push(Out::Raw(ws::control(0x8, code)));
                false
            }
            Err(e) => {
                if let ws::WsError::Protocol(what) = e {
                    crate::debug!("gateway: closed a connection that sent {what}");
                }
                false
            }
        };
        if !batch.is_empty()
            && (!ok || !reader.ready())
            && dispatch(conn, &mut batch, &shared.relay, &shared.to_state).is_err()
        {
            return;
        }
        if !ok {
            return;
        }
    }
}

/// Writes every slice before `deadline`, or fails.
fn write_all_before(
    tcp: &mut TcpStream,
    mut bufs: &mut [IoSlice<'_>],
    deadline: Instant,
) -> io::Result<()> {
    while !bufs.is_empty() {
        if Instant::now() > deadline {
            return Err(io::ErrorKind::TimedOut.into());
        }
        match tcp.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The writer: what is queued goes out in order, runs of lines as one
/// text message each (written with one `writev`, no copy), the reader's
/// control frames between them as they are. It holds the socket while it
/// writes, finishes first what a direct write left, and lowers `len` for
/// what it took only once that is written.
pub fn write_loop(
    socket: &Mutex<Socket>,
    rx: outq::Receiver<Out>,
    len: Arc<AtomicUsize>,
    limit: Duration,
) {
    let mut run: Vec<Out> = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut sock = socket.lock().unwrap_or_else(|p| p.into_inner());
        let Socket { tcp, rest } = &mut *sock;
        let mut failed = !rest.is_empty()
            && write_all_before(tcp, &mut [IoSlice::new(rest)], Instant::now() + limit).is_err();
        rest.clear();
        let mut next = Some(first);
        let mut bytes = 0;
        let mut taken = 0;
        while let Some(out) = next.take() {
            taken += 1;
            if failed {
                break;
            }
            match &out {
                Out::Raw(raw) => {
                    failed = write_run(tcp, &mut run, limit).is_err()
                        || write_all_before(tcp, &mut [IoSlice::new(raw)], Instant::now() + limit)
                            .is_err();
                }
                // Its work, writing what a direct write left, is done above.
                Out::Wake => {}
                Out::Line(..) | Out::Relay(..) => {
                    bytes += out.wire_len();
                    run.push(out);
                }
            }
            if failed
                || bytes >= limits::GATEWAY_WRITE_BATCH
                || run.len() >= limits::GATEWAY_WRITE_BATCH_FRAMES
            {
                break;
            }
            next = rx.try_recv();
        }
        if !failed {
            failed = write_run(tcp, &mut run, limit).is_err();
        }
        len.fetch_sub(taken, Ordering::AcqRel);
        if failed {
            crate::debug!("gateway: closed a connection that did not take a frame in time");
            let _ = tcp.shutdown(Shutdown::Both);
            return;
        }
    }
}

/// Writes `run` as one text message and empties it.
fn write_run(tcp: &mut TcpStream, run: &mut Vec<Out>, limit: Duration) -> io::Result<()> {
    if run.is_empty() {
        return Ok(());
    }
    let total = run.iter().map(Out::wire_len).sum();
    let (h, n) = ws::header(0x1, total);
    let mut slices = Vec::with_capacity(1 + 2 * run.len());
    slices.push(IoSlice::new(&h[..n]));
    for o in run.iter() {
        match o {
            Out::Line(b, _) => slices.push(IoSlice::new(b)),
            Out::Relay(b, _) => {
                slices.push(IoSlice::new(b));
                slices.push(IoSlice::new(b"\n"));
            }
            Out::Raw(_) | Out::Wake => {}
        }
    }
    let r = write_all_before(tcp, &mut slices, Instant::now() + limit);
    drop(slices);
    for o in run.drain(..) {
        o.written();
    }
    if run.capacity() > limits::GATEWAY_WRITE_BATCH_FRAMES {
        *run = Vec::new();
    }
    r
}

/// Binds the gateway's listening socket.
pub fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr).map_err(|e| {
        format!(
            "unable to listen for the gateway on {addr}: {}",
            crate::errors::io_cause(&e)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_message_must_be_utf8_and_one_relay_frame_passes_whole() {
        let (out, _rx, _) = Outbox::new();
        let mut lines = LineBuffer::new(limits::GATEWAY_MAX_LINE);
        let mut batch = Vec::new();
        let frame = "{\"id\":1,\"route\":{\"chan_id\":\"c1\"},\"body\":\"é\"}";
        let msg = format!("{frame}\r\n").into_bytes();
        let at = msg.as_ptr();
        take_message(&mut lines, msg, true, &out, &mut batch).unwrap();
        match batch.pop() {
            // The message's own buffer, without its line end.
            Some(Frame::Relay { chan, line }) => {
                assert_eq!((chan.as_str(), &line[..]), ("c1", frame.as_bytes()));
                assert_eq!(line.as_ptr(), at);
            }
            f => panic!("{f:?}"),
        }
        // Not UTF-8: in a relay frame's body, or anywhere else, the
        // connection closes; a binary message is not held to it.
        let bad_relay = b"{\"route\":{\"chan_id\":\"c1\"},\"body\":\"\xC3(\"}\n".to_vec();
        let bad_other = b"{\"id\":1,\"method\":\"\xC3(\"}\n".to_vec();
        for m in [bad_relay.clone(), bad_other] {
            assert!(take_message(&mut lines, m, true, &out, &mut batch).is_err());
        }
        assert!(take_message(&mut lines, bad_relay, false, &out, &mut batch).is_ok());
        batch.clear();
        // Two frames in one message, and one cut across messages.
        let two = format!("{frame}\n{frame}\n{}", &frame[..9]).into_bytes();
        take_message(&mut lines, two, true, &out, &mut batch).unwrap();
        take_message(
            &mut lines,
            frame.as_bytes()[9..].to_vec(),
            true,
            &out,
            &mut batch,
        )
        .unwrap();
        assert_eq!(batch.len(), 2);
        take_message(&mut lines, b"\n".to_vec(), true, &out, &mut batch).unwrap();
        assert_eq!(batch.len(), 3);
        assert!(
            batch
                .iter()
                .all(|f| matches!(f, Frame::Relay { line, .. } if line == frame.as_bytes()))
        );
    }

    /// Direct writes and queued frames interleave on a socket that keeps
    /// filling (writes taken in part, finished by the writer) and the
    /// peer still reads every line once, in order.
    #[test]
    fn direct_writes_keep_the_order_of_queued_frames() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (tcp, _) = l.accept().unwrap();
        let (out, rx, len, socket) = Outbox::with_socket(tcp);
        let writer = std::thread::spawn(move || {
            write_loop(&socket, rx, len, Duration::from_secs(30));
        });
        const N: usize = 4000;
        let reader = std::thread::spawn(move || {
            let mut peer = peer;
            let mut got = Vec::new();
            let mut text = Vec::new();
            while got.len() < N {
                let mut h = [0u8; 2];
                peer.read_exact(&mut h).unwrap();
                assert_eq!(h[0], 0x81);
                let n = match h[1] {
                    126 => {
                        let mut l = [0u8; 2];
                        peer.read_exact(&mut l).unwrap();
                        u16::from_be_bytes(l) as usize
                    }
                    127 => {
                        let mut l = [0u8; 8];
                        peer.read_exact(&mut l).unwrap();
                        u64::from_be_bytes(l) as usize
                    }
                    n => n as usize,
                };
                let mut p = vec![0; n];
                peer.read_exact(&mut p).unwrap();
                text.extend(p);
                while let Some(i) = text.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = text.drain(..=i).collect();
                    got.push(String::from_utf8(line).unwrap());
                }
            }
            got
        });
        let q = Arc::new(Queued::default());
        let pad = "x".repeat(2000);
        let (mut direct, mut queued) = (0, 0);
        // The first frame finds nothing queued, the writer waiting and an
        // empty socket: it is written directly whatever the scheduling.
        // Every seventh after it is queued; the others are tried directly
        // and queued when the writer is busy or the socket full.
        for i in 0..N {
            let line = format!("{i} {pad}").into_bytes();
            if i % 7 != 1 && out.try_direct(std::slice::from_ref(&line)) == Direct::Sent {
                direct += 1;
                continue;
            }
            queued += 1;
            q.frames.fetch_add(1, Ordering::AcqRel);
            q.bytes.fetch_add(line.len(), Ordering::AcqRel);
            out.push(Out::Relay(line, q.clone())).unwrap();
        }
        let got = reader.join().unwrap();
        for (i, l) in got.iter().enumerate() {
            assert_eq!(l, &format!("{i} {pad}\n"));
        }
        assert!(direct > 0 && queued > 0);
        drop(out);
        writer.join().unwrap();
        assert_eq!(q.frames.load(Ordering::Acquire), 0);
    }

    /// Shrinks a socket's send buffer, so that a write of a few KiB is
    /// taken only in part.
    fn small_send_buffer(tcp: &TcpStream) {
        use std::os::fd::AsRawFd;
        let size: libc::c_int = 4096;
        // SAFETY: the descriptor is the one `tcp` owns, open while it is
        // borrowed; the option value is a live c_int of the length given.
        let r = unsafe {
            libc::setsockopt(
                tcp.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0);
    }

    /// A direct write the socket takes only in part is finished by the
    /// writer, and the connection stays open for the frames after it.
    #[test]
    fn a_direct_write_taken_in_part_is_finished_and_the_connection_kept() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (tcp, _) = l.accept().unwrap();
        small_send_buffer(&tcp);
        let (out, rx, len, socket) = Outbox::with_socket(tcp);
        let writer = std::thread::spawn(move || {
            write_loop(&socket, rx, len, Duration::from_secs(30));
        });
        // The largest direct write: far more than the send buffer and the
        // peer's receive buffer take while the peer does not read.
        let big = vec![b'x'; limits::GATEWAY_DIRECT_WRITE - 1];
        assert_eq!(out.try_direct(std::slice::from_ref(&big)), Direct::Sent);
        let mut got = vec![0u8; 10 + big.len() + 1];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got[..2], &[0x81, 127]);
        assert!(got[10..10 + big.len()].iter().all(|&b| b == b'x'));
        assert_eq!(got[10 + big.len()], b'\n');
        // The connection is still open: a line queued after it comes too.
        out.line(b"next\n".to_vec()).unwrap();
        let mut next = [0u8; 7];
        peer.read_exact(&mut next).unwrap();
        assert_eq!(&next, b"\x81\x05next\n");
        drop(out);
        writer.join().unwrap();
    }

    #[test]
    fn tokens_in_the_query_are_percent_decoded() {
        assert_eq!(percent_decode("a%2Fb+c"), "a/b c");
    }
}
