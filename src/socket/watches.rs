//! Who on the daemon socket watches what, and what they are sent (seed
//! 004, Events, Sessions, Transcripts): the connections that asked for
//! `event` notifications (events.subscribe), for `session.event`
//! (sessions.subscribe), the transcript subscriptions
//! (transcript.subscribe) and the deltas committed and not yet sent.
//! A closed connection's watches go with it (`Server::close`).
//!
//! Transcript subscriptions are also kept on relay channels of the uplink
//! (issue 13): a [`Subscriber`] is a socket connection or a channel, and a
//! channel's `transcript.delta`s go out through `uplink::channels`, sealed
//! on an E2EE channel and in order with its answers and `session.event`s.
//! A channel's subscriptions go when it is closed (`relay.closed`, a
//! desynchronised record, the trust log) or its uplink goes; one whose
//! channel is gone when a delta is flushed is dropped then too.
//!
//! The daemon hands every committed round of a session here
//! ([`on_committed`]); the deltas of the batches committed in one wake-up
//! go out merged, one line per subscriber, at the end of that wake-up
//! ([`flush_deltas`]). A subscription names its session by id only; those
//! of a session the core forgets (evicted once ended) go then
//! ([`on_removed`]), when the watchers get its `session.event` `removed`.

use mio::Token;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};

use crate::core::sessions::{self, Change};
use crate::core::transcript::Delta;
use crate::daemon::Daemon;
use crate::errors::RpcError;
use crate::ledger::Appended;
use crate::limits;
use crate::socket::views;

/// Who holds a transcript subscription.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Subscriber {
    /// A daemon socket connection.
    Conn(Token),
    /// A relay channel of the uplink: the link and the channel's id.
    Chan { link: u64, chan: String },
}

/// The socket's watches of sessions.
#[derive(Default)]
pub struct Watches {
    /// Connections that asked for `event` notifications: only these
    /// streams, or every stream. One per connection; a second
    /// events.subscribe replaces the first.
    events: HashMap<Token, Option<HashSet<String>>>,
    /// Connections that asked for `session.event`.
    watchers: HashSet<Token>,
    /// Transcript subscriptions: session -> (subscriber, sub_id).
    tsubs: HashMap<String, Vec<(Subscriber, String)>>,
    /// Committed deltas not sent yet, per session, in commit order.
    outbox: Vec<(String, Delta)>,
}

impl Watches {
    /// Subscribes `conn` to committed events of `streams`, or of every
    /// stream; replaces what it subscribed to before.
    pub fn subscribe_events(&mut self, conn: Token, streams: Option<HashSet<String>>) {
        self.events.insert(conn, streams);
    }

    /// Whether `conn` was subscribed to events.
    pub fn unsubscribe_events(&mut self, conn: Token) -> bool {
        self.events.remove(&conn).is_some()
    }

    pub fn watch(&mut self, conn: Token) {
        self.watchers.insert(conn);
    }

    pub fn unwatch(&mut self, conn: Token) -> bool {
        self.watchers.remove(&conn)
    }

    /// The connections that watch the sessions (the tmux routes send them
    /// the tmux sessions' `session.event`s).
    pub fn watchers(&self) -> impl Iterator<Item = Token> + '_ {
        self.watchers.iter().copied()
    }

    pub fn forget_conn(&mut self, conn: Token) {
        self.events.remove(&conn);
        self.watchers.remove(&conn);
        self.forget_subs(|s| *s == Subscriber::Conn(conn));
    }

    /// Drops the transcript subscriptions of relay channel `chan` of link
    /// `link`, or of every channel of the link when `chan` is `None`.
    pub fn forget_chan(&mut self, link: u64, chan: Option<&str>) {
        self.forget_subs(|s| match s {
            Subscriber::Chan { link: l, chan: c } => {
                *l == link && chan.is_none_or(|want| want == c)
            }
            Subscriber::Conn(_) => false,
        });
    }

    fn forget_subs(&mut self, gone: impl Fn(&Subscriber) -> bool) {
        for subs in self.tsubs.values_mut() {
            subs.retain(|(t, _)| !gone(t));
        }
        self.tsubs.retain(|_, v| !v.is_empty());
    }

    /// Adds (or replaces) a transcript subscription. `held`: whether the
    /// core still holds a session; those of sessions it forgot are dropped
    /// first, so that they do not count against the subscriber's bound
    /// (the same for a connection and a channel).
    pub fn subscribe_transcript(
        &mut self,
        conn: &Subscriber,
        sub_id: &str,
        session: &str,
        held: impl Fn(&str) -> bool,
    ) -> Result<(), RpcError> {
        self.tsubs.retain(|sid, _| held(sid));
        self.unsubscribe_transcript(conn, sub_id);
        let taken: usize = self
            .tsubs
            .values()
            .map(|v| v.iter().filter(|(t, _)| t == conn).count())
            .sum();
        if taken >= limits::TRANSCRIPT_SUBS_PER_CONN {
            return Err(RpcError::invalid_params(format!(
                "a connection holds at most {} transcript subscriptions",
                limits::TRANSCRIPT_SUBS_PER_CONN
            )));
        }
        self.tsubs
            .entry(session.to_string())
            .or_default()
            .push((conn.clone(), sub_id.to_string()));
        Ok(())
    }

    pub fn unsubscribe_transcript(&mut self, conn: &Subscriber, sub_id: &str) -> bool {
        let mut found = false;
        for subs in self.tsubs.values_mut() {
            let before = subs.len();
            subs.retain(|(t, s)| !(t == conn && s == sub_id));
            found |= subs.len() != before;
        }
        self.tsubs.retain(|_, v| !v.is_empty());
        found
    }
}

/// Sends committed events to the connections subscribed to their
/// streams: the line is built once per event and queued to each.
pub fn publish(d: &mut Daemon, events: &[Appended]) {
    if d.socket.watches.events.is_empty() {
        return;
    }
    for ev in events {
        let line = event_line(ev);
        let targets: Vec<Token> = d
            .socket
            .watches
            .events
            .iter()
            .filter(|(_, streams)| streams.as_ref().is_none_or(|set| set.contains(&ev.stream)))
            .map(|(conn, _)| *conn)
            .collect();
        for t in targets {
            d.send(t, &line);
        }
    }
}

/// The `event` notification line for one committed event. `data` is JSON
/// text the daemon serialised itself, so it is embedded as it is.
pub fn event_line(ev: &Appended) -> Vec<u8> {
    let mut line = Vec::with_capacity(ev.data.len() + ev.stream.len() + ev.kind.len() + 96);
    line.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":\"event\",\"params\":{\"stream\":");
    let _ = serde_json::to_writer(&mut line, &ev.stream);
    line.extend_from_slice(format!(",\"seq\":{},\"kind\":", ev.seq).as_bytes());
    let _ = serde_json::to_writer(&mut line, &ev.kind);
    line.extend_from_slice(b",\"ts\":");
    let _ = serde_json::to_writer(&mut line, &ev.ts);
    line.extend_from_slice(b",\"data\":");
    line.extend_from_slice(ev.data.as_bytes());
    line.extend_from_slice(b"}}\n");
    line
}

/// A session's round was committed: its delta waits for [`flush_deltas`],
/// and a change goes to the watchers at once.
pub fn on_committed(d: &mut Daemon, sid: &str, delta: Option<Delta>, change: Option<Change>) {
    if let Some(delta) = delta {
        queue_delta(d, sid, delta);
    }
    match change {
        Some(Change::Added) => notify_session(d, sid, "added"),
        Some(Change::Updated) => notify_session(d, sid, "updated"),
        None => {}
    }
}

/// Holds a committed batch's delta until [`flush_deltas`]: the batches
/// committed together (one group commit) send one merged delta per
/// subscriber, carrying the growing entry once instead of once per batch.
fn queue_delta(d: &mut Daemon, sid: &str, delta: Delta) {
    if !d.socket.watches.tsubs.contains_key(sid) {
        return;
    }
    let out = &mut d.socket.watches.outbox;
    match out.iter_mut().find(|(s, _)| s == sid) {
        Some((_, slot)) => {
            let mut merged = Some(std::mem::replace(
                slot,
                Delta {
                    from: 0,
                    entries: Vec::new(),
                },
            ));
            Delta::merge(&mut merged, delta);
            if let Some(m) = merged {
                *slot = m;
            }
        }
        None => out.push((sid.to_string(), delta)),
    }
}

/// Sends the deltas held by [`queue_delta`]; the daemon runs it once the
/// continuations of a group commit have run. The entries are serialised
/// once per delta; each subscriber's line differs only in its `sub_id`.
pub fn flush_deltas(d: &mut Daemon) {
    if d.socket.watches.outbox.is_empty() {
        return;
    }
    for (sid, delta) in std::mem::take(&mut d.socket.watches.outbox) {
        let Some(subs) = d.socket.watches.tsubs.get(&sid).cloned() else {
            continue;
        };
        if d.core.sessions.get(&sid).is_none() {
            // Forgotten since (evicted): it has no subscribers any more.
            d.socket.watches.tsubs.remove(&sid);
            continue;
        }
        // Written straight into one buffer by the JSON writer that copies
        // strings in runs: the growing entry is most of a busy session's
        // bytes.
        let mut tail = Vec::with_capacity(64);
        tail.extend_from_slice(format!(",\"from_index\":{},\"entries\":", delta.from).as_bytes());
        crate::jsonscan::write_array(&mut tail, &delta.entries);
        tail.extend_from_slice(b"}}\n");
        let mut gone = Vec::new();
        for (who, sub_id) in subs {
            let conn = match who {
                Subscriber::Conn(conn) => conn,
                Subscriber::Chan { link, chan } => {
                    // The same params as the socket's line, without its
                    // envelope: the channel seals them as the body.
                    let mut params = Vec::with_capacity(tail.len() + sub_id.len() + 16);
                    params.extend_from_slice(b"{\"sub_id\":");
                    let _ = serde_json::to_writer(&mut params, &sub_id);
                    params.extend_from_slice(&tail[..tail.len() - 2]);
                    let sent = crate::uplink::channels::notify_plain(
                        d,
                        link,
                        &chan,
                        "transcript.delta",
                        &params,
                    );
                    if !sent {
                        gone.push((link, chan));
                    }
                    continue;
                }
            };
            // Each subscriber's line differs only in its head: the head and
            // the shared tail go into the connection's queue as they are.
            let mut head = Vec::with_capacity(sub_id.len() + 80);
            head.extend_from_slice(
                b"{\"jsonrpc\":\"2.0\",\"method\":\"transcript.delta\",\"params\":{\"sub_id\":",
            );
            let _ = serde_json::to_writer(&mut head, &sub_id);
            d.send_parts(conn, &[&head, &tail]);
        }
        for (link, chan) in gone {
            d.socket.watches.forget_chan(link, Some(&chan));
        }
    }
}

fn note(method: &str, params: Value) -> Vec<u8> {
    let mut line = json!({"jsonrpc": "2.0", "method": method, "params": params})
        .to_string()
        .into_bytes();
    line.push(b'\n');
    line
}

/// Sends `session.event` to every watcher that may read the session:
/// built once, queued to each.
fn notify_session(d: &mut Daemon, sid: &str, kind: &str) {
    if d.socket.watches.watchers.is_empty() {
        return;
    }
    let Some(s) = d.core.sessions.get(sid) else {
        return;
    };
    let view = views::session(s, &d.node_name);
    send_session_event(d, sid, kind, view);
}

/// Session `sid` was forgotten (ended, evicted): its watchers get
/// `removed` with its last state, `view`, and its transcript
/// subscriptions go with its deltas not sent yet.
pub fn on_removed(d: &mut Daemon, sid: &str, view: Value) {
    let w = &mut d.socket.watches;
    w.tsubs.remove(sid);
    w.outbox.retain(|(s, _)| s != sid);
    if !w.watchers.is_empty() {
        send_session_event(d, sid, "removed", view);
    }
}

fn send_session_event(d: &mut Daemon, sid: &str, kind: &str, view: Value) {
    let line = note("session.event", json!({"type": kind, "session": view}));
    let conns = &d.socket.conns;
    let targets: Vec<Token> = d
        .socket
        .watches
        .watchers
        .iter()
        .copied()
        .filter(|t| {
            conns
                .get(t)
                .is_some_and(|c| sessions::may_read(&c.class, sid))
        })
        .collect();
    for t in targets {
        d.send(t, &line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_connection_takes_all_its_watches_with_it() {
        let mut w = Watches::default();
        let (a, b) = (Token(1 << 20), Token((1 << 20) + 1));
        w.subscribe_events(a, None);
        w.subscribe_events(b, Some(["x-a".to_string()].into()));
        // A second events.subscribe replaces the first.
        w.subscribe_events(a, Some(["x-b".to_string()].into()));
        assert_eq!(w.events.len(), 2);
        w.watch(a);
        let sa = Subscriber::Conn(a);
        w.subscribe_transcript(&sa, "t1", "s1", |_| true).unwrap();
        w.forget_conn(a);
        assert!(!w.unsubscribe_events(a));
        assert!(!w.unwatch(a));
        assert!(!w.unsubscribe_transcript(&sa, "t1"));
        assert!(w.tsubs.is_empty());
        assert!(w.unsubscribe_events(b));
    }

    #[test]
    fn subscriptions_of_forgotten_sessions_do_not_count_against_the_bound() {
        let mut w = Watches::default();
        let conn = Subscriber::Conn(Token(1 << 20));
        for i in 0..limits::TRANSCRIPT_SUBS_PER_CONN {
            w.subscribe_transcript(&conn, &format!("t{i}"), &format!("s{i}"), |_| true)
                .unwrap();
        }
        let full = w.subscribe_transcript(&conn, "one-more", "s0", |_| true);
        assert_eq!(full.unwrap_err().code, crate::errors::Code::InvalidParams);
        // Replacing a sub_id is not one more.
        w.subscribe_transcript(&conn, "t0", "s1", |_| true).unwrap();
        // Session s2 was evicted: its subscription is dropped, room is made.
        w.subscribe_transcript(&conn, "one-more", "s0", |s| s != "s2")
            .unwrap();
        assert!(!w.tsubs.contains_key("s2"));
        assert!(!w.unsubscribe_transcript(&conn, "t2"));
    }

    #[test]
    fn a_closed_channel_or_link_takes_its_subscriptions_with_it() {
        let mut w = Watches::default();
        let chan = |link: u64, c: &str| Subscriber::Chan {
            link,
            chan: c.to_string(),
        };
        let sock = Subscriber::Conn(Token(1 << 20));
        // The same sub_id on a socket and two channels: three subscriptions.
        for who in [&sock, &chan(1, "a"), &chan(1, "b"), &chan(2, "a")] {
            w.subscribe_transcript(who, "t", "s1", |_| true).unwrap();
        }
        assert_eq!(w.tsubs["s1"].len(), 4);
        w.forget_chan(1, Some("a"));
        assert!(!w.unsubscribe_transcript(&chan(1, "a"), "t"));
        assert_eq!(w.tsubs["s1"].len(), 3);
        w.forget_chan(1, None);
        assert!(!w.unsubscribe_transcript(&chan(1, "b"), "t"));
        assert!(w.unsubscribe_transcript(&chan(2, "a"), "t"));
        assert!(w.unsubscribe_transcript(&sock, "t"));
        assert!(w.tsubs.is_empty());
    }

    #[test]
    fn the_event_line_embeds_the_stored_data_as_it_is() {
        let ev = Appended {
            stream: "x-a".into(),
            seq: 7,
            kind: "note".into(),
            ts: "2026-01-01T00:00:00.000Z".into(),
            data: r#"{"n":1}"#.into(),
        };
        let line = event_line(&ev);
        assert_eq!(line.last(), Some(&b'\n'));
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            v,
            json!({"jsonrpc": "2.0", "method": "event", "params": {
                "stream": "x-a", "seq": 7, "kind": "note",
                "ts": "2026-01-01T00:00:00.000Z", "data": {"n": 1}}})
        );
    }
}
