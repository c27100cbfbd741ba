//! Sessions in tmux panes (issue 15; seed 004, Features › Sessions, the
//! Session type): the sessions found in the panes of the operator's
//! `default` tmux server and of the daemon's own server, and the pane
//! methods that drive them. The seed's own server is `argus`; ours is
//! named `omniconflux` (`tmux -L omniconflux`).
//!
//! [`Tmux`] is a subsystem in the shape of DESIGN.md ("How subsystems
//! talk"): it holds the last scan, the requests waiting for one, and the
//! pane calls in flight; its methods take `&mut self` and return
//! [`Effect`]s. Every tmux call and every file it reads runs as a [`Job`]
//! on the tmux workers ([`worker`]), which report back a [`Report`]. The
//! requests it holds are of the caller's type `R` (the daemon's reply
//! address), which it only hands back.
//!
//! Rescans. `sessions.refresh` answers after a scan that starts after the
//! call. `sessions.list` and the pane methods answer from the last scan
//! when it is younger than `TMUX_RESCAN_MS`, and wait for a new one
//! otherwise, so that they are right on a daemon no one watches. While
//! someone watches the sessions (`sessions.subscribe`) the daemon rescans
//! every `TMUX_RESCAN_MS` and reports what was added, updated or removed;
//! when no one watches, the timer is not re-armed, and an idle daemon
//! does no tmux work at all.
//!
//! Pane input (seed 004, InputParams and the rules under it):
//! `prepare` leaves copy mode and Claude Code's vim normal mode first;
//! `submit` presses Enter after the text. Empty text fails with
//! `session has no terminal control`, as the seed says of every session.
//! Every agent fails with `session is busy` while the screen shows a
//! permission prompt; Codex and opencode also while they work. Claude
//! Code and Gemini CLI take text while they work (they queue it; a slash
//! command runs after the turn).

pub mod discover;
pub mod driver;
pub mod host;
pub mod persistent;
pub mod terminal;
pub mod transcript;
pub mod viewer;
pub mod wakelock;
pub mod worker;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

pub use discover::{Found, Status};
pub use driver::{Server, Socket, TmuxError};

use crate::limits;

/// The name of the daemon's own tmux server and of the server part of its
/// sessions' ids.
pub const OWN_SERVER: &str = "omniconflux";

/// The operator's server, as the seed names it.
pub const DEFAULT_SERVER: &str = "default";

/// A session found in a pane, with when its status last changed.
#[derive(Clone, Debug, PartialEq)]
pub struct Session {
    pub found: Found,
    pub status_since_ms: i64,
}

impl Session {
    /// Whether the daemon started it (a pane of its own server).
    pub fn spawned(&self) -> bool {
        self.found.server == OWN_SERVER
    }

    /// Whether it takes a prompt now (seed 004, `can_prompt`).
    pub fn can_prompt(&self) -> bool {
        prompt_refused(&self.found).is_none()
    }
}

/// What a worker does for one request: to a pane, or on the host.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Capture,
    Keys(Vec<String>),
    Focus,
    Kill,
    Input {
        text: String,
        submit: bool,
        prepare: bool,
    },
    /// Start `argv` in a window of tmux session `session` in `cwd`.
    Spawn {
        session: String,
        cwd: String,
        argv: Vec<String>,
    },
    /// `host.info`.
    HostInfo,
    /// `host.completeDir` of `path`, `~` being `home`.
    CompleteDir {
        home: PathBuf,
        path: String,
    },
    /// terminal.create: a shell in `cwd` in a session of the daemon's
    /// server ([`persistent`]).
    TermCreate {
        id: String,
        cwd: String,
    },
    TermList,
    TermKill {
        id: String,
    },
    TermRename {
        id: String,
        name: String,
    },
}

/// Blocking work for a tmux worker.
#[derive(Clone, Debug, PartialEq)]
pub enum Job {
    /// List the panes of `servers` and find the agents in them.
    Scan { servers: Vec<Server> },
    /// One call for one request, which `ticket` names; `pane` is empty
    /// for a call on no pane.
    Call {
        ticket: u64,
        server: Server,
        pane: String,
        op: Op,
    },
    /// Read on transcript slot `sid` (src/tmux/transcript.rs):
    /// `file` as far as it was read, or the file at `path` from its start.
    Transcript {
        sid: String,
        cwd: String,
        path: PathBuf,
        file: Option<Box<transcript::File>>,
        /// A subagent's file: read as it is, not followed.
        subagent: bool,
    },
}

/// What a worker reports for a [`Job`].
#[derive(Clone, Debug, PartialEq)]
pub enum Report {
    Scanned {
        found: Vec<Found>,
        failed: Vec<TmuxError>,
    },
    Done {
        ticket: u64,
        result: Result<Done, TmuxError>,
    },
    Transcript {
        sid: String,
        read: transcript::Followed,
    },
}

/// A pane call's outcome.
#[derive(Clone, Debug, PartialEq)]
pub enum Done {
    Ok,
    Screen(String),
    /// The new pane's id.
    Spawned(String),
    Host(host::Info),
    Dirs(Vec<String>),
    Terminals(Vec<persistent::Terminal>),
    Terminal(persistent::Terminal),
    /// The persistent terminal named does not exist.
    NoTerminal(String),
}

/// What a request is answered with.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Sessions(Vec<Session>),
    Screen(String),
    Null,
    Spawned { session_id: String, pane_id: String },
    Host(host::Info),
    Dirs(Vec<String>),
    Terminals(Vec<persistent::Terminal>),
    Terminal(persistent::Terminal),
}

/// Why a request failed; the texts are seed 004's.
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// `unknown session: <id>`.
    UnknownSession(String),
    /// `session has no terminal control`.
    NoTerminalControl,
    /// `session is busy`.
    Busy,
    /// The tmux call failed.
    Tmux(TmuxError),
    /// Too many tmux calls wait already.
    Overloaded,
    /// `unknown terminal: <id>`.
    UnknownTerminal(String),
}

/// A session of the list appeared, changed or went.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Added(Session),
    Updated(Session),
    Removed(Session),
}

/// What the subsystem asks of the daemon, in order.
#[derive(Debug, PartialEq)]
pub enum Effect<R> {
    /// Run on a tmux worker; a full queue is [`Tmux::refused`].
    Job(Job),
    /// Answer a request.
    Reply(R, Result<Answer, Error>),
    /// Tell those who watch the sessions.
    Changed(Vec<Change>),
    /// Call [`Tmux::tick`] after `TMUX_RESCAN_MS`.
    ArmRescan,
    /// A persistent terminal was created, killed or renamed
    /// (`terminal.changed`).
    TerminalsChanged,
}

/// A pane call waiting for a scan before it runs.
#[derive(Debug)]
struct Waiting<R> {
    reply: R,
    id: String,
    op: Op,
}

/// The tmux subsystem (module comment).
#[derive(Debug)]
pub struct Tmux<R> {
    servers: Vec<Server>,
    sessions: BTreeMap<String, Session>,
    scanned_at_ms: Option<i64>,
    scanning: bool,
    /// Another scan is to follow the one running: a refresh came after it
    /// started.
    scan_again: bool,
    /// A spawn was answered while the running scan ran: the scan may have
    /// listed the panes before the new one existed, so it leaves the list
    /// stale and another follows, for which every waiting call waits.
    spawned_meanwhile: bool,
    /// Lists answered by the running scan, and by the next one.
    lists: Vec<R>,
    lists_next: Vec<R>,
    pane_calls: Vec<Waiting<R>>,
    calls: HashMap<u64, (R, String, Op)>,
    next_ticket: u64,
    armed: bool,
}

impl<R> Tmux<R> {
    /// A subsystem that looks at `servers` (the operator's default server
    /// and the daemon's own).
    pub fn new(servers: Vec<Server>) -> Tmux<R> {
        Tmux {
            servers,
            sessions: BTreeMap::new(),
            scanned_at_ms: None,
            scanning: false,
            scan_again: false,
            spawned_meanwhile: false,
            lists: Vec::new(),
            lists_next: Vec::new(),
            pane_calls: Vec::new(),
            calls: HashMap::new(),
            next_ticket: 0,
            armed: false,
        }
    }

    /// The servers it looks at.
    pub fn servers(&self) -> impl Iterator<Item = &Server> {
        self.servers.iter()
    }

    /// The daemon's own server.
    pub fn own_server(&self) -> Option<&Server> {
        self.servers.iter().find(|s| s.name == OWN_SERVER)
    }

    /// The sessions of the last scan, in id order.
    pub fn sessions(&self) -> impl Iterator<Item = &Session> {
        self.sessions.values()
    }

    /// Whether `id` has the form of a tmux session id of one of this
    /// subsystem's servers: `<server>:%<n>`.
    pub fn owns_id(&self, id: &str) -> bool {
        id.split_once(':').is_some_and(|(server, pane)| {
            driver::is_pane_id(pane) && self.servers.iter().any(|s| s.name == server)
        })
    }

    fn fresh(&self, now_ms: i64) -> bool {
        self.scanned_at_ms
            .is_some_and(|at| now_ms - at < limits::TMUX_RESCAN_MS as i64)
            && !self.scanning
    }

    fn waiting(&self) -> usize {
        self.lists.len() + self.lists_next.len() + self.pane_calls.len() + self.calls.len()
    }

    /// Starts a scan unless one runs.
    fn scan(&mut self) -> Vec<Effect<R>> {
        if self.scanning {
            return Vec::new();
        }
        self.scanning = true;
        vec![Effect::Job(Job::Scan {
            servers: self.servers.clone(),
        })]
    }

    /// A scan for a caller that waits on it itself (the transcript
    /// routes): none when the last scan is fresh, and the running one when
    /// one runs; `false` when nothing is to be waited for.
    pub fn rescan(&mut self, now_ms: i64) -> (bool, Vec<Effect<R>>) {
        if self.fresh(now_ms) {
            return (false, Vec::new());
        }
        (true, self.scan())
    }

    /// `sessions.list`: the sessions, from the last scan when it is fresh.
    pub fn list(&mut self, reply: R, now_ms: i64) -> Vec<Effect<R>> {
        if self.fresh(now_ms) {
            return vec![Effect::Reply(reply, Ok(Answer::Sessions(self.listed())))];
        }
        if self.waiting() >= limits::TMUX_WAITERS_MAX {
            return vec![Effect::Reply(reply, Err(Error::Overloaded))];
        }
        self.lists.push(reply);
        self.scan()
    }

    /// `sessions.refresh`: the sessions after a scan that starts now.
    pub fn refresh(&mut self, reply: R) -> Vec<Effect<R>> {
        if self.waiting() >= limits::TMUX_WAITERS_MAX {
            return vec![Effect::Reply(reply, Err(Error::Overloaded))];
        }
        if self.scanning {
            self.lists_next.push(reply);
            self.scan_again = true;
            return Vec::new();
        }
        self.lists.push(reply);
        self.scan()
    }

    /// Someone began to watch the sessions: a scan now, and the timer.
    pub fn watch(&mut self) -> Vec<Effect<R>> {
        let mut fx = self.scan();
        if !self.armed {
            self.armed = true;
            fx.push(Effect::ArmRescan);
        }
        fx
    }

    /// The rescan timer fired; `watched` says whether anyone still
    /// watches. Without watchers the timer stays off.
    pub fn tick(&mut self, watched: bool) -> Vec<Effect<R>> {
        self.armed = false;
        if !watched {
            return Vec::new();
        }
        self.armed = true;
        let mut fx = self.scan();
        fx.push(Effect::ArmRescan);
        fx
    }

    /// A pane method on session `id`: run once the list is fresh.
    pub fn pane(&mut self, reply: R, id: String, op: Op, now_ms: i64) -> Vec<Effect<R>> {
        if !self.owns_id(&id) {
            return vec![Effect::Reply(reply, Err(Error::UnknownSession(id)))];
        }
        if self.waiting() >= limits::TMUX_WAITERS_MAX {
            return vec![Effect::Reply(reply, Err(Error::Overloaded))];
        }
        if self.fresh(now_ms) {
            return self.run_pane(reply, id, op);
        }
        self.pane_calls.push(Waiting { reply, id, op });
        self.scan()
    }

    /// `sessions.spawn` into the daemon's own server.
    pub fn spawn(
        &mut self,
        reply: R,
        session: String,
        cwd: String,
        argv: Vec<String>,
    ) -> Vec<Effect<R>> {
        let Some(server) = self.own_server().cloned() else {
            return vec![Effect::Reply(reply, Err(Error::NoTerminalControl))];
        };
        if self.waiting() >= limits::TMUX_WAITERS_MAX {
            return vec![Effect::Reply(reply, Err(Error::Overloaded))];
        }
        self.next_ticket += 1;
        let op = Op::Spawn { session, cwd, argv };
        self.calls
            .insert(self.next_ticket, (reply, String::new(), op.clone()));
        vec![Effect::Job(Job::Call {
            ticket: self.next_ticket,
            server,
            pane: String::new(),
            op,
        })]
    }

    /// A call on no pane (the host methods, persistent terminals), on a
    /// worker.
    pub fn call(&mut self, reply: R, op: Op) -> Vec<Effect<R>> {
        if self.waiting() >= limits::TMUX_WAITERS_MAX {
            return vec![Effect::Reply(reply, Err(Error::Overloaded))];
        }
        self.next_ticket += 1;
        self.calls
            .insert(self.next_ticket, (reply, String::new(), op.clone()));
        let server = self.own_server().cloned().unwrap_or(Server {
            name: OWN_SERVER.into(),
            socket: Socket::Name(OWN_SERVER.into()),
        });
        vec![Effect::Job(Job::Call {
            ticket: self.next_ticket,
            server,
            pane: String::new(),
            op,
        })]
    }

    fn run_pane(&mut self, reply: R, id: String, op: Op) -> Vec<Effect<R>> {
        let Some(s) = self.sessions.get(&id) else {
            return vec![Effect::Reply(reply, Err(Error::UnknownSession(id)))];
        };
        if let Op::Input { text, .. } = &op {
            if text.is_empty() {
                return vec![Effect::Reply(reply, Err(Error::NoTerminalControl))];
            }
            if prompt_refused(&s.found).is_some() {
                return vec![Effect::Reply(reply, Err(Error::Busy))];
            }
        }
        let Some(server) = self
            .servers
            .iter()
            .find(|x| x.name == s.found.server)
            .cloned()
        else {
            return vec![Effect::Reply(reply, Err(Error::UnknownSession(id)))];
        };
        let pane = s.found.pane.pane_id.clone();
        self.next_ticket += 1;
        self.calls.insert(self.next_ticket, (reply, id, op.clone()));
        vec![Effect::Job(Job::Call {
            ticket: self.next_ticket,
            server,
            pane,
            op,
        })]
    }

    /// The worker queue refused `job`: its requests fail.
    pub fn refused(&mut self, job: Job) -> Vec<Effect<R>> {
        match job {
            Job::Scan { .. } => {
                self.scanning = false;
                self.scan_again = false;
                self.spawned_meanwhile = false;
                let mut fx: Vec<Effect<R>> = Vec::new();
                for r in self.lists.drain(..).chain(self.lists_next.drain(..)) {
                    fx.push(Effect::Reply(r, Err(Error::Overloaded)));
                }
                for w in self.pane_calls.drain(..) {
                    fx.push(Effect::Reply(w.reply, Err(Error::Overloaded)));
                }
                fx
            }
            Job::Call { ticket, .. } => match self.calls.remove(&ticket) {
                Some((r, ..)) => vec![Effect::Reply(r, Err(Error::Overloaded))],
                None => Vec::new(),
            },
            // The daemon's transcript routes submit these and handle
            // their refusal themselves.
            Job::Transcript { .. } => Vec::new(),
        }
    }

    /// A worker's report.
    pub fn on_report(&mut self, report: Report, now_ms: i64) -> Vec<Effect<R>> {
        match report {
            Report::Scanned { found, failed } => self.scanned(found, failed, now_ms),
            Report::Transcript { .. } => Vec::new(),
            Report::Done { ticket, result } => {
                let Some((reply, id, op)) = self.calls.remove(&ticket) else {
                    return Vec::new();
                };
                let mut fx = Vec::new();
                let answer = match result {
                    Err(e) => Err(Error::Tmux(e)),
                    Ok(Done::Screen(s)) => Ok(Answer::Screen(s)),
                    Ok(Done::Ok) => Ok(Answer::Null),
                    Ok(Done::Spawned(pane_id)) => Ok(Answer::Spawned {
                        session_id: format!("{OWN_SERVER}:{pane_id}"),
                        pane_id,
                    }),
                    Ok(Done::Host(i)) => Ok(Answer::Host(i)),
                    Ok(Done::Dirs(d)) => Ok(Answer::Dirs(d)),
                    Ok(Done::Terminals(t)) => Ok(Answer::Terminals(t)),
                    Ok(Done::Terminal(t)) => Ok(Answer::Terminal(t)),
                    Ok(Done::NoTerminal(id)) => Err(Error::UnknownTerminal(id)),
                };
                let gone = matches!(op, Op::Kill) && answer.is_ok();
                if gone {
                    if let Some(s) = self.sessions.remove(&id) {
                        fx.push(Effect::Changed(vec![Change::Removed(s)]));
                    }
                }
                let spawned = matches!(answer, Ok(Answer::Spawned { .. }));
                if answer.is_ok()
                    && matches!(
                        op,
                        Op::TermCreate { .. } | Op::TermKill { .. } | Op::TermRename { .. }
                    )
                {
                    fx.push(Effect::TerminalsChanged);
                }
                fx.push(Effect::Reply(reply, answer));
                if spawned {
                    // The new session shows in the list, and to watchers,
                    // once a scan has seen it: the next call scans first,
                    // and a scan that runs now may predate the pane.
                    self.scanned_at_ms = None;
                    if self.scanning {
                        self.spawned_meanwhile = true;
                    } else if self.armed {
                        fx.extend(self.scan());
                    }
                }
                fx
            }
        }
    }

    fn scanned(
        &mut self,
        found: Vec<Found>,
        failed: Vec<TmuxError>,
        now_ms: i64,
    ) -> Vec<Effect<R>> {
        for e in &failed {
            crate::debug!("tmux scan: {e}");
        }
        self.scanning = false;
        self.scanned_at_ms = Some(now_ms);
        let mut changes = Vec::new();
        let mut next = BTreeMap::new();
        for f in found {
            let s = match self.sessions.remove(&f.id) {
                Some(old) if old.found == f => old,
                Some(old) => {
                    let since = if old.found.status == f.status {
                        old.status_since_ms
                    } else {
                        now_ms
                    };
                    let s = Session {
                        found: f,
                        status_since_ms: since,
                    };
                    changes.push(Change::Updated(s.clone()));
                    s
                }
                None => {
                    let s = Session {
                        found: f,
                        status_since_ms: now_ms,
                    };
                    changes.push(Change::Added(s.clone()));
                    s
                }
            };
            next.insert(s.found.id.clone(), s);
        }
        for (_, old) in std::mem::replace(&mut self.sessions, next) {
            changes.push(Change::Removed(old));
        }
        let mut fx = Vec::new();
        if !changes.is_empty() {
            fx.push(Effect::Changed(changes));
        }
        if std::mem::take(&mut self.spawned_meanwhile) {
            // This scan may lack a pane a spawn just answered: the calls
            // waiting, those that wait for the next scan too, wait for one
            // that starts now.
            self.scanned_at_ms = None;
            self.scan_again = false;
            let next = std::mem::take(&mut self.lists_next);
            self.lists.extend(next);
            fx.extend(self.scan());
            return fx;
        }
        let list = self.listed();
        for r in self.lists.drain(..) {
            fx.push(Effect::Reply(r, Ok(Answer::Sessions(list.clone()))));
        }
        for w in std::mem::take(&mut self.pane_calls) {
            fx.extend(self.run_pane(w.reply, w.id, w.op));
        }
        if std::mem::take(&mut self.scan_again) {
            self.lists = std::mem::take(&mut self.lists_next);
            fx.extend(self.scan());
        }
        fx
    }

    fn listed(&self) -> Vec<Session> {
        self.sessions.values().cloned().collect()
    }
}

/// Why a session takes no prompt now (module comment), if it does not.
fn prompt_refused(f: &Found) -> Option<Error> {
    match (f.status, f.agent.as_str()) {
        (Status::AwaitingInput, _) => Some(Error::Busy),
        (Status::Working, "codex" | "opencode") => Some(Error::Busy),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers() -> Vec<Server> {
        [DEFAULT_SERVER, OWN_SERVER]
            .into_iter()
            .map(|n| Server {
                name: n.into(),
                socket: Socket::Name(n.into()),
            })
            .collect()
    }

    fn found(pane: &str, agent: &str, status: Status) -> Found {
        Found {
            id: format!("default:{pane}"),
            server: DEFAULT_SERVER.into(),
            pane: driver::Pane {
                pane_id: pane.into(),
                session_name: "work".into(),
                window_index: 0,
                window_id: "@0".into(),
                pid: 1,
                command: agent.into(),
                current_path: "/w".into(),
                in_mode: false,
            },
            agent: agent.into(),
            agent_pid: 1,
            cwd: "/w".into(),
            repo: None,
            branch: None,
            status,
            transcript_path: None,
            agent_session_id: None,
            prompt: None,
        }
    }

    fn scanned(found: Vec<Found>) -> Report {
        Report::Scanned {
            found,
            failed: vec![],
        }
    }

    fn replies(fx: &[Effect<u32>]) -> Vec<(u32, Result<Answer, Error>)> {
        fx.iter()
            .filter_map(|e| match e {
                Effect::Reply(r, a) => Some((*r, a.clone())),
                _ => None,
            })
            .collect()
    }

    fn jobs(fx: &[Effect<u32>]) -> Vec<Job> {
        fx.iter()
            .filter_map(|e| match e {
                Effect::Job(j) => Some(j.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_list_waits_for_one_scan_and_a_fresh_scan_answers_at_once() {
        let mut t: Tmux<u32> = Tmux::new(servers());
        let fx = t.list(1, 0);
        assert_eq!(jobs(&fx).len(), 1);
        // A second list while the scan runs shares it.
        assert!(t.list(2, 10).is_empty());
        let fx = t.on_report(scanned(vec![found("%1", "claude", Status::Idle)]), 100);
        let r = replies(&fx);
        assert_eq!(r.len(), 2);
        assert!(matches!(&r[0].1, Ok(Answer::Sessions(l)) if l.len() == 1));
        // Fresh: answered without a job; stale: a new scan.
        let fx = t.list(3, 100 + limits::TMUX_RESCAN_MS as i64 - 1);
        assert_eq!((jobs(&fx).len(), replies(&fx).len()), (0, 1));
        let fx = t.list(4, 100 + limits::TMUX_RESCAN_MS as i64);
        assert_eq!((jobs(&fx).len(), replies(&fx).len()), (1, 0));
    }

    #[test]
    fn a_refresh_during_a_scan_waits_for_the_next_one() {
        let mut t: Tmux<u32> = Tmux::new(servers());
        t.list(1, 0);
        assert!(t.refresh(2).is_empty());
        let fx = t.on_report(scanned(vec![]), 5);
        assert_eq!(replies(&fx).iter().map(|r| r.0).collect::<Vec<_>>(), [1]);
        assert_eq!(jobs(&fx).len(), 1, "the second scan starts");
        let fx = t.on_report(scanned(vec![]), 6);
        assert_eq!(replies(&fx).iter().map(|r| r.0).collect::<Vec<_>>(), [2]);
        assert!(jobs(&fx).is_empty());
    }

    #[test]
    fn scans_report_what_was_added_updated_and_removed() {
        let mut t: Tmux<u32> = Tmux::new(servers());
        t.refresh(1);
        let fx = t.on_report(
            scanned(vec![
                found("%1", "claude", Status::Idle),
                found("%2", "codex", Status::Idle),
            ]),
            10,
        );
        let Some(Effect::Changed(c)) = fx.first() else {
            panic!("{fx:?}")
        };
        assert!(c.iter().all(|c| matches!(c, Change::Added(_))) && c.len() == 2);
        t.refresh(2);
        let fx = t.on_report(scanned(vec![found("%1", "claude", Status::Working)]), 20);
        let Some(Effect::Changed(c)) = fx.first() else {
            panic!("{fx:?}")
        };
        assert!(matches!(&c[0], Change::Updated(s) if s.status_since_ms == 20));
        assert!(matches!(&c[1], Change::Removed(s) if s.found.id == "default:%2"));
        // Nothing changed: no event.
        t.refresh(3);
        let fx = t.on_report(scanned(vec![found("%1", "claude", Status::Working)]), 30);
        assert!(!fx.iter().any(|e| matches!(e, Effect::Changed(_))));
    }

    #[test]
    fn the_rescan_timer_runs_only_while_someone_watches() {
        let mut t: Tmux<u32> = Tmux::new(servers());
        let fx = t.watch();
        assert!(fx.contains(&Effect::ArmRescan));
        // A second watcher arms no second timer.
        assert!(!t.watch().contains(&Effect::ArmRescan));
        t.on_report(scanned(vec![]), 1);
        let fx = t.tick(true);
        assert_eq!(jobs(&fx).len(), 1);
        assert!(fx.contains(&Effect::ArmRescan));
        t.on_report(scanned(vec![]), 2);
        assert!(t.tick(false).is_empty(), "no watcher: no scan, no timer");
        assert!(t.watch().contains(&Effect::ArmRescan));
    }

    #[test]
    fn input_follows_the_seed_s_busy_rules() {
        let mut t: Tmux<u32> = Tmux::new(servers());
        t.refresh(0);
        t.on_report(
            scanned(vec![
                found("%1", "claude", Status::Working),
                found("%2", "codex", Status::Working),
                found("%3", "claude", Status::AwaitingInput),
            ]),
            0,
        );
        let input = |text: &str| Op::Input {
            text: text.into(),
            submit: true,
            prepare: false,
        };
        // Claude Code takes text while it works.
        let fx = t.pane(1, "default:%1".into(), input("go"), 1);
        assert_eq!(jobs(&fx).len(), 1);
        for (n, id) in [(2, "default:%2"), (3, "default:%3")] {
            let fx = t.pane(n, id.into(), input("go"), 1);
            assert_eq!(replies(&fx), [(n, Err(Error::Busy))], "{id}");
        }
        let fx = t.pane(4, "default:%1".into(), input(""), 1);
        assert_eq!(replies(&fx), [(4, Err(Error::NoTerminalControl))]);
        let fx = t.pane(5, "default:%9".into(), Op::Capture, 1);
        assert_eq!(
            replies(&fx),
            [(5, Err(Error::UnknownSession("default:%9".into())))]
        );
        let fx = t.pane(6, "other:%1".into(), Op::Capture, 1);
        assert_eq!(
            replies(&fx),
            [(6, Err(Error::UnknownSession("other:%1".into())))]
        );
    }

    #[test]
    fn a_killed_pane_leaves_the_list_and_a_refused_job_fails_its_request() {
        let mut t: Tmux<u32> = Tmux::new(servers());
        t.refresh(0);
        t.on_report(scanned(vec![found("%1", "claude", Status::Idle)]), 0);
        let fx = t.pane(1, "default:%1".into(), Op::Kill, 1);
        let [Job::Call { ticket, .. }] = jobs(&fx)[..] else {
            panic!("{fx:?}")
        };
        let fx = t.on_report(
            Report::Done {
                ticket,
                result: Ok(Done::Ok),
            },
            2,
        );
        assert!(matches!(&fx[0], Effect::Changed(c) if matches!(&c[0], Change::Removed(_))));
        assert_eq!(replies(&fx), [(1, Ok(Answer::Null))]);
        assert_eq!(t.sessions().count(), 0);
        let fx = t.list(2, 100_000);
        let job = jobs(&fx).pop().unwrap();
        assert_eq!(replies(&t.refused(job)), [(2, Err(Error::Overloaded))]);
    }

    #[test]
    fn a_scan_that_ran_while_a_spawn_answered_is_followed_by_another() {
        let mut t: Tmux<u32> = Tmux::new(servers());
        t.list(1, 0);
        let fx = t.spawn(2, "w".into(), "/w".into(), vec!["sh".into()]);
        let [Job::Call { ticket, .. }] = jobs(&fx)[..] else {
            panic!("{fx:?}")
        };
        let fx = t.on_report(
            Report::Done {
                ticket,
                result: Ok(Done::Spawned("%5".into())),
            },
            1,
        );
        assert!(matches!(
            &replies(&fx)[..],
            [(2, Ok(Answer::Spawned { .. }))]
        ));
        // A pane call on the new pane waits for the scan that runs.
        assert!(
            t.pane(3, "omniconflux:%5".into(), Op::Capture, 2)
                .is_empty()
        );
        // That scan may predate the pane: nothing is answered from it.
        let fx = t.on_report(scanned(vec![]), 3);
        assert!(replies(&fx).is_empty(), "{fx:?}");
        assert_eq!(jobs(&fx).len(), 1, "another scan starts");
        let mut own = found("%5", "sh", Status::Idle);
        own.id = "omniconflux:%5".into();
        own.server = OWN_SERVER.into();
        let fx = t.on_report(scanned(vec![own]), 4);
        assert_eq!(replies(&fx).iter().map(|r| r.0).collect::<Vec<_>>(), [1]);
        assert!(
            matches!(&jobs(&fx)[..], [Job::Call { pane, op: Op::Capture, .. }] if pane == "%5"),
            "{fx:?}"
        );
    }
}
