//! `omniconfluxd attach SESSION` and `attach --terminal ID` (issue 15, "The
//! operator CLI"): the live terminal of a tmux session's pane, or of a
//! persistent terminal, in the terminal the command runs in, through the
//! daemon socket's `terminal.open/input/resize/close` and the
//! `terminal.output`s it sends (seed 004, Terminals).
//!
//! - Standard input must be a terminal; it is put in raw mode (termios,
//!   `cfmakeraw`) so that every key, Ctrl-C included, goes to the pane,
//!   and its settings are put back on every way out: a detach, the pane
//!   exiting, another client taking the terminal, the daemon going, an
//!   error, SIGTERM, SIGHUP, SIGINT or SIGQUIT sent to the command, and a
//!   panic (the guard restores on unwinding).
//! - The size is the terminal's (TIOCGWINSZ) when it opens, and is sent
//!   again on each SIGWINCH.
//! - The detach key is Ctrl-] (byte 0x1d, as telnet's escape): the keys
//!   typed before it in the same read are sent, the rest dropped, and the
//!   terminal is closed (`terminal.close`), leaving the pane running.
//! - Exit status: 0 after a detach or when the pane exits; 1 when another
//!   client took the terminal (`evicted`), the daemon closed the
//!   connection, or a call failed; 2 when standard input is no terminal.
//!
//! Threads: one reads standard input, one reads the socket, one takes the
//! signals (blocked in every thread and taken with sigwait, as the daemon
//! does, src/signals.rs); each hands what it got to the main thread over
//! one bounded channel, and only the main thread writes to the socket and
//! to standard output.

use crossbeam_channel::{Sender, bounded};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::os::unix::net::UnixStream;
use std::path::Path;

use super::Failure;
use super::args::usage;
use crate::limits;
use crate::tmux::terminal::{b64_decode, b64_encode};

/// The detach key (module comment).
pub const DETACH_KEY: u8 = 0x1d;

pub const USAGE: &str = "\
attach SESSION | attach --terminal ID
                              the live terminal of a tmux session's pane, or
                              of a persistent terminal, in this terminal;
                              Ctrl-] detaches";

/// Signals taken while attached: a resize, and those that end the command.
const SIGNALS: [libc::c_int; 5] = [
    libc::SIGWINCH,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
];

enum Ev {
    Keys(Vec<u8>),
    StdinClosed,
    Frame(Value),
    SocketClosed(String),
    Signal(libc::c_int),
}

/// The terminal's settings before raw mode, put back when dropped.
struct Raw {
    saved: libc::termios,
}

impl Raw {
    fn enter() -> std::io::Result<Raw> {
        let mut t = MaybeUninit::<libc::termios>::uninit();
        // SAFETY: fd 0 is open (a terminal, checked by the caller);
        // tcgetattr fills `t` when it returns 0, and only then is it read.
        let saved = unsafe {
            if libc::tcgetattr(0, t.as_mut_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            t.assume_init()
        };
        let mut raw = saved;
        // SAFETY: `raw` is an initialised termios; cfmakeraw only writes
        // its fields, and tcsetattr reads it.
        unsafe {
            libc::cfmakeraw(&mut raw);
            if libc::tcsetattr(0, libc::TCSAFLUSH, &raw) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(Raw { saved })
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: `saved` is the termios tcgetattr gave for fd 0.
        unsafe { libc::tcsetattr(0, libc::TCSAFLUSH, &self.saved) };
    }
}

/// The size of the terminal on fd 0, or the seed's default.
fn size() -> (u16, u16) {
    let mut ws = MaybeUninit::<libc::winsize>::zeroed();
    // SAFETY: TIOCGWINSZ writes a winsize into the pointer it is given,
    // which points at one; a zeroed winsize is a valid one if it fails.
    let ws = unsafe {
        libc::ioctl(0, libc::TIOCGWINSZ as _, ws.as_mut_ptr());
        ws.assume_init()
    };
    if ws.ws_col == 0 || ws.ws_row == 0 {
        (limits::TERMINAL_DEFAULT_COLS, limits::TERMINAL_DEFAULT_ROWS)
    } else {
        (ws.ws_col, ws.ws_row)
    }
}

fn is_tty() -> bool {
    // SAFETY: isatty only reads the descriptor number.
    unsafe { libc::isatty(0) == 1 }
}

fn signal_set() -> libc::sigset_t {
    let mut set = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set before sigaddset and the
    // read; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for s in SIGNALS {
            libc::sigaddset(set.as_mut_ptr(), s);
        }
        set.assume_init()
    }
}

/// Blocks [`SIGNALS`] in this thread (and the threads it starts after),
/// and starts the thread that takes them.
fn take_signals(tx: Sender<Ev>) -> Result<(), Failure> {
    let set = signal_set();
    // SAFETY: `set` is initialised; a null old set is allowed.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if r != 0 {
        return Err(fail("unable to block signals".into()));
    }
    std::thread::Builder::new()
        .name("attach-signals".into())
        .spawn(move || {
            loop {
                let mut sig: libc::c_int = 0;
                // SAFETY: `set` is initialised and `sig` is a valid out
                // pointer.
                if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                    continue;
                }
                if tx.send(Ev::Signal(sig)).is_err() {
                    return;
                }
            }
        })
        .map(drop)
        .map_err(|e| fail(format!("unable to start a thread: {e}")))
}

fn fail(message: String) -> Failure {
    Failure {
        status: super::EXIT_ERROR,
        message,
    }
}

/// One request line; attach does not wait for its answer, except for
/// terminal.open.
fn line(id: u64, method: &str, params: Value) -> Vec<u8> {
    let mut l = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
        .to_string()
        .into_bytes();
    l.push(b'\n');
    l
}

/// `attach SESSION | attach --terminal ID`.
pub fn attach(socket: &Path, rest: &[String]) -> Result<(), Failure> {
    let (key, target) = match rest {
        [t, id] if t == "--terminal" => ("terminal_id", id.clone()),
        [id] if !id.starts_with('-') => ("session_id", id.clone()),
        [] => return Err(usage("missing session id")),
        _ => return Err(usage(USAGE)),
    };
    if !is_tty() {
        return Err(usage("attach needs a terminal on standard input"));
    }
    let mut client = super::client::Client::connect(socket)?;
    if key == "session_id" {
        // The daemon opens a terminal on a session of its last scan: a
        // list brings a stale one up to date.
        client.call("sessions.list", json!({}))?;
    }
    drop(client);
    let (tx, rx) = bounded::<Ev>(64);
    take_signals(tx.clone())?;
    let stream = UnixStream::connect(socket)
        .map_err(|e| fail(format!("no daemon answers on {}: {e}", socket.display())))?;
    let mut writer = stream
        .try_clone()
        .map_err(|e| fail(format!("unable to use the socket: {e}")))?;
    let term_id = format!("attach-{}", std::process::id());
    let (cols, rows) = size();
    let mut next_id = 1u64;
    let open_id = next_id;
    writer
        .write_all(&line(
            open_id,
            "terminal.open",
            json!({"term_id": term_id, key: target, "cols": cols, "rows": rows}),
        ))
        .map_err(|e| fail(format!("unable to send terminal.open: {e}")))?;
    let socket_tx = tx.clone();
    let mut client = super::client::Client::from_stream(stream)
        .map_err(|e| fail(format!("unable to use the socket: {e}")))?;
    std::thread::Builder::new()
        .name("attach-socket".into())
        .spawn(move || {
            loop {
                match client.read_frame() {
                    Ok(Some(v)) => {
                        if socket_tx.send(Ev::Frame(v)).is_err() {
                            return;
                        }
                    }
                    Ok(None) => {
                        let _ = socket_tx
                            .send(Ev::SocketClosed("the daemon closed the connection".into()));
                        return;
                    }
                    Err(e) => {
                        let _ = socket_tx.send(Ev::SocketClosed(format!("{e:?}")));
                        return;
                    }
                }
            }
        })
        .map_err(|e| fail(format!("unable to start a thread: {e}")))?;
    // Until terminal.open is answered nothing else is sent: its error is
    // printed on a terminal still in its own mode.
    let mut early = Vec::new();
    loop {
        match rx.recv() {
            Ok(Ev::Frame(v)) if v.get("id") == Some(&json!(open_id)) => {
                if let Some(e) = v.get("error") {
                    return Err(fail(format!(
                        "{}: {}",
                        e["data"]["code"].as_str().unwrap_or("error"),
                        e["message"].as_str().unwrap_or("")
                    )));
                }
                break;
            }
            Ok(Ev::Frame(v)) => early.push(v),
            Ok(Ev::SocketClosed(why)) => return Err(fail(why)),
            Ok(Ev::Signal(libc::SIGWINCH)) => {}
            Ok(Ev::Signal(_)) => return Ok(()),
            Ok(_) => {}
            Err(_) => return Err(fail("attach: every reader stopped".into())),
        }
    }
    let raw =
        Raw::enter().map_err(|e| fail(format!("unable to put the terminal in raw mode: {e}")))?;
    let stdin_tx = tx;
    std::thread::Builder::new()
        .name("attach-stdin".into())
        .spawn(move || {
            let mut buf = vec![0u8; 4096];
            let mut stdin = std::io::stdin().lock();
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = stdin_tx.send(Ev::StdinClosed);
                        return;
                    }
                    Ok(n) => {
                        if stdin_tx.send(Ev::Keys(buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        })
        .map_err(|e| fail(format!("unable to start a thread: {e}")))?;
    let mut out = std::io::stdout().lock();
    let mut send = |w: &mut UnixStream, method: &str, params: Value| -> Result<(), Failure> {
        next_id += 1;
        w.write_all(&line(next_id, method, params))
            .map_err(|e| fail(format!("unable to send {method}: {e}")))
    };
    let end: Result<&str, Failure> = 'run: {
        let mut pending = early.into_iter();
        loop {
            let ev = match pending.next() {
                Some(v) => Ev::Frame(v),
                None => match rx.recv() {
                    Ok(ev) => ev,
                    Err(_) => break 'run Err(fail("attach: every reader stopped".into())),
                },
            };
            match ev {
                Ev::Keys(k) => {
                    let (keys, detach) = match k.iter().position(|b| *b == DETACH_KEY) {
                        Some(p) => (&k[..p], true),
                        None => (&k[..], false),
                    };
                    if !keys.is_empty() {
                        let p = json!({"term_id": term_id, "data": b64_encode(keys)});
                        if let Err(e) = send(&mut writer, "terminal.input", p) {
                            break 'run Err(e);
                        }
                    }
                    if detach {
                        let _ = send(&mut writer, "terminal.close", json!({"term_id": term_id}));
                        break 'run Ok("detached");
                    }
                }
                Ev::StdinClosed => {
                    let _ = send(&mut writer, "terminal.close", json!({"term_id": term_id}));
                    break 'run Ok("detached: standard input closed");
                }
                Ev::Signal(libc::SIGWINCH) => {
                    let (cols, rows) = size();
                    let p = json!({"term_id": term_id, "cols": cols, "rows": rows});
                    if let Err(e) = send(&mut writer, "terminal.resize", p) {
                        break 'run Err(e);
                    }
                }
                Ev::Signal(_) => {
                    let _ = send(&mut writer, "terminal.close", json!({"term_id": term_id}));
                    break 'run Ok("detached by a signal");
                }
                Ev::SocketClosed(why) => break 'run Err(fail(why)),
                Ev::Frame(v) => match v["method"].as_str() {
                    Some("terminal.output") if v["params"]["term_id"] == term_id.as_str() => {
                        let data = v["params"]["data"].as_str().unwrap_or("");
                        let Some(bytes) = b64_decode(data) else {
                            continue;
                        };
                        if out.write_all(&bytes).and_then(|()| out.flush()).is_err() {
                            break 'run Err(fail("unable to write to the terminal".into()));
                        }
                    }
                    Some("terminal.exited") if v["params"]["term_id"] == term_id.as_str() => {
                        if v["params"]["reason"] == "evicted" {
                            break 'run Err(fail(
                                "another client took this terminal (terminal.open)".into(),
                            ));
                        }
                        break 'run Ok("the pane exited");
                    }
                    _ => {}
                },
            }
        }
    };
    drop(raw);
    let _ = out.write_all(b"\r\n");
    let _ = out.flush();
    match end {
        Ok(m) => {
            eprintln!("[{m}]");
            Ok(())
        }
        Err(e) => Err(e),
    }
}
