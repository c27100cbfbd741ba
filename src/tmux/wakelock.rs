//! The host's wakelock (issue 15, Host; seed 004, `host.setWakelock` and
//! HostWakelock): while it is on, a `systemd-inhibit --what=idle:sleep
//! --mode=block` runs as a child of the daemon, holding logind's inhibitor
//! lock for as long as it lives; turning the lock off ends it.
//!
//! - **Support.** systemd-inhibit needs logind on the system bus. At start
//!   the daemon runs `systemd-inhibit ... true` once on a thread of its own
//!   (at most `WAKELOCK_PROBE_MS`); only if that succeeds is
//!   `capabilities.host_wakelock` true and `host.setWakelock` served.
//!   Without systemd-inhibit on PATH there is no probe. (In a container
//!   without a system bus the probe fails: the lock is refused there, as
//!   the seed says, with `wakelock not supported on this node`.)
//! - **The child** is `systemd-inhibit ... cat`, whose standard input is a
//!   pipe the daemon holds: if the daemon dies, `cat` sees the end of it
//!   and exits, and the lock is not left held by no one. Turning the lock
//!   off closes the pipe and sends SIGTERM. It is started on the reactor
//!   thread, which reaps it (src/daemon/mod.rs, `reap_children`).
//! - **until.** RFC 3339 (`Z` or an offset, fraction optional); empty or
//!   absent turns the lock off; `9999-12-31T23:59:59Z` is until a client
//!   turns it off; an invalid or past until is refused (-32600). A timer
//!   turns it off when until passes (re-armed at most every hour, so a far
//!   date costs one wake-up an hour, and the forever date none).
//! - Neither child inherits NOTIFY_SOCKET: systemd's tools report their
//!   own failure there (`ERRNO=`), which the service manager would take
//!   for the daemon's.
//! - **Restart.** The until in force is kept in `STATE_DIR/wakelock`
//!   (written whole through a temporary file and a rename, removed when
//!   the lock goes off); a daemon that starts finds it and, once the probe
//!   says it can, takes the lock again if until has not passed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::limits;

/// seed 004: "9999-12-31T23:59:59Z keeps it on until a client turns it off".
pub const FOREVER: &str = "9999-12-31T23:59:59Z";

/// The lock held now.
pub struct Held {
    pub until: String,
    pub until_ms: i64,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Drop for Held {
    fn drop(&mut self) {
        // Closing the pipe ends `cat`; SIGTERM ends systemd-inhibit. The
        // reactor reaps it.
        self.stdin.take();
        let _ = self.child.kill();
    }
}

/// The milliseconds of an RFC 3339 time, `None` if it is not one.
pub fn parse_until(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || !s.is_char_boundary(19) {
        return None;
    }
    let (base, mut rest) = s.split_at(19);
    let mut ms = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let f = &frac[..digits];
        ms = format!("{:0<3}", &f[..f.len().min(3)]).parse().ok()?;
        rest = &frac[digits..];
    }
    let offset_ms = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) && &o[3..4] == ":" => {
            let h: i64 = o[1..3].parse().ok()?;
            let m: i64 = o[4..6].parse().ok()?;
            if h > 23 || m > 59 {
                return None;
            }
            let v = (h * 60 + m) * 60_000;
            if o.starts_with('+') { v } else { -v }
        }
        _ => return None,
    };
    let t = crate::clock::parse_ts(&format!("{base}.{ms:03}Z"))?;
    Some(t - offset_ms)
}

/// Whether systemd-inhibit can take a lock here (module comment), or why
/// not.
pub fn probe() -> Result<(), String> {
    let Some(program) = crate::isolation::which("systemd-inhibit") else {
        return Err("no systemd-inhibit on PATH".into());
    };
    let mut cmd = Command::new(program);
    cmd.args(args("omniconfluxd probe"))
        .arg("true")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().map_err(|e| {
        format!(
            "unable to run systemd-inhibit: {}",
            crate::errors::io_cause(&e)
        )
    })?;
    let deadline = Instant::now() + Duration::from_millis(limits::WAKELOCK_PROBE_MS);
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                return Err(format!(
                    "systemd-inhibit cannot take a lock here ({status}; is logind on the system bus?)"
                ));
            }
            Ok(None) if Instant::now() < deadline => {
                // Polling a child this thread alone waits for.
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "systemd-inhibit did not answer in {} ms",
                    limits::WAKELOCK_PROBE_MS
                ));
            }
        }
    }
}

fn args(why: &str) -> Vec<String> {
    vec![
        "--what=idle:sleep".into(),
        "--who=omniconfluxd".into(),
        format!("--why={why}"),
        "--mode=block".into(),
    ]
}

/// Takes the lock until `until` (call on the reactor thread, which reaps
/// the child).
pub fn take(until: &str, until_ms: i64) -> Result<Held, String> {
    let program = crate::isolation::which("systemd-inhibit")
        .ok_or_else(|| "cannot hold the wakelock: no systemd-inhibit on PATH".to_string())?;
    let mut cmd = Command::new(program);
    cmd.args(args(&format!("host.setWakelock until {until}")))
        .arg("cat")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: between fork and exec the closure only empties the signal
    // mask (`unblock_in_child`, async-signal-safe).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, crate::signals::unblock_in_child);
    }
    let mut child = cmd.spawn().map_err(|e| {
        format!(
            "cannot hold the wakelock: unable to run systemd-inhibit: {}",
            crate::errors::io_cause(&e)
        )
    })?;
    let stdin = child.stdin.take();
    Ok(Held {
        until: until.to_string(),
        until_ms,
        child,
        stdin,
    })
}

/// `STATE_DIR/wakelock`.
pub fn state_file(state_dir: &Path) -> PathBuf {
    state_dir.join("wakelock")
}

/// The until kept in the state file, if any.
pub fn saved(state_dir: &Path) -> Option<String> {
    let f = std::fs::File::open(state_file(state_dir)).ok()?;
    let mut s = String::new();
    f.take(128).read_to_string(&mut s).ok()?;
    let s = s.trim().to_string();
    parse_until(&s).map(|_| s)
}

/// Keeps `until` (or removes the file for `None`).
pub fn save(state_dir: &Path, until: Option<&str>) -> Result<(), String> {
    let path = state_file(state_dir);
    let cause = |e: std::io::Error| {
        format!(
            "cannot keep the wakelock in {}: {}",
            path.display(),
            crate::errors::io_cause(&e)
        )
    };
    match until {
        None => match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(cause(e)),
            _ => Ok(()),
        },
        Some(u) => {
            let tmp = state_dir.join("wakelock.tmp");
            std::fs::write(&tmp, format!("{u}\n")).map_err(cause)?;
            std::fs::rename(&tmp, &path).map_err(cause)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_is_rfc_3339_with_z_or_an_offset() {
        assert_eq!(parse_until("1970-01-01T00:00:01Z"), Some(1000));
        assert_eq!(parse_until("1970-01-01T00:00:01.5Z"), Some(1500));
        assert_eq!(parse_until("1970-01-01T01:00:01+01:00"), Some(1000));
        assert_eq!(
            parse_until("1970-01-01T00:00:01-00:30"),
            Some(1000 + 1_800_000)
        );
        assert!(parse_until(FOREVER).is_some());
        for bad in [
            "",
            "tomorrow",
            "1970-01-01 00:00:01Z",
            "1970-01-01T00:00:01",
            "1970-13-01T00:00:00Z",
        ] {
            assert_eq!(parse_until(bad), None, "{bad}");
        }
    }
}
