//! Picking the lanes up after a restart: see "Restart" in the
//! controller's module comment. The lanes resume once their records, the
//! isolation probe, the reopened sessions and the seats' first probe are
//! all known.

use super::*;

/// What a builder reopened after a restart is told.
pub(super) const RESUMED: &str = "The daemon restarted while you worked on this task. Continue it in this worktree; your earlier work is here.";

impl Lanes {
    /// The daemon's isolation probe answered.
    pub fn isolation_known(&mut self, cx: &Cx, probe: &Probe) -> Vec<Effect> {
        if let Err(why) = probe {
            crate::warn!("acceptance commands cannot run isolated: {why}");
        }
        self.isolation = Some(probe.clone());
        let mut fx = Vec::new();
        self.resume_all(cx, &mut fx);
        fx
    }

    /// The sessions of the last run that no lane will use again, so that
    /// the restart does not reopen them: every lane's verifier session,
    /// since a verification cut off by the stop starts over with a new
    /// verifier, and one past its verdict was done with. The lanes forget
    /// them here.
    pub fn sessions_not_needed(&mut self) -> HashSet<String> {
        let mut out = HashSet::new();
        for l in self.map.values_mut() {
            if let Some(sid) = l.verifier_session.take() {
                self.by_session.remove(&sid);
                out.insert(sid);
            }
        }
        out
    }

    /// The sessions of the last run are reopened: each lane notes the
    /// agent session its builder's session was reopened with (before the
    /// agent has said anything), and the lanes resume when the rest is
    /// known.
    pub fn sessions_restored(&mut self, cx: &Cx) -> Vec<Effect> {
        for l in self.map.values_mut() {
            l.builder_reopened = l
                .builder_session
                .as_deref()
                .and_then(|sid| cx.sessions.session(sid))
                .filter(|s| !s.ended)
                .and_then(|s| s.agent_session_id.map(str::to_string));
        }
        self.sessions_restored = true;
        let mut fx = Vec::new();
        self.resume_all(cx, &mut fx);
        fx
    }

    /// The seats' probe answered.
    pub fn seats_probed(&mut self, cx: &Cx) -> Vec<Effect> {
        self.seats_probed = true;
        let mut fx = Vec::new();
        self.resume_all(cx, &mut fx);
        fx
    }

    /// Lanes resume once their records, the isolation probe, the reopened
    /// sessions and the seats' first probe are all known: a lane resumed
    /// before the probe would find every seat not ready, wait for its
    /// verifier or go to the operator for that alone.
    pub(super) fn resume_all(&mut self, cx: &Cx, fx: &mut Fx) {
        let seats_known = self.seats_probed || !cx.seats.probing();
        if !self.loaded
            || self.isolation.is_none()
            || !self.sessions_restored
            || !seats_known
            || self.resumed
        {
            return;
        }
        self.resumed = true;
        let mut ids: Vec<String> = std::mem::take(&mut self.to_resume)
            .into_iter()
            .filter(|id| self.map.get(id).is_some_and(|l| !l.archived))
            .collect();
        ids.sort();
        for id in ids {
            self.resume(cx, fx, &id);
        }
    }

    /// Picks a lane up after a restart; see the module comment.
    pub(super) fn resume(&mut self, cx: &Cx, fx: &mut Fx, id: &str) {
        let Some(l) = self.map.get(id) else { return };
        let stage = l.machine.stage;
        crate::info!("lane {id}: resuming at {}", stage.name());
        match stage {
            // The turn the stop cut off ended with it: the builder is asked
            // to go on, in its reopened session when there is one, with the
            // task (the agent may have come back without its history).
            Stage::Building | Stage::Rework => {
                let prompt = format!("{RESUMED}\n\nThe task:\n{}", l.task.task);
                match l.builder_session.clone().filter(|s| cx.alive(s)) {
                    Some(session) => fx.push(Effect::Prompt {
                        session,
                        text: prompt,
                        then: Prompted::Resume { lane: id.into() },
                    }),
                    None => self.restart_builder(cx, fx, id, RESUMED.into(), None),
                }
            }
            Stage::Idle => self.run_actions(
                cx,
                fx,
                id,
                vec![Action::Stage(Stage::Idle), Action::CommitWork],
            ),
            Stage::Checking => {
                let commit = l.machine.commit.clone().unwrap_or_default();
                self.run_actions(
                    cx,
                    fx,
                    id,
                    vec![Action::Stage(Stage::Checking), Action::RunCheck { commit }],
                );
            }
            // The old verifier session was not reopened
            // (`sessions_not_needed`): the verification starts over.
            Stage::WaitingVerifier | Stage::Verifying | Stage::SecondOpinion => {
                let st = if stage == Stage::SecondOpinion {
                    Stage::SecondOpinion
                } else {
                    Stage::WaitingVerifier
                };
                self.run_actions(cx, fx, id, vec![Action::Stage(st)]);
            }
            Stage::Merging => {
                let commit = l.machine.commit.clone().unwrap_or_default();
                self.run_actions(
                    cx,
                    fx,
                    id,
                    vec![Action::Stage(Stage::Merging), Action::Merge { commit }],
                );
            }
            // A pending approval does not survive a restart (it resolves
            // undelivered), so a pass that waited for one asks again.
            Stage::Pass if l.machine.require_merge_approval => {
                if let Some(commit) = l.machine.commit.clone() {
                    self.request_merge_approval(fx, id, &commit);
                }
            }
            _ => {}
        }
    }
}
