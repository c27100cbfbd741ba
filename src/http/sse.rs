//! Server-sent events (seed 002, "SSE delivery and recovery"): an I/O-free
//! core and a writer over any `Write`.
//!
//! The core:
//! - [`Replay`]: a topic's replay buffer, "at most 256 events or 992 KiB,
//!   whichever bound is reached first", with its generation, the highest
//!   published sequence and the lowest cursor it can still serve. A
//!   cursor it cannot serve (another generation, evicted, future) plans a
//!   reset with a snapshot.
//! - [`Topic`]: the replay buffer behind a mutex plus its subscribers'
//!   mailboxes. "Mailboxes carry at most one outstanding wake, never full
//!   payloads" and "publication uses bounded nonblocking admission": a
//!   publish appends once and `try_send`s a wake to each mailbox, so the
//!   publisher (the reactor) never waits for a reader.
//! - [`CollectionQueue`]: the collection watch's per-subscriber queue:
//!   `ready` and `reset` first, then invalidations and activity
//!   replacements (one per session, replaced in place), at most 256 events
//!   and 1 MiB; past that it overflows and the stream is closed.
//! - [`batch`] and [`frame`]: the batch envelope `{generation, cursor,
//!   events, snapshot?}` and its `data:` framing. The data is one JSON text,
//!   authoritative; SSE `id` and Last-Event-ID are not used.
//!
//! The writers [`run_watch`] and [`run_collection`] drive one subscriber:
//! they wait on the mailbox until the keepalive is due, counted from the
//! last write (so wakes that bring nothing, however frequent, never
//! postpone it: issue 10, item 24), take whatever is ready up to the 1
//! MiB frame bound, and write it. A write that cannot complete within the
//! socket's send timeout ends the stream (a stalled reader); a watch
//! reader that falls behind the replay buffer is reset rather than
//! skipped. While waiting, the writer looks at its socket every
//! `SSE_PEER_CHECK_MS` ([`Peer::gone`]): a client that closed (or reset)
//! its connection ends the stream then, not at the next write, so a dead
//! watcher frees its slot within about a second. A client that half-closes
//! its side is taken as gone too: a watch has nothing left to say to a
//! reader that said it is done. When the publisher drops the mailbox (the
//! daemon is stopping) the stream ends with a `failure` batch.
//!
//! A topic tells a departed subscriber by its liveness token (the
//! subscription's `Arc` count), never by sending it a wake: a probe wake
//! reached every live watcher, and each rejected attempt at a full topic
//! restarted their keepalive waits.
//!
//! Phase 2 hooks a session in by giving it a [`Topic`] (generation = the
//! session actor's identity), publishing each session event with
//! [`Topic::publish`], and serving `GET /sessions/{id}` as SSE with
//! [`run_watch`] and a snapshot closure that captures the session on the
//! reactor. The collection watch feeds one [`CollectionQueue`] per
//! subscriber.

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError, bounded};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::limits;

/// Why a batch starts with a reset (seed 002, "reset" event).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetReason {
    Initial,
    GenerationChanged,
    ReplayUnavailable,
}

impl ResetReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ResetReason::Initial => "initial",
            ResetReason::GenerationChanged => "generation_changed",
            ResetReason::ReplayUnavailable => "replay_unavailable",
        }
    }
}

/// Where a new watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Replay every event after this sequence.
    Resume(u64),
    /// Send a reset with a snapshot first.
    Reset(ResetReason),
}

struct Entry {
    seq: u64,
    json: Arc<str>,
}

/// A topic's replay buffer.
pub struct Replay {
    generation: String,
    entries: VecDeque<Entry>,
    bytes: usize,
    /// Every event after `floor` up to `last` is in `entries`.
    floor: u64,
    last: u64,
}

/// A cursor the buffer cannot serve any more.
#[derive(Debug, PartialEq, Eq)]
pub struct Evicted;

impl Replay {
    /// An empty buffer whose history up to `high_water` is durable
    /// elsewhere (the snapshot's business).
    pub fn new(generation: impl Into<String>, high_water: u64) -> Replay {
        Replay {
            generation: generation.into(),
            entries: VecDeque::new(),
            bytes: 0,
            floor: high_water,
            last: high_water,
        }
    }

    pub fn generation(&self) -> &str {
        &self.generation
    }

    /// The highest published sequence.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// The lowest cursor that can still be served.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Appends one encoded event. A sequence at or below `last` is already
    /// covered and ignored; a gap (events published before the buffer
    /// learnt of them) makes everything before the new event unservable.
    pub fn push(&mut self, seq: u64, json: &str) {
        if seq <= self.last {
            return;
        }
        if seq != self.last + 1 {
            self.entries.clear();
            self.bytes = 0;
            self.floor = seq - 1;
        }
        self.last = seq;
        self.bytes += json.len();
        self.entries.push_back(Entry {
            seq,
            json: Arc::from(json),
        });
        while self.entries.len() > limits::SSE_REPLAY_EVENTS
            || self.bytes > limits::SSE_REPLAY_BYTES
        {
            let Some(old) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= old.json.len();
            self.floor = old.seq;
        }
    }

    /// Plans a watch from the client's `(after_generation, after_seq)`.
    /// "The session checks generation equality before consulting numeric
    /// replay bounds. [...] A well-formed future or evicted cursor resets."
    pub fn plan(&self, after: Option<(&str, u64)>) -> Start {
        match after {
            None => Start::Reset(ResetReason::Initial),
            Some((g, _)) if g != self.generation => Start::Reset(ResetReason::GenerationChanged),
            Some((_, s)) if s < self.floor || s > self.last => {
                Start::Reset(ResetReason::ReplayUnavailable)
            }
            Some((_, s)) => Start::Resume(s),
        }
    }

    /// The events after `after`, at most `max_bytes` of them (at least one
    /// when any is due), and the cursor the batch ends at.
    pub fn since(&self, after: u64, max_bytes: usize) -> Result<(Vec<Arc<str>>, u64), Evicted> {
        if after < self.floor || after > self.last {
            return Err(Evicted);
        }
        let skip = (after - self.floor) as usize;
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut cursor = after;
        for e in self.entries.iter().skip(skip) {
            if !out.is_empty() && bytes + e.json.len() + 1 > max_bytes {
                break;
            }
            bytes += e.json.len() + 1;
            cursor = e.seq;
            out.push(e.json.clone());
        }
        Ok((out, cursor))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A writer that panicked holding the lock left the buffer consistent
    // (every method completes its update before it can fail).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A subscriber's side of a topic.
pub struct Subscription {
    pub replay: Arc<Mutex<Replay>>,
    pub wake: Receiver<()>,
    /// Held while the subscriber lives; the topic counts it.
    _alive: Arc<()>,
}

impl Subscription {
    /// Plans where this watch starts from the client's cursor.
    pub fn plan(&self, after: Option<(&str, u64)>) -> Start {
        lock(&self.replay).plan(after)
    }

    /// The highest sequence published to the topic so far.
    pub fn high_water(&self) -> u64 {
        lock(&self.replay).last()
    }
}

/// A replay buffer and its subscribers' mailboxes, owned by the publisher.
pub struct Topic {
    replay: Arc<Mutex<Replay>>,
    subs: Vec<Mailbox>,
}

/// A subscriber's mailbox and its liveness token.
struct Mailbox {
    wake: Sender<()>,
    alive: Arc<()>,
}

impl Mailbox {
    fn live(&self) -> bool {
        Arc::strong_count(&self.alive) > 1
    }
}

/// A topic already holds its maximum of subscribers.
#[derive(Debug, PartialEq, Eq)]
pub struct TopicFull;

impl Topic {
    pub fn new(generation: impl Into<String>, high_water: u64) -> Topic {
        Topic {
            replay: Arc::new(Mutex::new(Replay::new(generation, high_water))),
            subs: Vec::new(),
        }
    }

    /// Appends an event and wakes every subscriber; never blocks.
    pub fn publish(&mut self, seq: u64, json: &str) {
        lock(&self.replay).push(seq, json);
        self.subs.retain(|s| {
            s.live() && !matches!(s.wake.try_send(()), Err(TrySendError::Disconnected(())))
        });
    }

    pub fn subscribe(&mut self) -> Result<Subscription, TopicFull> {
        if self.subs.len() >= limits::SSE_TOPIC_SUBSCRIBERS {
            self.prune();
            if self.subs.len() >= limits::SSE_TOPIC_SUBSCRIBERS {
                return Err(TopicFull);
            }
        }
        let (tx, rx) = bounded(limits::SSE_MAILBOX);
        let alive = Arc::new(());
        self.subs.push(Mailbox {
            wake: tx,
            alive: alive.clone(),
        });
        Ok(Subscription {
            replay: self.replay.clone(),
            wake: rx,
            _alive: alive,
        })
    }

    /// Drops the mailboxes of subscribers that went away, waking no one.
    fn prune(&mut self) {
        self.subs.retain(Mailbox::live);
    }

    /// Live subscribers, after dropping those that went away.
    pub fn watchers(&mut self) -> usize {
        self.prune();
        self.subs.len()
    }

    /// Ends every subscription: their writers send `failure` and close.
    pub fn close(&mut self) {
        self.subs.clear();
    }

    pub fn high_water(&self) -> u64 {
        lock(&self.replay).last()
    }

    pub fn generation(&self) -> String {
        lock(&self.replay).generation().to_string()
    }
}

/// The `reset` control event.
pub fn reset_event(reason: ResetReason) -> String {
    json!({"type": "reset", "data": {"reason": reason.as_str()}}).to_string()
}

/// A published event: `{type, sequence, data}`.
pub fn event(kind: &str, sequence: u64, data: &Value) -> String {
    json!({"type": kind, "sequence": sequence, "data": data}).to_string()
}

/// The batch envelope around already-encoded events (and snapshot).
pub fn batch(
    generation: &str,
    cursor: u64,
    events: &[impl AsRef<str>],
    snapshot: Option<&str>,
) -> String {
    let mut s =
        String::with_capacity(64 + events.iter().map(|e| e.as_ref().len() + 1).sum::<usize>());
    s.push_str("{\"generation\":");
    s.push_str(&Value::from(generation).to_string());
    s.push_str(&format!(",\"cursor\":{cursor},\"events\":["));
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(e.as_ref());
    }
    s.push(']');
    if let Some(snap) = snapshot {
        s.push_str(",\"snapshot\":");
        s.push_str(snap);
    }
    s.push('}');
    s
}

/// A `failure` batch: terminal, alone, not advancing the cursor.
pub fn failure_batch(generation: &str, cursor: u64, code: &str) -> String {
    let ev = json!({"type": "failure", "data": {"code": code}}).to_string();
    batch(generation, cursor, &[ev], None)
}

/// One SSE event carrying `data` (one JSON text) as `data:` lines.
pub fn frame(out: &mut Vec<u8>, data: &str) {
    for line in data.split('\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.strip_suffix('\r').unwrap_or(line).as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
}

fn send(w: &mut impl Write, data: &str) -> io::Result<()> {
    let mut out = Vec::with_capacity(data.len() + 16);
    frame(&mut out, data);
    w.write_all(&out)?;
    w.flush()
}

/// The client side of a stream, as far as a writer needs to know.
pub trait Peer: Write {
    /// Whether the client has gone: closed or reset its connection. Must
    /// not block.
    fn gone(&mut self) -> bool;
}

impl Peer for TcpStream {
    /// Reads, without waiting, whatever the client sent since (a watch
    /// expects nothing; it is discarded, at most a few KiB per look): end
    /// of stream or an error means the client is gone.
    fn gone(&mut self) -> bool {
        if self.set_nonblocking(true).is_err() {
            return true;
        }
        let mut buf = [0u8; 1024];
        let mut gone = false;
        for _ in 0..4 {
            match self.read(&mut buf) {
                Ok(0) => {
                    gone = true;
                    break;
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    gone = e.kind() != io::ErrorKind::WouldBlock;
                    break;
                }
            }
        }
        self.set_nonblocking(false).is_err() || gone
    }
}

/// What waiting for the mailbox came to.
enum Waited {
    /// A wake, or the keepalive is due: look again.
    Look,
    /// The publisher dropped the mailbox.
    Stopped,
    /// The client went away.
    PeerGone,
}

/// Waits for a wake until `until`, looking at the peer every
/// `SSE_PEER_CHECK_MS`.
fn wait(w: &mut impl Peer, wake: &Receiver<()>, until: Instant) -> Waited {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Waited::Look;
        }
        let slice = left.min(Duration::from_millis(limits::SSE_PEER_CHECK_MS));
        match wake.recv_timeout(slice) {
            Ok(()) => return Waited::Look,
            Err(RecvTimeoutError::Disconnected) => return Waited::Stopped,
            Err(RecvTimeoutError::Timeout) => {
                if w.gone() {
                    return Waited::PeerGone;
                }
            }
        }
    }
}

/// How a stream ended.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// A write failed or timed out: the client went away or stalled.
    ClientGone,
    /// The publisher closed the topic (the daemon is stopping).
    Stopped,
    /// A snapshot could not be taken, or resets kept failing.
    Failed,
}

/// What a snapshot closure gives: the cursor it was captured at and the
/// snapshot's JSON text, or the failure code to close with.
pub type Snapshot = Result<(u64, String), &'static str>;

/// Resets in a row without delivering an event before the stream gives up
/// with `failure`: a reader that cannot keep up with even one batch.
const MAX_RESETS_IN_A_ROW: usize = 3;

/// Serves one watch until it ends. `start` comes from [`Replay::plan`];
/// `snapshot` captures the authoritative state for a reset, serialized
/// with publication by its owner.
pub fn run_watch<W: Peer>(
    w: &mut W,
    sub: &Subscription,
    start: Start,
    keepalive: Duration,
    snapshot: &mut dyn FnMut() -> Snapshot,
) -> End {
    let generation = lock(&sub.replay).generation().to_string();
    let mut reset = match start {
        Start::Reset(r) => Some(r),
        Start::Resume(_) => None,
    };
    let mut cursor = match start {
        Start::Resume(s) => s,
        Start::Reset(_) => 0,
    };
    let mut resets = 0;
    // The response head was just written.
    let mut last_write = Instant::now();
    loop {
        if let Some(reason) = reset.take() {
            resets += 1;
            if resets > MAX_RESETS_IN_A_ROW {
                let _ = send(w, &failure_batch(&generation, cursor, "replay_unavailable"));
                return End::Failed;
            }
            let (at, snap) = match snapshot() {
                Ok(s) => s,
                Err(code) => {
                    let _ = send(w, &failure_batch(&generation, cursor, code));
                    return End::Failed;
                }
            };
            cursor = at;
            if send(
                w,
                &batch(&generation, cursor, &[reset_event(reason)], Some(&snap)),
            )
            .is_err()
            {
                return End::ClientGone;
            }
            last_write = Instant::now();
        }
        let due = lock(&sub.replay).since(cursor, limits::HTTP_RESPONSE_MAX - 256);
        match due {
            Err(Evicted) => {
                reset = Some(ResetReason::ReplayUnavailable);
                continue;
            }
            Ok((events, next)) if !events.is_empty() => {
                resets = 0;
                if send(w, &batch(&generation, next, &events, None)).is_err() {
                    return End::ClientGone;
                }
                last_write = Instant::now();
                cursor = next;
                continue; // more may be due beyond the frame bound
            }
            Ok(_) if last_write.elapsed() >= keepalive => {
                if send(w, &batch(&generation, cursor, &[] as &[&str], None)).is_err() {
                    return End::ClientGone;
                }
                last_write = Instant::now();
            }
            Ok(_) => {}
        }
        match wait(w, &sub.wake, last_write + keepalive) {
            Waited::Look => {}
            Waited::PeerGone => return End::ClientGone,
            Waited::Stopped => {
                let _ = send(w, &failure_batch(&generation, cursor, "shutting_down"));
                return End::Stopped;
            }
        }
    }
}

/// What a collection subscriber has queued.
pub struct CollectionQueue {
    events: VecDeque<(Option<String>, String)>,
    bytes: usize,
    overflowed: bool,
}

/// What [`CollectionQueue::take`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    Events(Vec<String>),
    /// The queue passed its bound: send `overflow` and close.
    Overflow,
}

impl Default for CollectionQueue {
    fn default() -> Self {
        CollectionQueue::new()
    }
}

impl CollectionQueue {
    /// A new subscriber's queue: "Its first batch contains ready and reset,
    /// requiring an authoritative collection read."
    pub fn new() -> CollectionQueue {
        let mut q = CollectionQueue {
            events: VecDeque::new(),
            bytes: 0,
            overflowed: false,
        };
        q.admit(None, json!({"type": "ready", "data": {}}).to_string());
        q.admit(None, reset_event(ResetReason::Initial));
        q
    }

    fn admit(&mut self, key: Option<String>, json: String) {
        if self.overflowed {
            return;
        }
        self.bytes += json.len();
        self.events.push_back((key, json));
        if self.events.len() > limits::SSE_QUEUE_EVENTS || self.bytes > limits::SSE_QUEUE_BYTES {
            self.overflowed = true;
            self.events.clear();
            self.bytes = 0;
        }
    }

    /// Queues an `invalidate` event (already encoded).
    pub fn invalidate(&mut self, json: String) {
        self.admit(None, json);
    }

    /// Queues an `activity` replacement for `session_id`; a queued one for
    /// the same session is replaced in place, keeping its position.
    pub fn activity(&mut self, session_id: &str, json: String) {
        if self.overflowed {
            return;
        }
        if let Some(slot) = self
            .events
            .iter_mut()
            .find(|(k, _)| k.as_deref() == Some(session_id))
        {
            self.bytes = self.bytes - slot.1.len() + json.len();
            slot.1 = json;
            if self.bytes > limits::SSE_QUEUE_BYTES {
                self.overflowed = true;
                self.events.clear();
                self.bytes = 0;
            }
            return;
        }
        self.admit(Some(session_id.to_string()), json);
    }

    /// Takes queued events up to `max_bytes` (at least one).
    pub fn take(&mut self, max_bytes: usize) -> Taken {
        if self.overflowed {
            return Taken::Overflow;
        }
        let mut out = Vec::new();
        let mut bytes = 0;
        while let Some((_, e)) = self.events.front() {
            if !out.is_empty() && bytes + e.len() + 1 > max_bytes {
                break;
            }
            bytes += e.len() + 1;
            self.bytes -= e.len();
            if let Some((_, e)) = self.events.pop_front() {
                out.push(e);
            }
        }
        Taken::Events(out)
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

fn collection_batch(events: &[String]) -> String {
    format!("{{\"events\":[{}]}}", events.join(","))
}

/// Serves one collection watch until it ends: the queue is filled by the
/// publisher, which wakes `wake`.
pub fn run_collection<W: Peer>(
    w: &mut W,
    queue: &Mutex<CollectionQueue>,
    wake: &Receiver<()>,
    keepalive: Duration,
) -> End {
    let mut last_write = Instant::now();
    loop {
        let taken = lock(queue).take(limits::HTTP_RESPONSE_MAX - 256);
        match taken {
            Taken::Overflow => {
                // "emits overflow and closes if the socket can still accept
                // the signal"; closing alone also requires a refresh.
                let _ = send(
                    w,
                    &collection_batch(&[json!({"type": "overflow", "data": {}}).to_string()]),
                );
                return End::Failed;
            }
            Taken::Events(events) if !events.is_empty() => {
                if send(w, &collection_batch(&events)).is_err() {
                    return End::ClientGone;
                }
                last_write = Instant::now();
                continue;
            }
            Taken::Events(_) if last_write.elapsed() >= keepalive => {
                if send(w, &collection_batch(&[])).is_err() {
                    return End::ClientGone;
                }
                last_write = Instant::now();
            }
            Taken::Events(_) => {}
        }
        match wait(w, wake, last_write + keepalive) {
            Waited::Look => {}
            Waited::PeerGone => return End::ClientGone,
            Waited::Stopped => {
                let failure =
                    json!({"type": "failure", "data": {"code": "shutting_down"}}).to_string();
                let _ = send(w, &collection_batch(&[failure]));
                return End::Stopped;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer into memory: its reader never goes.
    impl Peer for Vec<u8> {
        fn gone(&mut self) -> bool {
            false
        }
    }

    fn ev(seq: u64) -> String {
        event("event", seq, &json!({"n": seq}))
    }

    /// Parses what a writer wrote into batches (test-side, simple framing).
    fn batches(bytes: &[u8]) -> Vec<Value> {
        String::from_utf8(bytes.to_vec())
            .unwrap()
            .split("\n\n")
            .filter(|f| !f.is_empty())
            .map(|f| serde_json::from_str(f.strip_prefix("data: ").unwrap()).unwrap())
            .collect()
    }

    #[test]
    fn replay_is_bounded_by_count_and_bytes() {
        let mut r = Replay::new("g", 10);
        for s in 11..=11 + limits::SSE_REPLAY_EVENTS as u64 + 9 {
            r.push(s, &ev(s));
        }
        assert_eq!(r.len(), limits::SSE_REPLAY_EVENTS);
        assert_eq!(r.last(), 276);
        assert_eq!(r.floor(), 276 - 256);
        assert_eq!(r.since(19, 1 << 20), Err(Evicted));
        let (got, cursor) = r.since(20, 1 << 20).unwrap();
        assert_eq!((got.len(), cursor), (256, 276));
        let big = "x".repeat(300 * 1024);
        let mut r = Replay::new("g", 0);
        for s in 1..=4 {
            r.push(s, &big);
        }
        assert!(r.bytes() <= limits::SSE_REPLAY_BYTES);
        assert_eq!((r.len(), r.floor()), (3, 1));
    }

    #[test]
    fn plans_follow_generation_then_bounds() {
        let mut r = Replay::new("g1", 5);
        r.push(6, &ev(6));
        assert_eq!(r.plan(None), Start::Reset(ResetReason::Initial));
        assert_eq!(
            r.plan(Some(("g0", 6))),
            Start::Reset(ResetReason::GenerationChanged)
        );
        assert_eq!(
            r.plan(Some(("g1", 4))),
            Start::Reset(ResetReason::ReplayUnavailable)
        );
        assert_eq!(
            r.plan(Some(("g1", 7))),
            Start::Reset(ResetReason::ReplayUnavailable)
        );
        assert_eq!(r.plan(Some(("g1", 5))), Start::Resume(5));
        assert_eq!(r.plan(Some(("g1", 6))), Start::Resume(6));
        // A gap: the buffer cannot vouch for what it did not see.
        r.push(9, &ev(9));
        assert_eq!(
            r.plan(Some(("g1", 6))),
            Start::Reset(ResetReason::ReplayUnavailable)
        );
        assert_eq!(r.plan(Some(("g1", 8))), Start::Resume(8));
        // Old or repeated sequences are ignored.
        r.push(9, &ev(9));
        r.push(3, &ev(3));
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn batches_respect_the_frame_bound() {
        let mut r = Replay::new("g", 0);
        let big = "y".repeat(100);
        for s in 1..=10 {
            r.push(s, &big);
        }
        let (got, cursor) = r.since(0, 350).unwrap();
        assert_eq!((got.len(), cursor), (3, 3));
        let (got, cursor) = r.since(10, 350).unwrap();
        assert_eq!((got.len(), cursor), (0, 10));
    }

    #[test]
    fn batch_and_frame_shapes() {
        let b = batch("g", 3, &[ev(3)], Some("{\"x\":1}"));
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["generation"], "g");
        assert_eq!(v["cursor"], 3);
        assert_eq!(v["events"][0]["sequence"], 3);
        assert_eq!(v["snapshot"]["x"], 1);
        let keep: Value = serde_json::from_str(&batch("g", 3, &[] as &[&str], None)).unwrap();
        assert_eq!(keep, json!({"generation": "g", "cursor": 3, "events": []}));
        let mut out = Vec::new();
        frame(&mut out, "a\nb");
        assert_eq!(out, b"data: a\ndata: b\n\n");
    }

    #[test]
    fn watch_resets_then_streams_then_fails_on_close() {
        let mut topic = Topic::new("gen", 2);
        let sub = topic.subscribe().unwrap();
        let start = lock(&sub.replay).plan(None);
        let replay = sub.replay.clone();
        let publisher = std::thread::spawn(move || {
            for s in 3..=5 {
                topic.publish(s, &ev(s));
            }
            // A wake still queued is received before the disconnection, and
            // the writer reads the buffer before every wait.
            topic.close();
        });
        let mut out = Vec::new();
        let mut snap = || Ok((lock(&replay).last(), "{\"high_water\":0}".to_string()));
        let end = run_watch(&mut out, &sub, start, Duration::from_secs(60), &mut snap);
        publisher.join().unwrap();
        assert_eq!(end, End::Stopped);
        let got = batches(&out);
        assert_eq!(got[0]["events"][0]["type"], "reset");
        assert!(got[0]["snapshot"].is_object());
        let mut seqs: Vec<u64> = vec![];
        for b in &got[1..got.len() - 1] {
            for e in b["events"].as_array().unwrap() {
                seqs.push(e["sequence"].as_u64().unwrap());
            }
        }
        let first_cursor = got[0]["cursor"].as_u64().unwrap();
        let want: Vec<u64> = (first_cursor + 1..=5).collect();
        assert_eq!(
            seqs, want,
            "each event once, in order, after the reset's cursor"
        );
        assert_eq!(got.last().unwrap()["events"][0]["type"], "failure");
    }

    #[test]
    fn a_quiet_watch_sends_keepalives_and_a_stalled_one_ends() {
        struct Budget(usize, Vec<u8>);
        impl Write for Budget {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                if self.0 == 0 {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                self.0 -= 1;
                self.1.extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        impl Peer for Budget {
            fn gone(&mut self) -> bool {
                false
            }
        }
        let mut topic = Topic::new("g", 7);
        let sub = topic.subscribe().unwrap();
        let mut w = Budget(3, Vec::new());
        let mut snap = || Ok((7, "{}".to_string()));
        let end = run_watch(
            &mut w,
            &sub,
            Start::Resume(7),
            Duration::from_millis(1),
            &mut snap,
        );
        assert_eq!(end, End::ClientGone);
        let got = batches(&w.1);
        assert_eq!(got.len(), 3);
        assert!(
            got.iter()
                .all(|b| b == &json!({"generation": "g", "cursor": 7, "events": []}))
        );
    }

    #[test]
    fn a_reader_behind_the_buffer_is_reset_not_skipped() {
        let mut topic = Topic::new("g", 0);
        let sub = topic.subscribe().unwrap();
        for s in 1..=300 {
            topic.publish(s, &ev(s));
        }
        topic.close();
        let mut out = Vec::new();
        let replay = sub.replay.clone();
        let mut snap = || Ok((lock(&replay).last(), "{}".to_string()));
        assert_eq!(
            run_watch(
                &mut out,
                &sub,
                Start::Resume(2),
                Duration::from_secs(60),
                &mut snap
            ),
            End::Stopped
        );
        let got = batches(&out);
        assert_eq!(got[0]["events"][0]["data"]["reason"], "replay_unavailable");
        assert_eq!(got[0]["cursor"], 300);
    }

    #[test]
    fn topics_bound_their_subscribers_and_forget_departed_ones() {
        let mut t = Topic::new("g", 0);
        let subs: Vec<_> = (0..limits::SSE_TOPIC_SUBSCRIBERS)
            .map(|_| t.subscribe().unwrap())
            .collect();
        assert!(t.subscribe().is_err());
        drop(subs);
        assert_eq!(t.watchers(), 0);
        assert!(t.subscribe().is_ok());
    }

    #[test]
    fn a_full_topic_refuses_without_waking_its_subscribers() {
        let mut t = Topic::new("g", 0);
        let mut subs: Vec<_> = (0..limits::SSE_TOPIC_SUBSCRIBERS)
            .map(|_| t.subscribe().unwrap())
            .collect();
        for _ in 0..3 {
            assert!(t.subscribe().is_err());
        }
        assert!(subs.iter().all(|s| s.wake.try_recv().is_err()));
        // One departs: its slot is free, still without a wake to the rest.
        subs.pop();
        assert!(t.subscribe().is_ok());
        assert!(subs.iter().all(|s| s.wake.try_recv().is_err()));
    }

    #[test]
    fn wakes_that_bring_nothing_do_not_postpone_keepalives() {
        #[derive(Clone, Default)]
        struct Shared(Arc<Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                lock(&self.0).extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        impl Peer for Shared {
            fn gone(&mut self) -> bool {
                false
            }
        }
        let mut topic = Topic::new("g", 0);
        let sub = topic.subscribe().unwrap();
        let out = Shared::default();
        let mut w = out.clone();
        let writer = std::thread::spawn(move || {
            let mut snap = || Ok((0, "{}".to_string()));
            run_watch(
                &mut w,
                &sub,
                Start::Resume(0),
                Duration::from_millis(20),
                &mut snap,
            )
        });
        // Wakes far more often than the keepalive period, none with an
        // event, until two keepalives were written anyway.
        let keepalives = || batches(&lock(&out.0)).len();
        for _ in 0..100_000 {
            if keepalives() >= 2 {
                break;
            }
            let _ = topic.subs[0].wake.try_send(());
            std::thread::sleep(Duration::from_millis(1)); // simulated load
        }
        assert!(keepalives() >= 2);
        topic.close();
        assert_eq!(writer.join().unwrap(), End::Stopped);
    }

    #[test]
    fn collection_queue_starts_ready_replaces_activity_and_overflows() {
        let mut q = CollectionQueue::new();
        q.activity("s-1", "{\"type\":\"activity\",\"v\":1}".into());
        q.invalidate("{\"type\":\"invalidate\"}".into());
        q.activity("s-1", "{\"type\":\"activity\",\"v\":2}".into());
        let Taken::Events(got) = q.take(1 << 20) else {
            panic!()
        };
        assert_eq!(got.len(), 4);
        assert!(got[0].contains("ready"));
        assert!(got[1].contains("reset"));
        assert!(got[2].contains("\"v\":2"));
        for i in 0..=limits::SSE_QUEUE_EVENTS {
            q.invalidate(format!("{{\"i\":{i}}}"));
        }
        assert_eq!(q.take(1 << 20), Taken::Overflow);
        let (tx, rx) = bounded(1);
        let queue = Mutex::new(q);
        let mut out = Vec::new();
        assert_eq!(
            run_collection(&mut out, &queue, &rx, Duration::from_secs(60)),
            End::Failed
        );
        drop(tx);
        assert_eq!(
            batches(&out),
            vec![json!({"events": [{"type": "overflow", "data": {}}]})]
        );
    }
}
