//! Figure 1, the idle daemon: resident memory on an empty ledger, and the
//! CPU time and wake-ups of a 3-second window with nobody connected
//! (DESIGN.md: "An idle daemon does nothing").

use serde_json::json;
use std::path::Path;
use std::time::Duration;

use crate::util::{self, DaemonDirs, Figure, Proc, TempDir};

pub const RSS: &str = "idle_rss";
pub const CPU: &str = "idle_cpu_ticks";
pub const WAKEUPS: &str = "idle_wakeups";

const RSS_GOAL_MIB: f64 = 8.0;
const WINDOW: Duration = Duration::from_secs(3);
/// Lets start-up work after ready finish before measuring: the ledger's
/// integrity check runs `LEDGER_CHECK_DELAY_MS` after ready on the reader
/// thread, and the isolation probe and seat probes run once. "While nothing
/// happens" starts after them.
const SETTLE: Duration = Duration::from_millis(omniconfluxd::limits::LEDGER_CHECK_DELAY_MS + 1_000);

pub fn run() {
    if ![RSS, CPU, WAKEUPS].iter().any(|f| util::selected(f)) {
        return;
    }
    let rounds = util::rounds(3, 1);
    let (mut rss, mut ticks, mut wakeups, mut threads) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        match one_round() {
            Ok(r) => {
                rss.push(r.rss_kib as f64 / 1024.0);
                ticks.push(r.ticks as f64);
                wakeups.push(r.switches as f64 / WINDOW.as_secs_f64());
                threads.push(r.threads as f64);
            }
            Err(e) => {
                for f in [RSS, CPU, WAKEUPS] {
                    if util::selected(f) {
                        util::skipped(f, None, &format!("error: {e}"));
                    }
                }
                return;
            }
        }
    }
    if util::selected(RSS) {
        let v = util::median(&rss);
        Figure {
            name: RSS,
            placement: None,
            value: v,
            baseline: None,
            baseline_of: "",
            ratio: Some(v / RSS_GOAL_MIB),
            better: "lower",
            goal: json!("<= 8 MiB (ratio is value / 8 MiB)"),
            unit: "MiB",
            pass: v <= RSS_GOAL_MIB,
            rounds,
            extra: vec![("threads", json!(util::median(&threads)))],
        }
        .emit();
    }
    if util::selected(CPU) {
        let v = util::median(&ticks);
        let max = ticks.iter().copied().fold(0.0, f64::max);
        Figure {
            name: CPU,
            placement: None,
            value: v,
            baseline: None,
            baseline_of: "",
            ratio: None,
            better: "lower",
            goal: json!("0 ticks (utime+stime) in a 3 s idle window"),
            unit: "clock ticks / 3 s",
            pass: v == 0.0,
            rounds,
            extra: vec![("max", json!(max))],
        }
        .emit();
    }
    if util::selected(WAKEUPS) {
        let v = util::median(&wakeups);
        let max = wakeups.iter().copied().fold(0.0, f64::max);
        Figure {
            name: WAKEUPS,
            placement: None,
            value: v,
            baseline: None,
            baseline_of: "",
            ratio: Some(v / 1.0),
            better: "lower",
            goal: json!("<= 1 context switch a second, all threads (ratio is value / 1)"),
            unit: "wake-ups/s",
            pass: v <= 1.0,
            rounds,
            extra: vec![("max", util::round3(max))],
        }
        .emit();
    }
}

struct Round {
    rss_kib: u64,
    ticks: u64,
    switches: u64,
    threads: usize,
}

fn one_round() -> Result<Round, String> {
    let tmp = TempDir::new("idle");
    let dirs = DaemonDirs::under(tmp.path());
    let mut p = Proc::spawn(
        "omniconfluxd",
        util::serve_command(&util::daemon_bin(), &dirs),
        None,
        Some(&dirs.log),
    )
    .map_err(|e| format!("unable to start the daemon: {e}"))?;
    util::wait_daemon_ready(&mut p, &dirs.socket, Duration::from_secs(10))
        .map_err(|e| format!("{e}; log: {}", util::log_tail(&dirs.log)))?;
    std::thread::sleep(SETTLE);
    let pid = p.pid();
    let rss_kib = status_field(&format!("/proc/{pid}/status"), "VmRSS:").ok_or("no VmRSS")?;
    let (t0, s0, n) = (
        cpu_ticks(pid).ok_or("no stat")?,
        switches(pid),
        thread_count(pid),
    );
    std::thread::sleep(WINDOW);
    let (t1, s1) = (cpu_ticks(pid).ok_or("no stat")?, switches(pid));
    p.stop(Duration::from_secs(5));
    Ok(Round {
        rss_kib,
        ticks: t1 - t0,
        switches: s1.saturating_sub(s0),
        threads: n,
    })
}

/// A `Name:   123 kB` field of a status file, as its number.
fn status_field(path: &str, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}

/// utime + stime of the whole process (every thread), in clock ticks.
fn cpu_ticks(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces and parentheses.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime 15.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Voluntary plus involuntary context switches, summed over every thread.
fn switches(pid: i32) -> u64 {
    let dir = format!("/proc/{pid}/task");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let status = e.path().join("status");
            let s = status.to_string_lossy();
            status_field(&s, "voluntary_ctxt_switches:").unwrap_or(0)
                + status_field(&s, "nonvoluntary_ctxt_switches:").unwrap_or(0)
        })
        .sum()
}

fn thread_count(pid: i32) -> usize {
    std::fs::read_dir(Path::new(&format!("/proc/{pid}/task")))
        .map(|d| d.count())
        .unwrap_or(0)
}
