//! Figure 2, start to ready: from spawning `serve` to the first `ping`
//! answered on its socket, against nats-server started side by side (ready
//! when its port answers `PING` with `PONG`), and on a ledger of a million
//! events against the empty ledger.

use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use omniconfluxd::ledger::{Batch, Committed, Ledger, Op};

use crate::util::{self, DaemonDirs, Figure, Placement, Proc, TempDir};

pub const VS_NATS: &str = "start_ready_vs_nats";
pub const MILLION: &str = "start_ready_1m_vs_empty";

const MILLION_EVENTS: usize = 1_000_000;
const PREP_BATCH: usize = 8192;
const READY_TIMEOUT: Duration = Duration::from_secs(30);

pub fn run() {
    let want_nats = util::selected(VS_NATS);
    let want_million = util::selected(MILLION);
    if !want_nats && !want_million {
        return;
    }
    let nats = if want_nats {
        match util::find_tool("nats-server") {
            Some(p) => Some(p),
            None => {
                util::skipped(
                    VS_NATS,
                    None,
                    "nats-server not found; apt-get install nats-server",
                );
                None
            }
        }
    } else {
        None
    };
    let million = if want_million {
        match million_ledger() {
            Ok(p) => Some(p),
            Err(e) => {
                util::skipped(MILLION, None, &format!("error preparing the ledger: {e}"));
                None
            }
        }
    } else {
        None
    };
    // The empty ledger exists before the rounds, as the million does, so
    // that both starts open a ledger rather than one of them creating it.
    let empty = TempDir::new("empty");
    let empty_dirs = DaemonDirs::under(empty.path());
    if let Err(e) = time_daemon(&empty_dirs, Placement::Pinned) {
        util::skipped(VS_NATS, None, &format!("error: {e}"));
        util::skipped(MILLION, None, &format!("error: {e}"));
        return;
    }
    let rounds = util::rounds(15, 3);
    for placement in util::placements() {
        let (mut d_empty, mut d_nats, mut d_million) = (Vec::new(), Vec::new(), Vec::new());
        // Spawn to first accepted connection: separates opening the ledger
        // and binding from the reactor's first answer.
        let (mut l_empty, mut l_million) = (Vec::new(), Vec::new());
        let mut failed = None;
        for _ in 0..rounds {
            let r = (|| -> Result<(), String> {
                let s = time_daemon(&empty_dirs, placement)?;
                d_empty.push(s.ready_ms);
                l_empty.push(s.listening_ms);
                if let Some(n) = &nats {
                    d_nats.push(time_nats(n, placement)?);
                }
                if let Some(state) = &million {
                    let tmp = TempDir::new("m");
                    let mut dirs = DaemonDirs::under(tmp.path());
                    dirs.state = state.clone();
                    let s = time_daemon(&dirs, placement)?;
                    d_million.push(s.ready_ms);
                    l_million.push(s.listening_ms);
                }
                Ok(())
            })();
            if let Err(e) = r {
                failed = Some(e);
                break;
            }
        }
        if let Some(e) = failed {
            util::skipped(VS_NATS, Some(placement.name()), &format!("error: {e}"));
            util::skipped(MILLION, Some(placement.name()), &format!("error: {e}"));
            continue;
        }
        let empty_ms = util::median(&d_empty);
        if nats.is_some() {
            let nats_ms = util::median(&d_nats);
            let ratio = empty_ms / nats_ms;
            Figure {
                name: VS_NATS,
                placement: Some(placement.name()),
                value: empty_ms,
                baseline: Some(nats_ms),
                baseline_of: "nats-server -a 127.0.0.1 -p PORT, ready at PONG",
                ratio: Some(ratio),
                better: "lower",
                goal: json!("ratio <= 1"),
                unit: "ms",
                pass: ratio <= 1.0,
                rounds,
                extra: vec![
                    ("value_spread", util::round3(util::spread(&d_empty))),
                    ("baseline_spread", util::round3(util::spread(&d_nats))),
                    ("listening_ms", util::round3(util::median(&l_empty))),
                ],
            }
            .emit();
        }
        if million.is_some() {
            let m_ms = util::median(&d_million);
            let ratio = m_ms / empty_ms;
            Figure {
                name: MILLION,
                placement: Some(placement.name()),
                value: m_ms,
                baseline: Some(empty_ms),
                baseline_of: "the same daemon on an empty ledger",
                ratio: Some(ratio),
                better: "lower",
                goal: json!("ratio <= 2"),
                unit: "ms",
                pass: ratio <= 2.0,
                rounds,
                extra: vec![
                    ("value_spread", util::round3(util::spread(&d_million))),
                    ("listening_ms", util::round3(util::median(&l_million))),
                    (
                        "baseline_listening_ms",
                        util::round3(util::median(&l_empty)),
                    ),
                    ("events", json!(MILLION_EVENTS)),
                ],
            }
            .emit();
        }
    }
}

/// One start: milliseconds from spawn to the first accepted connection and
/// to the answer of the ping sent on it.
struct Start {
    ready_ms: f64,
    listening_ms: f64,
}

/// Spawns the daemon on `dirs`, times its start, then stops it cleanly (so
/// that its socket file is gone).
fn time_daemon(dirs: &DaemonDirs, placement: Placement) -> Result<Start, String> {
    let cmd = util::serve_command(&util::daemon_bin(), dirs);
    util::on_cpu(placement.client_cpu(), || {
        let t0 = Instant::now();
        let mut p = Proc::spawn(
            "omniconfluxd",
            cmd,
            Some(placement.server_cpu()),
            Some(&dirs.log),
        )
        .map_err(|e| format!("unable to start the daemon: {e}"))?;
        let ready = util::wait_daemon_ready(&mut p, &dirs.socket, READY_TIMEOUT)
            .map_err(|e| format!("{e}; log: {}", util::log_tail(&dirs.log)))?;
        let ms = |t: Instant| (t - t0).as_secs_f64() * 1e3;
        p.stop(Duration::from_secs(30));
        Ok(Start {
            ready_ms: ms(ready.answered),
            listening_ms: ms(ready.connected),
        })
    })
}

fn time_nats(program: &Path, placement: Placement) -> Result<f64, String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let mut cmd = Command::new(program);
    cmd.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
    util::on_cpu(placement.client_cpu(), || {
        let t0 = Instant::now();
        let mut p = Proc::spawn("nats-server", cmd, Some(placement.server_cpu()), None)
            .map_err(|e| format!("unable to start nats-server: {e}"))?;
        let end = t0 + READY_TIMEOUT;
        loop {
            if nats_pong(port) {
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                p.stop(Duration::from_secs(10));
                return Ok(ms);
            }
            if p.exited() {
                return Err("nats-server exited before it was ready".into());
            }
            if Instant::now() >= end {
                return Err(format!("nats-server not ready after {READY_TIMEOUT:?}"));
            }
            std::thread::sleep(util::PROBE_INTERVAL);
        }
    })
}

/// Whether nats-server on `port` answers `PING` with `PONG` (it greets
/// every connection with an INFO line first).
fn nats_pong(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.set_nodelay(true);
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let Ok(r) = s.try_clone() else { return false };
    let mut reader = BufReader::new(r);
    let mut line = String::new();
    for _ in 0..4 {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) if line.starts_with("PONG") => return true,
            Ok(_) => {}
        }
    }
    false
}

/// The state directory of a ledger holding a million events, made once
/// with the library's writer in batches of 8192 and kept under
/// `<target>/bench-cache/` for later runs (`cargo clean` removes it).
fn million_ledger() -> Result<PathBuf, String> {
    let state = util::target_dir().join("bench-cache/ledger-1m/state");
    let marker = state.join("complete");
    let want = format!(
        "{MILLION_EVENTS} events, schema {}\n",
        omniconfluxd::ledger::current_version()
    );
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(want.as_str()) {
        return Ok(state);
    }
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state).map_err(|e| e.to_string())?;
    eprintln!(
        "bench: preparing a ledger of {MILLION_EVENTS} events in {} (once)",
        state.display()
    );
    let t0 = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<Committed>>();
    let ledger = Ledger::open(
        &state.join("ledger.sqlite3"),
        Box::new(move |c| {
            let _ = tx.send(c);
        }),
    )
    .map_err(|e| e.0)?;
    let batches = MILLION_EVENTS.div_ceil(PREP_BATCH);
    let (mut submitted, mut done, mut events) = (0usize, 0usize, 0usize);
    let mut n = 0usize;
    while done < batches {
        // The writer's queue holds far more than this few batches.
        while submitted < batches && submitted - done < 16 {
            let ops = (0..PREP_BATCH.min(MILLION_EVENTS - n))
                .map(|_| {
                    n += 1;
                    bench_event(n)
                })
                .collect();
            ledger
                .submit(Batch {
                    ticket: submitted as u64,
                    ops,
                })
                .map_err(|e| format!("{e:?}"))?;
            submitted += 1;
        }
        for c in rx.recv().map_err(|e| e.to_string())? {
            done += 1;
            events += c.result.map_err(|e| format!("{e:?}"))?.len();
        }
    }
    ledger.close();
    if events != MILLION_EVENTS {
        return Err(format!(
            "committed {events} events, wanted {MILLION_EVENTS}"
        ));
    }
    std::fs::write(&marker, want).map_err(|e| e.to_string())?;
    eprintln!("bench: prepared in {:.1} s", t0.elapsed().as_secs_f64());
    Ok(state)
}

/// The n-th event of the prepared ledger: a hundred streams, a small
/// document of the size a turn event carries.
fn bench_event(n: usize) -> Op {
    Op::Event {
        stream: format!("x-bench-{:03}", n % 100),
        kind: "turn.end".into(),
        ts: "2026-01-01T00:00:00.000Z".into(),
        data: format!(
            "{{\"n\":{n},\"text\":\"a benchmark event of about the size of a small turn summary\"}}"
        ),
    }
}
