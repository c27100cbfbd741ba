//! Live terminals on tmux panes (issue 15; seed 004, Terminals): a real
//! tmux client attached in a pseudo-terminal the daemon owns, its output
//! handed on in chunks of at most 32 KiB, keystrokes and sizes written
//! back.
//!
//! To show the session's window without moving the operator's own clients
//! (attaching to the pane's session would change its current window for
//! everyone), each terminal attaches to a new *viewer* session grouped with
//! the pane's session (`new-session -t`), named `omniconflux-view-N`, with
//! its status line off, on the pane's window, and destroyed by tmux when
//! the client detaches (`destroy-unattached`, set by a `client-attached`
//! hook: set before, it would end the session at once), and killed by the
//! daemon when it closes the terminal. The first output is the
//! client's own full redraw. The client's size is the terminal's, and
//! tmux sizes the real window to its latest client, so a resize reaches
//! the window. Discovery skips viewer sessions.
//!
//! Threads: one per terminal sets it up and then writes its input (a
//! bounded queue of `TERMINAL_INPUT_QUEUE` chunks, refused when full), one
//! reads its output. Both end when the client exits or the terminal is
//! closed; at most `TERMINALS_MAX` terminals are open.
//!
//! A session without a pane (one the daemon drives over ACP or
//! stream-json) is shown in a *viewer pane* (seed 004: "for a session
//! without a pane, the node first creates a viewer pane"): a session of
//! the daemon's own server, made for this terminal alone in the session's
//! directory, named `omniconflux-view-N-PID-feed` (so discovery skips
//! it), whose pane follows the session's transcript (src/tmux/viewer.rs
//! says how). It is killed when the terminal ends.

use crossbeam_channel::{Receiver, Sender, bounded};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::Arc;

use super::driver::{self, Server};
use crate::limits;

/// The prefix of the viewer sessions' names.
pub const VIEWER_PREFIX: &str = "omniconflux-view-";

/// What to attach to.
#[derive(Clone, Debug)]
pub struct Spec {
    pub server: Server,
    pub session_name: String,
    /// The window to show; `None`: the session's current one.
    pub window_index: Option<u32>,
    /// A tmux target in the window shown, for the `client_pane` check.
    pub pane: String,
    pub cols: u16,
    pub rows: u16,
    /// The client's own pane (seed 004's `client_pane`): the open is
    /// refused when it is in the window shown.
    pub client_pane: Option<String>,
    /// The error when the session is gone, and when `client_pane` is in
    /// its window (seed 004's texts for a session and for a terminal).
    pub gone: String,
    pub refusal: String,
    /// Made first, for a session without a pane: then `session_name` and
    /// `pane` are ignored.
    pub feed: Option<Feed>,
}

/// A viewer pane to make for a session without a pane: the directory it
/// starts in and what it follows (src/tmux/viewer.rs).
#[derive(Clone, Debug)]
pub struct Feed {
    pub cwd: std::path::PathBuf,
    pub source: super::viewer::Source,
}

/// The name of terminal `term`'s viewer pane session.
fn feed_name(term: u64) -> String {
    format!("{VIEWER_PREFIX}{term}-{}-feed", std::process::id())
}

/// What the daemon sends a terminal.
#[derive(Debug)]
pub enum Input {
    Data(Vec<u8>),
    Resize(u16, u16),
    Close,
}

/// What a terminal reports; `term` is the number the daemon gave it.
#[derive(Debug)]
pub enum Event {
    Opened { term: u64 },
    Failed { term: u64, why: String },
    Output { term: u64, data: Vec<u8> },
    Exited { term: u64 },
}

/// Sends a terminal's events to the daemon.
pub type Sink = Arc<dyn Fn(Event) + Send + Sync>;

/// Starts terminal `term`; its events go to `sink`. The sender takes its
/// input; dropping it closes the terminal.
pub fn open(term: u64, spec: Spec, sink: Sink) -> Result<Sender<Input>, String> {
    let (tx, rx) = bounded(limits::TERMINAL_INPUT_QUEUE);
    std::thread::Builder::new()
        .name(format!("term-{term}"))
        .spawn(move || {
            match attach(term, &spec, sink.clone()) {
                Ok((master, pid, viewer)) => {
                    sink(Event::Opened { term });
                    write_loop(&master, pid, &rx);
                    let _ = driver::run(
                        &spec.server,
                        &["kill-session", "-t", &format!("={viewer}")],
                        0,
                    );
                }
                Err(why) => sink(Event::Failed { term, why }),
            }
            if spec.feed.is_some() {
                let _ = driver::run(
                    &spec.server,
                    &["kill-session", "-t", &format!("={}", feed_name(term))],
                    0,
                );
            }
        })
        .map_err(|e| {
            format!(
                "unable to start a terminal thread: {}",
                crate::errors::io_cause(&e)
            )
        })?;
    Ok(tx)
}

/// Makes the viewer session, the pseudo-terminal and the client, and
/// starts the reader; the master side, the client's pid and the viewer's
/// name.
fn attach(term: u64, spec: &Spec, sink: Sink) -> Result<(OwnedFd, i32, String), String> {
    let s = &spec.server;
    let (cols, rows) = (spec.cols.to_string(), spec.rows.to_string());
    let (session_name, pane) = match &spec.feed {
        None => (spec.session_name.clone(), spec.pane.clone()),
        Some(f) => {
            let name = feed_name(term);
            let cwd = f.cwd.display().to_string();
            let file = super::viewer::start(term, &f.source)?;
            let file = file.display().to_string();
            let args = [
                "new-session",
                "-d",
                "-s",
                &name,
                "-x",
                &cols,
                "-y",
                &rows,
                "-c",
                &cwd,
                "--",
                "tail",
                "-n",
                "+1",
                "-f",
                &file,
            ];
            driver::run(s, &args, 0).map_err(|e| e.0)?;
            let pane = format!("={name}:");
            (name, pane)
        }
    };
    if let Some(cp) = &spec.client_pane {
        let window = |t: &str| driver::run(s, &["display", "-p", "-t", t, "#{window_id}"], 256);
        let ours = window(&pane).map_err(|_| spec.gone.clone())?;
        if window(cp).is_ok_and(|t| t.trim() == ours.trim()) {
            return Err(spec.refusal.clone());
        }
    }
    // `new-session -t` of a session that does not exist would make a new
    // group of that name rather than fail.
    let group = format!("={session_name}");
    if driver::run(s, &["has-session", "-t", &group], 0).is_err() {
        return Err(spec.gone.clone());
    }
    let viewer = format!("{VIEWER_PREFIX}{term}-{}", std::process::id());
    let made = driver::run(
        s,
        &[
            "new-session",
            "-d",
            "-s",
            &viewer,
            "-t",
            &group,
            "-x",
            &cols,
            "-y",
            &rows,
        ],
        0,
    );
    if let Err(e) = made {
        return Err(if e.0.contains("can't find session") {
            spec.gone.clone()
        } else {
            e.0
        });
    }
    let mut steps = vec![
        vec!["set-option", "-t", &viewer, "status", "off"],
        // On now it would end the session before the client attaches.
        vec![
            "set-hook",
            "-t",
            &viewer,
            "client-attached",
            "set-option destroy-unattached on",
        ],
    ];
    let target = spec
        .window_index
        .map(|w| format!("={viewer}:{w}"))
        .unwrap_or_default();
    if !target.is_empty() {
        steps.push(vec!["select-window", "-t", &target]);
    }
    for args in steps {
        if let Err(e) = driver::run(s, &args, 0) {
            let _ = driver::run(s, &["kill-session", "-t", &format!("={viewer}")], 0);
            return Err(e.0);
        }
    }
    let (master, slave) = pty(spec.cols, spec.rows)?;
    let mut cmd = driver::command(s, &["attach-session", "-t", &format!("={viewer}")]);
    let dup = |f: &OwnedFd| {
        f.try_clone()
            .map(Stdio::from)
            .map_err(|e| crate::errors::io_cause(&e))
    };
    cmd.stdin(dup(&slave)?)
        .stdout(dup(&slave)?)
        .stderr(dup(&slave)?)
        .env("TERM", "xterm-256color");
    // SAFETY: between fork and exec the closure calls only setsid, ioctl
    // and `unblock_in_child`, which are async-signal-safe; fd 0 is the
    // slave the child was given.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            crate::signals::unblock_in_child()
        });
    }
    let child = cmd.spawn().map_err(|e| {
        let _ = driver::run(s, &["kill-session", "-t", &format!("={viewer}")], 0);
        format!(
            "unable to run tmux attach-session: {}",
            crate::errors::io_cause(&e)
        )
    })?;
    drop(slave);
    let pid = child.id() as i32;
    let reader = master
        .try_clone()
        .map_err(|e| crate::errors::io_cause(&e))?;
    std::thread::Builder::new()
        .name(format!("term-{term}-out"))
        .spawn(move || read_loop(term, reader, child, sink))
        .map_err(|e| {
            format!(
                "unable to start a terminal thread: {}",
                crate::errors::io_cause(&e)
            )
        })?;
    Ok((master, pid, viewer))
}

/// A pseudo-terminal of `cols` × `rows`: (master, slave).
fn pty(cols: u16, rows: u16) -> Result<(OwnedFd, OwnedFd), String> {
    let (mut m, mut s) = (-1, -1);
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two descriptors into `m` and `s`; the name
    // and termios pointers may be null, `ws` is a valid winsize.
    let r = unsafe { libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), &ws) };
    if r != 0 {
        return Err(format!(
            "unable to open a pseudo-terminal: {}",
            crate::errors::io_cause(&std::io::Error::last_os_error())
        ));
    }
    // SAFETY: openpty succeeded: both are open descriptors owned by no one
    // else. Close-on-exec, so that no other child inherits them.
    unsafe {
        libc::fcntl(m, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(s, libc::F_SETFD, libc::FD_CLOEXEC);
        Ok((OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)))
    }
}

fn read_loop(term: u64, master: OwnedFd, mut child: std::process::Child, sink: Sink) {
    let mut f = std::fs::File::from(master);
    let mut buf = vec![0u8; limits::TERMINAL_CHUNK_BYTES];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => sink(Event::Output {
                term,
                data: buf[..n].to_vec(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // EIO: the client closed the slave side.
            Err(_) => break,
        }
    }
    let _ = child.wait();
    sink(Event::Exited { term });
}

fn write_loop(master: &OwnedFd, pid: i32, rx: &Receiver<Input>) {
    let Ok(w) = master.try_clone() else {
        return;
    };
    let mut w = std::fs::File::from(w);
    for input in rx.iter() {
        match input {
            Input::Data(d) => {
                if w.write_all(&d).is_err() {
                    break;
                }
            }
            Input::Resize(cols, rows) => {
                let ws = libc::winsize {
                    ws_row: rows,
                    ws_col: cols,
                    ws_xpixel: 0,
                    ws_ypixel: 0,
                };
                // SAFETY: TIOCSWINSZ on an open pty master with a valid
                // winsize; the kernel then sends the client SIGWINCH.
                unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ as _, &ws) };
            }
            Input::Close => break,
        }
    }
    // The client detaches on SIGHUP, as when its terminal goes away.
    // SAFETY: kill with the pid of the client this thread started, which
    // its reader thread has not waited for before the client exits.
    unsafe { libc::kill(pid, libc::SIGHUP) };
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (seed 004: "data is standard base64").
pub fn b64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard base64 with padding; `None` for anything else.
pub fn b64_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if b.len() % 4 != 0 {
        return None;
    }
    let val = |c: u8| B64.iter().position(|x| *x == c).map(|p| p as u32);
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for (i, q) in b.chunks(4).enumerate() {
        let last = i == b.len() / 4 - 1;
        let pad = q.iter().rev().take_while(|c| **c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for (j, c) in q.iter().enumerate() {
            let v = if j >= 4 - pad { 0 } else { val(*c)? };
            n = n << 6 | v;
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_refuses_what_is_not_standard() {
        for s in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            b"fooba",
            b"foobar",
            &[0xff, 0xfe, 0],
        ] {
            assert_eq!(b64_decode(&b64_encode(s)).as_deref(), Some(s));
        }
        assert_eq!(b64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(b64_encode(b"fo"), "Zm8=");
        for bad in [
            "Zm8", "Zm8===", "Z===", "Zm=8", "Zm9v!mFy", "Zg==Zg==", "Zm9v-mFy",
        ] {
            assert_eq!(b64_decode(bad), None, "{bad}");
        }
    }
}
