//! Persistent terminals (issue 15; seed 004, Persistent terminals): shells
//! that live in sessions of the daemon's own tmux server, named
//! `omniconflux-term-<id>`, so that they outlive `terminal.close` and the
//! daemon itself. tmux is their only record: a terminal's name is the
//! session's user option `@omniconflux_name`, its creation time the
//! option `@omniconflux_created`, its cwd and command those of the session's active pane. A
//! shell that exits takes its session, and so leaves the list, with it.
//!
//! Blocking (tmux calls): run on the tmux workers. Discovery skips these
//! sessions: they are terminals, not agent sessions.

use super::driver::{self, Server, TmuxError};
use crate::limits;

/// The prefix of a persistent terminal's tmux session.
pub const PREFIX: &str = "omniconflux-term-";

/// The option that holds a terminal's name.
const NAME_OPTION: &str = "@omniconflux_name";
/// The option that holds when it was created, in nanoseconds since the
/// epoch: tmux's own `session_created` counts seconds, too coarse for the
/// seed's creation order.
const CREATED_OPTION: &str = "@omniconflux_created";

/// One persistent terminal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Terminal {
    pub id: String,
    /// Empty until a rename.
    pub name: String,
    pub cwd: String,
    pub command: String,
    /// When it was created (nanoseconds), for the seed's order.
    pub created: u128,
}

/// Whether `id` has the form of a terminal id this daemon makes.
pub fn valid_id(id: &str) -> bool {
    (1..=32).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit())
}

fn target(id: &str) -> String {
    format!("={PREFIX}{id}:")
}

/// Every terminal, in creation order.
pub fn list(server: &Server) -> Result<Vec<Terminal>, TmuxError> {
    let format = format!(
        "#{{session_name}}\x1f#{{{CREATED_OPTION}}}\x1f#{{{NAME_OPTION}}}\x1f#{{pane_current_path}}\x1f#{{pane_current_command}}"
    );
    let text = match driver::run(
        server,
        &["list-sessions", "-F", &format],
        limits::TMUX_LIST_MAX_BYTES,
    ) {
        Ok(t) => t,
        Err(e) if driver::not_running(&e) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out: Vec<Terminal> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\x1f').collect();
            let id = f.first()?.strip_prefix(PREFIX)?;
            (f.len() == 5 && valid_id(id)).then(|| Terminal {
                id: id.to_string(),
                created: f[1].parse().unwrap_or(0),
                name: f[2].to_string(),
                cwd: f[3].to_string(),
                command: f[4].to_string(),
            })
        })
        .collect();
    out.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
    Ok(out)
}

/// Starts tmux's default shell in `cwd` as terminal `id`.
pub fn create(server: &Server, id: &str, cwd: &str) -> Result<Terminal, TmuxError> {
    let name = format!("{PREFIX}{id}");
    driver::run(
        server,
        &["new-session", "-d", "-s", &name, "-c", cwd],
        limits::TMUX_STDERR_MAX_BYTES,
    )?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
        .to_string();
    driver::run(
        server,
        &["set-option", "-t", &target(id), CREATED_OPTION, &now],
        0,
    )?;
    list(server)?
        .into_iter()
        .find(|t| t.id == id)
        .ok_or_else(|| TmuxError(format!("terminal {id} ended as soon as it started")))
}

/// Whether terminal `id` exists.
pub fn exists(server: &Server, id: &str) -> bool {
    driver::run(server, &["has-session", "-t", &format!("={PREFIX}{id}")], 0).is_ok()
}

/// Stops terminal `id`; false when there is none. Its windows are killed
/// first: a live terminal's viewer session, grouped with it, would
/// otherwise keep them, and the shell, alive.
pub fn kill(server: &Server, id: &str) -> Result<bool, TmuxError> {
    if !exists(server, id) {
        return Ok(false);
    }
    let windows = driver::run(
        server,
        &["list-windows", "-t", &target(id), "-F", "#{window_id}"],
        limits::TMUX_STDERR_MAX_BYTES,
    )?;
    for w in windows.lines().filter(|w| w.starts_with('@')) {
        driver::run(server, &["kill-window", "-t", w], 0)?;
    }
    match driver::run(
        server,
        &["kill-session", "-t", &format!("={PREFIX}{id}")],
        0,
    ) {
        // Its last window took it already.
        Err(_) if !exists(server, id) => Ok(true),
        other => other.map(|_| true),
    }
}

/// Names terminal `id`; false when there is none.
pub fn rename(server: &Server, id: &str, name: &str) -> Result<bool, TmuxError> {
    if !exists(server, id) {
        return Ok(false);
    }
    driver::run(
        server,
        &["set-option", "-t", &target(id), NAME_OPTION, name],
        0,
    )
    .map(|_| true)
}
