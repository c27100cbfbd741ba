//! The gateway thread: the one owner of the roster, the relay channels, the
//! pending pairings and the paired devices (seed 004, "Connecting a
//! client", "Roster events", "Pairing a new device", "Relay channels";
//! issue 12). Connection threads ([`super::conn`]) and the operator's unix
//! sockets talk to it only through one bounded channel ([`ToState`]); it
//! never blocks on a peer: everything it sends goes into bounded outboxes.
//!
//! Roster. A connection on `/node` is asked `node.identify` (within
//! `GATEWAY_IDENTIFY_MS`, or it is closed); its answer is the node's
//! descriptor, with capability keys the gateway does not know carried
//! through unchanged. A new node id is `added`; an id offline for less than
//! 30 s comes back `online`; a disconnect is `offline`, and 30 s later
//! `removed` (the grace is the protocol's, not configurable). A second
//! uplink with the id of a connected one replaces it: the first uplink is
//! closed (`offline`, its channels gone) and the second is `online`, so a
//! client drops its channels and opens new ones, as on any reconnect. An
//! id that is empty or holds `:` (the composite-id separator) is refused
//! by closing the uplink. A client is subscribed, then sent `added` for
//! each roster node (those in the grace window with `online: false`), then
//! every change; at most 64 events wait for a client, past that the event
//! is dropped for it.
//!
//! Channels. `relay.open` gives `c<N>` from one counter (from `c1` at each
//! start). A relay frame is forwarded, as the bytes it came in, only if its
//! `chan_id` exists and the sender holds that side of the channel; any
//! other relay frame is dropped without a reply. This thread opens and
//! closes channels in a table the readers share, and the readers forward
//! relay frames through it themselves ([`super::relay`] has the checks and
//! why). Each direction of a
//! channel has a 64-frame queue (frames handed to the destination's writer
//! and not yet written); a frame that finds it full closes the channel
//! instead of being dropped. A channel closes on `relay.close` by its
//! client, its client's disconnect, its uplink's close, an overflow, and a
//! write failure on either side (which closes that connection); the node
//! gets `relay.closed` unless it is the node that went away; the client
//! gets nothing (it learns from the roster). `relay.close` answers null,
//! also for a channel the caller does not own, which it leaves open.
//!
//! Who may call what. Gateway methods on `/client`: `server.info`,
//! `nodes.list`, `relay.open`, `relay.close`; with the master token
//! (admin) also `clients.*`; `trustlog.sync` ([`super::trust`]);
//! `pushport.setToken` is admin-only and, like `push.vapidKey`, not
//! served yet (-32601).
//! `server.checkUpgrade`, `server.upgrade`, `server.restart` and
//! `server.stop` answer -32601 on the WebSocket routes, as the seed allows.
//! On `/node`: `ping`, `trustlog.sync` and `trustlog.push`; a push that
//! brings new entries sends `trustlog.changed {heads}` to every other
//! uplink and `node.event` `trust-changed` (an empty descriptor) to every
//! client. The operator's unix socket (the node's
//! or the standalone gateway's) is an admin caller ([`ToState::Local`]).
//!
//! Pairing. `clients.pairStart` makes a token pending for 60 s. A device
//! that connects to `/client` with it within that time is stored (its id,
//! never the token) and wakes `clients.pairAwait`, once its WebSocket
//! upgrade has completed: the handshake's token check only admits it, so
//! a device whose handshake then fails is not paired and the token stays
//! pending (a pairing that ends between the check and the upgrade refuses
//! the connection); the pending entry stays
//! until its 60 s end so that an await that comes after the device still
//! answers `connected: true`. An await for an unknown or expired token, a
//! second await of one token, and an await that reaches the 60 s end all
//! answer `connected: false`. Removing a device also closes its open
//! connections.

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::conn::{Closer, Out, Outbox, Queued};
use super::tokens::{self, Digest, Paired, Store};
use super::wire::{self, Frame, GwError};
use crate::limits;

/// Which route a connection came in on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RouteKind {
    Node,
    Client,
}

/// What a connection's token grants.
#[derive(Clone, Debug, PartialEq)]
pub enum Role {
    /// An uplink, on `/node` with the master token.
    Node,
    /// A client on `/client`: admin with the master token; else the id of
    /// its client token.
    Client { admin: bool, token: Option<String> },
}

/// Where an answer goes when it comes later than its request.
pub type LocalReply = Box<dyn FnOnce(Result<Value, GwError>) + Send>;

/// Everything the gateway thread hears.
pub enum ToState {
    /// A handshake asks whether its token is good on its route.
    Auth {
        route: RouteKind,
        token: String,
        reply: Sender<Option<Role>>,
    },
    /// A connection is upgraded; its frames follow.
    Open {
        conn: u64,
        role: Role,
        out: Outbox,
        closer: Closer,
        peer: Option<SocketAddr>,
    },
    /// The frames of one WebSocket message, in order.
    Frames {
        conn: u64,
        frames: Vec<Frame>,
    },
    /// The connection's reader ended, or a reader found this connection's
    /// outbox full while forwarding to it: close it.
    Closed {
        conn: u64,
    },
    /// A reader found a direction of this channel full: close it.
    Overflow {
        chan: String,
    },
    /// A request of the operator's, from a unix socket: an admin caller.
    Local {
        method: String,
        params: Value,
        reply: LocalReply,
    },
    Stop,
}

/// What the gateway thread is started with.
pub struct Setup {
    pub master: Digest,
    pub store: Store,
    pub public_url: String,
    pub started_at: String,
    /// The channel table readers forward through; this thread alone
    /// opens and closes channels in it.
    pub relay: Arc<super::relay::Table>,
}

struct Conn {
    role: Role,
    out: Outbox,
    closer: Closer,
    /// Channels it holds a side of.
    chans: HashSet<String>,
    /// An uplink's node id, once it answered `node.identify`.
    node: Option<String>,
    /// The id of the `node.identify` it has not answered yet.
    identify: Option<u64>,
    /// A client's node events not yet written.
    events: Arc<Queued>,
}

struct Node {
    /// The descriptor without `online`.
    desc: Map<String, Value>,
    conn: Option<u64>,
    /// Bumped on every connect and disconnect, so a stale grace timer
    /// does nothing.
    epoch: u64,
}

/// A channel's two sides (its queues are in the shared table).
struct Chan {
    client: u64,
    node: u64,
}

/// Who waits for an answer.
enum Asker {
    Conn { conn: u64, id: Value },
    Local(LocalReply),
}

struct Pair {
    expires: Instant,
    connected: bool,
    awaited: bool,
    waiter: Option<Asker>,
}

enum Timer {
    Roster { node: String, epoch: u64 },
    Pair(Digest),
    Identify(u64),
}

struct State {
    setup: Setup,
    conns: HashMap<u64, Conn>,
    nodes: BTreeMap<String, Node>,
    chans: HashMap<String, Chan>,
    next_chan: u64,
    next_request: u64,
    pairs: HashMap<Digest, Pair>,
    /// Paired devices, oldest first, and their ids.
    paired: Vec<Paired>,
    paired_ids: HashSet<String>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    timer_tasks: HashMap<u64, Timer>,
    next_timer: u64,
    /// The trust log's entries, as carried ([`super::trust`]).
    trust: super::trust::Held,
}

/// The gateway thread's body.
pub fn run(setup: Setup, paired: Vec<Paired>, rx: Receiver<ToState>) {
    let paired_ids = paired.iter().map(|p| p.id.clone()).collect();
    let mut s = State {
        setup,
        conns: HashMap::new(),
        nodes: BTreeMap::new(),
        chans: HashMap::new(),
        next_chan: 0,
        next_request: 0,
        pairs: HashMap::new(),
        paired,
        paired_ids,
        timers: BinaryHeap::new(),
        timer_tasks: HashMap::new(),
        next_timer: 0,
        trust: Default::default(),
    };
    loop {
        let msg = match s.timers.peek() {
            Some(Reverse((at, _))) => {
                match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            None => match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => break,
            },
        };
        if let Some(m) = msg {
            if !s.on_msg(m) {
                break;
            }
            // Everything already queued, before the timers are looked at.
            while let Ok(m) = rx.try_recv() {
                if !s.on_msg(m) {
                    s.stop();
                    return;
                }
            }
        }
        s.fire_timers();
    }
    s.stop();
}

impl State {
    /// Handles one message; `false` to stop.
    fn on_msg(&mut self, m: ToState) -> bool {
        match m {
            ToState::Auth {
                route,
                token,
                reply,
            } => {
                let role = self.auth(route, &token);
                let _ = reply.send(role);
            }
            ToState::Open {
                conn,
                role,
                out,
                closer,
                peer,
            } => self.open(conn, role, out, closer, peer),
            ToState::Frames { conn, frames } => {
                for f in frames {
                    if !self.conns.contains_key(&conn) {
                        break;
                    }
                    self.on_frame(conn, f);
                }
            }
            ToState::Closed { conn } => self.drop_conn(conn),
            ToState::Overflow { chan } => self.close_chan(&chan),
            ToState::Local {
                method,
                params,
                reply,
            } => {
                if let Some(r) = self.local(&method, params, reply) {
                    r.0(r.1);
                }
            }
            ToState::Stop => return false,
        }
        true
    }

    fn stop(&mut self) {
        for c in self.conns.values() {
            c.closer.close();
        }
        self.conns.clear();
        for (_, p) in self.pairs.drain() {
            if let Some(Asker::Local(f)) = p.waiter {
                f(Ok(json!({"connected": false})));
            }
        }
    }

    fn schedule(&mut self, after: Duration, t: Timer) {
        self.next_timer += 1;
        self.timers
            .push(Reverse((Instant::now() + after, self.next_timer)));
        self.timer_tasks.insert(self.next_timer, t);
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((at, key))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(t) = self.timer_tasks.remove(&key) else {
                continue;
            };
            match t {
                Timer::Roster { node, epoch } => {
                    let gone = self
                        .nodes
                        .get(&node)
                        .is_some_and(|n| n.epoch == epoch && n.conn.is_none());
                    if let Some(n) = gone.then(|| self.nodes.remove(&node)).flatten() {
                        self.event("removed", with_online(&n.desc, false));
                    }
                }
                Timer::Pair(hash) => {
                    if let Some(p) = self.pairs.remove(&hash)
                        && let Some(w) = p.waiter
                    {
                        self.respond(w, Ok(json!({"connected": false})));
                    }
                }
                Timer::Identify(conn) => {
                    if self.conns.get(&conn).is_some_and(|c| c.identify.is_some()) {
                        crate::warn!("gateway: closed an uplink that did not answer node.identify");
                        self.drop_conn(conn);
                    }
                }
            }
        }
    }

    // ---- tokens and pairing ----

    fn auth(&mut self, route: RouteKind, token: &str) -> Option<Role> {
        let d = tokens::sha256(token.as_bytes());
        let master = tokens::digest_eq(&d, &self.setup.master);
        if route == RouteKind::Node {
            return master.then_some(Role::Node);
        }
        if master {
            return Some(Role::Client {
                admin: true,
                token: None,
            });
        }
        if !tokens::is_hex64(token) {
            return None;
        }
        let id = crate::ids::hex(&d);
        if self.paired_ids.contains(&id) {
            return Some(Role::Client {
                admin: false,
                token: Some(id),
            });
        }
        // A pending pairing token admits the handshake but is not spent
        // here: the device is paired in `open`, once the upgrade is done.
        let pair = self.pairs.get(&d)?;
        if pair.connected || Instant::now() >= pair.expires {
            return None;
        }
        Some(Role::Client {
            admin: false,
            token: Some(id),
        })
    }

    /// A device that connected with a pending pairing token and finished
    /// its upgrade: stores the token's id and wakes `clients.pairAwait`.
    /// `false` when the pairing is gone (it ended between the handshake's
    /// check and now, or storing failed): the connection is refused.
    fn complete_pairing(&mut self, id: &str) -> bool {
        // At most `GATEWAY_PAIRS_PENDING` pairings: a scan is enough.
        let Some(pair) = self
            .pairs
            .iter_mut()
            .find(|(h, p)| !p.connected && crate::ids::hex(&h[..]) == id)
            .map(|(_, p)| p)
        else {
            return false;
        };
        let p = Paired {
            id: id.to_string(),
            created_at: crate::clock::now_ts(),
        };
        if let Err(e) = self.setup.store.insert(&p) {
            crate::error!("gateway: {e}; the device was not paired");
            return false;
        }
        pair.connected = true;
        let waiter = pair.waiter.take();
        self.paired.push(p);
        self.paired_ids.insert(id.to_string());
        crate::info!("gateway: paired a device (token id {})", &id[..12]);
        if let Some(w) = waiter {
            self.respond(w, Ok(json!({"connected": true})));
        }
        true
    }

    fn pair_start(&mut self) -> Result<Value, GwError> {
        if self.pairs.len() >= limits::GATEWAY_PAIRS_PENDING {
            return Err(GwError::refused(
                "busy",
                format!(
                    "{} pairings are pending already; try again within a minute",
                    limits::GATEWAY_PAIRS_PENDING
                ),
            ));
        }
        if self.paired.len() >= limits::GATEWAY_CLIENTS_MAX {
            return Err(GwError::refused(
                "busy",
                format!(
                    "{} devices are paired already; remove one with clients.remove",
                    limits::GATEWAY_CLIENTS_MAX
                ),
            ));
        }
        let token = crate::ids::secret_hex(limits::GATEWAY_TOKEN_BYTES);
        let hash = tokens::sha256(token.as_bytes());
        let ttl = Duration::from_millis(limits::GATEWAY_PAIR_PENDING_MS);
        self.pairs.insert(
            hash,
            Pair {
                expires: Instant::now() + ttl,
                connected: false,
                awaited: false,
                waiter: None,
            },
        );
        self.schedule(ttl, Timer::Pair(hash));
        Ok(json!({"token": token, "url": self.setup.public_url}))
    }

    /// `clients.pairAwait`: `None` when the answer comes later.
    fn pair_await(
        &mut self,
        params: Value,
        asker: Asker,
    ) -> Option<(Asker, Result<Value, GwError>)> {
        #[derive(Deserialize)]
        struct P {
            token: String,
        }
        let p: P = match serde_json::from_value(params) {
            Ok(p) => p,
            Err(e) => return Some((asker, Err(GwError::invalid_params(e)))),
        };
        let no = json!({"connected": false});
        let Some(pair) = self.pairs.get_mut(&tokens::sha256(p.token.as_bytes())) else {
            return Some((asker, Ok(no)));
        };
        if pair.awaited {
            return Some((asker, Ok(no)));
        }
        pair.awaited = true;
        if pair.connected {
            return Some((asker, Ok(json!({"connected": true}))));
        }
        pair.waiter = Some(asker);
        None
    }

    fn clients_list(&self) -> Value {
        Value::Array(
            self.paired
                .iter()
                .rev()
                .map(|p| json!({"token": p.id, "created_at": p.created_at}))
                .collect(),
        )
    }

    fn clients_remove(&mut self, params: Value) -> Result<Value, GwError> {
        #[derive(Deserialize)]
        struct P {
            token: String,
        }
        let p: P = serde_json::from_value(params).map_err(GwError::invalid_params)?;
        if !self.paired_ids.contains(&p.token) {
            return Err(GwError::refused(
                "not-found",
                format!("unknown client token id: {}", p.token),
            ));
        }
        self.setup
            .store
            .remove(&p.token)
            .map_err(|e| GwError::internal(e.to_string()))?;
        self.paired_ids.remove(&p.token);
        self.paired.retain(|x| x.id != p.token);
        let theirs: Vec<u64> = self
            .conns
            .iter()
            .filter(
                |(_, c)| matches!(&c.role, Role::Client { token: Some(t), .. } if *t == p.token),
            )
            .map(|(k, _)| *k)
            .collect();
        for c in theirs {
            self.drop_conn(c);
        }
        Ok(Value::Null)
    }

    // ---- requests ----

    /// A request from the operator's unix socket.
    fn local(
        &mut self,
        method: &str,
        params: Value,
        reply: LocalReply,
    ) -> Option<(LocalReply, Result<Value, GwError>)> {
        let asker = Asker::Local(reply);
        let (asker, r) = match method {
            // "This socket serves only server.info (with no nodes)".
            "server.info" => (asker, Ok(self.server_info(false))),
            _ => self.admin_method(method, params, asker)?,
        };
        match asker {
            Asker::Local(f) => Some((f, r)),
            Asker::Conn { .. } => None,
        }
    }

    /// `clients.*` and `pushport.setToken`, for an admin caller.
    fn admin_method(
        &mut self,
        method: &str,
        params: Value,
        asker: Asker,
    ) -> Option<(Asker, Result<Value, GwError>)> {
        let r = match method {
            "clients.pairStart" => self.pair_start(),
            "clients.pairAwait" => return self.pair_await(params, asker),
            "clients.list" => Ok(self.clients_list()),
            "clients.remove" => self.clients_remove(params),
            _ => Err(GwError::not_found()),
        };
        Some((asker, r))
    }

    fn request(&mut self, conn: u64, id: Value, method: &str, params: Value) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let asker = Asker::Conn { conn, id };
        let Role::Client { admin, .. } = c.role else {
            // An uplink is served `ping` (answered by its reader) and the
            // trust log's distribution.
            let r = match method {
                "trustlog.sync" => self.trust.sync(params),
                "trustlog.push" => self.trust_push(conn, params),
                _ => Err(GwError::not_found()),
            };
            return self.respond(asker, r);
        };
        let r = match method {
            "server.info" => Ok(self.server_info(true)),
            "trustlog.sync" => self.trust.sync(params),
            "nodes.list" => Ok(json!({"nodes": self.roster()})),
            "relay.open" => self.relay_open(conn, params),
            "relay.close" => self.relay_close(conn, params),
            m if m.starts_with("clients.") || m == "pushport.setToken" => {
                if !admin {
                    Err(GwError::admin_only())
                } else {
                    if let Some((a, r)) = self.admin_method(method, params, asker) {
                        self.respond(a, r);
                    }
                    return;
                }
            }
            _ => Err(GwError::not_found()),
        };
        self.respond(asker, r);
    }

    /// `trustlog.push` from the uplink `conn`. When it brings entries the
    /// gateway did not hold, every other uplink is told `trustlog.changed
    /// {heads}` and every client `node.event` `trust-changed` (seed 004,
    /// Distribution, Roster events), so that they sync.
    fn trust_push(&mut self, conn: u64, params: Value) -> Result<Value, GwError> {
        let added = self.trust.push(params)?;
        if added > 0 {
            crate::debug!("gateway: {added} new trust-log entries");
            let note =
                wire::notification("trustlog.changed", &json!({"heads": self.trust.heads()}));
            let nodes: Vec<u64> = self
                .conns
                .iter()
                .filter(|(k, c)| **k != conn && c.role == Role::Node)
                .map(|(k, _)| *k)
                .collect();
            for n in nodes {
                self.send(n, note.clone());
            }
            // "Its node field is an empty descriptor."
            let empty =
                json!({"id": "", "label": "", "version": "", "capabilities": {}, "online": false});
            self.event("trust-changed", empty);
        }
        Ok(Value::Null)
    }

    fn respond(&mut self, asker: Asker, r: Result<Value, GwError>) {
        match asker {
            Asker::Local(f) => f(r),
            Asker::Conn { conn, id } => {
                let line = wire::answer(&id, &r);
                self.send(conn, line);
            }
        }
    }

    /// Queues a line to a connection; one that cannot take it is closed.
    fn send(&mut self, conn: u64, line: Vec<u8>) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        if c.out.line(line).is_err() {
            crate::debug!("gateway: closed a connection whose queue is full");
            self.drop_conn(conn);
        }
    }

    fn server_info(&self, with_nodes: bool) -> Value {
        let nodes: Vec<Value> = if with_nodes {
            self.nodes
                .values()
                .filter(|n| n.conn.is_some())
                .map(|n| {
                    let mut m = Map::new();
                    for k in ["id", "label", "version", "capabilities"] {
                        if let Some(v) = n.desc.get(k) {
                            m.insert(k.into(), v.clone());
                        }
                    }
                    Value::Object(m)
                })
                .collect()
        } else {
            Vec::new()
        };
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "started_at": self.setup.started_at,
            "nodes": nodes,
            "pushPortConfigured": false,
        })
    }

    fn roster(&self) -> Vec<Value> {
        self.nodes
            .values()
            .map(|n| with_online(&n.desc, n.conn.is_some()))
            .collect()
    }

    // ---- connections ----

    fn open(
        &mut self,
        conn: u64,
        role: Role,
        out: Outbox,
        closer: Closer,
        peer: Option<SocketAddr>,
    ) {
        let shown = peer
            .map(|p| p.to_string())
            .unwrap_or_else(|| "in-process".into());
        crate::debug!("gateway: {role:?} connected from {shown}");
        if let Role::Client {
            token: Some(id), ..
        } = &role
            && !self.paired_ids.contains(id)
            && !self.complete_pairing(id)
        {
            crate::debug!("gateway: refused a device whose pairing ended during its handshake");
            return closer.close();
        }
        let node = role == Role::Node;
        self.conns.insert(
            conn,
            Conn {
                role,
                out,
                closer,
                chans: HashSet::new(),
                node: None,
                identify: None,
                events: Arc::new(Queued::default()),
            },
        );
        if node {
            self.next_request += 1;
            let id = self.next_request;
            if let Some(c) = self.conns.get_mut(&conn) {
                c.identify = Some(id);
            }
            self.send(conn, wire::request(id, "node.identify"));
            self.schedule(
                Duration::from_millis(limits::GATEWAY_IDENTIFY_MS),
                Timer::Identify(conn),
            );
        } else {
            // Subscribed already (it is in `conns`); now the snapshot.
            for desc in self.roster() {
                self.event_to(conn, "added", &desc);
            }
        }
    }

    /// Forgets a connection and closes it: its channels, and an uplink's
    /// place in the roster.
    fn drop_conn(&mut self, conn: u64) {
        let Some(c) = self.conns.remove(&conn) else {
            return;
        };
        c.closer.close();
        for chan in &c.chans {
            let Some(ch) = self.chans.remove(chan) else {
                continue;
            };
            self.setup.relay.close(chan);
            if ch.client == conn {
                if let Some(n) = self.conns.get_mut(&ch.node) {
                    n.chans.remove(chan);
                }
                self.relay_closed(ch.node, chan);
            } else if let Some(cl) = self.conns.get_mut(&ch.client) {
                cl.chans.remove(chan);
            }
        }
        if let Some(id) = c.node
            && let Some(n) = self.nodes.get_mut(&id)
            && n.conn == Some(conn)
        {
            n.conn = None;
            n.epoch += 1;
            let (epoch, desc) = (n.epoch, with_online(&n.desc, false));
            self.event("offline", desc);
            self.schedule(
                Duration::from_millis(limits::GATEWAY_ROSTER_GRACE_MS),
                Timer::Roster { node: id, epoch },
            );
        }
    }

    fn on_frame(&mut self, conn: u64, f: Frame) {
        match f {
            Frame::Request { id, method, params } => self.request(conn, id, &method, params),
            Frame::Response { id, result } => self.on_response(conn, id, result),
            // Forwarded, answered or dropped by the reader.
            Frame::Relay { .. }
            | Frame::Ping { .. }
            | Frame::Notification
            | Frame::Unroutable
            | Frame::Refused(_) => {}
        }
    }

    /// An uplink's answer to `node.identify`.
    fn on_response(&mut self, conn: u64, id: Value, result: Option<Value>) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.identify.is_none() || id.as_u64() != c.identify {
            return;
        }
        c.identify = None;
        let desc = match result {
            Some(Value::Object(r)) => descriptor(&r),
            _ => None,
        };
        let Some(desc) = desc else {
            crate::warn!(
                "gateway: closed an uplink whose node.identify gave no usable id (empty, or holding ':')"
            );
            return self.drop_conn(conn);
        };
        let node_id = desc["id"].as_str().unwrap_or_default().to_string();
        c.node = Some(node_id.clone());
        // A second uplink with the same id replaces the first.
        if let Some(old) = self.nodes.get(&node_id).and_then(|n| n.conn) {
            crate::info!("gateway: a new uplink of node {node_id} replaces the old one");
            self.drop_conn(old);
        }
        let kind = match self.nodes.get_mut(&node_id) {
            Some(n) => {
                n.conn = Some(conn);
                n.epoch += 1;
                n.desc = desc;
                "online"
            }
            None => {
                self.nodes.insert(
                    node_id.clone(),
                    Node {
                        desc,
                        conn: Some(conn),
                        epoch: 0,
                    },
                );
                "added"
            }
        };
        crate::info!("gateway: node {node_id} is {kind}");
        let desc = self
            .nodes
            .get(&node_id)
            .map(|n| with_online(&n.desc, true))
            .unwrap_or(Value::Null);
        self.event(kind, desc);
    }

    /// A roster event to every client.
    fn event(&mut self, kind: &str, desc: Value) {
        let clients: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.role, Role::Client { .. }))
            .map(|(k, _)| *k)
            .collect();
        for c in clients {
            self.event_to(c, kind, &desc);
        }
    }

    fn event_to(&mut self, conn: u64, kind: &str, desc: &Value) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        // "If the event buffer of a client (64 events) is full, the
        // gateway drops the event for that client."
        if c.events.frames.load(Ordering::Acquire) >= limits::GATEWAY_CLIENT_EVENTS {
            return;
        }
        let line = wire::notification("node.event", &json!({"type": kind, "node": desc}));
        c.events.frames.fetch_add(1, Ordering::AcqRel);
        c.events.bytes.fetch_add(line.len(), Ordering::AcqRel);
        let q = c.events.clone();
        if c.out.push(Out::Line(line, Some(q))).is_err() {
            self.drop_conn(conn);
        }
    }

    // ---- relay channels ----

    fn relay_open(&mut self, conn: u64, params: Value) -> Result<Value, GwError> {
        #[derive(Deserialize)]
        struct P {
            node_id: String,
        }
        let p: P = serde_json::from_value(params).map_err(GwError::invalid_params)?;
        let Some(node_conn) = self.nodes.get(&p.node_id).and_then(|n| n.conn) else {
            return Err(GwError::refused(
                "unknown-node",
                format!("unknown node: {}", p.node_id),
            ));
        };
        let held = self.conns.get(&conn).map_or(0, |c| c.chans.len());
        if held >= limits::GATEWAY_CHANNELS_PER_CLIENT {
            return Err(GwError::refused(
                "too-many-channels",
                "too many open channels for this client",
            ));
        }
        let (Some(client_out), Some(node_out)) = (
            self.conns.get(&conn).map(|c| c.out.clone()),
            self.conns.get(&node_conn).map(|c| c.out.clone()),
        ) else {
            return Err(GwError::refused(
                "unknown-node",
                format!("unknown node: {}", p.node_id),
            ));
        };
        self.next_chan += 1;
        let chan = format!("c{}", self.next_chan);
        for c in [conn, node_conn] {
            if let Some(c) = self.conns.get_mut(&c) {
                c.chans.insert(chan.clone());
            }
        }
        // In the table before the answer is queued: the client sends on
        // the channel only once it has the id.
        self.setup
            .relay
            .open(chan.clone(), (conn, client_out), (node_conn, node_out));
        self.chans.insert(
            chan.clone(),
            Chan {
                client: conn,
                node: node_conn,
            },
        );
        Ok(json!({"chan_id": chan}))
    }

    fn relay_close(&mut self, conn: u64, params: Value) -> Result<Value, GwError> {
        #[derive(Deserialize)]
        struct P {
            chan_id: String,
        }
        let p: P = serde_json::from_value(params).map_err(GwError::invalid_params)?;
        if self.chans.get(&p.chan_id).is_some_and(|c| c.client == conn) {
            self.close_chan(&p.chan_id);
        }
        Ok(Value::Null)
    }

    /// Closes a channel whose both ends live on, and tells its node.
    fn close_chan(&mut self, chan: &str) {
        let Some(ch) = self.chans.remove(chan) else {
            return;
        };
        self.setup.relay.close(chan);
        for c in [ch.client, ch.node] {
            if let Some(c) = self.conns.get_mut(&c) {
                c.chans.remove(chan);
            }
        }
        self.relay_closed(ch.node, chan);
    }

    fn relay_closed(&mut self, node: u64, chan: &str) {
        self.send(
            node,
            wire::notification("relay.closed", &json!({"chan_id": chan})),
        );
    }
}

/// The roster descriptor of an `IdentifyResult`, or `None` when its id is
/// unusable. `capabilities` is carried whole, unknown keys included.
fn descriptor(r: &Map<String, Value>) -> Option<Map<String, Value>> {
    let id = r.get("id")?.as_str()?;
    if id.is_empty() || id.contains(':') {
        return None;
    }
    let mut d = Map::new();
    d.insert("id".into(), json!(id));
    for k in ["label", "version"] {
        let v = r.get(k).and_then(Value::as_str).unwrap_or_default();
        d.insert(k.into(), json!(v));
    }
    let caps = match r.get("capabilities") {
        Some(c @ Value::Object(_)) => c.clone(),
        _ => json!({}),
    };
    d.insert("capabilities".into(), caps);
    for k in ["identity_pubkey", "signer_pubkey"] {
        if let Some(v @ Value::String(_)) = r.get(k) {
            d.insert(k.into(), v.clone());
        }
    }
    if let Some(v @ Value::Bool(_)) = r.get("lock_disabled") {
        d.insert("lock_disabled".into(), v.clone());
    }
    Some(d)
}

fn with_online(desc: &Map<String, Value>, online: bool) -> Value {
    let mut d = desc.clone();
    d.insert("online".into(), Value::Bool(online));
    Value::Object(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::bounded;

    fn ask(tx: &Sender<ToState>, method: &str, params: Value) -> Receiver<Result<Value, GwError>> {
        let (rtx, rrx) = bounded(1);
        tx.send(ToState::Local {
            method: method.into(),
            params,
            reply: Box::new(move |r| {
                let _ = rtx.send(r);
            }),
        })
        .unwrap();
        rrx
    }

    fn auth(tx: &Sender<ToState>, token: &str) -> Option<Role> {
        let (rtx, rrx) = bounded(1);
        tx.send(ToState::Auth {
            route: RouteKind::Client,
            token: token.into(),
            reply: rtx,
        })
        .unwrap();
        rrx.recv().unwrap()
    }

    #[test]
    fn a_pairing_token_is_spent_only_by_an_upgraded_connection() {
        let dir = crate::testutil::TempDir::new("gw-state-pair");
        let store = Store::open(&dir.path().join("g.sqlite3"), true).unwrap();
        let setup = Setup {
            master: tokens::sha256(b"m"),
            store,
            public_url: String::new(),
            started_at: String::new(),
            relay: Arc::default(),
        };
        let (tx, rx) = bounded(64);
        let t = std::thread::spawn(move || run(setup, Vec::new(), rx));
        let wait = Duration::from_secs(30);
        let started = ask(&tx, "clients.pairStart", json!({}))
            .recv()
            .unwrap()
            .unwrap();
        let token = started["token"].as_str().unwrap().to_string();
        let awaited = ask(&tx, "clients.pairAwait", json!({"token": token}));
        // A handshake checks the token, then fails before its upgrade: it
        // never opens. Nothing is stored, the await still waits, and the
        // token still admits the next handshake.
        let role = auth(&tx, &token).expect("a pending token is admitted");
        let list = ask(&tx, "clients.list", json!({})).recv().unwrap().unwrap();
        assert_eq!(list, json!([]));
        assert!(awaited.try_recv().is_err());
        assert_eq!(auth(&tx, &token), Some(role.clone()));
        // The next one is upgraded: now the device is paired.
        let (out, _orx, _) = Outbox::new();
        let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tx.send(ToState::Open {
            conn: 1,
            role,
            out: out.clone(),
            closer: Closer::Link(closed.clone(), out),
            peer: None,
        })
        .unwrap();
        assert_eq!(
            awaited.recv_timeout(wait).unwrap().unwrap(),
            json!({"connected": true})
        );
        let list = ask(&tx, "clients.list", json!({})).recv().unwrap().unwrap();
        assert_eq!(
            list[0]["token"],
            json!(crate::ids::hex(&tokens::sha256(token.as_bytes())))
        );
        assert!(!closed.load(Ordering::Acquire));
        tx.send(ToState::Stop).unwrap();
        t.join().unwrap();
    }
}
