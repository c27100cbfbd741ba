//! What the plugin host reads of the rest of the daemon to answer
//! sessions.list, sessions.get, seats.list and lanes.list (seed 000; issue 4,
//! "Sessions data").
//!
//! Sessions and seats are the core's (`core::sessions`, `core::seats`), read
//! at the moment of the answer on the reactor thread. Their plugin wire
//! items are built once, here from a session's typed `Summary` and by
//! `Seat::plugin_item`, as JSON values: the host pages them as they are and
//! converts nothing again. Lanes are the lane controller's, as verify.list
//! lists them.
//!
//! sessions.get (API 1.1) is the busy query: a session with queued input or
//! an agent stop in progress is `running` (seed 001: "including
//! interruption cleanup"). It is a snapshot: a session can be admitted,
//! start a turn or end right after the answer, so a plugin must treat
//! `state` and `turnActive` as advice, never as a guarantee (seed 001).

use serde_json::{Value, json};

use super::calls::{LaneBuilder, LaneItem, LaneSeat, LaneVerdict};
use super::effects::Views;
use crate::agents::EndReason;
use crate::core::Core;
use crate::core::sessions::{State, Summary};
use crate::lanes::controller::{Lane, Lanes, SeatRef, head_and_stale};
use crate::lanes::machine::Stage;

/// The host's view of the daemon's sessions, seats and lanes, read at the
/// moment of the answer.
pub struct Of<'a> {
    pub core: &'a Core,
    pub lanes: &'a Lanes,
    pub node: &'a str,
}

impl Views for Of<'_> {
    /// The daemon's sessions in creation order: this machine's first, then
    /// the sessions it follows on other nodes (this daemon follows none).
    fn session_items(&self) -> Vec<Value> {
        self.core
            .sessions
            .iter()
            .map(|s| {
                let s = s.summary();
                session_item_of(&s, s.state, self.node)
            })
            .collect()
    }

    /// One session's item, read now, for the busy query (sessions.get, API
    /// 1.1): as sessions.list gives it, except that a session the daemon
    /// counts as busy although no turn runs is `running`: input is queued
    /// for it (the next turn is about to start), or its agent is being
    /// stopped (seed 001: "including interruption cleanup"). `turnActive`
    /// stays what it is.
    fn session_item(&self, session: &str) -> Option<Value> {
        let s = self.core.sessions.summary(session)?;
        let state = match s.state {
            State::Idle if s.busy => State::Running,
            st => st,
        };
        Some(session_item_of(&s, state, self.node))
    }

    /// The seats of the registry, in registry order.
    fn seat_items(&self) -> Vec<Value> {
        self.core
            .seats
            .list
            .iter()
            .map(|s| s.plugin_item())
            .collect()
    }

    /// The lanes verify.list gives, newest first, archived lanes left out.
    /// The host keeps a copy of this for 5 seconds.
    fn lane_items(&self) -> Vec<LaneItem> {
        self.lanes.listed().into_iter().map(lane_item).collect()
    }

    /// A lane neither merged nor closed (seed 000, plugin.get lanes).
    fn lane_at_work(&self, lane: &str) -> Option<i64> {
        self.lanes
            .map
            .get(lane)
            .filter(|l| !l.archived && !matches!(l.machine.stage, Stage::Merged | Stage::Closed))
            .map(|l| l.created_ms)
    }
}

/// The plugin wire's sessions.list item (seed 000, exactly), in `state`.
fn session_item_of(s: &Summary, state: State, node: &str) -> Value {
    json!({
        "session": s.id,
        "harness": s.harness,
        "provider": s.provider,
        "transport": s.transport.wire_name(),
        "state": state.wire_name(),
        "turn": s.turn,
        "turnActive": s.turn_active,
        "endReason": s.end_reason.map(EndReason::wire_name),
        "pendingApprovals": s.pending_approvals,
        "parent": s.parent,
        "node": node,
        "worktree": s.cwd.display().to_string(),
        "createdAt": s.created_at,
    })
}

/// The lane as lanes.list gives it to plugins (seed 000).
fn lane_item(l: &Lane) -> LaneItem {
    let seat = |s: &SeatRef| LaneSeat {
        harness: s.harness.clone(),
        provider: s.provider.clone(),
        family: s.family,
        model: s
            .model
            .clone()
            .filter(|m| crate::config::valid_model_name(m)),
    };
    let (head, stale) = head_and_stale(l);
    LaneItem {
        lane: l.id.clone(),
        repo: l.repo.display().to_string(),
        base: l.base.clone(),
        branch: l.branch.clone(),
        worktree: l.worktree.display().to_string(),
        state: l.machine.stage.state(),
        stage: l.machine.stage,
        builder: LaneBuilder {
            session: l.builder_session.clone(),
            seat: seat(&l.builder),
        },
        verifier: seat(&l.verifier),
        verdict: l
            .machine
            .last_verdict
            .as_ref()
            .map(|(verdict, commit)| LaneVerdict {
                verdict: *verdict,
                commit: commit.clone(),
            }),
        head,
        stale,
        created_at: crate::clock::format_ts(l.created_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::Transport;

    #[test]
    fn a_session_item_names_the_state_as_seed_000_does() {
        let s = Summary {
            id: "s-1",
            harness: "claude",
            provider: "anthropic",
            transport: Transport::StreamJson,
            cwd: std::path::Path::new("/w"),
            parent: None,
            created_at: "2026-01-01T00:00:00.000Z",
            agent_session_id: None,
            state: State::AwaitingApproval,
            ready: true,
            turn: 2,
            turn_active: true,
            end_reason: None,
            pending_approvals: 1,
            busy: false,
        };
        let item = session_item_of(&s, s.state, "n");
        assert_eq!(item["state"], "awaiting-approval");
        assert_eq!(item["transport"], "stream-json");
        assert_eq!(item["worktree"], "/w");
        assert_eq!(item["pendingApprovals"], 1);
        for (st, name) in [
            (State::Starting, "starting"),
            (State::Idle, "idle"),
            (State::Running, "running"),
            (State::Ended, "ended"),
        ] {
            assert_eq!(session_item_of(&s, st, "n")["state"], name);
        }
    }
}
