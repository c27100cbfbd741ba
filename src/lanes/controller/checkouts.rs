//! The daemon-owned checkouts a lane holds from its check to its verdict
//! (`lanes::pool`): taken, given back, and reclaimed after a restart.

use super::*;

impl Lanes {
    /// Checkouts under state/lanes/ that no live lane holds, left by the
    /// last run (a lane archived as the daemon stopped, a give-back that did
    /// not happen, a checkout of the per-lane kind older daemons made) are
    /// put back in their repository's pool rather than removed: a full
    /// checkout is the very cost the pool saves, and `git::checkout_exactly`
    /// makes whatever state a stop left there exact before any lane uses
    /// it. The pool's bound still holds (the rest are removed), and so are
    /// checkouts of a repository the daemon no longer knows, or that git
    /// does not recognize.
    pub(super) fn reclaimed(
        &mut self,
        cx: &Cx,
        fx: &mut Fx,
        found: Vec<(PathBuf, Option<PathBuf>)>,
    ) {
        let held: HashSet<PathBuf> = self
            .map
            .values()
            .filter_map(|l| l.checkout.clone())
            .chain(self.pool.known())
            .collect();
        let known: Vec<PathBuf> = self
            .known_repos(cx.cfg)
            .into_iter()
            .map(|r| r.canonicalize().unwrap_or(r))
            .collect();
        for (co, repo) in found {
            if held.contains(&co) {
                continue;
            }
            match repo {
                Some(repo) if known.contains(&repo) => {
                    let r = self.pool.give(&repo, &co);
                    if r == Returned::Pooled {
                        crate::info!(
                            "checkout {}: left by the last run, kept for the next lane of {}",
                            co.display(),
                            repo.display()
                        );
                    }
                    returned(fx, repo, co, r);
                }
                repo => fx.push(remove_checkout(repo, co)),
            }
        }
    }

    /// The lane's checkout: the one it holds, else a spare of its
    /// repository, else a new path (made by the first `checkout_exactly` on
    /// it).
    pub(super) fn lane_checkout(&mut self, cx: &Cx, id: &str) -> Option<PathBuf> {
        let l = self.map.get(id)?;
        if let Some(co) = &l.checkout {
            return Some(co.clone());
        }
        let co = match self.pool.take(&l.repo) {
            Some(co) => {
                crate::info!("lane {id}: reuses checkout {}", co.display());
                co
            }
            None => {
                let co = cx
                    .state_dir
                    .join("lanes")
                    .join(crate::ids::prefixed_id("co-"));
                crate::info!("lane {id}: new checkout {}", co.display());
                co
            }
        };
        self.map.get_mut(id)?.checkout = Some(co.clone());
        Some(co)
    }

    /// The lane lets its checkout go (its verdict is in, or it left the
    /// loop).
    pub(super) fn release_checkout(&mut self, fx: &mut Fx, id: &str) {
        let Some(l) = self.map.get_mut(id) else {
            return;
        };
        let Some(co) = l.checkout.take() else { return };
        let repo = l.repo.clone();
        crate::info!("lane {id}: gives back checkout {}", co.display());
        let r = self.pool.give(&repo, &co);
        returned(fx, repo, co, r);
    }

    /// A job or session that used `co` is done.
    pub(super) fn checkout_used(&mut self, fx: &mut Fx, co: &Path) {
        if let Some((repo, r)) = self.pool.use_end(co) {
            returned(fx, repo, co.to_path_buf(), r);
        }
    }
}

/// Stages in which a lane holds its checkout: from its check to its
/// verdict. The verifier reads the checkout while the lane verifies.
pub(super) fn holds_checkout(stage: Stage) -> bool {
    matches!(
        stage,
        Stage::Checking
            | Stage::WaitingVerifier
            | Stage::Verifying
            | Stage::VerifyFailed
            | Stage::SecondOpinion
    )
}

pub(super) fn returned(fx: &mut Fx, repo: PathBuf, co: PathBuf, r: Returned) {
    match r {
        Returned::Deferred => {}
        Returned::Pooled => crate::info!(
            "checkout {}: kept for the next lane of {}",
            co.display(),
            repo.display()
        ),
        Returned::Remove => fx.push(remove_checkout(Some(repo), co)),
    }
}

pub(super) fn remove_checkout(repo: Option<PathBuf>, checkout: PathBuf) -> Effect {
    Effect::Job(Job::RemoveCheckout { repo, checkout })
}
