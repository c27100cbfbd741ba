//! The routes of the sessions and the approvals inbox (issue 11): where an
//! answer to an approval goes, and what the inbox's timers and rules
//! become.
//!
//! The inbox (`core::approvals`) decides nothing about other subsystems:
//! it says who owns an item (`approvals::owner`) and what an answer is
//! (`approvals::Settle`). [`settle`] hands the answer to that owner (the
//! session whose agent asked, the lane that waits to merge, the plugin's
//! task request) and closes the item with whether the owner could still
//! take it; the item's rows join the batch of the round in hand. A rule's
//! answer (an [`approvals::Effect::Settle`]) is settled only after what
//! made the request is handled, never from inside it.

use super::super::Daemon;
use crate::agents::{CommandError, Decision};
use crate::core::approvals::{self, Effect, Owner, Settle};
use crate::core::inbox::{Answerer, InboxError, Item, LaneMerge, PluginTask, Verdict};
use crate::core::sessions::{self, Effects};
use crate::errors::{Code, RpcError};
use crate::ledger::Op;
use std::time::Duration;

/// Applies what the inbox returned; rows of a rule's answer go into `fx`.
pub fn inbox(d: &mut Daemon, effects: Vec<Effect>, fx: &mut Effects) {
    for e in effects {
        match e {
            Effect::Expire { id, after_ms } => arm_expiry(d, id, after_ms),
            Effect::Settle(s) => {
                if let Err(e) = settle(d, &s, fx) {
                    crate::warn!(
                        "approval {}: {} could not answer it: {}",
                        s.id,
                        s.by.describe(),
                        e.message
                    );
                }
            }
        }
    }
}

fn arm_expiry(d: &mut Daemon, id: String, after_ms: i64) {
    d.reactor
        .schedule(Duration::from_millis(after_ms.max(0) as u64), move |d| {
            expire(d, &id)
        });
}

/// An item's deadline passed: its fallback answers.
fn expire(d: &mut Daemon, id: &str) {
    let Some(s) = approvals::expire(&d.core.approvals, id, crate::clock::now_ms()) else {
        return;
    };
    let id = id.to_string();
    answer(d, s, None, move |_d, r| {
        if let Err(e) = r {
            crate::warn!(
                "approval {id}: its fallback could not be applied: {}",
                e.message
            );
        }
    });
}

/// Delivers an answer to the item's owner and resolves the item; the
/// ledger rows go into `fx`. `s.withdraw` sends the owner a cancel but
/// records the request as undelivered.
pub fn settle(d: &mut Daemon, s: &Settle, fx: &mut Effects) -> Result<Item, RpcError> {
    let item = approvals::pending(&d.core.approvals, &s.id, None)?;
    let delivered = deliver(d, &item, s, fx)? && !s.withdraw;
    approvals::close(
        &mut d.core.approvals,
        &s.id,
        s.verdict,
        s.by.clone(),
        s.surface,
        delivered,
        s.reason.clone(),
        crate::clock::now_ms(),
        &mut fx.ops,
    )
    .ok_or_else(|| {
        RpcError::new(
            Code::NotPending,
            format!("approval {} is no longer pending", s.id),
        )
    })
}

/// Tells the owner of `item` the answer; Ok(false) when the owner can no
/// longer take it (the agent is gone, the request vanished, the plugin's
/// call no longer waits).
fn deliver(d: &mut Daemon, item: &Item, s: &Settle, fx: &mut Effects) -> Result<bool, RpcError> {
    match approvals::owner(item) {
        Owner::PluginRequest { id } => {
            Ok(crate::plugins::tasks::on_answer(d, id, s.verdict, &s.by))
        }
        Owner::Lane { lane, commit } => Ok(crate::lanes::controller::on_merge_answer(
            d, lane, commit, s.verdict,
        )),
        Owner::Session { session, key } => {
            let decision = match s.verdict {
                Verdict::Allow => Decision::Allow,
                Verdict::Deny => Decision::Deny {
                    message: s.reason.clone(),
                },
                Verdict::Cancel => Decision::Cancel,
            };
            match d.core.sessions.answer(session, &item.id, key, decision) {
                Ok(Some(step)) => {
                    fx.changed = true;
                    sessions::handle_step(d, session, step, fx);
                    Ok(true)
                }
                Ok(None) => Ok(false),
                Err(CommandError::NoMatchingOption) => Err(RpcError::new(
                    Code::Unavailable,
                    format!(
                        "the agent offered no option to {} approval {}",
                        s.verdict.wire_name(),
                        item.id
                    ),
                )),
                Err(_) => Ok(false),
            }
        }
    }
}

/// `approvals.answer` and every other answer from outside the inbox
/// (`expect_digest`: the action the caller saw): the commit of the
/// answer's records comes before `then`, which gets the resolved item for
/// its surface to show.
pub fn answer(
    d: &mut Daemon,
    s: Settle,
    expect_digest: Option<&str>,
    then: impl FnOnce(&mut Daemon, Result<Item, RpcError>) + 'static,
) {
    if let Err(e) = approvals::pending(&d.core.approvals, &s.id, expect_digest) {
        return then(d, Err(e));
    }
    let mut fx = Effects::default();
    match settle(d, &s, &mut fx) {
        Ok(item) => {
            let stream = item.subject.session().unwrap_or_default().to_string();
            sessions::finish(
                d,
                &stream,
                fx,
                false,
                Some(Box::new(
                    move |d: &mut Daemon, r: Result<(), crate::ledger::WriteError>| {
                        then(d, r.map(|()| item).map_err(RpcError::from))
                    },
                )),
            );
        }
        Err(e) => then(d, Err(e)),
    }
}

/// Resolves a pending item whose owner knows already or is gone (a
/// plugin's request withdrawn, a session's request closed), its rows into
/// `ops`.
#[allow(clippy::too_many_arguments)]
pub fn close(
    d: &mut Daemon,
    id: &str,
    verdict: Verdict,
    by: Answerer,
    surface: &'static str,
    delivered: bool,
    reason: Option<String>,
    ops: &mut Vec<Op>,
) -> Option<Item> {
    approvals::close(
        &mut d.core.approvals,
        id,
        verdict,
        by,
        surface,
        delivered,
        reason,
        crate::clock::now_ms(),
        ops,
    )
}

/// A plugin's task request is stored: into the inbox, recorded, expiring.
pub fn add_plugin_task(
    d: &mut Daemon,
    id: &str,
    task: PluginTask,
    created_ms: i64,
) -> Result<(), InboxError> {
    let now = crate::clock::now_ms();
    let (op, expire) =
        approvals::add_plugin_task(&mut d.core.approvals, &d.cfg, id, task, created_ms, now)?;
    record(d, id, op);
    inbox(d, vec![expire], &mut Effects::default());
    Ok(())
}

/// A lane waits for the operator to allow its merge.
pub fn add_lane_merge(d: &mut Daemon, id: &str, merge: LaneMerge) -> Result<(), InboxError> {
    let now = crate::clock::now_ms();
    let (op, expire) = approvals::add_lane_merge(&mut d.core.approvals, &d.cfg, id, merge, now)?;
    record(d, id, op);
    inbox(d, expire.into_iter().collect(), &mut Effects::default());
    Ok(())
}

/// Writes an item's row that belongs to no session's round.
fn record(d: &mut Daemon, id: &str, op: Op) {
    let id = id.to_string();
    d.write(vec![op], move |_d, r| {
        if let Err(e) = r {
            crate::error!("approval {id}: the ledger refused its record: {e:?}");
        }
    });
}
