//! The gateway role (seed 004, "Overview", "Wire format", "Connecting a
//! client", "Pairing a new device", "Relay channels"; issue 12): WebSocket
//! routes `/node` and `/client`, the roster, relay channels it forwards
//! without reading them, pairing and client tokens, and the trust log's
//! distribution (seed 004, Locked mode › Distribution; issue 14,
//! [`trust`]).
//!
//! Where it runs: in the node (`[gateway] listen`, `serve --gateway ADDR`)
//! or alone (`omniconfluxd gateway --listen ADDR`, [`standalone`]). Either
//! way it is the same [`Gateway`]: its own threads, never the node's
//! reactor, so relay traffic does not touch the node's state:
//!
//! - `gateway`, the one owner of the roster, channels, pairings and paired
//!   devices ([`state`]); relay frames do not pass through it: readers
//!   forward them through the channel table it keeps ([`relay`]);
//! - `gw-accept`, and per WebSocket connection a reader and a writer
//!   thread ([`conn`]), at most `gateway.max_connections` connections;
//! - the operator's requests (`clients.*` for `omniconfluxd pair` and
//!   `omniconfluxd clients`, `server.info`) enter through [`Caller::call`]
//!   from the node's socket or the standalone gateway's own socket, as an
//!   admin caller.
//!
//! The node link (for issue 13). A node that runs its own gateway joins its
//! roster without dialing: [`Gateway::attach_node`] returns a [`NodeLink`],
//! a typed in-process uplink. The gateway treats it exactly as a `/node`
//! connection: it sends `node.identify` down the link, takes the answer as
//! the node's descriptor, forwards relay frames both ways and sends
//! `relay.closed`. The node side writes lines with [`NodeLink::send`] and
//! reads lines with [`NodeLink::recv`]; dropping the link is the uplink
//! closing, and the gateway closing the link (on stop, or when a second
//! uplink with the node's id replaces it) makes `recv` end.

pub mod conn;
pub mod in_node;
pub mod outq;
pub mod relay;
pub mod standalone;
pub mod state;
pub mod tokens;
pub mod trust;
pub mod wire;
pub mod ws;

use crossbeam_channel::{Sender, bounded};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::GatewaySection;
use crate::limits;
use conn::{Closer, Out, Outbox, Shared};
use state::{LocalReply, Role, ToState};
pub use wire::GwError;

/// A running gateway.
pub struct Gateway {
    addr: SocketAddr,
    shared: Arc<Shared>,
    state: Option<JoinHandle<()>>,
    accept: Option<JoinHandle<()>>,
}

impl Gateway {
    /// Binds `addr`, loads the paired devices from `store` and starts the
    /// gateway's threads.
    pub fn start(
        cfg: &GatewaySection,
        addr: SocketAddr,
        master: tokens::Digest,
        store: tokens::Store,
    ) -> Result<Gateway, String> {
        let paired = store.load()?;
        let listener = conn::bind(addr)?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("unable to read the gateway's address: {e}"))?;
        let (tx, rx) = bounded(limits::GATEWAY_INBOX);
        let relay = Arc::new(relay::Table::default());
        let shared = Arc::new(Shared {
            to_state: tx,
            relay: relay.clone(),
            live: AtomicUsize::new(0),
            max: cfg.max_connections,
            write_timeout: Duration::from_millis(cfg.write_timeout_ms),
            next_conn: Arc::new(AtomicU64::new(1)),
            stopping: AtomicBool::new(false),
            handshaking: Default::default(),
        });
        let setup = state::Setup {
            master,
            store,
            public_url: cfg.public_url.clone(),
            started_at: crate::clock::now_ts(),
            relay,
        };
        let state = std::thread::Builder::new()
            .name("gateway".into())
            .spawn(move || state::run(setup, paired, rx))
            .map_err(|e| format!("unable to start the gateway thread: {e}"))?;
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("gw-accept".into())
            .spawn(move || conn::accept_loop(listener, s))
            .map_err(|e| format!("unable to start the gateway's accept thread: {e}"))?;
        Ok(Gateway {
            addr,
            shared,
            state: Some(state),
            accept: Some(accept),
        })
    }

    /// The address bound (port 0 in the config picks a free one).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle for the operator's requests, for another thread.
    pub fn caller(&self) -> Caller {
        Caller(self.shared.to_state.clone())
    }

    /// Attaches an in-process node to the roster (module comment).
    pub fn attach_node(&self) -> Result<NodeLink, String> {
        let (out, rx, len) = Outbox::new();
        let closed = Arc::new(AtomicBool::new(false));
        let conn = self.shared.next_conn.fetch_add(1, Ordering::AcqRel);
        self.shared
            .to_state
            .send(ToState::Open {
                conn,
                role: Role::Node,
                out: out.clone(),
                closer: Closer::Link(closed.clone(), out.clone()),
                peer: None,
            })
            .map_err(|_| "the gateway has stopped".to_string())?;
        Ok(NodeLink {
            conn,
            closed,
            to_state: self.shared.to_state.clone(),
            rx,
            len,
            tx: LinkSender {
                conn,
                to_state: self.shared.to_state.clone(),
                relay: self.shared.relay.clone(),
                out,
                lines: crate::socket::framing::LineBuffer::new(limits::GATEWAY_MAX_LINE),
            },
        })
    }

    /// Stops accepting and closes every connection. With `wait`, returns
    /// once the gateway thread is done; without, it finishes on its own
    /// (the node's reactor calls this, and the gateway thread may be
    /// handing it a last answer through the reactor's queue).
    pub fn stop(mut self, wait: bool) {
        self.shared.stopping.store(true, Ordering::Release);
        if wait {
            let _ = self.shared.to_state.send(ToState::Stop);
        } else if self.shared.to_state.try_send(ToState::Stop).is_err() {
            // Its queue is full: the gateway thread may itself be waiting
            // for the caller's queue, so do not wait here; the process
            // is about to exit, which closes every connection anyway.
            crate::warn!("gateway: its queue is full at stop; leaving it to the exit");
        }
        // Wake the blocking accept with a connection of our own; join it
        // only if that worked.
        let wake = match self.addr {
            SocketAddr::V4(a) if a.ip().is_unspecified() => {
                SocketAddr::from(([127, 0, 0, 1], a.port()))
            }
            SocketAddr::V6(a) if a.ip().is_unspecified() => {
                SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, a.port()))
            }
            a => a,
        };
        let woken = std::net::TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok();
        if let Some(t) = self.accept.take()
            && woken
        {
            let _ = t.join();
        }
        if let Some(t) = self.state.take()
            && wait
        {
            let _ = t.join();
        }
    }
}

/// Sends the operator's requests (admin) to the gateway thread.
#[derive(Clone)]
pub struct Caller(Sender<ToState>);

impl Caller {
    /// `reply` runs on the gateway thread, at once or, for
    /// `clients.pairAwait`, when the device connects or the wait ends.
    pub fn call(&self, method: &str, params: Value, reply: LocalReply) {
        let msg = ToState::Local {
            method: method.to_string(),
            params,
            reply,
        };
        if let Err(e) = self.0.try_send(msg)
            && let ToState::Local { reply, .. } = e.into_inner()
        {
            reply(Err(GwError::refused(
                "busy",
                "the gateway's queue is full; try again",
            )));
        }
    }
}

/// A node attached in-process (module comment).
pub struct NodeLink {
    conn: u64,
    closed: Arc<AtomicBool>,
    to_state: Sender<ToState>,
    rx: outq::Receiver<Out>,
    len: Arc<AtomicUsize>,
    /// The node's side of the stream, as a reader thread is for a
    /// WebSocket.
    tx: LinkSender,
}

impl NodeLink {
    /// Sends bytes of the node's stream (lines ending in `\n`). `Err` when
    /// the gateway closed the link.
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.tx.send(bytes)
    }

    /// The next line from the gateway, `\n` included; `None` once the
    /// gateway closed the link, or after `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.closed.load(Ordering::Acquire) {
                return None;
            }
            let out = self
                .rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))?;
            self.len.fetch_sub(1, Ordering::AcqRel);
            if self.closed.load(Ordering::Acquire) {
                return None;
            }
            out.written();
            match out {
                Out::Line(line, _) | Out::Raw(line) => return Some(line),
                Out::Relay(mut line, _) => {
                    line.push(b'\n');
                    return Some(line);
                }
                // A wake-up carries nothing; the close it wakes for is
                // seen above.
                Out::Wake => {}
            }
        }
    }
}

impl NodeLink {
    /// A second handle that sends on this link, for a writer thread of its
    /// own while another thread waits in [`NodeLink::recv`] (the uplink,
    /// issue 13): both ends of the link then work without polling.
    pub fn sender(&self) -> LinkSender {
        LinkSender {
            conn: self.conn,
            to_state: self.to_state.clone(),
            relay: self.tx.relay.clone(),
            out: self.tx.out.clone(),
            lines: crate::socket::framing::LineBuffer::new(limits::GATEWAY_MAX_LINE),
        }
    }

    /// Whether the gateway closed the link: `recv` answering `None` for
    /// this reason rather than its timeout.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// Sends on a [`NodeLink`] from another thread ([`NodeLink::sender`]).
/// Relay frames go straight to the client's writer through the channel
/// table, the rest to the gateway thread, as a connection's reader does.
pub struct LinkSender {
    conn: u64,
    to_state: Sender<ToState>,
    relay: Arc<relay::Table>,
    /// Where `ping` and lines that are no frame are answered.
    out: Outbox,
    lines: crate::socket::framing::LineBuffer,
}

impl LinkSender {
    /// As [`NodeLink::send`].
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        let mut batch = Vec::new();
        let ok = conn::take_lines(&mut self.lines, bytes, &self.out, &mut batch);
        if !batch.is_empty() {
            conn::dispatch(self.conn, &mut batch, &self.relay, &self.to_state)
                .map_err(|conn::Stopped| "the gateway has stopped".to_string())?;
        }
        ok.map_err(|_| "the gateway closed the node link".to_string())
    }
}

impl Drop for NodeLink {
    fn drop(&mut self) {
        let _ = self.to_state.send(ToState::Closed { conn: self.conn });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::net::TcpStream;
    use tungstenite::client::IntoClientRequest;

    fn line(v: &Value) -> Vec<u8> {
        let mut l = serde_json::to_vec(v).unwrap();
        l.push(b'\n');
        l
    }

    fn next_json(ws: &mut tungstenite::WebSocket<TcpStream>) -> Value {
        loop {
            if let tungstenite::Message::Text(t) = ws.read().unwrap() {
                return serde_json::from_str(t.as_str().trim_end()).unwrap();
            }
        }
    }

    #[test]
    fn a_node_link_joins_the_roster_without_dialing() {
        let dir = crate::testutil::TempDir::new("gw-link");
        let store = tokens::Store::open(&dir.path().join("g.sqlite3"), true).unwrap();
        let cfg = GatewaySection::default();
        let gw = Gateway::start(
            &cfg,
            "127.0.0.1:0".parse().unwrap(),
            tokens::sha256(b"m"),
            store,
        )
        .unwrap();
        let wait = Duration::from_secs(30);
        let mut link = gw.attach_node().unwrap();
        let ask: Value = serde_json::from_slice(&link.recv(wait).unwrap()).unwrap();
        assert_eq!(ask["method"], "node.identify");
        let ident = json!({"id": "local", "label": "l", "version": "1", "capabilities": {}});
        link.send(&line(
            &json!({"jsonrpc": "2.0", "id": ask["id"], "result": ident}),
        ))
        .unwrap();
        // `ping` on the link is answered on the link.
        link.send(b"{\"jsonrpc\":\"2.0\",\"id\":\"p\",\"method\":\"ping\"}\n")
            .unwrap();
        let pong: Value = serde_json::from_slice(&link.recv(wait).unwrap()).unwrap();
        assert_eq!(pong["id"], "p");

        let mut req = format!("ws://{}/client", gw.addr())
            .into_client_request()
            .unwrap();
        req.headers_mut()
            .insert("authorization", "Bearer m".parse().unwrap());
        let tcp = TcpStream::connect(gw.addr()).unwrap();
        tcp.set_read_timeout(Some(wait)).unwrap();
        let (mut ws, _) = tungstenite::client::client(req, tcp).unwrap();
        let added = next_json(&mut ws);
        assert_eq!(added["params"]["node"]["id"], "local");
        ws.send(tungstenite::Message::text(
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"relay.open\",\"params\":{\"node_id\":\"local\"}}\n",
        ))
        .unwrap();
        let chan = next_json(&mut ws)["result"]["chan_id"].clone();
        let frame = json!({"jsonrpc":"2.0","id":5,"method":"m","route":{"chan_id":chan},"body":""});
        ws.send(tungstenite::Message::text(format!("{frame}\n")))
            .unwrap();
        let got: Value = serde_json::from_slice(&link.recv(wait).unwrap()).unwrap();
        assert_eq!(got, frame);
        let back = json!({"jsonrpc":"2.0","id":5,"route":{"chan_id":chan},"body":"e30="});
        link.send(&line(&back)).unwrap();
        assert_eq!(next_json(&mut ws), back);
        // The gateway stopping ends the link.
        gw.stop(true);
        assert!(link.recv(wait).is_none());
    }
}
