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
//!
//! Issue 15's terminal figures (src/tmux/terminal.rs, the live terminal of
//! seed 004), each against a baseline measured in the same run, rounds
//! interleaved:
//!
//! - `tmux_terminal_echo_us`: one keystroke's round trip, `terminal.input`
//!   of one character to the `terminal.output` that echoes it, on a pane
//!   running `cat` (the tty echoes), against the same keystroke written to
//!   a bare pseudo-terminal running `cat` and read back from it. Median,
//!   with the p99s and their ratio.
//! - `tmux_terminal_cat_100mib_ms`: `cat` of a 100 MiB text file in a
//!   persistent terminal's shell until the client, reading as fast as it
//!   can, sees the marker echoed after it, against the same `cat` in a pane
//!   whose output goes to `tmux pipe-pane` into /dev/null, with no client.
//! - `tmux_terminal_kib_per_terminal`: the daemon's VmRSS growth per open
//!   terminal, 8 opened at once; the goal is at most 256 KiB (issue 15).

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
    discovery();
    terminals();
}

fn discovery() {
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

pub const ECHO: &str = "tmux_terminal_echo_us";
pub const CAT: &str = "tmux_terminal_cat_100mib_ms";
pub const MEM: &str = "tmux_terminal_kib_per_terminal";

/// Terminals opened at once for the memory figure.
const MEM_TERMINALS: usize = 8;

fn terminals() {
    let figures = [ECHO, CAT, MEM];
    if !figures.iter().any(|f| util::selected(f)) {
        return;
    }
    let missing = if util::find_tool("tmux").is_none() {
        Some("tmux is not installed")
    } else if util::find_tool("bash").is_none() {
        Some("bash is not installed")
    } else {
        None
    };
    if let Some(why) = missing {
        for f in figures {
            util::skipped(f, None, why);
        }
        return;
    }
    match measure_terminals() {
        Ok(m) => emit_terminals(m),
        Err(e) => {
            for f in figures {
                util::skipped(f, None, &format!("error: {e}"));
            }
        }
    }
}

struct Terminals {
    echo_us: Vec<f64>,
    bare_us: Vec<f64>,
    cat_ms: Vec<f64>,
    pipe_ms: Vec<f64>,
    kib_per_terminal: f64,
}

/// Reads the connection until a `terminal.output` of `term_id` holds
/// `needle` (across chunk ends); keeps only a short tail of what it read.
fn output_until(rpc: &mut util::Rpc, term_id: &str, needle: &[u8]) -> Result<(), String> {
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let v = match rpc.notes.pop_front() {
            Some(v) => v,
            None => rpc.read()?,
        };
        if v["method"] == "terminal.exited" {
            return Err(format!("terminal {term_id} exited: {v}"));
        }
        if v["method"] != "terminal.output" || v["params"]["term_id"] != term_id {
            continue;
        }
        let data = v["params"]["data"].as_str().unwrap_or("");
        let bytes = omniconfluxd::tmux::terminal::b64_decode(data).ok_or("bad base64")?;
        tail.extend_from_slice(&bytes);
        if tail.windows(needle.len()).any(|w| w == needle) {
            return Ok(());
        }
        let keep = tail.len().saturating_sub(needle.len());
        tail.drain(..keep);
    }
}

fn input(rpc: &mut util::Rpc, term_id: &str, data: &[u8]) -> Result<(), String> {
    rpc.send(
        "terminal.input",
        json!({"term_id": term_id, "data": omniconfluxd::tmux::terminal::b64_encode(data)}),
    )
    .map(drop)
}

/// A bare pseudo-terminal running `cat`: the master, and the child.
struct BarePty {
    master: std::fs::File,
    child: std::process::Child,
}

impl Drop for BarePty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bare_pty() -> Result<BarePty, String> {
    use std::os::fd::FromRawFd;
    use std::os::unix::process::CommandExt;
    let (mut m, mut sl) = (0, 0);
    let ws = libc::winsize {
        ws_row: 24,
        ws_col: 80,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two descriptors into valid pointers; a null
    // name and termios are allowed.
    let r = unsafe { libc::openpty(&mut m, &mut sl, std::ptr::null_mut(), std::ptr::null(), &ws) };
    if r != 0 {
        return Err(format!("openpty: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: openpty returned two open descriptors that nothing else owns.
    let (master, slave) = unsafe {
        (
            std::fs::File::from_raw_fd(m),
            std::fs::File::from_raw_fd(sl),
        )
    };
    let mut cmd = Command::new("cat");
    cmd.stdin(slave.try_clone().map_err(|e| e.to_string())?)
        .stdout(slave.try_clone().map_err(|e| e.to_string())?)
        .stderr(slave);
    // SAFETY: between fork and exec only setsid and ioctl run, both
    // async-signal-safe; fd 0 is the slave.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| format!("cat on a pty: {e}"))?;
    Ok(BarePty { master, child })
}

fn bare_echo(p: &mut BarePty, ch: u8) -> Result<(), String> {
    use std::io::{Read, Write};
    p.master.write_all(&[ch]).map_err(|e| e.to_string())?;
    let mut buf = [0u8; 4096];
    loop {
        let n = p.master.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the bare pty closed".into());
        }
        if buf[..n].contains(&ch) {
            return Ok(());
        }
    }
}

fn measure_terminals() -> Result<Terminals, String> {
    let tmp = TempDir::new("tmux-term");
    let tmpdir = tmp.path().join("x");
    std::fs::create_dir_all(&tmpdir).map_err(|e| e.to_string())?;
    // The echo program: cat, under the name discovery knows.
    let agent = tmp.path().join("claude");
    std::fs::write(&agent, "#!/bin/bash\nexec -a claude cat\n").map_err(|e| e.to_string())?;
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    // 100 MiB of 64-byte lines.
    let big = tmp.path().join("big.txt");
    {
        use std::io::Write;
        let line = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-+\n";
        let mut f =
            std::io::BufWriter::new(std::fs::File::create(&big).map_err(|e| e.to_string())?);
        for _ in 0..(100 * 1024 * 1024 / line.len()) {
            f.write_all(line).map_err(|e| e.to_string())?;
        }
        f.flush().map_err(|e| e.to_string())?;
    }
    let big = big.display().to_string();
    let _server = Server(&tmpdir);
    tmux(
        &tmpdir,
        &[
            "new-session",
            "-d",
            "-s",
            "bench",
            "-x",
            "80",
            "-y",
            "24",
            "--",
            &agent.display().to_string(),
        ],
    )?;
    tmux(&tmpdir, &["set", "-g", "status", "off"])?;
    let dirs = DaemonDirs::under(tmp.path());
    let mut cmd = util::serve_command(&util::daemon_bin(), &dirs);
    cmd.env("TMUX_TMPDIR", &tmpdir).env("HOME", tmp.path());
    let mut p = Proc::spawn("omniconfluxd", cmd, None, Some(&dirs.log))
        .map_err(|e| format!("unable to start the daemon: {e}"))?;
    util::wait_daemon_ready(&mut p, &dirs.socket, Duration::from_secs(20))
        .map_err(|e| format!("{e}; log: {}", util::log_tail(&dirs.log)))?;
    // The daemon's own server is started by it and outlives it.
    struct Own<'a>(&'a Path);
    impl Drop for Own<'_> {
        fn drop(&mut self) {
            let _ = Command::new("tmux")
                .args(["-L", "omniconflux", "kill-server"])
                .env("TMUX_TMPDIR", self.0)
                .env_remove("TMUX")
                .output();
        }
    }
    let _own = Own(&tmpdir);
    let mut rpc = util::Rpc::connect(&dirs.socket)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !rpc
        .call("sessions.refresh", json!({}))?
        .as_array()
        .is_some_and(|l| l.iter().any(|s| s["id"] == "default:%0"))
    {
        if Instant::now() > deadline {
            return Err("the echo pane was never discovered".into());
        }
    }
    rpc.call(
        "terminal.open",
        json!({"term_id": "echo", "session_id": "default:%0", "cols": 80, "rows": 24}),
    )?;
    // The first output is the full redraw.
    output_until(&mut rpc, "echo", b"\x1b")?;
    // Whatever tmux sends after its redraw comes before this echo.
    input(&mut rpc, "echo", b"WARM")?;
    output_until(&mut rpc, "echo", b"WARM")?;
    let mut bare = bare_pty()?;
    let rounds = util::rounds(200, 40);
    let (mut echo_us, mut bare_us) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let ch = b'a' + (i % 26) as u8;
        let t0 = Instant::now();
        input(&mut rpc, "echo", &[ch])?;
        output_until(&mut rpc, "echo", &[ch])?;
        echo_us.push(t0.elapsed().as_secs_f64() * 1e6);
        let t0 = Instant::now();
        bare_echo(&mut bare, ch)?;
        bare_us.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    drop(bare);
    // Throughput: a persistent terminal's shell, and a pane piped to
    // /dev/null.
    let t = rpc.call("terminal.create", json!({}))?;
    let tid = t["id"].as_str().ok_or("no terminal id")?.to_string();
    rpc.call(
        "terminal.open",
        json!({"term_id": "cat", "terminal_id": tid, "cols": 80, "rows": 24}),
    )?;
    input(&mut rpc, "cat", b"stty -echo; echo READY$((6*7))\r")?;
    output_until(&mut rpc, "cat", b"READY42")?;
    let (mut cat_ms, mut pipe_ms) = (Vec::new(), Vec::new());
    for r in 0..util::rounds(3, 1) {
        let marker = format!("END{}", 1000 + r);
        let t0 = Instant::now();
        input(
            &mut rpc,
            "cat",
            format!("cat {big}; echo END$((1000+{r}))\r").as_bytes(),
        )?;
        output_until(&mut rpc, "cat", marker.as_bytes())?;
        cat_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        let chan = format!("done{r}");
        let script = format!("tmux wait-for go{r}; cat {big}; tmux wait-for -S {chan}");
        let pane = tmux(
            &tmpdir,
            &[
                "new-window",
                "-d",
                "-P",
                "-F",
                "#{pane_id}",
                "-t",
                "bench:",
                "--",
                "sh",
                "-c",
                &script,
            ],
        )?;
        let pane = pane.trim().to_string();
        tmux(
            &tmpdir,
            &["pipe-pane", "-o", "-t", &pane, "cat > /dev/null"],
        )?;
        let t0 = Instant::now();
        tmux(&tmpdir, &["wait-for", "-S", &format!("go{r}")])?;
        tmux(&tmpdir, &["wait-for", &chan])?;
        pipe_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    // Memory: the daemon's growth for MEM_TERMINALS more open terminals.
    let mut ids = Vec::new();
    for _ in 0..MEM_TERMINALS {
        let t = rpc.call("terminal.create", json!({}))?;
        ids.push(t["id"].as_str().ok_or("no terminal id")?.to_string());
    }
    let before = util::vm_rss_kib(p.pid()).ok_or("no VmRSS")?;
    for (n, id) in ids.iter().enumerate() {
        let term = format!("m{n}");
        rpc.call(
            "terminal.open",
            json!({"term_id": term, "terminal_id": id, "cols": 80, "rows": 24}),
        )?;
        output_until(&mut rpc, &term, b"\x1b")?;
    }
    let after = util::vm_rss_kib(p.pid()).ok_or("no VmRSS")?;
    drop(rpc);
    p.stop(Duration::from_secs(5));
    Ok(Terminals {
        echo_us,
        bare_us,
        cat_ms,
        pipe_ms,
        kib_per_terminal: (after - before) / MEM_TERMINALS as f64,
    })
}

fn emit_terminals(m: Terminals) {
    if util::selected(ECHO) {
        let (v, b) = (util::median(&m.echo_us), util::median(&m.bare_us));
        let (v99, b99) = (
            util::quantile(&m.echo_us, 0.99),
            util::quantile(&m.bare_us, 0.99),
        );
        Figure {
            name: ECHO,
            placement: None,
            value: v,
            baseline: Some(b),
            baseline_of: "the same keystroke on a bare pty running cat",
            ratio: Some(v / b),
            better: "lower",
            goal: json!("no goal given (issue 15: median and p99 ratio)"),
            unit: "us",
            pass: true,
            rounds: m.echo_us.len(),
            extra: vec![
                ("p99", util::round3(v99)),
                ("baseline_p99", util::round3(b99)),
                ("p99_ratio", util::round3(v99 / b99)),
                ("value_spread", util::round3(util::spread(&m.echo_us))),
                ("baseline_spread", util::round3(util::spread(&m.bare_us))),
            ],
        }
        .emit();
    }
    if util::selected(CAT) {
        let (v, b) = (util::median(&m.cat_ms), util::median(&m.pipe_ms));
        Figure {
            name: CAT,
            placement: None,
            value: v,
            baseline: Some(b),
            baseline_of: "the same cat in a pane with tmux pipe-pane to /dev/null",
            ratio: Some(v / b),
            better: "lower",
            goal: json!("no goal given (issue 15: against tmux pipe-pane)"),
            unit: "ms",
            pass: true,
            rounds: m.cat_ms.len(),
            extra: vec![
                ("mib_per_s", util::round3(100.0 / (v / 1000.0))),
                ("baseline_mib_per_s", util::round3(100.0 / (b / 1000.0))),
            ],
        }
        .emit();
    }
    if util::selected(MEM) {
        Figure {
            name: MEM,
            placement: None,
            value: m.kib_per_terminal,
            baseline: None,
            baseline_of: "",
            ratio: Some(m.kib_per_terminal / 256.0),
            better: "lower",
            goal: json!(256),
            unit: "KiB of daemon VmRSS per open terminal",
            pass: m.kib_per_terminal <= 256.0,
            rounds: 1,
            extra: vec![("terminals", json!(MEM_TERMINALS))],
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
