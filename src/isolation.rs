//! Whether bubblewrap can isolate processes on this machine: plugins (seed
//! 000; issue 4, "Isolation") and lanes' acceptance commands (issue 5) both
//! ask. Installed is not enough: a container or a unit with
//! RestrictNamespaces= can forbid the namespaces bwrap needs, so the probe
//! runs bwrap once with every namespace the daemon uses.
//!
//! The probe starts a process and waits for it, so it runs once on its own
//! thread after the daemon is ready (never on the start path, never on the
//! reactor), and its answer is handed to the reactor.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The result: the bwrap that works, or why there is none.
pub type Probe = Result<PathBuf, String>;

/// Finds `name` on PATH, or takes it as a path when it has a slash.
pub fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Runs bwrap with a read-only root, new /dev and /proc and every
/// namespace unshared. Blocking.
pub fn probe() -> Probe {
    let bwrap = which("bwrap").ok_or_else(|| "bubblewrap (bwrap) is not installed".to_string())?;
    let out = Command::new(&bwrap)
        .args([
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--unshare-all",
            "--die-with-parent",
            "true",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| {
            format!(
                "unable to run {}: {}",
                bwrap.display(),
                crate::errors::io_cause(&e)
            )
        })?;
    if out.status.success() {
        Ok(bwrap)
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(format!(
            "bubblewrap cannot create namespaces here: {}",
            err.lines().next().unwrap_or("it failed").trim()
        ))
    }
}

/// Runs the probe on its own thread and calls `done` on the reactor with
/// the answer.
pub fn probe_later(
    inbox: crate::reactor::Inbox,
    done: impl FnOnce(&mut crate::daemon::Daemon, Probe) + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("isolation-probe".into())
        .spawn(move || {
            let r = probe();
            inbox.run(move |d| done(d, r));
        })?;
    Ok(())
}
