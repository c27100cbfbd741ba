//! The uplink through the real binaries (issue 13, "Uplink", "Channels as
//! connections", "Noise IK"): `omniconfluxd gateway` standalone and a node
//! (`omniconfluxd serve` with `[uplink] url`), or a node that runs the
//! gateway itself (`serve --gateway`); a scripted client on `/client`
//! speaks WebSocket with tungstenite and opens relay channels, plaintext
//! and end-to-end encrypted (our own client end, e2ee::Initiator).

mod util;

use omniconfluxd::e2ee::{Channel, Initiator, PublicKey, StaticKey, base64};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use tungstenite::client::IntoClientRequest;
use tungstenite::{Message, WebSocket};
use util::{Daemon, Opts, PATIENCE, TestDir};

const MASTER: &str = "master-token-of-the-uplink-tests";
const NODE: &str = "home";

/// vendor-schemas/gateway/gateway.schema.json, read once.
fn schema() -> &'static Value {
    static DOC: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    DOC.get_or_init(|| read_schema("gateway.schema.json"))
}

/// vendor-schemas/gateway/uplink.schema.json, read once.
fn uplink_schema() -> &'static Value {
    static DOC: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    DOC.get_or_init(|| read_schema("uplink.schema.json"))
}

fn read_schema(name: &str) -> Value {
    let p = format!(
        "{}/vendor-schemas/gateway/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// Checks `v` against `$defs/<def>` of the gateway's schema.
fn check(def: &str, v: &Value) {
    let s = json!({"$ref": format!("#/$defs/{def}")});
    if let Err(e) = util::http::validate(schema(), &s, v, def) {
        panic!("not a valid {def}: {e}");
    }
}

/// Checks `v` against `$defs/<def>` of the uplink's schema.
fn check_uplink(def: &str, v: &Value) {
    let s = json!({"$ref": format!("#/$defs/{def}")});
    if let Err(e) = util::http::validate(uplink_schema(), &s, v, def) {
        panic!("not a valid {def}: {e}");
    }
}

/// `omniconfluxd gateway --listen LISTEN` with the master token.
fn gateway(dir: &TestDir, listen: &str) -> (Daemon, SocketAddr) {
    let d = Daemon::start_command(
        &dir.path,
        Opts {
            config: Some(String::new()),
            extra_args: vec!["--listen".into(), listen.into()],
            env: vec![("OMNICONFLUX_GATEWAY_TOKEN".into(), MASTER.into())],
            ..Opts::default()
        },
        "gateway",
    );
    let line = d.wait_log("gateway listening on ");
    let rest = line.split("gateway listening on ").nth(1).unwrap();
    let addr = rest.split_whitespace().next().unwrap().parse().unwrap();
    (d, addr)
}

/// A node dialing `addr`, with `extra` config lines.
fn node(dir: &TestDir, addr: SocketAddr, extra: &str) -> Daemon {
    Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(format!(
                "[daemon]\nnode_name = \"{NODE}\"\n[uplink]\nurl = \"ws://{addr}\"\n{extra}"
            )),
            env: vec![("OMNICONFLUX_UPLINK_TOKEN".into(), MASTER.into())],
            ..Opts::default()
        },
    )
}

/// A client of the gateway that reads the stream as lines.
struct Client {
    ws: WebSocket<TcpStream>,
    pending: Vec<u8>,
    lines: VecDeque<Value>,
    next_id: u64,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        Client::connect_with(addr, MASTER)
    }

    /// A client holding `token`: the master token, or a paired device's.
    fn connect_with(addr: SocketAddr, token: &str) -> Client {
        let mut req = format!("ws://{addr}/client").into_client_request().unwrap();
        req.headers_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(PATIENCE)).unwrap();
        let (ws, _) = tungstenite::client::client(req, tcp).expect("client connects");
        Client {
            ws,
            pending: Vec::new(),
            lines: VecDeque::new(),
            next_id: 0,
        }
    }

    fn send(&mut self, v: &Value) {
        self.ws.send(Message::text(format!("{v}\n"))).unwrap();
    }

    fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(v) = self.lines.pop_front() {
                return Some(v);
            }
            let bytes = match self.ws.read().ok()? {
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

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}));
        self.expect(&format!("the answer to {method}"), |v| {
            v["id"] == json!(id) && v.get("route").is_none()
        })
    }

    /// Waits until `node` is online in the roster; its descriptor.
    fn online(&mut self, node: &str) -> Value {
        self.expect(&format!("{node} online"), |v| {
            v["method"] == "node.event"
                && v["params"]["node"]["id"] == node
                && v["params"]["node"]["online"] == true
        })["params"]["node"]
            .clone()
    }

    fn open(&mut self, node: &str) -> String {
        let r = self.call("relay.open", json!({"node_id": node}));
        r["result"]["chan_id"]
            .as_str()
            .unwrap_or_else(|| panic!("relay.open failed: {r}"))
            .to_string()
    }

    /// Sends a request on `chan` with `body`; returns its id.
    fn relay(&mut self, chan: &str, method: &str, body: String) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":method,
            "route":{"chan_id":chan,"node_id":NODE},"body":body}));
        id
    }

    /// The body of the relay response to `id`.
    fn relay_answer(&mut self, id: u64) -> String {
        let v = self.expect(&format!("the relay answer to {id}"), |v| {
            v["id"] == json!(id) && v.get("route").is_some()
        });
        v["body"].as_str().unwrap().to_string()
    }

    /// A plaintext call on `chan`: the inner `{"result"}` or `{"error"}`.
    fn plain(&mut self, chan: &str, method: &str, params: Option<Value>) -> Value {
        let body = params.map_or(String::new(), |p| base64::encode(p.to_string().as_bytes()));
        let id = self.relay(chan, method, body);
        let body = self.relay_answer(id);
        let v = serde_json::from_slice(&base64::decode(&body).expect("base64")).expect("JSON body");
        check_uplink("responseBody", &v);
        v
    }

    /// Opens an E2EE channel to the node whose key is `node_key`.
    fn handshake(&mut self, chan: &str, node_key: &PublicKey) -> Channel {
        let me = StaticKey::generate().unwrap();
        let (init, msg1) = Initiator::start(&me, node_key, NODE, chan).unwrap();
        self.send(&json!({"jsonrpc":"2.0","method":"e2e.handshake",
            "route":{"chan_id":chan},"body":base64::encode(&msg1)}));
        let m2 = self.expect("message 2", |v| {
            v["method"] == "e2e.handshake" && v["route"]["chan_id"] == chan
        });
        check_uplink("handshakeReply", &m2);
        let msg2 = base64::decode(m2["body"].as_str().unwrap()).unwrap();
        assert_eq!(msg2.len(), 48);
        init.finish(&msg2)
            .expect("the node's message 2 authenticates")
    }

    /// A sealed call on `chan`.
    fn sealed(
        &mut self,
        ch: &mut Channel,
        chan: &str,
        method: &str,
        params: Option<Value>,
    ) -> Value {
        let plain = params.map_or(Vec::new(), |p| p.to_string().into_bytes());
        let body = ch.seal_body(&plain).unwrap();
        let id = self.relay(chan, method, body);
        let body = self.relay_answer(id);
        let opened = ch.open_body(&body).expect("the node's answer opens");
        let v = serde_json::from_slice(&opened).expect("JSON body");
        check_uplink("responseBody", &v);
        v
    }
}

fn node_key(desc: &Value) -> PublicKey {
    PublicKey::from_base64(desc["identity_pubkey"].as_str().expect("identity_pubkey")).unwrap()
}

#[test]
fn a_node_serves_plaintext_and_e2ee_channels_through_the_gateway() {
    let gdir = TestDir::new("up-gw");
    let ndir = TestDir::new("up-node");
    let (_gw, addr) = gateway(&gdir, "127.0.0.1:0");
    let n = node(&ndir, addr, "");
    let mut c = Client::connect(addr);
    let desc = c.online(NODE);
    // The identity key is 0600 in the state directory, and the roster has
    // its public half.
    let key_file = n.state.join("e2ee-identity.key");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&key_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let key = node_key(&desc);
    assert_eq!(desc["label"], NODE);
    // Terminals live in the daemon's tmux server: the node says so only
    // where tmux is installed.
    let tmux = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("tmux").is_file()));
    assert_eq!(desc["capabilities"]["terminal"], tmux);
    let listed = c.call("nodes.list", json!({}));
    assert_eq!(listed["result"]["nodes"][0]["id"], NODE, "{listed}");

    // Plaintext: the first frame makes the channel.
    let chan = c.open(NODE);
    let ident = c.plain(&chan, "node.identify", None);
    check_uplink("identifyResult", &ident["result"]);
    assert_eq!(ident["result"]["identity_pubkey"], desc["identity_pubkey"]);
    let info = c.plain(&chan, "server.info", None);
    assert_eq!(info["result"]["caller"]["class"], "remote-client");
    assert_eq!(info["result"]["uplink"]["state"], "connected");
    let list = c.plain(&chan, "sessions.list", Some(json!({})));
    assert!(list["result"].is_array(), "{list}");
    // Operator-only calls are for E2EE channels by default.
    let refused = c.plain(
        &chan,
        "approvals.answer",
        Some(json!({"request_id": "nope", "decision": "allow"})),
    );
    assert_eq!(
        refused["error"]["data"]["code"], "operator-only",
        "{refused}"
    );
    for m in ["lock.status", "server.stop"] {
        let e = c.plain(&chan, m, None);
        assert_eq!(e["error"]["code"], -32601, "{m}: {e}");
    }
    // A command spawned is a shell on the node: the operator's. An agent
    // the node knows is session control (refused here for another reason:
    // none is installed).
    let spawn = json!({"command": "touch /tmp/omniconflux-remote-shell", "cwd": "/"});
    let e = c.plain(&chan, "sessions.spawn", Some(spawn));
    assert_eq!(e["error"]["data"]["code"], "operator-only", "{e}");
    let e = c.plain(&chan, "sessions.spawn", Some(json!({"agent": "codex"})));
    assert_ne!(e["error"]["data"]["code"], "operator-only", "{e}");
    // What the node does not serve is unknown, not the operator's.
    for m in ["nope.method", "push.register", "project.list"] {
        let e = c.plain(&chan, m, Some(json!({})));
        assert_eq!(e["error"]["code"], -32601, "{m}: {e}");
    }
    // A body that does not open is dropped without a reply: the next
    // request's answer is the next frame on the channel.
    let _dropped = c.relay(&chan, "server.info", "not base64!".into());
    let after = c.plain(&chan, "ping", None);
    assert_eq!(after, json!({"result": null}));
    let skipped: Vec<&Value> = c
        .lines
        .iter()
        .filter(|v| v["route"]["chan_id"] == chan)
        .collect();
    assert!(skipped.is_empty(), "{skipped:?}");

    // E2EE: the handshake makes the channel; the bodies are sealed.
    let chan2 = c.open(NODE);
    let mut ch = c.handshake(&chan2, &key);
    let info = c.sealed(&mut ch, &chan2, "server.info", None);
    assert_eq!(info["result"]["caller"]["class"], "remote-client");
    let answer = c.sealed(
        &mut ch,
        &chan2,
        "approvals.answer",
        Some(json!({"request_id": "nope", "decision": "allow"})),
    );
    // Past the gate: the inbox itself says the request is unknown.
    assert_ne!(answer["error"]["data"]["code"], "operator-only", "{answer}");
    assert!(answer.get("error").is_some(), "{answer}");
    // A second handshake on an existing channel is dropped; the channel
    // still serves.
    let me = StaticKey::generate().unwrap();
    let (_i, msg1) = Initiator::start(&me, &key, NODE, &chan2).unwrap();
    c.send(&json!({"jsonrpc":"2.0","method":"e2e.handshake",
        "route":{"chan_id":chan2},"body":base64::encode(&msg1)}));
    let ping = c.sealed(&mut ch, &chan2, "ping", None);
    assert_eq!(ping, json!({"result": null}));
    assert!(
        !c.lines.iter().any(|v| v["method"] == "e2e.handshake"),
        "a second message 2: {:?}",
        c.lines
    );

    // relay.close frees the channel on the node.
    let info = c.plain(&chan, "server.info", None);
    assert_eq!(info["result"]["uplink"]["channels"], 2);
    c.call("relay.close", json!({"chan_id": chan2}));
    let mut waited = 0;
    loop {
        let info = c.plain(&chan, "server.info", None);
        if info["result"]["uplink"]["channels"] == 1 {
            break;
        }
        waited += 1;
        assert!(waited < 1000, "the node kept the closed channel: {info}");
    }
}

#[test]
fn a_node_in_e2ee_mode_drops_plaintext_channels() {
    let gdir = TestDir::new("up-gw-e2ee");
    let ndir = TestDir::new("up-node-e2ee");
    let (_gw, addr) = gateway(&gdir, "127.0.0.1:0");
    let _n = node(&ndir, addr, "e2ee = true\nremote_operator = \"never\"\n");
    let mut c = Client::connect(addr);
    let key = node_key(&c.online(NODE));
    let plain = c.open(NODE);
    let dropped = c.relay(&plain, "server.info", String::new());
    let chan = c.open(NODE);
    let mut ch = c.handshake(&chan, &key);
    let info = c.sealed(&mut ch, &chan, "server.info", None);
    assert_eq!(info["result"]["uplink"]["e2ee_mode"], true);
    assert_eq!(info["result"]["uplink"]["channels"], 1);
    assert!(
        !c.lines.iter().any(|v| v["id"] == json!(dropped)),
        "a plaintext frame was answered"
    );
    // A sealed body that does not open (its first record fails) is dropped
    // without a reply, and the channel's nonces do not move: the next
    // request still opens.
    let mut record = vec![0u8, 38];
    record.extend([7u8; 38]);
    let forged = c.relay(&chan, "server.info", base64::encode(&record));
    let ping = c.sealed(&mut ch, &chan, "ping", None);
    assert_eq!(ping, json!({"result": null}));
    assert!(
        !c.lines.iter().any(|v| v["id"] == json!(forged)),
        "a forged body was answered"
    );
    // remote_operator = "never": not even an E2EE channel answers approvals.
    let refused = c.sealed(
        &mut ch,
        &chan,
        "approvals.answer",
        Some(json!({"request_id": "nope", "decision": "allow"})),
    );
    assert_eq!(refused["error"]["data"]["code"], "operator-only");
    // A wrong node key: the node cannot read message 1 and says nothing,
    // which the next answer on another channel shows.
    let other = c.open(NODE);
    let wrong = StaticKey::generate().unwrap().public();
    let me = StaticKey::generate().unwrap();
    let (_i, msg1) = Initiator::start(&me, &wrong, NODE, &other).unwrap();
    c.send(&json!({"jsonrpc":"2.0","method":"e2e.handshake",
        "route":{"chan_id":other},"body":base64::encode(&msg1)}));
    let info = c.sealed(&mut ch, &chan, "server.info", None);
    assert_eq!(info["result"]["uplink"]["channels"], 1);
}

#[test]
fn the_uplink_dials_again_after_the_gateway_restarts() {
    let gdir = TestDir::new("up-gw-re");
    let ndir = TestDir::new("up-node-re");
    let (gw, addr) = gateway(&gdir, "127.0.0.1:0");
    let n = node(&ndir, addr, "");
    let mut c = Client::connect(addr);
    c.online(NODE);
    let chan = c.open(NODE);
    assert!(c.plain(&chan, "ping", None)["result"].is_null());
    drop(c);
    gw.stop();
    n.wait_log(" closed: ");
    // The same port again: the node dials until it is back.
    let (_gw2, addr2) = gateway(&gdir, &addr.to_string());
    assert_eq!(addr2, addr);
    let mut c = Client::connect(addr);
    c.online(NODE);
    // Old channel ids mean nothing on the new connection; a new one serves.
    let chan = c.open(NODE);
    let info = c.plain(&chan, "server.info", None);
    assert_eq!(info["result"]["uplink"]["state"], "connected");
    assert_eq!(info["result"]["uplink"]["connects"], 2);
    assert_eq!(info["result"]["uplink"]["channels"], 1);
    let mut sock = n.connect();
    let status = sock.call("server.info", json!({}));
    assert_eq!(status["uplink"]["via"], format!("ws://{addr}"));
    assert!(status["uplink"]["last_error"].is_string(), "{status}");
    // `omniconfluxd status` says it too.
    let socket = n.socket.display().to_string();
    let (code, out, err) = util::run_cli(&["--socket", &socket, "status"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("uplink      connected to ws://"), "{out}");
}

#[test]
fn a_node_with_its_own_gateway_is_in_the_roster_without_dialing() {
    let dir = TestDir::new("up-innode");
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(format!("[daemon]\nnode_name = \"{NODE}\"\n")),
            extra_args: vec!["--gateway".into(), "127.0.0.1:0".into()],
            env: vec![("OMNICONFLUX_GATEWAY_TOKEN".into(), MASTER.into())],
            ..Opts::default()
        },
    );
    let line = d.wait_log("gateway listening on ");
    let rest = line.split("gateway listening on ").nth(1).unwrap();
    let addr: SocketAddr = rest.split_whitespace().next().unwrap().parse().unwrap();
    let mut c = Client::connect(addr);
    let key = node_key(&c.online(NODE));
    let chan = c.open(NODE);
    let info = c.plain(&chan, "server.info", None);
    assert_eq!(info["result"]["uplink"]["via"], "in-process");
    let chan2 = c.open(NODE);
    let mut ch = c.handshake(&chan2, &key);
    let list = c.sealed(&mut ch, &chan2, "sessions.list", Some(json!({})));
    assert!(list["result"].is_array(), "{list}");
}

/// The python3 of the venv tests/fixtures/install-noiseprotocol.sh makes.
fn noise_python() -> Result<std::path::PathBuf, String> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(".."));
    let python = target.join("noiseprotocol/bin/python3");
    if python.exists() {
        Ok(python)
    } else {
        Err(format!(
            "noiseprotocol's venv is not in {}",
            python.display()
        ))
    }
}

/// tests/fixtures/noise_peer.py as the client, one line in, one line out.
struct NoisePeer {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl NoisePeer {
    fn say(&mut self, line: &str) -> Vec<String> {
        use std::io::{BufRead, Write};
        if !line.is_empty() {
            writeln!(self.stdin, "{line}").unwrap();
            self.stdin.flush().unwrap();
        }
        let mut out = String::new();
        self.stdout.read_line(&mut out).unwrap();
        out.split_whitespace().map(str::to_string).collect()
    }
}

impl Drop for NoisePeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Interop (issue 13): a client whose Noise and records no one on the team
/// wrote (PyPI noiseprotocol, tests/fixtures/noise_peer.py) completes the
/// handshake with the node through the real gateway and exchanges sealed
/// requests and answers with it.
#[test]
fn a_noiseprotocol_client_talks_to_the_node_through_the_gateway() {
    let Some(python) = util::need::have(
        noise_python(),
        "PyPI noiseprotocol: sh tests/fixtures/install-noiseprotocol.sh",
    ) else {
        return;
    };
    let gdir = TestDir::new("up-gw-py");
    let ndir = TestDir::new("up-node-py");
    let (_gw, addr) = gateway(&gdir, "127.0.0.1:0");
    let _n = node(&ndir, addr, "e2ee = true\n");
    let mut c = Client::connect(addr);
    let desc = c.online(NODE);
    let chan = c.open(NODE);
    let mut child = std::process::Command::new(&python)
        .arg(util::fixture("noise_peer.py"))
        .args(["initiator", NODE, &chan])
        .arg(desc["identity_pubkey"].as_str().unwrap())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start noise_peer.py");
    let mut peer = NoisePeer {
        stdin: child.stdin.take().unwrap(),
        stdout: std::io::BufReader::new(child.stdout.take().unwrap()),
        child,
    };
    let words = peer.say("");
    assert_eq!(words[0], "msg1", "{words:?}");
    c.send(&json!({"jsonrpc":"2.0","method":"e2e.handshake",
        "route":{"chan_id":chan},"body":words[1]}));
    let m2 = c.expect("message 2", |v| v["method"] == "e2e.handshake");
    let words = peer.say(&format!("msg2 {}", m2["body"].as_str().unwrap()));
    assert_eq!(words, ["ready"]);
    for (method, params) in [
        ("server.info", String::new()),
        ("sessions.list", "{}".to_string()),
        ("node.identify", String::new()),
    ] {
        let sealed = peer.say(&format!("seal {}", base64::encode(params.as_bytes())));
        assert_eq!(sealed[0], "sealed");
        // An empty message seals to one empty record: still a body.
        let id = c.relay(&chan, method, sealed[1].clone());
        let body = c.relay_answer(id);
        let opened = peer.say(&format!("open {body}"));
        assert_eq!(opened[0], "opened", "{method}: {opened:?}");
        let v: Value = serde_json::from_slice(&base64::decode(&opened[1]).unwrap()).unwrap();
        assert!(v.get("result").is_some(), "{method}: {v}");
        if method == "node.identify" {
            assert_eq!(v["result"]["identity_pubkey"], desc["identity_pubkey"]);
        }
    }
}

#[test]
fn the_token_file_must_be_private_and_a_bad_url_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let gdir = TestDir::new("up-gw-tok");
    let ndir = TestDir::new("up-node-tok");
    let (_gw, addr) = gateway(&gdir, "127.0.0.1:0");
    let token = ndir.path.join("uplink.token");
    std::fs::write(&token, format!("{MASTER}\n")).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = format!(
        "[daemon]\nnode_name = \"{NODE}\"\n[uplink]\nurl = \"ws://{addr}/\"\ntoken_file = \"{}\"\n",
        token.display()
    );
    let opts = || Opts {
        config: Some(config.clone()),
        ..Opts::default()
    };
    let mut d = Daemon::spawn(&ndir.path, opts());
    assert!(!d.wait().success());
    assert!(d.log_text().contains("make it 0600"), "{}", d.log_text());
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let _n = Daemon::start_with(&ndir.path, opts());
    let mut c = Client::connect(addr);
    c.online(NODE);

    let mut d = Daemon::spawn(
        &ndir.path,
        Opts {
            config: Some("[uplink]\nurl = \"https://gw.example\"\n".into()),
            ..Opts::default()
        },
    );
    assert_eq!(d.wait().code(), Some(2));
    assert!(d.log_text().contains("uplink"), "{}", d.log_text());
}

/// The params of a plaintext relay notification.
fn plain_params(v: &Value) -> Value {
    let body = base64::decode(v["body"].as_str().unwrap()).unwrap();
    serde_json::from_slice(&body).unwrap()
}

#[test]
fn channels_get_the_session_stream() {
    let gdir = TestDir::new("up-gw-ses");
    let ndir = TestDir::new("up-node-ses");
    let (_gw, addr) = gateway(&gdir, "127.0.0.1:0");
    let wt = ndir.join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    let script = json!([[{"text": "hi"}]]);
    let seat = format!(
        "[[seat]]\nharness = \"fake\"\ncommand = \"python3\"\nargs = [\"{}\"]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\nenv = {{ FAKE_SCRIPT = '{script}' }}\n",
        util::fixture("fake_acp_agent.py")
    );
    let _n = node(
        &ndir,
        addr,
        &format!("[agents]\nisolation = \"none\"\n{seat}"),
    );
    let mut c = Client::connect(addr);
    let key = node_key(&c.online(NODE));
    let chan = c.open(NODE);
    // A plaintext channel controls sessions, and hears them.
    let spawned = c.plain(
        &chan,
        "sessions.spawn",
        Some(json!({"harness": "fake", "cwd": wt.display().to_string(), "prompt": "hello"})),
    );
    let sid = spawned["result"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{spawned}"))
        .to_string();
    let added = c.expect("session.event added", |v| {
        v["method"] == "session.event" && v["route"]["chan_id"] == chan
    });
    let p = plain_params(&added);
    assert_eq!(p["type"], "added");
    assert_eq!(p["session"]["id"], json!(sid));
    let updated = c.expect("session.event updated", |v| {
        v["method"] == "session.event" && v["route"]["chan_id"] == chan
    });
    assert_eq!(plain_params(&updated)["type"], "updated");

    // A new channel starts with the snapshot: one `added` per session,
    // before the answer to its first request.
    let chan2 = c.open(NODE);
    let id = c.relay(&chan2, "ping", String::new());
    let first = c.expect("the first frame on the new channel", |v| {
        v["route"]["chan_id"] == chan2
    });
    assert_eq!(first["method"], "session.event", "{first}");
    assert_eq!(plain_params(&first)["session"]["id"], json!(sid));
    c.relay_answer(id);

    // On an E2EE channel the snapshot follows message 2, sealed in order
    // with the answers.
    let chan3 = c.open(NODE);
    let mut ch = c.handshake(&chan3, &key);
    let ev = c.expect("the sealed snapshot", |v| {
        v["method"] == "session.event" && v["route"]["chan_id"] == chan3
    });
    let opened = ch.open_body(ev["body"].as_str().unwrap()).unwrap();
    let p: Value = serde_json::from_slice(&opened).unwrap();
    assert_eq!(p["type"], "added");
    assert_eq!(p["session"]["id"], json!(sid));
}

/// `ssh://` (issue 13): the node runs `ssh -W 127.0.0.1:PORT DEST` and
/// speaks WebSocket through its stdin and stdout. A stand-in ssh on PATH
/// (tests/fixtures/fake_ssh.sh) records its arguments and joins the pipes
/// to the gateway with socat.
#[test]
fn the_uplink_goes_through_ssh() {
    let Some(socat) = util::need::have(
        which("socat").ok_or_else(|| "socat is not on PATH".to_string()),
        "the Debian package socat",
    ) else {
        return;
    };
    let gdir = TestDir::new("up-gw-ssh");
    let ndir = TestDir::new("up-node-ssh");
    let (_gw, addr) = gateway(&gdir, "127.0.0.1:0");
    let bin = ndir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(util::fixture("fake_ssh.sh"), bin.join("ssh")).unwrap();
    let args_file = ndir.join("ssh.args");
    let path = format!("{}:{}", bin.display(), socat.parent().unwrap().display());
    let _n = Daemon::start_with(
        &ndir.path,
        Opts {
            config: Some(format!(
                "[daemon]\nnode_name = \"{NODE}\"\n[uplink]\nurl = \"ssh://me@box.example:2222?port={}\"\n",
                addr.port()
            )),
            env: vec![
                ("OMNICONFLUX_UPLINK_TOKEN".into(), MASTER.into()),
                ("PATH".into(), path),
                ("FAKE_SSH_ARGS".into(), args_file.display().to_string()),
            ],
            ..Opts::default()
        },
    );
    let mut c = Client::connect(addr);
    let key = node_key(&c.online(NODE));
    let args = std::fs::read_to_string(&args_file).unwrap();
    let args: Vec<&str> = args.lines().collect();
    assert!(args.windows(2).any(|w| w == ["-p", "2222"]), "{args:?}");
    let w = format!("127.0.0.1:{}", addr.port());
    assert!(args.windows(2).any(|x| x == ["-W", w.as_str()]), "{args:?}");
    assert!(args.contains(&"BatchMode=yes"), "{args:?}");
    assert_eq!(args.last(), Some(&"me@box.example"));
    let chan = c.open(NODE);
    let mut ch = c.handshake(&chan, &key);
    let info = c.sealed(&mut ch, &chan, "server.info", None);
    assert_eq!(info["result"]["uplink"]["state"], "connected");
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(name))
        .find(|p| p.is_file())
}

impl Client {
    /// The next frame on E2EE channel `chan`, opened: frames of a channel
    /// must be opened in the order they came.
    fn next_sealed(&mut self, ch: &mut Channel, chan: &str) -> Value {
        let v = self.expect(&format!("a frame on {chan}"), |v| {
            v["route"]["chan_id"] == chan
        });
        let opened = ch.open_body(v["body"].as_str().unwrap()).expect("opens");
        let inner: Value = serde_json::from_slice(&opened).unwrap();
        json!({"id": v["id"], "method": v["method"], "inner": inner})
    }

    /// A sealed call that opens every frame of the channel on the way:
    /// (the answer, the notifications before it).
    fn sealed_call(
        &mut self,
        ch: &mut Channel,
        chan: &str,
        method: &str,
        params: Value,
    ) -> (Value, Vec<Value>) {
        let body = ch.seal_body(params.to_string().as_bytes()).unwrap();
        let id = self.relay(chan, method, body);
        let mut notes = Vec::new();
        loop {
            let f = self.next_sealed(ch, chan);
            if f["id"] == json!(id) {
                check_uplink("responseBody", &f["inner"]);
                return (f["inner"].clone(), notes);
            }
            notes.push(f["inner"].clone());
        }
    }
}

/// Issue 13, "Answering from a phone": a seed client sees the session wait
/// through its session.event (status awaiting_input, a permission
/// interaction) and answers with sessions.respond, which goes through the
/// approvals inbox: bound to the request, used once, recorded with the
/// relay as its surface, and operator-only (so refused on a plaintext
/// channel by default).
#[test]
fn a_remote_client_answers_a_permission_with_sessions_respond() {
    let gdir = TestDir::new("up-gw-resp");
    let ndir = TestDir::new("up-node-resp");
    let (_gw, addr) = gateway(&gdir, "127.0.0.1:0");
    let wt = ndir.join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    let script = json!([[
        {"permission": {"id": "c1", "title": "execute it", "kind": "execute", "input": {"command": "ls"}}},
        {"text": "done"}
    ]]);
    let seat = format!(
        "[[seat]]\nharness = \"fake\"\ncommand = \"python3\"\nargs = [\"{}\"]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\nenv = {{ FAKE_SCRIPT = '{script}' }}\n",
        util::fixture("fake_acp_agent.py")
    );
    let _n = node(
        &ndir,
        addr,
        &format!("[agents]\nisolation = \"none\"\n{seat}"),
    );
    let mut c = Client::connect(addr);
    let key = node_key(&c.online(NODE));
    let chan = c.open(NODE);
    let mut ch = c.handshake(&chan, &key);
    let (spawned, _) = c.sealed_call(
        &mut ch,
        &chan,
        "sessions.spawn",
        json!({"harness": "fake", "cwd": wt.display().to_string(), "prompt": "go"}),
    );
    let sid = spawned["result"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{spawned}"))
        .to_string();
    // The session's events until it waits for the answer.
    let waiting = loop {
        let f = c.next_sealed(&mut ch, &chan);
        let s = &f["inner"]["session"];
        if f["method"] == "session.event"
            && s["id"] == json!(sid)
            && s["status"] == "awaiting_input"
        {
            break s.clone();
        }
    };
    let interaction = &waiting["interaction"];
    assert_eq!(interaction["kind"], "permission", "{waiting}");
    let request_id = interaction["request_id"].as_str().unwrap().to_string();

    // Not from a plaintext channel (remote_operator = "e2ee").
    let plain = c.open(NODE);
    let refused = c.plain(
        &plain,
        "sessions.respond",
        Some(json!({"session_id": sid, "behavior": "allow"})),
    );
    assert_eq!(
        refused["error"]["data"]["code"], "operator-only",
        "{refused}"
    );

    let (answer, _) = c.sealed_call(
        &mut ch,
        &chan,
        "sessions.respond",
        json!({"session_id": sid, "behavior": "allow", "request_id": request_id, "kind": "permission"}),
    );
    assert_eq!(answer, json!({"result": null}));
    // Used once.
    let (again, _) = c.sealed_call(
        &mut ch,
        &chan,
        "sessions.respond",
        json!({"session_id": sid, "option_value": "deny", "request_id": request_id}),
    );
    assert_eq!(again["error"]["data"]["code"], "not-pending", "{again}");
    let (item, _) = c.sealed_call(
        &mut ch,
        &chan,
        "approvals.get",
        json!({"request_id": request_id}),
    );
    assert_eq!(item["result"]["decision"], "allow", "{item}");
    assert_eq!(item["result"]["surface"], "relay", "{item}");
}

/// Runs `program` with `args` in `dir`; fails the test when it fails.
fn run_in(dir: &std::path::Path, program: &str, args: &[&str]) {
    let out = std::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Kills socat when the test ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `wss://` (issue 13): the node speaks TLS (rustls on ring) to a TLS
/// front of the gateway (socat with a certificate of a test CA), trusting
/// the CA through `[uplink] ca_file`.
#[test]
fn the_uplink_dials_a_wss_gateway_trusting_its_ca_file() {
    use std::io::BufRead;
    let tools = which("socat")
        .zip(which("openssl"))
        .ok_or_else(|| "socat or openssl is not on PATH".to_string());
    let Some((socat, openssl)) = util::need::have(tools, "the Debian packages socat and openssl")
    else {
        return;
    };
    let (socat, openssl) = (socat.display().to_string(), openssl.display().to_string());
    let gdir = TestDir::new("up-gw-tls");
    let ndir = TestDir::new("up-node-tls");
    let (_gw, addr) = gateway(&gdir, "127.0.0.1:0");
    let pki = ndir.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=uplink test CA",
    ]);
    run_in(&pki, &openssl, &ca);
    let mut leaf = vec!["req"];
    leaf.extend(ec);
    leaf.extend([
        "-keyout",
        "leaf.key",
        "-out",
        "leaf.csr",
        "-subj",
        "/CN=localhost",
    ]);
    run_in(&pki, &openssl, &leaf);
    std::fs::write(
        pki.join("ext.cnf"),
        "basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost\n",
    )
    .unwrap();
    run_in(
        &pki,
        &openssl,
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "leaf.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
    // A free port for the TLS front.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut front = std::process::Command::new(&socat)
        .args([
            "-d",
            "-d",
            &format!(
                "OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,cert={},key={},verify=0",
                pki.join("leaf.pem").display(),
                pki.join("leaf.key").display()
            ),
            &format!("TCP:{addr}"),
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let err = front.stderr.take().unwrap();
    let _front = Killed(front);
    let mut lines = std::io::BufReader::new(err).lines();
    loop {
        let l = lines
            .next()
            .expect("socat said nothing")
            .expect("socat's stderr");
        if l.contains("listening on") {
            break;
        }
    }
    // Keep reading, so that socat never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    let _n = Daemon::start_with(
        &ndir.path,
        Opts {
            config: Some(format!(
                "[daemon]\nnode_name = \"{NODE}\"\n[uplink]\nurl = \"wss://localhost:{port}\"\nca_file = \"{}\"\n",
                pki.join("ca.pem").display()
            )),
            env: vec![("OMNICONFLUX_UPLINK_TOKEN".into(), MASTER.into())],
            ..Opts::default()
        },
    );
    let mut c = Client::connect(addr);
    let key = node_key(&c.online(NODE));
    let chan = c.open(NODE);
    let mut ch = c.handshake(&chan, &key);
    let info = c.sealed(&mut ch, &chan, "server.info", None);
    assert_eq!(info["result"]["uplink"]["state"], "connected");
    assert_eq!(
        info["result"]["uplink"]["via"],
        format!("wss://localhost:{port}")
    );
}

/// Sends message 1 of a handshake from `me` on `chan` and returns at once:
/// for handshakes the node is to drop.
fn send_msg1(c: &mut Client, me: &StaticKey, node_key: &PublicKey, chan: &str) {
    let (_init, msg1) = Initiator::start(me, node_key, NODE, chan).unwrap();
    c.send(&json!({"jsonrpc":"2.0","method":"e2e.handshake",
        "route":{"chan_id":chan},"body":base64::encode(&msg1)}));
}

/// Opens an E2EE channel from the device whose static key is `me`.
fn handshake_as(c: &mut Client, me: &StaticKey, node_key: &PublicKey, chan: &str) -> Channel {
    let (init, msg1) = Initiator::start(me, node_key, NODE, chan).unwrap();
    c.send(&json!({"jsonrpc":"2.0","method":"e2e.handshake",
        "route":{"chan_id":chan},"body":base64::encode(&msg1)}));
    let m2 = c.expect("message 2", |v| {
        v["method"] == "e2e.handshake" && v["route"]["chan_id"] == chan
    });
    let msg2 = base64::decode(m2["body"].as_str().unwrap()).unwrap();
    init.finish(&msg2)
        .expect("the node's message 2 authenticates")
}

#[test]
fn a_locked_node_admits_only_the_devices_its_trust_log_authorizes() {
    let gdir = TestDir::new("up-gw-lock");
    let ndir = TestDir::new("up-node-lock");
    let (_gw, addr) = gateway(&gdir, "127.0.0.1:0");
    let n = node(&ndir, addr, "");
    let mut op = n.connect();
    // The phone is a paired device: it holds its own client token, not the
    // gateway's master token.
    let mut admin = Client::connect(addr);
    admin.online(NODE);
    let paired = admin.call("clients.pairStart", json!({}))["result"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut c = Client::connect_with(addr, &paired);
    let key = node_key(&c.online(NODE));
    let channels =
        |op: &mut util::Client| op.call("server.info", json!({}))["uplink"]["channels"].clone();

    // Before the log: a plaintext channel is served.
    let open = c.open(NODE);
    assert_eq!(c.plain(&open, "ping", None), json!({"result": null}));
    assert_eq!(channels(&mut op), 1);

    // lock.init: locked mode. The open plaintext channel is closed, a new
    // one is refused, and so is a device the log does not name.
    let init = op.call("lock.init", json!({"gen_disablements": 1}));
    let secret = init["disablement_secrets"][0].clone();
    assert_eq!(channels(&mut op), 0);
    let phone = StaticKey::generate().unwrap();
    let stranger = StaticKey::generate().unwrap();
    let plain = c.open(NODE);
    let dropped = c.relay(&plain, "ping", String::new());
    let refused = c.open(NODE);
    send_msg1(&mut c, &stranger, &key, &refused);
    let early = c.open(NODE);
    send_msg1(&mut c, &phone, &key, &early);

    // The operator authorizes the phone's key: its handshake completes and
    // it is served; the frames before got no answer.
    let phone_pub = base64::encode(phone.public().as_bytes());
    op.call("lock.sign", json!({"device": phone_pub}));
    let chan = c.open(NODE);
    let mut ch = handshake_as(&mut c, &phone, &key, &chan);
    let info = c.sealed(&mut ch, &chan, "ping", None);
    assert_eq!(info, json!({"result": null}));
    assert_eq!(channels(&mut op), 1);
    assert!(
        !c.lines.iter().any(|v| v["id"] == json!(dropped)
            || v["route"]["chan_id"] == json!(refused)
            || v["route"]["chan_id"] == json!(early)),
        "a refused channel was answered: {:?}",
        c.lines
    );

    // Revoked: the node closes its channel at once, and the phone's next
    // handshake is dropped; a device signed after it gets through, which
    // shows the node handled the phone's message 1 first (one link, in
    // order).
    op.call("lock.revoke", json!({"device": phone_pub}));
    assert_eq!(channels(&mut op), 0);
    op.call(
        "lock.sign",
        json!({"device": base64::encode(stranger.public().as_bytes())}),
    );
    let after = c.open(NODE);
    send_msg1(&mut c, &phone, &key, &after);
    let other = c.open(NODE);
    let mut ch = handshake_as(&mut c, &stranger, &key, &other);
    assert_eq!(
        c.sealed(&mut ch, &other, "ping", None),
        json!({"result": null})
    );
    assert!(
        !c.lines
            .iter()
            .any(|v| v["route"]["chan_id"] == json!(after)),
        "a revoked device was answered"
    );
    // Disabled with its secret, the log admits any device again (seed 004,
    // Enforcement), the revoked phone included.
    assert_eq!(
        op.call("lock.disable", json!({"secret": secret}))["disabled"],
        true
    );
    let back = c.open(NODE);
    let mut ch = handshake_as(&mut c, &phone, &key, &back);
    assert_eq!(
        c.sealed(&mut ch, &back, "ping", None),
        json!({"result": null})
    );
}

#[test]
fn a_node_pinned_to_another_s_genesis_gets_its_log_through_the_gateway() {
    let gdir = TestDir::new("up-gw-dist");
    let adir = TestDir::new("up-node-a");
    let bdir = TestDir::new("up-node-b");
    let (_gw, addr) = gateway(&gdir, "127.0.0.1:0");
    let a = node(&adir, addr, "");
    let mut c = Client::connect(addr);
    c.online(NODE);
    // A starts a log and authorizes a phone; its entries reach the gateway
    // (A answers the sync's `want` with trustlog.push), which tells the
    // client.
    let mut opa = a.connect();
    opa.call("lock.init", json!({}));
    let phone = StaticKey::generate().unwrap();
    let phone_pub = base64::encode(phone.public().as_bytes());
    let signed = opa.call("lock.sign", json!({"device": phone_pub}));
    let genesis = opa.call("lock.log", json!({}))["entries"][0]["hash"].clone();
    a.wait_log(&format!(
        "holds a trust log of 2 entries, tip {}",
        signed["tip"].as_str().unwrap()
    ));
    // B, with no log and no pin, sees a log on the gateway: quarantined,
    // admitting nothing. Pinned to A's genesis, it adopts A's log, the
    // phone's authorization with it.
    let b = Daemon::start_with(
        &bdir.path,
        Opts {
            config: Some(format!(
                "[daemon]\nnode_name = \"far\"\n[uplink]\nurl = \"ws://{addr}\"\n"
            )),
            env: vec![("OMNICONFLUX_UPLINK_TOKEN".into(), MASTER.into())],
            ..Opts::default()
        },
    );
    b.wait_log("locked mode: quarantined");
    let mut opb = b.connect();
    assert_eq!(opb.call("lock.status", json!({}))["quarantined"], true);
    opb.call("lock.pin", json!({"genesis": genesis}));
    b.wait_log(&format!(
        "holds a trust log of 2 entries, tip {}",
        signed["tip"].as_str().unwrap()
    ));
    let st = opb.call("lock.status", json!({}));
    assert_eq!(st["quarantined"], false, "{st}");
    assert!(
        st["devices"]
            .as_array()
            .unwrap()
            .contains(&json!(phone_pub)),
        "{st}"
    );
}

/// Whether any transcript entry in `entries` carries `text`.
fn carries(entries: &Value, text: &str) -> bool {
    entries.to_string().contains(text)
}

/// Issue 13: `transcript.subscribe` on a relay channel keeps the
/// subscription on that channel; its `transcript.delta`s come as relay
/// notifications (sealed on an E2EE channel, in order with its answers),
/// each channel with its own `sub_id`s.
#[test]
fn channels_keep_transcript_subscriptions() {
    let gdir = TestDir::new("up-gw-tsub");
    let ndir = TestDir::new("up-node-tsub");
    let (_gw, addr) = gateway(&gdir, "127.0.0.1:0");
    let wt = ndir.join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    let seat = format!(
        "[[seat]]\nharness = \"fake\"\ncommand = \"python3\"\nargs = [\"{}\"]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\n",
        util::fixture("fake_acp_agent.py")
    );
    let _n = node(
        &ndir,
        addr,
        &format!("[agents]\nisolation = \"none\"\n{seat}"),
    );
    let mut c = Client::connect(addr);
    let key = node_key(&c.online(NODE));
    let chan = c.open(NODE);
    let spawned = c.plain(
        &chan,
        "sessions.spawn",
        Some(json!({"harness": "fake", "cwd": wt.display().to_string(), "prompt": "first"})),
    );
    let sid = spawned["result"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{spawned}"))
        .to_string();

    // Plaintext: the answer is the transcript so far, then deltas follow.
    let sub = c.plain(
        &chan,
        "transcript.subscribe",
        Some(json!({"sub_id": "p", "session_id": sid})),
    );
    assert_eq!(sub["result"]["sub_id"], "p", "{sub}");
    let q = c.plain(
        &chan,
        "sessions.input",
        Some(json!({"session_id": sid, "text": "second"})),
    );
    assert!(q.get("result").is_some(), "{q}");
    loop {
        let d = c.expect("a transcript.delta on the plaintext channel", |v| {
            v["method"] == "transcript.delta" && v["route"]["chan_id"] == chan
        });
        let p = plain_params(&d);
        assert_eq!(p["sub_id"], "p");
        assert!(p["from_index"].is_u64(), "{p}");
        if carries(&p["entries"], "echo: second") {
            break;
        }
    }

    // E2EE: the same session, another sub_id, sealed in order.
    let chan2 = c.open(NODE);
    let mut ch = c.handshake(&chan2, &key);
    let (sub, _) = c.sealed_call(
        &mut ch,
        &chan2,
        "transcript.subscribe",
        json!({"sub_id": "e", "session_id": sid}),
    );
    assert_eq!(sub["result"]["sub_id"], "e", "{sub}");
    assert!(carries(&sub["result"]["entries"], "echo: second"), "{sub}");
    let (q, _) = c.sealed_call(
        &mut ch,
        &chan2,
        "sessions.input",
        json!({"session_id": sid, "text": "third"}),
    );
    assert!(q.get("result").is_some(), "{q}");
    loop {
        let f = c.next_sealed(&mut ch, &chan2);
        if f["method"] != "transcript.delta" {
            continue;
        }
        assert_eq!(f["inner"]["sub_id"], "e");
        if carries(&f["inner"]["entries"], "echo: third") {
            break;
        }
    }
    // The plaintext channel's subscription heard the same turn.
    loop {
        let d = c.expect("the plaintext channel's delta of the third turn", |v| {
            v["method"] == "transcript.delta" && v["route"]["chan_id"] == chan
        });
        if carries(&plain_params(&d)["entries"], "echo: third") {
            break;
        }
    }

    // Unsubscribing frees the channel's subscription.
    let (un, _) = c.sealed_call(
        &mut ch,
        &chan2,
        "transcript.unsubscribe",
        json!({"sub_id": "e"}),
    );
    assert_eq!(un["result"], Value::Null, "{un}");
    // A subscription needs a session the caller may read.
    let bad = c.plain(
        &chan,
        "transcript.subscribe",
        Some(json!({"sub_id": "q", "session_id": "no-such-session"})),
    );
    assert!(bad.get("error").is_some(), "{bad}");
}

/// Issue 13: an ended session the daemon forgets (`[agents] ended_kept`,
/// here 0, at the next spawn) is `removed` on every channel, plaintext and
/// E2EE, and for the socket's `sessions.subscribe` watchers, with its last
/// state; it is not found from then on.
#[test]
fn a_forgotten_session_is_removed_on_channels_and_the_socket() {
    let gdir = TestDir::new("up-gw-rm");
    let ndir = TestDir::new("up-node-rm");
    let (_gw, addr) = gateway(&gdir, "127.0.0.1:0");
    let wt = ndir.join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    let seat = format!(
        "[[seat]]\nharness = \"fake\"\ncommand = \"python3\"\nargs = [\"{}\"]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\n",
        util::fixture("fake_acp_agent.py")
    );
    let n = node(
        &ndir,
        addr,
        &format!("[agents]\nisolation = \"none\"\nended_kept = 0\n{seat}"),
    );
    let mut sock = n.connect();
    assert_eq!(sock.call("sessions.subscribe", json!({})), json!([]));
    let mut c = Client::connect(addr);
    let key = node_key(&c.online(NODE));
    let chan = c.open(NODE);
    let ch_chan = c.open(NODE);
    let mut ch = c.handshake(&ch_chan, &key);
    let spawn = json!({"harness": "fake", "cwd": wt.display().to_string(), "prompt": "hi"});
    let first = c.plain(&chan, "sessions.spawn", Some(spawn.clone()));
    let sid = first["result"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{first}"))
        .to_string();
    let killed = c.plain(&chan, "sessions.kill", Some(json!({"session_id": sid})));
    assert!(killed.get("result").is_some(), "{killed}");
    // Ended, and its agent reaped: the next spawn forgets it.
    c.expect("the session's end", |v| {
        v["method"] == "session.event" && v["route"]["chan_id"] == chan && {
            let p = plain_params(v);
            p["session"]["id"] == json!(sid) && p["session"]["status"] == "dead"
        }
    });
    let second = c.plain(&chan, "sessions.spawn", Some(spawn));
    assert!(second.get("result").is_some(), "{second}");

    let removed = c.expect("removed on the plaintext channel", |v| {
        v["method"] == "session.event"
            && v["route"]["chan_id"] == chan
            && plain_params(v)["type"] == "removed"
    });
    let p = plain_params(&removed);
    assert_eq!(p["session"]["id"], json!(sid));
    assert_eq!(p["session"]["status"], "dead");
    loop {
        let f = c.next_sealed(&mut ch, &ch_chan);
        if f["method"] == "session.event" && f["inner"]["type"] == "removed" {
            assert_eq!(f["inner"]["session"]["id"], json!(sid));
            break;
        }
    }
    loop {
        let ev = sock.next_note("session.event");
        if ev["params"]["type"] == "removed" {
            assert_eq!(ev["params"]["session"]["id"], json!(sid));
            assert_eq!(ev["params"]["session"]["status"], "dead");
            break;
        }
    }
    let gone = c.plain(&chan, "sessions.get", Some(json!({"session_id": sid})));
    assert_eq!(gone["error"]["data"]["code"], "session-not-found", "{gone}");
}

// ---- terminals and tmux transcripts on channels (issue 15) ----

/// A gateway and a node whose HOME and tmux directory are the test's, with
/// a fake Claude Code (tests/fixtures/tmux/claude) in pane `default:%0`,
/// its transcript file ending a turn; a client online, and the node's
/// socket. Dropped in order: clients, daemons, tmux servers, directories.
struct TermRig {
    c: Client,
    sock: util::Client,
    key: PublicKey,
    transcript: std::path::PathBuf,
    n: Daemon,
    _gw: Daemon,
    servers: util::tmux::Servers,
    _dirs: (TestDir, TestDir),
}

fn term_rig(name: &str) -> Option<TermRig> {
    util::need::have(util::need::program("tmux"), "the Debian package tmux")?;
    let gdir = TestDir::new(&format!("{name}-gw"));
    let ndir = TestDir::new(name);
    let tmpdir = ndir.join("x");
    std::fs::create_dir_all(&tmpdir).unwrap();
    let servers = util::tmux::Servers { tmpdir };
    let proj = ndir.join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    let home = ndir.join("home");
    let transcript = servers.fake_claude(&home, &proj);
    let (gw, addr) = gateway(&gdir, "127.0.0.1:0");
    let n = Daemon::start_with(
        &ndir.path,
        Opts {
            config: Some(format!(
                "[daemon]\nnode_name = \"{NODE}\"\n[uplink]\nurl = \"ws://{addr}\"\n"
            )),
            env: [("OMNICONFLUX_UPLINK_TOKEN".to_string(), MASTER.to_string())]
                .into_iter()
                .chain(servers.daemon_env(&home))
                .collect(),
            ..Opts::default()
        },
    );
    let mut sock = n.connect();
    let deadline = std::time::Instant::now() + PATIENCE;
    while !sock
        .call("sessions.refresh", json!({}))
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["id"] == PANE)
    {
        assert!(std::time::Instant::now() < deadline, "no {PANE} discovered");
    }
    let mut c = Client::connect(addr);
    let key = node_key(&c.online(NODE));
    Some(TermRig {
        c,
        sock,
        key,
        transcript,
        n,
        _gw: gw,
        servers,
        _dirs: (gdir, ndir),
    })
}

/// The fake agent's session id.
const PANE: &str = "default:%0";

/// The bytes of a channel's `terminal.output`s for one term_id, and the
/// `terminal.exited`s it saw on the way.
#[derive(Default)]
struct Screen {
    seen: Vec<u8>,
    exited: Vec<Value>,
}

impl Screen {
    /// Takes one notification's params (`method`, `params`).
    fn take(&mut self, term_id: &str, method: &Value, p: &Value) {
        if method == "terminal.output" && p["term_id"] == term_id {
            let data = p["data"].as_str().unwrap();
            self.seen
                .extend(base64::decode(data).expect("standard base64"));
        } else if method == "terminal.exited" {
            self.exited.push(p.clone());
        }
    }

    fn holds(&self, needle: &str) -> bool {
        String::from_utf8_lossy(&self.seen).contains(needle)
    }
}

/// Reads a plaintext channel's frames until its terminal shows `needle`.
fn plain_until(c: &mut Client, chan: &str, term_id: &str, needle: &str) -> Screen {
    let mut s = Screen::default();
    while !s.holds(needle) {
        let f = c.expect(&format!("{needle:?} on {chan}"), |v| {
            v["route"]["chan_id"] == chan && v.get("method").is_some()
        });
        s.take(term_id, &f["method"], &plain_params(&f));
    }
    s
}

/// Reads an E2EE channel's frames, in order, until its terminal shows
/// `needle`; `s` holds what was read already.
fn sealed_until(
    c: &mut Client,
    ch: &mut Channel,
    chan: &str,
    term_id: &str,
    needle: &str,
    mut s: Screen,
) -> Screen {
    while !s.holds(needle) {
        let f = c.next_sealed(ch, chan);
        s.take(term_id, &f["method"], &f["inner"]);
    }
    s
}

/// A sealed call whose notifications on the way go to a screen.
fn sealed_term_call(
    c: &mut Client,
    ch: &mut Channel,
    chan: &str,
    term_id: &str,
    method: &str,
    params: Value,
) -> (Value, Screen) {
    let body = ch.seal_body(params.to_string().as_bytes()).unwrap();
    let id = c.relay(chan, method, body);
    let mut s = Screen::default();
    loop {
        let f = c.next_sealed(ch, chan);
        if f["id"] == json!(id) {
            return (f["inner"].clone(), s);
        }
        s.take(term_id, &f["method"], &f["inner"]);
    }
}

/// The daemon's terminal threads (`term-N`, `term-N-out`).
fn term_threads(pid: i32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| c.starts_with("term-"))
        .collect()
}

/// Issue 15 over issue 13's channels: a phone opens a pane's live terminal
/// on a plaintext channel and on an E2EE one (a full redraw, then output;
/// input echoed), the last opener wins across the socket and the channels
/// (`terminal.exited` `evicted`, sealed in order on the E2EE channel), and
/// `relay.closed` frees the channel's terminal: its threads and tmux
/// client go, and a later open from the socket evicts no one.
#[test]
fn a_phone_s_terminal_on_a_channel_is_evicted_by_the_socket_and_freed_by_relay_closed() {
    let Some(mut r) = term_rig("up-term") else {
        return;
    };
    let c = &mut r.c;
    let pchan = c.open(NODE);
    let echan = c.open(NODE);
    let mut ch = c.handshake(&echan, &r.key);

    // The node says it serves terminals, on a channel too.
    let (id, _) = c.sealed_call(&mut ch, &echan, "node.identify", json!({}));
    assert_eq!(id["result"]["capabilities"]["terminal"], true, "{id}");

    // Plaintext: a full redraw first, then the echo of what is typed.
    let open = json!({"term_id": "p1", "session_id": PANE, "cols": 90, "rows": 20});
    let o = c.plain(&pchan, "terminal.open", Some(open));
    assert_eq!(o["result"], Value::Null, "{o}");
    plain_until(c, &pchan, "p1", "fake claude ready");
    let data = base64::encode(b"typed\r");
    let i = c.plain(
        &pchan,
        "terminal.input",
        Some(json!({"term_id": "p1", "data": data})),
    );
    assert_eq!(i["result"], Value::Null, "{i}");
    plain_until(c, &pchan, "p1", "got: typed");
    let e = c.plain(
        &pchan,
        "terminal.input",
        Some(json!({"term_id": "p1", "data": "%%%"})),
    );
    assert_eq!(e["error"]["message"], "bad base64", "{e}");
    // A persistent terminal is a shell on the node: the operator's, which
    // a plaintext channel is not by default; so is the wakelock.
    for (m, p) in [
        (
            "terminal.open",
            json!({"term_id": "x", "terminal_id": "abc"}),
        ),
        ("terminal.list", json!({})),
        ("host.setWakelock", json!({})),
    ] {
        let e = c.plain(&pchan, m, Some(p));
        assert_eq!(e["error"]["data"]["code"], "operator-only", "{m}: {e}");
    }
    // The pane's own controls and the host's readings are session control
    // and read access, which a plaintext channel has.
    let cap = c.plain(
        &pchan,
        "sessions.capture",
        Some(json!({"session_id": PANE})),
    );
    let screen = cap["result"]["screen"].as_str().unwrap_or_default();
    assert!(screen.contains("got: typed"), "{cap}");
    let info = c.plain(&pchan, "host.info", Some(json!({})));
    assert!(info["result"]["uptime_seconds"].is_number(), "{info}");

    // The E2EE channel opens the same session: the plaintext one is evicted.
    let open = json!({"term_id": "e1", "session_id": PANE});
    let (o, s) = sealed_term_call(c, &mut ch, &echan, "e1", "terminal.open", open);
    assert_eq!(o["result"], Value::Null, "{o}");
    let s = sealed_until(c, &mut ch, &echan, "e1", "got: typed", s);
    assert!(s.exited.is_empty(), "{:?}", s.exited);
    let ev = c.expect("terminal.exited on the plaintext channel", |v| {
        v["method"] == "terminal.exited" && v["route"]["chan_id"] == pchan
    });
    assert_eq!(
        plain_params(&ev),
        json!({"term_id": "p1", "reason": "evicted"})
    );
    let data = base64::encode(b"again\r");
    let (i, s) = sealed_term_call(
        c,
        &mut ch,
        &echan,
        "e1",
        "terminal.input",
        json!({"term_id": "e1", "data": data}),
    );
    assert_eq!(i["result"], Value::Null, "{i}");
    sealed_until(c, &mut ch, &echan, "e1", "got: again", s);
    // The wakelock is served on an E2EE channel, as to the operator.
    let (w, _) = c.sealed_call(&mut ch, &echan, "host.setWakelock", json!({}));
    assert_ne!(w["error"]["data"]["code"], "operator-only", "{w}");

    // A socket client takes the pane: the phone hears it, sealed in order.
    r.sock.call(
        "terminal.open",
        json!({"term_id": "t1", "session_id": PANE}),
    );
    let mut s = Screen::default();
    while s.exited.is_empty() {
        let f = c.next_sealed(&mut ch, &echan);
        s.take("e1", &f["method"], &f["inner"]);
    }
    assert_eq!(s.exited, [json!({"term_id": "e1", "reason": "evicted"})]);
    // And the phone takes it back.
    let open = json!({"term_id": "e2", "session_id": PANE});
    let (o, s) = sealed_term_call(c, &mut ch, &echan, "e2", "terminal.open", open);
    assert_eq!(o["result"], Value::Null, "{o}");
    let ev = r.sock.next_note("terminal.exited");
    assert_eq!(ev["params"], json!({"term_id": "t1", "reason": "evicted"}));
    sealed_until(c, &mut ch, &echan, "e2", "got: again", s);

    // relay.closed frees the channel's terminal: every terminal thread and
    // viewer session goes (the socket's was evicted already).
    assert_eq!(
        c.call("relay.close", json!({"chan_id": echan}))["result"],
        Value::Null
    );
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let threads = term_threads(r.n.pid());
        let views = r
            .servers
            .tmux("default", &["list-sessions", "-F", "#{session_name}"]);
        if threads.is_empty() && !views.contains("omniconflux-view") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still open: {threads:?} {views}"
        );
        r.sock.call("ping", json!({}));
    }
    // A later open from the socket finds the pane free.
    r.sock.call(
        "terminal.open",
        json!({"term_id": "t2", "session_id": PANE}),
    );
    let n = r.sock.next_note("terminal.output");
    assert_eq!(n["params"]["term_id"], "t2", "{n}");
    assert!(
        !r.sock
            .notes
            .iter()
            .any(|n| n["method"] == "terminal.exited"),
        "{:?}",
        r.sock.notes
    );
}

/// Issue 15 over issue 13's channels: `transcript.subscribe` of a tmux
/// session's Claude Code transcript file keeps the subscription on the
/// channel, whose deltas come as relay notifications; a channel that
/// lists or creates persistent terminals hears `terminal.changed`, sealed.
#[test]
fn channels_follow_tmux_transcripts_and_hear_terminal_changes() {
    let Some(mut r) = term_rig("up-ttx") else {
        return;
    };
    let c = &mut r.c;
    let pchan = c.open(NODE);
    let sub = c.plain(
        &pchan,
        "transcript.subscribe",
        Some(json!({"sub_id": "tp", "session_id": PANE})),
    );
    assert_eq!(sub["result"]["sub_id"], "tp", "{sub}");
    assert!(carries(&sub["result"]["entries"], "hello"), "{sub}");
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&r.transcript)
        .unwrap();
    let rec = json!({"type": "user", "message": {"role": "user", "content": "from the phone"},
        "sessionId": "0b6f0d8e-1111-4222-8333-944455556666"});
    f.write_all(format!("{rec}\n").as_bytes()).unwrap();
    loop {
        let d = c.expect("a transcript.delta of the file on the channel", |v| {
            v["method"] == "transcript.delta" && v["route"]["chan_id"] == pchan
        });
        let p = plain_params(&d);
        assert_eq!(p["sub_id"], "tp", "{p}");
        if carries(&p["entries"], "from the phone") {
            break;
        }
    }
    let un = c.plain(
        &pchan,
        "transcript.unsubscribe",
        Some(json!({"sub_id": "tp"})),
    );
    assert_eq!(un["result"], Value::Null, "{un}");

    // Persistent terminals on an E2EE channel (the operator's there).
    let echan = c.open(NODE);
    let mut ch = c.handshake(&echan, &r.key);
    let (l, _) = c.sealed_call(&mut ch, &echan, "terminal.list", json!({}));
    assert_eq!(l["result"]["terminals"], json!([]), "{l}");
    let (t, notes) = c.sealed_call(&mut ch, &echan, "terminal.create", json!({}));
    let tid = t["result"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{t}"))
        .to_string();
    // The node tells the change before it answers; the notification has
    // empty params.
    assert!(notes.contains(&json!({})), "{notes:?}");
    let (k, _) = c.sealed_call(
        &mut ch,
        &echan,
        "terminal.kill",
        json!({"terminal_id": tid}),
    );
    assert_eq!(k["result"], Value::Null, "{k}");
}

/// The events of a sealed channel read until `pick` takes one: the
/// `session.event`s on the way go to `events`, answers are skipped.
fn sealed_event_until(
    c: &mut Client,
    ch: &mut Channel,
    chan: &str,
    events: &mut Vec<Value>,
    what: &str,
    pick: impl Fn(&Value) -> bool,
) -> Value {
    if let Some(i) = events.iter().position(&pick) {
        return events.remove(i);
    }
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let f = c.next_sealed(ch, chan);
        if f["method"] == "session.event" {
            if pick(&f["inner"]) {
                return f["inner"].clone();
            }
            events.push(f["inner"].clone());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {what}: {events:?}"
        );
    }
}

/// A sealed call; the `session.event`s before its answer go to `events`.
fn sealed_call_events(
    c: &mut Client,
    ch: &mut Channel,
    chan: &str,
    method: &str,
    params: Value,
    events: &mut Vec<Value>,
) -> Value {
    let (answer, notes) = c.sealed_call(ch, chan, method, params);
    events.extend(notes.into_iter().filter(|n| n.get("session").is_some()));
    answer
}

/// Tmux sessions on a channel's session stream (seed 004, Sessions: the
/// snapshot, then live events): the discovered pane in the snapshot of a
/// plaintext channel and of an E2EE one; a pane spawned from the channel
/// opened at once with terminal.open, then `added` and, once killed,
/// `removed`; a pane the operator opens by hand found by the rescans a
/// channel keeps going with no socket watcher.
#[test]
fn channels_hear_tmux_sessions_and_open_a_pane_just_spawned() {
    let Some(mut r) = term_rig("up-tses") else {
        return;
    };
    let c = &mut r.c;
    // Plaintext: the snapshot comes before the first answer.
    let pchan = c.open(NODE);
    let id = c.relay(&pchan, "ping", String::new());
    let mut snapshot = Vec::new();
    loop {
        let f = c.expect("a frame on the plaintext channel", |v| {
            v["route"]["chan_id"] == pchan
        });
        if f["id"] == json!(id) {
            break;
        }
        if f["method"] == "session.event" {
            snapshot.push(plain_params(&f));
        }
    }
    assert!(
        snapshot
            .iter()
            .any(|e| e["type"] == "added" && e["session"]["id"] == PANE),
        "{snapshot:?}"
    );

    // E2EE: the snapshot follows message 2.
    let echan = c.open(NODE);
    let mut ch = c.handshake(&echan, &r.key);
    let mut events = Vec::new();
    let first = sealed_event_until(c, &mut ch, &echan, &mut events, "the snapshot", |e| {
        e["session"]["id"] == PANE
    });
    assert_eq!(first["type"], "added", "{first}");
    assert_eq!(first["session"]["frontend"], "tmux", "{first}");

    let v = sealed_call_events(
        c,
        &mut ch,
        &echan,
        "sessions.spawn",
        json!({"command": "sleep 300", "name": "live"}),
        &mut events,
    );
    let sid = v["result"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string();
    let open = json!({"term_id": "s", "session_id": sid, "cols": 80, "rows": 24});
    let o = sealed_call_events(c, &mut ch, &echan, "terminal.open", open, &mut events);
    assert_eq!(o, json!({"result": null}), "{o}");
    let close = json!({"term_id": "s"});
    let o = sealed_call_events(c, &mut ch, &echan, "terminal.close", close, &mut events);
    assert_eq!(o, json!({"result": null}), "{o}");
    let added = sealed_event_until(c, &mut ch, &echan, &mut events, "added", |e| {
        e["type"] == "added" && e["session"]["id"] == json!(sid)
    });
    assert_eq!(added["session"]["source"], "spawned", "{added}");
    let k = sealed_call_events(
        c,
        &mut ch,
        &echan,
        "sessions.kill",
        json!({"session_id": sid}),
        &mut events,
    );
    assert_eq!(k["result"], Value::Null, "{k}");
    sealed_event_until(c, &mut ch, &echan, &mut events, "removed", |e| {
        e["type"] == "removed" && e["session"]["id"] == json!(sid)
    });

    // No socket connection watches: the channels keep the rescans going.
    r.servers.tmux(
        "default",
        &[
            "new-window",
            "-d",
            "-t",
            "work:",
            "--",
            &util::fixture("tmux/claude"),
        ],
    );
    let by_hand = sealed_event_until(c, &mut ch, &echan, &mut events, "the new pane", |e| {
        e["type"] == "added"
            && e["session"]["tmux"]["server"] == "default"
            && e["session"]["id"] != PANE
    });
    assert_eq!(by_hand["session"]["source"], "discovered", "{by_hand}");
}
