//! Relay frames' path through the gateway (seed 004, "Relay channels",
//! "Route header", "Limits and teardown"; issue 12): the table of open
//! channels, shared read-mostly between the gateway thread and the
//! connections' readers, so that a relay frame goes from the reader that
//! read it straight into the writer of the channel's other side without a
//! hop through the `gateway` thread.
//!
//! Who does what. The gateway thread ([`super::state`]) is the only one
//! that adds and removes channels (`relay.open`, `relay.close`, teardown),
//! under the table's write lock; it stays the owner of what channels mean
//! (roster, ownership lists, `relay.closed`). A reader takes the read lock
//! once per WebSocket message and, for each relay frame in it, checks
//! there what the gateway thread used to check: the `chan_id` exists and
//! the sender holds that side; any other relay frame is dropped without a
//! reply. Because a channel leaves the table (write lock) before its
//! `relay.closed` is queued, a frame forwarded under the read lock is
//! always queued before that notification.
//!
//! Consecutive frames of one direction are first offered to the receiver's
//! socket in one direct write ([`super::conn::Outbox::try_direct`]); what
//! is written there never waits in a queue, so it counts against none.
//!
//! Bounds, unchanged: each direction of a channel counts its frames and
//! bytes handed to the receiver's writer and not yet written (the writer
//! lowers the count, [`super::conn::Out::written`]). Only one reader sends
//! in each direction of a channel (the client's or the node's), so the
//! check and the count cannot race. A frame that finds its direction full
//! (64 frames, or `GATEWAY_CHANNEL_QUEUE_BYTES`) is not forwarded and
//! closes the channel: the reader marks it closing, so no later frame of it
//! passes, and asks the gateway thread to close it; nothing is ever
//! dropped from the middle of a channel. A receiver whose whole outbox is
//! full is closed by the gateway thread at the reader's request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use super::conn::{Direct, Out, Outbox, Queued};
use crate::limits;

/// One direction of a channel: the receiver's outbox and what waits in it.
struct Dir {
    out: Outbox,
    queued: Arc<Queued>,
}

/// An open channel.
struct Chan {
    client: u64,
    node: u64,
    to_node: Dir,
    to_client: Dir,
    /// Set by the reader whose frame found a full queue; the gateway
    /// thread removes the channel soon after.
    closing: AtomicBool,
}

/// What a reader must ask of the gateway thread after forwarding.
#[derive(Debug, PartialEq)]
pub enum Trouble {
    /// The channel's queue in one direction was full: close it.
    Overflow(String),
    /// This connection's outbox is full: close it (Slow readers).
    Full(u64),
}

/// The open channels, by id.
#[derive(Default)]
pub struct Table {
    chans: RwLock<HashMap<String, Chan>>,
}

impl Table {
    /// Opens `chan` between two connections (the gateway thread).
    pub fn open(
        &self,
        chan: String,
        (client, client_out): (u64, Outbox),
        (node, node_out): (u64, Outbox),
    ) {
        let c = Chan {
            client,
            node,
            to_node: Dir {
                out: node_out,
                queued: Arc::default(),
            },
            to_client: Dir {
                out: client_out,
                queued: Arc::default(),
            },
            closing: AtomicBool::new(false),
        };
        self.write().insert(chan, c);
    }

    /// Removes `chan` (the gateway thread); frames already handed to a
    /// writer stay queued ahead of anything queued after this.
    pub fn close(&self, chan: &str) {
        self.write().remove(chan);
    }

    /// Forwards the relay frames `frames` (their channel id and line, as
    /// read, in order) that `from` may send; says what the gateway thread
    /// must do about the others. Consecutive frames of one channel
    /// direction are tried as one direct write first (module comment).
    pub fn forward(
        &self,
        from: u64,
        frames: impl Iterator<Item = (String, Vec<u8>)>,
        trouble: &mut Vec<Trouble>,
    ) {
        let chans = self.chans.read().unwrap_or_else(|p| p.into_inner());
        let mut run: Vec<Vec<u8>> = Vec::new();
        let mut run_of: Option<(&str, &Chan, &Dir)> = None;
        for (chan, line) in frames {
            let Some((name, ch)) = chans.get_key_value(&chan) else {
                continue;
            };
            let dir = if ch.client == from {
                &ch.to_node
            } else if ch.node == from {
                &ch.to_client
            } else {
                // Not the sender's channel: dropped without a reply.
                continue;
            };
            if let Some((_, _, d)) = run_of
                && !std::ptr::eq(d, dir)
            {
                flush(from, run_of, &mut run, trouble);
            }
            run_of = Some((name.as_str(), ch, dir));
            run.push(line);
        }
        flush(from, run_of, &mut run, trouble);
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Chan>> {
        self.chans.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// Hands on `run`, consecutive frames of one channel direction: in one
/// direct write when the receiver's writer is idle, else each queued, as
/// long as the channel is open and its queue has room.
fn flush(
    from: u64,
    to: Option<(&str, &Chan, &Dir)>,
    run: &mut Vec<Vec<u8>>,
    trouble: &mut Vec<Trouble>,
) {
    let Some((chan, ch, dir)) = to else {
        return;
    };
    if run.is_empty() || ch.closing.load(Ordering::Acquire) {
        run.clear();
        return;
    }
    if dir.out.try_direct(run) == Direct::Sent {
        run.clear();
        return;
    }
    for line in run.drain(..) {
        if ch.closing.load(Ordering::Acquire) {
            continue;
        }
        let q = &dir.queued;
        let n = line.len();
        if q.frames.load(Ordering::Acquire) >= limits::GATEWAY_CHANNEL_QUEUE
            || q.bytes.load(Ordering::Acquire) + n > limits::GATEWAY_CHANNEL_QUEUE_BYTES
        {
            crate::debug!("gateway: closed channel {chan}: its queue is full");
            ch.closing.store(true, Ordering::Release);
            trouble.push(Trouble::Overflow(chan.to_string()));
            continue;
        }
        q.frames.fetch_add(1, Ordering::AcqRel);
        q.bytes.fetch_add(n, Ordering::AcqRel);
        if dir.out.push(Out::Relay(line, q.clone())).is_err() {
            q.frames.fetch_sub(1, Ordering::AcqRel);
            q.bytes.fetch_sub(n, Ordering::AcqRel);
            let dest = if ch.client == from {
                ch.node
            } else {
                ch.client
            };
            if !trouble.contains(&Trouble::Full(dest)) {
                trouble.push(Trouble::Full(dest));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_pass_only_to_the_other_side_and_a_full_queue_closes() {
        let t = Table::default();
        let (client_out, client_rx, _) = Outbox::new();
        let (node_out, node_rx, _) = Outbox::new();
        t.open("c1".into(), (1, client_out), (2, node_out));
        let mut trouble = Vec::new();
        let frames = |n: usize| (0..n).map(|i| ("c1".to_string(), vec![b'a'; i + 1]));
        // The client's frames reach the node; a stranger's are dropped.
        t.forward(1, frames(2), &mut trouble);
        t.forward(3, frames(1), &mut trouble);
        t.forward(1, [("c9".to_string(), vec![1])].into_iter(), &mut trouble);
        assert_eq!(node_rx.len(), 2);
        assert!(client_rx.is_empty() && trouble.is_empty());
        // Unwritten, the queue fills at 64; the 65th closes the channel
        // and nothing after it passes.
        t.forward(1, frames(limits::GATEWAY_CHANNEL_QUEUE), &mut trouble);
        assert_eq!(node_rx.len(), limits::GATEWAY_CHANNEL_QUEUE);
        assert_eq!(trouble, vec![Trouble::Overflow("c1".into())]);
        // The other direction is closed with it.
        t.forward(2, frames(1), &mut trouble);
        assert!(client_rx.is_empty());
        // Written frames lower the count.
        while let Some(o) = node_rx.try_recv() {
            o.written();
        }
        t.close("c1");
        t.forward(1, frames(1), &mut trouble);
        assert!(node_rx.is_empty());
    }
}
