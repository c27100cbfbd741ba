//! The routes of the tmux subsystem (issue 15; src/tmux/): where its
//! effects are applied. Jobs go to the tmux workers, whose reports come
//! back through the reactor inbox to [`report`]; replies are answered by
//! the socket's tmux methods (src/socket/methods/tmux.rs, which owns their
//! wire); changes of the session list go to the operator connections that
//! watch the sessions as `session.event`s; the rescan timer runs on the
//! reactor and asks the socket whether anyone still watches.
//!
//! A new operator watcher (`sessions.subscribe`) is sent an `added` event
//! for each tmux session of the last scan right after its snapshot, since
//! the snapshot holds the daemon's own sessions only, then a rescan tells
//! it what changed since. Every relay channel of the uplink is a watcher
//! too (its snapshot holds the tmux sessions, src/uplink/channels.rs): the
//! changes go to the channels, and the rescan timer runs while a channel
//! is open.
//!
//! The live terminals (seed 004, Terminals) are kept here too, by owner
//! and term_id, because their owner is a surface's: a socket connection or
//! a relay channel of the uplink (issue 13, a [`Subscriber`]). Each has its
//! threads (src/tmux/terminal.rs), whose events come back through the
//! reactor inbox to [`terminal_event`] and go out as `terminal.output` and
//! `terminal.exited` to the connection or channel that opened it (sealed
//! on an E2EE channel, in order with its answers). The last opener wins
//! across both: a socket client and a phone evict each other. A closed
//! connection closes its terminals ([`conn_closed`]), and so do a closed
//! channel and an uplink that goes ([`chan_closed`]).
//!
//! A channel's output never waits: the reactor seals it and queues it on
//! the link's bounded outbox (src/uplink/channels.rs). Once that outbox
//! holds `UPLINK_TERMINAL_BACKLOG` frames the path to the gateway is not
//! keeping up, and the channel's terminal is closed with `terminal.exited`
//! `slow` rather than let its output fill the outbox (which would close
//! the uplink and every channel with it) or drop chunks (which would
//! leave the client's screen wrong with no sign). The client may open it
//! again: the first output of an open is a full redraw. A client slower
//! than its gateway meets the gateway's 64-frame queue first, which
//! closes its channel (`relay.closed`), freeing the terminal the same way.
//!
//! Also here: the transcripts of tmux Claude Code sessions, read from their
//! files on the tmux workers (the section below says how they are kept and
//! polled), and the host's wakelock, whose systemd-inhibit child the
//! reactor holds (src/tmux/wakelock.rs).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Sender;
use mio::Token;
use serde_json::{Value, json};

use crate::daemon::{Daemon, Req};
use crate::errors::{Code, RpcError};
use crate::limits;
use crate::reactor::Msg;
use crate::socket::watches::Subscriber;
use crate::tmux::terminal::{self, Event, Input, Spec};
use crate::tmux::worker::{Ctx, Pool};
use crate::tmux::{
    Change, DEFAULT_SERVER, Effect, OWN_SERVER, Op, Report, Server, Session, Socket, Tmux,
};

/// The tmux subsystem and its workers, and the live terminals: the
/// daemon's `tmux` field.
pub struct Routes {
    pub state: Tmux<Req>,
    pool: Pool,
    home: PathBuf,
    inbox: crate::reactor::Inbox,
    terms: Terms,
    files: Files,
    wake: Wake,
    /// Calls on a tmux session the last scan did not see, waiting for the
    /// scan that runs (at most `TMUX_WAITERS_MAX`; [`when_seen`]).
    unseen: Vec<(Req, String, Then)>,
}

/// What a call does once the scans have had their chance to see its tmux
/// session: it gets the session as the last scan saw it, or `None`.
pub type Then = Box<dyn FnOnce(&mut Daemon, Req, Option<Session>)>;

/// The host's wakelock (src/tmux/wakelock.rs): whether the probe said
/// systemd-inhibit works, the lock held, and the generation of its timer.
#[derive(Default)]
struct Wake {
    supported: bool,
    held: Option<crate::tmux::wakelock::Held>,
    generation: u64,
}

/// The live terminals (seed 004, Terminals), by owner and term_id, and
/// the channels that asked for `terminal.changed` (module comment).
#[derive(Default)]
struct Terms {
    open: HashMap<Key, Term>,
    by_num: HashMap<u64, Key>,
    next: u64,
    /// Relay channels that listed, created, opened, killed or renamed a
    /// persistent terminal: they hear `terminal.changed` from then on, as
    /// an operator connection that watches the sessions does.
    chan_watchers: std::collections::HashSet<Subscriber>,
}

/// A live terminal's owner and term_id.
type Key = (Subscriber, String);

struct Term {
    num: u64,
    target: Target,
    input: Sender<Input>,
    /// The terminal.open not answered yet: answered once the client is
    /// attached, before any output.
    opening: Option<Req>,
    /// For a viewer pane: the session it follows and the wake of its feed
    /// (src/tmux/viewer.rs), woken by [`session_committed`].
    feed: Option<FeedWake>,
}

/// A viewer pane's session id and the wake of its feed.
type FeedWake = (String, Sender<()>);

impl Terms {
    /// Forgets terminal `key` and tells its threads to close it.
    fn close(&mut self, key: &Key) -> Option<Term> {
        let t = self.open.remove(key)?;
        self.by_num.remove(&t.num);
        let _ = t.input.try_send(Input::Close);
        Some(t)
    }
}

impl Routes {
    /// The subsystem for the operator's `default` server and the daemon's
    /// own; its workers report to the reactor through `inbox`, and start
    /// with the first job.
    pub fn start(inbox: crate::reactor::Inbox) -> Routes {
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
        let probed = inbox.clone();
        let started = crate::probe_thread::spawn("wakelock-probe", move || {
            let ok = crate::tmux::wakelock::probe();
            probed.send(Msg::Run(Box::new(move |d: &mut Daemon| {
                wakelock_probed(d, ok)
            })));
        });
        if let Err(e) = started {
            crate::warn!(
                "unable to start the wakelock probe: {}; no wakelock is served",
                crate::errors::io_cause(&e)
            );
        }
        let reports = inbox.clone();
        let pool = Pool::new(Ctx { home: home.clone() }, move |r: Report| {
            reports.send(Msg::Run(Box::new(move |d: &mut Daemon| report(d, r))));
        });
        Routes {
            state: Tmux::new(servers),
            pool,
            home,
            inbox,
            terms: Terms::default(),
            files: Files::default(),
            wake: Wake::default(),
            unseen: Vec::new(),
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

/// A call on no pane (host methods, persistent terminals), on a tmux
/// worker.
pub fn call(d: &mut Daemon, req: Req, op: Op) {
    let fx = d.tmux.state.call(req, op);
    apply(d, fx);
}

/// A connection began to watch the sessions (`sessions.subscribe`).
pub fn watched(d: &mut Daemon, conn: Token) {
    // Only the operator reads tmux sessions, so only an operator's watch
    // makes the daemon scan.
    let operator = d
        .socket
        .conns
        .get(&conn)
        .is_some_and(|c| c.class.is_operator());
    if !operator || !d.socket.watches.watchers().any(|t| t == conn) {
        return;
    }
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
    let fx = d.tmux.state.watch();
    apply(d, fx);
}

/// A worker's report.
fn report(d: &mut Daemon, r: Report) {
    if let Report::Transcript { sid, read } = r {
        return transcript_read(d, sid, read);
    }
    let scanned = matches!(r, Report::Scanned { .. });
    let fx = d.tmux.state.on_report(r, crate::clock::now_ms());
    apply(d, fx);
    if scanned {
        // The scan is fresh now (or another runs, which they wait for).
        for (req, sid, then) in std::mem::take(&mut d.tmux.unseen) {
            when_seen(d, req, sid, then);
        }
    }
}

/// Runs `then` with tmux session `sid` as the scans know it: at once when
/// the last scan saw it or is fresh, and after a new scan otherwise, so
/// that a pane that appeared since (one a spawn just made, one the
/// operator opened by hand) is found (module comment of src/tmux/mod.rs,
/// Rescans). Past `TMUX_WAITERS_MAX` waiting, it answers from what it has.
pub fn when_seen(d: &mut Daemon, req: Req, sid: String, then: Then) {
    let seen = d.tmux.state.sessions().any(|s| s.found.id == sid);
    if !seen && d.tmux.unseen.len() < limits::TMUX_WAITERS_MAX {
        let (wait, fx) = d.tmux.state.rescan(crate::clock::now_ms());
        if wait {
            d.tmux.unseen.push((req, sid, then));
            apply(d, fx);
            return;
        }
    }
    let s = d.tmux.state.sessions().find(|s| s.found.id == sid).cloned();
    then(d, req, s)
}

/// A relay channel began: it watches the sessions as an operator's
/// `sessions.subscribe` does (src/uplink/channels.rs sent it the tmux
/// sessions of the last scan with its snapshot), so a scan now, and the
/// timer while channels are open.
pub fn chan_watching(d: &mut Daemon) {
    let fx = d.tmux.state.watch();
    apply(d, fx);
}

fn tick(d: &mut Daemon) {
    let watched = operator_watchers(d).next().is_some() || crate::uplink::channels::any_open(d);
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
                let scan = matches!(job, crate::tmux::Job::Scan { .. });
                if let Err(job) = d.tmux.pool.submit(job) {
                    queue.extend(d.tmux.state.refused(*job));
                    if scan {
                        for (req, ..) in std::mem::take(&mut d.tmux.unseen) {
                            d.answer(
                                req,
                                Err(RpcError::new(
                                    Code::Unavailable,
                                    "too many tmux calls are waiting; try again",
                                )),
                            );
                        }
                    }
                }
            }
            Effect::Reply(req, result) => crate::socket::methods::tmux::reply(d, req, result),
            Effect::Changed(changes) => notify(d, &changes),
            Effect::ArmRescan => {
                d.reactor
                    .schedule(Duration::from_millis(limits::TMUX_RESCAN_MS), tick);
            }
            Effect::TerminalsChanged => terminals_changed(d),
        }
    }
}

/// Sends each change to the operator connections that watch the sessions
/// and to every relay channel (counted in its event buffer, as the
/// daemon's own sessions' events are).
fn notify(d: &mut Daemon, changes: &[Change]) {
    let targets: Vec<Token> = operator_watchers(d).collect();
    let chans = crate::uplink::channels::any_open(d);
    if targets.is_empty() && !chans {
        return;
    }
    let node = d.node_name.clone();
    for c in changes {
        let (kind, s) = match c {
            Change::Added(s) => ("added", s),
            Change::Updated(s) => ("updated", s),
            Change::Removed(s) => ("removed", s),
        };
        let view = crate::socket::methods::tmux::session(s, &node);
        let line = event_line(kind, &view);
        for t in &targets {
            d.send(*t, &line);
        }
        if chans {
            crate::uplink::channels::on_tmux(d, kind, &view);
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

/// What a live terminal shows: a tmux session's pane, or a persistent
/// terminal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Session(String),
    Terminal(String),
}

/// What terminal.open asks for, checked by the socket's method.
pub struct OpenTerminal {
    pub term_id: String,
    pub target: Target,
    pub cols: u16,
    pub rows: u16,
    pub client_pane: Option<String>,
    /// For one of the daemon's own sessions (which have no pane): its
    /// directory, checked, where the viewer pane starts.
    pub viewer_cwd: Option<PathBuf>,
}

/// terminal.open by `who` (a connection or a channel): answered once
/// attached. A second open of the same term_id replaces the first; an open
/// of a session that another terminal shows evicts that one, whoever holds
/// it (the last opener wins). A tmux session the last scan did not see is
/// looked for as the pane methods look for theirs ([`when_seen`]).
pub fn open_terminal(d: &mut Daemon, req: Req, who: Subscriber, o: OpenTerminal) {
    match &o.target {
        Target::Session(id) if d.tmux.state.owns_id(id) => {
            let id = id.clone();
            when_seen(
                d,
                req,
                id,
                Box::new(move |d, req, _| open_now(d, req, who, o)),
            );
        }
        _ => open_now(d, req, who, o),
    }
}

fn open_now(d: &mut Daemon, req: Req, who: Subscriber, o: OpenTerminal) {
    if !alive(d, &who) {
        // Gone while the open waited for a scan: nothing would close it.
        return;
    }
    let (spec, feed) = match spec_of(d, &o) {
        Ok(s) => s,
        Err(e) => return d.answer(req, Err(e)),
    };
    if matches!(o.target, Target::Terminal(_)) {
        watch_terminals(d, &who);
    }
    let key = (who, o.term_id.clone());
    close_term(d, &key);
    let evicted: Vec<Key> = d
        .tmux
        .terms
        .open
        .iter()
        .filter(|(_, t)| t.target == o.target)
        .map(|(k, _)| k.clone())
        .collect();
    for k in evicted {
        if let Some(t) = close_term(d, &k) {
            if let Some(r) = t.opening {
                d.answer(
                    r,
                    Err(RpcError::new(
                        Code::NoTerminalControl,
                        "terminal not available for this session: a newer terminal.open took it",
                    )),
                );
            }
            send_note(
                d,
                &k.0,
                "terminal.exited",
                &json!({"term_id": k.1, "reason": "evicted"}),
            );
        }
    }
    if d.tmux.terms.open.len() >= limits::TERMINALS_MAX {
        d.answer(
            req,
            Err(RpcError::new(
                Code::Unavailable,
                format!(
                    "at most {} terminals are open at once",
                    limits::TERMINALS_MAX
                ),
            )),
        );
        return;
    }
    d.tmux.terms.next += 1;
    let num = d.tmux.terms.next;
    let inbox = d.tmux.inbox.clone();
    let sink: terminal::Sink = Arc::new(move |ev: Event| {
        inbox.send(Msg::Run(Box::new(move |d: &mut Daemon| {
            terminal_event(d, ev)
        })));
    });
    match terminal::open(num, spec, sink) {
        Ok(input) => {
            d.tmux.terms.by_num.insert(num, key.clone());
            d.tmux.terms.open.insert(
                key,
                Term {
                    num,
                    target: o.target.clone(),
                    input,
                    opening: Some(req),
                    feed,
                },
            );
        }
        Err(why) => d.answer(req, Err(RpcError::new(Code::Unavailable, why))),
    }
}

/// Sends notification `method` to a connection or a channel (sealed on an
/// E2EE one); false when the channel is gone.
fn send_note(d: &mut Daemon, to: &Subscriber, method: &str, params: &Value) -> bool {
    match to {
        Subscriber::Conn(conn) => {
            d.send(*conn, &note(method, params.clone()));
            true
        }
        Subscriber::Chan { link, chan } => {
            let plain = serde_json::to_vec(params).unwrap_or_default();
            crate::uplink::channels::notify_plain(d, *link, chan, method, &plain)
        }
    }
}

/// Whether the connection or channel `who` is still open.
fn alive(d: &Daemon, who: &Subscriber) -> bool {
    match who {
        Subscriber::Conn(conn) => d.socket.conns.contains_key(conn),
        Subscriber::Chan { link, chan } => crate::uplink::channels::exists(d, *link, chan),
    }
}

/// The terminal `term_id` of `who`, or the seed's error.
fn term<'a>(d: &'a Daemon, who: &Subscriber, term_id: &str) -> Result<&'a Term, RpcError> {
    d.tmux
        .terms
        .open
        .get(&(who.clone(), term_id.to_string()))
        .ok_or_else(|| RpcError::new(Code::NotFound, format!("unknown term_id: {term_id}")))
}

/// Whether `who` has terminal `term_id`, as the seed's error.
pub fn terminal_known(d: &Daemon, who: &Subscriber, term_id: &str) -> Result<(), RpcError> {
    term(d, who, term_id).map(drop)
}

/// terminal.input and terminal.resize: queued to the terminal's writer.
pub fn terminal_input(
    d: &mut Daemon,
    who: &Subscriber,
    term_id: &str,
    input: Input,
) -> Result<(), RpcError> {
    term(d, who, term_id)?.input.try_send(input).map_err(|_| {
        RpcError::new(
            Code::Unavailable,
            format!("terminal {term_id} takes no more input now; try again"),
        )
    })
}

/// terminal.close: no terminal.exited follows.
pub fn terminal_close(d: &mut Daemon, who: &Subscriber, term_id: &str) -> Result<(), RpcError> {
    term(d, who, term_id)?;
    close_term(d, &(who.clone(), term_id.to_string()));
    Ok(())
}

/// A connection closed: its terminals close with it.
pub fn conn_closed(d: &mut Daemon, conn: Token) {
    owner_closed(d, |w| *w == Subscriber::Conn(conn));
}

/// Relay channel `chan` of link `link` was closed (`relay.closed`, a
/// desynchronised record, the trust log), or every channel of the link
/// when `chan` is `None` (the uplink went): their terminals close, their
/// transcript file subscriptions end and they hear no `terminal.changed`.
pub fn chan_closed(d: &mut Daemon, link: u64, chan: Option<&str>) {
    owner_closed(d, |w| match w {
        Subscriber::Chan { link: l, chan: c } => *l == link && chan.is_none_or(|want| want == c),
        Subscriber::Conn(_) => false,
    });
}

fn owner_closed(d: &mut Daemon, gone: impl Fn(&Subscriber) -> bool) {
    d.tmux.terms.chan_watchers.retain(|w| !gone(w));
    let keys: Vec<Key> = d
        .tmux
        .terms
        .open
        .keys()
        .filter(|k| gone(&k.0))
        .cloned()
        .collect();
    for k in keys {
        close_term(d, &k);
    }
    d.tmux.files.subs.retain(|k, _| !gone(&k.0));
}

/// A relay channel asked about persistent terminals: it hears
/// `terminal.changed` from now on (module comment).
pub fn watch_terminals(d: &mut Daemon, who: &Subscriber) {
    if matches!(who, Subscriber::Chan { .. }) {
        d.tmux.terms.chan_watchers.insert(who.clone());
    }
}

fn terminal_event(d: &mut Daemon, ev: Event) {
    let num = match &ev {
        Event::Opened { term }
        | Event::Failed { term, .. }
        | Event::Output { term, .. }
        | Event::Exited { term } => *term,
    };
    let Some(key) = d.tmux.terms.by_num.get(&num).cloned() else {
        return;
    };
    match ev {
        Event::Failed { why, .. } => {
            if let Some(t) = close_term(d, &key) {
                if let Some(r) = t.opening {
                    d.answer(r, Err(RpcError::new(Code::NoTerminalControl, why)));
                }
            }
        }
        Event::Opened { .. } => answer_open(d, &key),
        Event::Output { data, .. } => {
            answer_open(d, &key);
            if let Subscriber::Chan { link, .. } = &key.0 {
                if !crate::uplink::channels::has_room_for_output(d, *link) {
                    // Module comment: the path to the gateway lags.
                    close_term(d, &key);
                    send_note(
                        d,
                        &key.0,
                        "terminal.exited",
                        &json!({"term_id": key.1, "reason": "slow"}),
                    );
                    return;
                }
            }
            let p = json!({"term_id": key.1, "data": terminal::b64_encode(&data)});
            if !send_note(d, &key.0, "terminal.output", &p) {
                close_term(d, &key);
            }
        }
        Event::Exited { .. } => {
            if let Some(t) = close_term(d, &key) {
                if let Some(r) = t.opening {
                    d.answer(
                        r,
                        Err(RpcError::new(
                            Code::NoTerminalControl,
                            "terminal not available for this session",
                        )),
                    );
                    return;
                }
            }
            send_note(
                d,
                &key.0,
                "terminal.exited",
                &json!({"term_id": key.1, "reason": "exited"}),
            );
        }
    }
}

/// Answers terminal.open once, before the terminal's first output; an
/// attach to a persistent terminal that begins is a `terminal.changed`.
fn answer_open(d: &mut Daemon, key: &Key) {
    let Some(t) = d.tmux.terms.open.get_mut(key) else {
        return;
    };
    let Some(r) = t.opening.take() else {
        return;
    };
    let persistent = matches!(t.target, Target::Terminal(_));
    d.answer(r, Ok(serde_json::Value::Null));
    if persistent {
        terminals_changed(d);
    }
}

fn note(method: &str, params: serde_json::Value) -> Vec<u8> {
    let mut line = json!({"jsonrpc": "2.0", "method": method, "params": params})
        .to_string()
        .into_bytes();
    line.push(b'\n');
    line
}

/// How to attach to what `o` names, or the seed's error.
fn spec_of(d: &Daemon, o: &OpenTerminal) -> Result<(Spec, Option<FeedWake>), RpcError> {
    let not_available = || {
        RpcError::new(
            Code::NoTerminalControl,
            "terminal not available for this session",
        )
    };
    match &o.target {
        Target::Session(id) => {
            let Some(s) = d.tmux.state.sessions().find(|s| &s.found.id == id) else {
                return match (&o.viewer_cwd, d.core.sessions.get(id).is_some()) {
                    (Some(cwd), true) => {
                        // One wake waiting is enough: the feed reads all
                        // that is new when it wakes.
                        let (tx, rx) = crossbeam_channel::bounded(1);
                        Ok((viewer_spec(d, o, id, cwd, rx)?, Some((id.clone(), tx))))
                    }
                    (None, true) => Err(not_available()),
                    _ => Err(RpcError::new(
                        Code::SessionNotFound,
                        format!("unknown session: {id}"),
                    )),
                };
            };
            let server = d
                .tmux
                .state
                .servers()
                .find(|x| x.name == s.found.server)
                .cloned()
                .ok_or_else(not_available)?;
            Ok((
                Spec {
                    server,
                    session_name: s.found.pane.session_name.clone(),
                    window_index: Some(s.found.pane.window_index),
                    pane: s.found.pane.pane_id.clone(),
                    cols: o.cols,
                    rows: o.rows,
                    client_pane: o.client_pane.clone(),
                    gone: format!("unknown session: {id}"),
                    refusal:
                        "terminal not available for this session: client_pane is in its window"
                            .into(),
                    feed: None,
                },
                None,
            ))
        }
        Target::Terminal(id) => {
            let server = d.tmux.state.own_server().cloned().ok_or_else(|| {
                RpcError::new(Code::InvalidRequest, "terminals not supported on this node")
            })?;
            let session_name = format!("{}{id}", crate::tmux::persistent::PREFIX);
            Ok((
                Spec {
                    server,
                    pane: format!("={session_name}:"),
                    session_name,
                    window_index: None,
                    cols: o.cols,
                    rows: o.rows,
                    client_pane: o.client_pane.clone(),
                    gone: format!("unknown terminal: {id}"),
                    refusal: "this terminal holds your client; use it directly".into(),
                    feed: None,
                },
                None,
            ))
        }
    }
}

/// How to show daemon session `id`, which has no pane, in `cwd`: a
/// viewer pane of the daemon's own server following its transcript
/// (src/tmux/terminal.rs says how).
fn viewer_spec(
    d: &Daemon,
    o: &OpenTerminal,
    id: &str,
    cwd: &std::path::Path,
    wake: crossbeam_channel::Receiver<()>,
) -> Result<Spec, RpcError> {
    let server = d.tmux.state.own_server().cloned().ok_or_else(|| {
        RpcError::new(Code::InvalidRequest, "terminals not supported on this node")
    })?;
    Ok(Spec {
        server,
        session_name: String::new(),
        window_index: None,
        pane: String::new(),
        cols: o.cols,
        rows: o.rows,
        client_pane: o.client_pane.clone(),
        gone: format!("unknown session: {id}"),
        refusal: "terminal not available for this session: client_pane is in its window".into(),
        feed: Some(terminal::Feed {
            cwd: cwd.to_path_buf(),
            source: crate::tmux::viewer::Source {
                ledger: d.paths.ledger.clone(),
                stream: id.to_string(),
                dir: d.paths.state_dir.join("viewers"),
                wake,
            },
        }),
    })
}

/// Wakes the viewer panes that follow session `sid`: a round of it was
/// committed (its transcript grew or an event was recorded).
pub fn session_committed(d: &mut Daemon, sid: &str) {
    for t in d.tmux.terms.open.values() {
        if let Some((of, wake)) = &t.feed {
            if of == sid {
                // Full: a wake already waits, which covers this round too.
                let _ = wake.try_send(());
            }
        }
    }
}

/// The persistent terminals a live terminal shows now (their `attached`).
pub fn attached_terminals(d: &Daemon) -> Vec<String> {
    d.tmux
        .terms
        .open
        .values()
        .filter_map(|t| match &t.target {
            Target::Terminal(id) => Some(id.clone()),
            Target::Session(_) => None,
        })
        .collect()
}

/// `terminal.changed` to every operator connection that watches the
/// sessions: a persistent terminal was created, killed or renamed, or an
/// attach to one began or ended.
pub fn terminals_changed(d: &mut Daemon) {
    let targets: Vec<Token> = operator_watchers(d).collect();
    let line = note("terminal.changed", json!({}));
    for t in targets {
        d.send(t, &line);
    }
    let chans: Vec<Subscriber> = d.tmux.terms.chan_watchers.iter().cloned().collect();
    for c in chans {
        if !send_note(d, &c, "terminal.changed", &json!({})) {
            d.tmux.terms.chan_watchers.remove(&c);
        }
    }
}

/// Closes terminal `key`; an attach to a persistent terminal that ends is
/// a `terminal.changed`.
fn close_term(d: &mut Daemon, key: &Key) -> Option<Term> {
    let t = d.tmux.terms.close(key)?;
    if matches!(t.target, Target::Terminal(_)) && t.opening.is_none() {
        terminals_changed(d);
    }
    Some(t)
}

// ---- transcripts of discovered Claude Code sessions (src/tmux/transcript.rs) ----
//
// Each session whose transcript someone reads has a slot: its parsed file
// (absent while a worker reads on it), the requests waiting for that read,
// and where the session works (to follow it to a new file). All the
// subscriptions of one slot have been told the same state, so one read's
// changes make the same delta for each. While any subscription exists the
// daemon reads each subscribed file every `TRANSCRIPT_POLL_MS`; with none,
// the timer is not re-armed. A slot with neither subscribers nor waiting
// requests keeps its parse (so a second view reads only what was
// appended), at most `TRANSCRIPT_FILES_IDLE_MAX` of them.

/// What a request on a session's transcript wants once it is read.
pub enum Want {
    View,
    Tool(String),
    Tasks,
    Subscribe {
        who: Subscriber,
        sub_id: String,
        have: usize,
    },
}

#[derive(Default)]
struct Files {
    slots: HashMap<String, Slot>,
    /// (connection or channel, sub_id) -> session id.
    subs: HashMap<(Subscriber, String), String>,
    armed: bool,
}

/// One followed file: a session's transcript (keyed by the session id) or
/// one of its subagents' (keyed `<session id>#<agent_id>`).
struct Slot {
    session: String,
    agent: Option<String>,
    cwd: String,
    path: PathBuf,
    file: Option<Box<crate::tmux::transcript::File>>,
    reading: bool,
    waiting: Vec<(Req, Want)>,
}

/// A request on the transcript of tmux session `sid` (or of its subagent
/// `agent`): answered after a read of what was appended to its file.
pub fn transcript_request(
    d: &mut Daemon,
    req: Req,
    sid: String,
    agent: Option<String>,
    want: Want,
) {
    // A session a stale scan does not know may be there ([`when_seen`]).
    when_seen(
        d,
        req,
        sid.clone(),
        Box::new(move |d, req, s| transcript_seen(d, req, sid, s, agent, want)),
    );
}

fn transcript_seen(
    d: &mut Daemon,
    req: Req,
    sid: String,
    s: Option<Session>,
    agent: Option<String>,
    want: Want,
) {
    let Some(s) = s else {
        return d.answer(
            req,
            Err(RpcError::new(
                Code::SessionNotFound,
                format!("unknown session: {sid}"),
            )),
        );
    };
    let Some(path) = s.found.transcript_path.clone() else {
        return d.answer(
            req,
            Err(RpcError::new(
                Code::NotFound,
                format!("session has no transcript: {sid}"),
            )),
        );
    };
    let cwd = s.found.cwd.clone();
    // The file the session's transcript was last followed to, if it is
    // followed, is newer than the last scan's.
    let path = d
        .tmux
        .files
        .slots
        .get(&sid)
        .map(|x| x.path.clone())
        .unwrap_or_else(|| PathBuf::from(path));
    let (key, path) = match &agent {
        None => (sid.clone(), path),
        Some(a) => match crate::tmux::transcript::subagent_path(&path, a) {
            Some(p) => (format!("{sid}#{a}"), p),
            None => {
                return d.answer(
                    req,
                    Err(RpcError::new(
                        Code::NotFound,
                        format!("unknown subagent: {a}"),
                    )),
                );
            }
        },
    };
    let files = &mut d.tmux.files;
    if !files.slots.contains_key(&key) {
        let busy = files
            .slots
            .values()
            .filter(|x| x.reading || !x.waiting.is_empty())
            .count();
        if busy >= limits::TRANSCRIPT_FILES_MAX {
            return d.answer(
                req,
                Err(RpcError::new(
                    Code::Unavailable,
                    "too many transcripts are being read; try again",
                )),
            );
        }
        files.slots.insert(
            key.clone(),
            Slot {
                session: sid,
                agent,
                cwd,
                path,
                file: None,
                reading: false,
                waiting: Vec::new(),
            },
        );
    }
    if let Some(slot) = d.tmux.files.slots.get_mut(&key) {
        if slot.waiting.len() >= limits::TMUX_WAITERS_MAX {
            return d.answer(
                req,
                Err(RpcError::new(
                    Code::Unavailable,
                    "too many requests wait for this transcript; try again",
                )),
            );
        }
        slot.waiting.push((req, want));
    }
    read_transcript(d, &key);
}

/// Hands slot `sid`'s file to a worker unless one reads it already.
fn read_transcript(d: &mut Daemon, sid: &str) {
    let Some(slot) = d.tmux.files.slots.get_mut(sid) else {
        return;
    };
    if slot.reading {
        return;
    }
    slot.reading = true;
    let job = crate::tmux::Job::Transcript {
        sid: sid.to_string(),
        cwd: slot.cwd.clone(),
        path: slot.path.clone(),
        file: slot.file.take(),
        subagent: slot.agent.is_some(),
    };
    if let Err(job) = d.tmux.pool.submit(job) {
        // Refused: the parse comes back, the waiting requests fail.
        let crate::tmux::Job::Transcript { file, .. } = *job else {
            return;
        };
        let Some(slot) = d.tmux.files.slots.get_mut(sid) else {
            return;
        };
        slot.reading = false;
        slot.file = file;
        let waiting = std::mem::take(&mut slot.waiting);
        for (r, _) in waiting {
            d.answer(
                r,
                Err(RpcError::new(
                    Code::Unavailable,
                    "too many tmux calls are waiting; try again",
                )),
            );
        }
    }
}

/// A worker read on slot `sid`: deltas to its subscribers, then the
/// waiting requests answered.
fn transcript_read(d: &mut Daemon, sid: String, read: crate::tmux::transcript::Followed) {
    let Some(slot) = d.tmux.files.slots.get_mut(&sid) else {
        return;
    };
    slot.reading = false;
    let mut file = read.file;
    slot.path = file.path.clone();
    let waiting = std::mem::take(&mut slot.waiting);
    let (session, agent) = (slot.session.clone(), slot.agent.clone());
    if let Some(e) = &read.error {
        crate::debug!("transcript {sid}: {e}");
    }
    if let (Some(a), true) = (&agent, read.missing) {
        // No such subagent: its requests fail, its subscriptions end.
        d.tmux.files.slots.remove(&sid);
        d.tmux.files.subs.retain(|_, s| *s != sid);
        for (req, _) in waiting {
            d.answer(
                req,
                Err(RpcError::new(
                    Code::NotFound,
                    format!("unknown subagent: {a}"),
                )),
            );
        }
        return;
    }
    // Subagent transcripts never carry queue (seed 004).
    let main = agent.is_none();
    let subs: Vec<(Subscriber, String)> = d
        .tmux
        .files
        .subs
        .iter()
        .filter(|(_, s)| **s == sid)
        .map(|(k, _)| k.clone())
        .collect();
    let from = if read.switched {
        Some(0)
    } else {
        file.changed_from
    };
    if from.is_some() || (main && file.queue_changed) || read.switched {
        let from = from.unwrap_or(file.entries.len());
        let entries = file.wire_from(from);
        for (who, sub_id) in &subs {
            let mut p = json!({"sub_id": sub_id, "from_index": from, "entries": entries});
            if main && (file.queue_changed || read.switched) {
                p["queue"] = file.queue_wire();
            }
            send_note(d, who, "transcript.delta", &p);
        }
    }
    if file.settle() && main {
        for (who, sub_id) in &subs {
            let p = json!({"sub_id": sub_id, "session_id": session});
            send_note(d, who, "tasks.changed", &p);
        }
    }
    for (req, want) in waiting {
        let out = match want {
            Want::View => {
                let start = file
                    .entries
                    .len()
                    .saturating_sub(limits::TRANSCRIPT_PAGE_MAX);
                Ok(json!({"entries": file.wire_from(start)}))
            }
            Want::Tool(tool_id) => file.tool_detail(&tool_id).ok_or_else(|| {
                RpcError::new(
                    Code::NotFound,
                    format!("session {session} has no tool call {tool_id}"),
                )
            }),
            Want::Tasks => Ok(json!({
                "tasks": file.tasks.iter().map(|t| t.wire()).collect::<Vec<_>>(),
            })),
            Want::Subscribe { who, sub_id, have } => {
                let start = file.subscribe_start(have).max(
                    file.entries
                        .len()
                        .saturating_sub(limits::TRANSCRIPT_PAGE_MAX),
                );
                let per_conn = d.tmux.files.subs.keys().filter(|k| k.0 == who).count();
                let alive = alive(d, &who);
                let key = (who, sub_id.clone());
                if !d.tmux.files.subs.contains_key(&key)
                    && per_conn >= limits::TRANSCRIPT_SUBS_PER_CONN
                {
                    Err(RpcError::new(
                        Code::Unavailable,
                        format!(
                            "at most {} transcript subscriptions per connection",
                            limits::TRANSCRIPT_SUBS_PER_CONN
                        ),
                    ))
                } else if !alive {
                    Ok(Value::Null)
                } else {
                    d.tmux.files.subs.insert(key, sid.clone());
                    let mut first = json!({
                        "sub_id": sub_id,
                        "from_index": start,
                        "entries": file.wire_from(start),
                    });
                    if main {
                        first["queue"] = file.queue_wire();
                    }
                    Ok(first)
                }
            }
        };
        d.answer(req, out);
    }
    if let Some(slot) = d.tmux.files.slots.get_mut(&sid) {
        slot.file = Some(file);
    }
    forget_idle(d);
    arm_transcripts(d);
}

/// Drops the parses no one subscribes to past `TRANSCRIPT_FILES_IDLE_MAX`.
fn forget_idle(d: &mut Daemon) {
    let files = &mut d.tmux.files;
    let idle: Vec<String> = files
        .slots
        .iter()
        .filter(|(sid, s)| {
            !s.reading && s.waiting.is_empty() && !files.subs.values().any(|x| x == *sid)
        })
        .map(|(k, _)| k.clone())
        .collect();
    for sid in idle
        .iter()
        .skip(limits::TRANSCRIPT_FILES_IDLE_MAX.min(idle.len()))
    {
        files.slots.remove(sid);
    }
}

/// Starts the read timer while someone subscribes.
fn arm_transcripts(d: &mut Daemon) {
    if d.tmux.files.armed || d.tmux.files.subs.is_empty() {
        return;
    }
    d.tmux.files.armed = true;
    d.reactor.schedule(
        Duration::from_millis(limits::TRANSCRIPT_POLL_MS),
        transcripts_tick,
    );
}

fn transcripts_tick(d: &mut Daemon) {
    d.tmux.files.armed = false;
    let mut sids: Vec<String> = d.tmux.files.subs.values().cloned().collect();
    sids.sort();
    sids.dedup();
    for sid in sids {
        read_transcript(d, &sid);
    }
    arm_transcripts(d);
}

/// transcript.unsubscribe of a transcript file subscription; false when
/// `who` has none named `sub_id`.
pub fn transcript_unsubscribe(d: &mut Daemon, who: &Subscriber, sub_id: &str) -> bool {
    d.tmux
        .files
        .subs
        .remove(&(who.clone(), sub_id.to_string()))
        .is_some()
}

// ---- the host's wakelock (src/tmux/wakelock.rs) ----

/// The probe's answer: the lock is served from now on if systemd-inhibit
/// works, and a lock kept from before a restart is taken again.
fn wakelock_probed(d: &mut Daemon, probe: Result<(), String>) {
    use crate::tmux::wakelock;
    d.tmux.wake.supported = probe.is_ok();
    if let Err(why) = probe {
        crate::info!("no wakelock is served (host.setWakelock): {why}");
        return;
    }
    crate::info!("the wakelock is served with systemd-inhibit (host.setWakelock)");
    let Some(until) = wakelock::saved(&d.paths.state_dir) else {
        return;
    };
    if let Err(e) = set_wakelock(d, Some(until.clone())) {
        crate::warn!(
            "the wakelock until {until} was not taken again: {}",
            e.message
        );
        let _ = wakelock::save(&d.paths.state_dir, None);
    }
}

/// `capabilities.host_wakelock`.
pub fn wakelock_supported(d: &Daemon) -> bool {
    d.tmux.wake.supported
}

/// HostWakelock: `{until}` while the lock is held, `{}` otherwise.
pub fn wakelock_view(d: &Daemon) -> Value {
    match &d.tmux.wake.held {
        Some(h) => json!({"until": h.until}),
        None => json!({}),
    }
}

/// `host.setWakelock` (seed 004; src/tmux/wakelock.rs).
pub fn set_wakelock(d: &mut Daemon, until: Option<String>) -> Result<Value, RpcError> {
    use crate::tmux::wakelock;
    if !d.tmux.wake.supported {
        return Err(RpcError::new(
            Code::InvalidRequest,
            "wakelock not supported on this node",
        ));
    }
    let internal = |m: String| RpcError::new(Code::InternalError, m);
    let until = until.filter(|u| !u.is_empty());
    d.tmux.wake.generation += 1;
    let Some(until) = until else {
        d.tmux.wake.held = None;
        wakelock::save(&d.paths.state_dir, None).map_err(internal)?;
        return Ok(json!({}));
    };
    let Some(until_ms) = wakelock::parse_until(&until) else {
        return Err(RpcError::new(
            Code::InvalidRequest,
            format!("invalid until: {until}"),
        ));
    };
    if until_ms <= crate::clock::now_ms() {
        return Err(RpcError::new(
            Code::InvalidRequest,
            format!("until is in the past: {until}"),
        ));
    }
    // One lock at a time: the old child goes before the new one starts.
    d.tmux.wake.held = None;
    let held = wakelock::take(&until, until_ms).map_err(internal)?;
    if let Err(e) = wakelock::save(&d.paths.state_dir, Some(&until)) {
        return Err(internal(e));
    }
    d.tmux.wake.held = Some(held);
    arm_wakelock(d);
    Ok(json!({"until": until}))
}

/// Turns the lock off when its until passes (module comment of
/// src/tmux/wakelock.rs); a later set makes this timer stale.
fn arm_wakelock(d: &mut Daemon) {
    let Some(h) = &d.tmux.wake.held else {
        return;
    };
    if h.until == crate::tmux::wakelock::FOREVER {
        return;
    }
    let left = (h.until_ms - crate::clock::now_ms()).max(0) as u64;
    let generation = d.tmux.wake.generation;
    d.reactor.schedule(
        Duration::from_millis(left.min(limits::WAKELOCK_RECHECK_MS)),
        move |d: &mut Daemon| {
            if d.tmux.wake.generation != generation {
                return;
            }
            let due = d
                .tmux
                .wake
                .held
                .as_ref()
                .is_some_and(|h| h.until_ms <= crate::clock::now_ms());
            if due {
                d.tmux.wake.held = None;
                if let Err(e) = crate::tmux::wakelock::save(&d.paths.state_dir, None) {
                    crate::warn!("{e}");
                }
            } else {
                arm_wakelock(d);
            }
        },
    );
}
