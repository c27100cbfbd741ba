//! Fork choice and chain assembly (seed 004, Locked mode, "Fork choice" and
//! "Distribution"): which of two chains with the same genesis wins, and the
//! best valid chain of each genesis found in an unordered set of entries.
//!
//! The five rules, in order: a disabled chain wins; of a chain and its
//! prefix the longer wins; otherwise the first different entries decide,
//! by weight at the fork, then a removal wins, then the lower entry hash.
//! A revoke-signer entry weighs the number of its co-signers that
//! [`State::counted_cosigners`] counts against the state at the fork (a
//! valid co-sign by a signer trusted there, a revoked signer's only when
//! Replaces is not empty); any other entry weighs 1 if its signer was
//! trusted at the fork, else 0 (a disable entry signed by another key).
//!
//! Assembly verifies the entries as a tree from each genesis, so a shared
//! prefix is checked once however many branches grow from it. A branch is
//! cut at its first entry that breaks a rule, and what precedes it stays a
//! candidate: an entry anyone can make (an invalid child of the tip) must
//! not hide the valid chain it claims to extend. Only maximal valid paths
//! are candidates, so rule 2 never decides between them; rules 1 and 3–5
//! pick, at each branch point, the child whose subtree holds the winner.
//! This is the same order [`compare`] gives pairwise: rule 1 first, then
//! the siblings at the first difference.

use std::cmp::{Ordering, Reverse};
use std::collections::HashMap;

use super::chain::{Chain, State};
use super::entry::{Entry, Hash, Kind};
use crate::limits::TRUSTLOG_MAX_CHAIN;

/// An entry's weight at the fork (rule 3).
pub fn weight(e: &Entry, fork: &State) -> usize {
    if e.kind() == Kind::RevokeSigner {
        fork.counted_cosigners(e)
    } else {
        usize::from(fork.is_signer(e.signer()))
    }
}

/// Rules 3 to 5 between two different entries with the same parent,
/// whose state is `fork`: `Greater` when `x` wins.
pub fn sibling_order(x: &Entry, y: &Entry, fork: &State) -> Ordering {
    sibling_key(x, fork).cmp(&sibling_key(y, fork))
}

type SiblingKey = (usize, bool, Reverse<Hash>);

fn sibling_key(e: &Entry, fork: &State) -> SiblingKey {
    (weight(e, fork), e.kind().is_removal(), Reverse(e.hash()))
}

/// Fork choice between two verified chains: `Greater` when `a` wins,
/// `Equal` when they are the same chain, `None` when their geneses differ
/// (the seed's rules order only chains of one log).
pub fn compare(a: &Chain, b: &Chain) -> Option<Ordering> {
    let (sa, sb) = (a.state(), b.state());
    if sa.genesis_hash() != sb.genesis_hash() {
        return None;
    }
    // 1. A disabled chain beats a chain that is not disabled.
    if sa.disabled() != sb.disabled() {
        return Some(sa.disabled().cmp(&sb.disabled()));
    }
    let (ea, eb) = (a.entries(), b.entries());
    let p = ea
        .iter()
        .zip(eb)
        .take_while(|(x, y)| x.hash() == y.hash())
        .count();
    // 2. If one chain is a prefix of the other, the longer chain wins.
    if p == ea.len() || p == eb.len() {
        return Some(ea.len().cmp(&eb.len()));
    }
    // 3–5. The first different entries, weighed at the fork.
    let fork = a.state_at(p)?;
    Some(sibling_order(&ea[p], &eb[p], &fork))
}

/// What [`assemble`] found.
#[derive(Debug, Default)]
pub struct Assembly {
    /// The winning chain of each genesis that is valid, in the order of
    /// their genesis hashes.
    pub chains: Vec<Chain>,
    /// Distinct entries on no valid path from a valid genesis: a missing
    /// ancestor, a broken rule, or another log's entries that did not
    /// verify.
    pub unplaced: usize,
}

impl Assembly {
    /// The winning chain of the log with this genesis.
    pub fn chain_for(&self, genesis: &Hash) -> Option<&Chain> {
        self.chains
            .iter()
            .find(|c| c.state().genesis_hash() == *genesis)
    }
}

/// Builds chains from an unordered set of entries (duplicates allowed):
/// walks from each genesis through the entries that name it as Prev,
/// keeps the valid paths, and picks each genesis's winner by fork choice.
/// Paths stop at 65,536 entries, the longest chain a peer may send.
pub fn assemble(entries: impl IntoIterator<Item = Entry>) -> Assembly {
    let mut nodes: Vec<Entry> = Vec::new();
    let mut index: HashMap<Hash, usize> = HashMap::new();
    for e in entries {
        if let std::collections::hash_map::Entry::Vacant(v) = index.entry(e.hash()) {
            v.insert(nodes.len());
            nodes.push(e);
        }
    }
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut roots = Vec::new();
    for (i, e) in nodes.iter().enumerate() {
        if e.prev().is_empty() {
            roots.push(i);
        } else if let Some(&p) = e.prev_hash().and_then(|h| index.get(&h)) {
            children[p].push(i);
        }
    }
    roots.sort_by_key(|&i| nodes[i].hash());

    // The trees of different geneses are disjoint: one set of per-node
    // tables serves them all, so many geneses cost no more than one.
    let n = nodes.len();
    let mut walk = Walk {
        placed: vec![false; n],
        parent: vec![None; n],
        key: vec![None; n],
        disabled: vec![false; n],
        valid_children: vec![Vec::new(); n],
        best: (0..n).collect(),
    };
    let mut chains = Vec::new();
    for root in roots {
        let Ok(state) = State::genesis(&nodes[root]) else {
            continue;
        };
        if let Some(chain) = walk.best_from(root, state, &nodes, &children) {
            chains.push(chain);
        }
    }
    let unplaced = walk.placed.iter().filter(|p| !**p).count();
    Assembly { chains, unplaced }
}

/// Per-node tables of one assembly, indexed like its entries.
struct Walk {
    /// On a valid path from a valid genesis.
    placed: Vec<bool>,
    parent: Vec<Option<usize>>,
    /// Rules 3–5 against the parent's state.
    key: Vec<Option<SiblingKey>>,
    /// The chain ending here is disabled.
    disabled: Vec<bool>,
    valid_children: Vec<Vec<usize>>,
    /// The winning leaf of the subtree.
    best: Vec<usize>,
}

impl Walk {
    /// The winning chain of the tree under a valid genesis `root`.
    fn best_from(
        &mut self,
        root: usize,
        genesis: State,
        nodes: &[Entry],
        children: &[Vec<usize>],
    ) -> Option<Chain> {
        // Pre-order walk: each node's state is moved to its last valid
        // child and cloned only for the others, so a linear chain is never
        // copied.
        let mut preorder = Vec::new();
        let mut stack: Vec<(usize, State)> = vec![(root, genesis)];
        while let Some((i, state)) = stack.pop() {
            preorder.push(i);
            self.placed[i] = true;
            self.disabled[i] = state.disabled();
            if state.len() >= TRUSTLOG_MAX_CHAIN {
                continue;
            }
            let ok: Vec<usize> = children[i]
                .iter()
                .copied()
                .filter(|&c| state.check(&nodes[c]).is_ok())
                .collect();
            for &c in &ok {
                self.parent[c] = Some(i);
                self.key[c] = Some(sibling_key(&nodes[c], &state));
            }
            let mut state = Some(state);
            for (k, &c) in ok.iter().enumerate() {
                let mut s = if k + 1 == ok.len() {
                    state.take()?
                } else {
                    state.as_ref()?.clone()
                };
                s.apply(&nodes[c]);
                stack.push((c, s));
            }
            self.valid_children[i] = ok;
        }
        // Post-order: children come after their parent in `preorder`.
        for &i in preorder.iter().rev() {
            let winner = self.valid_children[i]
                .iter()
                .copied()
                .max_by_key(|&c| (self.disabled[self.best[c]], self.key[c]));
            if let Some(c) = winner {
                self.best[i] = self.best[c];
            }
        }
        let mut path = vec![self.best[root]];
        while let Some(p) = self.parent[*path.last()?] {
            path.push(p);
        }
        path.reverse();
        let entries: Vec<Entry> = path.iter().map(|&i| nodes[i].clone()).collect();
        let mut state = State::genesis(entries.first()?).ok()?;
        for e in &entries[1..] {
            state.apply(e);
        }
        Some(Chain::from_parts(entries, state))
    }
}
