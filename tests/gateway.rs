//! The gateway role through the real binary (issue 12, "Tests"): a scripted
//! fake node (uplink) and fake clients speaking WebSocket with tungstenite,
//! against `omniconfluxd gateway` and `omniconfluxd serve --gateway`.

mod util;

use serde_json::{Value, json};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use tungstenite::client::IntoClientRequest;
use tungstenite::{Message, WebSocket};
use util::{Daemon, Opts, PATIENCE, TestDir};

const MASTER: &str = "master-token-of-the-tests";

/// vendor-schemas/gateway/gateway.schema.json, read once.
fn schema() -> &'static Value {
    static DOC: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    DOC.get_or_init(|| {
        let p = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/vendor-schemas/gateway/gateway.schema.json"
        );
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    })
}

/// Checks `v` against `$defs/<def>` of the gateway's schema.
fn check(def: &str, v: &Value) {
    let s = json!({"$ref": format!("#/$defs/{def}")});
    if let Err(e) = util::http::validate(schema(), &s, v, def) {
        panic!("not a valid {def}: {e}");
    }
}

/// Starts `omniconfluxd gateway --listen 127.0.0.1:0` with the master token
/// in the environment; returns it and the address it bound.
fn gateway(dir: &TestDir, config: &str) -> (Daemon, SocketAddr) {
    let d = Daemon::start_command(
        &dir.path,
        Opts {
            config: Some(config.into()),
            extra_args: vec!["--listen".into(), "127.0.0.1:0".into()],
            env: vec![("OMNICONFLUX_GATEWAY_TOKEN".into(), MASTER.into())],
            ..Opts::default()
        },
        "gateway",
    );
    let addr = listen_addr(&d);
    (d, addr)
}

fn listen_addr(d: &Daemon) -> SocketAddr {
    let line = d.wait_log("gateway listening on ");
    let rest = line.split("gateway listening on ").nth(1).unwrap();
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

/// A WebSocket peer that reads the stream as lines.
struct Peer {
    ws: WebSocket<TcpStream>,
    pending: Vec<u8>,
    lines: VecDeque<Value>,
    next_id: u64,
}

/// The refusal of a handshake: status and body (status 0: the
/// connection was closed without an answer).
#[derive(Debug)]
struct Refused(u16, String);

fn dial(addr: SocketAddr, path: &str, bearer: Option<&str>) -> Result<Peer, Refused> {
    let mut req = format!("ws://{addr}{path}").into_client_request().unwrap();
    if let Some(t) = bearer {
        req.headers_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(PATIENCE)).unwrap();
    match tungstenite::client::client(req, tcp) {
        Ok((ws, _)) => Ok(Peer {
            ws,
            pending: Vec::new(),
            lines: VecDeque::new(),
            next_id: 0,
        }),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(r))) => Err(Refused(
            r.status().as_u16(),
            String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into(),
        )),
        // Closed without an answer (status 0): refused before any HTTP.
        Err(e) => Err(Refused(0, e.to_string())),
    }
}

fn client(addr: SocketAddr, token: &str) -> Peer {
    dial(addr, "/client", Some(token)).expect("client connects")
}

/// A client that has seen `node` online in the roster, so that a channel
/// to it can be opened.
fn client_of(addr: SocketAddr, node: &str) -> Peer {
    let mut c = client(addr, MASTER);
    c.expect(&format!("{node} online"), |v| {
        v["method"] == "node.event"
            && v["params"]["node"]["id"] == node
            && v["params"]["node"]["online"] == true
    });
    c
}

impl Peer {
    fn send_text(&mut self, text: &str) {
        self.ws.send(Message::text(text)).unwrap();
    }

    fn send(&mut self, v: &Value) {
        self.send_text(&format!("{v}\n"));
    }

    fn request(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}));
        id
    }

    /// The next line, or `None` when the connection ends.
    fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(v) = self.lines.pop_front() {
                return Some(v);
            }
            let msg = self.ws.read().ok()?;
            let bytes = match &msg {
                Message::Text(t) => t.as_bytes().to_vec(),
                Message::Binary(b) => b.to_vec(),
                Message::Close(_) => return None,
                _ => continue,
            };
            self.pending.extend_from_slice(&bytes);
            while let Some(i) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=i).collect();
                if line.iter().all(|b| b.is_ascii_whitespace()) {
                    continue;
                }
                let v: Value = serde_json::from_slice(&line).expect("a JSON line");
                // Every line the gateway writes is one its schema allows.
                check("line", &v);
                self.lines.push_back(v);
            }
        }
    }

    /// Waits for the line `pick` accepts, keeping the others for later.
    fn expect(&mut self, what: &str, pick: impl Fn(&Value) -> bool) -> Value {
        let mut skipped = VecDeque::new();
        let found = loop {
            match self.next() {
                Some(v) if pick(&v) => break v,
                Some(v) => skipped.push_back(v),
                None => panic!("connection ended waiting for {what}; saw {skipped:?}"),
            }
        };
        skipped.extend(self.lines.drain(..));
        self.lines = skipped;
        found
    }

    fn answer(&mut self, id: u64) -> Value {
        self.expect(&format!("the answer to {id}"), |v| {
            v["id"] == json!(id) && v.get("method").is_none() && v.get("route").is_none()
        })
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.request(method, params);
        self.answer(id)
    }

    /// Opens a relay channel to `node`: its id.
    fn open_chan(&mut self, node: &str) -> String {
        let r = self.call("relay.open", json!({ "node_id": node }));
        r["result"]["chan_id"]
            .as_str()
            .unwrap_or_else(|| panic!("relay.open failed: {r}"))
            .to_string()
    }

    fn node_event(&mut self, kind: &str, node: &str) -> Value {
        self.expect(&format!("node.event {kind} {node}"), |v| {
            v["method"] == "node.event"
                && v["params"]["type"] == kind
                && v["params"]["node"]["id"] == node
        })["params"]["node"]
            .clone()
    }

    /// Whether the gateway closed the connection.
    fn closed(&mut self) -> bool {
        loop {
            match self.next() {
                None => return true,
                Some(_) => continue,
            }
        }
    }
}

/// A fake node: dials `/node`, answers `node.identify` with `identify`.
fn node(addr: SocketAddr, identify: Value) -> Peer {
    let mut n = dial(addr, "/node", Some(MASTER)).expect("node connects");
    let req = n.expect("node.identify", |v| v["method"] == "node.identify");
    n.send(&json!({"jsonrpc":"2.0","id":req["id"],"result":identify}));
    n
}

fn ident(id: &str) -> Value {
    json!({"id": id, "label": format!("{id} box"), "version": "9.9.9",
           "capabilities": {"spawn_session": true, "terminal": false, "host_wakelock": false, "future_thing": 7},
           "identity_pubkey": "AAAA", "tip": "ignored"})
}

fn b64(s: &str) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn relay_req(chan: &str, node: &str, id: u64, method: &str, body: &str) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":method,"route":{"chan_id":chan,"node_id":node},"body":b64(body)})
}

/// A raw HTTP request on a fresh connection: the response head, and the
/// body when the connection is not upgraded.
fn raw_http(addr: SocketAddr, head: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    while !out.ends_with(b"\r\n\r\n") && s.read(&mut b).unwrap_or(0) == 1 {
        out.push(b[0]);
    }
    if !out.starts_with(b"HTTP/1.1 101") {
        let _ = s.read_to_end(&mut out);
    }
    String::from_utf8_lossy(&out).into()
}

#[test]
fn tokens_are_checked_before_any_upgrade() {
    let dir = TestDir::new("gw-auth");
    let (_d, addr) = gateway(&dir, "");
    // No token, a wrong token, a client route token on /node: 401, body unauthorized.
    let r = dial(addr, "/client", None).err().expect("refused");
    assert_eq!((r.0, r.1.as_str()), (401, "unauthorized"));
    let r = dial(addr, "/client", Some("wrong")).err().expect("refused");
    assert_eq!(r.0, 401);
    let r = dial(addr, "/nodes", Some(MASTER)).err().expect("refused");
    assert_eq!(r.0, 404, "exactly two routes");
    // Not the exact text "Bearer ": the query parameter is read instead.
    let key = "dGhlIHNhbXBsZSBub25jZQ==";
    let head = |path: &str, auth: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n{auth}\r\n"
        )
    };
    let out = raw_http(
        addr,
        &head("/client", &format!("Authorization: bearer {MASTER}\r\n")),
    );
    assert!(out.starts_with("HTTP/1.1 401"), "{out}");
    assert!(out.ends_with("\r\n\r\nunauthorized"), "{out}");
    assert!(
        !out.to_lowercase().contains("sec-websocket-accept"),
        "{out}"
    );
    let out = raw_http(
        addr,
        &head(
            &format!("/client?token={MASTER}"),
            "Authorization: Basic eDp5\r\n",
        ),
    );
    assert!(out.starts_with("HTTP/1.1 101"), "query fallback: {out}");
    // A Bearer header wins over the query.
    let out = raw_http(
        addr,
        &head(
            &format!("/client?token={MASTER}"),
            "Authorization: Bearer nope\r\n",
        ),
    );
    assert!(out.starts_with("HTTP/1.1 401"), "{out}");
    // The master token is accepted on both routes.
    let mut c = client(addr, MASTER);
    assert_eq!(c.call("ping", json!(null))["result"], Value::Null);
    let mut n = dial(addr, "/node", Some(MASTER)).expect("node");
    n.expect("node.identify", |v| v["method"] == "node.identify");
}

#[test]
fn framing_is_a_byte_stream_of_lines() {
    let dir = TestDir::new("gw-frame");
    let (_d, addr) = gateway(&dir, "");
    let mut c = client(addr, MASTER);
    // One frame split across three messages, then three frames (and empty
    // lines) in one message.
    c.send_text("{\"jsonrpc\":\"2.0\",\"id\":1,");
    c.send_text("\"method\":\"pi");
    c.send_text("ng\"}\n");
    assert_eq!(
        c.next().unwrap(),
        json!({"jsonrpc":"2.0","id":1,"result":null})
    );
    c.send_text("{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}\n\n\r\n{not json\n{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"nodes.list\"}\n");
    assert_eq!(c.next().unwrap()["id"], 2);
    let pe = c.next().unwrap();
    assert_eq!(pe["error"]["code"], -32700);
    assert_eq!(pe["error"]["message"], "parse error");
    assert!(pe.get("id").is_none(), "no id: {pe}");
    assert_eq!(
        c.next().unwrap(),
        json!({"jsonrpc":"2.0","id":3,"result":{"nodes":[]}})
    );
    // Methods the gateway does not serve here.
    for m in [
        "server.stop",
        "server.upgrade",
        "trustlog.push",
        "push.vapidKey",
        "sessions.list",
    ] {
        let r = c.call(m, json!({}));
        assert_eq!(r["error"]["code"], -32601, "{m}: {r}");
        assert_eq!(r["error"]["message"], "method not found");
    }
    let info = c.call("server.info", json!(null))["result"].clone();
    check("ServerInfo", &info);
    assert_eq!(info["nodes"], json!([]));
    assert_eq!(info["pushPortConfigured"], false);
    // A line past 16 MiB closes the connection; another one is untouched.
    let mut other = client(addr, MASTER);
    let big = "x".repeat(16 * 1024 * 1024 + 1);
    let _ =
        c.ws.send(Message::text(format!("\"{}", &big[..8 * 1024 * 1024])));
    let _ = c.ws.send(Message::text(&big[8 * 1024 * 1024..]));
    assert!(c.closed());
    assert_eq!(other.call("ping", json!(null))["result"], Value::Null);
}

#[test]
fn websocket_frames_follow_rfc_6455() {
    use tungstenite::protocol::frame::Frame;
    use tungstenite::protocol::frame::coding::{Data, OpCode};
    let dir = TestDir::new("gw-rfc6455");
    let (_d, addr) = gateway(&dir, "");
    // A frame sent in the same write as the handshake, before its answer,
    // is read after it, not lost.
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(PATIENCE)).unwrap();
    let ping = b"{\"jsonrpc\":\"2.0\",\"id\":\"early\",\"method\":\"ping\"}\n";
    let key = [9u8, 8, 7, 6];
    let mut wire = format!(
        "GET /client HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Authorization: Bearer {MASTER}\r\n\r\n"
    )
    .into_bytes();
    wire.extend([0x81, 0x80 | ping.len() as u8]);
    wire.extend(key);
    wire.extend(ping.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    tcp.write_all(&wire).unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8];
        tcp.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let ws = WebSocket::from_raw_socket(tcp, tungstenite::protocol::Role::Client, None);
    let mut c = Peer {
        ws,
        pending: Vec::new(),
        lines: VecDeque::new(),
        next_id: 0,
    };
    assert_eq!(
        c.next().unwrap(),
        json!({"jsonrpc":"2.0","id":"early","result":null})
    );
    // A WebSocket ping is answered with a pong of its payload.
    c.ws.send(Message::Ping("p1".into())).unwrap();
    match c.ws.read().unwrap() {
        Message::Pong(p) => assert_eq!(&p[..], b"p1"),
        m => panic!("{m:?}"),
    }
    // A message in fragments, a ping between them, and a code point cut
    // by a fragment boundary.
    let text = |b: &[u8], fin| Frame::message(b.to_vec(), OpCode::Data(Data::Text), fin);
    let cont = |b: &[u8], fin| Frame::message(b.to_vec(), OpCode::Data(Data::Continue), fin);
    c.ws.send(Message::Frame(text(
        b"{\"jsonrpc\":\"2.0\",\"id\":\"\xC3",
        false,
    )))
    .unwrap();
    c.ws.send(Message::Frame(Frame::ping(b"p2".to_vec())))
        .unwrap();
    c.ws.send(Message::Frame(cont(b"\xA9\",\"method\":", false)))
        .unwrap();
    c.ws.send(Message::Frame(cont(b"\"ping\"}\n", true)))
        .unwrap();
    assert_eq!(
        c.next().unwrap(),
        json!({"jsonrpc":"2.0","id":"é","result":null})
    );
    // A text message that is not UTF-8 closes the connection.
    c.ws.send(Message::Frame(text(b"{\"id\":\"\xC3(\"}\n", true)))
        .unwrap();
    assert!(c.closed());
}

#[test]
fn the_roster_follows_uplinks() {
    let dir = TestDir::new("gw-roster");
    let (_d, addr) = gateway(&dir, "");
    let mut c = client(addr, MASTER);
    let n1 = node(addr, ident("home"));
    let added = c.node_event("added", "home");
    assert_eq!(added["online"], true);
    assert_eq!(added["label"], "home box");
    assert_eq!(added["identity_pubkey"], "AAAA");
    assert_eq!(
        added["capabilities"]["future_thing"], 7,
        "unknown capability keys pass"
    );
    assert!(added.get("tip").is_none());
    // A late client gets the snapshot.
    let mut late = client(addr, MASTER);
    assert_eq!(late.node_event("added", "home")["online"], true);
    let list = late.call("nodes.list", json!({}))["result"].clone();
    check("NodesList", &list);
    let list = list["nodes"].clone();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["id"], "home");
    let info = late.call("server.info", json!({}))["result"].clone();
    check("ServerInfo", &info);
    assert_eq!(info["nodes"][0]["id"], "home");
    // Disconnect: offline; a client that joins now sees it with online false.
    drop(n1);
    assert_eq!(c.node_event("offline", "home")["online"], false);
    let mut third = client(addr, MASTER);
    assert_eq!(third.node_event("added", "home")["online"], false);
    let r = third.call("relay.open", json!({"node_id": "home"}));
    assert_eq!(r["error"]["message"], "unknown node: home");
    // Back within 30 s: online, not added.
    let mut n2 = node(addr, ident("home"));
    assert_eq!(c.node_event("online", "home")["online"], true);
    // A second uplink with the same id replaces the first.
    let _n3 = node(addr, ident("home"));
    assert!(n2.closed(), "the replaced uplink is closed");
    c.node_event("offline", "home");
    c.node_event("online", "home");
    // An unusable id closes the uplink.
    let mut bad = dial(addr, "/node", Some(MASTER)).unwrap();
    let req = bad.expect("identify", |v| v["method"] == "node.identify");
    bad.send(&json!({"jsonrpc":"2.0","id":req["id"],"result":{"id":"a:b"}}));
    assert!(bad.closed());
}

#[test]
fn a_node_gone_for_30_seconds_is_removed() {
    let dir = TestDir::new("gw-grace");
    let (_d, addr) = gateway(&dir, "");
    let mut c = client(addr, MASTER);
    let n = node(addr, ident("away"));
    c.node_event("added", "away");
    let gone = Instant::now();
    drop(n);
    c.node_event("offline", "away");
    // The grace is the protocol's 30 s: wait for the event it ends with.
    c.node_event("removed", "away");
    assert!(
        gone.elapsed() >= Duration::from_secs(29),
        "removed before the grace"
    );
    assert_eq!(
        c.call("nodes.list", json!({}))["result"]["nodes"],
        json!([])
    );
}

#[test]
fn relay_channels_forward_both_ways_to_their_owners_only() {
    let dir = TestDir::new("gw-relay");
    let (_d, addr) = gateway(&dir, "");
    let mut n = node(addr, ident("home"));
    let mut a = client_of(addr, "home");
    let mut b = client_of(addr, "home");
    for (m, p, want) in [
        (
            "relay.open",
            json!({}),
            "invalid params: missing field `node_id`",
        ),
        // No params at all reads as none given, not as a type of ours.
        (
            "relay.open",
            Value::Null,
            "invalid params: missing field `node_id`",
        ),
        (
            "relay.open",
            json!({"node_id": "elsewhere"}),
            "unknown node: elsewhere",
        ),
        ("relay.close", json!({"chan": 1}), "invalid params: "),
    ] {
        let r = a.call(m, p);
        assert_eq!(r["error"]["code"], -32600, "{r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.starts_with(want), "{msg}");
    }
    let ca = a.open_chan("home");
    let cb = b.open_chan("home");
    assert!(ca.starts_with('c') && cb.starts_with('c') && ca != cb);
    // Client to node, as sent.
    let f = relay_req(&ca, "home", 42, "sessions.list", "{}");
    a.send(&f);
    assert_eq!(n.next().unwrap(), f);
    // Node to client.
    let resp =
        json!({"jsonrpc":"2.0","id":42,"route":{"chan_id":ca},"body":b64("{\"result\":[]}")});
    n.send(&resp);
    assert_eq!(
        a.expect("relayed answer", |v| v.get("route").is_some()),
        resp
    );
    // B writes on A's channel, the node on an unknown one: both dropped
    // without a reply; what follows still flows.
    b.send(&relay_req(&ca, "home", 7, "sessions.kill", "{}"));
    n.send(&json!({"jsonrpc":"2.0","method":"x","route":{"chan_id":"c999"},"body":""}));
    assert_eq!(b.call("ping", json!(null))["result"], Value::Null);
    let g = relay_req(&cb, "home", 8, "sessions.list", "");
    b.send(&g);
    assert_eq!(
        n.next().unwrap(),
        g,
        "B's stray frame never reached the node"
    );
    // relay.close: null also for a channel the caller does not own (left open).
    assert_eq!(
        b.call("relay.close", json!({"chan_id": ca}))["result"],
        Value::Null
    );
    a.send(&f);
    assert_eq!(n.next().unwrap(), f);
    assert_eq!(
        a.call("relay.close", json!({"chan_id": ca}))["result"],
        Value::Null
    );
    assert_eq!(
        n.next().unwrap(),
        json!({"jsonrpc":"2.0","method":"relay.closed","params":{"chan_id":ca}})
    );
    a.send(&f);
    // The client disconnects: its channel closes.
    drop(b);
    assert_eq!(
        n.next().unwrap()["params"]["chan_id"],
        json!(cb),
        "only relay.closed, not A's frame"
    );
    // 64 channels per client, the 65th refused.
    for _ in 0..64 {
        assert!(a.call("relay.open", json!({"node_id":"home"}))["result"]["chan_id"].is_string());
    }
    let r = a.call("relay.open", json!({"node_id":"home"}));
    assert_eq!(
        r["error"]["message"],
        "too many open channels for this client"
    );
    assert_eq!(r["error"]["code"], -32600);
}

/// A gateway, a node "home" that will stall, and a client with a channel
/// open to it. The node stalls for as long as the client sends: no write
/// deadline may end it first.
fn stalling_node(dir: &TestDir) -> (Daemon, Peer, Peer, String) {
    let (d, addr) = gateway(dir, "[gateway]\nwrite_timeout_ms = 600000\n");
    let n = node(addr, ident("home"));
    let mut a = client_of(addr, "home");
    let chan = a.open_chan("home");
    (d, n, a, chan)
}

/// Sends relay requests 1..=total on `chan`, and returns once the gateway
/// has read them all (it answers a `ping` after every frame before it).
fn send_frames(a: &mut Peer, chan: &str, method: &str, body: &str, total: u64) {
    for i in 1..=total {
        a.send(&relay_req(chan, "home", i, method, body));
    }
    assert_eq!(a.call("ping", json!(null))["result"], Value::Null);
}

#[test]
fn a_full_channel_queue_closes_the_channel_without_dropping_a_frame() {
    let dir = TestDir::new("gw-ovfl");
    let (_d, mut n, mut a, chan) = stalling_node(&dir);
    // The node reads nothing while the client sends far more than the
    // socket buffers and 64 queued frames hold.
    let body = "y".repeat(256 * 1024);
    let total = 200u64;
    send_frames(&mut a, &chan, "big", &body, total);
    // Now the node reads: a prefix 1..k in order, then relay.closed.
    let mut expected = 1;
    loop {
        let v = n.next().expect("the uplink stays open");
        if v["method"] == "relay.closed" {
            assert_eq!(v["params"]["chan_id"], json!(chan));
            break;
        }
        assert_eq!(
            v["id"],
            json!(expected),
            "frames arrive in order, none missing"
        );
        expected += 1;
    }
    let delivered = expected - 1;
    assert!(
        delivered < total,
        "the channel was closed before all frames"
    );
    assert!(
        delivered >= 64,
        "at least the queue's 64 frames got through"
    );
}

/// Frames written straight to a node whose socket fills mid-frame (the
/// rest finished by its writer) arrive whole and in order, and the node
/// keeps its uplink: a relay frame the socket takes only in part once
/// closed the connection after finishing it.
#[test]
fn a_node_whose_socket_fills_mid_frame_keeps_its_uplink() {
    let dir = TestDir::new("gw-fill");
    let (_d, mut n, mut a, chan) = stalling_node(&dir);
    // Frames small enough to be written directly (150 KiB, 200 KiB as
    // base64, under a direct write's 256 KiB), while the node reads
    // nothing, until its socket buffers are full: more than they hold,
    // less than the channel's 64 frames and 32 MiB.
    let body = "y".repeat(150 * 1024);
    let total = 48u64;
    send_frames(&mut a, &chan, "fill", &body, total);
    for i in 1..=total {
        let v = n.next().expect("the uplink stays open");
        assert_eq!(v["id"], json!(i), "frames arrive in order, none missing");
        assert_eq!(v["body"].as_str(), Some(b64(&body).as_str()));
    }
    // Both ways still work on the same connections.
    a.send(&relay_req(&chan, "home", 99, "after", ""));
    n.expect("the frame after the fill", |v| v["id"] == json!(99));
    n.send(&json!({"jsonrpc":"2.0","id":99,"route":{"chan_id":chan},"body":""}));
    a.expect("the node's answer", |v| v["id"] == json!(99));
}

#[test]
fn a_client_that_does_not_read_is_closed_and_others_keep_going() {
    let dir = TestDir::new("gw-slow");
    let (_d, addr) = gateway(&dir, "[gateway]\nwrite_timeout_ms = 1000\n");
    let mut n = node(addr, ident("home"));
    let mut slow = client_of(addr, "home");
    let mut fast = client_of(addr, "home");
    let cs = slow.open_chan("home");
    let cf = fast.open_chan("home");
    // The node floods the slow client, which reads nothing, with 1 MiB
    // frames: more than the socket buffers hold, fewer than the channel's
    // 64 frames and 32 MiB.
    let body = b64(&"z".repeat(768 * 1024));
    for i in 0..24 {
        n.send(&json!({"jsonrpc":"2.0","method":"flood","route":{"chan_id":cs},"body":body,"n":i}));
    }
    // Meanwhile the fast client's round trips go on.
    for i in 0..50 {
        fast.send(&relay_req(&cf, "home", 1000 + i, "ping", ""));
        n.expect("fast frame", |v| v["id"] == json!(1000 + i));
        n.send(&json!({"jsonrpc":"2.0","id":1000 + i,"route":{"chan_id":cf},"body":""}));
        fast.expect("fast answer", |v| v["id"] == json!(1000 + i));
    }
    // The slow client's connection was closed: its channel with it.
    let closed = n.expect("relay.closed of the slow channel", |v| {
        v["method"] == "relay.closed" && v["params"]["chan_id"] == json!(cs)
    });
    assert_eq!(closed["params"]["chan_id"], json!(cs));
    assert!(slow.closed());
    assert_eq!(fast.call("ping", json!(null))["result"], Value::Null);
}

fn sha256_hex(s: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn pairing_stores_a_token_id_and_admin_methods_need_the_master_token() {
    let dir = TestDir::new("gw-pair");
    let (d, addr) = gateway(&dir, "[gateway]\npublic_url = \"wss://gw.example\"\n");
    let mut admin = client(addr, MASTER);
    let started = admin.call("clients.pairStart", json!({}))["result"].clone();
    check("PairStart", &started);
    let token = started["token"].as_str().unwrap().to_string();
    assert_eq!(token.len(), 64);
    assert!(
        token
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );
    assert_eq!(started["url"], "wss://gw.example");
    let wait = admin.request("clients.pairAwait", json!({"token": token}));
    // A pending token is no node token; a guessed one is nothing.
    assert_eq!(dial(addr, "/node", Some(&token)).err().unwrap().0, 401);
    assert_eq!(
        dial(addr, "/client", Some(&"a".repeat(64)))
            .err()
            .unwrap()
            .0,
        401
    );
    // The device connects: the await wakes.
    let mut device = client(addr, &token);
    assert_eq!(admin.answer(wait)["result"], json!({"connected": true}));
    // A second await, and one for an unknown token: false, no error.
    assert_eq!(
        admin.call("clients.pairAwait", json!({"token": token}))["result"],
        json!({"connected": false})
    );
    assert_eq!(
        admin.call("clients.pairAwait", json!({"token": "nope"}))["result"],
        json!({"connected": false})
    );
    // The device is no admin.
    for m in [
        "clients.list",
        "clients.pairStart",
        "clients.remove",
        "pushport.setToken",
    ] {
        let r = device.call(m, json!({}));
        assert_eq!(r["error"]["code"], -32600, "{m}: {r}");
        assert_eq!(r["error"]["message"], "unauthorized: admin token required");
    }
    assert_eq!(
        device.call("nodes.list", json!({}))["result"]["nodes"],
        json!([])
    );
    // Stored by its SHA-256, never raw.
    let id = sha256_hex(&token);
    let list = admin.call("clients.list", json!({}))["result"].clone();
    check("ClientsList", &list);
    assert_eq!(list[0]["token"], json!(id));
    assert!(list[0]["created_at"].is_string());
    let db = std::fs::read(d.state.join("gateway.sqlite3")).unwrap();
    let raw = String::from_utf8_lossy(&db);
    assert!(!raw.contains(&token), "the raw token is never stored");
    // It persists across a restart.
    drop((device, admin));
    assert!(d.stop().success());
    let (_d, addr) = gateway(&dir, "");
    let mut device = client(addr, &token);
    assert_eq!(device.call("ping", json!(null))["result"], Value::Null);
    // Removing it closes its connection and refuses it from then on.
    let mut admin = client(addr, MASTER);
    let r = admin.call("clients.remove", json!({"token": id}));
    assert_eq!(r["result"], Value::Null, "{r}");
    assert!(device.closed());
    assert_eq!(dial(addr, "/client", Some(&token)).err().unwrap().0, 401);
    assert_eq!(admin.call("clients.list", json!({}))["result"], json!([]));
}

#[test]
fn a_pairing_no_device_takes_ends_after_60_seconds() {
    let dir = TestDir::new("gw-pairto");
    let (_d, addr) = gateway(&dir, "");
    let mut admin = client(addr, MASTER);
    admin
        .ws
        .get_mut()
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let token = admin.call("clients.pairStart", json!({}))["result"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    let t0 = Instant::now();
    let r = admin.call("clients.pairAwait", json!({"token": token}));
    assert_eq!(r["result"], json!({"connected": false}));
    assert!(
        t0.elapsed() >= Duration::from_secs(55),
        "answered before the 60 s"
    );
    // Expired: the token no longer pairs.
    assert_eq!(dial(addr, "/client", Some(&token)).err().unwrap().0, 401);
}

#[test]
fn pair_on_the_gateway_socket_prints_the_uri_and_waits_for_the_device() {
    use std::io::BufRead;
    let dir = TestDir::new("gw-paircli");
    let (d, addr) = gateway(&dir, "");
    let mut child = std::process::Command::new(util::bin())
        .args([
            "--socket",
            d.socket.to_str().unwrap(),
            "pair",
            "--url",
            "ws://h:1",
            "--e2e",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let uri = first.trim();
    assert!(
        uri.starts_with("argus://pair?url=ws%3A%2F%2Fh%3A1&token="),
        "{uri}"
    );
    assert!(uri.ends_with("&e2e=true"), "{uri}");
    let token = uri
        .split("token=")
        .nth(1)
        .unwrap()
        .split('&')
        .next()
        .unwrap();
    let mut rest = String::new();
    // The QR code and the waiting line come before the device connects.
    loop {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        rest.push_str(&l);
        if l.starts_with("waiting") {
            break;
        }
    }
    assert!(
        rest.contains('\u{2588}') || rest.contains('\u{2580}'),
        "a QR code: {rest}"
    );
    let _device = client(addr, token);
    let mut tail = String::new();
    out.read_to_string(&mut tail).unwrap();
    assert!(child.wait().unwrap().success());
    assert!(tail.contains("paired: the device connected"), "{tail}");
    // The gateway socket answers server.info with no nodes, and clients.
    let (code, text, _) =
        util::run_cli(&["--socket", d.socket.to_str().unwrap(), "--json", "clients"]);
    assert_eq!(code, 0);
    let list: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(list[0]["token"], json!(sha256_hex(token)));
    let mut s = util::Client::new(
        std::os::unix::net::UnixStream::connect(
            d.socket.with_file_name("omniconfluxd-gateway.sock"),
        )
        .unwrap(),
    );
    let info = s.call("server.info", json!({}));
    assert_eq!(info["nodes"], json!([]));
    let err = s.request("server.restart", json!({}));
    assert_eq!(err["error"]["code"], -32601);
}

#[test]
fn the_node_runs_the_gateway_with_serve_gateway() {
    let dir = TestDir::new("gw-innode");
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            extra_args: vec!["--gateway".into(), "127.0.0.1:0".into()],
            ..Opts::default()
        },
    );
    let addr = listen_addr(&d);
    // The master token was made at first start: 0600, 64 lowercase hex.
    let path = d.state.join("gateway.token");
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o600
    );
    let master = std::fs::read_to_string(&path)
        .unwrap()
        .trim_end()
        .to_string();
    assert_eq!(master.len(), 64);
    assert!(
        master
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    );
    let mut n = dial(addr, "/node", Some(&master)).expect("node");
    let req = n.expect("identify", |v| v["method"] == "node.identify");
    n.send(&json!({"jsonrpc":"2.0","id":req["id"],"result":ident("far")}));
    // server.info and status name the address the gateway bound.
    let mut s = d.connect();
    let info = s.call("server.info", json!({}));
    assert_eq!(info["gateway"]["address"], json!(addr.to_string()));
    let (code, text, err) = util::run_cli(&["--socket", d.socket.to_str().unwrap(), "status"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("gateway") && l.ends_with(&addr.to_string())),
        "{text}"
    );
    // The operator pairs a device on the node socket.
    let started = s.call("clients.pairStart", json!({}));
    check("PairStart", &started);
    let token = started["token"].as_str().unwrap().to_string();
    let wait =
        json!({"jsonrpc":"2.0","id":"await","method":"clients.pairAwait","params":{"token":token}});
    s.send_raw(format!("{wait}\n").as_bytes());
    let mut device = dial(addr, "/client", Some(&token)).expect("device");
    let answer = s.read_line().unwrap();
    assert_eq!(answer["id"], "await");
    assert_eq!(answer["result"], json!({"connected": true}));
    assert_eq!(device.node_event("added", "far")["online"], true);
    let list = s.call("clients.list", json!({}));
    check("ClientsList", &list);
    assert_eq!(list[0]["token"], json!(sha256_hex(&token)));
    // Kept in the ledger, by id only.
    let db = std::fs::read(d.state.join("ledger.sqlite3")).unwrap();
    assert!(!String::from_utf8_lossy(&db).contains(&token));
    // Relay through the node's gateway.
    let chan = device.call("relay.open", json!({"node_id":"far"}))["result"]["chan_id"]
        .as_str()
        .unwrap()
        .to_string();
    let f = relay_req(&chan, "far", 1, "node.identify", "");
    device.send(&f);
    assert_eq!(n.next().unwrap(), f);
    assert_eq!(
        s.error_code("clients.remove", json!({"token": "0".repeat(64)})),
        "not-found"
    );
    assert!(d.stop().success());
}

#[test]
fn clients_methods_need_the_gateway_role() {
    let dir = TestDir::new("gw-off");
    let d = Daemon::start(&dir.path);
    let mut s = d.connect();
    assert_eq!(s.error_code("clients.list", json!({})), "unavailable");
    assert_eq!(s.call("server.info", json!({}))["gateway"], Value::Null);
    let (code, _, err) = util::run_cli(&["--socket", d.socket.to_str().unwrap(), "clients"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("gateway role is not running"), "{err}");
}

#[test]
fn silent_sockets_of_one_peer_cannot_hold_every_slot() {
    let dir = TestDir::new("gw-silent");
    let (_d, addr) = gateway(&dir, "");
    let mut client_ok = client(addr, MASTER);
    // 64 sockets that never send a handshake: the peer's share.
    let silent: Vec<TcpStream> = (0..64).map(|_| TcpStream::connect(addr).unwrap()).collect();
    // Once all 64 are being handshaken, the next one from this address is
    // closed at once, without an answer.
    let refused = (0..1000).find_map(|_| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(0) => Some(()),
            _ => None,
        }
    });
    assert!(refused.is_some(), "a 65th handshake was closed");
    // A connection already made is unaffected; after the silent ones go,
    // new handshakes succeed.
    assert_eq!(client_ok.call("ping", json!(null))["result"], Value::Null);
    drop(silent);
    let mut again = (0..1000)
        .find_map(|_| dial(addr, "/client", Some(MASTER)).ok())
        .expect("handshakes are admitted again");
    assert_eq!(again.call("ping", json!(null))["result"], Value::Null);
}

// ---- the trust log's distribution (issue 14; seed 004, Distribution) ----

fn signing_key(n: u8) -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[n; 32])
}

/// A chain of `n` entries: a genesis by key 1, then devices authorized.
fn trust_chain(n: usize, key_len: usize) -> Vec<omniconfluxd::trustlog::Entry> {
    use omniconfluxd::trustlog::{Content, Kind};
    let k = signing_key(1);
    let me = k.verifying_key().to_bytes().to_vec();
    let mut out = vec![
        Content {
            kind: Kind::Genesis,
            prev: vec![],
            signers: vec![me.clone()],
            disablements: vec![],
            key: vec![],
            signer: me.clone(),
            replaces: vec![],
        }
        .sign(&k)
        .unwrap(),
    ];
    for i in 1..n {
        let mut key = vec![0u8; key_len];
        key[..8].copy_from_slice(&(i as u64).to_be_bytes());
        let e = Content {
            kind: Kind::AuthorizeDevice,
            prev: out[i - 1].hash().0.to_vec(),
            signers: vec![],
            disablements: vec![],
            key,
            signer: me.clone(),
            replaces: vec![],
        }
        .sign(&k)
        .unwrap();
        out.push(e);
    }
    out
}

fn b64_bytes(b: &[u8]) -> Value {
    json!(omniconfluxd::e2ee::base64::encode(b))
}

fn wires(entries: &[&omniconfluxd::trustlog::Entry]) -> Value {
    Value::Array(entries.iter().map(|e| b64_bytes(e.wire())).collect())
}

fn hashes(entries: &[&omniconfluxd::trustlog::Entry]) -> Value {
    Value::Array(entries.iter().map(|e| b64_bytes(&e.hash().0)).collect())
}

#[test]
fn the_gateway_carries_the_trust_log_between_nodes_and_clients() {
    let dir = TestDir::new("gw-trust");
    let (_d, addr) = gateway(&dir, "");
    let chain = trust_chain(3, 32);
    let (g, e1, e2) = (&chain[0], &chain[1], &chain[2]);
    let mut pusher = node(addr, ident("pusher"));
    let mut other = node(addr, ident("other"));
    let mut c = client_of(addr, "other");
    c.node_event("added", "pusher");
    // Nothing held: an empty answer; a node that holds entries is asked
    // for them (want) and told that nothing is shared (disjoint).
    let r = c.call("trustlog.sync", json!({}))["result"].clone();
    check("TrustlogSync", &r);
    assert_eq!(r, json!({}));
    let r = pusher.call("trustlog.sync", json!({"known": hashes(&[g, e1])}))["result"].clone();
    check("TrustlogSync", &r);
    assert_eq!(r, json!({"want": hashes(&[g, e1]), "disjoint": true}));
    // The node pushes them, children first: the other uplink is told the
    // new heads, each client to sync; the pusher is not told.
    let id = pusher.request("trustlog.push", json!({"entries": wires(&[e1, g])}));
    let answer = pusher.next().unwrap();
    assert_eq!(
        answer,
        json!({"jsonrpc":"2.0","id":id,"result":null}),
        "the pusher gets no trustlog.changed"
    );
    let changed = other.expect("trustlog.changed", |v| v["method"] == "trustlog.changed");
    assert_eq!(changed["params"], json!({"heads": hashes(&[e1])}));
    let ev = c.expect("trust-changed", |v| v["params"]["type"] == "trust-changed");
    assert_eq!(
        ev["params"]["node"],
        json!({"id": "", "label": "", "version": "", "capabilities": {}, "online": false})
    );
    // A client that knows nothing gets every entry, parents first; one
    // that holds the genesis gets the rest; an entry pushed twice is held
    // once.
    let r = c.call("trustlog.sync", json!({}))["result"].clone();
    assert_eq!(r, json!({"entries": wires(&[g, e1])}));
    let r = pusher.call("trustlog.push", json!({"entries": wires(&[g, e1, e2, e2])}));
    assert_eq!(r["result"], Value::Null, "{r}");
    let changed = other.expect("trustlog.changed", |v| v["method"] == "trustlog.changed");
    assert_eq!(changed["params"], json!({"heads": hashes(&[e2])}));
    let r = c.call(
        "trustlog.sync",
        json!({"known": hashes(&[g]), "truncated": true}),
    )["result"]
        .clone();
    check("TrustlogSync", &r);
    assert_eq!(r, json!({"entries": wires(&[e1, e2])}));
    // A known hash the gateway lacks is wanted; a truncated list is never
    // disjoint.
    let alien = &trust_chain(2, 33)[1];
    let r = pusher.call(
        "trustlog.sync",
        json!({"known": hashes(&[alien]), "truncated": true}),
    )["result"]
        .clone();
    assert_eq!(r["want"], hashes(&[alien]));
    assert!(r.get("disjoint").is_none(), "{r}");
    // Refusals: a client may not push; bad params; a list past 4,096.
    let r = c.call("trustlog.push", json!({"entries": wires(&[g])}));
    assert_eq!(r["error"]["code"], -32601, "{r}");
    for bad in [
        json!({"entries": ["not base64!"]}),
        json!({"entries": [b64_bytes(b"\x09 no entry")]}),
        json!({"entries": "x"}),
    ] {
        let r = pusher.call("trustlog.push", bad.clone());
        assert_eq!(r["error"]["code"], -32600, "{bad}: {r}");
        assert_eq!(r["error"]["data"]["code"], "invalid-params", "{r}");
    }
    let r = c.call("trustlog.sync", json!({"known": [b64_bytes(b"short")]}));
    assert_eq!(r["error"]["data"]["code"], "invalid-params", "{r}");
    let many: Vec<Value> = (0..4097).map(|_| b64_bytes(&g.hash().0)).collect();
    let r = c.call("trustlog.sync", json!({"known": many}));
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(r["error"]["data"]["code"], "trustlog-known-too-long", "{r}");
    // Past the gateway's bound (8 MiB of entries) a push is refused whole.
    let big = trust_chain(10, 1_000_000);
    let refs: Vec<&omniconfluxd::trustlog::Entry> = big.iter().collect();
    let r = pusher.call("trustlog.push", json!({"entries": wires(&refs)}));
    assert_eq!(r["error"]["data"]["code"], "trustlog-full", "{r}");
    let r = c.call("trustlog.sync", json!({}))["result"].clone();
    assert_eq!(r, json!({"entries": wires(&[g, e1, e2])}));
}
