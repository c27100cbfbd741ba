//! Issue 15's discovery figures: a private tmux server with 100 panes,
//! each running a stand-in agent named `claude` (a shell script, so that
//! 100 of them cost little), and the daemon's `sessions.refresh` over it.
//!
//! - `tmux_discovery_100_ms`: the median time of one refresh (one scan of
//!   every pane: the pane list, /proc, a capture per agent pane), against
//!   the baseline of the same tmux work done by hand (one `list-panes -a`
//!   and 100 `capture-pane`s, from this process).
//! - `tmux_discovery_100_cpu_ms`: the daemon's CPU time per refresh.
//! - `tmux_idle_cpu_ticks`: the daemon's CPU in a 3 s window after the
//!   scans, with nobody watching: the goal is none at all.

use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::{self, DaemonDirs, Figure, Proc, TempDir};

pub const TIME: &str = "tmux_discovery_100_ms";
pub const CPU: &str = "tmux_discovery_100_cpu_ms";
pub const IDLE: &str = "tmux_idle_cpu_ticks";

const PANES: usize = 100;

pub fn run() {
    if ![TIME, CPU, IDLE].iter().any(|f| util::selected(f)) {
        return;
    }
    if util::find_tool("tmux").is_none() {
        for f in [TIME, CPU, IDLE] {
            util::skipped(f, None, "tmux is not installed");
        }
        return;
    }
    match measure() {
        Ok(m) => emit(m),
        Err(e) => {
            for f in [TIME, CPU, IDLE] {
                util::skipped(f, None, &format!("error: {e}"));
            }
        }
    }
}

struct Measured {
    rounds: usize,
    refresh_ms: Vec<f64>,
    by_hand_ms: Vec<f64>,
    cpu_ms: Vec<f64>,
    idle_ticks: u64,
}

fn tmux(tmpdir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("tmux")
        .args(["-L", "default"])
        .args(args)
        .env("TMUX_TMPDIR", tmpdir)
        .env_remove("TMUX")
        .output()
        .map_err(|e| format!("tmux: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Kills the bench's tmux server when done.
struct Server<'a>(&'a Path);

impl Drop for Server<'_> {
    fn drop(&mut self) {
        let _ = tmux(self.0, &["kill-server"]);
    }
}

fn measure() -> Result<Measured, String> {
    let tmp = TempDir::new("tmux");
    let tmpdir = tmp.path().join("x");
    std::fs::create_dir_all(&tmpdir).map_err(|e| e.to_string())?;
    let agent = tmp.path().join("claude");
    std::fs::write(
        &agent,
        "#!/bin/sh\nwhile read l; do echo \"got: $l\"; done\n",
    )
    .map_err(|e| e.to_string())?;
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    let agent = agent.display().to_string();
    let _server = Server(&tmpdir);
    tmux(&tmpdir, &["new-session", "-d", "-s", "bench", "--", &agent])?;
    for _ in 1..PANES {
        // One window each: a window holds only as many panes as fit.
        tmux(&tmpdir, &["new-window", "-d", "-t", "bench:", "--", &agent])?;
    }
    let dirs = DaemonDirs::under(tmp.path());
    let mut cmd = util::serve_command(&util::daemon_bin(), &dirs);
    cmd.env("TMUX_TMPDIR", &tmpdir);
    let mut p = Proc::spawn("omniconfluxd", cmd, None, Some(&dirs.log))
        .map_err(|e| format!("unable to start the daemon: {e}"))?;
    util::wait_daemon_ready(&mut p, &dirs.socket, Duration::from_secs(20))
        .map_err(|e| format!("{e}; log: {}", util::log_tail(&dirs.log)))?;
    let mut rpc = util::Rpc::connect(&dirs.socket)?;
    // Until every stand-in has started and is seen.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = rpc.call("sessions.refresh", json!({}))?;
        let n = list.as_array().map_or(0, |l| l.len());
        if n == PANES {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("{n} of {PANES} panes seen"));
        }
    }
    let rounds = util::rounds(10, 3);
    let (mut refresh_ms, mut by_hand_ms, mut cpu_ms) = (Vec::new(), Vec::new(), Vec::new());
    let tick_ms = 1000.0 / ticks_per_second();
    for _ in 0..rounds {
        let c0 = cpu_ticks(p.pid()).ok_or("no stat")?;
        let t0 = Instant::now();
        rpc.call("sessions.refresh", json!({}))?;
        refresh_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        let c1 = cpu_ticks(p.pid()).ok_or("no stat")?;
        cpu_ms.push((c1 - c0) as f64 * tick_ms);
        let t0 = Instant::now();
        let panes = tmux(&tmpdir, &["list-panes", "-a", "-F", "#{pane_id}"])?;
        for pane in panes.lines() {
            tmux(&tmpdir, &["capture-pane", "-p", "-t", pane])?;
        }
        by_hand_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    drop(rpc);
    // Nobody watches: the daemon does nothing, tmux included. The sleep
    // is the window measured, not a synchronisation.
    std::thread::sleep(Duration::from_millis(500));
    let i0 = cpu_ticks(p.pid()).ok_or("no stat")?;
    std::thread::sleep(Duration::from_secs(3));
    let i1 = cpu_ticks(p.pid()).ok_or("no stat")?;
    p.stop(Duration::from_secs(5));
    Ok(Measured {
        rounds,
        refresh_ms,
        by_hand_ms,
        cpu_ms,
        idle_ticks: i1 - i0,
    })
}

fn emit(m: Measured) {
    let (v, b) = (util::median(&m.refresh_ms), util::median(&m.by_hand_ms));
    if util::selected(TIME) {
        Figure {
            name: TIME,
            placement: None,
            value: v,
            baseline: Some(b),
            baseline_of: "list-panes -a and 100 capture-pane by hand",
            ratio: Some(v / b),
            better: "lower",
            goal: json!("no goal given (issue 15: time of a discovery of 100 panes)"),
            unit: "ms",
            pass: true,
            rounds: m.rounds,
            extra: vec![
                ("value_spread", util::round3(util::spread(&m.refresh_ms))),
                ("baseline_spread", util::round3(util::spread(&m.by_hand_ms))),
            ],
        }
        .emit();
    }
    if util::selected(CPU) {
        let c = util::median(&m.cpu_ms);
        Figure {
            name: CPU,
            placement: None,
            value: c,
            baseline: None,
            baseline_of: "",
            ratio: None,
            better: "lower",
            goal: json!("no goal given (issue 15: daemon CPU of a discovery of 100 panes)"),
            unit: "ms of CPU per refresh",
            pass: true,
            rounds: m.rounds,
            extra: vec![],
        }
        .emit();
    }
    if util::selected(IDLE) {
        Figure {
            name: IDLE,
            placement: None,
            value: m.idle_ticks as f64,
            baseline: None,
            baseline_of: "",
            ratio: None,
            better: "lower",
            goal: json!("0 ticks in 3 s with nobody watching (issue 15)"),
            unit: "clock ticks / 3 s",
            pass: m.idle_ticks == 0,
            rounds: 1,
            extra: vec![],
        }
        .emit();
    }
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// utime + stime of the whole process, in clock ticks.
fn cpu_ticks(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}
