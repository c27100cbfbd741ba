//! Locked mode run on the daemon: the start-up load, and `lock.*`
//! operations one at a time (DESIGN.md, "Threads and ownership").
//!
//! Every operation waits in one bounded queue ([`limits::LOCK_QUEUE`];
//! full: `busy`) until the state is loaded and the operation before it is
//! committed, so that each plans against the tip the last one wrote. A
//! plan that needs Argon2id (`lock.init`'s commitments, `lock.disable`) runs
//! on the `lock-worker` thread; the start-up verification of the stored
//! chain does too. A change is answered only after the ledger committed
//! it, and only then made true in memory: a write the ledger refuses
//! changes nothing. `commit` is the one place a change becomes true, so
//! it is where the uplink, once it exists, asks [`Lock::to_close`] which
//! of its channels to close.

use std::collections::VecDeque;

use crate::daemon::Daemon;
use crate::errors::{Code, RpcError};
use crate::limits;
use crate::lock::{Answer, Change, Error, Lock, Op, Plan, Stored, store};
use crate::plugins::store::Worker;

/// Who hears an operation's outcome, on the reactor.
pub type Then = Box<dyn FnOnce(&mut Daemon, Result<Answer, Error>)>;

/// The node's locked-mode state and its operation queue.
pub struct Node {
    pub lock: Lock,
    loaded: bool,
    busy: bool,
    waiting: VecDeque<(Op, Then)>,
    /// The callback of the operation on the worker (one at most).
    in_work: Option<Then>,
    worker: Result<Worker, String>,
}

impl Default for Node {
    fn default() -> Node {
        Node {
            lock: Lock::default(),
            loaded: false,
            busy: false,
            waiting: VecDeque::new(),
            in_work: None,
            worker: Err("the lock worker is not started".into()),
        }
    }
}

impl Node {
    /// Whether the trust log and flags of the ledger are read: until then
    /// the uplink admits no channel.
    pub fn loaded(&self) -> bool {
        self.loaded
    }
}

/// Starts the worker and the load: the ledger's rows on the reader
/// thread, their verification and the keys on the worker, then
/// [`Lock::install`] here and the operations that waited for it.
pub fn start(d: &mut Daemon) {
    d.lock.worker = Worker::spawn("lock-worker", limits::LOCK_WORKER_QUEUE)
        .map_err(|e| format!("cannot start the lock worker thread: {e}"));
    let inbox = d.inbox.clone();
    let queued = d.ledger.read(Box::new(move |conn| {
        let stored = store::read(conn);
        inbox.run(move |d| verify(d, stored.map_err(|e| e.to_string())));
    }));
    if let Err(e) = queued {
        verify(d, Err(e.to_string()));
    }
}

/// Hands the rows to the worker. A ledger that could not be read leaves
/// the node quarantined rather than unlocked: it may hold a log.
fn verify(d: &mut Daemon, stored: Result<Stored, String>) {
    let stored = stored.unwrap_or_else(|e| {
        crate::error!(
            "locked mode: cannot read the trust log from the ledger: {}; the node is quarantined",
            e.to_lowercase()
        );
        Stored {
            quarantined: Some(Vec::new()),
            ..Stored::default()
        }
    });
    let dir = d.paths.state_dir.clone();
    let inbox = d.inbox.clone();
    let job = Box::new(move || {
        let loaded = crate::lock::load(stored, &dir);
        inbox.run(move |d| {
            d.lock.lock.install(loaded);
            d.lock.loaded = true;
            crate::uplink::channels::lock_loaded(d);
            pump(d);
        });
    });
    let queued = match &d.lock.worker {
        Ok(w) => w.queue(job),
        Err(e) => Err(e.clone()),
    };
    if let Err(e) = queued {
        crate::error!("locked mode: {e}; lock operations are unavailable");
    }
}

/// Queues `op`; `then` hears its outcome once it ran.
pub fn submit(d: &mut Daemon, op: Op, then: Then) -> Result<(), RpcError> {
    if d.lock.waiting.len() >= limits::LOCK_QUEUE {
        return Err(RpcError::new(
            Code::Busy,
            format!(
                "{} lock operations are waiting already; try again",
                limits::LOCK_QUEUE
            ),
        ));
    }
    d.lock.waiting.push_back((op, then));
    pump(d);
    Ok(())
}

/// Runs waiting operations until one must wait for a commit or the worker.
fn pump(d: &mut Daemon) {
    while d.lock.loaded && !d.lock.busy {
        let Some((op, then)) = d.lock.waiting.pop_front() else {
            return;
        };
        match d.lock.lock.plan(op) {
            Plan::Answer(r) => then(d, r),
            Plan::Commit(change, answer) => {
                d.lock.busy = true;
                commit(d, change, answer, then);
            }
            Plan::Work(work) => {
                d.lock.busy = true;
                let inbox = d.inbox.clone();
                let queued = match &d.lock.worker {
                    Ok(w) => w.queue(Box::new(move || {
                        let r = work();
                        inbox.run(move |d| worked(d, r));
                    })),
                    Err(e) => Err(e.clone()),
                };
                match queued {
                    Ok(()) => d.lock.in_work = Some(then),
                    Err(e) => {
                        crate::error!("locked mode: {e}");
                        done(
                            d,
                            then,
                            Err(Error::Unavailable(format!("locked mode: {e}"))),
                        );
                    }
                }
            }
        }
    }
}

/// The worker's result for the operation in work.
fn worked(d: &mut Daemon, r: Result<(Box<Change>, Answer), Error>) {
    let Some(then) = d.lock.in_work.take() else {
        return;
    };
    match r {
        Ok((change, answer)) => commit(d, change, answer, then),
        Err(e) => done(d, then, Err(e)),
    }
}

/// Writes the change; once committed, makes it true and answers.
fn commit(d: &mut Daemon, change: Box<Change>, answer: Answer, then: Then) {
    let ops = store::writes(&d.lock.lock, &change);
    if ops.is_empty() {
        // Nothing to keep (a sync that kept the log held): nothing changes.
        done(d, then, Ok(answer));
        return;
    }
    d.write(ops, move |d, r| match r {
        Ok(_) => {
            // Any change may bring entries to push or a new root to sync
            // against; a quarantine waits for the operator instead (a sync
            // would only find the same stranger again). A sync that adopted
            // syncs once more and then finds nothing new.
            let resync = change.quarantine.is_none();
            let log_changed = change.log.is_some();
            if let Some(g) = &change.quarantine {
                crate::warn!(
                    "locked mode: quarantined: the gateway carries a trust log of genesis {} and this node has no root; lock.pin chooses one",
                    crate::e2ee::base64::encode(&g.0)
                );
            }
            d.lock.lock.apply(*change);
            if log_changed && let Some(c) = d.lock.lock.chain() {
                crate::info!(
                    "locked mode: the node holds a trust log of {} entries, tip {}",
                    c.entries().len(),
                    crate::e2ee::base64::encode(&c.state().tip().0)
                );
            }
            crate::uplink::channels::enforce(d);
            if resync {
                crate::uplink::channels::sync_trust(d);
            }
            done(d, then, Ok(answer));
        }
        Err(e) => done(d, then, Err(Error::Ledger(e))),
    });
}

/// Answers the operation that ran and starts the next.
fn done(d: &mut Daemon, then: Then, r: Result<Answer, Error>) {
    d.lock.busy = false;
    then(d, r);
    pump(d);
}
