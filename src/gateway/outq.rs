//! The queue into a gateway connection's writer ([`super::conn::Outbox`]):
//! bounded by its capacity, checked on every push, and holding memory
//! only for what it holds (issue 12: an idle connection may use at most
//! 64 KiB, while the bound is `GATEWAY_OUTBOX_FRAMES` frames). A crossbeam
//! `bounded` channel of that capacity allocates and writes every slot when
//! it is made, 384 KiB a connection; this one is a `VecDeque` under a
//! mutex that grows as frames wait and gives its room back once drained.
//!
//! Senders never block: a push into a full queue, or one whose receiver is
//! gone, fails and the caller closes the connection (seed 004, "Slow
//! readers"). The receiver blocks until a value comes or the last sender
//! is dropped.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Room a drained queue keeps; more is given back.
const KEPT: usize = 64;

struct State<T> {
    items: VecDeque<T>,
    senders: usize,
    receiver: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    cap: usize,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A queue of at most `cap` values.
pub fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            items: VecDeque::new(),
            senders: 1,
            receiver: true,
        }),
        ready: Condvar::new(),
        cap,
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

/// The queue is full, or its receiver is gone.
#[derive(Debug, PartialEq)]
pub struct Refused;

/// Pushes values; cloned into every thread that queues for the writer.
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    /// Queues `v`, or refuses it when the queue holds `cap` values or
    /// nobody receives.
    pub fn try_send(&self, v: T) -> Result<(), Refused> {
        let mut s = self.shared.lock();
        if !s.receiver || s.items.len() >= self.shared.cap {
            return Err(Refused);
        }
        s.items.push_back(v);
        drop(s);
        self.shared.ready.notify_one();
        Ok(())
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Sender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        s.senders -= 1;
        if s.senders == 0 {
            drop(s);
            self.shared.ready.notify_all();
        }
    }
}

/// Takes values, in the order they were queued.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

/// Every sender is gone and nothing is left.
#[derive(Debug, PartialEq)]
pub struct Disconnected;

impl<T> Receiver<T> {
    /// The next value, waiting for one; `Err` once every sender is gone
    /// and the queue is empty.
    pub fn recv(&self) -> Result<T, Disconnected> {
        let mut s = self.shared.lock();
        loop {
            if let Some(v) = take(&mut s) {
                return Ok(v);
            }
            if s.senders == 0 {
                return Err(Disconnected);
            }
            s = self.shared.ready.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The next value if one is queued.
    pub fn try_recv(&self) -> Option<T> {
        take(&mut self.shared.lock())
    }

    /// The next value, waiting at most `timeout`; `None` after it, or once
    /// every sender is gone and the queue is empty.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<T> {
        let deadline = Instant::now() + timeout;
        let mut s = self.shared.lock();
        loop {
            if let Some(v) = take(&mut s) {
                return Some(v);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if s.senders == 0 || left.is_zero() {
                return None;
            }
            s = self
                .shared
                .ready
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Values queued now.
    pub fn len(&self) -> usize {
        self.shared.lock().items.len()
    }

    /// Whether nothing is queued now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        s.receiver = false;
        // What waits is dropped now: nobody will take it.
        s.items = VecDeque::new();
    }
}

/// Pops the front, giving back the room of a burst once drained.
fn take<T>(s: &mut State<T>) -> Option<T> {
    let v = s.items.pop_front();
    if s.items.is_empty() && s.items.capacity() > KEPT {
        s.items.shrink_to(KEPT);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_holds_at_most_its_capacity_in_order_and_ends_with_its_senders() {
        let (tx, rx) = bounded(3);
        let tx2 = tx.clone();
        for i in 0..3 {
            tx.try_send(i).unwrap();
        }
        assert_eq!(tx2.try_send(9), Err(Refused));
        assert_eq!(rx.len(), 3);
        assert_eq!(rx.recv(), Ok(0));
        tx2.try_send(3).unwrap();
        assert_eq!(
            (rx.try_recv(), rx.recv_timeout(Duration::ZERO)),
            (Some(1), Some(2))
        );
        drop((tx, tx2));
        // What was queued before the last sender left is still taken.
        assert_eq!(rx.recv(), Ok(3));
        assert_eq!(rx.recv(), Err(Disconnected));
        assert_eq!(rx.recv_timeout(Duration::from_secs(60)), None);
    }

    #[test]
    fn a_waiting_receiver_wakes_for_a_value_and_a_gone_receiver_refuses() {
        let (tx, rx) = bounded(1);
        let t = std::thread::spawn(move || rx.recv());
        tx.try_send(7).unwrap();
        assert_eq!(t.join().unwrap(), Ok(7));
        // The receiver is gone with the thread.
        assert_eq!(tx.try_send(8), Err(Refused));
    }

    #[test]
    fn a_drained_burst_gives_its_room_back() {
        let (tx, rx) = bounded(10_000);
        for i in 0..10_000 {
            tx.try_send(i).unwrap();
        }
        while rx.try_recv().is_some() {}
        assert!(rx.shared.lock().items.capacity() <= KEPT);
    }
}
