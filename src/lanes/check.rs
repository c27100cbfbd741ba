//! The acceptance command of a lane (issue 5, "checking"): run in a
//! daemon-owned checkout of exactly the lane's commit, isolated, with a time
//! limit, keeping its exit status and the tail of its output.
//!
//! Isolation is bubblewrap: the whole system read-only, the checkout the
//! only writable path, a private /tmp and HOME, new namespaces for
//! everything including the network (so no network), a new session, no
//! capabilities (`--cap-drop ALL`: bwrap keeps root's otherwise, enough to
//! unmount what covers a secret) and `--die-with-parent`. Where bwrap is
//! missing or cannot create namespaces on this machine, the daemon's probe
//! (`crate::isolation`) says so and the lane refuses the task with
//! `isolation-missing` unless the operator configured
//! `lanes.require_isolation = false`.
//!
//! A read-only root still lets a process read files and connect to
//! sockets, so what the daemon hides from agents (`crate::isolation::
//! hidden_for`: its state directory with the ledger and `http.token`, its
//! socket, the user's runtime directory with the session bus and systemd,
//! tmux and X11 sockets) is mounted over here too, and the checkout, which
//! lives in the state directory (`STATE/lanes/co-*`), bound back on top.
//!
//! The checkout is a worktree of the lane's repository: its `.git` names a
//! directory in the repository's common git directory. That directory is
//! bound read-only at its own path, so that git works in the check even
//! when the repository lies under /tmp (which the private /tmp would hide),
//! and so that a check cannot move the repository's refs or write objects.
//! Read-only includes the checkout's own admin directory
//! (`.git/worktrees/NAME`, its HEAD and index): `git status`, `git diff`
//! and `git log` work without writing (git skips refreshing an index it
//! cannot lock), while `git commit`, `git checkout` or `git stash` in a
//! check fail. A check is a test of one commit, not a place to make more.
//!
//! This runs on a lane worker thread: it waits for its own child (never the
//! reactor, which reaps only its own) with poll on a pidfd and the output
//! pipe, so the time limit needs no sleeping and output never fills the pipe.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::errors::io_cause;
use crate::isolation::{Access, Hidden};

/// How the check is contained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Isolation {
    Bwrap(PathBuf),
    /// The operator allowed unisolated checks on a machine without bwrap.
    Unisolated,
}

/// What the check did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Outcome {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// The last bytes of stdout and stderr together, at a character boundary.
    pub tail: String,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.code == Some(0) && !self.timed_out
    }

    /// One line for the lane's record and the builder's rework prompt.
    pub fn summary(&self) -> String {
        if self.timed_out {
            "the acceptance command ran out of time".into()
        } else if let Some(c) = self.code {
            format!("the acceptance command exited with status {c}")
        } else {
            format!(
                "the acceptance command was killed by signal {}",
                self.signal.unwrap_or(0)
            )
        }
    }
}

pub struct Spec<'a> {
    /// The daemon's git, to find the checkout's git directory.
    pub git: &'a crate::lanes::git::Git,
    pub checkout: &'a Path,
    pub command: &'a str,
    pub timeout: Duration,
    pub isolation: &'a Isolation,
    /// What the daemon hides from every sandbox (`crate::isolation`).
    pub hidden: &'a Hidden,
    pub tail_bytes: usize,
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Runs the check and waits for it, at most `timeout`.
pub fn run(spec: &Spec<'_>) -> Result<Outcome, String> {
    let checkout = spec.checkout;
    let mut cmd = match spec.isolation {
        Isolation::Bwrap(bwrap) => {
            let mut c = Command::new(bwrap);
            c.args([
                "--ro-bind",
                "/",
                "/",
                "--dev",
                "/dev",
                "--proc",
                "/proc",
                "--tmpfs",
                "/tmp",
            ]);
            // The checkout's git directory lies in the repository's, which
            // the private /tmp hides when the repository is under /tmp.
            let common = crate::lanes::git::common_dir(spec.git, checkout).ok();
            let mut back = vec![(checkout, Access::Writable)];
            if let Some(g) = common.as_deref().filter(|g| !g.starts_with(checkout)) {
                back.push((g, Access::ReadOnly));
            }
            spec.hidden
                .shown_where(|p| !p.starts_with("/tmp"))
                .mount(&mut c, &back);
            c.args([
                "--unshare-all",
                "--die-with-parent",
                "--new-session",
                "--cap-drop",
                "ALL",
                "--chdir",
            ])
            .arg(checkout)
            .args([
                "--setenv",
                "HOME",
                "/tmp",
                "--",
                "/bin/sh",
                "-c",
                spec.command,
            ]);
            c
        }
        Isolation::Unisolated => {
            let mut c = Command::new("/bin/sh");
            c.args(["-c", spec.command]).current_dir(checkout);
            c
        }
    };
    cmd.env_clear()
        .env("PATH", crate::isolation::search_path())
        .env("LANG", "C.UTF-8")
        .env("HOME", "/tmp")
        .env("CI", "true")
        .stdin(Stdio::null());
    // A new session (pgid == pid, no controlling terminal): the command
    // cannot TIOCSTI into the daemon's terminal, and killpg still reaches it.
    // No signal blocked, whatever the daemon blocks (signals.rs).
    // SAFETY: the closure runs between fork and exec and calls only setsid
    // and `unblock_in_child`, which are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            crate::signals::unblock_in_child()
        });
    }
    let (read_end, write_end) =
        pipe().map_err(|e| format!("unable to make a pipe: {}", io_cause(&e)))?;
    let write2 = write_end
        .try_clone()
        .map_err(|e| format!("unable to make a pipe: {}", io_cause(&e)))?;
    cmd.stdout(Stdio::from(write_end))
        .stderr(Stdio::from(write2));
    let child = cmd
        .spawn()
        .map_err(|e| format!("unable to start the acceptance command: {}", io_cause(&e)))?;
    // The command's copies of the write end are the only ones left once
    // `cmd` is dropped, so end of file means the command and its children
    // closed their output.
    drop(cmd);
    let pid = child.id() as i32;
    let mut child = child;
    // Our own child, not reaped yet: the pid is still its own.
    let pidfd = crate::procs::pidfd_open(pid);
    let mut reader = std::fs::File::from(read_end);
    let mut tail: Vec<u8> = Vec::new();
    let deadline = Instant::now() + spec.timeout;
    let mut out_open = true;
    let mut exited = false;
    let mut timed_out = false;
    while out_open || !exited {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            timed_out = true;
            break;
        }
        let mut fds = Vec::with_capacity(2);
        if out_open {
            fds.push(libc::pollfd {
                fd: reader.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        if let (Some(p), false) = (&pidfd, exited) {
            fds.push(libc::pollfd {
                fd: p.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        } else if pidfd.is_none() && !out_open {
            // No pidfd (old kernel): the output closing is the only signal;
            // wait() below blocks until the command is gone.
            break;
        }
        let ms = left.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a valid array of pollfd of the given length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!(
                "unable to wait for the acceptance command: {}",
                io_cause(&e)
            ));
        }
        for f in &fds {
            if f.revents == 0 {
                continue;
            }
            if out_open && f.fd == reader.as_raw_fd() {
                let mut buf = [0u8; 16 * 1024];
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => out_open = false,
                    Ok(k) => {
                        tail.extend_from_slice(&buf[..k]);
                        if tail.len() > spec.tail_bytes * 2 {
                            let cut = tail.len() - spec.tail_bytes;
                            tail.drain(..cut);
                        }
                    }
                }
            } else {
                exited = true;
            }
        }
    }
    if timed_out {
        // SAFETY: the group id is our unreaped child's pid.
        unsafe { libc::killpg(pid, libc::SIGKILL) };
    }
    let status = child.wait().map_err(|e| {
        format!(
            "unable to wait for the acceptance command: {}",
            io_cause(&e)
        )
    })?;
    use std::os::unix::process::ExitStatusExt;
    let start = tail.len().saturating_sub(spec.tail_bytes);
    let mut text = String::from_utf8_lossy(&tail[start..]).into_owned();
    // A cut through a multi-byte character shows as U+FFFD at the start.
    if text.starts_with('\u{FFFD}') {
        text = text.trim_start_matches('\u{FFFD}').to_string();
    }
    Ok(Outcome {
        code: status.code(),
        signal: status.signal(),
        timed_out,
        tail: text,
    })
}

/// The tests' rule for what a test needs and does not bring (CI fails
/// without it), shared with the tests in tests/; these use part of it.
#[cfg(test)]
#[allow(dead_code)]
#[path = "../../tests/util/need.rs"]
mod need;

#[cfg(test)]
mod tests {
    use super::*;

    static NOTHING: Hidden = Hidden {
        dirs: Vec::new(),
        read_only: Vec::new(),
        files: Vec::new(),
        protected: Vec::new(),
    };
    static HOST_GIT: crate::lanes::git::Git = crate::lanes::git::Git::host();

    fn spec<'a>(dir: &'a Path, cmd: &'a str, iso: &'a Isolation, secs: u64) -> Spec<'a> {
        Spec {
            git: &HOST_GIT,
            checkout: dir,
            command: cmd,
            timeout: Duration::from_secs(secs),
            isolation: iso,
            hidden: &NOTHING,
            tail_bytes: 64,
        }
    }

    #[test]
    fn status_tail_and_timeout() {
        let tmp = crate::testutil::TempDir::new("check");
        let iso = Isolation::Unisolated;
        let o = run(&spec(
            tmp.path(),
            "echo hello; echo oops >&2; exit 3",
            &iso,
            60,
        ))
        .unwrap();
        assert_eq!(o.code, Some(3));
        assert!(!o.passed());
        assert_eq!(o.tail, "hello\noops\n");
        let o = run(&spec(
            tmp.path(),
            "head -c 1000 /dev/zero | tr '\\0' y; true",
            &iso,
            60,
        ))
        .unwrap();
        assert!(o.passed());
        assert_eq!(o.tail.len(), 64);
        // The timeout is the command's own; the test waits for nothing.
        let o = run(&spec(tmp.path(), "exec sleep 600", &iso, 1)).unwrap();
        assert!(o.timed_out && !o.passed());
    }

    #[test]
    // In a new network namespace /proc/net/dev lists only `lo` under its two
    // header lines.
    fn bwrap_confines_writes_and_network() {
        let Some(bwrap) = super::need::have(
            crate::isolation::probe(),
            "the Debian package bubblewrap, where namespaces are allowed",
        ) else {
            return;
        };
        let tmp = crate::testutil::TempDir::new("checkb");
        let iso = Isolation::Bwrap(bwrap);
        let name = format!("outside-{}", crate::ids::secret_hex(4));
        // Next to the checkout: with the checkout under /tmp this is in the
        // sandbox's own /tmp, where a write may succeed but never lands
        // outside; elsewhere it is on the read-only root.
        let sibling = tmp.path().parent().unwrap().join(&name);
        // A directory this test can write to that is outside the checkout
        // and outside /tmp wherever the checkout lives: the sibling's
        // folder unless that is under /tmp, else /var/tmp (FHS: writable
        // by all). The sandbox must refuse the write there.
        let writable = if tmp.path().starts_with("/tmp") {
            PathBuf::from("/var/tmp")
        } else {
            tmp.path().parent().unwrap().to_path_buf()
        };
        let refused = writable.join(&name);
        std::fs::write(&refused, "").unwrap_or_else(|e| {
            panic!(
                "{} must be writable outside the sandbox: {e}",
                writable.display()
            )
        });
        std::fs::remove_file(&refused).unwrap();
        let cmd = format!(
            "echo inside > ok.txt && (echo x > '{}') 2>/dev/null; ! (echo x > '{}') 2>/dev/null && [ \"$(wc -l < /proc/net/dev)\" -eq 3 ] && echo done",
            sibling.display(),
            refused.display()
        );
        let o = run(&spec(tmp.path(), &cmd, &iso, 60));
        let _ = std::fs::remove_file(&refused);
        let o = o.unwrap();
        assert!(o.passed(), "{o:?}");
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("ok.txt")).unwrap(),
            "inside\n"
        );
        assert!(!sibling.exists() && !refused.exists());
    }
}
