//! Seats: the agent harnesses the daemon offers and what it knows of each
//! (issue 3, "Seats"; issue 9, "Seats on defaults"; seed 000, seats.list):
//! probing (not answered yet), ready, degraded (installed, something in
//! the way, and why) or missing, and the sign-in state an agent reported.
//!
//! Where seats come from: the config's `[[seat]]` tables (origin
//! `configured`); when there is none and `[seats] detect` is on (the
//! default), the agent CLIs of `KNOWN` found on PATH (origin
//! `detected`). Configured seats always win: one `[[seat]]` and nothing is
//! detected. Detection runs again with every probe (start, SIGHUP,
//! seats.probe); a detected seat whose program left PATH leaves the
//! registry, and one that stays keeps what is known of it.
//!
//! Detected seats, decided where issue 9 is silent: `claude` is Claude
//! Code in stream-json mode (harness `claude`); `claude-agent-acp`, or
//! `claude-code-acp` when the former is absent, is harness `claude-acp`
//! (one seat for one adapter); `codex-acp` is harness `codex`; `gemini`
//! runs with `--acp`, or `--experimental-acp` when its `--help` names only
//! that, and is degraded with the reason when its help names neither or
//! does not answer in time; `opencode acp` is provider `opencode` of
//! family `auto`, because opencode serves whichever provider its own
//! config names. Every detected harness name is distinct and fits seed
//! 000's harness pattern; none names a model.
//!
//! Probing never blocks the reactor: one worker thread at a time detects
//! (when detection is on), hands the list to the reactor, then resolves
//! each seat's command in PATH and runs `command --version` with stdin,
//! stdout and stderr closed, bounded by `SEAT_PROBE_TIMEOUT_MS`, and hands
//! each seat's answer back through the reactor inbox as it comes. A probe
//! asked for while one runs is run again once that one is done. The
//! reactor reaps only its own thread's children, not the worker's probe; a
//! wait that fails anyway (ECHILD included) leaves the probe's outcome
//! unknown, and the seat is reported degraded with the cause rather than
//! ready.
//!
//! The registry is a subsystem in the shape of DESIGN.md, "How subsystems
//! talk": [`Seats`] changes only through its methods, which take what they
//! need (the config, the time) and return [`Effect`]s: the probe job for a
//! worker, and the two things others wait for, the list known (sessions of
//! the last run are reopened on their seats) and a probe answered (lanes
//! resume). The router in the daemon starts the worker ([`run_probe`]),
//! hands its [`Report`]s back to [`Seats::on_report`] and decides who hears
//! the events; nothing here knows the daemon, the sessions or the lanes,
//! so the registry's rules are tested in memory below.
//!
//! Before its first probe answers a seat is `probing` on the socket, over
//! HTTP and on the command line, never `missing`: nobody has looked yet.
//! Lanes take only `ready` seats, so a probing seat is `seat-not-ready` to
//! them; `sessions.spawn` starts its agent (the start itself is the
//! test). The plugin wire's status enum (seed 000) has no `probing`: there
//! a probing seat is `degraded`, "something is in the way" being the
//! check that has not answered, since it cannot take a task yet and is
//! not known to be absent.

use serde_json::{Value, json};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::agents::{SignInState, Transport};
use crate::config::{FileConfig, SeatConfig};
use crate::limits;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ready,
    Degraded,
    Missing,
}

impl Status {
    pub fn wire_name(self) -> &'static str {
        match self {
            Status::Ready => "ready",
            Status::Degraded => "degraded",
            Status::Missing => "missing",
        }
    }
}

/// Where a seat came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A `[[seat]]` table of the config.
    Configured,
    /// An agent CLI of `KNOWN` found on PATH.
    Detected,
}

impl Origin {
    pub fn wire_name(self) -> &'static str {
        match self {
            Origin::Configured => "configured",
            Origin::Detected => "detected",
        }
    }
}

/// One seat as the daemon knows it.
#[derive(Clone, Debug)]
pub struct Seat {
    pub cfg: SeatConfig,
    pub origin: Origin,
    pub transport: Transport,
    /// Not probed yet (`probing`): `None`.
    pub status: Option<Status>,
    pub reason: Option<String>,
    pub program: Option<PathBuf>,
    pub sign_in: Option<SignInState>,
    pub probed_at_ms: Option<i64>,
}

impl Seat {
    fn new(cfg: SeatConfig, origin: Origin) -> Seat {
        let transport = Transport::from_wire_name(&cfg.transport).unwrap_or(Transport::Acp);
        Seat {
            cfg,
            origin,
            transport,
            status: None,
            reason: None,
            program: None,
            sign_in: None,
            probed_at_ms: None,
        }
    }

    /// The status the socket, HTTP and the command line show.
    pub fn status_name(&self) -> &'static str {
        self.status.map(Status::wire_name).unwrap_or("probing")
    }

    pub fn sign_in_name(&self) -> &'static str {
        match self.sign_in {
            Some(SignInState::SignedIn) => "signed-in",
            Some(SignInState::SignedOut) => "signed-out",
            None => "unknown",
        }
    }

    /// The plugin wire's seats.list item (seed 000, exactly: no origin). A
    /// seat not probed yet is degraded; see the module comment.
    pub fn plugin_item(&self) -> Value {
        json!({
            "harness": self.cfg.harness,
            "provider": self.cfg.provider,
            "family": self.cfg.family,
            "status": self.status.unwrap_or(Status::Degraded).wire_name(),
            "signIn": self.sign_in_name(),
        })
    }
}

/// The registry in order: config order, or `KNOWN`'s order when detected.
#[derive(Default)]
pub struct Seats {
    pub list: Vec<Seat>,
    /// The config has no `[[seat]]` and `[seats] detect` is on.
    detect: bool,
    probing: bool,
    again: bool,
    /// The list has been known once ([`Effect::Known`] was returned): at
    /// the first probe for configured seats, at the first detection
    /// otherwise.
    known: bool,
}

/// Work for the probe worker: detect the known agent CLIs on PATH (when
/// `detect`), then probe `seats` (only when not detecting: detection's
/// list is what is probed then). Run by [`run_probe`].
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeJob {
    pub detect: bool,
    pub seats: Vec<SeatConfig>,
}

/// What the probe worker hands back, in this order, through the reactor
/// inbox: [`Seats::on_report`] takes each.
#[derive(Debug)]
pub enum Report {
    /// Detection's list: each seat found, with the program it found.
    Detected(Vec<(SeatConfig, PathBuf)>),
    /// One seat's probe answered (the config boxed: reports queue on
    /// the reactor's inbox, whose slots are as large as its largest).
    Probed(Box<SeatConfig>, Outcome),
    /// Every seat of the job has answered.
    Done,
}

/// What a change of the registry asks of the rest of the daemon. The
/// router applies these in the order given (daemon/router.rs); the
/// registry never learns who acts on them.
#[derive(Debug, PartialEq)]
pub enum Effect {
    /// Run this job on a worker thread; its reports come back to
    /// [`Seats::on_report`]. At most one runs at a time.
    Probe(ProbeJob),
    /// The list is known for the first time: the sessions of the last run
    /// may be reopened on their seats. Returned once in the daemon's life.
    Known,
    /// A probe has answered for every seat: lanes waiting to see which
    /// seats are ready may resume. Returned at the end of every probe.
    Probed,
}

/// A probe's answer for one seat: the status, why, and the program it
/// found.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub status: Status,
    pub reason: Option<String>,
    pub program: Option<PathBuf>,
}

fn detects(cfg: &FileConfig) -> bool {
    cfg.seat.is_empty() && cfg.seats.detect
}

impl Seats {
    /// A probe runs now (its results are not in yet).
    pub fn probing(&self) -> bool {
        self.probing
    }

    pub fn from_config(cfg: &FileConfig) -> Seats {
        Seats {
            // A tmux seat is started in a pane by the tmux subsystem
            // (src/socket/methods/tmux.rs), never driven by the core.
            list: cfg
                .seat
                .iter()
                .filter(|c| !c.in_tmux())
                .cloned()
                .map(|c| Seat::new(c, Origin::Configured))
                .collect(),
            detect: detects(cfg),
            ..Seats::default()
        }
    }

    pub fn get(&self, harness: &str) -> Option<&Seat> {
        self.list.iter().find(|s| s.cfg.harness == harness)
    }

    /// Takes a new config (SIGHUP), keeping what is known of unchanged
    /// seats. Detected seats stay until the next detection says otherwise,
    /// unless the config now names seats of its own.
    pub fn reconfigure(&mut self, cfg: &FileConfig) {
        self.detect = detects(cfg);
        if self.detect {
            self.list.retain(|s| s.origin == Origin::Detected);
            return;
        }
        let old = std::mem::take(&mut self.list);
        self.list = cfg
            .seat
            .iter()
            .filter(|c| !c.in_tmux())
            .map(|c| match old.iter().find(|s| &s.cfg == c) {
                Some(s) => Seat {
                    origin: Origin::Configured,
                    ..s.clone()
                },
                None => Seat::new(c.clone(), Origin::Configured),
            })
            .collect();
    }

    /// Detects (when on) and probes every seat on a worker thread; see the
    /// module comment. While a probe runs, the ask is remembered and the
    /// probe runs again once that one is done.
    pub fn probe(&mut self) -> Vec<Effect> {
        let mut out = Vec::new();
        if self.probing {
            self.again = true;
            return out;
        }
        if !self.detect {
            self.mark_known(&mut out);
            if self.list.is_empty() {
                return out;
            }
        }
        self.probing = true;
        out.push(Effect::Probe(ProbeJob {
            detect: self.detect,
            seats: self.list.iter().map(|s| s.cfg.clone()).collect(),
        }));
        out
    }

    /// The worker for an [`Effect::Probe`] could not start: nothing will
    /// answer, and the list stays as it is.
    pub fn probe_not_started(&mut self) -> Vec<Effect> {
        self.probing = false;
        let mut out = Vec::new();
        self.mark_known(&mut out);
        out
    }

    /// One report of the probe worker, at `now_ms`.
    pub fn on_report(&mut self, report: Report, now_ms: i64) -> Vec<Effect> {
        let mut out = Vec::new();
        match report {
            Report::Detected(found) => {
                self.take_detected(found);
                self.mark_known(&mut out);
            }
            Report::Probed(cfg, outcome) => self.take_probe(&cfg, outcome, now_ms),
            Report::Done => {
                self.probing = false;
                if std::mem::take(&mut self.again) {
                    out.extend(self.probe());
                }
                out.push(Effect::Probed);
            }
        }
        out
    }

    fn mark_known(&mut self, out: &mut Vec<Effect>) {
        if !self.known {
            self.known = true;
            out.push(Effect::Known);
        }
    }

    /// A detection's list: new seats are probing, gone ones leave, the
    /// others keep what is known of them. Ignored when the config named
    /// seats of its own meanwhile.
    fn take_detected(&mut self, found: Vec<(SeatConfig, PathBuf)>) {
        if !self.detect {
            return;
        }
        let old = std::mem::take(&mut self.list);
        for s in &old {
            if !found.iter().any(|(c, _)| c == &s.cfg) {
                crate::info!("seat {}: no longer detected on PATH", s.cfg.harness);
            }
        }
        self.list = found
            .into_iter()
            .map(|(c, program)| match old.iter().find(|s| s.cfg == c) {
                Some(s) => s.clone(),
                None => {
                    crate::info!(
                        "seat {}: detected {} ({}, {})",
                        c.harness,
                        program.display(),
                        c.transport,
                        c.provider
                    );
                    Seat::new(c, Origin::Detected)
                }
            })
            .collect();
    }

    /// One probe's answer, for the seat with this very config (a seat
    /// reconfigured meanwhile waits for its own probe).
    fn take_probe(&mut self, cfg: &SeatConfig, outcome: Outcome, now_ms: i64) {
        let Some(s) = self.list.iter_mut().find(|s| &s.cfg == cfg) else {
            return;
        };
        let Outcome {
            status: st,
            reason: why,
            program,
        } = outcome;
        if s.status != Some(st) {
            match &why {
                Some(w) => crate::info!("seat {}: {} ({w})", cfg.harness, st.wire_name()),
                None => crate::info!("seat {}: {}", cfg.harness, st.wire_name()),
            }
        }
        s.status = Some(st);
        s.reason = why;
        s.program = program;
        s.probed_at_ms = Some(now_ms);
    }

    pub fn note_sign_in(&mut self, harness: &str, state: SignInState) {
        if let Some(s) = self.list.iter_mut().find(|s| s.cfg.harness == harness) {
            s.sign_in = Some(state);
        }
    }
}

/// Runs a [`ProbeJob`] on the calling (worker) thread, handing each
/// [`Report`] to `report` as it comes, so that a slow probe holds back no
/// other seat's state; blocking, bounded per program by
/// `SEAT_PROBE_TIMEOUT_MS`. `path_var` is the PATH agents will run with.
pub fn run_probe(job: ProbeJob, path_var: &str, mut report: impl FnMut(Report)) {
    let work: Vec<(SeatConfig, Option<Outcome>)> = if job.detect {
        let found = detect_on_path(path_var);
        report(Report::Detected(
            found
                .iter()
                .map(|f| (f.cfg.clone(), f.program.clone()))
                .collect(),
        ));
        found.into_iter().map(|f| (f.cfg, f.outcome)).collect()
    } else {
        job.seats.into_iter().map(|c| (c, None)).collect()
    };
    for (cfg, outcome) in work {
        let answer = outcome.unwrap_or_else(|| probe(&cfg, path_var));
        report(Report::Probed(Box::new(cfg), answer));
    }
    report(Report::Done);
}

/// How a detected seat's arguments are chosen.
#[derive(Clone, Copy)]
enum Args {
    Fixed(&'static [&'static str]),
    /// `--acp` or `--experimental-acp`, whichever the program's `--help`
    /// names (`gemini_acp_flag`).
    GeminiAcp,
}

/// An agent CLI that detection knows.
struct Known {
    harness: &'static str,
    /// Program names, first found on PATH wins.
    commands: &'static [&'static str],
    transport: Transport,
    provider: &'static str,
    family: &'static str,
    args: Args,
}

/// The agent CLIs detected on PATH, in registry order (issue 9, item 2).
const KNOWN: [Known; 5] = [
    Known {
        harness: "claude",
        commands: &["claude"],
        transport: Transport::StreamJson,
        provider: "anthropic",
        family: "anthropic",
        args: Args::Fixed(&[]),
    },
    Known {
        harness: "claude-acp",
        commands: &["claude-agent-acp", "claude-code-acp"],
        transport: Transport::Acp,
        provider: "anthropic",
        family: "anthropic",
        args: Args::Fixed(&[]),
    },
    Known {
        harness: "codex",
        commands: &["codex-acp"],
        transport: Transport::Acp,
        provider: "openai",
        family: "openai",
        args: Args::Fixed(&[]),
    },
    Known {
        harness: "gemini",
        commands: &["gemini"],
        transport: Transport::Acp,
        provider: "google",
        family: "google",
        args: Args::GeminiAcp,
    },
    Known {
        harness: "opencode",
        commands: &["opencode"],
        transport: Transport::Acp,
        provider: "opencode",
        family: "auto",
        args: Args::Fixed(&["acp"]),
    },
];

/// A seat detection found, with its probe's outcome when detection
/// already knows it.
struct Found {
    cfg: SeatConfig,
    program: PathBuf,
    outcome: Option<Outcome>,
}

/// The known agent CLIs on `path_var`, as seats. Runs on the probe worker:
/// it may run `gemini --help`, bounded like a probe.
fn detect_on_path(path_var: &str) -> Vec<Found> {
    let mut out = Vec::new();
    for k in &KNOWN {
        let Some((command, program)) = k
            .commands
            .iter()
            .find_map(|c| resolve(c, path_var).ok().map(|p| (*c, p)))
        else {
            continue;
        };
        let mut cfg = SeatConfig {
            harness: k.harness.into(),
            command: command.into(),
            transport: k.transport.wire_name().into(),
            provider: k.provider.into(),
            family: k.family.into(),
            ..SeatConfig::default()
        };
        let mut outcome = None;
        match k.args {
            Args::Fixed(a) => cfg.args = a.iter().map(|s| s.to_string()).collect(),
            Args::GeminiAcp => {
                let (args, why) = match run_bounded(&program, "--help", &cfg, path_var, true) {
                    Ran::Exited(st, help) if st.success() => {
                        match gemini_acp_flag(&String::from_utf8_lossy(&help)) {
                            Some(flag) => (vec![flag.to_string()], None),
                            None => (
                                vec!["--acp".to_string()],
                                Some(format!(
                                    "`{command} --help` names neither --acp nor --experimental-acp: this version cannot speak ACP"
                                )),
                            ),
                        }
                    }
                    ran => (
                        vec!["--acp".to_string()],
                        Some(format!(
                            "its ACP flag is unknown: {}",
                            ran.failure(command, "--help")
                        )),
                    ),
                };
                cfg.args = args;
                outcome = why.map(|w| Outcome {
                    status: Status::Degraded,
                    reason: Some(w),
                    program: Some(program.clone()),
                });
            }
        }
        out.push(Found {
            cfg,
            program,
            outcome,
        });
    }
    out
}

/// The ACP flag a `gemini --help` text names: `--acp` where the CLI has
/// it, else the older `--experimental-acp`.
fn gemini_acp_flag(help: &str) -> Option<&'static str> {
    let names = |flag: &str| {
        help.split(|c: char| c.is_whitespace() || matches!(c, ',' | '[' | ']' | '=' | '|'))
            .any(|w| w == flag)
    };
    if names("--acp") {
        Some("--acp")
    } else if names("--experimental-acp") {
        Some("--experimental-acp")
    } else {
        None
    }
}

/// Finds `command` the way the agent's exec will: a name with a slash as
/// it is, otherwise the first executable match in `path_var`.
pub fn resolve(command: &str, path_var: &str) -> Result<PathBuf, (Status, String)> {
    let candidates: Vec<PathBuf> = if command.contains('/') {
        vec![PathBuf::from(command)]
    } else {
        path_var
            .split(':')
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(command))
            .collect()
    };
    let mut not_exec = None;
    for c in candidates {
        match std::fs::metadata(&c) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => return Ok(c),
            Ok(m) if m.is_file() => not_exec = Some(c),
            _ => {}
        }
    }
    match not_exec {
        Some(p) => Err((
            Status::Degraded,
            format!("{} is not executable", p.display()),
        )),
        None if command.contains('/') => {
            Err((Status::Missing, format!("{command} does not exist")))
        }
        None => Err((Status::Missing, format!("{command} is not in PATH"))),
    }
}

/// How a bounded run of a seat's program ended.
enum Ran {
    /// It exited; what it wrote to stdout when captured, at most
    /// `SEAT_HELP_MAX_BYTES`.
    Exited(ExitStatus, Vec<u8>),
    SpawnFailed(PathBuf, std::io::Error),
    WaitFailed(std::io::Error),
    TimedOut,
}

impl Ran {
    /// Why this run says nothing good of the program, for a seat's reason.
    fn failure(&self, command: &str, arg: &str) -> String {
        match self {
            Ran::Exited(status, _) => format!("`{command} {arg}` failed ({status})"),
            Ran::SpawnFailed(program, e) => format!(
                "unable to run {}: {}",
                program.display(),
                crate::errors::io_cause(e)
            ),
            // The outcome is unknown: not evidence the tool works.
            Ran::WaitFailed(e) => format!(
                "unable to wait for `{command} {arg}`: {}",
                crate::errors::io_cause(e)
            ),
            Ran::TimedOut => format!(
                "`{command} {arg}` did not finish within {} ms",
                limits::SEAT_PROBE_TIMEOUT_MS
            ),
        }
    }
}

/// Runs `program arg` with the seat's environment, stdin and stderr
/// closed, stdout captured (bounded) or closed, for at most
/// `SEAT_PROBE_TIMEOUT_MS`; killed past it.
fn run_bounded(program: &Path, arg: &str, cfg: &SeatConfig, path_var: &str, capture: bool) -> Ran {
    let mut cmd = Command::new(program);
    cmd.arg(arg)
        .env_clear()
        .env("PATH", path_var)
        .stdin(Stdio::null())
        .stdout(if capture {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::null());
    for (k, v) in &cfg.env {
        cmd.env(k, v);
    }
    if let Ok(home) = std::env::var("HOME") {
        cmd.env("HOME", home);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ran::SpawnFailed(program.to_path_buf(), e),
    };
    // Non-blocking, so that the wait below stays bounded whatever the
    // program (or a child it left holding the pipe) does.
    let mut out = child
        .stdout
        .take()
        .map(mio::unix::pipe::Receiver::from)
        .filter(|r| r.set_nonblocking(true).is_ok());
    let mut captured = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(limits::SEAT_PROBE_TIMEOUT_MS);
    loop {
        if let Some(r) = &mut out {
            drain(r, &mut captured);
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                if let Some(r) = &mut out {
                    drain(r, &mut captured);
                }
                return Ran::Exited(status, captured);
            }
            Err(e) => return Ran::WaitFailed(e),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Ran::TimedOut;
            }
            // A worker thread waiting on its probe: polling is how std
            // offers a bounded wait on a child.
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Reads what the pipe holds now, at most 16 buffers a call so the caller
/// keeps its deadline; past `SEAT_HELP_MAX_BYTES` the bytes are read and
/// dropped, so that the program is not stopped by a full pipe.
fn drain(r: &mut mio::unix::pipe::Receiver, into: &mut Vec<u8>) {
    let mut buf = [0u8; 4096];
    for _ in 0..16 {
        match r.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                let room = limits::SEAT_HELP_MAX_BYTES.saturating_sub(into.len());
                into.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn probe(cfg: &SeatConfig, path_var: &str) -> Outcome {
    let program = match resolve(&cfg.command, path_var) {
        Ok(p) => p,
        Err((status, why)) => {
            return Outcome {
                status,
                reason: Some(why),
                program: None,
            };
        }
    };
    match run_bounded(&program, "--version", cfg, path_var, false) {
        Ran::Exited(status, _) if status.success() => Outcome {
            status: Status::Ready,
            reason: None,
            program: Some(program),
        },
        ran => Outcome {
            status: Status::Degraded,
            reason: Some(ran.failure(&cfg.command, "--version")),
            program: Some(program),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seat_cfg(harness: &str) -> SeatConfig {
        SeatConfig {
            harness: harness.into(),
            command: harness.into(),
            transport: "acp".into(),
            provider: "p".into(),
            family: "local".into(),
            ..SeatConfig::default()
        }
    }

    /// A config with these `[[seat]]` tables and `[seats] detect`.
    fn config(seats: &[SeatConfig], detect: bool) -> FileConfig {
        FileConfig {
            seat: seats.to_vec(),
            seats: crate::config::SeatsSection { detect },
            ..FileConfig::default()
        }
    }

    fn answer(status: Status, reason: Option<&str>) -> Outcome {
        Outcome {
            status,
            reason: reason.map(str::to_string),
            program: Some(PathBuf::from("/usr/bin/agent")),
        }
    }

    fn statuses(s: &Seats) -> Vec<(&str, &str)> {
        s.list
            .iter()
            .map(|s| (s.cfg.harness.as_str(), s.status_name()))
            .collect()
    }

    #[test]
    fn configured_seats_are_probing_until_their_own_answer_comes() {
        let (a, b) = (seat_cfg("a"), seat_cfg("b"));
        // Detection is on, but one [[seat]] and nothing is detected.
        let mut s = Seats::from_config(&config(&[a.clone(), b.clone()], true));
        assert_eq!(statuses(&s), [("a", "probing"), ("b", "probing")]);
        assert!(!s.probing());

        // Configured seats are known at once; the probe goes to a worker.
        let job = ProbeJob {
            detect: false,
            seats: vec![a.clone(), b.clone()],
        };
        assert_eq!(s.probe(), [Effect::Known, Effect::Probe(job.clone())]);
        assert!(s.probing());
        assert_eq!(statuses(&s), [("a", "probing"), ("b", "probing")]);

        // Each answer as it comes: the other seat is still probing.
        let none = s.on_report(
            Report::Probed(Box::new(a.clone()), answer(Status::Ready, None)),
            5,
        );
        assert_eq!(none, []);
        assert_eq!(statuses(&s), [("a", "ready"), ("b", "probing")]);
        let a_now = s.get("a").unwrap();
        assert_eq!(a_now.probed_at_ms, Some(5));
        assert_eq!(a_now.program, Some(PathBuf::from("/usr/bin/agent")));
        let missing = Outcome {
            status: Status::Missing,
            reason: Some("b is not in PATH".into()),
            program: None,
        };
        assert_eq!(
            s.on_report(Report::Probed(Box::new(b.clone()), missing), 6),
            []
        );
        assert_eq!(statuses(&s), [("a", "ready"), ("b", "missing")]);
        assert_eq!(
            s.get("b").unwrap().reason.as_deref(),
            Some("b is not in PATH")
        );

        // The end of the probe is what lanes wait for.
        assert_eq!(s.on_report(Report::Done, 7), [Effect::Probed]);
        assert!(!s.probing());

        // The list is known once in the daemon's life.
        assert_eq!(s.probe(), [Effect::Probe(job)]);
    }

    #[test]
    fn a_probe_asked_for_while_one_runs_runs_again_once_it_is_done() {
        let a = seat_cfg("a");
        let mut s = Seats::from_config(&config(std::slice::from_ref(&a), false));
        let job = ProbeJob {
            detect: false,
            seats: vec![a.clone()],
        };
        assert_eq!(s.probe(), [Effect::Known, Effect::Probe(job.clone())]);
        // Asked twice more while it runs: one more probe, not two, and
        // not before this one is done (one worker at a time).
        assert_eq!(s.probe(), []);
        assert_eq!(s.probe(), []);
        assert_eq!(
            s.on_report(
                Report::Probed(Box::new(a.clone()), answer(Status::Ready, None)),
                1
            ),
            []
        );
        // The second probe starts before the lanes hear of the first.
        assert_eq!(
            s.on_report(Report::Done, 2),
            [Effect::Probe(job), Effect::Probed]
        );
        assert!(s.probing());
        assert_eq!(s.on_report(Report::Done, 3), [Effect::Probed]);
        assert!(!s.probing());
    }

    #[test]
    fn a_reload_keeps_what_is_known_of_unchanged_seats() {
        let (a, b) = (seat_cfg("a"), seat_cfg("b"));
        let mut s = Seats::from_config(&config(&[a.clone(), b.clone()], true));
        s.probe();
        s.on_report(
            Report::Probed(Box::new(a.clone()), answer(Status::Ready, None)),
            1,
        );
        s.on_report(
            Report::Probed(Box::new(b.clone()), answer(Status::Degraded, Some("x"))),
            1,
        );
        s.on_report(Report::Done, 1);
        s.note_sign_in("a", SignInState::SignedIn);

        // b's arguments change, c is new, and the order is the config's.
        let mut b2 = b.clone();
        b2.args = vec!["--fast".into()];
        let c = seat_cfg("c");
        s.reconfigure(&config(&[c.clone(), a.clone(), b2.clone()], true));
        assert_eq!(
            statuses(&s),
            [("c", "probing"), ("a", "ready"), ("b", "probing")]
        );
        assert_eq!(s.get("a").unwrap().sign_in_name(), "signed-in");
        assert_eq!(s.get("a").unwrap().origin, Origin::Configured);

        // The probe of the new list; an answer for b's old config, still
        // under way when the config changed, is not b's answer.
        assert_eq!(
            s.probe(),
            [Effect::Probe(ProbeJob {
                detect: false,
                seats: vec![c, a.clone(), b2.clone()],
            })]
        );
        s.on_report(Report::Probed(Box::new(b), answer(Status::Ready, None)), 2);
        assert_eq!(s.get("b").unwrap().status_name(), "probing");
        s.on_report(Report::Probed(Box::new(b2), answer(Status::Ready, None)), 2);
        assert_eq!(s.get("b").unwrap().status_name(), "ready");
    }

    #[test]
    fn detection_lists_the_seats_and_the_list_is_known_when_it_answers() {
        let (x, y) = (seat_cfg("x"), seat_cfg("y"));
        let mut s = Seats::from_config(&config(&[], true));
        assert!(s.list.is_empty());
        let job = ProbeJob {
            detect: true,
            seats: vec![],
        };
        // Not known before the worker has looked at PATH.
        assert_eq!(s.probe(), [Effect::Probe(job)]);
        let found = |cfgs: &[&SeatConfig]| {
            Report::Detected(
                cfgs.iter()
                    .map(|c| ((*c).clone(), PathBuf::from("/bin/agent")))
                    .collect(),
            )
        };
        assert_eq!(s.on_report(found(&[&x, &y]), 1), [Effect::Known]);
        assert_eq!(statuses(&s), [("x", "probing"), ("y", "probing")]);
        assert_eq!(s.get("x").unwrap().origin, Origin::Detected);
        s.on_report(
            Report::Probed(Box::new(x.clone()), answer(Status::Ready, None)),
            2,
        );
        assert_eq!(s.on_report(Report::Done, 3), [Effect::Probed]);

        // A reload that still detects keeps the detected seats meanwhile.
        s.reconfigure(&config(&[], true));
        assert_eq!(statuses(&s), [("x", "ready"), ("y", "probing")]);

        // The next detection: y left PATH, x keeps what is known of it,
        // and the list is not "known" a second time.
        s.probe();
        assert_eq!(s.on_report(found(&[&x]), 4), []);
        assert_eq!(statuses(&s), [("x", "ready")]);
        assert_eq!(s.get("x").unwrap().probed_at_ms, Some(2));
    }

    #[test]
    fn configured_seats_win_over_detected_ones() {
        let (x, a) = (seat_cfg("x"), seat_cfg("a"));
        let mut s = Seats::from_config(&config(&[], true));
        s.probe();
        s.on_report(
            Report::Detected(vec![(x.clone(), PathBuf::from("/bin/x"))]),
            1,
        );
        // A [[seat]] appears while the detecting probe runs: the detected
        // seat leaves, and what that probe still reports is not taken.
        s.reconfigure(&config(std::slice::from_ref(&a), true));
        assert_eq!(statuses(&s), [("a", "probing")]);
        assert_eq!(s.get("a").unwrap().origin, Origin::Configured);
        assert_eq!(s.probe(), []);
        s.on_report(
            Report::Probed(Box::new(x.clone()), answer(Status::Ready, None)),
            2,
        );
        s.on_report(Report::Detected(vec![(x, PathBuf::from("/bin/x"))]), 2);
        assert_eq!(statuses(&s), [("a", "probing")]);
        // The probe asked for meanwhile probes the configured seat only.
        assert_eq!(
            s.on_report(Report::Done, 3),
            [
                Effect::Probe(ProbeJob {
                    detect: false,
                    seats: vec![a],
                }),
                Effect::Probed
            ]
        );
    }

    #[test]
    fn no_seats_and_no_detection_is_known_at_once_with_nothing_to_probe() {
        let mut s = Seats::from_config(&config(&[], false));
        assert_eq!(s.probe(), [Effect::Known]);
        assert!(!s.probing());
        assert_eq!(s.probe(), []);
    }

    #[test]
    fn a_probe_whose_worker_cannot_start_leaves_the_list_known() {
        let mut s = Seats::from_config(&config(&[], true));
        assert!(matches!(s.probe().as_slice(), [Effect::Probe(_)]));
        assert_eq!(s.probe_not_started(), [Effect::Known]);
        assert!(!s.probing());
        // The next ask probes again.
        assert!(matches!(s.probe().as_slice(), [Effect::Probe(_)]));
    }

    #[test]
    fn resolves_in_path_and_names_what_is_wrong() {
        assert!(resolve("sh", "/nonexistent:/bin:/usr/bin").is_ok());
        assert_eq!(
            resolve("no-such-agent-xyz", "/bin").unwrap_err().0,
            Status::Missing
        );
        assert_eq!(
            resolve("/nonexistent/agent", "/bin").unwrap_err().0,
            Status::Missing
        );
        let dir = std::env::temp_dir().join(format!("seat-{}", crate::ids::prefixed_id("")));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("agent"), "#!/bin/sh\n").unwrap();
        let (st, why) = resolve(&dir.join("agent").display().to_string(), "").unwrap_err();
        assert_eq!(st, Status::Degraded);
        assert!(why.contains("not executable"), "{why}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_seat_not_probed_yet_is_probing_and_never_missing() {
        let cfg = SeatConfig {
            harness: "a".into(),
            command: "a".into(),
            transport: "acp".into(),
            provider: "p".into(),
            family: "local".into(),
            ..SeatConfig::default()
        };
        let s = Seat::new(cfg, Origin::Configured);
        // What the socket's and HTTP's view show (socket::views::seat).
        assert_eq!(s.status_name(), "probing");
        assert_eq!(s.origin.wire_name(), "configured");
        // Seed 000's enum has no probing: degraded, and no origin member.
        let item = s.plugin_item();
        assert_eq!(item["status"], "degraded");
        assert!(item.get("origin").is_none(), "{item}");
    }

    #[test]
    fn gemini_speaks_acp_with_the_flag_its_help_names() {
        let new = "Options:\n  -m, --model  Model\n      --acp  Starts the agent in ACP mode [boolean]\n      --experimental-acp  Deprecated: use --acp [boolean]\n";
        assert_eq!(gemini_acp_flag(new), Some("--acp"));
        let old = "Options:\n  --experimental-acp  Starts the agent in ACP mode [boolean]\n";
        assert_eq!(gemini_acp_flag(old), Some("--experimental-acp"));
        assert_eq!(
            gemini_acp_flag("Options:\n  --acpx  no\n  -p, --prompt\n"),
            None
        );
    }

    #[test]
    fn detected_seats_have_distinct_harnesses_that_the_config_would_accept() {
        let mut text = String::new();
        for k in &KNOWN {
            text.push_str(&format!(
                "[[seat]]\nharness = {:?}\ncommand = {:?}\ntransport = {:?}\nprovider = {:?}\nfamily = {:?}\n\n",
                k.harness,
                k.commands[0],
                k.transport.wire_name(),
                k.provider,
                k.family
            ));
        }
        let cfg = crate::config::parse(&text).unwrap();
        cfg.check(&text).unwrap();
    }

    #[test]
    fn detection_finds_known_programs_on_path_first_name_first() {
        let dir = std::env::temp_dir().join(format!("detect-{}", crate::ids::prefixed_id("")));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = |name: &str, body: &str| {
            let p = dir.join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        exe("claude", "exit 0");
        exe("claude-code-acp", "exit 0");
        exe("opencode", "exit 0");
        exe("gemini", "echo '  --experimental-acp  ACP mode'");
        std::fs::write(dir.join("codex-acp"), "not executable").unwrap();
        let path = dir.display().to_string();
        let found = detect_on_path(&path);
        let got: Vec<(&str, &str, Vec<String>, bool)> = found
            .iter()
            .map(|f| {
                (
                    f.cfg.harness.as_str(),
                    f.cfg.command.as_str(),
                    f.cfg.args.clone(),
                    f.outcome.is_some(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("claude", "claude", vec![], false),
                ("claude-acp", "claude-code-acp", vec![], false),
                (
                    "gemini",
                    "gemini",
                    vec!["--experimental-acp".to_string()],
                    false
                ),
                ("opencode", "opencode", vec!["acp".to_string()], false),
            ]
        );
        assert_eq!(found[0].cfg.transport, "stream-json");
        assert_eq!(found[2].cfg.family, "google");
        assert_eq!(found[3].cfg.family, "auto");

        // Both adapters: the newer name wins. A gemini whose help names no
        // ACP flag is degraded with the reason.
        exe("claude-agent-acp", "exit 0");
        exe("gemini", "echo '  --prompt  a prompt'");
        let found = detect_on_path(&path);
        assert_eq!(found[1].cfg.command, "claude-agent-acp");
        let outcome = found[2].outcome.clone().unwrap();
        assert_eq!(outcome.status, Status::Degraded);
        assert!(outcome.reason.unwrap().contains("neither --acp"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
