//! Issue 3, fan-out: a fast ACP agent (fast_acp_agent.py beside this file)
//! streams agent_message_chunk lines as fast as it can; the daemon turns
//! them into transcript rows and sends them to 4 socket subscribers, each
//! subscribed with `events.subscribe` (its session's stream) and
//! `transcript.subscribe` (the session). A chunk is delivered when a
//! subscriber reads a line carrying it (message chunks are not ledger
//! events: they reach a socket client only in `transcript.delta`, see the
//! report). Against NATS core: one publisher, 4 subscribers of one subject,
//! messages as large as the agent's lines, in the same run, rounds
//! alternating.
//!
//! Placement: the daemon (and so its agent) and nats-server with its
//! publisher on core 0; the subscribers on core 1 ("spread"), or all on
//! core 0 with one core.
//!
//! Figures:
//! - `fanout_deliveries_vs_nats`: chunk deliveries a second summed over the
//!   4 subscribers, ratio to NATS >= 0.5.
//! - `fanout_delay`: agent line written to subscriber line read, median and
//!   p99 (wall clock stamps in the chunk text); NATS's in the same rounds.
//! - `fanout_stalled_subscriber`: a fifth subscriber that never reads; the
//!   others' rate with it over their rate without (>= 0.8), and whether it
//!   was disconnected at `socket.max_queued_bytes` with the daemon's peak
//!   VmRSS bounded.

use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::util::{self, Figure, Proc, Rpc, TempDir};

pub const RATE: &str = "fanout_deliveries_vs_nats";
pub const DELAY: &str = "fanout_delay";
pub const STALLED: &str = "fanout_stalled_subscriber";

const SUBSCRIBERS: usize = 4;
const CHUNKS_PER_TURN: usize = 256;
const PAD: usize = 64;
/// Prompts kept waiting behind the running turn. It was 2, polled every
/// 5 ms: a turn of 256 chunks takes about 1 ms when the daemon keeps up, so
/// the queue ran dry within each sleep and the figure measured this
/// feeder (about 50,000 chunks/s, 3 turns per 5 ms sleep plus the calls)
/// rather than the daemon, with core 0 idle a third of the time. 16 turns
/// outlast a sleep with room to spare and stay under the daemon's bound of
/// 32 (`limits::AGENT_PROMPT_QUEUE`).
const QUEUE_DEPTH: u64 = 16;
const POLL_MS: u64 = 5;
/// The queue bound of the stalled figure's daemon (the smallest allowed is
/// 64 KiB; the default is 8 MiB).
const MAX_QUEUED: usize = 1024 * 1024;

pub fn run() {
    let want_rate = util::selected(RATE) || util::selected(DELAY);
    let want_stalled = util::selected(STALLED);
    if !want_rate && !want_stalled {
        return;
    }
    let Some(py) = util::python3() else {
        for f in [RATE, DELAY, STALLED] {
            util::skipped(f, None, "python3 not found");
        }
        return;
    };
    let placement = *util::placements().last().expect("core 0 is allowed");
    if want_rate {
        let Some(nats) = util::find_tool("nats-server") else {
            util::skipped(
                RATE,
                None,
                "nats-server not found; apt-get install nats-server",
            );
            util::skipped(
                DELAY,
                None,
                "nats-server not found; apt-get install nats-server",
            );
            return;
        };
        if let Err(e) = rate_and_delay(&py, &nats, placement) {
            util::skipped(RATE, Some(placement.name()), &format!("error: {e}"));
        }
    }
    if want_stalled {
        if let Err(e) = stalled(&py, placement) {
            util::skipped(STALLED, Some(placement.name()), &format!("error: {e}"));
        }
    }
}

/// The daemon's config: the fast agent's seat and, when given, a queue
/// bound for socket connections. Only the stalled figure sets one
/// ([`MAX_QUEUED`], so that the stalled reader is cut off within a round);
/// the rate figure runs on the default, as a user's daemon does. It once ran
/// on the stalled figure's 1 MiB too: a subscriber that fell 40 ms behind
/// the stream was disconnected as a slow reader, and the chunks it missed
/// were counted as not delivered, so the figure swung from round to round
/// with the moments core 1 was taken from the subscribers.
fn config(py: &Path, max_queued: Option<usize>) -> String {
    let socket = max_queued.map_or(String::new(), |b| {
        format!("[socket]\nmax_queued_bytes = {b}\n\n")
    });
    format!(
        "{socket}[[seat]]\nharness = \"fast\"\ncommand = \"{}\"\nargs = [\"{}\"]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\nenv = {{ FAST_CHUNKS = \"{CHUNKS_PER_TURN}\", FAST_PAD = \"{PAD}\", FAST_BATCH = \"16\" }}\n",
        py.display(),
        util::bench_file("fast_acp_agent.py").display()
    )
}

/// What one subscriber saw in a round.
#[derive(Default)]
struct Seen {
    /// Chunks delivered before the window closed.
    chunks: usize,
    /// Delay of each, microseconds.
    delays_us: Vec<f64>,
    lines: usize,
    bytes: usize,
    /// `event` notes (ledger events of the stream).
    events: usize,
    closed: bool,
}

/// Finds the `[seq@ns]` stamps in `line` newer than `*max_seq`.
pub fn stamps(line: &[u8], max_seq: &mut u64, mut f: impl FnMut(u64, u128)) {
    let mut i = 0;
    while let Some(p) = line[i..].iter().position(|&b| b == b'[') {
        let s = i + p + 1;
        i = s;
        let mut j = s;
        let mut seq: u64 = 0;
        while j < line.len() && line[j].is_ascii_digit() {
            seq = seq * 10 + (line[j] - b'0') as u64;
            j += 1;
        }
        if j == s || j >= line.len() || line[j] != b'@' {
            continue;
        }
        j += 1;
        let k = j;
        let mut ns: u128 = 0;
        while j < line.len() && line[j].is_ascii_digit() {
            ns = ns * 10 + (line[j] - b'0') as u128;
            j += 1;
        }
        if j == k || j >= line.len() || line[j] != b']' {
            continue;
        }
        i = j;
        if seq > *max_seq {
            *max_seq = seq;
            f(seq, ns);
        }
    }
}

/// Reads a daemon subscriber's lines until `stop`, counting the chunks read
/// before `until` (set when the window closes).
fn daemon_subscriber(
    mut r: BufReader<UnixStream>,
    stop: Arc<AtomicBool>,
    end_ns: Arc<std::sync::atomic::AtomicU64>,
) -> Seen {
    let mut seen = Seen::default();
    let mut max_seq = 0u64;
    let mut line = Vec::with_capacity(1 << 16);
    let _ = r
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(100)));
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) => {
                seen.closed = true;
                break;
            }
            Ok(_) => {}
            Err(_) if !line.is_empty() => {
                // A timeout mid-line: keep what was read and go on.
                let mut rest = Vec::new();
                loop {
                    match r.read_until(b'\n', &mut rest) {
                        Ok(_) => break,
                        Err(_) if stop.load(Ordering::Relaxed) => break,
                        Err(_) => continue,
                    }
                }
                line.extend_from_slice(&rest);
            }
            Err(_) => {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                continue;
            }
        }
        let now = util::now_ns();
        let end = end_ns.load(Ordering::Relaxed) as u128;
        if end != 0 && now > end * 1000 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            continue;
        }
        seen.lines += 1;
        seen.bytes += line.len();
        if line.starts_with(b"{\"jsonrpc\":\"2.0\",\"method\":\"event\"")
            || line
                .windows(17)
                .take(64)
                .any(|w| w == b"\"method\":\"event\"")
        {
            seen.events += 1;
        }
        stamps(&line, &mut max_seq, |_, ns| {
            seen.chunks += 1;
            seen.delays_us.push(now.saturating_sub(ns) as f64 / 1000.0);
        });
    }
    seen
}

struct RoundResult {
    rate: f64,
    delays_us: Vec<f64>,
    per_sub: Vec<usize>,
    events: usize,
    bytes: usize,
    lines: usize,
    peak_rss_kib: f64,
    stalled_closed: Option<bool>,
    stalled_bytes: usize,
    /// Feeder polls that found no prompt waiting (daemon rounds only).
    drained_polls: usize,
    /// Subscribers the daemon disconnected during the round (daemon rounds
    /// only): a closed subscriber stops counting, so any makes the round's
    /// rate a figure of the queue bound rather than of the fan-out.
    closed_subscribers: usize,
}

/// One round on the daemon: a new session, SUBSCRIBERS readers (and a
/// stalled one), prompts kept queued for `window`.
fn daemon_round(
    daemon_pid: i32,
    socket: &Path,
    client_cpu: usize,
    window: Duration,
    with_stalled: bool,
) -> Result<RoundResult, String> {
    let mut ctl = Rpc::connect(socket)?;
    let cwd = socket
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("/"))
        .canonicalize()
        .map_err(|e| e.to_string())?;
    let r = ctl.call(
        "sessions.spawn",
        json!({"harness": "fast", "cwd": cwd.display().to_string()}),
    )?;
    let sid = r["session_id"].as_str().ok_or("no session id")?.to_string();
    let subscribe = |c: &mut Rpc| -> Result<(), String> {
        c.call("events.subscribe", json!({"streams": [sid]}))?;
        c.call(
            "transcript.subscribe",
            json!({"sub_id": "b", "session_id": sid, "have_entries": 0}),
        )?;
        Ok(())
    };
    let stop = Arc::new(AtomicBool::new(false));
    let end_us = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut handles = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let mut c = Rpc::connect(socket)?;
        subscribe(&mut c)?;
        let (reader, _w) = c.into_parts();
        let (stop, end_us) = (stop.clone(), end_us.clone());
        handles.push(util::on_cpu(client_cpu, || {
            std::thread::spawn(move || {
                let _keep = _w;
                daemon_subscriber(reader, stop, end_us)
            })
        }));
    }
    let mut stalled = None;
    if with_stalled {
        let mut c = Rpc::connect(socket)?;
        subscribe(&mut c)?;
        stalled = Some(c);
    }
    // Keep prompts queued for the window: QUEUE_DEPTH waiting, topped up
    // after each POLL_MS sleep. A poll that finds none waiting means the
    // agent may have idled for want of a prompt (`drained_polls`).
    let t0 = Instant::now();
    let mut peak = 0f64;
    let mut drained_polls = 0;
    while t0.elapsed() < window {
        let q = ctl.call("sessions.input", json!({"session_id": sid, "text": "go"}))?;
        peak = peak.max(util::vm_rss_kib(daemon_pid).unwrap_or(0.0));
        if q["queue_length"].as_u64().unwrap_or(0) >= QUEUE_DEPTH {
            while t0.elapsed() < window {
                std::thread::sleep(Duration::from_millis(POLL_MS));
                peak = peak.max(util::vm_rss_kib(daemon_pid).unwrap_or(0.0));
                let s = ctl.call("sessions.get", json!({"session_id": sid}))?;
                let waiting = s["queued"]
                    .as_u64()
                    .or_else(|| s["queue_length"].as_u64())
                    .unwrap_or(0);
                if waiting == 0 {
                    drained_polls += 1;
                }
                if waiting < QUEUE_DEPTH {
                    break;
                }
            }
        }
    }
    let elapsed = t0.elapsed();
    end_us.store((util::now_ns() / 1000) as u64, Ordering::Relaxed);
    let _ = ctl.call("sessions.kill", json!({"session_id": sid}));
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let mut res = RoundResult {
        rate: 0.0,
        delays_us: Vec::new(),
        per_sub: Vec::new(),
        events: 0,
        bytes: 0,
        lines: 0,
        peak_rss_kib: peak,
        stalled_closed: None,
        stalled_bytes: 0,
        drained_polls,
        closed_subscribers: 0,
    };
    for h in handles {
        let s = h.join().map_err(|_| "subscriber panicked")?;
        res.per_sub.push(s.chunks);
        res.closed_subscribers += usize::from(s.closed);
        res.delays_us.extend(s.delays_us);
        res.events += s.events;
        res.bytes += s.bytes;
        res.lines += s.lines;
    }
    if let Some(c) = stalled {
        // Read what the daemon had queued: EOF after it means it closed the
        // connection.
        let (mut r, _w) = c.into_parts();
        let _ = r
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = vec![0u8; 1 << 16];
        let mut closed = false;
        loop {
            match r.read(&mut buf) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => res.stalled_bytes += n,
                Err(_) => break,
            }
        }
        res.stalled_closed = Some(closed);
    }
    res.rate = res.per_sub.iter().sum::<usize>() as f64 / elapsed.as_secs_f64();
    Ok(res)
}

// ---- NATS ----

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(14222)
}

fn nats_connect(port: u16) -> Result<TcpStream, String> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            s.set_nodelay(true).ok();
            s.write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\n")
                .map_err(|e| e.to_string())?;
            return Ok(s);
        }
        if Instant::now() > end {
            return Err("nats-server did not listen".into());
        }
        std::thread::sleep(util::PROBE_INTERVAL);
    }
}

/// Sends PING and waits for PONG (everything before it is processed).
fn nats_sync(r: &mut BufReader<TcpStream>) -> Result<(), String> {
    r.get_mut()
        .write_all(b"PING\r\n")
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err("nats closed".into());
        }
        if line.starts_with("PONG") {
            return Ok(());
        }
        if line.starts_with("-ERR") {
            return Err(line.trim().to_string());
        }
    }
}

fn nats_subscriber(
    mut r: BufReader<TcpStream>,
    stop: Arc<AtomicBool>,
    end_us: Arc<std::sync::atomic::AtomicU64>,
) -> Seen {
    let mut seen = Seen::default();
    let mut max_seq = 0;
    let _ = r
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(100)));
    let mut head = Vec::new();
    let mut payload = Vec::new();
    loop {
        head.clear();
        match r.read_until(b'\n', &mut head) {
            Ok(0) => break,
            Ok(_) => {}
            Err(_) => {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                continue;
            }
        }
        if head.starts_with(b"PING") {
            let _ = r.get_mut().write_all(b"PONG\r\n");
            continue;
        }
        if !head.starts_with(b"MSG ") {
            continue;
        }
        let len: usize = std::str::from_utf8(&head)
            .ok()
            .and_then(|h| h.split_whitespace().last()?.parse().ok())
            .unwrap_or(0);
        payload.resize(len + 2, 0);
        let mut got = 0;
        while got < payload.len() {
            match r.read(&mut payload[got..]) {
                Ok(0) => return seen,
                Ok(n) => got += n,
                Err(_) => continue,
            }
        }
        let now = util::now_ns();
        let end = end_us.load(Ordering::Relaxed) as u128;
        if end != 0 && now > end * 1000 {
            continue;
        }
        seen.lines += 1;
        seen.bytes += head.len() + payload.len();
        stamps(&payload, &mut max_seq, |_, ns| {
            seen.chunks += 1;
            seen.delays_us.push(now.saturating_sub(ns) as f64 / 1000.0);
        });
    }
    seen
}

/// One NATS round: SUBSCRIBERS subscribers on the client core, one
/// publisher on core 0 sending `size`-byte messages in writes of 16, as the
/// agent writes its lines.
fn nats_round(
    port: u16,
    client_cpu: usize,
    size: usize,
    window: Duration,
) -> Result<RoundResult, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let end_us = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut handles = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let s = nats_connect(port)?;
        let mut r = BufReader::with_capacity(1 << 20, s);
        r.get_mut()
            .write_all(b"SUB bench 1\r\n")
            .map_err(|e| e.to_string())?;
        nats_sync(&mut r)?;
        let (stop, end_us) = (stop.clone(), end_us.clone());
        handles.push(util::on_cpu(client_cpu, || {
            std::thread::spawn(move || nats_subscriber(r, stop, end_us))
        }));
    }
    let published = util::on_cpu(0, || -> Result<usize, String> {
        let s = nats_connect(port)?;
        let mut w =
            std::io::BufWriter::with_capacity(1 << 16, s.try_clone().map_err(|e| e.to_string())?);
        let mut seq = 0u64;
        let t0 = Instant::now();
        let mut buf = Vec::with_capacity(size + 64);
        while t0.elapsed() < window {
            for _ in 0..16 {
                seq += 1;
                buf.clear();
                write!(buf, "[{seq}@{}]", util::now_ns()).ok();
                buf.resize(size.max(buf.len()), b'x');
                write!(w, "PUB bench {}\r\n", buf.len()).map_err(|e| e.to_string())?;
                w.write_all(&buf).map_err(|e| e.to_string())?;
                w.write_all(b"\r\n").map_err(|e| e.to_string())?;
            }
            w.flush().map_err(|e| e.to_string())?;
        }
        Ok(seq as usize)
    })?;
    end_us.store((util::now_ns() / 1000) as u64, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let mut res = RoundResult {
        rate: 0.0,
        delays_us: Vec::new(),
        per_sub: Vec::new(),
        events: published,
        bytes: 0,
        lines: 0,
        peak_rss_kib: 0.0,
        stalled_closed: None,
        stalled_bytes: 0,
        drained_polls: 0,
        closed_subscribers: 0,
    };
    for h in handles {
        let s = h.join().map_err(|_| "nats subscriber panicked")?;
        res.per_sub.push(s.chunks);
        res.delays_us.extend(s.delays_us);
        res.bytes += s.bytes;
    }
    res.rate = res.per_sub.iter().sum::<usize>() as f64 / window.as_secs_f64();
    Ok(res)
}

/// The size of one agent line of the fast agent (for the NATS messages).
fn agent_line_size() -> usize {
    let seq_ns = format!("[{}@{}]", 100_000, util::now_ns());
    format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{{\"sessionId\":\"fast0000abcd\",\"update\":{{\"sessionUpdate\":\"agent_message_chunk\",\"content\":{{\"type\":\"text\",\"text\":\"{seq_ns}{}\"}}}}}}}}",
        "x".repeat(PAD)
    )
    .len()
}

fn rate_and_delay(py: &Path, nats: &Path, placement: util::Placement) -> Result<(), String> {
    let tmp = TempDir::new("fan");
    let (daemon, dirs) = util::start_daemon(tmp.path(), &config(py, None), Some(0))?;
    let port = free_port();
    let mut cmd = Command::new(nats);
    cmd.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
    let _nats = Proc::spawn("nats-server", cmd, Some(0), None)
        .map_err(|e| format!("unable to start nats-server: {e}"))?;
    let size = agent_line_size();
    let rounds = util::rounds(5, 2);
    let window = if util::quick() {
        Duration::from_millis(1500)
    } else {
        Duration::from_secs(3)
    };
    let client = placement.client_cpu();
    let (mut d, mut n) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        eprintln!("bench: {RATE} round {}/{rounds}", i + 1);
        d.push(daemon_round(
            daemon.pid(),
            &dirs.socket,
            client,
            window,
            false,
        )?);
        n.push(nats_round(port, client, size, window)?);
    }
    let dr: Vec<f64> = d.iter().map(|r| r.rate).collect();
    let nr: Vec<f64> = n.iter().map(|r| r.rate).collect();
    let (v, b) = (util::median(&dr), util::median(&nr));
    let ratio = v / b;
    let bytes_per_delivery = d.iter().map(|r| r.bytes).sum::<usize>() as f64
        / d.iter()
            .map(|r| r.per_sub.iter().sum::<usize>())
            .sum::<usize>()
            .max(1) as f64;
    let lines_per_sub_s = d
        .iter()
        .map(|r| r.lines as f64 / SUBSCRIBERS as f64 / window.as_secs_f64())
        .collect::<Vec<_>>();
    Figure {
        name: RATE,
        placement: Some(placement.name()),
        value: v,
        baseline: Some(b),
        baseline_of: "nats-server core: 1 publisher, 4 subscribers of one subject, messages as large as the agent's lines",
        ratio: Some(ratio),
        better: "higher",
        goal: json!("ratio >= 0.5"),
        unit: "chunk deliveries/s (sum over 4 subscribers)",
        pass: ratio >= 0.5,
        rounds,
        extra: vec![
            ("message_bytes", json!(size)),
            ("chunks_per_turn", json!(CHUNKS_PER_TURN)),
            ("agent_chunks_per_s", util::round3(v / SUBSCRIBERS as f64)),
            ("delivered_lines_per_subscriber_per_s", util::round3(util::median(&lines_per_sub_s))),
            ("wire_bytes_per_chunk_delivery", util::round3(bytes_per_delivery)),
            ("event_notes_per_subscriber", json!(d.iter().map(|r| r.events / SUBSCRIBERS).collect::<Vec<_>>())),
            ("delivery_path", json!("transcript.delta (message chunks are not ledger events; events.subscribe carries only turn.start/turn.end)")),
            ("drained_polls", json!(d.iter().map(|r| r.drained_polls).collect::<Vec<_>>())),
            ("closed_subscribers", json!(d.iter().map(|r| r.closed_subscribers).collect::<Vec<_>>())),
            ("value_spread", util::round3(util::spread(&dr))),
            ("baseline_spread", util::round3(util::spread(&nr))),
        ],
    }
    .emit();
    if util::selected(DELAY) {
        let dd: Vec<f64> = d.iter().flat_map(|r| r.delays_us.iter().copied()).collect();
        let nd: Vec<f64> = n.iter().flat_map(|r| r.delays_us.iter().copied()).collect();
        let (med, p99) = (
            util::median(&dd) / 1000.0,
            util::quantile(&dd, 0.99) / 1000.0,
        );
        let (nmed, np99) = (
            util::median(&nd) / 1000.0,
            util::quantile(&nd, 0.99) / 1000.0,
        );
        Figure {
            name: DELAY,
            placement: Some(placement.name()),
            value: med,
            baseline: Some(nmed),
            baseline_of: "nats-server, same rounds, publisher to subscriber (both saturated)",
            ratio: Some(med / nmed),
            better: "lower",
            goal: json!("report: median and p99"),
            unit: "ms (median, agent line to subscriber line, saturated)",
            pass: true,
            rounds,
            extra: vec![
                ("p99_ms", util::round3(p99)),
                ("baseline_p99_ms", util::round3(np99)),
                ("samples", json!(dd.len())),
            ],
        }
        .emit();
    }
    daemon.stop(Duration::from_secs(10));
    Ok(())
}

fn stalled(py: &Path, placement: util::Placement) -> Result<(), String> {
    let tmp = TempDir::new("stall");
    let (daemon, dirs) = util::start_daemon(tmp.path(), &config(py, Some(MAX_QUEUED)), Some(0))?;
    let rounds = util::rounds(5, 2);
    let window = if util::quick() {
        Duration::from_millis(1500)
    } else {
        Duration::from_secs(3)
    };
    let client = placement.client_cpu();
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        eprintln!("bench: {STALLED} round {}/{rounds}", i + 1);
        without.push(daemon_round(
            daemon.pid(),
            &dirs.socket,
            client,
            window,
            false,
        )?);
        with.push(daemon_round(
            daemon.pid(),
            &dirs.socket,
            client,
            window,
            true,
        )?);
    }
    let wo: Vec<f64> = without.iter().map(|r| r.rate).collect();
    let wi: Vec<f64> = with.iter().map(|r| r.rate).collect();
    let (v, b) = (util::median(&wi), util::median(&wo));
    let ratio = v / b;
    let closed: Vec<bool> = with
        .iter()
        .map(|r| r.stalled_closed.unwrap_or(false))
        .collect();
    let peak_with = util::median(&with.iter().map(|r| r.peak_rss_kib).collect::<Vec<_>>());
    let peak_without = util::median(&without.iter().map(|r| r.peak_rss_kib).collect::<Vec<_>>());
    let all_closed = closed.iter().all(|c| *c);
    // The queue bound is the memory bound: the stalled connection must be
    // closed, having been sent at most the bound plus the socket's buffer.
    let bounded = with
        .iter()
        .all(|r| r.stalled_bytes <= MAX_QUEUED + 4 * 1024 * 1024);
    Figure {
        name: STALLED,
        placement: Some(placement.name()),
        value: v,
        baseline: Some(b),
        baseline_of: "the same 4 subscribers without the stalled one",
        ratio: Some(ratio),
        better: "higher",
        goal: json!("ratio >= 0.8 and the stalled subscriber disconnected at socket.max_queued_bytes"),
        unit: "chunk deliveries/s (sum over the 4 reading subscribers)",
        pass: ratio >= 0.8 && all_closed && bounded,
        rounds,
        extra: vec![
            ("max_queued_bytes", json!(MAX_QUEUED)),
            ("stalled_disconnected", json!(closed)),
            ("stalled_bytes_received", json!(with.iter().map(|r| r.stalled_bytes).collect::<Vec<_>>())),
            ("daemon_peak_rss_kib_with", util::round3(peak_with)),
            ("daemon_peak_rss_kib_without", util::round3(peak_without)),
            ("rss_note", json!("peaks are the median of rounds run alternately; the allocator keeps what a burst took")),
            ("value_spread", util::round3(util::spread(&wi))),
            ("baseline_spread", util::round3(util::spread(&wo))),
        ],
    }
    .emit();
    daemon.stop(Duration::from_secs(10));
    Ok(())
}
