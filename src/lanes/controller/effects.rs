//! What the lane controller asks of the rest of the daemon and what it
//! hears back, typed (issue 11; DESIGN.md, "How subsystems talk"): its
//! effects with their typed keys, and the turn and session ends it
//! follows. The router (daemon/router/lanes.rs) applies these; nothing
//! here knows who does.

use super::*;

/// Whoever waits for an answer of the lanes (a socket request, a plugin's
/// task request): the domain's one opaque key, which the router hands in
/// and maps back.
pub use crate::core::ReplyKey;

/// What a change of the lanes asks of the rest of the daemon, applied by
/// the router in the order given.
#[derive(Debug, PartialEq)]
pub enum Effect {
    /// Commit `ops` as one batch; the outcome goes to [`Lanes::written`].
    Write { ops: Vec<Op>, ack: Ack },
    /// Run a job on a lane worker; its report goes to [`Lanes::on_report`],
    /// a refusal (queue full, workers not running) to
    /// [`Lanes::job_refused`].
    Job(Job),
    /// Read branch heads on the heads thread; the report goes to
    /// [`Lanes::on_report`], a refusal to [`Lanes::heads_refused`].
    ReadHeads(HeadsJob),
    /// Read the verifier's last turn from the ledger; the text comes back
    /// as `Report::Answer`, a busy reader to [`Lanes::answer_unread`].
    ReadAnswer { lane: String, session: String },
    /// Call [`Lanes::timer`] with `timer` after `after`.
    Timer { after: Duration, timer: Timer },
    /// Start a session; the outcome goes to [`Lanes::spawned`] with `then`.
    Spawn { start: SessionStart, then: Spawn },
    /// Send a prompt to a session; whether it took it goes to
    /// [`Lanes::prompted`] with `then`.
    Prompt {
        session: String,
        text: String,
        then: Prompted,
    },
    /// Stop a session.
    Kill { session: String },
    /// Put a lane's merge in the approvals inbox; the answer comes back
    /// through [`Lanes::merge_answered`].
    AskMerge(MergeAsk),
    /// Hand `answer` to whoever waits under `to`.
    Answer { to: ReplyKey, answer: Answer },
}

/// What waits for a lane write to commit.
#[derive(Debug, Clone, PartialEq)]
pub enum Ack {
    /// A lane's row (and its events).
    Record { lane: String },
    /// A `check.rework` record.
    Rework,
    /// repos.add's row: the repository is known once committed.
    RepoAdded { repo: PathBuf, to: ReplyKey },
    /// A new lane's first record (its row, lane.start and lane.stage): the
    /// dispatch is answered once it is committed, so that a lane named in
    /// an answer survives a crash and its lane.start reaches subscribers
    /// before the answer does.
    Dispatched {
        to: ReplyKey,
        dispatched: Dispatched,
    },
}

/// A lane's timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Timer {
    /// Look again whether the lane's verifier seat can take it.
    TryVerifier { lane: String },
}

/// A session the lanes ask for: a builder or a verifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionStart {
    pub harness: String,
    pub cwd: PathBuf,
    pub prompt: String,
    pub name: String,
}

/// Why a session was asked for, and what to do with it.
#[derive(Debug, Clone, PartialEq)]
pub enum Spawn {
    /// The builder of a lane being dispatched: the lane exists once it
    /// runs.
    FirstBuilder(Box<Made>),
    /// A builder taking over a lane (restart, failover), on `seat`,
    /// recording `rework` on its stream once it exists.
    Builder {
        lane: String,
        seat: SeatRef,
        rework: Option<Rework>,
    },
    /// The lane's verifier, reading `checkout` until its session ends.
    Verifier { lane: String, checkout: PathBuf },
}

/// Why a prompt was sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompted {
    /// A builder reopened after a restart is told to go on.
    Resume { lane: String },
    /// Rework for the builder: `rework` is recorded once it is taken,
    /// `original` goes to a new builder otherwise.
    Rework {
        lane: String,
        session: String,
        rework: Rework,
        original: String,
    },
}

/// A `check.rework` record: what a lane sent its builder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rework {
    pub id: String,
    pub lane: String,
    pub text: String,
}

/// A lane's pass waiting for the operator in the approvals inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeAsk {
    /// The approval's id: `<lane>-merge-<verdicts>`.
    pub approval: String,
    pub lane: String,
    /// The lane, its task's name, its branch and base.
    pub summary: String,
    pub commit: String,
}

/// The operator's answer to a merge approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeAnswer {
    Allow,
    /// Denied, or withdrawn without a yes.
    Refuse,
}

/// What the lanes answer whoever waits under a [`ReplyKey`].
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A dispatch's lane, or its refusal.
    Dispatched(Result<Dispatched, RpcError>),
    /// The branch heads asked for are read (or could not be now).
    HeadsFresh,
    /// repos.list's repositories.
    Repos(Result<Vec<RepoListing>, RpcError>),
    /// repos.add's repository, once the ledger has it.
    RepoAdded(Result<PathBuf, RpcError>),
}

/// How a turn ended, as the lanes tell turns apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    Completed,
    Failed,
    UsageLimited,
    /// Any other reason (cancelled, say).
    Other,
}

/// A committed turn or session end the lanes hear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    TurnEnded { session: String, reason: TurnEnd },
    SessionEnded { session: String },
}

impl Heard {
    pub(super) fn session(&self) -> &str {
        match self {
            Heard::TurnEnded { session, .. } | Heard::SessionEnded { session } => session,
        }
    }
}
