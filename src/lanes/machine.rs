//! The lane loop as a pure state machine (issue 5, "The loop, stage by
//! stage"; seed 000, lane.stage and lanes.list). It takes what happened (a
//! builder's turn ended, a check finished, a verifier answered, a merge
//! finished, the operator asked for something) and returns what to do next
//! as [`Action`]s, which the lane controller carries out with git, agent
//! sessions and the ledger. No I/O here, so every path of the loop is tested
//! in memory.
//!
//! The stage order (the spec's list is the contract):
//!
//! ```text
//! building -> idle -> checking -> waiting-verifier -> verifying -> pass -> merging -> merged
//!                        |                               |           \-> merge-failed
//!                        +-- failed check -> rework      +-- rework -> building
//!                                                        +-- no verdict -> verify-failed
//!                                                              -> second-opinion -> verifying
//!                                                              -> sent-back
//! rework beyond the configured rounds -> cap -> (operator) ; operator close -> closed
//! ```
//!
//! Rounds: every commit the loop judges (a failed check or a verdict) uses
//! one round; a rework that would start a round beyond `max_rounds` stops at
//! `cap` instead, for the operator. lane.verdict's `round` counts verdicts.

use serde::{Deserialize, Serialize};

use crate::lanes::check::Outcome;
use crate::lanes::verdict::{self, Defect, Verdict};
use crate::limits;

/// A lane's state as verify.list gives it (seed 000, lanes[].state): its
/// stage, coarser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LaneState {
    Building,
    UnderTest,
    SentBack,
    Verified,
    Merged,
}

impl LaneState {
    pub fn name(self) -> &'static str {
        match self {
            LaneState::Building => "building",
            LaneState::UnderTest => "under-test",
            LaneState::SentBack => "sent-back",
            LaneState::Verified => "verified",
            LaneState::Merged => "merged",
        }
    }
}

/// What a verifier's verdict was (seed 000, lane.verdict's and
/// lanes[].verdict's `verdict`), without its defects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerdictKind {
    Pass,
    Rework,
}

/// Where a lane is (seed 000, lanes[].stage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    Building,
    Idle,
    Checking,
    WaitingVerifier,
    Verifying,
    VerifyFailed,
    SecondOpinion,
    Pass,
    Rework,
    SentBack,
    Cap,
    Merging,
    MergeFailed,
    Merged,
    Closed,
}

impl Stage {
    pub const ALL: [Stage; 15] = [
        Stage::Building,
        Stage::Idle,
        Stage::Checking,
        Stage::WaitingVerifier,
        Stage::Verifying,
        Stage::VerifyFailed,
        Stage::SecondOpinion,
        Stage::Pass,
        Stage::Rework,
        Stage::SentBack,
        Stage::Cap,
        Stage::Merging,
        Stage::MergeFailed,
        Stage::Merged,
        Stage::Closed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Building => "building",
            Stage::Idle => "idle",
            Stage::Checking => "checking",
            Stage::WaitingVerifier => "waiting-verifier",
            Stage::Verifying => "verifying",
            Stage::VerifyFailed => "verify-failed",
            Stage::SecondOpinion => "second-opinion",
            Stage::Pass => "pass",
            Stage::Rework => "rework",
            Stage::SentBack => "sent-back",
            Stage::Cap => "cap",
            Stage::Merging => "merging",
            Stage::MergeFailed => "merge-failed",
            Stage::Merged => "merged",
            Stage::Closed => "closed",
        }
    }

    pub fn from_name(s: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|st| st.name() == s)
    }

    /// The lane's state as verify.list gives it (seed 000, lanes[].state).
    pub fn state(self) -> LaneState {
        match self {
            Stage::Building | Stage::Rework => LaneState::Building,
            Stage::Idle
            | Stage::Checking
            | Stage::WaitingVerifier
            | Stage::Verifying
            | Stage::VerifyFailed
            | Stage::SecondOpinion => LaneState::UnderTest,
            Stage::SentBack | Stage::Cap | Stage::MergeFailed => LaneState::SentBack,
            Stage::Pass | Stage::Merging => LaneState::Verified,
            Stage::Merged | Stage::Closed => LaneState::Merged,
        }
    }

    /// Stages where the operator decides what happens next.
    pub fn waits_for_operator(self) -> bool {
        matches!(
            self,
            Stage::SentBack | Stage::Cap | Stage::MergeFailed | Stage::Pass
        )
    }
}

/// What happened to the lane.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The builder's turn ended normally.
    BuilderIdle,
    /// The lane's work is the commit `head` (made by the daemon if the
    /// builder left changes uncommitted).
    Committed {
        head: String,
    },
    /// The acceptance command finished on the commit under test.
    Checked(Outcome),
    /// The verifier seat can take the lane now.
    VerifierReady,
    /// The verifier's whole answer.
    VerifierAnswered(String),
    /// The verifier's session failed before it answered.
    VerifierFailed,
    /// The merge into base finished.
    Merged {
        base_head: String,
    },
    MergeFailed(String),
    /// The operator approved the merge, or asked for it (`lanes.merge`).
    OperatorMerge,
    /// The operator sends the lane back to its builder (`lanes.rework`).
    OperatorRework {
        notes: String,
    },
    /// The operator closes the lane (`lanes.close`).
    OperatorClose,
    /// The operator denied the merge approval in the inbox (or it timed out
    /// to deny): the pass goes back to the operator's hands.
    MergeDenied,
    /// A step the daemon itself must do failed (git refused, no seat can
    /// build): the lane goes to the operator with the reason in its record.
    Broken,
}

/// What the controller must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Record a lane.stage event and set the lane's stage.
    Stage(Stage),
    /// Make the lane's work a commit (git add, commit what is left).
    CommitWork,
    /// Run the acceptance command on `commit` in a daemon-owned checkout.
    RunCheck { commit: String },
    /// Ask the verifier seat (when it is ready) to judge `commit`.
    Verify {
        commit: String,
        second_opinion: bool,
    },
    /// Record a lane.verdict.
    RecordVerdict {
        commit: String,
        verdict: &'static str,
        round: u32,
        defects: usize,
    },
    /// Send the builder its next turn.
    PromptBuilder { text: String },
    /// Ask the operator to approve the merge in the inbox.
    RequestMergeApproval { commit: String },
    /// Merge `commit` into base.
    Merge { commit: String },
    /// Stop the lane's sessions and archive it.
    Archive,
}

/// Why an input does not apply to the lane now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotNow {
    pub stage: Stage,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub stage: Stage,
    /// Commits judged so far (failed checks and verdicts).
    pub rounds_used: u32,
    /// Verdicts recorded so far: lane.verdict's `round`.
    pub verdicts: u32,
    pub max_rounds: u32,
    /// The commit under test or judged last.
    pub commit: Option<String>,
    /// Answers that were not a verdict for the current commit.
    pub failed_opinions: u32,
    pub require_merge_approval: bool,
    /// The latest verdict and the commit it judged.
    pub last_verdict: Option<(VerdictKind, String)>,
}

impl Machine {
    pub fn new(max_rounds: u32, require_merge_approval: bool) -> Machine {
        Machine {
            stage: Stage::Building,
            rounds_used: 0,
            verdicts: 0,
            max_rounds: max_rounds.max(1),
            commit: None,
            failed_opinions: 0,
            require_merge_approval,
            last_verdict: None,
        }
    }

    /// Applies one input. An input that does not fit the stage changes
    /// nothing and says so (a late answer from a session the operator
    /// already replaced, say).
    pub fn step(&mut self, input: Input) -> Result<Vec<Action>, NotNow> {
        let not_now = NotNow { stage: self.stage };
        let mut out = Vec::new();
        match (self.stage, input) {
            (Stage::Closed | Stage::Merged, _) => return Err(not_now),
            (_, Input::OperatorClose) => {
                self.go(Stage::Closed, &mut out);
                out.push(Action::Archive);
            }
            (Stage::Building, Input::BuilderIdle) => {
                self.go(Stage::Idle, &mut out);
                out.push(Action::CommitWork);
            }
            (Stage::Idle, Input::Committed { head }) => {
                self.commit = Some(head.clone());
                self.failed_opinions = 0;
                self.go(Stage::Checking, &mut out);
                out.push(Action::RunCheck { commit: head });
            }
            (Stage::Checking, Input::Checked(outcome)) => {
                self.rounds_used += 1;
                if outcome.passed() {
                    self.go(Stage::WaitingVerifier, &mut out);
                } else {
                    let text = format!(
                        "The acceptance check failed: {}. Fix the work so that it passes.\n\nThe end of its output:\n```\n{}\n```",
                        outcome.summary(),
                        outcome.tail.trim_end()
                    );
                    self.rework(text, &mut out);
                }
            }
            (Stage::WaitingVerifier, Input::VerifierReady)
            | (Stage::SecondOpinion, Input::VerifierReady) => {
                let second = self.stage == Stage::SecondOpinion;
                let commit = self.commit.clone().ok_or(not_now)?;
                self.go(Stage::Verifying, &mut out);
                out.push(Action::Verify {
                    commit,
                    second_opinion: second,
                });
            }
            (Stage::Verifying, Input::VerifierAnswered(text)) => match verdict::parse(&text) {
                Ok(v) => self.verdict(v, &mut out),
                Err(_) => self.no_verdict(&mut out),
            },
            (Stage::Verifying, Input::VerifierFailed) => self.no_verdict(&mut out),
            (stage, Input::Broken) if !stage.waits_for_operator() => {
                self.go(Stage::SentBack, &mut out)
            }
            (Stage::Pass, Input::MergeDenied) => self.go(Stage::SentBack, &mut out),
            (Stage::Pass | Stage::MergeFailed | Stage::SentBack, Input::OperatorMerge)
                if self
                    .last_verdict
                    .as_ref()
                    .is_some_and(|v| v.0 == VerdictKind::Pass) =>
            {
                let commit = self.commit.clone().ok_or(not_now)?;
                self.go(Stage::Merging, &mut out);
                out.push(Action::Merge { commit });
            }
            (Stage::Merging, Input::Merged { .. }) => {
                self.go(Stage::Merged, &mut out);
                out.push(Action::Archive);
            }
            (Stage::Merging, Input::MergeFailed(_)) => self.go(Stage::MergeFailed, &mut out),
            (
                Stage::SentBack | Stage::Cap | Stage::MergeFailed | Stage::Pass,
                Input::OperatorRework { notes },
            ) => {
                // The operator's rework grants the round it needs.
                self.max_rounds = self.max_rounds.max(self.rounds_used + 1);
                self.rework(
                    format!("The operator sends the work back:\n{notes}"),
                    &mut out,
                );
            }
            _ => return Err(not_now),
        }
        Ok(out)
    }

    fn go(&mut self, stage: Stage, out: &mut Vec<Action>) {
        self.stage = stage;
        out.push(Action::Stage(stage));
    }

    fn rework(&mut self, text: String, out: &mut Vec<Action>) {
        if self.rounds_used >= self.max_rounds {
            self.go(Stage::Cap, out);
            return;
        }
        self.go(Stage::Rework, out);
        out.push(Action::PromptBuilder { text });
        self.go(Stage::Building, out);
    }

    fn verdict(&mut self, v: Verdict, out: &mut Vec<Action>) {
        let commit = self.commit.clone().unwrap_or_default();
        self.verdicts += 1;
        self.failed_opinions = 0;
        let kind = match v {
            Verdict::Pass => VerdictKind::Pass,
            Verdict::Rework(_) => VerdictKind::Rework,
        };
        self.last_verdict = Some((kind, commit.clone()));
        out.push(Action::RecordVerdict {
            commit: commit.clone(),
            verdict: v.name(),
            round: self.verdicts,
            defects: v.defects().len(),
        });
        match v {
            Verdict::Pass => {
                self.go(Stage::Pass, out);
                if self.require_merge_approval {
                    out.push(Action::RequestMergeApproval { commit });
                } else {
                    self.go(Stage::Merging, out);
                    out.push(Action::Merge { commit });
                }
            }
            Verdict::Rework(defects) => self.rework(rework_text(&defects), out),
        }
    }

    fn no_verdict(&mut self, out: &mut Vec<Action>) {
        self.failed_opinions += 1;
        self.go(Stage::VerifyFailed, out);
        if self.failed_opinions < limits::LANE_VERIFY_ATTEMPTS {
            self.go(Stage::SecondOpinion, out);
        } else {
            self.go(Stage::SentBack, out);
        }
    }
}

/// The builder's rework turn: the defects the verifier cited.
pub fn rework_text(defects: &[Defect]) -> String {
    let mut t = String::from("The verifier sends the work back. Fix each defect it cites:\n");
    for (i, d) in defects.iter().enumerate() {
        match d.line {
            Some(l) => t.push_str(&format!("{}. {}:{}: {}\n", i + 1, d.file, l, d.issue)),
            None => t.push_str(&format!("{}. {}: {}\n", i + 1, d.file, d.issue)),
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    const C1: &str = "1111111111111111111111111111111111111111";
    const C2: &str = "2222222222222222222222222222222222222222";

    fn pass_text() -> String {
        format!(
            "ok\n```{}\n{{\"verdict\":\"pass\"}}\n```\n",
            verdict::FENCE_TAG
        )
    }

    fn rework_answer() -> String {
        format!(
            "```{}\n{{\"verdict\":\"rework\",\"defects\":[{{\"file\":\"a.rs\",\"line\":1,\"issue\":\"bad\"}}]}}\n```",
            verdict::FENCE_TAG
        )
    }

    fn ok() -> Outcome {
        Outcome {
            code: Some(0),
            signal: None,
            timed_out: false,
            tail: String::new(),
        }
    }

    fn stages(actions: &[Action]) -> Vec<&'static str> {
        actions
            .iter()
            .filter_map(|a| {
                if let Action::Stage(s) = a {
                    Some(s.name())
                } else {
                    None
                }
            })
            .collect()
    }

    fn to_verifying(m: &mut Machine, commit: &str) -> Vec<&'static str> {
        let mut seen = stages(&m.step(Input::BuilderIdle).unwrap());
        seen.extend(stages(
            &m.step(Input::Committed {
                head: commit.into(),
            })
            .unwrap(),
        ));
        seen.extend(stages(&m.step(Input::Checked(ok())).unwrap()));
        seen.extend(stages(&m.step(Input::VerifierReady).unwrap()));
        seen
    }

    #[test]
    fn pass_in_round_one_merges() {
        let mut m = Machine::new(3, false);
        assert_eq!(
            to_verifying(&mut m, C1),
            ["idle", "checking", "waiting-verifier", "verifying"]
        );
        let a = m.step(Input::VerifierAnswered(pass_text())).unwrap();
        assert_eq!(
            a[0],
            Action::RecordVerdict {
                commit: C1.into(),
                verdict: "pass",
                round: 1,
                defects: 0
            }
        );
        assert_eq!(stages(&a), ["pass", "merging"]);
        assert_eq!(a.last(), Some(&Action::Merge { commit: C1.into() }));
        let a = m
            .step(Input::Merged {
                base_head: C1.into(),
            })
            .unwrap();
        assert_eq!(a, vec![Action::Stage(Stage::Merged), Action::Archive]);
        assert_eq!(m.stage.state(), LaneState::Merged);
        assert!(m.step(Input::BuilderIdle).is_err());
    }

    #[test]
    fn rework_then_pass() {
        let mut m = Machine::new(3, false);
        to_verifying(&mut m, C1);
        let a = m.step(Input::VerifierAnswered(rework_answer())).unwrap();
        assert_eq!(stages(&a), ["rework", "building"]);
        assert!(matches!(&a[2], Action::PromptBuilder { text } if text.contains("a.rs:1: bad")));
        to_verifying(&mut m, C2);
        let a = m.step(Input::VerifierAnswered(pass_text())).unwrap();
        assert_eq!(
            a[0],
            Action::RecordVerdict {
                commit: C2.into(),
                verdict: "pass",
                round: 2,
                defects: 0
            }
        );
    }

    #[test]
    fn failed_checks_use_rounds_until_the_cap() {
        let mut m = Machine::new(2, false);
        for (i, c) in [C1, C2].iter().enumerate() {
            m.step(Input::BuilderIdle).unwrap();
            m.step(Input::Committed { head: (*c).into() }).unwrap();
            let fail = Outcome {
                code: Some(1),
                signal: None,
                timed_out: false,
                tail: "assertion failed".into(),
            };
            let a = m.step(Input::Checked(fail)).unwrap();
            if i == 0 {
                assert_eq!(stages(&a), ["rework", "building"]);
                assert!(
                    matches!(&a[1], Action::PromptBuilder { text } if text.contains("assertion failed"))
                );
            } else {
                assert_eq!(stages(&a), ["cap"]);
                assert_eq!(m.stage.state(), LaneState::SentBack);
            }
        }
        // The operator grants another round.
        let a = m
            .step(Input::OperatorRework {
                notes: "try the other approach".into(),
            })
            .unwrap();
        assert_eq!(stages(&a), ["rework", "building"]);
    }

    #[test]
    fn no_verdict_twice_is_sent_back() {
        let mut m = Machine::new(3, false);
        to_verifying(&mut m, C1);
        let a = m
            .step(Input::VerifierAnswered("I think it is fine".into()))
            .unwrap();
        assert_eq!(stages(&a), ["verify-failed", "second-opinion"]);
        let a = m.step(Input::VerifierReady).unwrap();
        assert_eq!(
            a.last(),
            Some(&Action::Verify {
                commit: C1.into(),
                second_opinion: true
            })
        );
        let a = m.step(Input::VerifierFailed).unwrap();
        assert_eq!(stages(&a), ["verify-failed", "sent-back"]);
    }

    #[test]
    fn merge_approval_and_merge_failure_wait_for_the_operator() {
        let mut m = Machine::new(3, true);
        to_verifying(&mut m, C1);
        let a = m.step(Input::VerifierAnswered(pass_text())).unwrap();
        assert_eq!(
            a.last(),
            Some(&Action::RequestMergeApproval { commit: C1.into() })
        );
        assert!(m.stage.waits_for_operator());
        m.step(Input::OperatorMerge).unwrap();
        let a = m.step(Input::MergeFailed("conflict".into())).unwrap();
        assert_eq!(stages(&a), ["merge-failed"]);
        let a = m.step(Input::OperatorMerge).unwrap();
        assert_eq!(stages(&a), ["merging"]);
        let a = m.step(Input::OperatorClose).unwrap();
        assert_eq!(a, vec![Action::Stage(Stage::Closed), Action::Archive]);
    }

    #[test]
    fn every_stage_has_its_spec_name_and_state() {
        for s in Stage::ALL {
            assert_eq!(Stage::from_name(s.name()), Some(s));
            let st = s.state();
            assert!(
                ["building", "under-test", "sent-back", "verified", "merged"].contains(&st.name())
            );
            // The socket's name and the plugin wire's (serde) are one.
            assert_eq!(serde_json::to_value(st).unwrap(), st.name());
        }
    }
}
