//! The viewer pane's feed (issue 15; seed 004, Terminals: "for a session
//! without a pane, the node first creates a viewer pane"): what a live
//! terminal on one of the daemon's own sessions (ACP or stream-json, which
//! have no pane) shows. src/tmux/terminal.rs makes the pane; this module
//! writes what it shows.
//!
//! The pane runs `tail -n +1 -f FILE` on a file of the daemon's state
//! directory (`viewers/`, mode 0700), written by one thread per viewer
//! from the session's transcript in the ledger (src/core/transcript.rs):
//! every entry so far, then each new one as it is committed: `> ` before
//! what the user sent, the agent's text as it is, `(thinking)`, `[Tool]
//! input (running|done|failed)`, `! ` before a system note, and a line at
//! each turn's end. An entry is written once another follows it or it
//! ends the turn, since the last one may still grow: the file only
//! grows, as `tail` needs. The thread reads the ledger through its own
//! read-only connection, so the reactor only wakes it after each
//! committed round of the session (a queue of one wake, which coalesces: a
//! wake missed while one waits is covered by the next read, which starts
//! after the last entry written). Not through the pane's own socket
//! connection: a process in the daemon's tmux server descends from the
//! daemon and is classed `agent-session`, which may not read another
//! session's transcript.
//!
//! Bounds: `VIEWER_FEED_MAX_BYTES` written per viewer, after which the
//! file says so and stops growing; entries read `VIEWER_FEED_PAGE` at a
//! time. The file is removed when the terminal ends.

use crossbeam_channel::Receiver;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::limits;

/// What a viewer follows, and where.
#[derive(Clone, Debug)]
pub struct Source {
    /// The ledger file and the stream (the session id) in it.
    pub ledger: PathBuf,
    pub stream: String,
    /// The directory of the feed files.
    pub dir: PathBuf,
    /// A wake for each commit to the stream; closed when the terminal ends.
    pub wake: Receiver<()>,
}

/// The feed file of terminal `term`.
pub fn file_of(dir: &Path, term: u64) -> PathBuf {
    dir.join(format!("{term}-{}.log", std::process::id()))
}

/// Makes the feed file of terminal `term`, empty, and starts its writer;
/// the file's path.
pub fn start(term: u64, src: &Source) -> Result<PathBuf, String> {
    let cause = |what: &str, p: &Path, e: std::io::Error| {
        format!(
            "unable to {what} {}: {}",
            p.display(),
            crate::errors::io_cause(&e)
        )
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&src.dir)
        .map_err(|e| cause("create the viewer directory", &src.dir, e))?;
    let path = file_of(&src.dir, term);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| cause("create the viewer feed", &path, e))?;
    let src = src.clone();
    std::thread::Builder::new()
        .name(format!("term-{term}-feed"))
        .spawn(move || {
            if let Err(why) = feed(&src, file) {
                crate::warn!("viewer of session {}: {why}", src.stream);
            }
        })
        .map_err(|e| {
            format!(
                "unable to start a viewer thread: {}",
                crate::errors::io_cause(&e)
            )
        })?;
    Ok(path)
}

/// Writes the session's transcript to `out` until the wake closes or the
/// cap.
fn feed(src: &Source, out: std::fs::File) -> Result<(), String> {
    let conn = rusqlite::Connection::open_with_flags(
        &src.ledger,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("unable to open the ledger: {e}"))?;
    crate::ledger::configure(&conn, false)
        .map_err(|e| format!("unable to open the ledger: {e}"))?
        .map_err(|e| format!("unable to open the ledger: {e}"))?;
    let mut out = std::io::BufWriter::new(out);
    let werr = |e: std::io::Error| format!("unable to write the feed: {e}");
    // The next entry to show, and the bytes written so far.
    let (mut next, mut written) = (0usize, 0usize);
    loop {
        let page = crate::core::transcript::read_entries(
            &conn,
            &src.stream,
            next,
            limits::VIEWER_FEED_PAGE,
        )
        .map_err(|e| format!("unable to read the session's transcript: {e}"))?;
        let full = page.len() == limits::VIEWER_FEED_PAGE;
        let count = page.len();
        for (i, e) in page.iter().enumerate() {
            // The last entry may still grow (text arrives in chunks, a
            // tool gets its result): it is shown once another follows it,
            // or when it ends the turn.
            if i + 1 == count && e["kind"] != "turn_end" {
                break;
            }
            let text = render(e);
            if written + text.len() > limits::VIEWER_FEED_MAX_BYTES {
                writeln!(
                    out,
                    "(the viewer stops here: it shows at most {} bytes)",
                    limits::VIEWER_FEED_MAX_BYTES
                )
                .and_then(|_| out.flush())
                .map_err(werr)?;
                return Ok(());
            }
            out.write_all(text.as_bytes()).map_err(werr)?;
            written += text.len();
            next += 1;
        }
        out.flush().map_err(werr)?;
        if full {
            continue;
        }
        if src.wake.recv().is_err() {
            return Ok(());
        }
    }
}

/// One transcript entry (wire form, src/core/transcript.rs) as lines of
/// the pane.
fn render(e: &serde_json::Value) -> String {
    let s = |k: &str| e[k].as_str().unwrap_or_default();
    let body = match s("kind") {
        "user" => format!("> {}", s("text")),
        "thinking" => format!("(thinking) {}", s("text")),
        "tool" => {
            let state = match e["resultIsError"].as_bool() {
                Some(true) => "failed",
                Some(false) => "done",
                None => "running",
            };
            format!(
                "[{}] {} ({state})",
                s("toolName"),
                s("inputPreview").replace('\n', " ")
            )
        }
        "turn_end" => format!("-- turn ended: {} --", s("stopReason")),
        "system" => format!("! {}", s("text")),
        _ => s("text").to_string(),
    };
    let mut text = String::with_capacity(body.len() + 2);
    for line in body.lines() {
        text.push_str(line);
        text.push('\n');
    }
    if text.is_empty() {
        text.push('\n');
    }
    text
}
