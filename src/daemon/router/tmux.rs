//! The routes of the tmux subsystem (issue 15; src/tmux/): where its
//! effects are applied. Jobs go to the tmux workers, whose reports come
//! back through the reactor inbox to [`report`]; replies are answered by
//! the socket's tmux methods (src/socket/methods/tmux.rs, which owns their
//! wire); changes of the session list go to the operator connections that
//! watch the sessions as `session.event`s; the rescan timer runs on the
//! reactor and asks the socket whether anyone still watches.
//!
//! A new watcher (`sessions.subscribe`) is sent an `added` event for each
//! tmux session of the last scan right after its snapshot, since the
//! snapshot holds the daemon's own sessions only, then a rescan tells it
//! what changed since.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;

use mio::Token;
use serde_json::json;

use crate::daemon::{Daemon, Req};
use crate::limits;
use crate::reactor::Msg;
use crate::tmux::worker::{Ctx, Pool};
use crate::tmux::{Change, DEFAULT_SERVER, Effect, OWN_SERVER, Op, Report, Server, Socket, Tmux};

/// The tmux subsystem and its workers: the daemon's `tmux` field.
pub struct Host {
    pub state: Tmux<Req>,
    pool: Pool,
    home: PathBuf,
}

impl Host {
    /// The subsystem for the operator's `default` server and the daemon's
    /// own; its workers report to the reactor through `inbox`, and start
    /// with the first job.
    pub fn start(inbox: crate::reactor::Inbox) -> Host {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_absolute())
            .unwrap_or_else(|| PathBuf::from("/"));
        let servers = [DEFAULT_SERVER, OWN_SERVER]
            .into_iter()
            .map(|n| Server {
                name: n.to_string(),
                socket: Socket::Name(n.to_string()),
            })
            .collect();
        let pool = Pool::new(Ctx { home: home.clone() }, move |r: Report| {
            inbox.send(Msg::Run(Box::new(move |d: &mut Daemon| report(d, r))));
        });
        Host {
            state: Tmux::new(servers),
            pool,
            home,
        }
    }
}

/// The daemon user's home directory (`~` in the seed's paths).
pub fn home(d: &Daemon) -> PathBuf {
    d.tmux.home.clone()
}

/// `sessions.list` (`refresh`: after a new scan).
pub fn list(d: &mut Daemon, req: Req, refresh: bool) -> Option<serde_json::Value> {
    let fx = if refresh {
        d.tmux.state.refresh(req)
    } else {
        d.tmux.state.list(req, crate::clock::now_ms())
    };
    apply(d, fx);
    None
}

/// A pane method on a tmux session.
pub fn pane(d: &mut Daemon, req: Req, id: String, op: Op) {
    let fx = d.tmux.state.pane(req, id, op, crate::clock::now_ms());
    apply(d, fx);
}

/// `sessions.spawn` into the daemon's own server.
pub fn spawn(d: &mut Daemon, req: Req, name: String, cwd: String, argv: Vec<String>) {
    let fx = d.tmux.state.spawn(req, name, cwd, argv);
    apply(d, fx);
}

/// A host method, run on a tmux worker.
pub fn host(d: &mut Daemon, req: Req, op: Op) {
    let fx = d.tmux.state.host(req, op);
    apply(d, fx);
}

/// A connection began to watch the sessions (`sessions.subscribe`).
pub fn watched(d: &mut Daemon, conn: Token) {
    if !d.socket.watches.watchers().any(|t| t == conn) {
        return;
    }
    if d.socket
        .conns
        .get(&conn)
        .is_some_and(|c| c.class.is_operator())
    {
        let node = d.node_name.clone();
        let lines: Vec<Vec<u8>> = d
            .tmux
            .state
            .sessions()
            .map(|s| event_line("added", &crate::socket::methods::tmux::session(s, &node)))
            .collect();
        for l in lines {
            d.send(conn, &l);
        }
    }
    let fx = d.tmux.state.watch();
    apply(d, fx);
}

/// A worker's report.
fn report(d: &mut Daemon, r: Report) {
    let fx = d.tmux.state.on_report(r, crate::clock::now_ms());
    apply(d, fx);
}

fn tick(d: &mut Daemon) {
    let watched = operator_watchers(d).next().is_some();
    let fx = d.tmux.state.tick(watched);
    apply(d, fx);
}

fn operator_watchers(d: &Daemon) -> impl Iterator<Item = Token> + '_ {
    d.socket
        .watches
        .watchers()
        .filter(|t| d.socket.conns.get(t).is_some_and(|c| c.class.is_operator()))
}

/// Applies the subsystem's effects in order; those an effect leads to run
/// after it, from the same queue.
fn apply(d: &mut Daemon, fx: Vec<Effect<Req>>) {
    let mut queue = VecDeque::from(fx);
    while let Some(e) = queue.pop_front() {
        match e {
            Effect::Job(job) => {
                if let Err(job) = d.tmux.pool.submit(job) {
                    queue.extend(d.tmux.state.refused(*job));
                }
            }
            Effect::Reply(req, result) => crate::socket::methods::tmux::reply(d, req, result),
            Effect::Changed(changes) => notify(d, &changes),
            Effect::ArmRescan => {
                d.reactor
                    .schedule(Duration::from_millis(limits::TMUX_RESCAN_MS), tick);
            }
        }
    }
}

/// Sends each change to the operator connections that watch the sessions.
fn notify(d: &mut Daemon, changes: &[Change]) {
    let targets: Vec<Token> = operator_watchers(d).collect();
    if targets.is_empty() {
        return;
    }
    let node = d.node_name.clone();
    for c in changes {
        let (kind, s) = match c {
            Change::Added(s) => ("added", s),
            Change::Updated(s) => ("updated", s),
            Change::Removed(s) => ("removed", s),
        };
        let line = event_line(kind, &crate::socket::methods::tmux::session(s, &node));
        for t in &targets {
            d.send(*t, &line);
        }
    }
}

fn event_line(kind: &str, session: &serde_json::Value) -> Vec<u8> {
    let mut line = json!({
        "jsonrpc": "2.0",
        "method": "session.event",
        "params": {"type": kind, "session": session},
    })
    .to_string()
    .into_bytes();
    line.push(b'\n');
    line
}
