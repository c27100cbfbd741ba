//! Test harness: runs the real `omniconfluxd` binary in its own temporary
//! directory and talks to it as a client would. Readiness and stopping are
//! awaited through the sd_notify datagrams the daemon sends (READY=1,
//! STOPPING=1) and through its log lines, never by sleeping. When a test
//! fails, the guard prints the command, the directory, the exit status and
//! everything the daemon wrote.

#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod http;
pub mod need;
pub mod tmux;

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long any wait in a test may take before the test fails. Generous:
/// the machine may be loaded; nothing is asserted about speed.
pub const PATIENCE: Duration = Duration::from_secs(60);

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_omniconfluxd")
}

/// A directory under cargo's per-target temp dir, removed when the test
/// passes and kept (and printed) when it fails.
pub struct TestDir {
    pub path: PathBuf,
}

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        let mut b = [0u8; 4];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut b))
            .expect("urandom");
        // Short names: a unix socket path must fit in 107 bytes (sun_path),
        // and the longest the tests bind is DIR/NAME-XXXXXXXX/notify-PID,
        // 37 bytes past the base. Under a checkout so deep that cargo's temp
        // dir leaves no room for that, the system's temp dir serves.
        let mut base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        if base.as_os_str().len() + 37 > 107 {
            base = std::env::temp_dir().join("omniconfluxd-tests");
        }
        let path = base.join(format!(
            "{}-{:02x}{:02x}{:02x}{:02x}",
            &name[..name.len().min(12)],
            b[0],
            b[1],
            b[2],
            b[3]
        ));
        std::fs::create_dir_all(&path).expect("create test dir");
        TestDir { path }
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.path.join(p)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A running daemon.
pub struct Daemon {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub state: PathBuf,
    pub args: Vec<String>,
    child: Option<Child>,
    notify: UnixDatagram,
    log: Arc<Mutex<Vec<String>>>,
    log_rx: mpsc::Receiver<String>,
    readers: Vec<std::thread::JoinHandle<()>>,
    pub status: Option<ExitStatus>,
}

/// A file of tests/fixtures/.
pub fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs the test's own git in `dir` and returns its trimmed stdout, failing
/// the test on an error. It runs none of the repository's hooks or its file
/// system monitor: a repository an agent worked in may carry some, and the
/// test must not run them outside the agent's namespace.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
        ])
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t")
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Whether bubblewrap makes namespaces here, as the daemon's own probe
/// decides; where it cannot, the rule of `need` applies.
pub fn bwrap_works() -> bool {
    need::have(
        omniconfluxd::isolation::probe(),
        "the Debian package bubblewrap, on a kernel that lets users make namespaces",
    )
    .is_some()
}

#[derive(Default)]
pub struct Opts {
    pub config: Option<String>,
    /// With no `config`: pass no `--config` at all, so the daemon looks at
    /// its default path as a fresh install does (point XDG_CONFIG_HOME in
    /// `env` at an empty directory to keep the user's own file out).
    pub no_config_file: bool,
    pub extra_args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl Daemon {
    /// Starts a daemon on `dir` and waits for READY=1.
    pub fn start(dir: &Path) -> Daemon {
        Daemon::start_with(dir, Opts::default())
    }

    pub fn start_with(dir: &Path, opts: Opts) -> Daemon {
        let d = Daemon::spawn(dir, opts);
        d.expect_notify("READY=1")
    }

    /// Starts a daemon without waiting for it to become ready.
    pub fn spawn(dir: &Path, opts: Opts) -> Daemon {
        Daemon::spawn_command(dir, opts, "serve")
    }

    /// Runs `command` (`gateway` for the standalone gateway) instead of
    /// `serve`, and waits for READY=1; `opts.extra_args` follow it.
    pub fn start_command(dir: &Path, opts: Opts, command: &str) -> Daemon {
        Daemon::spawn_command(dir, opts, command).expect_notify("READY=1")
    }

    fn spawn_command(dir: &Path, opts: Opts, command: &str) -> Daemon {
        let socket = dir.join("run/d.sock");
        let state = dir.join("state");
        let notify_path = dir.join(format!("notify-{}", std::process::id()));
        let _ = std::fs::remove_file(&notify_path);
        let notify = UnixDatagram::bind(&notify_path).expect("bind notify socket");
        let mut args = vec![
            "--state-dir".to_string(),
            state.display().to_string(),
            "--socket".into(),
            socket.display().to_string(),
        ];
        if let Some(cfg) = &opts.config {
            let p = dir.join("omniconfluxd.toml");
            std::fs::write(&p, cfg).expect("write config");
            args.push("--config".into());
            args.push(p.display().to_string());
        } else if !opts.no_config_file {
            // A config path that does not exist would be an error; point the
            // daemon at an empty one so the operator's own file is never read.
            let p = dir.join("empty.toml");
            std::fs::write(&p, "").expect("write config");
            args.push("--config".into());
            args.push(p.display().to_string());
        }
        args.push(command.into());
        args.extend(opts.extra_args.iter().cloned());
        let tmux_dir = dir.join("tmx");
        std::fs::create_dir_all(&tmux_dir).expect("create the tmux directory");
        let mut cmd = Command::new(bin());
        cmd.args(&args)
            .env("NOTIFY_SOCKET", &notify_path)
            .env_remove("JOURNAL_STREAM")
            // The default config directory is the test's own: the daemon
            // protects (and creates) it, and as root it would otherwise be
            // /etc/omniconflux on the machine running the tests.
            .env("XDG_CONFIG_HOME", dir.join("xdg-config"))
            // The tmux servers the daemon looks at (its sessions in tmux,
            // issue 15) are the test's own, never the machine's: tmux
            // falls back to /tmp when this directory does not exist.
            .env("TMUX_TMPDIR", &tmux_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn daemon");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, log_rx) = mpsc::channel();
        let mut readers = Vec::new();
        for pipe in [
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let log = log.clone();
            let tx = tx.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    log.lock().unwrap().push(line.clone());
                    let _ = tx.send(line);
                }
            }));
        }
        notify.set_read_timeout(Some(PATIENCE)).expect("timeout");
        Daemon {
            dir: dir.to_path_buf(),
            socket,
            state,
            args,
            child: Some(child),
            notify,
            log,
            log_rx,
            readers,
            status: None,
        }
    }

    /// Waits for one sd_notify datagram and checks it. A signal that lands
    /// in the test process (another test's child exiting, say) interrupts
    /// recv with EINTR: that is no answer, so it waits again for what is
    /// left of the patience.
    pub fn expect_notify(self, want: &str) -> Daemon {
        let mut buf = [0u8; 256];
        let deadline = Instant::now() + PATIENCE;
        let got = loop {
            match self.notify.recv(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break Err(e);
                    }
                    self.notify.set_read_timeout(Some(left)).expect("timeout");
                }
                other => break other,
            }
        };
        self.notify
            .set_read_timeout(Some(PATIENCE))
            .expect("timeout");
        match got {
            Ok(n) => {
                let got = String::from_utf8_lossy(&buf[..n]).to_string();
                if got != want {
                    self.fail(&format!("expected notify {want:?}, got {got:?}"));
                }
            }
            Err(e) => self.fail(&format!("no notify {want:?} within {PATIENCE:?}: {e}")),
        }
        self
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    pub fn connect(&self) -> Client {
        match UnixStream::connect(&self.socket) {
            Ok(s) => Client::new(s),
            Err(e) => self.fail(&format!("connect {}: {e}", self.socket.display())),
        }
    }

    /// Waits until the daemon writes a log line containing `needle`.
    pub fn wait_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        if let Some(l) = self.log.lock().unwrap().iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log_rx.recv_timeout(left) {
                Ok(l) if l.contains(needle) => return l,
                Ok(_) => {}
                Err(_) => self.fail(&format!("no log line containing {needle:?}")),
            }
        }
    }

    /// Waits until the daemon has written `n` log lines containing `needle`.
    pub fn wait_log_count(&self, needle: &str, n: usize) {
        let deadline = Instant::now() + PATIENCE;
        let count = || {
            self.log
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains(needle))
                .count()
        };
        while count() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.log_rx.recv_timeout(left).is_err() {
                self.fail(&format!("fewer than {n} log lines containing {needle:?}"));
            }
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill with our own child's pid.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits for the daemon to exit and returns its status.
    pub fn wait(&mut self) -> ExitStatus {
        if let Some(s) = self.status {
            return s;
        }
        let mut child = self.child.take().expect("child");
        let (tx, rx) = mpsc::channel();
        let pid = child.id();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match rx.recv_timeout(PATIENCE) {
            Ok(Ok(s)) => {
                self.status = Some(s);
                // The pipes reach end of file once the daemon is gone; the
                // whole log is kept before anyone reads it.
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                s
            }
            _ => {
                // SAFETY: kill our own child that did not exit in time.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                self.fail("daemon did not exit in time")
            }
        }
    }

    pub fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        self.wait();
    }

    pub fn stop(mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait()
    }

    pub fn fail(&self, what: &str) -> ! {
        panic!(
            "{what}\ncommand: {} {}\ndirectory: {}\nstatus: {:?}\ndaemon output:\n{}",
            bin(),
            self.args.join(" "),
            self.dir.display(),
            self.status,
            self.log_text()
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "daemon in {} wrote:\n{}",
                self.dir.display(),
                self.log_text()
            );
        }
    }
}

/// A line client of the daemon socket.
pub struct Client {
    pub stream: UnixStream,
    reader: BufReader<UnixStream>,
    next_id: u64,
    /// Notifications read while waiting for replies.
    pub notes: Vec<Value>,
}

impl Client {
    pub fn new(stream: UnixStream) -> Client {
        stream.set_read_timeout(Some(PATIENCE)).expect("timeout");
        let reader = BufReader::new(stream.try_clone().expect("clone"));
        Client {
            stream,
            reader,
            next_id: 1,
            notes: Vec::new(),
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write to daemon");
    }

    /// Reads one line; `None` at end of stream.
    pub fn read_line(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => None,
            Ok(_) => Some(
                serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("daemon sent non-JSON {line:?}: {e}")),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
            Err(e) => panic!("read from daemon: {e}"),
        }
    }

    /// Sends a request and returns the whole reply frame.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_raw(format!("{line}\n").as_bytes());
        loop {
            let msg = self
                .read_line()
                .unwrap_or_else(|| panic!("connection closed waiting for {method}"));
            if msg.get("id") == Some(&json!(id)) {
                return msg;
            }
            if msg.get("method").is_some() {
                self.notes.push(msg);
            }
        }
    }

    /// The result of a call that must succeed.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let r = self.request(method, params);
        match r.get("error") {
            Some(e) => panic!("{method} failed: {e}"),
            None => r["result"].clone(),
        }
    }

    /// The stable code of a call that must fail.
    pub fn error_code(&mut self, method: &str, params: Value) -> String {
        let r = self.request(method, params);
        r["error"]["data"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("{method} did not fail: {r}"))
            .to_string()
    }

    /// Waits for the next notification with `method`.
    pub fn next_note(&mut self, method: &str) -> Value {
        if let Some(i) = self.notes.iter().position(|n| n["method"] == method) {
            return self.notes.remove(i);
        }
        loop {
            let msg = self
                .read_line()
                .unwrap_or_else(|| panic!("connection closed waiting for {method}"));
            if msg["method"] == method {
                return msg;
            }
        }
    }
}

/// Runs the binary as a client command and returns (status, stdout, stderr).
pub fn run_cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
        .args(args)
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .output()
        .expect("run cli");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// The commands the command line dispatches, read from the arms of its
/// match in src/cli/mod.rs (`"serve" => ...`), so that a command added
/// there shows up in every test that walks them.
pub fn cli_commands() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cli/mod.rs");
    let text = std::fs::read_to_string(&src)
        .unwrap_or_else(|e| panic!("unable to read {}: {e}", src.display()));
    let cmds: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let word = l.trim_start().strip_prefix('"')?.split_once("\" =>")?.0;
            word.chars()
                .all(|c| c.is_ascii_lowercase())
                .then(|| word.to_string())
        })
        .collect();
    assert!(
        cmds.len() >= 14,
        "expected the commands of src/cli/mod.rs, found {cmds:?}"
    );
    cmds
}
