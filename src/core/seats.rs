//! Seats: the agent harnesses of the config's `[[seat]]` tables and what
//! the daemon knows of each (issue 3, "Seats"; seed 000, seats.list):
//! ready, degraded (installed, something in the way, and why) or missing,
//! and the sign-in state an agent reported.
//!
//! Probing never blocks the reactor: one worker thread at a time resolves
//! each seat's command in PATH and runs `command --version` with stdin,
//! stdout and stderr closed, bounded by `SEAT_PROBE_TIMEOUT_MS`, then hands
//! the results back through the reactor inbox. A probe asked for while one
//! runs is run again once that one is done. The reactor reaps only its own
//! thread's children, not the worker's probe; a wait that fails anyway
//! (ECHILD included) leaves the probe's outcome unknown, and the seat is
//! reported degraded with the cause rather than ready.

use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::agents::{SignInState, Transport};
use crate::config::SeatConfig;
use crate::daemon::Daemon;
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

/// One seat as the daemon knows it.
#[derive(Clone, Debug)]
pub struct Seat {
    pub cfg: SeatConfig,
    pub transport: Transport,
    /// Not probed yet: `None`.
    pub status: Option<Status>,
    pub reason: Option<String>,
    pub program: Option<PathBuf>,
    pub sign_in: Option<SignInState>,
    pub probed_at_ms: Option<i64>,
}

impl Seat {
    fn new(cfg: SeatConfig) -> Seat {
        let transport = Transport::from_wire_name(&cfg.transport).unwrap_or(Transport::Acp);
        Seat {
            cfg,
            transport,
            status: None,
            reason: None,
            program: None,
            sign_in: None,
            probed_at_ms: None,
        }
    }

    fn sign_in_name(&self) -> &'static str {
        match self.sign_in {
            Some(SignInState::SignedIn) => "signed-in",
            Some(SignInState::SignedOut) => "signed-out",
            None => "unknown",
        }
    }

    /// The daemon socket's shape (snake_case).
    pub fn to_socket(&self) -> Value {
        json!({
            "harness": self.cfg.harness,
            "provider": self.cfg.provider,
            "family": self.cfg.family,
            "transport": self.cfg.transport,
            "command": self.cfg.command,
            "args": self.cfg.args,
            "model": self.cfg.model,
            "status": self.status.map(Status::wire_name).unwrap_or("unknown"),
            "reason": self.reason,
            "program": self.program.as_ref().map(|p| p.display().to_string()),
            "sign_in": self.sign_in_name(),
            "probed_at": self.probed_at_ms.map(crate::clock::format_ts),
        })
    }

    /// The plugin wire's seats.list item (seed 000, exactly). A seat not
    /// probed yet is reported missing: it cannot take a task now.
    pub fn plugin_item(&self) -> Value {
        json!({
            "harness": self.cfg.harness,
            "provider": self.cfg.provider,
            "family": self.cfg.family,
            "status": self.status.unwrap_or(Status::Missing).wire_name(),
            "signIn": self.sign_in_name(),
        })
    }
}

/// The registry in config order.
#[derive(Default)]
pub struct Seats {
    pub list: Vec<Seat>,
    probing: bool,
    again: bool,
}

impl Seats {
    /// A probe runs now (its results are not in yet).
    pub fn probing(&self) -> bool {
        self.probing
    }

    pub fn from_config(cfg: &[SeatConfig]) -> Seats {
        Seats {
            list: cfg.iter().cloned().map(Seat::new).collect(),
            probing: false,
            again: false,
        }
    }

    pub fn get(&self, harness: &str) -> Option<&Seat> {
        self.list.iter().find(|s| s.cfg.harness == harness)
    }

    /// Takes a new config (SIGHUP), keeping what is known of unchanged seats.
    pub fn reconfigure(&mut self, cfg: &[SeatConfig]) {
        let old = std::mem::take(&mut self.list);
        self.list = cfg
            .iter()
            .map(|c| match old.iter().find(|s| &s.cfg == c) {
                Some(s) => s.clone(),
                None => Seat::new(c.clone()),
            })
            .collect();
    }

    pub fn note_sign_in(&mut self, harness: &str, state: SignInState) {
        if let Some(s) = self.list.iter_mut().find(|s| s.cfg.harness == harness) {
            s.sign_in = Some(state);
        }
    }
}

/// Probes every seat on a worker thread; see the module comment.
pub fn probe_all(d: &mut Daemon) {
    let seats = &mut d.core.seats;
    if seats.probing {
        seats.again = true;
        return;
    }
    let cfgs: Vec<SeatConfig> = seats.list.iter().map(|s| s.cfg.clone()).collect();
    if cfgs.is_empty() {
        return;
    }
    seats.probing = true;
    let inbox = d.inbox.clone();
    let path_var = crate::core::sessions::search_path();
    let spawned = std::thread::Builder::new()
        .name("seat-probe".into())
        .spawn(move || {
            let results: Vec<(SeatConfig, Status, Option<String>, Option<PathBuf>)> = cfgs
                .into_iter()
                .map(|c| {
                    let (st, why, prog) = probe(&c, &path_var);
                    (c, st, why, prog)
                })
                .collect();
            inbox.run(move |d| {
                let now = crate::clock::now_ms();
                for (cfg, st, why, prog) in results {
                    if let Some(s) = d.core.seats.list.iter_mut().find(|s| s.cfg == cfg) {
                        if s.status != Some(st) {
                            match &why {
                                Some(w) => {
                                    crate::info!("seat {}: {} ({w})", cfg.harness, st.wire_name())
                                }
                                None => crate::info!("seat {}: {}", cfg.harness, st.wire_name()),
                            }
                        }
                        s.status = Some(st);
                        s.reason = why;
                        s.program = prog;
                        s.probed_at_ms = Some(now);
                    }
                }
                d.core.seats.probing = false;
                if std::mem::take(&mut d.core.seats.again) {
                    probe_all(d);
                }
                // Lanes resume once the seats they need are known.
                crate::lanes::controller::seats_probed(d);
            });
        });
    if let Err(e) = spawned {
        crate::warn!(
            "unable to start the seat probe thread: {}",
            crate::errors::io_cause(&e)
        );
        d.core.seats.probing = false;
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

fn probe(cfg: &SeatConfig, path_var: &str) -> (Status, Option<String>, Option<PathBuf>) {
    let program = match resolve(&cfg.command, path_var) {
        Ok(p) => p,
        Err((st, why)) => return (st, Some(why), None),
    };
    let mut cmd = std::process::Command::new(&program);
    cmd.arg("--version")
        .env_clear()
        .env("PATH", path_var)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    for (k, v) in &cfg.env {
        cmd.env(k, v);
    }
    if let Ok(home) = std::env::var("HOME") {
        cmd.env("HOME", home);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return (
                Status::Degraded,
                Some(format!(
                    "unable to run {}: {}",
                    program.display(),
                    crate::errors::io_cause(&e)
                )),
                Some(program),
            );
        }
    };
    let deadline = Instant::now() + Duration::from_millis(limits::SEAT_PROBE_TIMEOUT_MS);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                return if status.success() {
                    (Status::Ready, None, Some(program))
                } else {
                    (
                        Status::Degraded,
                        Some(format!("`{} --version` failed ({status})", cfg.command)),
                        Some(program),
                    )
                };
            }
            // The probe's outcome is unknown: not evidence the tool works.
            Err(e) => {
                return (
                    Status::Degraded,
                    Some(format!(
                        "unable to wait for `{} --version`: {}",
                        cfg.command,
                        crate::errors::io_cause(&e)
                    )),
                    Some(program),
                );
            }
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return (
                    Status::Degraded,
                    Some(format!(
                        "`{} --version` did not finish within {} ms",
                        cfg.command,
                        limits::SEAT_PROBE_TIMEOUT_MS
                    )),
                    Some(program),
                );
            }
            // A worker thread waiting on its probe: polling is how std
            // offers a bounded wait on a child.
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
