//! Issue 13's figure for the uplink: an E2EE request and its answer
//! through the real gateway and node, against the same request in
//! plaintext mode.
//!
//! - `uplink_e2ee_vs_plaintext_{median,p99}`: a standalone `omniconfluxd
//!   gateway` and a node (`serve` with `[uplink] url`), one client on
//!   `/client` with two channels to the node: one plaintext, one Noise IK
//!   (our client end, e2ee::Initiator). The client sends `sessions.list`
//!   on one channel and waits for its answer, then on the other,
//!   alternating, and times each round trip (wall clock: the delay is
//!   what a user waits). Value: the E2EE round trip; baseline: the
//!   plaintext one; ratio E2EE / plaintext, the median and the 99th
//!   percentile. No goal: the issue asks for the figure.
//!
//! All three processes run unpinned: the path crosses two hops and four
//! threads, and pinning them to one core would measure the scheduler.

use omniconfluxd::e2ee::{Channel, Initiator, PublicKey, StaticKey, base64};
use serde_json::{Value, json};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tungstenite::client::IntoClientRequest;
use tungstenite::{Message, WebSocket};

use crate::util::{self, DaemonDirs, Figure, Proc, TempDir};

const MEDIAN: &str = "uplink_e2ee_vs_plaintext_median";
const P99: &str = "uplink_e2ee_vs_plaintext_p99";
const TOKEN: &str = "bench-master-token";

pub fn run() {
    if !util::selected(MEDIAN) && !util::selected(P99) {
        return;
    }
    if let Err(e) = measure() {
        util::skipped(MEDIAN, None, &format!("error: {e}"));
        util::skipped(P99, None, &format!("error: {e}"));
    }
}

/// Waits for `needle` in the log at `path`; the rest of its line.
fn log_line(path: &Path, needle: &str) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.contains(needle)) {
            return Ok(l.split(needle).nth(1).unwrap_or("").to_string());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("no {needle:?} in {}", path.display()))
}

struct Client {
    ws: WebSocket<TcpStream>,
    pending: Vec<u8>,
    lines: std::collections::VecDeque<Value>,
    next: u64,
}

impl Client {
    fn send(&mut self, v: &Value) -> Result<(), String> {
        self.ws
            .send(Message::text(format!("{v}\n")))
            .map_err(|e| e.to_string())
    }

    fn next(&mut self) -> Result<Value, String> {
        loop {
            if let Some(v) = self.lines.pop_front() {
                return Ok(v);
            }
            let bytes = match self.ws.read().map_err(|e| e.to_string())? {
                Message::Text(t) => t.as_bytes().to_vec(),
                Message::Binary(b) => b.to_vec(),
                _ => continue,
            };
            self.pending.extend_from_slice(&bytes);
            while let Some(i) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=i).collect();
                if let Ok(v) = serde_json::from_slice(&line) {
                    self.lines.push_back(v);
                }
            }
        }
    }

    fn until(&mut self, pick: impl Fn(&Value) -> bool) -> Result<Value, String> {
        loop {
            let v = self.next()?;
            if pick(&v) {
                return Ok(v);
            }
        }
    }

    /// One request on `chan` and the body of its answer.
    fn round_trip(&mut self, chan: &str, body: String) -> Result<String, String> {
        self.next += 1;
        let id = self.next;
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":"sessions.list",
            "route":{"chan_id":chan,"node_id":"bench"},"body":body}))?;
        let v = self.until(|v| v["id"] == json!(id) && v.get("route").is_some())?;
        Ok(v["body"].as_str().unwrap_or("").to_string())
    }
}

fn measure() -> Result<(), String> {
    let dir = TempDir::new("uplink");
    let glog = dir.path().join("gateway.log");
    let gdirs = DaemonDirs::under(&dir.path().join("gw"));
    let _ = std::fs::create_dir_all(&gdirs.home);
    let mut cmd = Command::new(util::daemon_bin());
    cmd.arg("--state-dir")
        .arg(&gdirs.state)
        .arg("--socket")
        .arg(&gdirs.socket)
        .args(["gateway", "--listen", "127.0.0.1:0"])
        .env("XDG_CONFIG_HOME", &gdirs.home)
        .env("HOME", &gdirs.home)
        .env("OMNICONFLUX_GATEWAY_TOKEN", TOKEN)
        .env_remove("NOTIFY_SOCKET");
    let _gw = Proc::spawn("gateway", cmd, None, Some(&glog))
        .map_err(|e| format!("unable to start the gateway: {e}"))?;
    let addr: SocketAddr = log_line(&glog, "gateway listening on ")?
        .split_whitespace()
        .next()
        .and_then(|a| a.parse().ok())
        .ok_or("no address in the gateway's log")?;
    let ndir = dir.path().join("node");
    let ndirs = DaemonDirs::under(&ndir);
    std::fs::create_dir_all(&ndir).map_err(|e| e.to_string())?;
    let mut ncmd = util::serve_with_config(
        &ndirs,
        &ndir,
        &format!("[daemon]\nnode_name = \"bench\"\n[uplink]\nurl = \"ws://{addr}\"\n"),
    );
    ncmd.env("OMNICONFLUX_UPLINK_TOKEN", TOKEN);
    let _node = Proc::spawn("omniconfluxd", ncmd, None, Some(&ndirs.log))
        .map_err(|e| format!("unable to start the node: {e}"))?;

    let mut req = format!("ws://{addr}/client")
        .into_client_request()
        .map_err(|e| e.to_string())?;
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {TOKEN}").parse().map_err(|_| "header")?,
    );
    let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let (ws, _) = tungstenite::client::client(req, tcp).map_err(|e| e.to_string())?;
    let mut c = Client {
        ws,
        pending: Vec::new(),
        lines: Default::default(),
        next: 0,
    };
    let node = c.until(|v| {
        v["method"] == "node.event"
            && v["params"]["node"]["id"] == "bench"
            && v["params"]["node"]["online"] == true
    })?;
    let key = PublicKey::from_base64(
        node["params"]["node"]["identity_pubkey"]
            .as_str()
            .ok_or("no identity_pubkey")?,
    )
    .map_err(|e| e.to_string())?;
    let open = |c: &mut Client| -> Result<String, String> {
        c.next += 1;
        let id = c.next;
        c.send(
            &json!({"jsonrpc":"2.0","id":id,"method":"relay.open","params":{"node_id":"bench"}}),
        )?;
        let v = c.until(|v| v["id"] == json!(id))?;
        v["result"]["chan_id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("relay.open: {v}"))
    };
    let plain = open(&mut c)?;
    let sealed = open(&mut c)?;
    let me = StaticKey::generate().map_err(|e| e.to_string())?;
    let (init, msg1) = Initiator::start(&me, &key, "bench", &sealed).map_err(|e| e.to_string())?;
    c.send(&json!({"jsonrpc":"2.0","method":"e2e.handshake",
        "route":{"chan_id":sealed},"body":base64::encode(&msg1)}))?;
    let m2 = c.until(|v| v["method"] == "e2e.handshake")?;
    let msg2 = base64::decode(m2["body"].as_str().unwrap_or("")).ok_or("message 2")?;
    let mut ch: Channel = init.finish(&msg2).map_err(|e| e.to_string())?;

    let n = util::rounds(2000, 300);
    let warm = n / 10;
    let mut p_ms = Vec::with_capacity(n);
    let mut e_ms = Vec::with_capacity(n);
    for i in 0..n + warm {
        let t = Instant::now();
        c.round_trip(&plain, String::new())?;
        let pt = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let body = ch.seal_body(b"").map_err(|e| e.code().to_string())?;
        let answer = c.round_trip(&sealed, body)?;
        ch.open_body(&answer).map_err(|e| e.code().to_string())?;
        let et = t.elapsed().as_secs_f64() * 1e3;
        if i >= warm {
            p_ms.push(pt);
            e_ms.push(et);
        }
    }
    for (name, q) in [(MEDIAN, 0.5), (P99, 0.99)] {
        let (value, baseline) = (util::quantile(&e_ms, q), util::quantile(&p_ms, q));
        Figure {
            name,
            placement: None,
            value,
            baseline: Some(baseline),
            baseline_of: "the same sessions.list on a plaintext channel of the same node",
            ratio: Some(value / baseline),
            better: "lower",
            goal: Value::Null,
            unit: "ms a round trip, client to node through the gateway and back",
            pass: true,
            rounds: n,
            extra: vec![],
        }
        .emit();
    }
    Ok(())
}
