//! What every figure of the harness shares: the daemon binary, temporary
//! directories under the target dir, child processes that die with the
//! harness, CPU placement, medians, and the one output line per figure.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The daemon binary under test: the one cargo built for this bench
/// (release profile), or `BENCH_DAEMON` when set, so that one harness
/// measures an older commit's binary against the same baselines.
pub fn daemon_bin() -> PathBuf {
    match std::env::var_os("BENCH_DAEMON") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(env!("CARGO_BIN_EXE_omniconfluxd")),
    }
}

/// The cargo target directory: the built daemon binary sits in
/// `<target>/release/` (whatever `BENCH_DAEMON` names).
pub fn target_dir() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_omniconfluxd"));
    bin.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target"))
}

/// Whether a figure runs under `BENCH_FILTER`: substrings of figure names,
/// separated by commas; a figure runs when its name contains any of them.
pub fn selected(figure: &str) -> bool {
    match std::env::var("BENCH_FILTER") {
        Ok(f) if !f.is_empty() => f
            .split(',')
            .any(|part| !part.is_empty() && figure.contains(part)),
        _ => true,
    }
}

/// `BENCH_QUICK=1`: fewer and shorter rounds.
pub fn quick() -> bool {
    std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Rounds of each figure: few when quick.
pub fn rounds(normal: usize, quick_rounds: usize) -> usize {
    if quick() { quick_rounds } else { normal }
}

/// Prints one `BENCH {json}` line, its members in the order given (so that
/// `figure` leads) rather than serde_json's sorted order.
pub fn emit(fields: Vec<(&str, Value)>) {
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}:{v}", Value::from(*k)))
        .collect();
    println!("BENCH {{{}}}", body.join(","));
    let _ = std::io::stdout().flush();
}

/// The line for a figure that could not run.
pub fn skipped(figure: &str, placement: Option<&str>, reason: &str) {
    let mut m = vec![("figure", Value::from(figure))];
    if let Some(p) = placement {
        m.push(("placement", p.into()));
    }
    m.push(("skipped", reason.into()));
    emit(m);
}

/// A figure compared with a baseline (or a goal) and its verdict.
pub struct Figure<'a> {
    pub name: &'a str,
    pub placement: Option<&'a str>,
    pub value: f64,
    pub baseline: Option<f64>,
    /// What the baseline is, for a reader of the line.
    pub baseline_of: &'a str,
    /// The ratio, already computed the way `better` reads it.
    pub ratio: Option<f64>,
    pub better: &'a str,
    pub goal: Value,
    pub unit: &'a str,
    pub pass: bool,
    pub rounds: usize,
    /// Extra members for this figure.
    pub extra: Vec<(&'a str, Value)>,
}

impl Figure<'_> {
    /// Prints the figure; a value that is not a number (nothing was
    /// measured: an empty sample, a zero span) prints as `skipped` with the
    /// reason, never as `null`.
    pub fn emit(self) {
        if !self.value.is_finite() {
            skipped(
                self.name,
                self.placement,
                &format!("nothing measured: the value came out as {}", self.value),
            );
            return;
        }
        let mut m = vec![
            ("figure", Value::from(self.name)),
            (
                "placement",
                self.placement.map(Value::from).unwrap_or(Value::Null),
            ),
            ("value", round3(self.value)),
            ("baseline", self.baseline.map(round3).unwrap_or(Value::Null)),
            ("ratio", self.ratio.map(round3).unwrap_or(Value::Null)),
            ("better", self.better.into()),
            ("goal", self.goal),
            ("unit", self.unit.into()),
            ("pass", self.pass.into()),
            ("rounds", self.rounds.into()),
        ];
        if !self.baseline_of.is_empty() {
            m.push(("baseline_of", self.baseline_of.into()));
        }
        m.extend(self.extra);
        emit(m);
    }
}

pub fn round3(x: f64) -> Value {
    if !x.is_finite() {
        return Value::Null;
    }
    let r = (x * 1000.0).round() / 1000.0;
    serde_json::Number::from_f64(r)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// (max - min) / median of the rounds: how noisy a figure was.
pub fn spread(xs: &[f64]) -> f64 {
    let m = median(xs);
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m == 0.0 { 0.0 } else { (hi - lo) / m }
}

// ---- CPU placement ----

/// Where the daemon (or the baseline server) and the client run.
#[derive(Clone, Copy, Debug)]
pub enum Placement {
    /// Both on core 0.
    Pinned,
    /// Server on core 0, client on core 1.
    Spread,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::Pinned => "pinned",
            Placement::Spread => "spread",
        }
    }
    pub fn server_cpu(self) -> usize {
        0
    }
    pub fn client_cpu(self) -> usize {
        match self {
            Placement::Pinned => 0,
            Placement::Spread => 1,
        }
    }
}

/// The placements this machine allows: spread needs cores 0 and 1.
pub fn placements() -> Vec<Placement> {
    let allowed = allowed_cpus();
    let mut v = Vec::new();
    if allowed.contains(&0) {
        v.push(Placement::Pinned);
        if allowed.contains(&1) {
            v.push(Placement::Spread);
        }
    }
    v
}

fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
    // writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

fn set_affinity(cpus: &[usize]) -> std::io::Result<()> {
    set_task_affinity(0, cpus)
}

/// Puts thread `tid` (of any process this one may change) on `cpu` alone.
pub fn pin_task(tid: i32, cpu: usize) -> std::io::Result<()> {
    set_task_affinity(tid, &[cpu])
}

fn set_task_affinity(tid: i32, cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, and CPU_SET writes
    // inside it (it panics, rather than writing past it, on a CPU beyond
    // its size); sched_setaffinity reads at most the size given. `tid` only
    // names the target (0: the calling thread), which the kernel checks.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The numbered entries of `dir`: the processes of /proc, the threads of
/// /proc/PID/task; none when it cannot be read (a process gone since).
pub fn numbered(dir: &Path) -> Vec<i32> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `f` with the calling thread on `cpu`, then puts its mask back.
/// Threads `f` starts inherit the CPU.
pub fn on_cpu<T>(cpu: usize, f: impl FnOnce() -> T) -> T {
    let before = allowed_cpus();
    let _ = set_affinity(&[cpu]);
    struct Restore(Vec<usize>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = set_affinity(&self.0);
        }
    }
    let _restore = Restore(before);
    f()
}

// ---- temporary directories ----

/// A directory under `<target>/bench-tmp/`, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        // Short names: unix socket paths must fit in 108 bytes.
        let p = target_dir()
            .join("bench-tmp")
            .join(format!("{}-{n}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create bench temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes the directories that earlier runs killed before their cleanup
/// (SIGKILL, a lost terminal) left under `<target>/bench-tmp/`: those whose
/// pid prefix names no live process.
pub fn sweep_stale_temp_dirs() {
    let Ok(entries) = std::fs::read_dir(target_dir().join("bench-tmp")) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

// ---- child processes ----

/// A child process killed when dropped, on any path out (a panic included),
/// and killed by the kernel if the harness itself dies (PR_SET_PDEATHSIG).
pub struct Proc {
    child: Option<Child>,
    pub name: String,
}

impl Proc {
    /// Starts `cmd` on `cpu` (all of its threads and children inherit it),
    /// with its output to `log` or discarded.
    pub fn spawn(
        name: &str,
        mut cmd: Command,
        cpu: Option<usize>,
        log: Option<&Path>,
    ) -> std::io::Result<Proc> {
        cmd.stdin(Stdio::null());
        match log {
            Some(p) => {
                let f = std::fs::File::create(p)?;
                cmd.stdout(f.try_clone()?);
                cmd.stderr(f);
            }
            None => {
                cmd.stdout(Stdio::null());
                cmd.stderr(Stdio::null());
            }
        }
        // SAFETY: the closure runs between fork and exec and calls only
        // async-signal-safe functions (prctl, sched_setaffinity).
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                if let Some(c) = cpu {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(c, &mut set);
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        Ok(Proc {
            child: Some(child),
            name: name.into(),
        })
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// Whether it already exited.
    pub fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| matches!(c.try_wait(), Ok(Some(_))))
    }

    /// SIGTERM, then SIGKILL after `grace`; waits for the exit.
    pub fn stop(mut self, grace: Duration) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill with the pid of our own unreaped child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let end = Instant::now() + grace;
            while Instant::now() < end {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// valgrind for `figure`, or the figure reported skipped without it.
pub fn valgrind_for(figure: &str) -> Option<PathBuf> {
    let found = find_tool("valgrind");
    if found.is_none() {
        skipped(figure, None, "valgrind not found; apt-get install valgrind");
    }
    found
}

/// Looks a program up on PATH and in the sbin directories (nats-server is
/// installed to /usr/sbin, which a non-root PATH may lack).
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let extra = ["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from);
    std::env::split_paths(&path)
        .chain(extra)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

// ---- the daemon ----

/// The paths of one daemon instance.
pub struct DaemonDirs {
    pub state: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
    pub home: PathBuf,
}

impl DaemonDirs {
    pub fn under(dir: &Path) -> DaemonDirs {
        DaemonDirs {
            state: dir.join("state"),
            socket: dir.join("run/d.sock"),
            log: dir.join("daemon.log"),
            home: dir.join("home"),
        }
    }
}

/// The `serve` command for `dirs`, isolated from the user's config and the
/// service manager.
pub fn serve_command(program: &Path, dirs: &DaemonDirs) -> Command {
    let mut cmd = Command::new(program);
    daemon_args(&mut cmd, dirs);
    cmd
}

pub fn daemon_args(cmd: &mut Command, dirs: &DaemonDirs) {
    let _ = std::fs::create_dir_all(&dirs.home);
    cmd.arg("--state-dir")
        .arg(&dirs.state)
        .arg("--socket")
        .arg(&dirs.socket)
        .arg("serve");
    cmd.env("XDG_CONFIG_HOME", &dirs.home)
        .env("HOME", &dirs.home)
        .env_remove("NOTIFY_SOCKET");
}

pub const PING: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n";

/// One connection that sends a line and reads one line back.
pub struct LineClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    line: Vec<u8>,
}

impl LineClient {
    pub fn connect(path: &Path) -> std::io::Result<LineClient> {
        let s = UnixStream::connect(path)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(LineClient {
            writer: s.try_clone()?,
            reader: BufReader::new(s),
            line: Vec::with_capacity(128),
        })
    }

    /// Sends `req` and returns the line that comes back.
    pub fn exchange(&mut self, req: &[u8]) -> std::io::Result<&[u8]> {
        self.writer.write_all(req)?;
        self.line.clear();
        let n = self.reader.read_until(b'\n', &mut self.line)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed before answering",
            ));
        }
        Ok(&self.line)
    }
}

/// How long between two readiness probes: short enough for a fine
/// figure, long enough not to steal the core from the server it waits for.
pub const PROBE_INTERVAL: Duration = Duration::from_micros(250);

/// When a starting daemon first accepted a connection and when it answered
/// the ping sent on it.
pub struct Ready {
    pub connected: Instant,
    pub answered: Instant,
}

/// Waits until the daemon answers `ping` on `socket`.
pub fn wait_daemon_ready(p: &mut Proc, socket: &Path, timeout: Duration) -> Result<Ready, String> {
    let end = Instant::now() + timeout;
    loop {
        if let Ok(mut c) = LineClient::connect(socket) {
            let connected = Instant::now();
            if let Ok(line) = c.exchange(PING) {
                if line.windows(8).any(|w| w == b"\"result\"") {
                    return Ok(Ready {
                        connected,
                        answered: Instant::now(),
                    });
                }
                return Err(format!(
                    "ping answered with {}",
                    String::from_utf8_lossy(line).trim()
                ));
            }
        }
        if p.exited() {
            return Err(format!("{} exited before it was ready", p.name));
        }
        if Instant::now() >= end {
            return Err(format!("{} not ready after {timeout:?}", p.name));
        }
        std::thread::sleep(PROBE_INTERVAL);
    }
}

/// The last lines of a log file, for an error message.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

// ---- helpers of the session and plugin figures ----

/// The `serve` command for `dirs` with `config` written beside the state
/// directory and passed with `--config`.
pub fn serve_with_config(dirs: &DaemonDirs, dir: &Path, config: &str) -> Command {
    let p = dir.join("omniconfluxd.toml");
    std::fs::write(&p, config).expect("write bench config");
    let _ = std::fs::create_dir_all(&dirs.home);
    let mut cmd = Command::new(daemon_bin());
    cmd.arg("--state-dir")
        .arg(&dirs.state)
        .arg("--socket")
        .arg(&dirs.socket)
        .arg("--config")
        .arg(&p)
        .arg("serve");
    cmd.env("XDG_CONFIG_HOME", &dirs.home)
        .env("HOME", &dirs.home)
        .env_remove("NOTIFY_SOCKET");
    cmd
}

/// `cmd` (a daemon's command line and environment) run under
/// `valgrind --tool=callgrind` with `options` of its own, its output to
/// `out`; valgrind's own temporary files stay in `tmp`, the run's
/// directory.
pub fn under_callgrind(
    valgrind: &Path,
    out: &Path,
    tmp: &Path,
    cmd: &Command,
    options: &[&str],
) -> Command {
    let mut vg = Command::new(valgrind);
    vg.arg("--tool=callgrind")
        .arg("--vgdb=no")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .args(options)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => vg.env(k, v),
            None => vg.env_remove(k),
        };
    }
    vg.env("TMPDIR", tmp);
    vg
}

/// The total instructions in the callgrind output file `out` (a daemon
/// with several threads writes one file, its totals on one line); the
/// daemon's log tail when there is none.
pub fn callgrind_total(out: &Path, log: &Path) -> Result<f64, String> {
    callgrind_total_in(&read_callgrind(out, log)?)
}

/// The callgrind output file `out`; the daemon's log tail when it is missing.
pub fn read_callgrind(out: &Path, log: &Path) -> Result<String, String> {
    std::fs::read_to_string(out)
        .map_err(|e| format!("no callgrind output: {e}; log: {}", log_tail(log)))
}

/// The total instructions in a callgrind output's text.
pub fn callgrind_total_in(text: &str) -> Result<f64, String> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .ok_or_else(|| "no totals in the callgrind output".into())
}

/// Starts a daemon with `config` on core `cpu` and waits for its first ping.
pub fn start_daemon(
    dir: &Path,
    config: &str,
    cpu: Option<usize>,
) -> Result<(Proc, DaemonDirs), String> {
    let dirs = DaemonDirs::under(dir);
    let mut p = Proc::spawn(
        "omniconfluxd",
        serve_with_config(&dirs, dir, config),
        cpu,
        Some(&dirs.log),
    )
    .map_err(|e| format!("unable to start the daemon: {e}"))?;
    wait_daemon_ready(&mut p, &dirs.socket, Duration::from_secs(20))
        .map_err(|e| format!("{e}; log: {}", log_tail(&dirs.log)))?;
    Ok((p, dirs))
}

/// A JSON-RPC client of the daemon socket that keeps the notifications it
/// reads while it waits for an answer.
pub struct Rpc {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next: u64,
    pub notes: std::collections::VecDeque<Value>,
}

impl Rpc {
    pub fn connect(path: &Path) -> Result<Rpc, String> {
        let s =
            UnixStream::connect(path).map_err(|e| format!("connect {}: {e}", path.display()))?;
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| e.to_string())?;
        Ok(Rpc {
            writer: s.try_clone().map_err(|e| e.to_string())?,
            reader: BufReader::with_capacity(1 << 20, s),
            next: 0,
            notes: Default::default(),
        })
    }

    /// Sends a request and returns its id.
    pub fn send(&mut self, method: &str, params: Value) -> Result<u64, String> {
        self.next += 1;
        let line = serde_json::json!({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params}).to_string() + "\n";
        self.writer
            .write_all(line.as_bytes())
            .map_err(|e| format!("{method}: {e}"))?;
        Ok(self.next)
    }

    /// Reads one line as JSON.
    pub fn read(&mut self) -> Result<Value, String> {
        let mut line = Vec::new();
        let n = self
            .reader
            .read_until(b'\n', &mut line)
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the daemon closed the connection".into());
        }
        serde_json::from_slice(&line).map_err(|e| format!("bad line: {e}"))
    }

    /// Waits for the answer to `id`; an error answer is `Err`.
    pub fn wait(&mut self, id: u64) -> Result<Value, String> {
        loop {
            let v = self.read()?;
            if v.get("id").and_then(Value::as_u64) == Some(id) {
                if let Some(e) = v.get("error") {
                    return Err(format!("error answer: {e}"));
                }
                return Ok(v.get("result").cloned().unwrap_or(Value::Null));
            }
            if v.get("method").is_some() {
                self.notes.push_back(v);
            }
        }
    }

    /// Waits for the next `event` notification of `kind`, kept or new.
    pub fn wait_event(&mut self, kind: &str) -> Result<Value, String> {
        let is = |v: &Value| v["method"] == "event" && v["params"]["kind"] == kind;
        if let Some(i) = self.notes.iter().position(is) {
            return Ok(self.notes.remove(i).unwrap_or(Value::Null));
        }
        loop {
            let v = self.read()?;
            if is(&v) {
                return Ok(v);
            }
            if v.get("method").is_some() {
                self.notes.push_back(v);
            }
        }
    }

    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.send(method, params)?;
        self.wait(id).map_err(|e| format!("{method}: {e}"))
    }
}

/// VmRSS of a process in KiB.
pub fn vm_rss_kib(pid: i32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    l.split_whitespace().nth(1)?.parse().ok()
}

/// The `q` quantile (0..=1) of `xs`, nearest rank.
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// Wall clock in nanoseconds since the epoch (the agents' and plugins'
/// stamps are wall clock too).
pub fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The absolute path of a python3 (the daemon's agent environment may not
/// carry a pyenv shim's variables).
pub fn python3() -> Option<PathBuf> {
    let out = Command::new("python3")
        .arg("-c")
        .arg("import sys; print(sys.executable)")
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if p.is_file() {
        Some(p)
    } else {
        find_tool("python3")
    }
}

/// A file of this bench's directory (fixtures kept beside the modules).
pub fn bench_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/bench")
        .join(name)
}

impl Rpc {
    /// The reading and writing halves, for a thread that only reads.
    pub fn into_parts(self) -> (BufReader<UnixStream>, UnixStream) {
        let Rpc { reader, writer, .. } = self;
        (reader, writer)
    }
}
