//! Issue 6, HTTP API figures.
//!
//! - `http_get_session_vs_tiny_http`: `GET /sessions/{id}` (bearer token,
//!   an idle session) with 8 concurrent keep-alive clients (wrk, 2 threads,
//!   8 connections), requests/s, against "a bare tiny_http handler"
//!   returning a fixed body of the same size (tiny_http is a dev-dependency
//!   only for this; its server runs in the harness process on the server's
//!   core with as many handler threads as `http.threads`), goal ratio >=
//!   0.8; `nginx_rps` and `ratio_to_nginx` report nginx (one worker, the
//!   same body as a static file) in the same rounds. Both placements.
//! - `http_sse_fanout_delay`: 100 session watchers (`Accept:
//!   text/event-stream`) of one busy session, a fast ACP agent
//!   (fast_acp_agent.py) streaming stamped chunks with prompts kept queued;
//!   delay from the chunk's stamp (the agent's write, which precedes the
//!   ledger commit) to a watcher reading the batch carrying it, median
//!   (`value`) and `p99_ms`, over every watcher; report. The agent there
//!   outruns the watchers: their one core reads 3 to 6 million chunks a
//!   second in all on the machine this was written on, and falls behind,
//!   so that delay is the backlog that builds up over the window, and it
//!   swings with the machine. The `paced_` fields are the same with the
//!   agent held to `PACED_RATE` chunks a second (FAST_RATE), well below
//!   that: the delay of delivery itself.
//! - `http_sse_watchers_rss`: daemon VmRSS with 100 attached watchers
//!   minus with none, MiB (`per_watcher_kib`, `threads` besides), idle
//!   and at the end of the busy window; report.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::util::{self, Figure, Placement, Proc, Rpc, TempDir};

pub const GET: &str = "http_get_session_vs_tiny_http";
pub const SSE_DELAY: &str = "http_sse_fanout_delay";
pub const SSE_RSS: &str = "http_sse_watchers_rss";

const CLIENTS: usize = 8;
const WATCHERS: usize = 100;

pub fn run() {
    let want_get = util::selected(GET);
    let want_sse = util::selected(SSE_DELAY) || util::selected(SSE_RSS);
    if !want_get && !want_sse {
        return;
    }
    let Some(py) = util::python3() else {
        for f in [GET, SSE_DELAY, SSE_RSS] {
            util::skipped(f, None, "python3 not found");
        }
        return;
    };
    if want_get {
        match util::find_tool("wrk") {
            None => util::skipped(GET, None, "wrk not found; apt-get install wrk"),
            Some(wrk) => {
                for placement in util::placements() {
                    if let Err(e) = get_figure(&py, &wrk, placement) {
                        util::skipped(GET, Some(placement.name()), &format!("error: {e}"));
                    }
                }
            }
        }
    }
    if want_sse {
        let placement = *util::placements().last().expect("core 0 is allowed");
        if let Err(e) = sse_figure(&py, placement) {
            util::skipped(SSE_DELAY, Some(placement.name()), &format!("error: {e}"));
        }
    }
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// `rate`: the agent's chunks a second (FAST_RATE), 0 for as fast as it
/// can.
fn config(py: &Path, port: u16, token: &Path, chunks: usize, rate: u32) -> String {
    format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\ntoken_file = \"{}\"\n\n[[seat]]\nharness = \"fast\"\ncommand = \"{}\"\nargs = [\"{}\"]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\nenv = {{ FAST_CHUNKS = \"{chunks}\", FAST_PAD = \"64\", FAST_BATCH = \"16\", FAST_RATE = \"{rate}\" }}\n",
        token.display(),
        py.display(),
        util::bench_file("fast_acp_agent.py").display()
    )
}

/// A daemon with the HTTP API and one live, idle session.
struct Api {
    proc: Proc,
    addr: SocketAddr,
    token: String,
    sid: String,
    ctl: Rpc,
}

fn start_api(dir: &Path, py: &Path, cpu: usize, chunks: usize, rate: u32) -> Result<Api, String> {
    let port = free_port()?;
    let token_path = dir.join("token");
    let config = config(py, port, &token_path, chunks, rate);
    let (proc, dirs) = util::start_daemon(dir, &config, Some(cpu))?;
    let token = std::fs::read_to_string(&token_path)
        .map_err(|e| format!("token: {e}"))?
        .trim()
        .to_string();
    let mut ctl = Rpc::connect(&dirs.socket)?;
    let cwd = dir.canonicalize().map_err(|e| e.to_string())?;
    let r = ctl.call(
        "sessions.spawn",
        serde_json::json!({"harness": "fast", "cwd": cwd.display().to_string()}),
    )?;
    let sid = r["session_id"].as_str().ok_or("no session id")?.to_string();
    let addr: SocketAddr = format!("127.0.0.1:{port}")
        .parse()
        .map_err(|e| format!("{e}"))?;
    Ok(Api {
        proc,
        addr,
        token,
        sid,
        ctl,
    })
}

/// One GET on a new connection: (status, body).
fn get_once(addr: SocketAddr, path: &str, token: &str) -> Result<(u16, Vec<u8>), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).map_err(|e| e.to_string())?;
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no header end")?;
    let status = std::str::from_utf8(&out[9..12])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or("no status")?;
    Ok((status, out[split + 4..].to_vec()))
}

/// wrk's requests/s against `url` for `secs`, on `cpu`.
fn wrk(wrk: &Path, url: &str, token: Option<&str>, cpu: usize, secs: u64) -> Result<f64, String> {
    let mut cmd = Command::new("taskset");
    cmd.arg("-c")
        .arg(cpu.to_string())
        .arg(wrk)
        .arg("-t2")
        .arg(format!("-c{CLIENTS}"))
        .arg(format!("-d{secs}s"));
    if let Some(t) = token {
        cmd.arg("-H").arg(format!("Authorization: Bearer {t}"));
    }
    cmd.arg(url);
    let out = cmd.output().map_err(|e| format!("wrk: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("Non-2xx") {
        return Err(format!("wrk saw non-2xx answers: {text}"));
    }
    text.lines()
        .find_map(|l| {
            l.strip_prefix("Requests/sec:")
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .ok_or_else(|| {
            format!(
                "no Requests/sec in wrk's output: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// The bare baseline: tiny_http with `threads` handler threads answering
/// every request with `body`.
struct Bare {
    addr: SocketAddr,
    server: Arc<tiny_http::Server>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Bare {
    fn start(body: Vec<u8>, threads: usize, cpu: usize) -> Result<Bare, String> {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").map_err(|e| e.to_string())?);
        let addr = server.server_addr().to_ip().ok_or("no address")?;
        let body = Arc::new(body);
        let handles = (0..threads)
            .map(|_| {
                let (server, body) = (server.clone(), body.clone());
                util::on_cpu(cpu, || {
                    std::thread::spawn(move || {
                        let header = tiny_http::Header::from_bytes(
                            &b"Content-Type"[..],
                            &b"application/json"[..],
                        )
                        .expect("a static header");
                        for req in server.incoming_requests() {
                            let _ = req.respond(
                                tiny_http::Response::from_data(body.as_slice().to_vec())
                                    .with_header(header.clone()),
                            );
                        }
                    })
                })
            })
            .collect();
        Ok(Bare {
            addr,
            server,
            threads: handles,
        })
    }

    fn stop(self) {
        self.server.unblock();
        for _ in 1..self.threads.len() {
            self.server.unblock();
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// nginx serving `body` as /body.json with one worker on `cpu`.
fn start_nginx(nginx: &Path, dir: &Path, body: &[u8], cpu: usize) -> Result<(Proc, u16), String> {
    let root = dir.join("nginx");
    std::fs::create_dir_all(root.join("html")).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(root.join("logs")).map_err(|e| e.to_string())?;
    std::fs::write(root.join("html/body.json"), body).map_err(|e| e.to_string())?;
    let port = free_port()?;
    let conf = format!(
        "worker_processes 1;\nerror_log {r}/logs/error.log;\npid {r}/logs/nginx.pid;\nevents {{ worker_connections 256; }}\n\
         http {{\n access_log off;\n client_body_temp_path {r}/logs;\n proxy_temp_path {r}/logs;\n fastcgi_temp_path {r}/logs;\n uwsgi_temp_path {r}/logs;\n scgi_temp_path {r}/logs;\n\
         keepalive_requests 1000000;\n server {{\n  listen 127.0.0.1:{port};\n  location / {{ root {r}/html; default_type application/json; }}\n }}\n}}\n",
        r = root.display()
    );
    std::fs::write(root.join("nginx.conf"), conf).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(nginx);
    cmd.arg("-p")
        .arg(&root)
        .arg("-c")
        .arg(root.join("nginx.conf"))
        .arg("-g")
        .arg("daemon off; master_process off;");
    let p = Proc::spawn("nginx", cmd, Some(cpu), Some(&root.join("logs/stdout")))
        .map_err(|e| format!("nginx: {e}"))?;
    let addr: SocketAddr = format!("127.0.0.1:{port}")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let t0 = Instant::now();
    loop {
        if let Ok((200, _)) = get_once(addr, "/body.json", "") {
            return Ok((p, port));
        }
        if t0.elapsed() > Duration::from_secs(10) {
            return Err("nginx did not answer".into());
        }
        // nginx has no readiness signal of its own; its port answering is
        // the only one, so this third-party baseline is polled.
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn get_figure(py: &Path, wrk_bin: &Path, placement: Placement) -> Result<(), String> {
    let dir = TempDir::new("http-get");
    let api = start_api(dir.path(), py, placement.server_cpu(), 16, 0)?;
    let path = format!("/sessions/{}", api.sid);
    let (status, body) = get_once(api.addr, &path, &api.token)?;
    if status != 200 {
        return Err(format!("GET {path} answered {status}"));
    }
    let bare = Bare::start(body.clone(), util_threads(), placement.server_cpu())?;
    let nginx = util::find_tool("nginx")
        .map(|n| start_nginx(&n, dir.path(), &body, placement.server_cpu()))
        .transpose()?;
    let secs = if util::quick() { 1 } else { 3 };
    let rounds = util::rounds(3, 1);
    let (mut ours, mut base, mut ng) = (Vec::new(), Vec::new(), Vec::new());
    let client = placement.client_cpu();
    for _ in 0..rounds {
        ours.push(wrk(
            wrk_bin,
            &format!("http://{}{path}", api.addr),
            Some(&api.token),
            client,
            secs,
        )?);
        base.push(wrk(
            wrk_bin,
            &format!("http://{}/x", bare.addr),
            None,
            client,
            secs,
        )?);
        if let Some((_, port)) = &nginx {
            ng.push(wrk(
                wrk_bin,
                &format!("http://127.0.0.1:{port}/body.json"),
                None,
                client,
                secs,
            )?);
        }
    }
    let (value, baseline) = (util::median(&ours), util::median(&base));
    let ratio = value / baseline;
    let mut extra = vec![
        ("body_bytes", Value::from(body.len())),
        ("clients", Value::from(CLIENTS)),
        ("value_spread", util::round3(util::spread(&ours))),
        ("baseline_spread", util::round3(util::spread(&base))),
    ];
    if ng.is_empty() {
        extra.push((
            "nginx",
            "skipped: nginx not found; apt-get install nginx-light".into(),
        ));
    } else {
        let n = util::median(&ng);
        extra.push(("nginx_rps", util::round3(n)));
        extra.push(("ratio_to_nginx", util::round3(value / n)));
    }
    Figure {
        name: GET,
        placement: Some(placement.name()),
        value,
        baseline: Some(baseline),
        baseline_of: "a bare tiny_http 0.12 handler returning the same body, as many threads as http.threads",
        ratio: Some(ratio),
        better: "higher",
        goal: serde_json::json!(">= 0.8"),
        unit: "requests/s",
        pass: ratio >= 0.8,
        rounds,
        extra,
    }
    .emit();
    bare.stop();
    if let Some((p, _)) = nginx {
        p.stop(Duration::from_secs(2));
    }
    let mut api = api;
    let _ = api
        .ctl
        .call("sessions.kill", serde_json::json!({"session_id": api.sid}));
    api.proc.stop(Duration::from_secs(5));
    Ok(())
}

/// `http.threads`' default: the tiny_http baseline gets as many threads.
fn util_threads() -> usize {
    4
}

/// What one watcher saw.
#[derive(Default)]
struct Seen {
    delays_us: Vec<f64>,
    chunks: usize,
    bytes: usize,
    batches: usize,
    error: Option<String>,
}

/// Opens a watch and reads its first (reset) batch.
fn open_watch(addr: SocketAddr, path: &str, token: &str) -> Result<BufReader<TcpStream>, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    if !line.starts_with("HTTP/1.1 200") {
        return Err(format!("watch answered {line:?}"));
    }
    loop {
        line.clear();
        r.read_line(&mut line).map_err(|e| e.to_string())?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    // The first frame: the reset batch.
    loop {
        line.clear();
        let n = r.read_line(&mut line).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the watch closed before its reset".into());
        }
        if line == "\n" {
            return Ok(r);
        }
    }
}

fn watcher(mut r: BufReader<TcpStream>, stop: Arc<AtomicBool>) -> Seen {
    let mut seen = Seen::default();
    let mut max_seq = 0u64;
    let mut line = Vec::with_capacity(1 << 16);
    let _ = r
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(100)));
    while !stop.load(Ordering::Relaxed) {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) => {
                seen.error = Some("the watch closed".into());
                break;
            }
            Ok(_) => {
                let now = util::now_ns();
                seen.bytes += line.len();
                if line.starts_with(b"data: ") {
                    seen.batches += 1;
                    crate::fanout::stamps(&line, &mut max_seq, |_, ns| {
                        seen.chunks += 1;
                        seen.delays_us
                            .push((now.saturating_sub(ns)) as f64 / 1000.0);
                    });
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                seen.error = Some(e.to_string());
                break;
            }
        }
    }
    seen
}

fn threads_of(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

/// VmRSS after the daemon settles: the least of a few samples taken apart
/// (a measurement over time, not a wait for an event).
fn settled_rss(pid: i32) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(100));
        best = best.min(util::vm_rss_kib(pid).unwrap_or(f64::MAX));
    }
    best
}

/// The agent's rate in the paced window, chunks a second: 500,000 chunk
/// deliveries a second to the 100 watchers, well below what the watchers'
/// one core reads (they fell behind at 3 to 6 million).
const PACED_RATE: u32 = 5_000;

/// A daemon with one session of the fast agent streaming at `rate` (0: as
/// fast as it can), warmed by one turn.
fn sse_api(dir: &Path, py: &Path, placement: Placement, rate: u32) -> Result<Api, String> {
    let mut api = start_api(dir, py, placement.server_cpu(), 256, rate)?;
    let path = format!("/sessions/{}", api.sid);
    // Warm the paths a watch uses (a JSON read, one watch and its topic).
    let _ = get_once(api.addr, &path, &api.token)?;
    drop(open_watch(api.addr, &path, &api.token)?);
    // One turn first, so that allocator arenas are warm in both samples.
    api.ctl.call(
        "events.subscribe",
        serde_json::json!({"streams": [api.sid]}),
    )?;
    let _ = api.ctl.call(
        "sessions.input",
        serde_json::json!({"session_id": api.sid, "text": "warm"}),
    )?;
    api.ctl.wait_event("turn.end")?;
    Ok(api)
}

/// `WATCHERS` watches of the session, each read by a thread on `cpu` until
/// `stop`.
fn open_watchers(
    api: &Api,
    cpu: usize,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<std::thread::JoinHandle<Seen>>, String> {
    let path = format!("/sessions/{}", api.sid);
    let mut handles = Vec::new();
    for _ in 0..WATCHERS {
        let r = open_watch(api.addr, &path, &api.token)?;
        let stop = stop.clone();
        handles.push(util::on_cpu(cpu, || {
            std::thread::spawn(move || watcher(r, stop))
        }));
    }
    Ok(handles)
}

/// Keeps prompts queued for `window`, then interrupts the turn, stops the
/// watchers and returns what each saw, with the daemon's peak VmRSS
/// (KiB, at least `peak`) and its VmRSS after the turn.
fn busy_window(
    api: &mut Api,
    window: Duration,
    stop: &Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<Seen>>,
    mut peak: f64,
) -> Result<(Vec<Seen>, f64, f64), String> {
    let pid = api.proc.pid();
    let t0 = Instant::now();
    while t0.elapsed() < window {
        let q = api.ctl.call(
            "sessions.input",
            serde_json::json!({"session_id": api.sid, "text": "go"}),
        )?;
        peak = peak.max(util::vm_rss_kib(pid).unwrap_or(0.0));
        // Two queued are enough to keep the agent busy; wait for the queue
        // to drain below that (one prompt every 20 ms outran slow turns on
        // a loaded machine until the 33rd was refused with queue-full).
        if q["queue_length"].as_u64().unwrap_or(0) >= 2 {
            while t0.elapsed() < window {
                std::thread::sleep(Duration::from_millis(20));
                peak = peak.max(util::vm_rss_kib(pid).unwrap_or(0.0));
                let s = api
                    .ctl
                    .call("sessions.get", serde_json::json!({"session_id": api.sid}))?;
                if s["queued"]
                    .as_u64()
                    .or_else(|| s["queue_length"].as_u64())
                    .unwrap_or(0)
                    < 2
                {
                    break;
                }
            }
        }
    }
    let _ = api.ctl.call(
        "sessions.interrupt",
        serde_json::json!({"session_id": api.sid}),
    );
    std::thread::sleep(Duration::from_millis(300));
    let rss_busy = util::vm_rss_kib(pid).unwrap_or(0.0);
    stop.store(true, Ordering::Relaxed);
    let mut seen = Vec::new();
    for h in handles {
        seen.push(h.join().map_err(|_| "watcher panicked")?);
    }
    Ok((seen, peak, rss_busy))
}

/// Every watcher's delays, in microseconds.
fn delays_of(seen: &[Seen]) -> Vec<f64> {
    seen.iter()
        .flat_map(|s| s.delays_us.iter().copied())
        .collect()
}

/// The paced window: (median ms, p99 ms, chunks a watcher read a second
/// (median), watch errors).
fn paced_delay(
    py: &Path,
    placement: Placement,
    window: Duration,
) -> Result<(f64, f64, f64, usize), String> {
    let dir = TempDir::new("http-sse-paced");
    let mut api = sse_api(dir.path(), py, placement, PACED_RATE)?;
    let stop = Arc::new(AtomicBool::new(false));
    let handles = open_watchers(&api, placement.client_cpu(), &stop)?;
    let (seen, _, _) = busy_window(&mut api, window, &stop, handles, 0.0)?;
    let delays = delays_of(&seen);
    let per_s: Vec<f64> = seen
        .iter()
        .map(|s| s.chunks as f64 / window.as_secs_f64())
        .collect();
    let errors = seen.iter().filter(|s| s.error.is_some()).count();
    let _ = api
        .ctl
        .call("sessions.kill", serde_json::json!({"session_id": api.sid}));
    api.proc.stop(Duration::from_secs(5));
    if delays.is_empty() {
        return Err("no chunk reached a watcher in the paced window".into());
    }
    Ok((
        util::quantile(&delays, 0.5) / 1000.0,
        util::quantile(&delays, 0.99) / 1000.0,
        util::median(&per_s),
        errors,
    ))
}

fn sse_figure(py: &Path, placement: Placement) -> Result<(), String> {
    let dir = TempDir::new("http-sse");
    let mut api = sse_api(dir.path(), py, placement, 0)?;
    let pid = api.proc.pid();
    let rss0 = settled_rss(pid);
    let threads0 = threads_of(pid).unwrap_or(0);
    let stop = Arc::new(AtomicBool::new(false));
    let handles = open_watchers(&api, placement.client_cpu(), &stop)?;
    let rss100 = settled_rss(pid);
    let threads100 = threads_of(pid).unwrap_or(0);
    // Busy: prompts kept queued for the window.
    let window = Duration::from_secs(if util::quick() { 2 } else { 5 });
    let (seen, peak, rss_busy) = busy_window(&mut api, window, &stop, handles, rss100)?;
    let _ = api
        .ctl
        .call("sessions.kill", serde_json::json!({"session_id": api.sid}));
    api.proc.stop(Duration::from_secs(5));
    let (paced_median, paced_p99, paced_per_s, paced_errors) = paced_delay(py, placement, window)?;
    let errors: Vec<String> = seen.iter().filter_map(|s| s.error.clone()).collect();
    let delays = delays_of(&seen);
    let chunks: Vec<f64> = seen.iter().map(|s| s.chunks as f64).collect();
    let bytes: usize = seen.iter().map(|s| s.bytes).sum();
    let total_chunks: usize = seen.iter().map(|s| s.chunks).sum();
    let batches: usize = seen.iter().map(|s| s.batches).sum();
    let median_ms = util::quantile(&delays, 0.5) / 1000.0;
    let p99_ms = util::quantile(&delays, 0.99) / 1000.0;
    Figure {
        name: SSE_DELAY,
        placement: Some(placement.name()),
        value: median_ms,
        baseline: None,
        baseline_of: "",
        ratio: None,
        better: "lower",
        goal: "report".into(),
        unit: "ms",
        pass: errors.is_empty() && total_chunks > 0 && paced_errors == 0,
        rounds: 1,
        extra: vec![
            ("p99_ms", util::round3(p99_ms)),
            ("watchers", Value::from(WATCHERS)),
            (
                "chunks_per_watcher_median",
                util::round3(util::median(&chunks)),
            ),
            (
                "chunks_per_watcher_min",
                util::round3(chunks.iter().copied().fold(f64::MAX, f64::min)),
            ),
            (
                "bytes_per_chunk",
                util::round3(bytes as f64 / total_chunks.max(1) as f64),
            ),
            (
                "chunks_per_batch",
                util::round3(total_chunks as f64 / batches.max(1) as f64),
            ),
            ("paced_rate", Value::from(PACED_RATE)),
            ("paced_median_ms", util::round3(paced_median)),
            ("paced_p99_ms", util::round3(paced_p99)),
            ("paced_chunks_per_watcher_per_s", util::round3(paced_per_s)),
            ("paced_watch_errors", Value::from(paced_errors)),
            ("window_s", Value::from(window.as_secs())),
            ("watch_errors", Value::from(errors.len())),
            (
                "delay_from",
                "the chunk's stamp, written by the agent before the ledger commit".into(),
            ),
        ],
    }
    .emit();
    let mib = |k: f64| k / 1024.0;
    Figure {
        name: SSE_RSS,
        placement: Some(placement.name()),
        value: mib(rss100 - rss0),
        baseline: None,
        baseline_of: "",
        ratio: None,
        better: "lower",
        goal: "report".into(),
        unit: "MiB",
        pass: true,
        rounds: 1,
        extra: vec![
            ("rss_0_mib", util::round3(mib(rss0))),
            ("rss_100_mib", util::round3(mib(rss100))),
            (
                "per_watcher_kib",
                util::round3((rss100 - rss0) / WATCHERS as f64),
            ),
            ("busy_over_0_mib", util::round3(mib(rss_busy - rss0))),
            ("peak_busy_over_0_mib", util::round3(mib(peak - rss0))),
            ("threads_0", Value::from(threads0)),
            ("threads_100", Value::from(threads100)),
        ],
    }
    .emit();
    Ok(())
}
