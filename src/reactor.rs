//! The reactor: one thread that owns the daemon's state and every
//! non-blocking descriptor, driven by a mio poll (DESIGN.md, "Threads and
//! ownership"). Workers (the ledger threads, the signal thread, blocking
//! listeners) reach it only through the bounded [`Inbox`] plus the waker, and
//! it handles their messages in batches on each wake-up.
//!
//! Timers are a heap of deadlines; the poll sleeps until the earliest, so an
//! idle daemon with no timers sleeps until something happens.

use crossbeam_channel::{Receiver, Sender, bounded};
use mio::{Poll, Token, Waker};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::daemon::Daemon;
use crate::ledger::Committed;
use crate::limits;

/// The waker's token.
pub const WAKER: Token = Token(0);
/// The daemon socket listener's token.
pub const LISTENER: Token = Token(1);

/// The hasher of maps keyed by numbers the daemon hands out itself (mio
/// tokens, child ids, timer ids): a multiply and a rotate a word. SipHash
/// resists keys chosen to collide, which these never are, and at about a
/// hundred instructions a look-up it was a tenth of a plugin's storage.get
/// (issue 11; `storage_get_instructions` in tests/bench). Maps keyed by
/// anything from outside keep the standard hasher.
#[derive(Clone, Copy, Default)]
pub struct IdHasher(u64);

impl IdHasher {
    fn mix(&mut self, n: u64) {
        // FxHash's step: sequential ids spread over both the low bits
        // (the bucket) and the top bits (hashbrown's tag).
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.mix(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }
}

/// A map keyed by the daemon's own ids ([`IdHasher`]).
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
/// A set of the daemon's own ids ([`IdHasher`]).
pub type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

/// Work a closure does on the reactor thread with the daemon's state.
pub type Task = Box<dyn FnOnce(&mut Daemon) + Send>;

/// A timer's work: it runs on the reactor and never crosses threads.
pub type TimerTask = Box<dyn FnOnce(&mut Daemon)>;

/// A message from another thread.
pub enum Msg {
    Signal(libc::c_int),
    Committed(Vec<Committed>),
    Run(Task),
    /// A closure that changes nothing a reader could see (an HTTP read of
    /// committed state filling [`Inbox::changes`]'s cache): the only
    /// message that does not count as a change.
    Read(Task),
    /// A worker's typed report for the subsystem whose job started it,
    /// handed over by the router (daemon/router.rs).
    Report(crate::daemon::effects::Report),
}

// The inbox's slots are all allocated and written when it is made, so the
// size of a message is resident memory 4,096 times over: keep large
// payloads boxed (daemon/effects.rs, `Report`).
const _: () = assert!(std::mem::size_of::<Msg>() <= 32);

/// The sending side of the reactor's queue, cloned into every worker.
#[derive(Clone)]
pub struct Inbox {
    tx: Sender<Msg>,
    waker: Arc<Waker>,
    /// Counts the reactor's units of work that may have changed state
    /// (see [`Inbox::changed`]).
    changes: Arc<AtomicU64>,
}

impl Inbox {
    /// Queues a message and wakes the reactor. Blocks the calling worker
    /// while the queue is full: a worker is never allowed to outrun the
    /// reactor without bound. Returns false once the reactor is gone.
    pub fn send(&self, msg: Msg) -> bool {
        if self.tx.send(msg).is_err() {
            return false;
        }
        let _ = self.waker.wake();
        true
    }

    /// Runs `task` on the reactor thread.
    pub fn run(&self, task: impl FnOnce(&mut Daemon) + Send + 'static) -> bool {
        self.send(Msg::Run(Box::new(task)))
    }

    /// Runs `task` on the reactor thread as a [`Msg::Read`]: it must
    /// change nothing another reader could observe, or call
    /// [`Inbox::changed`] before it does.
    pub fn read(&self, task: impl FnOnce(&mut Daemon) + Send + 'static) -> bool {
        self.send(Msg::Read(Box::new(task)))
    }

    /// Called by the reactor before each unit of work that may change
    /// state (an event batch, a message other than [`Msg::Read`], a timer),
    /// so before any answer that unit sends. A value read from
    /// [`Inbox::changes`] that is still current therefore proves that
    /// nothing was changed, and nothing acknowledged, since it was read:
    /// what lets HTTP handlers answer reads of committed state without the
    /// reactor (src/http/snapshots.rs).
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// The count of [`Inbox::changed`] so far.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    /// As [`Inbox::run`], but never blocks: false when the queue is full or
    /// the reactor is gone. For code that may itself run on the reactor
    /// thread (a drop guard), where waiting for room would wait for ever.
    pub fn try_run(&self, task: impl FnOnce(&mut Daemon) + Send + 'static) -> bool {
        if self.tx.try_send(Msg::Run(Box::new(task))).is_err() {
            return false;
        }
        let _ = self.waker.wake();
        true
    }
}

/// The poll, the waker and the receiving side of the inbox.
pub struct Reactor {
    pub poll: Poll,
    rx: Receiver<Msg>,
    inbox: Inbox,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    timer_tasks: IdMap<u64, TimerTask>,
    next_timer: u64,
}

/// A scheduled timer, for cancelling it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerId(u64);

impl Reactor {
    pub fn new() -> std::io::Result<Reactor> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let (tx, rx) = bounded(limits::REACTOR_INBOX);
        Ok(Reactor {
            poll,
            rx,
            inbox: Inbox {
                tx,
                waker,
                changes: Arc::new(AtomicU64::new(0)),
            },
            timers: BinaryHeap::new(),
            timer_tasks: Default::default(),
            next_timer: 0,
        })
    }

    pub fn inbox(&self) -> Inbox {
        self.inbox.clone()
    }

    /// Runs `task` on the reactor after `after`.
    pub fn schedule(
        &mut self,
        after: Duration,
        task: impl FnOnce(&mut Daemon) + 'static,
    ) -> TimerId {
        self.next_timer += 1;
        let id = self.next_timer;
        self.timers.push(Reverse((Instant::now() + after, id)));
        self.timer_tasks.insert(id, Box::new(task));
        TimerId(id)
    }

    pub fn cancel(&mut self, id: TimerId) {
        // The heap entry stays until its deadline and then finds no task.
        self.timer_tasks.remove(&id.0);
    }

    /// How long the poll may sleep: until the next live timer.
    pub fn poll_timeout(&mut self) -> Option<Duration> {
        while let Some(Reverse((at, id))) = self.timers.peek().copied() {
            if self.timer_tasks.contains_key(&id) {
                return Some(at.saturating_duration_since(Instant::now()));
            }
            self.timers.pop();
        }
        None
    }

    /// Timers whose deadline has passed.
    pub fn due_timers(&mut self) -> Vec<TimerTask> {
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some(Reverse((at, id))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if let Some(t) = self.timer_tasks.remove(&id) {
                due.push(t);
            }
        }
        due
    }

    /// Up to one batch of queued messages.
    pub fn drain(&self) -> Vec<Msg> {
        self.rx.try_iter().take(limits::REACTOR_BATCH).collect()
    }

    /// Whether messages are still queued after a batch.
    pub fn has_pending(&self) -> bool {
        !self.rx.is_empty()
    }
}
