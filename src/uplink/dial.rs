//! Dialing the gateway (`[uplink] url`; seed 004, "Transports",
//! "Authentication", "Framing", "Keepalive", "Reconnect"; issue 13).
//!
//! The bytes travel over TCP (`ws://`), TLS over TCP (`wss://`, [`super::tls`]),
//! or through `ssh -W
//! 127.0.0.1:PORT DEST` (`ssh://`, issue 13: the gateway listens on the
//! SSH server's loopback), whose stdin and stdout are the stream. ssh runs
//! with `BatchMode` (no prompt: keys or an agent only) and server alive
//! checks; the `uplink` thread that started it kills and reaps it when the
//! connection ends. `ssh` is looked up on the daemon's PATH.
//!
//! Threads, all blocking, none the reactor's:
//! - `uplink` dials `ws://host[:port][/base]/node` with the master token in
//!   `Authorization: Bearer`, then becomes the connection's reader: it
//!   splits the text messages, taken as one byte stream, on `\n`, answers
//!   `ping` itself and hands every other line to the reactor. After a close
//!   or a failed dial it waits 500 ms, doubling to 15 s, and dials again;
//!   a connection that was up starts the wait again at 500 ms.
//! - `uplink-write`, one per connection, is the only thread that writes to
//!   the socket: the reactor's lines, and the pongs and close replies that
//!   tungstenite makes while reading (they reach it through the same
//!   queue). It sends a `ping` every 15 s; the reader closes a connection
//!   it heard nothing on for two pings and the ping timeout.

use crossbeam_channel::{Receiver, Sender, bounded, select};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tungstenite::Message;
use tungstenite::client::IntoClientRequest;
use tungstenite::protocol::{Role, WebSocketConfig};

use super::{Event, Out};
use crate::config::{UplinkUrl, UplinkVia};
use crate::limits;
use crate::reactor::Inbox;
use crate::socket::framing::LineBuffer;

/// The dialing thread, for the stop.
pub struct Dialer {
    stop: Option<Sender<()>>,
    current: Arc<Mutex<Option<Closer>>>,
}

/// Ends a connection from another thread: shuts the socket down, or kills
/// ssh.
#[derive(Clone)]
pub enum Closer {
    Tcp(Arc<TcpStream>),
    Ssh(Arc<Mutex<Child>>),
}

impl Closer {
    pub fn close(&self) {
        match self {
            Closer::Tcp(t) => {
                let _ = t.shutdown(Shutdown::Both);
            }
            Closer::Ssh(c) => {
                if let Ok(mut c) = c.lock() {
                    let _ = c.kill();
                }
            }
        }
    }
}

impl Dialer {
    /// Ends the dialing: the wait between dials ends, and the connection of
    /// the moment is shut down, which ends its reader and writer. Does not
    /// wait for them: a dial under way ends within `UPLINK_CONNECT_MS`.
    pub fn stop(mut self) {
        self.stop.take();
        if let Ok(mut cur) = self.current.lock()
            && let Some(c) = cur.take()
        {
            c.close();
        }
    }
}

/// Starts dialing `target`.
pub fn start(
    target: UplinkUrl,
    token: String,
    tls: Option<Arc<rustls::ClientConfig>>,
    inbox: Inbox,
    links: Arc<AtomicU64>,
) -> Result<Dialer, String> {
    let (stop_tx, stop_rx) = bounded::<()>(0);
    let current = Arc::new(Mutex::new(None));
    let cur = current.clone();
    std::thread::Builder::new()
        .name("uplink".into())
        .spawn(move || {
            let to = Target {
                url: target,
                token,
                tls,
            };
            dial_loop(&to, &inbox, &links, &stop_rx, &cur)
        })
        .map_err(|e| format!("unable to start the uplink thread: {e}"))?;
    Ok(Dialer {
        stop: Some(stop_tx),
        current,
    })
}

fn stopped(stop: &Receiver<()>) -> bool {
    matches!(
        stop.try_recv(),
        Err(crossbeam_channel::TryRecvError::Disconnected)
    )
}

/// Where and how to dial.
struct Target {
    url: UplinkUrl,
    token: String,
    tls: Option<Arc<rustls::ClientConfig>>,
}

fn dial_loop(
    target: &Target,
    inbox: &Inbox,
    links: &AtomicU64,
    stop: &Receiver<()>,
    current: &Mutex<Option<Closer>>,
) {
    let first = Duration::from_millis(limits::UPLINK_BACKOFF_FIRST_MS);
    let max = Duration::from_millis(limits::UPLINK_BACKOFF_MAX_MS);
    let mut wait = first;
    loop {
        if stopped(stop) {
            return;
        }
        let up = super::Event::Dialing;
        if !inbox.run(move |d| super::on_event(d, up)) {
            return;
        }
        let (link, error) = match connect(target) {
            Ok((ws, wire)) => {
                wait = first;
                let link = links.fetch_add(1, Ordering::AcqRel);
                let why = serve(ws, &wire, link, inbox, current);
                (link, wire.end(why))
            }
            Err(e) => (0, e),
        };
        let down = Event::Down { link, error };
        if !inbox.run(move |d| super::on_event(d, down)) {
            return;
        }
        match stop.recv_timeout(wait) {
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        wait = (wait * 2).min(max);
    }
}

/// The stream tungstenite reads from: writes (the handshake, then pongs
/// and close replies) go to the socket during the handshake and through
/// the writer's queue after it.
struct Side {
    read: Box<dyn Read + Send>,
    /// The stream's writing half until the handshake is done; then the
    /// writer thread has it.
    direct: Option<Box<dyn Write + Send>>,
    out: Option<Sender<Out>>,
}

impl Read for Side {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read.read(buf)
    }
}

impl Write for Side {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(out) = &self.out {
            return match out.try_send(Out::Raw(buf.to_vec())) {
                Ok(()) => Ok(buf.len()),
                Err(_) => Err(io::ErrorKind::BrokenPipe.into()),
            };
        }
        match &mut self.direct {
            Some(w) => w.write(buf),
            None => Err(io::ErrorKind::BrokenPipe.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match (&self.out, &mut self.direct) {
            (None, Some(w)) => w.flush(),
            _ => Ok(()),
        }
    }
}

/// The writing half for the writer thread's WebSocket, which never reads.
pub struct WriteOnly(Box<dyn Write + Send>);

impl Read for WriteOnly {
    fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        Ok(0)
    }
}

impl Write for WriteOnly {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// The stream of one connection, for its end.
struct Wire {
    closer: Closer,
    /// ssh's stderr, read when it failed, for the reason.
    stderr: Option<std::process::ChildStderr>,
}

impl Wire {
    /// Ends the stream and reaps ssh; the reason the connection ended,
    /// with ssh's own last words when it said any.
    fn end(mut self, why: String) -> String {
        self.closer.close();
        let Closer::Ssh(child) = &self.closer else {
            return why;
        };
        if let Ok(mut c) = child.lock() {
            let _ = c.wait();
        }
        let said = self.stderr.take().map(last_words).unwrap_or_default();
        if said.is_empty() {
            why
        } else {
            format!("{why} (ssh: {said})")
        }
    }
}

/// The last line ssh wrote on stderr, at most 4 KiB of it read.
fn last_words(err: std::process::ChildStderr) -> String {
    let mut buf = Vec::new();
    let _ = err.take(4096).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .write_buffer_size(0)
        .max_message_size(Some(limits::GATEWAY_MAX_MESSAGE))
        .max_frame_size(Some(limits::GATEWAY_MAX_MESSAGE))
}

/// Opens the stream and does the WebSocket handshake, within
/// `UPLINK_CONNECT_MS`.
fn connect(to: &Target) -> Result<(tungstenite::WebSocket<Side>, Wire), String> {
    let (target, token) = (&to.url, &to.token);
    let (side, wire) = match &target.via {
        UplinkVia::Tcp { authority } => tcp(authority, None)?,
        UplinkVia::Tls { authority, host } => match &to.tls {
            Some(cfg) => tcp(authority, Some((cfg.clone(), host)))?,
            None => return Err("wss:// without a TLS configuration".into()),
        },
        UplinkVia::Ssh {
            dest,
            ssh_port,
            port,
        } => ssh(dest, *ssh_port, *port)?,
    };
    let mut req = match target.node_url.as_str().into_client_request() {
        Ok(r) => r,
        Err(e) => {
            let why = format!("invalid uplink url {}: {e}", target.node_url);
            return Err(wire.end(why));
        }
    };
    let Ok(bearer) = format!("Bearer {token}").parse() else {
        let why = "the uplink's master token is not a valid header value".to_string();
        return Err(wire.end(why));
    };
    req.headers_mut().insert("authorization", bearer);
    match tungstenite::client::client_with_config(req, side, Some(ws_config())) {
        Ok((ws, _)) => Ok((ws, wire)),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(r))) => {
            Err(wire.end(match r.status().as_u16() {
                401 => "the gateway refused the master token (401 unauthorized)".to_string(),
                s => format!("the gateway answered the handshake with HTTP {s}"),
            }))
        }
        Err(e) => Err(wire.end(format!("the WebSocket handshake failed: {e}"))),
    }
}

fn tcp(
    authority: &str,
    tls: Option<(Arc<rustls::ClientConfig>, &String)>,
) -> Result<(Side, Wire), String> {
    let limit = Duration::from_millis(limits::UPLINK_CONNECT_MS);
    let addrs = authority
        .to_socket_addrs()
        .map_err(|e| format!("unable to resolve {authority}: {e}"))?;
    let mut last = format!("{authority} resolves to no address");
    let mut tcp = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, limit) {
            Ok(t) => {
                tcp = Some(t);
                break;
            }
            Err(e) => last = format!("unable to connect to {a}: {}", crate::errors::io_cause(&e)),
        }
    }
    let tcp = tcp.ok_or(last)?;
    let _ = tcp.set_nodelay(true);
    let _ = tcp.set_read_timeout(Some(limit));
    let _ = tcp.set_write_timeout(Some(limit));
    let clone = |t: &TcpStream| {
        t.try_clone()
            .map_err(|e| format!("unable to share the uplink's socket: {e}"))
    };
    let closer = Closer::Tcp(Arc::new(clone(&tcp)?));
    let side = match tls {
        None => Side {
            read: Box::new(clone(&tcp)?),
            direct: Some(Box::new(tcp)),
            out: None,
        },
        Some((cfg, host)) => {
            let (r, w) = super::tls::connect(cfg, host, tcp)?;
            Side {
                read: Box::new(r),
                direct: Some(Box::new(w)),
                out: None,
            }
        }
    };
    let wire = Wire {
        closer,
        stderr: None,
    };
    Ok((side, wire))
}

fn ssh(dest: &str, ssh_port: Option<u16>, port: u16) -> Result<(Side, Wire), String> {
    let mut cmd = std::process::Command::new("ssh");
    cmd.args([
        "-T",
        "-o",
        "BatchMode=yes",
        "-o",
        "ExitOnForwardFailure=yes",
    ])
    .arg("-o")
    .arg(format!(
        "ConnectTimeout={}",
        limits::UPLINK_CONNECT_MS / 1000
    ))
    .arg("-o")
    .arg(format!(
        "ServerAliveInterval={}",
        limits::UPLINK_PING_MS / 1000
    ))
    .args(["-o", "ServerAliveCountMax=2"]);
    if let Some(p) = ssh_port {
        cmd.arg("-p").arg(p.to_string());
    }
    cmd.arg("-W")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--")
        .arg(dest)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("unable to run ssh: {}", crate::errors::io_cause(&e)))?;
    let (Some(stdin), Some(stdout), stderr) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        let _ = child.wait();
        return Err("unable to talk to ssh through its pipes".into());
    };
    let side = Side {
        read: Box::new(stdout),
        direct: Some(Box::new(stdin)),
        out: None,
    };
    let wire = Wire {
        closer: Closer::Ssh(Arc::new(Mutex::new(child))),
        stderr,
    };
    Ok((side, wire))
}

/// Serves one connection until it ends; returns why it ended.
fn serve(
    mut ws: tungstenite::WebSocket<Side>,
    wire: &Wire,
    link: u64,
    inbox: &Inbox,
    current: &Mutex<Option<Closer>>,
) -> String {
    let Some(direct) = ws.get_mut().direct.take() else {
        return "the uplink's stream has no writing half".into();
    };
    let (tx, rx) = bounded::<Out>(limits::UPLINK_OUTBOX_FRAMES);
    let (quit_tx, quit_rx) = bounded::<()>(0);
    if let Closer::Tcp(t) = &wire.closer {
        let _ = t.set_write_timeout(Some(Duration::from_millis(limits::UPLINK_WRITE_TIMEOUT_MS)));
        // Wakes the reader to notice a gateway that went silent; through
        // ssh, its server alive checks do that.
        let _ = t.set_read_timeout(Some(Duration::from_millis(limits::UPLINK_PING_TIMEOUT_MS)));
    }
    let closer = wire.closer.clone();
    let writer = std::thread::Builder::new()
        .name("uplink-write".into())
        .spawn(move || write_loop(direct, rx, quit_rx, closer));
    let Ok(writer) = writer else {
        return "unable to start the uplink's writer thread".into();
    };
    ws.get_mut().out = Some(tx.clone());
    if let Ok(mut cur) = current.lock() {
        *cur = Some(wire.closer.clone());
    }
    let up = Event::Up {
        link,
        out: tx.clone(),
        closer: Some(wire.closer.clone()),
    };
    let why = if inbox.run(move |d| super::on_event(d, up)) {
        read_loop(&mut ws, link, &tx, inbox)
    } else {
        "the daemon is stopping".into()
    };
    wire.closer.close();
    drop(quit_tx);
    let _ = writer.join();
    if let Ok(mut cur) = current.lock() {
        cur.take();
    }
    why
}

fn read_loop(
    ws: &mut tungstenite::WebSocket<Side>,
    link: u64,
    out: &Sender<Out>,
    inbox: &Inbox,
) -> String {
    let silent = Duration::from_millis(2 * limits::UPLINK_PING_MS + limits::UPLINK_PING_TIMEOUT_MS);
    let mut heard = Instant::now();
    let mut lines = LineBuffer::new(limits::GATEWAY_MAX_LINE);
    loop {
        let msg = match ws.read() {
            Ok(m) => m,
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if heard.elapsed() > silent {
                    return format!("the gateway sent nothing for {} s", silent.as_secs());
                }
                continue;
            }
            Err(tungstenite::Error::ConnectionClosed) => {
                return "the gateway closed the connection".into();
            }
            Err(e) => return format!("the connection failed: {e}"),
        };
        heard = Instant::now();
        let bytes: &[u8] = match &msg {
            Message::Text(t) => t.as_bytes(),
            Message::Binary(b) => b,
            Message::Close(_) => {
                let _ = ws.flush();
                return "the gateway closed the connection".into();
            }
            _ => continue,
        };
        lines.extend(bytes);
        let mut batch = Vec::new();
        loop {
            match lines.next_line() {
                Ok(Some(l)) => {
                    if let Some(pong) = answer_ping(&l) {
                        if out.try_send(Out::Line(pong)).is_err() {
                            return "the uplink's writer does not keep up".into();
                        }
                    } else {
                        batch.push(l);
                    }
                }
                Ok(None) => break,
                Err(_) => return "the gateway sent a line longer than 16 MiB".into(),
            }
        }
        if !batch.is_empty() {
            let ev = Event::Lines { link, lines: batch };
            if !inbox.run(move |d| super::on_event(d, ev)) {
                return "the daemon is stopping".into();
            }
        }
    }
}

/// The answer to a `ping` request: "The peer answers it directly, before
/// any dispatch rule" (seed 004, Keepalive).
fn answer_ping(line: &[u8]) -> Option<Vec<u8>> {
    // Cheap test first: most lines are relay frames.
    if !line.windows(6).any(|w| w == b"\"ping\"") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(line).ok()?;
    if v.get("method")? != "ping" || v.get("route").is_some() {
        return None;
    }
    let id = v.get("id")?;
    let mut out =
        serde_json::to_vec(&serde_json::json!({"jsonrpc": "2.0", "id": id, "result": null}))
            .ok()?;
    out.push(b'\n');
    Some(out)
}

/// The writer: the queued lines as text messages, raw bytes as they are,
/// and a `ping` whenever the interval passes.
fn write_loop(
    direct: Box<dyn Write + Send>,
    rx: Receiver<Out>,
    quit: Receiver<()>,
    closer: Closer,
) {
    let mut ws =
        tungstenite::WebSocket::from_raw_socket(WriteOnly(direct), Role::Client, Some(ws_config()));
    let every = Duration::from_millis(limits::UPLINK_PING_MS);
    let mut next_ping = Instant::now() + every;
    let mut pings: u64 = 0;
    loop {
        let left = next_ping.saturating_duration_since(Instant::now());
        let ok = select! {
            recv(rx) -> m => match m {
                Ok(Out::Line(first) | Out::Event(first, _)) => {
                    let mut text = first;
                    // Lines already queued go in the same message.
                    while text.len() < limits::GATEWAY_WRITE_BATCH {
                        match rx.try_recv() {
                            Ok(Out::Line(l) | Out::Event(l, _)) => text.extend_from_slice(&l),
                            Ok(Out::Raw(r)) => {
                                if !send_text(&mut ws, text) {
                                    break_out(&closer);
                                    return;
                                }
                                text = Vec::new();
                                if ws.get_mut().write_all(&r).is_err() {
                                    break_out(&closer);
                                    return;
                                }
                            }
                            Err(_) => break,
                        }
                    }
                    text.is_empty() || send_text(&mut ws, text)
                }
                Ok(Out::Raw(r)) => ws.get_mut().write_all(&r).is_ok(),
                Err(_) => return,
            },
            recv(quit) -> _ => return,
            default(left) => {
                pings += 1;
                next_ping = Instant::now() + every;
                let ping = format!("{{\"jsonrpc\":\"2.0\",\"id\":\"uplink-ping-{pings}\",\"method\":\"ping\"}}\n");
                send_text(&mut ws, ping.into_bytes())
            }
        };
        if !ok {
            break_out(&closer);
            return;
        }
    }
}

fn send_text(ws: &mut tungstenite::WebSocket<WriteOnly>, text: Vec<u8>) -> bool {
    let text = match String::from_utf8(text) {
        Ok(t) => t,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    ws.send(Message::text(text)).is_ok()
}

/// A failed write ends the connection: the reader sees the stream end.
fn break_out(closer: &Closer) {
    closer.close();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_ping_request_is_answered_by_the_reader() {
        let pong = answer_ping(br#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&pong).unwrap();
        assert_eq!(v["id"], 3);
        assert!(v["result"].is_null());
        assert!(answer_ping(br#"{"jsonrpc":"2.0","method":"ping"}"#).is_none());
        let relay =
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","route":{"chan_id":"c1"},"body":""}"#;
        assert!(answer_ping(relay).is_none());
    }
}
