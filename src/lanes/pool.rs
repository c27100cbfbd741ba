//! The daemon-owned checkouts of lanes, pooled per repository (issue 5,
//! "at most 50 ms of daemon time per round on a repository of 10,000
//! files"). A full checkout of a large repository costs far more than the
//! rest of a round, so a checkout outlives the lane that made it: a lane
//! takes one from its repository's spares when it first needs one (to check
//! or verify), holds it until its verdict, then gives it back, and the next
//! lane moves it with `git::checkout_exactly` instead of making a new one.
//!
//! Bookkeeping only, on the reactor; the git work is the controller's, on
//! the lane workers. A checkout is never used by two lanes at once: a lane
//! holds it (its path is in the lane's record) from take to give, and a
//! checkout given back while a job or a verifier session still uses it is
//! only put back once the last of them is done.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// What became of a checkout a lane gave back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Returned {
    /// Still in use by a job or a session; put back when they are done.
    Deferred,
    /// A spare of its repository now.
    Pooled,
    /// Past the bound: the caller removes it.
    Remove,
}

#[derive(Debug)]
pub struct Pool {
    /// Spares kept per repository at most; beyond it a returned checkout
    /// is removed.
    max_spare: usize,
    spare: HashMap<PathBuf, Vec<PathBuf>>,
    /// Jobs and sessions using a checkout now.
    users: HashMap<PathBuf, u32>,
    /// Given back while in use: checkout -> repository.
    returning: HashMap<PathBuf, PathBuf>,
}

impl Default for Pool {
    fn default() -> Pool {
        Pool::new(crate::limits::LANE_SPARE_CHECKOUTS)
    }
}

impl Pool {
    pub fn new(max_spare: usize) -> Pool {
        Pool {
            max_spare,
            spare: HashMap::new(),
            users: HashMap::new(),
            returning: HashMap::new(),
        }
    }

    /// A spare checkout of `repo`, now the caller's; None when there is
    /// none (the caller names a new one).
    pub fn take(&mut self, repo: &Path) -> Option<PathBuf> {
        let v = self.spare.get_mut(repo)?;
        let co = v.pop();
        if v.is_empty() {
            self.spare.remove(repo);
        }
        co
    }

    /// A job or a session starts using `co`.
    pub fn use_start(&mut self, co: &Path) {
        *self.users.entry(co.to_path_buf()).or_default() += 1;
    }

    /// One user of `co` is done. When the checkout was given back meanwhile
    /// and this was its last user, it is returned now: the answer says how.
    pub fn use_end(&mut self, co: &Path) -> Option<(PathBuf, Returned)> {
        let n = self.users.get_mut(co)?;
        *n -= 1;
        if *n > 0 {
            return None;
        }
        self.users.remove(co);
        let repo = self.returning.remove(co)?;
        let r = self.put(&repo, co);
        Some((repo, r))
    }

    /// The lane that held `co` lets it go.
    pub fn give(&mut self, repo: &Path, co: &Path) -> Returned {
        if self.users.contains_key(co) {
            self.returning.insert(co.to_path_buf(), repo.to_path_buf());
            return Returned::Deferred;
        }
        self.put(repo, co)
    }

    fn put(&mut self, repo: &Path, co: &Path) -> Returned {
        let v = self.spare.entry(repo.to_path_buf()).or_default();
        if v.len() < self.max_spare && !v.iter().any(|c| c == co) {
            v.push(co.to_path_buf());
            Returned::Pooled
        } else {
            if v.is_empty() {
                self.spare.remove(repo);
            }
            Returned::Remove
        }
    }

    /// Every checkout the pool knows of: spares, in use, being returned.
    pub fn known(&self) -> HashSet<PathBuf> {
        self.spare
            .values()
            .flatten()
            .chain(self.users.keys())
            .chain(self.returning.keys())
            .cloned()
            .collect()
    }

    pub fn spares(&self, repo: &Path) -> usize {
        self.spare.get(repo).map_or(0, Vec::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returned_checkout_is_taken_by_the_next_lane_of_its_repository_only() {
        let mut p = Pool::new(2);
        let (r, other, co) = (Path::new("/r"), Path::new("/o"), Path::new("/s/co-1"));
        assert_eq!(p.take(r), None);
        assert_eq!(p.give(r, co), Returned::Pooled);
        assert_eq!(p.take(other), None);
        assert_eq!(p.take(r).as_deref(), Some(co));
        assert_eq!(p.take(r), None, "a checkout is never handed out twice");
    }

    #[test]
    fn a_checkout_in_use_is_put_back_after_its_last_user() {
        let mut p = Pool::new(2);
        let (r, co) = (Path::new("/r"), Path::new("/s/co-1"));
        p.use_start(co); // the check job
        p.use_start(co); // the verifier's session
        assert_eq!(p.give(r, co), Returned::Deferred);
        assert_eq!(p.take(r), None, "not a spare while still in use");
        assert_eq!(p.use_end(co), None);
        assert_eq!(p.use_end(co), Some((r.to_path_buf(), Returned::Pooled)));
        assert_eq!(p.take(r).as_deref(), Some(co));
        // A user ending on a held checkout returns nothing.
        p.use_start(co);
        assert_eq!(p.use_end(co), None);
    }

    #[test]
    fn past_the_bound_a_returned_checkout_is_removed() {
        let mut p = Pool::new(1);
        let r = Path::new("/r");
        assert_eq!(p.give(r, Path::new("/s/a")), Returned::Pooled);
        assert_eq!(p.give(r, Path::new("/s/b")), Returned::Remove);
        assert_eq!(p.spares(r), 1);
        // A bound of 0 keeps nothing: every lane makes and removes its own.
        let mut none = Pool::new(0);
        assert_eq!(none.give(r, Path::new("/s/a")), Returned::Remove);
        none.use_start(Path::new("/s/b"));
        assert_eq!(none.give(r, Path::new("/s/b")), Returned::Deferred);
        assert_eq!(
            none.use_end(Path::new("/s/b")),
            Some((r.to_path_buf(), Returned::Remove))
        );
        assert!(none.known().is_empty());
    }

    #[test]
    fn the_default_bound_is_the_limit() {
        let mut p = Pool::default();
        let r = Path::new("/r");
        for i in 0..crate::limits::LANE_SPARE_CHECKOUTS {
            assert_eq!(
                p.give(r, &PathBuf::from(format!("/s/{i}"))),
                Returned::Pooled
            );
        }
        assert_eq!(p.give(r, Path::new("/s/extra")), Returned::Remove);
    }
}
