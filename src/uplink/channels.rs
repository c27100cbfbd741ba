//! Relay channels served like connections (seed 004, "Relay channels":
//! Plaintext mode, Order and delivery, Mode mismatch, Limits and teardown;
//! "End-to-end encryption": Handshake, Sealed records, Methods on a
//! channel; issue 13), on the reactor.
//!
//! A line from the gateway is either addressed to the node itself
//! (`node.identify`, `ping`, `relay.closed`) or a relay frame, which has a
//! `route`. On a relay frame:
//! - an unknown `chan_id` makes a channel: `e2e.handshake` (a notification
//!   whose body is Noise message 1) an E2EE channel, answered with
//!   message 2 in the same frame shape; any other frame a plaintext one,
//!   unless the node is in E2EE mode (`[uplink] e2ee`), which drops it.
//!   A handshake on a channel that exists, or one that does not complete,
//!   is dropped without a word;
//! - only requests are served (notifications and responses from the client
//!   are ignored); the body opens as the params (plaintext: base64 of the
//!   JSON; E2EE: sealed records), an empty body meaning no params. A body
//!   that does not open is dropped without a reply; a later record that
//!   fails desynchronises the channel, which is then forgotten;
//! - `lock.*` and `server.stop` answer -32601; every other method goes
//!   through the socket's method table as a caller of class
//!   `remote-client` (`socket::methods::remote_gate` says what it may do);
//! - the answer goes back as `{"id","route":{"chan_id"},"body":
//!   seal({"result"…})}` or `seal({"error"…})`. Requests of a channel are
//!   served concurrently, at most `UPLINK_CHANNEL_IN_FLIGHT` at once.
//!
//! `relay.closed` frees the channel; the uplink closing frees them all,
//! with what is kept for them elsewhere (their transcript subscriptions,
//! `socket::watches` and, for tmux sessions, the tmux routes; their live
//! terminals, which close).
//!
//! Terminals (seed 004, Terminals; issue 15): `terminal.*` on a channel
//! goes through the socket's table too, and the terminal belongs to the
//! channel; its `terminal.output`s and `terminal.exited` come here
//! ([`notify_plain`]) from the reactor, sealed in order with the rest. A
//! terminal's output is queued only while the link's outbox has room for
//! it ([`has_room_for_output`]; src/daemon/router/tmux.rs says why and
//! what happens otherwise).
//!
//! Sessions (seed 004, "Connecting a client": "The session snapshot starts
//! when the channel exists"): a new channel gets one `session.event`
//! `added` per session, the daemon's own and the tmux sessions of the
//! last scan (after message 2 on an E2EE channel, before the answer to
//! the first request on a plaintext one), then every `added` and
//! `updated` the socket's watchers get, as relay notifications sealed in
//! order with the answers, and `removed` (with its last state) when the
//! core forgets an ended session (`[agents] ended_kept`) or a tmux
//! session leaves the list. A channel is a watcher of the tmux sessions
//! as a `sessions.subscribe` connection is: while one is open the daemon
//! rescans every `TMUX_RESCAN_MS` (src/daemon/router/tmux.rs).
//!
//! Transcripts: `transcript.subscribe` keeps its subscription on the
//! channel (`socket::watches::Subscriber::Chan`), and its deltas come here
//! ([`notify_plain`]) to be sealed in order with everything else.
//!
//! The node holds no queue of its own per channel: a frame goes straight to
//! the link's outbox, and past the gateway's 64-frame queue per channel the
//! gateway closes the channel. The seed's 64-event buffer per subscriber
//! counts a channel's live `session.event`s that wait in the outbox
//! ([`EventTicket`]): when 64 wait (the gateway is not reading the node),
//! a new one is dropped for that channel, before it is sealed, and the
//! client repairs its list with `sessions.list`. Transcript deltas and
//! answers are never dropped (a dropped delta would leave a hole the client
//! cannot see); the snapshot at a channel's start is not counted.

use crossbeam_channel::{Sender, TrySendError};
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Chans, Out};
use crate::daemon::{Daemon, ReplyTo, Req};
use crate::e2ee::{self, PublicKey};
use crate::errors::{Code, RpcError};
use crate::limits;
use crate::procs::CallerClass;

/// One connection to the gateway and its channels.
pub struct Link {
    pub id: u64,
    out: Sender<Out>,
    closer: Option<super::dial::Closer>,
    pub chans: Chans,
}

/// One relay channel.
pub struct Chan {
    /// The Noise channel of an E2EE channel; `None` in plaintext mode.
    seal: Option<e2ee::Channel>,
    in_flight: usize,
    /// The channel's live `session.event`s in the outbox (the seed's
    /// 64-event buffer per subscriber; [`EventTicket`]).
    events: Arc<AtomicUsize>,
}

/// One `session.event` of a channel in the uplink's outbox: counted from
/// when it is queued until the writer takes it out (or it is dropped with
/// a closing link), so that a channel whose events pile up behind a slow
/// gateway drops new ones, as the seed says, instead of filling the
/// outbox that every channel shares.
pub struct EventTicket(Arc<AtomicUsize>);

impl EventTicket {
    /// A ticket of the buffer `events`, or `None` when it is full.
    fn take(events: &Arc<AtomicUsize>) -> Option<EventTicket> {
        events
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limits::UPLINK_CHANNEL_EVENTS).then_some(n + 1)
            })
            .ok()
            .map(|_| EventTicket(events.clone()))
    }
}

impl Drop for EventTicket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Link {
    pub fn new(id: u64, out: Sender<Out>, closer: Option<super::dial::Closer>) -> Link {
        Link {
            id,
            out,
            closer,
            chans: Chans::new(),
        }
    }
}

/// What the node tells the handshake about its channels and trust: locked
/// mode's admission (issue 14; seed 004, Enforcement), checked at the end of
/// each Noise handshake. Until the trust log is read at start, no channel
/// is admitted: a locked node must not serve anyone in that moment.
struct Admit<'a> {
    chans: &'a Chans,
    lock: Option<&'a crate::lock::Lock>,
}

impl e2ee::Admission for Admit<'_> {
    fn channel_exists(&self, chan_id: &str) -> bool {
        self.chans.contains_key(chan_id)
    }
    fn quarantined(&self) -> bool {
        self.lock.is_none_or(|l| {
            matches!(
                l.admit(None),
                Err(crate::trustlog::enforce::Refusal::Quarantined)
            )
        })
    }
    fn authorizes(&self, client: &PublicKey) -> bool {
        self.lock
            .is_some_and(|l| l.admit(Some(client.as_bytes())).is_ok())
    }
}

/// Answers the gateway's `node.identify` on link `id`; then the node is in
/// the roster and syncs its trust log ("The node syncs on connect").
fn identify(d: &mut Daemon, id: u64, rid: Value) {
    let v = super::identify(d);
    send(
        d,
        id,
        line(&json!({"jsonrpc": "2.0", "id": rid, "result": v})),
    );
    sync_trust(d);
}

/// The id of the node's own `trustlog.sync` requests; their answers are
/// told apart from other lines by it.
const SYNC_ID: &str = "trustlog.sync";

/// Asks the gateway for the trust-log entries this node lacks (seed 004,
/// Distribution): on connect, when the gateway says the log changed, and
/// after each change of the log here (the answer's `want` is how this
/// node's new entries reach the gateway, by `trustlog.push`).
pub fn sync_trust(d: &mut Daemon) {
    if !d.lock.loaded() {
        return;
    }
    let Some(id) = d
        .uplink
        .as_ref()
        .and_then(|u| u.link.as_ref())
        .map(|l| l.id)
    else {
        return;
    };
    let (known, truncated) = d.lock.lock.known();
    let mut params = json!({
        "known": known.iter().map(|h| e2ee::base64::encode(&h.0)).collect::<Vec<_>>(),
    });
    if truncated {
        params["truncated"] = json!(true);
    }
    let v = json!({"jsonrpc": "2.0", "id": SYNC_ID, "method": "trustlog.sync", "params": params});
    send(d, id, line(&v));
}

/// The gateway's answer to `trustlog.sync`: its entries go to locked mode,
/// which decides by fork choice on the lock worker; the entries it wants
/// go back by `trustlog.push` once the decision is committed.
fn synced(d: &mut Daemon, id: u64, result: &Value) {
    let strings = |k: &str| -> Vec<Vec<u8>> {
        result
            .get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .take(limits::TRUSTLOG_MAX_CHAIN)
                    .filter_map(|v| v.as_str().and_then(e2ee::base64::decode))
                    .collect()
            })
            .unwrap_or_default()
    };
    let entries = strings("entries");
    let want: Vec<crate::trustlog::Hash> = strings("want")
        .iter()
        .filter_map(|h| crate::trustlog::Hash::from_slice(h))
        .collect();
    let push = move |d: &mut Daemon| {
        let wanted = d.lock.lock.wanted(&want);
        if !wanted.is_empty() && link_mut(d, id).is_some() {
            let entries: Vec<String> = wanted.iter().map(|w| e2ee::base64::encode(w)).collect();
            let v = json!({"jsonrpc": "2.0", "id": "trustlog.push", "method": "trustlog.push",
                "params": {"entries": entries}});
            send(d, id, line(&v));
        }
    };
    if entries.is_empty() {
        push(d);
        return;
    }
    let then: crate::daemon::router::lock::Then = Box::new(move |d, r| {
        if let Err(e) = r {
            crate::warn!("uplink: the trust log from the gateway was not taken: {e}");
        }
        push(d);
    });
    if let Err(e) = crate::daemon::router::lock::submit(d, crate::lock::Op::Sync(entries), then) {
        crate::warn!("uplink: a trust sync was not taken: {}", e.message);
    }
}

/// Locked mode is read at start: the node answers the `node.identify` it
/// held, so the gateway shows it online only once it can admit channels,
/// and closes what the log does not admit.
pub fn lock_loaded(d: &mut Daemon) {
    if let Some((id, rid)) = d.uplink.as_mut().and_then(|u| u.identify_waiting.take()) {
        identify(d, id, rid);
    }
    enforce(d);
}

/// Forgets the channels the trust log no longer admits (seed 004,
/// Enforcement: "When the log changes, the node closes channels whose
/// client is no longer authorized"). The seed gives the node no teardown
/// frame: the channel's state goes, and its next frames are dropped as
/// frames of an unknown channel. Called after every change of locked mode.
pub fn enforce(d: &mut Daemon) {
    let lock = &d.lock.lock;
    let Some(l) = d.uplink.as_mut().and_then(|u| u.link.as_mut()) else {
        return;
    };
    let keys: Vec<(String, Option<[u8; 32]>)> = l
        .chans
        .iter()
        .map(|(k, c)| (k.clone(), c.seal.as_ref().map(|s| *s.peer().as_bytes())))
        .collect();
    let closing = lock.to_close(
        keys.iter()
            .map(|(k, c)| (k.clone(), c.as_ref().map(|c| &c[..]))),
    );
    let link = l.id;
    for (chan, why) in closing {
        crate::info!("uplink: channel {chan} closed: {}", why.code());
        forget(d, link, &chan);
    }
}

fn line(v: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    out
}

/// Queues `bytes` on link `id`; a full outbox closes the link (module
/// comment of [`super`]).
fn send(d: &mut Daemon, id: u64, bytes: Vec<u8>) {
    send_out(d, id, Out::Line(bytes));
}

fn send_out(d: &mut Daemon, id: u64, out: Out) {
    let Some(u) = d.uplink.as_mut() else { return };
    let Some(l) = u.link.as_mut().filter(|l| l.id == id) else {
        return;
    };
    match l.out.try_send(out) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            // Shutting the socket down ends the reader and the writer; the
            // transport then reports the link down and dials again.
            if let Some(c) = &l.closer {
                c.close();
            }
            u.link = None;
            u.last_error = Some("the gateway did not read the node's frames".into());
            crate::warn!(
                "uplink to {}: closed, the gateway did not read the node's frames",
                u.via
            );
            link_gone(d, id);
        }
        Err(TrySendError::Disconnected(_)) => {
            u.link = None;
            link_gone(d, id);
        }
    }
}

/// Link `id` went (it is no longer `Uplink::link`): what was kept for its
/// channels goes too (their transcript subscriptions, their terminals).
pub fn link_gone(d: &mut Daemon, id: u64) {
    d.socket.watches.forget_chan(id, None);
    crate::daemon::router::tmux::chan_closed(d, id, None);
}

/// Whether channel `chan` of link `link` is open.
pub fn exists(d: &Daemon, link: u64, chan: &str) -> bool {
    d.uplink
        .as_ref()
        .and_then(|u| u.link.as_ref())
        .is_some_and(|l| l.id == link && l.chans.contains_key(chan))
}

/// Whether a terminal's output may be queued on link `link` now: its
/// outbox holds fewer than `UPLINK_TERMINAL_BACKLOG` frames
/// (src/daemon/router/tmux.rs says what happens otherwise).
pub fn has_room_for_output(d: &Daemon, link: u64) -> bool {
    d.uplink
        .as_ref()
        .and_then(|u| u.link.as_ref())
        .is_some_and(|l| l.id == link && l.out.len() < limits::UPLINK_TERMINAL_BACKLOG)
}

/// A line the gateway sent on link `id`.
pub fn on_line(d: &mut Daemon, id: u64, bytes: &[u8]) {
    let Ok(Value::Object(mut f)) = serde_json::from_slice::<Value>(bytes) else {
        return;
    };
    let method = f.get("method").and_then(Value::as_str).map(str::to_string);
    let rid = f.remove("id");
    if let Some(route) = f.get("route") {
        let Some(chan) = route.get("chan_id").and_then(Value::as_str) else {
            return;
        };
        let chan = chan.to_string();
        let body = f.get("body").and_then(Value::as_str).unwrap_or("");
        on_relay(d, id, chan, method.as_deref(), rid, body);
        return;
    }
    match (method.as_deref(), rid) {
        (Some("node.identify"), Some(rid)) => {
            if d.lock.loaded() {
                identify(d, id, rid);
            } else if let Some(u) = d.uplink.as_mut() {
                u.identify_waiting = Some((id, rid));
            }
        }
        (Some("ping"), Some(rid)) => {
            send(
                d,
                id,
                line(&json!({"jsonrpc": "2.0", "id": rid, "result": null})),
            );
        }
        (Some(m), Some(rid)) => {
            let e = RpcError::new(
                Code::MethodNotFound,
                format!("unknown method {m} on the uplink"),
            );
            let v = json!({"jsonrpc": "2.0", "id": rid, "error": error_value(&e)});
            send(d, id, line(&v));
        }
        (Some("trustlog.changed"), None) => sync_trust(d),
        (None, Some(rid)) if rid == SYNC_ID => {
            if let Some(result) = f.get("result") {
                synced(d, id, result);
            }
        }
        (Some("relay.closed"), None) => {
            let chan = f
                .get("params")
                .and_then(|p| p.get("chan_id"))
                .and_then(Value::as_str);
            if let Some(chan) = chan {
                let chan = chan.to_string();
                forget(d, id, &chan);
            }
        }
        // Answers to the node's own pings, and notifications it does not
        // act on.
        _ => {}
    }
}

fn link_mut(d: &mut Daemon, id: u64) -> Option<&mut Link> {
    d.uplink
        .as_mut()
        .and_then(|u| u.link.as_mut())
        .filter(|l| l.id == id)
}

fn on_relay(
    d: &mut Daemon,
    id: u64,
    chan: String,
    method: Option<&str>,
    rid: Option<Value>,
    body: &str,
) {
    let e2ee_mode = d.cfg.uplink.e2ee;
    let node_id = d.node_name.clone();
    let lock = d.lock.loaded().then_some(&d.lock.lock);
    let Some(u) = d.uplink.as_mut() else { return };
    let identity = u.identity.as_ref();
    let Some(l) = u.link.as_mut().filter(|l| l.id == id) else {
        return;
    };
    if method == Some("e2e.handshake") && rid.is_none() {
        let (Some(identity), Some(msg1)) = (identity, e2ee::base64::decode(body)) else {
            return;
        };
        if l.chans.len() >= limits::UPLINK_CHANNELS {
            return;
        }
        match e2ee::respond(
            identity,
            &node_id,
            &chan,
            &msg1,
            &Admit {
                chans: &l.chans,
                lock,
            },
        ) {
            Ok(acc) => {
                let chan_name = chan.clone();
                let reply = json!({
                    "jsonrpc": "2.0",
                    "method": "e2e.handshake",
                    "route": {"chan_id": chan},
                    "body": e2ee::base64::encode(&acc.msg2),
                });
                l.chans.insert(
                    chan,
                    Chan {
                        seal: Some(acc.channel),
                        in_flight: 0,
                        events: Arc::default(),
                    },
                );
                send(d, id, line(&reply));
                snapshot(d, id, &chan_name);
            }
            Err(e) => crate::debug!("uplink: dropped a handshake on {chan}: {}", e.code()),
        }
        return;
    }
    if !l.chans.contains_key(&chan) {
        // Seed 004, Mode mismatch: "A node in E2EE mode drops frames for an
        // unknown chan_id that are not e2e.handshake."
        if e2ee_mode || l.chans.len() >= limits::UPLINK_CHANNELS {
            return;
        }
        // A locked node refuses plaintext channels (src/trustlog/enforce.rs).
        if let Err(why) = lock.map_or(Err("the trust log is not read yet"), |l| {
            l.admit(None).map_err(|r| r.code())
        }) {
            crate::debug!("uplink: dropped a plaintext channel {chan}: {why}");
            return;
        }
        l.chans.insert(
            chan.clone(),
            Chan {
                seal: None,
                in_flight: 0,
                events: Arc::default(),
            },
        );
        snapshot(d, id, &chan);
    }
    let Some(l) = link_mut(d, id) else { return };
    // "The node acts only on requests."
    let (Some(method), Some(rid)) = (method, rid) else {
        return;
    };
    let Some(c) = l.chans.get_mut(&chan) else {
        return;
    };
    let opened = match &mut c.seal {
        None => e2ee::base64::decode(body).ok_or(None),
        Some(ch) => ch.open_body(body).map_err(|e| Some(e.closes_channel())),
    };
    let plain = match opened {
        Ok(p) => p,
        Err(closes) => {
            if closes == Some(true) {
                crate::debug!("uplink: channel {chan} is out of sync; forgotten");
                forget(d, id, &chan);
            }
            return;
        }
    };
    let e2ee_chan = c.seal.is_some();
    let full = c.in_flight >= limits::UPLINK_CHANNEL_IN_FLIGHT;
    if !full {
        c.in_flight += 1;
    }
    let req = Req {
        to: ReplyTo::Relay {
            link: id,
            chan,
            id: rid,
        },
        class: CallerClass::RemoteClient { e2ee: e2ee_chan },
    };
    if full {
        // Not counted, so its answer must not lower the count either.
        let e = RpcError::new(
            Code::Busy,
            format!(
                "more than {} requests of this channel are being served; wait for their answers",
                limits::UPLINK_CHANNEL_IN_FLIGHT
            ),
        );
        return write_answer(d, req, Err(e), false);
    }
    let params = match params_of(&plain) {
        Ok(p) => p,
        Err(e) => return d.answer(req, Err(e)),
    };
    if d.is_stopping() && method != "ping" {
        return d.answer(
            req,
            Err(RpcError::new(Code::ShuttingDown, "the daemon is stopping")),
        );
    }
    // Seed 004, Methods on a channel: "It returns -32601 for lock.*"; and
    // a remote client cannot stop the node.
    if method.starts_with("lock.") || method == "server.stop" {
        let e = RpcError::new(
            Code::MethodNotFound,
            format!("{method} is not served on a relay channel"),
        );
        return d.answer(req, Err(e));
    }
    if method == "node.identify" {
        let v = super::identify(d);
        return d.answer(req, Ok(v));
    }
    crate::socket::methods::dispatch(d, req, method, params);
}

/// A request's params from its opened body: nothing, or a JSON object.
fn params_of(plain: &[u8]) -> Result<Map<String, Value>, RpcError> {
    if plain.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(plain) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(Value::Null) => Ok(Map::new()),
        Ok(_) => Err(RpcError::invalid_params("params must be an object")),
        Err(_) => Err(RpcError::new(
            Code::ParseError,
            "the request's body is not valid JSON",
        )),
    }
}

/// The JSON-RPC error object of `e`, as the socket writes it.
fn error_value(e: &RpcError) -> Value {
    json!({"code": e.code.rpc(), "message": e.message, "data": {"code": e.code.as_str()}})
}

/// Answers a request that came on a channel (`ReplyTo::Relay`).
pub fn answer(d: &mut Daemon, req: Req, result: Result<Value, RpcError>) {
    write_answer(d, req, result, true)
}

fn write_answer(d: &mut Daemon, req: Req, result: Result<Value, RpcError>, counted: bool) {
    let ReplyTo::Relay { link, chan, id } = req.to else {
        return;
    };
    let inner = match &result {
        Ok(v) => json!({"result": v}),
        Err(e) => json!({"error": error_value(e)}),
    };
    let plain = serde_json::to_vec(&inner).unwrap_or_default();
    let Some(l) = link_mut(d, link) else { return };
    let Some(c) = l.chans.get_mut(&chan) else {
        return;
    };
    if counted {
        c.in_flight = c.in_flight.saturating_sub(1);
    }
    let body = match &mut c.seal {
        None => Ok(e2ee::base64::encode(&plain)),
        Some(ch) => ch.seal_body(&plain),
    };
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            // A record that fails midway leaves the channel unusable.
            crate::warn!("uplink: unable to seal an answer on {chan}: {}", e.code());
            forget(d, link, &chan);
            return;
        }
    };
    let frame = json!({"jsonrpc": "2.0", "id": id, "route": {"chan_id": chan}, "body": body});
    send(d, link, line(&frame));
}

/// The start of a channel's session stream: `added` for every session,
/// the daemon's own and then the tmux sessions of the last scan. The
/// channel watches already ("The node subscribes before it sends the
/// snapshot"): it counts as a watcher of the tmux sessions from now on,
/// so a scan starts, whose changes follow as live events.
fn snapshot(d: &mut Daemon, link: u64, chan: &str) {
    let node = d.node_name.clone();
    let own = d
        .core
        .sessions
        .iter()
        .map(|s| crate::socket::views::session(s, &node));
    let tmux = d
        .tmux
        .state
        .sessions()
        .map(|s| crate::socket::methods::tmux::session(s, &node));
    let events: Vec<Value> = own
        .chain(tmux)
        .map(|s| json!({"type": "added", "session": s}))
        .collect();
    for ev in events {
        notify(d, link, chan, "session.event", &ev);
    }
    crate::daemon::router::tmux::chan_watching(d);
}

/// Whether the uplink has a channel open: each watches the sessions.
pub fn any_open(d: &Daemon) -> bool {
    d.uplink
        .as_ref()
        .and_then(|u| u.link.as_ref())
        .is_some_and(|l| !l.chans.is_empty())
}

/// A change of the tmux sessions (`kind` added, updated or removed, with
/// the session's view), for every channel of the link, as the socket's
/// watchers get it.
pub fn on_tmux(d: &mut Daemon, kind: &str, session: &Value) {
    let Some(l) = d.uplink.as_ref().and_then(|u| u.link.as_ref()) else {
        return;
    };
    let (link, chans): (u64, Vec<String>) = (l.id, l.chans.keys().cloned().collect());
    let ev = json!({"type": kind, "session": session});
    let plain = serde_json::to_vec(&ev).unwrap_or_default();
    for chan in chans {
        notify_event(d, link, &chan, &plain);
    }
}

/// A committed change of session `sid`, for every channel of the link.
pub fn on_session(d: &mut Daemon, sid: &str, change: Option<crate::core::sessions::Change>) {
    let kind = match change {
        Some(crate::core::sessions::Change::Added) => "added",
        Some(crate::core::sessions::Change::Updated) => "updated",
        None => return,
    };
    let Some(l) = d.uplink.as_ref().and_then(|u| u.link.as_ref()) else {
        return;
    };
    if l.chans.is_empty() {
        return;
    }
    let (link, chans): (u64, Vec<String>) = (l.id, l.chans.keys().cloned().collect());
    let Some(s) = d.core.sessions.get(sid) else {
        return;
    };
    let ev = json!({"type": kind, "session": crate::socket::views::session(s, &d.node_name)});
    let plain = serde_json::to_vec(&ev).unwrap_or_default();
    for chan in chans {
        notify_event(d, link, &chan, &plain);
    }
}

/// A session the core forgot (ended, evicted): `removed` with its last
/// state (`view`), for every channel of the link.
pub fn on_removed(d: &mut Daemon, view: &Value) {
    let Some(l) = d.uplink.as_ref().and_then(|u| u.link.as_ref()) else {
        return;
    };
    let (link, chans): (u64, Vec<String>) = (l.id, l.chans.keys().cloned().collect());
    let ev = json!({"type": "removed", "session": view});
    let plain = serde_json::to_vec(&ev).unwrap_or_default();
    for chan in chans {
        notify_event(d, link, &chan, &plain);
    }
}

/// Sends a notification on a channel, sealed on an E2EE one.
fn notify(d: &mut Daemon, link: u64, chan: &str, method: &str, params: &Value) {
    let plain = serde_json::to_vec(params).unwrap_or_default();
    notify_plain(d, link, chan, method, &plain);
}

/// Sends a notification whose params are the JSON text `plain` on a
/// channel, sealed on an E2EE one. False when the channel is gone (or goes
/// now, its record failing), so that what was kept for it can go too.
pub fn notify_plain(d: &mut Daemon, link: u64, chan: &str, method: &str, plain: &[u8]) -> bool {
    notify_counted(d, link, chan, method, plain, false)
}

/// A live `session.event` (its params `plain`) on a channel, dropped when
/// the channel's event buffer is full (`UPLINK_CHANNEL_EVENTS`).
fn notify_event(d: &mut Daemon, link: u64, chan: &str, plain: &[u8]) {
    notify_counted(d, link, chan, "session.event", plain, true);
}

fn notify_counted(
    d: &mut Daemon,
    link: u64,
    chan: &str,
    method: &str,
    plain: &[u8],
    counted: bool,
) -> bool {
    let Some(l) = link_mut(d, link) else {
        return false;
    };
    let Some(c) = l.chans.get_mut(chan) else {
        return false;
    };
    // Taken before sealing: a dropped event uses no nonce.
    let ticket = match counted {
        false => None,
        true => match EventTicket::take(&c.events) {
            Some(t) => Some(t),
            None => {
                crate::debug!("uplink: channel {chan} is behind; a session.event is dropped");
                return true;
            }
        },
    };
    let body = match &mut c.seal {
        None => e2ee::base64::encode(plain),
        Some(ch) => match ch.seal_body(plain) {
            Ok(b) => b,
            Err(e) => {
                crate::warn!(
                    "uplink: unable to seal a notification on {chan}: {}",
                    e.code()
                );
                forget(d, link, chan);
                return false;
            }
        },
    };
    let frame =
        json!({"jsonrpc": "2.0", "method": method, "route": {"chan_id": chan}, "body": body});
    let bytes = line(&frame);
    send_out(
        d,
        link,
        match ticket {
            Some(t) => Out::Event(bytes, t),
            None => Out::Line(bytes),
        },
    );
    true
}

/// Forgets channel `chan` of link `link` and what is kept for it (its
/// transcript subscriptions, its terminals).
fn forget(d: &mut Daemon, link: u64, chan: &str) {
    if let Some(l) = link_mut(d, link) {
        l.chans.remove(chan);
    }
    d.socket.watches.forget_chan(link, Some(chan));
    crate::daemon::router::tmux::chan_closed(d, link, Some(chan));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_s_event_buffer_holds_64_until_the_writer_takes_them() {
        let events = Arc::default();
        let mut held: Vec<EventTicket> = (0..limits::UPLINK_CHANNEL_EVENTS)
            .map(|_| EventTicket::take(&events).expect("room"))
            .collect();
        assert!(EventTicket::take(&events).is_none(), "the 65th is dropped");
        drop(held.pop());
        let again = EventTicket::take(&events);
        assert!(again.is_some(), "a taken event makes room");
        drop(again);
        assert_eq!(
            events.load(Ordering::Acquire),
            limits::UPLINK_CHANNEL_EVENTS - 1
        );
    }

    #[test]
    fn params_come_from_an_empty_body_or_an_object() {
        assert!(params_of(b"").unwrap().is_empty());
        assert!(params_of(b"null").unwrap().is_empty());
        assert_eq!(params_of(br#"{"a":1}"#).unwrap()["a"], 1);
        assert_eq!(params_of(b"[1]").unwrap_err().code, Code::InvalidParams);
        assert_eq!(params_of(b"{").unwrap_err().code, Code::ParseError);
    }
}
