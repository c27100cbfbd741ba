//! `trustlog.sync` as pure functions (seed 004, Locked mode,
//! "Distribution"): what a caller sends as `known`, and what the gateway
//! answers from the entries it holds.
//!
//! The gateway holds entries deduplicated by hash and unverified; it only
//! needs each entry's hash and Prev, so these functions take decoded
//! entries and never check a signature. When a caller holds more than
//! 4,096 entries it sends the hashes of the last 4,096 in its order
//! (parents first, so the newest): those are the ones a gateway that
//! restarted or missed a push most likely lacks, and `want` can only name
//! hashes that were sent.

use std::collections::{HashMap, HashSet};
use std::fmt;

use super::entry::{Entry, Hash};
use crate::limits::TRUSTLOG_SYNC_KNOWN_MAX;

/// The params of `trustlog.sync`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncRequest {
    pub known: Vec<Hash>,
    pub truncated: bool,
}

/// The result of `trustlog.sync`, borrowing the gateway's entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncAnswer<'a> {
    /// Every held entry not in `known`, parents first.
    pub entries: Vec<&'a Entry>,
    /// Hashes in `known` that the gateway does not hold, in the order sent.
    pub want: Vec<Hash>,
    /// `known` is not empty, not truncated, and shares no hash with the
    /// gateway.
    pub disjoint: bool,
}

/// A request the gateway refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncError {
    /// More than 4,096 hashes in `known`: the caller must cut the list.
    KnownTooLong { len: usize },
}

impl SyncError {
    pub fn code(&self) -> &'static str {
        match self {
            SyncError::KnownTooLong { .. } => "trustlog-known-too-long",
        }
    }
}

impl fmt::Display for SyncError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyncError::KnownTooLong { len } => write!(
                f,
                "known has {len} hashes, over the limit of {TRUSTLOG_SYNC_KNOWN_MAX}"
            ),
        }
    }
}

impl std::error::Error for SyncError {}

/// The caller's side: `known` for the entries it holds (in its order,
/// parents first), cut to the last 4,096 with `truncated` set.
pub fn request<'a>(held: impl IntoIterator<Item = &'a Entry>) -> SyncRequest {
    let mut known: Vec<Hash> = held.into_iter().map(Entry::hash).collect();
    let truncated = known.len() > TRUSTLOG_SYNC_KNOWN_MAX;
    if truncated {
        known.drain(..known.len() - TRUSTLOG_SYNC_KNOWN_MAX);
    }
    SyncRequest { known, truncated }
}

/// The gateway's answer from the entries it holds (`held` deduplicated by
/// hash; a duplicate is sent once).
pub fn answer<'a>(held: &'a [Entry], req: &SyncRequest) -> Result<SyncAnswer<'a>, SyncError> {
    if req.known.len() > TRUSTLOG_SYNC_KNOWN_MAX {
        return Err(SyncError::KnownTooLong {
            len: req.known.len(),
        });
    }
    let known: HashSet<Hash> = req.known.iter().copied().collect();
    let mut index: HashMap<Hash, usize> = HashMap::with_capacity(held.len());
    for (i, e) in held.iter().enumerate() {
        index.entry(e.hash()).or_insert(i);
    }
    let mut shared = false;
    let mut want = Vec::new();
    let mut wanted = HashSet::new();
    for h in &req.known {
        if index.contains_key(h) {
            shared = true;
        } else if wanted.insert(*h) {
            want.push(*h);
        }
    }
    let depth = depths(held, &index);
    let mut order: Vec<usize> = index
        .values()
        .copied()
        .filter(|&i| !known.contains(&held[i].hash()))
        .collect();
    // Parents first: an entry is deeper than its parent, when the parent
    // is held; equal depths keep the order the gateway received them in.
    order.sort_by_key(|&i| (depth[i], i));
    Ok(SyncAnswer {
        entries: order.into_iter().map(|i| &held[i]).collect(),
        want,
        disjoint: !req.known.is_empty() && !req.truncated && !shared,
    })
}

/// The heads of what the gateway holds: the entries no other held entry
/// names as Prev, in the order received (`trustlog.changed {heads}`).
pub fn heads(held: &[Entry]) -> Vec<Hash> {
    let named: HashSet<Hash> = held.iter().filter_map(Entry::prev_hash).collect();
    let mut seen = HashSet::new();
    held.iter()
        .map(Entry::hash)
        .filter(|h| !named.contains(h) && seen.insert(*h))
        .collect()
}

/// Each held entry's distance from the first of its ancestors the gateway
/// holds (0 for a genesis or an entry whose parent it lacks). Iterative,
/// so a 65,536-entry chain needs no deep stack; Prev links cannot form a
/// cycle without a BLAKE2s collision, and a walk that meets one anyway
/// stops at the entry already on its path.
fn depths(held: &[Entry], index: &HashMap<Hash, usize>) -> Vec<usize> {
    let mut depth: Vec<Option<usize>> = vec![None; held.len()];
    // Which walk last put an entry on its path: a walk that meets its own
    // stamp has met a cycle.
    let mut seen_by: Vec<usize> = vec![usize::MAX; held.len()];
    let mut path = Vec::new();
    for start in 0..held.len() {
        let mut i = start;
        let mut next = loop {
            if let Some(d) = depth[i] {
                break d + 1;
            }
            if seen_by[i] == start {
                break 0;
            }
            seen_by[i] = start;
            path.push(i);
            match held[i].prev_hash().and_then(|h| index.get(&h)) {
                Some(&p) => i = p,
                None => break 0,
            }
        };
        // The path runs from `start` up to its topmost entry; number it
        // from the top down.
        while let Some(j) = path.pop() {
            depth[j] = Some(next);
            next += 1;
        }
    }
    depth.into_iter().map(|d| d.unwrap_or(0)).collect()
}
