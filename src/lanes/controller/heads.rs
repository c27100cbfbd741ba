//! The commit each lane's branch points at (seed 000, lanes[].head): read
//! on the heads thread, one background read at a time, and on demand for
//! the daemon socket's readers. See "Heads" in the controller's module
//! comment.

use super::*;

impl Lanes {
    /// Reads the branch heads again in the background when the last read
    /// is older than `LANE_HEADS_FRESH_MS`, for the next reader of
    /// [`Lanes::listed`] that answers at once (the plugin wire).
    pub fn keep_heads_fresh(&mut self, cx: &Cx) -> Vec<Effect> {
        let fresh = self.heads_read.is_some_and(|t| {
            cx.now.saturating_duration_since(t) < Duration::from_millis(limits::LANE_HEADS_FRESH_MS)
        });
        let mut fx = Vec::new();
        if !fresh {
            self.refresh_heads(&mut fx);
        }
        fx
    }

    /// Reads the commit the branch of every lane not archived points at,
    /// on the heads thread (one `git for-each-ref` per repository); one
    /// such read at a time (one asked for meanwhile follows it), and none
    /// when the thread cannot take it (the next reader asks again).
    pub(super) fn refresh_heads(&mut self, fx: &mut Fx) {
        if self.heads_reading {
            self.heads_again = true;
            return;
        }
        self.heads_reading = true;
        fx.push(Effect::ReadHeads(HeadsJob {
            branches: self.branches(None),
            to: None,
        }));
    }

    /// Reads the branch head of every lane not archived and of lane `also`
    /// on the heads thread, then answers [`Answer::HeadsFresh`] to `to`:
    /// the daemon socket's lane reads answer with the branches as they
    /// are. When the thread cannot take the read now, the answer comes at
    /// once, on the heads read last.
    pub fn fresh_heads(&mut self, also: Option<&str>, to: ReplyKey) -> Vec<Effect> {
        vec![Effect::ReadHeads(HeadsJob {
            branches: self.branches(also),
            to: Some(to),
        })]
    }

    /// The heads thread could not take a read.
    pub fn heads_refused(&mut self, to: Option<ReplyKey>) -> Vec<Effect> {
        match to {
            None => {
                self.heads_reading = false;
                Vec::new()
            }
            Some(to) => vec![Effect::Answer {
                to,
                answer: Answer::HeadsFresh,
            }],
        }
    }

    /// The branch of every lane not archived, and of lane `also` (lanes.get
    /// shows archived lanes too), by repository.
    pub(super) fn branches(&self, also: Option<&str>) -> HashMap<PathBuf, Vec<(String, String)>> {
        let mut by_repo: HashMap<PathBuf, Vec<(String, String)>> = HashMap::new();
        for l in self
            .map
            .values()
            .filter(|l| !l.archived || Some(l.id.as_str()) == also)
        {
            by_repo
                .entry(l.repo.clone())
                .or_default()
                .push((l.id.clone(), l.branch.clone()));
        }
        by_repo
    }

    pub(super) fn store_heads(&mut self, cx: &Cx, heads: Heads) {
        self.heads_read = Some(cx.now);
        for (id, head) in heads {
            if let Some(l) = self.map.get_mut(&id) {
                l.head = Some(head);
            }
        }
    }
}
