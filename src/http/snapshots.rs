//! Reads of committed state without the reactor (issue 11, "Figures that
//! fell short": "reads of committed state need not wait for the reactor
//! at all"): the serialised answers of `GET /sessions/{id}`, shared with
//! the listener's poller, which answers from them at once, and the
//! handler threads.
//!
//! The reactor fills an entry when it answers such a read (src/http/
//! sessions.rs), serialising the Session once and computing its ETag
//! once; the poller and handlers answer later reads of the same path and
//! tail from those bytes, with the same ETag, If-Match and If-None-Match
//! handling, while the entry is current.
//!
//! Current means: no unit of the reactor's work that may change state has
//! started since the entry was made. The reactor counts such units
//! ([`crate::reactor::Inbox::changed`]) before running each, so before any
//! answer, acknowledgement or publication it sends; an entry records the
//! count at which it was made, and it is served only while the count is
//! still that. So a client that got a write acknowledged (over
//! HTTP or the daemon socket) and then reads gets an answer made after
//! the write: the count moved before the acknowledgement was sent, and
//! the entry made before it is no longer current. The invalidation is
//! coarse on purpose: it needs no list of what a Session shows (which
//! reaches from the session core to inputs, approvals, creations and
//! watch cursors), so a field added to it later cannot be left stale. It
//! costs a busy daemon the cache, not correctness; an idle session read
//! by many clients, the case issue 11 measures, is served by the poller,
//! past each connection's first read, without the reactor or a handler
//! thread (src/http/listener.rs, "Reads answered at once"). Entries are
//! made only by reads that change nothing ([`crate::reactor::Msg::Read`]),
//! or that count their change (a watch topic a read starts) before the
//! entry is made.
//!
//! Bounded by `limits::HTTP_SNAPSHOTS` entries: a full map drops the
//! entries that are no longer current, and if all are, is emptied.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::limits;
use crate::reactor::Inbox;

/// One serialised answer.
pub struct Snapshot {
    /// [`Inbox::changes`] when it was made.
    pub at: u64,
    /// The daemon session id the path named then, for the caller check.
    pub sid: String,
    pub body: Arc<[u8]>,
    pub etag: String,
}

/// Entries by (path's session id or creation id, tail).
#[derive(Default)]
pub struct Snapshots {
    map: RwLock<HashMap<(String, usize), Arc<Snapshot>>>,
}

impl Snapshots {
    /// The current entry for `raw` and `tail`, if any.
    pub fn get(&self, inbox: &Inbox, raw: &str, tail: usize) -> Option<Arc<Snapshot>> {
        let found = {
            let map = self.map.read().unwrap_or_else(|e| e.into_inner());
            map.get(&(raw.to_string(), tail)).cloned()
        }?;
        // Read after the entry: a change counted before this load makes
        // the entry stale, and one counted after it comes after this read.
        (found.at == inbox.changes()).then_some(found)
    }

    /// Keeps `snap` for later reads of `raw` and `tail`.
    pub fn put(&self, raw: &str, tail: usize, snap: Arc<Snapshot>) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let key = (raw.to_string(), tail);
        if map.len() >= limits::HTTP_SNAPSHOTS && !map.contains_key(&key) {
            map.retain(|_, s| s.at == snap.at);
            if map.len() >= limits::HTTP_SNAPSHOTS {
                map.clear();
            }
        }
        map.insert(key, snap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(at: u64) -> Arc<Snapshot> {
        Arc::new(Snapshot {
            at,
            sid: "s-000000000001".into(),
            body: Arc::from(&b"{}"[..]),
            etag: "\"x\"".into(),
        })
    }

    #[test]
    fn an_entry_is_served_only_while_nothing_changed_and_the_map_stays_bounded() {
        let reactor = crate::reactor::Reactor::new().unwrap();
        let inbox = reactor.inbox();
        let s = Snapshots::default();
        s.put("s-000000000001", 20, snap(inbox.changes()));
        assert!(s.get(&inbox, "s-000000000001", 20).is_some());
        assert!(s.get(&inbox, "s-000000000001", 5).is_none(), "another tail");
        inbox.changed();
        assert!(s.get(&inbox, "s-000000000001", 20).is_none(), "stale");
        for i in 0..limits::HTTP_SNAPSHOTS * 3 {
            if i % 50 == 0 {
                inbox.changed();
            }
            s.put(&format!("s-{i}"), 20, snap(inbox.changes()));
            let held = s.map.read().unwrap().len();
            assert!(held <= limits::HTTP_SNAPSHOTS, "{held} entries held");
        }
        let last = format!("s-{}", limits::HTTP_SNAPSHOTS * 3 - 1);
        assert!(s.get(&inbox, &last, 20).is_some());
    }
}
