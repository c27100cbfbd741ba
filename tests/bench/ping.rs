//! Figure 3, the `ping` round trip on an open socket connection, against the
//! same line echoed by `socat UNIX-LISTEN:...,fork EXEC:cat` on a unix
//! socket. The servers run on core 0; the client on core 0 (pinned) or
//! core 1 (spread).

use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::{self, DaemonDirs, Figure, LineClient, PING, Proc, TempDir};

pub const FIGURE: &str = "ping_rtt_vs_socat";

pub fn run() {
    if !util::selected(FIGURE) {
        return;
    }
    let Some(socat) = util::find_tool("socat") else {
        util::skipped(FIGURE, None, "socat not found; apt-get install socat");
        return;
    };
    if let Err(e) = measure(&socat) {
        util::skipped(FIGURE, None, &format!("error: {e}"));
    }
}

fn measure(socat: &std::path::Path) -> Result<(), String> {
    let tmp = TempDir::new("ping");
    let dirs = DaemonDirs::under(tmp.path());
    let mut daemon = Proc::spawn(
        "omniconfluxd",
        util::serve_command(&util::daemon_bin(), &dirs),
        Some(0),
        Some(&dirs.log),
    )
    .map_err(|e| format!("unable to start the daemon: {e}"))?;
    util::wait_daemon_ready(&mut daemon, &dirs.socket, Duration::from_secs(10))
        .map_err(|e| format!("{e}; log: {}", util::log_tail(&dirs.log)))?;

    let echo_path = tmp.path().join("echo.sock");
    let mut cmd = Command::new(socat);
    cmd.arg(format!("UNIX-LISTEN:{},fork", echo_path.display()))
        .arg("EXEC:cat");
    let mut echo = Proc::spawn("socat", cmd, Some(0), None)
        .map_err(|e| format!("unable to start socat: {e}"))?;
    let end = Instant::now() + Duration::from_secs(10);
    let mut echo_client = loop {
        if let Ok(mut c) = LineClient::connect(&echo_path) {
            if c.exchange(PING).map(|l| l == PING).unwrap_or(false) {
                break c;
            }
        }
        if echo.exited() || Instant::now() >= end {
            return Err("socat did not echo on its socket".into());
        }
        std::thread::sleep(util::PROBE_INTERVAL);
    };
    let mut daemon_client = LineClient::connect(&dirs.socket).map_err(|e| e.to_string())?;

    let rounds = util::rounds(11, 3);
    let per_round = if util::quick() { 500 } else { 2000 };
    for placement in util::placements() {
        let (mut d, mut b) = (Vec::new(), Vec::new());
        util::on_cpu(placement.client_cpu(), || -> Result<(), String> {
            // Warm up both paths on this core.
            median_rtt_us(&mut daemon_client, 300)?;
            median_rtt_us(&mut echo_client, 300)?;
            for _ in 0..rounds {
                d.push(median_rtt_us(&mut daemon_client, per_round)?);
                b.push(median_rtt_us(&mut echo_client, per_round)?);
            }
            Ok(())
        })?;
        let (v, base) = (util::median(&d), util::median(&b));
        let ratio = v / base;
        Figure {
            name: FIGURE,
            placement: Some(placement.name()),
            value: v,
            baseline: Some(base),
            baseline_of: "socat UNIX-LISTEN:path,fork EXEC:cat echoing the same line",
            ratio: Some(ratio),
            better: "lower",
            goal: json!("ratio <= 2"),
            unit: "us (median round trip)",
            pass: ratio <= 2.0,
            rounds,
            extra: vec![
                ("exchanges_per_round", json!(per_round)),
                ("value_spread", util::round3(util::spread(&d))),
                ("baseline_spread", util::round3(util::spread(&b))),
            ],
        }
        .emit();
    }
    drop(daemon_client);
    drop(echo_client);
    echo.stop(Duration::from_secs(2));
    daemon.stop(Duration::from_secs(10));
    Ok(())
}

/// The median of `n` ping exchanges, in microseconds.
fn median_rtt_us(c: &mut LineClient, n: usize) -> Result<f64, String> {
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        c.exchange(PING).map_err(|e| e.to_string())?;
        t.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok(util::median(&t))
}
