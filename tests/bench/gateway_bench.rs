//! The gateway's figures (issue 12, "Figures"), on `serve --gateway` with a
//! fake node and clients speaking WebSocket (tungstenite) from the harness:
//!
//! - `gateway_relay_{64b,1k,64k}`: relayed round trips a second, a client
//!   sending relay requests on one channel (at most 32 in flight, under
//!   the channel's 64-frame queue) and the node answering each with the
//!   request itself, unparsed (a frame of the same size on the same route;
//!   see [`echo`] for why). Baseline, the issue's: `websocat` relaying the same
//!   WebSocket messages one for one (`ws-l:` for the client, `ws://` to a
//!   fake node that listens in the harness), on core 0 as the daemon is.
//!   websocat is taken from PATH, else built once from crates.io (version
//!   [`WEBSOCAT_VERSION`], `cargo install`) into
//!   `<target>/bench-tools/`. A second baseline, `bare_relay_rps`: a bare
//!   tungstenite relay run by the harness (one thread a direction, each
//!   message forwarded as received, no routing, no parsing), what a
//!   WebSocket relay costs at the least. When websocat cannot be had, the
//!   bare relay is the baseline and the line says why.
//! - `gateway_relay_instructions`: instructions the daemon executes per
//!   relayed round trip (two relay frames) at 64 B, 1 KiB and 64 KiB,
//!   counted by callgrind (valgrind) with the traffic of the figures above:
//!   two runs of the daemon under callgrind per size relay a few and many
//!   round trips; the difference of their totals over the difference of
//!   the counts is one round trip, start-up cancelling out. Unlike the
//!   rates it does not move with the machine's load.
//! - `gateway_idle_conn_rss`: the daemon's VmRSS with 1,000 idle `/client`
//!   connections minus without, per connection (goal <= 64 KiB), and its
//!   CPU ticks over 3 s while they idle (goal 0).
//! - `gateway_added_delay`: a relayed request's round trip (client ->
//!   gateway -> node -> gateway -> client, one at a time) minus a `ping`
//!   round trip on the node's unix socket, median and p99.
//! - `gateway_trustlog_sync_10k` (issue 14, Figures): a second fake node
//!   pushes the 10,000-entry chain of trustlog_bench.rs; a client's
//!   `trustlog.sync` with an empty `known` (all 10,000 entries come back),
//!   round trip median in ms, the answer's bytes, and the daemon's VmRSS
//!   after the push minus before, in KiB per 10,000 entries held.

use serde_json::{Value, json};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tungstenite::client::IntoClientRequest;
use tungstenite::{Message, WebSocket};

use crate::util::{self, DaemonDirs, Figure, LineClient, PING, Proc, TempDir};

const MASTER: &str = "bench-master-token";

/// The websocat built when none is on PATH: the last 1.x release (4.x is
/// an alpha).
const WEBSOCAT_VERSION: &str = "1.14.0";

/// websocat's largest message (`--buffer-size`): a message past it would
/// be split, and the largest frame here (64 KiB of body in base64 and its
/// envelope) is about 88 KiB, so every message passes one for one.
const WEBSOCAT_MESSAGE: usize = 1 << 20;

pub fn run() {
    let figures = [
        "gateway_relay_64b",
        "gateway_relay_1k",
        "gateway_relay_64k",
        "gateway_idle_conn_rss",
        "gateway_idle_conn_cpu",
        "gateway_added_delay",
        "gateway_trustlog_sync_10k",
    ];
    if figures.iter().any(|f| util::selected(f))
        && let Err(e) = measure()
    {
        util::skipped("gateway", None, &format!("error: {e}"));
    }
    if util::selected(INSTRUCTIONS) {
        instructions();
    }
}

fn start(tmp: &TempDir) -> Result<(Proc, DaemonDirs, SocketAddr), String> {
    start_under(tmp, None)
}

/// The daemon, or with `callgrind` (valgrind and its output file) the
/// daemon under callgrind.
fn start_under(
    tmp: &TempDir,
    callgrind: Option<(&std::path::Path, &std::path::Path)>,
) -> Result<(Proc, DaemonDirs, SocketAddr), String> {
    let dirs = DaemonDirs::under(tmp.path());
    let mut cmd = util::serve_with_config(
        &dirs,
        tmp.path(),
        "[gateway]\nlisten = \"127.0.0.1:0\"\nmax_connections = 4096\n",
    );
    cmd.env("OMNICONFLUX_GATEWAY_TOKEN", MASTER);
    if let Some((valgrind, out)) = callgrind {
        cmd = util::under_callgrind(valgrind, out, tmp.path(), &cmd, &[]);
    }
    let mut p = Proc::spawn("omniconfluxd", cmd, Some(0), Some(&dirs.log))
        .map_err(|e| format!("unable to start the daemon: {e}"))?;
    let ready = Duration::from_secs(if callgrind.is_some() { 120 } else { 20 });
    util::wait_daemon_ready(&mut p, &dirs.socket, ready)
        .map_err(|e| format!("{e}; log: {}", util::log_tail(&dirs.log)))?;
    let log = std::fs::read_to_string(&dirs.log).unwrap_or_default();
    let addr = log
        .lines()
        .find_map(|l| l.split("gateway listening on ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .ok_or("no gateway address in the log")?;
    Ok((p, dirs, addr))
}

fn dial(addr: SocketAddr, path: &str) -> Result<WebSocket<TcpStream>, String> {
    let mut req = format!("ws://{addr}{path}")
        .into_client_request()
        .map_err(|e| e.to_string())?;
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {MASTER}").parse().expect("header"),
    );
    let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    tungstenite::client::client(req, tcp)
        .map(|(ws, _)| ws)
        .map_err(|e| format!("handshake: {e}"))
}

/// Reads lines off a WebSocket peer.
struct Lines {
    ws: WebSocket<TcpStream>,
    pending: Vec<u8>,
    ready: std::collections::VecDeque<Vec<u8>>,
}

impl Lines {
    fn new(ws: WebSocket<TcpStream>) -> Lines {
        Lines {
            ws,
            pending: Vec::new(),
            ready: Default::default(),
        }
    }

    fn next(&mut self) -> Result<Vec<u8>, String> {
        loop {
            if let Some(l) = self.ready.pop_front() {
                return Ok(l);
            }
            match self.ws.read().map_err(|e| e.to_string())? {
                Message::Text(t) => self.pending.extend_from_slice(t.as_bytes()),
                Message::Binary(b) => self.pending.extend_from_slice(&b),
                Message::Close(_) => return Err("closed".into()),
                _ => continue,
            }
            while let Some(i) = self.pending.iter().position(|b| *b == b'\n') {
                let l: Vec<u8> = self.pending.drain(..=i).collect();
                if l.len() > 1 {
                    self.ready.push_back(l);
                }
            }
        }
    }

    fn json(&mut self) -> Result<Value, String> {
        serde_json::from_slice(&self.next()?).map_err(|e| e.to_string())
    }

    fn send(&mut self, line: &str) -> Result<(), String> {
        self.ws
            .send(Message::text(line.to_string()))
            .map_err(|e| e.to_string())
    }
}

/// A fake node on its own thread: answers `node.identify`, then answers
/// every relay request with itself ([`echo`]).
fn fake_node(ws: WebSocket<TcpStream>, id: &str) -> std::thread::JoinHandle<()> {
    let id = id.to_string();
    std::thread::spawn(move || {
        let mut n = Lines::new(ws);
        let Ok(req) = n.json() else { return };
        let ident = json!({"jsonrpc":"2.0","id":req["id"],"result":{"id":id,"label":id,"version":"0","capabilities":{}}});
        if n.send(&format!("{ident}\n")).is_err() {
            return;
        }
        echo(n);
    })
}

/// Answers every relay request with itself, verbatim, until the connection
/// ends: a frame of the same size on the same route, which every relay
/// measured here (the gateway, websocat, the bare relay) passes on as it
/// is. Built without parsing it: the node thread, not pinned, runs mostly
/// on core 1 beside the pinned client, and when the harness's side is the
/// bottleneck the figure measures the harness, not the relay (it did while
/// this node parsed each request into a `Value` and wrote a new frame:
/// core 1 99% busy, the relay's core 16% idle).
fn echo(mut n: Lines) {
    while let Ok(line) = n.next() {
        // Only relay frames (their `route` comes before the body, so the
        // search ends early): the gateway's own lines to the node are not
        // bounced back.
        if !line.windows(8).any(|w| w == b"\"route\":") {
            continue;
        }
        let Ok(text) = String::from_utf8(line) else {
            continue;
        };
        if n.ws.send(Message::text(text)).is_err() {
            return;
        }
    }
}

/// Exactly `n` round trips, at most `window` in flight.
fn pump_n(c: &mut Lines, chan: &str, body: &str, window: u64, n: u64) -> Result<(), String> {
    let (mut sent, mut done) = (0u64, 0u64);
    while done < n {
        while sent < n && sent - done < window {
            sent += 1;
            c.send(&relay_frame(sent, chan, body))?;
        }
        c.next()?;
        done += 1;
    }
    Ok(())
}

fn relay_frame(id: u64, chan: &str, body: &str) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"echo\",\"route\":{{\"chan_id\":\"{chan}\",\"node_id\":\"n\"}},\"body\":\"{body}\"}}\n"
    )
}

/// Round trips a second over `dur`, at most `window` in flight.
fn pump(
    c: &mut Lines,
    chan: &str,
    body: &str,
    window: usize,
    dur: Duration,
) -> Result<f64, String> {
    let mut sent = 0u64;
    let mut done = 0u64;
    let t0 = Instant::now();
    let frame = |id: u64| relay_frame(id, chan, body);
    while t0.elapsed() < dur {
        while sent - done < window as u64 {
            sent += 1;
            c.send(&frame(sent))?;
        }
        c.next()?;
        done += 1;
    }
    let secs = t0.elapsed().as_secs_f64();
    while done < sent {
        c.next()?;
        done += 1;
    }
    Ok(done as f64 / secs)
}

/// The baseline: a bare tungstenite relay between one client and one node
/// connection, a thread per direction forwarding each message as is.
fn bare_relay() -> Result<SocketAddr, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    // On core 0, as the daemon is: its threads inherit the CPU.
    util::on_cpu(0, || {
        std::thread::spawn(move || {
            let accept = || -> Option<(WebSocket<TcpStream>, WebSocket<TcpStream>)> {
                let (s, _) = l.accept().ok()?;
                s.set_nodelay(true).ok()?;
                let w = s.try_clone().ok()?;
                let r = tungstenite::accept(s).ok()?;
                let w = WebSocket::from_raw_socket(w, tungstenite::protocol::Role::Server, None);
                Some((r, w))
            };
            let Some((mut node_r, mut node_w)) = accept() else {
                return;
            };
            // The node expects node.identify first; the relay sends it as the
            // gateway would, and swallows the answer.
            let _ = node_w.send(Message::text(
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"node.identify\"}\n",
            ));
            let _ = node_r.read();
            let Some((mut client_r, mut client_w)) = accept() else {
                return;
            };
            std::thread::spawn(move || {
                while let Ok(m) = node_r.read() {
                    if m.is_text() && client_w.send(m).is_err() {
                        return;
                    }
                }
            });
            while let Ok(m) = client_r.read() {
                if m.is_text() && node_w.send(m).is_err() {
                    return;
                }
            }
        })
    });
    Ok(addr)
}

/// The websocat program: on PATH, else the one built into
/// `<target>/bench-tools/` (built now if it is not there yet), and its
/// version line.
fn websocat() -> Result<(PathBuf, String), String> {
    let bin = match util::find_tool("websocat") {
        Some(p) => p,
        None => {
            let root = util::target_dir().join("bench-tools");
            let bin = root.join("bin/websocat");
            if !bin.is_file() {
                eprintln!(
                    "bench: building websocat {WEBSOCAT_VERSION} into {} (once)",
                    root.display()
                );
                let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
                // Plain ws:// only: without its default features it needs
                // no TLS library. Not `--locked`: its lock file pins
                // traitobject 0.1.0, which today's rustc refuses.
                let st = Command::new(cargo)
                    .args(["install", "--quiet", "--no-default-features"])
                    .args(["--version", WEBSOCAT_VERSION, "--root"])
                    .arg(&root)
                    .arg("websocat")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .status()
                    .map_err(|e| format!("unable to run cargo install websocat: {e}"))?;
                if !st.success() || !bin.is_file() {
                    return Err(format!(
                        "cargo install websocat {WEBSOCAT_VERSION} failed: {st}"
                    ));
                }
            }
            bin
        }
    };
    let out = Command::new(&bin)
        .arg("--version")
        .output()
        .map_err(|e| format!("unable to run {}: {e}", bin.display()))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok((bin, version))
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// The baseline: websocat on core 0, as the daemon is, taking the
/// client on `ws-l:` and dialing, for it, a fake node that listens in the
/// harness; each message is relayed as one message (`--buffer-size` above
/// the largest), as text, as the gateway's are. Returns the process and
/// the client's connection.
fn websocat_relay(bin: &std::path::Path) -> Result<(Proc, Lines), String> {
    let node_l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let node_addr = node_l.local_addr().map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        let Ok((s, _)) = node_l.accept() else { return };
        let _ = s.set_nodelay(true);
        if let Ok(ws) = tungstenite::accept(s) {
            echo(Lines::new(ws));
        }
    });
    let port = free_port()?;
    let mut cmd = Command::new(bin);
    cmd.args(["--text", "--exit-on-eof", "-q", "--buffer-size"])
        .arg(WEBSOCAT_MESSAGE.to_string())
        .arg(format!("ws-l:127.0.0.1:{port}"))
        .arg(format!("ws://{node_addr}/node"));
    let p = Proc::spawn("websocat", cmd, Some(0), None)
        .map_err(|e| format!("unable to start websocat: {e}"))?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    // Until it listens.
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        match dial(addr, "/client") {
            Ok(ws) => return Ok((p, Lines::new(ws))),
            Err(e) if Instant::now() > end => return Err(format!("websocat did not listen: {e}")),
            Err(_) => std::thread::sleep(util::PROBE_INTERVAL),
        }
    }
}

fn b64_of(n: usize) -> String {
    // Any standard base64 text of the encoded size of n bytes.
    "A".repeat(n.div_ceil(3) * 4)
}

/// A fake node and a client with a channel open to it on the gateway at
/// `addr`: the node's thread, the client and the channel id.
fn open_channel(addr: SocketAddr) -> Result<(std::thread::JoinHandle<()>, Lines, String), String> {
    let node = fake_node(dial(addr, "/node")?, "n");
    let mut c = Lines::new(dial(addr, "/client")?);
    // Wait until the node is in the roster (the daemon's own node, in it
    // too, may come first).
    loop {
        let v = c.json()?;
        let node = &v["params"]["node"];
        if v["method"] == "node.event" && node["online"] == true && node["id"] == "n" {
            break;
        }
    }
    c.send(
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"relay.open\",\"params\":{\"node_id\":\"n\"}}\n",
    )?;
    // Its answer, past any roster event sent before it.
    let opened = loop {
        let v = c.json()?;
        if v["id"] == 1 {
            break v;
        }
    };
    let chan = opened["result"]["chan_id"]
        .as_str()
        .ok_or_else(|| format!("relay.open failed: {opened}"))?
        .to_string();
    Ok((node, c, chan))
}

pub const INSTRUCTIONS: &str = "gateway_relay_instructions";

/// Round trips in the two callgrind runs of each size.
const CG_FEW: u64 = 100;
const CG_MANY: u64 = 600;

/// `gateway_relay_instructions` (module comment).
fn instructions() {
    let Some(valgrind) = util::valgrind_for(INSTRUCTIONS) else {
        return;
    };
    let sizes = [("64b", 64usize), ("1k", 1024), ("64k", 64 * 1024)];
    let r = sizes
        .iter()
        .map(|&(name, size)| {
            let few = relay_total_ir(&valgrind, size, CG_FEW)?;
            let many = relay_total_ir(&valgrind, size, CG_MANY)?;
            Ok((name, ((many - few) / (CG_MANY - CG_FEW) as f64).round()))
        })
        .collect::<Result<Vec<(&str, f64)>, String>>();
    match r {
        Ok(per) => {
            let mut extra: Vec<(&str, Value)> = per.iter().map(|&(k, v)| (k, json!(v))).collect();
            extra.push(("round_trips", json!([CG_FEW, CG_MANY])));
            Figure {
                name: INSTRUCTIONS,
                placement: None,
                value: per.last().map_or(0.0, |p| p.1),
                baseline: None,
                baseline_of: "",
                ratio: None,
                better: "lower",
                goal: json!("none: a repeatable count to compare between commits"),
                unit: "instructions per relayed round trip at 64 KiB, all daemon threads (64b, 1k, 64k: each size)",
                pass: true,
                rounds: 1,
                extra,
            }
            .emit();
        }
        Err(e) => util::skipped(INSTRUCTIONS, None, &format!("error: {e}")),
    }
}

/// The total instructions of a daemon under callgrind that relays `n`
/// round trips of `size`-byte bodies (32 in flight), start and stop
/// included.
fn relay_total_ir(valgrind: &std::path::Path, size: usize, n: u64) -> Result<f64, String> {
    let tmp = TempDir::new("gateway-cg");
    let out = tmp.path().join("callgrind.out");
    let (daemon, dirs, addr) = start_under(&tmp, Some((valgrind, &out)))?;
    {
        let (node, mut c, chan) =
            open_channel(addr).map_err(|e| format!("{e}; log: {}", util::log_tail(&dirs.log)))?;
        let body = b64_of(size);
        util::on_cpu(1, || pump_n(&mut c, &chan, &body, 32, n))?;
        drop(c);
        drop(node);
    }
    daemon.stop(Duration::from_secs(120));
    util::callgrind_total(&out, &dirs.log)
}

fn measure() -> Result<(), String> {
    // Built (the first time, for minutes) before the channel opens: the
    // fake node gives up after 30 s without a line, as every harness
    // socket does.
    let tool = websocat();
    let tmp = TempDir::new("gateway");
    let (daemon, dirs, addr) = start(&tmp)?;
    let (node, mut c, chan) = open_channel(addr)?;

    let rounds = util::rounds(5, 2);
    let dur = Duration::from_millis(if util::quick() { 500 } else { 1500 });
    for (figure, size, goal) in [
        ("gateway_relay_64b", 64usize, 1.0),
        ("gateway_relay_1k", 1024, 1.0),
        ("gateway_relay_64k", 64 * 1024, 2.0),
    ] {
        if !util::selected(figure) {
            continue;
        }
        let body = b64_of(size);
        let base_addr = bare_relay()?;
        let _base_node = fake_node(dial(base_addr, "/node")?, "n");
        let mut b = Lines::new(dial(base_addr, "/client")?);
        let mut ws = match &tool {
            Ok((bin, _)) => Some(websocat_relay(bin)?),
            Err(_) => None,
        };
        let (mut v, mut wv, mut bv) = (Vec::new(), Vec::new(), Vec::new());
        // Which relay failed, for the skipped line.
        let gw = |e| format!("through the gateway: {e}");
        let wsc = |e| format!("through websocat: {e}");
        let bare = |e| format!("through the bare relay: {e}");
        util::on_cpu(1, || -> Result<(), String> {
            pump(&mut c, &chan, &body, 32, dur / 3).map_err(gw)?;
            pump(&mut b, &chan, &body, 32, dur / 3).map_err(bare)?;
            if let Some((_, w)) = &mut ws {
                pump(w, &chan, &body, 32, dur / 3).map_err(wsc)?;
            }
            for _ in 0..rounds {
                v.push(pump(&mut c, &chan, &body, 32, dur).map_err(gw)?);
                if let Some((_, w)) = &mut ws {
                    wv.push(pump(w, &chan, &body, 32, dur).map_err(wsc)?);
                }
                bv.push(pump(&mut b, &chan, &body, 32, dur).map_err(bare)?);
            }
            Ok(())
        })?;
        drop(ws);
        let (value, bare) = (util::median(&v), util::median(&bv));
        let mut extra = vec![
            ("frame_bytes", json!(size)),
            ("value_spread", util::round3(util::spread(&v))),
        ];
        let (base, baseline_of) = match &tool {
            Ok((_, version)) => {
                extra.push(("baseline_spread", util::round3(util::spread(&wv))));
                extra.push(("websocat", json!(version)));
                extra.push(("bare_relay_rps", util::round3(bare)));
                extra.push(("bare_relay_spread", util::round3(util::spread(&bv))));
                extra.push(("ratio_to_bare_relay", util::round3(value / bare)));
                (
                    util::median(&wv),
                    "websocat on core 0 relaying the same messages (ws-l: to ws://, --text); bare_relay_rps: a bare tungstenite relay in the harness".to_string(),
                )
            }
            Err(e) => {
                extra.push(("baseline_spread", util::round3(util::spread(&bv))));
                (
                    bare,
                    format!("a bare tungstenite relay in the harness (websocat unavailable: {e})"),
                )
            }
        };
        Figure {
            name: figure,
            placement: Some("spread"),
            value,
            baseline: Some(base),
            baseline_of: &baseline_of,
            ratio: Some(value / base),
            better: "higher",
            goal: json!(format!("ratio >= {goal}")),
            unit: "relayed round trips/s (32 in flight)",
            pass: value / base >= goal,
            rounds,
            extra,
        }
        .emit();
    }

    if util::selected("gateway_added_delay") {
        let n = if util::quick() { 300 } else { 2000 };
        let mut direct = LineClient::connect(&dirs.socket).map_err(|e| e.to_string())?;
        let body = b64_of(64);
        let (mut relayed, mut unix) = (Vec::with_capacity(n), Vec::with_capacity(n));
        util::on_cpu(1, || -> Result<(), String> {
            for i in 0..n {
                let t0 = Instant::now();
                c.send(&format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"echo\",\"route\":{{\"chan_id\":\"{chan}\",\"node_id\":\"n\"}},\"body\":\"{body}\"}}\n"
                ))?;
                c.next()?;
                relayed.push(t0.elapsed().as_secs_f64() * 1e6);
                let t0 = Instant::now();
                direct.exchange(PING).map_err(|e| e.to_string())?;
                unix.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            Ok(())
        })?;
        let (rm, um) = (util::median(&relayed), util::median(&unix));
        let (r99, u99) = (util::quantile(&relayed, 0.99), util::quantile(&unix, 0.99));
        Figure {
            name: "gateway_added_delay",
            placement: Some("spread"),
            value: rm - um,
            baseline: Some(um),
            baseline_of: "ping round trip on the node's unix socket",
            ratio: Some(rm / um),
            better: "lower",
            goal: json!("report"),
            unit: "us added (median)",
            pass: true,
            rounds: n,
            extra: vec![
                ("relayed_median_us", util::round3(rm)),
                ("relayed_p99_us", util::round3(r99)),
                ("unix_p99_us", util::round3(u99)),
                ("added_p99_us", util::round3(r99 - u99)),
            ],
        }
        .emit();
    }

    if util::selected("gateway_idle_conn") {
        let before = util::vm_rss_kib(daemon.pid()).ok_or("no VmRSS")?;
        let mut held = Vec::with_capacity(1000);
        for _ in 0..1000 {
            let mut ws = dial(addr, "/client")?;
            // Its snapshot (the node added) is read, so nothing is queued.
            let _ = ws.read();
            held.push(ws);
        }
        // Until the last one is registered: a ping on it is answered.
        let mut last = Lines::new(held.pop().ok_or("no connection")?);
        last.send("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")?;
        last.next()?;
        let after = util::vm_rss_kib(daemon.pid()).ok_or("no VmRSS")?;
        let per = (after - before) / 1000.0;
        Figure {
            name: "gateway_idle_conn_rss",
            placement: None,
            value: per,
            baseline: None,
            baseline_of: "",
            ratio: Some(per / 64.0),
            better: "lower",
            goal: json!("<= 64 KiB"),
            unit: "KiB VmRSS per idle /client connection (1,000 held)",
            pass: per <= 64.0,
            rounds: 1,
            extra: vec![
                ("rss_before_kib", json!(before)),
                ("rss_after_kib", json!(after)),
            ],
        }
        .emit();
        let t0 = cpu_ticks(daemon.pid()).ok_or("no stat")?;
        std::thread::sleep(Duration::from_secs(3));
        let ticks = cpu_ticks(daemon.pid()).ok_or("no stat")? - t0;
        Figure {
            name: "gateway_idle_conn_cpu",
            placement: None,
            value: ticks as f64,
            baseline: None,
            baseline_of: "",
            ratio: None,
            better: "lower",
            goal: json!("0 ticks in 3 s"),
            unit: "clock ticks (utime+stime) in 3 s, 1,000 idle connections",
            pass: ticks == 0,
            rounds: 1,
            extra: vec![],
        }
        .emit();
        drop(held);
    }
    if util::selected("gateway_trustlog_sync_10k") {
        trustlog_sync(&daemon, addr, &mut c)?;
    }
    drop(c);
    daemon.stop(Duration::from_secs(10));
    let _ = node.join();
    Ok(())
}

/// The `trustlog.sync` figure (module comment).
fn trustlog_sync(daemon: &Proc, addr: SocketAddr, c: &mut Lines) -> Result<(), String> {
    let entries = crate::trustlog_bench::build();
    let wire_bytes: usize = entries.iter().map(|e| e.wire().len()).sum();
    let list: Vec<Value> = entries
        .iter()
        .map(|e| json!(omniconfluxd::e2ee::base64::encode(e.wire())))
        .collect();
    let mut n = Lines::new(dial(addr, "/node")?);
    let req = n.json()?;
    n.send(&format!(
        "{}\n",
        json!({"jsonrpc":"2.0","id":req["id"],"result":{"id":"t","label":"t","version":"0","capabilities":{}}})
    ))?;
    let before = util::vm_rss_kib(daemon.pid()).ok_or("no VmRSS")?;
    n.send(&format!(
        "{}\n",
        json!({"jsonrpc":"2.0","id":1,"method":"trustlog.push","params":{"entries":list}})
    ))?;
    let pushed = n.json()?;
    if pushed.get("result") != Some(&Value::Null) {
        return Err(format!("trustlog.push failed: {pushed}"));
    }
    let after = util::vm_rss_kib(daemon.pid()).ok_or("no VmRSS")?;
    let rounds = util::rounds(20, 5);
    let mut times = Vec::with_capacity(rounds);
    let mut answer_bytes = 0;
    util::on_cpu(1, || -> Result<(), String> {
        for i in 0..rounds {
            let t0 = Instant::now();
            c.send(&format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":\"s{i}\",\"method\":\"trustlog.sync\",\"params\":{{}}}}\n"
            ))?;
            // Skip roster events (the second node's added, trust-changed);
            // the gateway writes an answer's members in order, `id` first.
            let line = loop {
                let l = c.next()?;
                if l.starts_with(b"{\"id\":\"s") {
                    break l;
                }
            };
            times.push(t0.elapsed().as_secs_f64() * 1e3);
            answer_bytes = line.len();
            let v: Value = serde_json::from_slice(&line).map_err(|e| e.to_string())?;
            let got = v["result"]["entries"].as_array().map_or(0, Vec::len);
            if got != entries.len() {
                return Err(format!("trustlog.sync gave {got} entries"));
            }
        }
        Ok(())
    })?;
    let ms = util::median(&times);
    Figure {
        name: "gateway_trustlog_sync_10k",
        placement: Some("spread"),
        value: ms,
        baseline: None,
        baseline_of: "",
        ratio: None,
        better: "lower",
        goal: json!("report"),
        unit: "ms per trustlog.sync answering 10,000 entries (round trip, median)",
        pass: true,
        rounds,
        extra: vec![
            ("answer_bytes", json!(answer_bytes)),
            ("entries_wire_bytes", json!(wire_bytes)),
            ("p99_ms", util::round3(util::quantile(&times, 0.99))),
            ("rss_held_kib_per_10k", json!(after - before)),
        ],
    }
    .emit();
    Ok(())
}

/// utime + stime of the whole process, in clock ticks.
fn cpu_ticks(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}
