//! Issue 3, sessions at scale: the daemon's resident memory per idle
//! session (its agent not counted: VmRSS of the daemon process alone), with
//! 0 and with 200 idle sessions of the fast agent (fast_acp_agent.py beside
//! this file, waiting on stdin), and 200 sessions at once on one daemon:
//! whether every one came up idle, and how long spawning them took.
//!
//! The daemon (and so its agents) runs on core 0; the client is not pinned.
//!
//! Figures:
//! - `session_idle_rss`: (VmRSS with 200 - VmRSS with 0) / 200, KiB; goal
//!   <= 64 KiB.
//! - `sessions_200_spawn`: first `sessions.spawn` sent to the 200th
//!   answered (each answered once its session.start is committed), ms, and
//!   to every session idle; pass when all 200 are idle.

use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::util::{self, Figure, Rpc, TempDir};

pub const RSS: &str = "session_idle_rss";
pub const SPAWN: &str = "sessions_200_spawn";

const SESSIONS: usize = 200;
/// Spawns in flight on the one connection (the socket allows 64).
const WINDOW: usize = 32;

pub fn run() {
    if !util::selected(RSS) && !util::selected(SPAWN) {
        return;
    }
    let Some(py) = util::python3() else {
        util::skipped(RSS, None, "python3 not found");
        return;
    };
    let rounds = util::rounds(2, 1);
    let (mut per, mut spawn_ms, mut idle_ms, mut ok, mut base, mut full) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for i in 0..rounds {
        eprintln!("bench: {RSS} round {}/{rounds}", i + 1);
        match round(&py) {
            Ok(r) => {
                per.push((r.rss_full - r.rss_empty) / SESSIONS as f64);
                base.push(r.rss_empty);
                full.push(r.rss_full);
                spawn_ms.push(r.spawn_ms);
                idle_ms.push(r.idle_ms);
                ok.push(r.idle);
            }
            Err(e) => {
                util::skipped(RSS, None, &format!("error: {e}"));
                util::skipped(SPAWN, None, &format!("error: {e}"));
                return;
            }
        }
    }
    let v = util::median(&per);
    if util::selected(RSS) {
        Figure {
            name: RSS,
            placement: None,
            value: v,
            baseline: None,
            baseline_of: "",
            ratio: Some(v / 64.0),
            better: "lower",
            goal: json!("<= 64 KiB"),
            unit: "KiB of daemon VmRSS per idle session",
            pass: v <= 64.0,
            rounds,
            extra: vec![
                (
                    "daemon_rss_kib_0_sessions",
                    util::round3(util::median(&base)),
                ),
                (
                    "daemon_rss_kib_200_sessions",
                    util::round3(util::median(&full)),
                ),
                ("sessions", json!(SESSIONS)),
            ],
        }
        .emit();
    }
    if util::selected(SPAWN) {
        let all = ok.iter().all(|n| *n == SESSIONS);
        Figure {
            name: SPAWN,
            placement: None,
            value: util::median(&spawn_ms),
            baseline: None,
            baseline_of: "",
            ratio: None,
            better: "lower",
            goal: json!("all 200 sessions idle on one daemon"),
            unit: "ms, first sessions.spawn sent to the 200th answered",
            pass: all,
            rounds,
            extra: vec![
                ("sessions_idle", json!(ok)),
                ("ms_to_all_idle", util::round3(util::median(&idle_ms))),
                ("spawns_in_flight", json!(WINDOW)),
            ],
        }
        .emit();
    }
}

struct Round {
    rss_empty: f64,
    rss_full: f64,
    spawn_ms: f64,
    idle_ms: f64,
    idle: usize,
}

/// VmRSS after the daemon has been quiet for a moment (the median of a
/// few samples).
fn settled_rss(pid: i32) -> f64 {
    std::thread::sleep(Duration::from_millis(500));
    let xs: Vec<f64> = (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            util::vm_rss_kib(pid).unwrap_or(f64::NAN)
        })
        .collect();
    util::median(&xs)
}

fn round(py: &Path) -> Result<Round, String> {
    let tmp = TempDir::new("sess");
    let config = format!(
        "[[seat]]\nharness = \"fast\"\ncommand = \"{}\"\nargs = [\"{}\"]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\n",
        py.display(),
        util::bench_file("fast_acp_agent.py").display()
    );
    let (daemon, dirs) = util::start_daemon(tmp.path(), &config, Some(0))?;
    let cwd = tmp
        .path()
        .canonicalize()
        .map_err(|e| e.to_string())?
        .display()
        .to_string();
    let mut c = Rpc::connect(&dirs.socket)?;
    // Touch the paths a spawn uses once, so that the empty figure is not
    // missing what any first session pays (seat probe, reader thread).
    c.call("seats.list", json!({}))?;
    c.call("sessions.list", json!({}))?;
    let rss_empty = settled_rss(daemon.pid());

    let t0 = Instant::now();
    let (mut sent, mut answered) = (0usize, 0usize);
    let mut waiting = std::collections::VecDeque::new();
    while answered < SESSIONS {
        while sent < SESSIONS && waiting.len() < WINDOW {
            waiting.push_back(c.send("sessions.spawn", json!({"harness": "fast", "cwd": cwd}))?);
            sent += 1;
        }
        let id = waiting.pop_front().ok_or("nothing in flight")?;
        c.wait(id)
            .map_err(|e| format!("sessions.spawn {answered}: {e}"))?;
        answered += 1;
    }
    let spawn_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let end = Instant::now() + Duration::from_secs(60);
    let idle = loop {
        let list = c.call("sessions.list", json!({}))?;
        let n = list
            .as_array()
            .map(|a| a.iter().filter(|s| s["state"] == "idle").count())
            .unwrap_or(0);
        if n == SESSIONS || Instant::now() > end {
            break n;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let idle_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let rss_full = settled_rss(daemon.pid());
    drop(c);
    daemon.stop(Duration::from_secs(20));
    Ok(Round {
        rss_empty,
        rss_full,
        spawn_ms,
        idle_ms,
        idle,
    })
}
