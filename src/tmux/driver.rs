//! The tmux driver (issue 15, "A tmux driver"): every call the daemon
//! makes to a tmux server, run as `tmux -L NAME ARGS...` or `tmux -S PATH
//! ARGS...` with no shell in between, its output read up to a bound and
//! its run cut off after `TMUX_CALL_TIMEOUT_MS`.
//!
//! Blocking: these functions run on the tmux workers (`super::worker`),
//! never on the reactor.
//!
//! A server is always named explicitly (`-L default` rather than no flag):
//! tmux would otherwise pick the server of `$TMUX` when the daemon itself
//! was started inside a pane. `$TMUX` and `$TMUX_PANE` are removed from the
//! environment of every call for the same reason, and so that
//! `new-session` does not refuse to nest; so are the service manager's
//! variables (`NOTIFY_SOCKET`, `LISTEN_*`, `WATCHDOG_*`), which a server
//! started by a call would hand to every pane. `$TMUX_TMPDIR` is kept: it is
//! where tmux puts the sockets of named servers, as for the operator's own
//! `tmux` command.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::limits;

/// How to reach one tmux server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Socket {
    /// `-L NAME`: a named server in tmux's socket directory.
    Name(String),
    /// `-S PATH`: a server on this socket file.
    Path(PathBuf),
}

/// A tmux server the daemon looks at: the name its session ids carry
/// (`default`, `omniconflux`) and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    pub name: String,
    pub socket: Socket,
}

/// Why a tmux call failed, as one lowercase line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TmuxError(pub String);

impl std::fmt::Display for TmuxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

type Result<T> = std::result::Result<T, TmuxError>;

/// One pane as `list-panes -a` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pane {
    pub pane_id: String,
    pub session_name: String,
    pub window_index: u32,
    pub window_id: String,
    pub pid: i32,
    pub command: String,
    pub current_path: String,
    pub in_mode: bool,
}

/// The fields of [`Pane`], in order, separated by the unit separator
/// (0x1f): no session name, command or path a person types holds it.
const PANE_FORMAT: &str = "#{pane_id}\x1f#{session_name}\x1f#{window_index}\x1f#{window_id}\x1f#{pane_pid}\x1f#{pane_current_command}\x1f#{pane_current_path}\x1f#{pane_in_mode}";

/// `tmux` on `server` with `args`, its environment cleaned and its signal
/// mask emptied (module comment); stdio is the caller's to set.
pub fn command(server: &Server, args: &[&str]) -> Command {
    let mut cmd = Command::new("tmux");
    match &server.socket {
        Socket::Name(n) => cmd.arg("-L").arg(n),
        Socket::Path(p) => cmd.arg("-S").arg(p),
    };
    cmd.args(args);
    // A server this call starts keeps its environment for every pane: none
    // of the service manager's hand-overs to the daemon reaches them.
    for k in [
        "TMUX",
        "TMUX_PANE",
        "NOTIFY_SOCKET",
        "LISTEN_PID",
        "LISTEN_FDS",
        "LISTEN_FDNAMES",
        "WATCHDOG_PID",
        "WATCHDOG_USEC",
    ] {
        cmd.env_remove(k);
    }
    // A server this call starts, and every pane of it, would otherwise keep
    // the signals the daemon blocks for its signal thread (src/signals.rs):
    // panes that ignore SIGHUP and SIGTERM, a kill-server that never ends.
    // SAFETY: the closure runs between fork and exec and calls only
    // `unblock_in_child`, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(crate::signals::unblock_in_child);
    }
    cmd
}

/// Runs `tmux` on `server` with `args`; its stdout when it exits 0, read
/// up to `max` bytes. More output, a run longer than the timeout, or a
/// failure is an error naming the subcommand and tmux's first line.
pub fn run(server: &Server, args: &[&str], max: usize) -> Result<String> {
    let what = args.first().copied().unwrap_or("tmux");
    let mut cmd = command(server, args);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| {
        TmuxError(format!(
            "unable to run tmux {what}: {}",
            crate::errors::io_cause(&e)
        ))
    })?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let read = read_both(&mut child, &mut out, &mut err, max);
    if read.is_err() {
        let _ = child.kill();
    }
    let status = child.wait();
    read.map_err(|why| TmuxError(format!("tmux {what} on server {}: {why}", server.name)))?;
    let ok = status.as_ref().is_ok_and(|s| s.success());
    if !ok {
        let text = String::from_utf8_lossy(&err);
        let first = text
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("failed")
            .trim()
            .to_lowercase();
        return Err(TmuxError(format!(
            "tmux {what} on server {}: {first}",
            server.name
        )));
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Reads the child's stdout (up to `max` bytes) and stderr (up to
/// `TMUX_STDERR_MAX_BYTES`) until both close, within the call timeout.
fn read_both(
    child: &mut std::process::Child,
    out: &mut Vec<u8>,
    err: &mut Vec<u8>,
    max: usize,
) -> std::result::Result<(), String> {
    let deadline = Instant::now() + Duration::from_millis(limits::TMUX_CALL_TIMEOUT_MS);
    let mut pipes: Vec<(Box<dyn Read>, i32, bool)> = Vec::new();
    if let Some(o) = child.stdout.take() {
        let fd = o.as_raw_fd();
        pipes.push((Box::new(o), fd, true));
    }
    if let Some(e) = child.stderr.take() {
        let fd = e.as_raw_fd();
        pipes.push((Box::new(e), fd, false));
    }
    let mut buf = vec![0u8; 64 * 1024];
    while !pipes.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "no answer within {} ms",
                limits::TMUX_CALL_TIMEOUT_MS
            ));
        }
        let mut fds: Vec<libc::pollfd> = pipes
            .iter()
            .map(|(_, fd, _)| libc::pollfd {
                fd: *fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures
        // for the duration of the call; the descriptors are owned by the
        // pipes in `pipes`, which outlive it.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!(
                "unable to wait for output: {}",
                crate::errors::io_cause(&e)
            ));
        }
        let mut closed = Vec::new();
        for (i, p) in fds.iter().enumerate() {
            if p.revents == 0 {
                continue;
            }
            let (pipe, _, is_out) = &mut pipes[i];
            match pipe.read(&mut buf) {
                Ok(0) => closed.push(i),
                Ok(k) => {
                    let (sink, cap) = if *is_out {
                        (&mut *out, max)
                    } else {
                        (&mut *err, limits::TMUX_STDERR_MAX_BYTES)
                    };
                    if sink.len() + k > cap {
                        if *is_out {
                            return Err(format!("output exceeds {cap} bytes"));
                        }
                        // Past the bound, stderr is drained and dropped.
                        let room = cap - sink.len();
                        sink.extend_from_slice(&buf[..room]);
                    } else {
                        sink.extend_from_slice(&buf[..k]);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("unable to read: {}", crate::errors::io_cause(&e))),
            }
        }
        for i in closed.into_iter().rev() {
            pipes.remove(i);
        }
    }
    Ok(())
}

/// Whether a failure means only that the server is not running: no panes,
/// not an error.
pub fn not_running(e: &TmuxError) -> bool {
    [
        "no server running",
        "server exited unexpectedly",
        "error connecting",
    ]
    .iter()
    .any(|s| e.0.contains(s))
}

/// Every pane of `server`, at most `TMUX_PANES_MAX`; none when the server
/// is not running.
pub fn list_panes(server: &Server) -> Result<Vec<Pane>> {
    let text = match run(
        server,
        &["list-panes", "-a", "-F", PANE_FORMAT],
        limits::TMUX_LIST_MAX_BYTES,
    ) {
        Ok(t) => t,
        Err(e) if not_running(&e) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(text
        .lines()
        .filter_map(parse_pane)
        .take(limits::TMUX_PANES_MAX)
        .collect())
}

fn parse_pane(line: &str) -> Option<Pane> {
    let f: Vec<&str> = line.split('\x1f').collect();
    if f.len() != 8 || !f[0].starts_with('%') {
        return None;
    }
    Some(Pane {
        pane_id: f[0].to_string(),
        session_name: f[1].to_string(),
        window_index: f[2].parse().ok()?,
        window_id: f[3].to_string(),
        pid: f[4].parse().ok()?,
        command: f[5].to_string(),
        current_path: f[6].to_string(),
        in_mode: f[7] == "1",
    })
}

/// Whether `s` is a pane id as tmux writes one: `%` and digits.
pub fn is_pane_id(s: &str) -> bool {
    s.strip_prefix('%')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The visible screen of a pane, as plain text.
pub fn capture(server: &Server, pane: &str) -> Result<String> {
    run(
        server,
        &["capture-pane", "-p", "-t", pane],
        limits::TMUX_CAPTURE_MAX_BYTES,
    )
}

/// Leaves copy mode (and any other mode) of a pane; nothing when it is
/// in none.
pub fn leave_modes(server: &Server, pane: &str) -> Result<()> {
    run(server, &["copy-mode", "-q", "-t", pane], 0).map(drop)
}

/// Types `text` into a pane literally: no key name in it is interpreted.
pub fn send_text(server: &Server, pane: &str, text: &str) -> Result<()> {
    run(server, &["send-keys", "-t", pane, "-l", "--", text], 0).map(drop)
}

/// Sends named keys (`Enter`, `C-c`, `Escape`, `Up`...) to a pane, in
/// order; a name tmux does not know is typed as it is.
pub fn send_keys(server: &Server, pane: &str, keys: &[String]) -> Result<()> {
    let mut args = vec!["send-keys", "-t", pane, "--"];
    args.extend(keys.iter().map(String::as_str));
    run(server, &args, 0).map(drop)
}

/// Makes the pane its window's active pane and the window its session's
/// current window, so that a client attached to the session shows it.
pub fn focus(server: &Server, pane: &str) -> Result<()> {
    run(server, &["select-window", "-t", pane], 0)?;
    run(server, &["select-pane", "-t", pane], 0).map(drop)
}

/// Kills a pane (and with it its window or session when it was the last).
pub fn kill_pane(server: &Server, pane: &str) -> Result<()> {
    run(server, &["kill-pane", "-t", pane], 0).map(drop)
}

/// Starts `argv` (executed directly, without a shell) in `cwd` in a new
/// window of session `session` when it exists, or in a new detached
/// session of that name; returns the new pane's id.
pub fn new_pane(server: &Server, session: &str, cwd: &str, argv: &[String]) -> Result<String> {
    let has = run(server, &["has-session", "-t", &format!("={session}")], 0).is_ok();
    let mut args: Vec<&str> = if has {
        vec!["new-window", "-d", "-P", "-F", "#{pane_id}", "-t"]
    } else {
        vec!["new-session", "-d", "-P", "-F", "#{pane_id}", "-s"]
    };
    let target = if has {
        format!("={session}:")
    } else {
        session.to_string()
    };
    args.push(&target);
    args.extend(["-c", cwd, "--"]);
    args.extend(argv.iter().map(String::as_str));
    let out = run(server, &args, limits::TMUX_STDERR_MAX_BYTES)?;
    let id = out.trim().to_string();
    if is_pane_id(&id) {
        Ok(id)
    } else {
        Err(TmuxError(format!(
            "tmux did not name the new pane on server {}",
            server.name
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pane_line_is_read_field_by_field_and_others_are_skipped() {
        let line = "%3\x1fwork\x1f2\x1f@4\x1f1234\x1fclaude\x1f/srv/a b\x1f1";
        assert_eq!(
            parse_pane(line),
            Some(Pane {
                pane_id: "%3".into(),
                session_name: "work".into(),
                window_index: 2,
                window_id: "@4".into(),
                pid: 1234,
                command: "claude".into(),
                current_path: "/srv/a b".into(),
                in_mode: true,
            })
        );
        assert_eq!(parse_pane("garbage"), None);
        assert_eq!(parse_pane("%3\x1fa\x1fx\x1f@1\x1f1\x1fc\x1f/\x1f0"), None);
    }

    #[test]
    fn pane_ids_are_a_percent_sign_and_digits() {
        assert!(is_pane_id("%0"));
        assert!(is_pane_id("%123"));
        assert!(!is_pane_id("%"));
        assert!(!is_pane_id("3"));
        assert!(!is_pane_id("%3;kill-server"));
    }
}
