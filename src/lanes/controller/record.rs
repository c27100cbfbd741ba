//! What a lane is and how it is stored (issue 5; seed 000, lanes[],
//! lane.start): its record, the seats it names, the rows read at start,
//! and the head a reader sees.

use super::*;

/// The stream every lane event goes to (DESIGN.md: "one for all lanes").
pub const STREAM: &str = "lanes";

/// A seat as a lane records it (seed 000, lanes[].builder / verifier).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeatRef {
    pub harness: String,
    pub provider: String,
    pub family: Family,
    pub model: Option<String>,
}

impl SeatRef {
    /// As lane.start and lane events carry it: a model that is not a plain
    /// model name (seed 000) is null, as the page says.
    pub fn to_json(&self) -> Value {
        let model = self
            .model
            .as_deref()
            .filter(|m| crate::config::valid_model_name(m));
        json!({"harness": self.harness, "provider": self.provider, "family": self.family, "model": model})
    }
}

/// What the lane was asked to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub task: String,
    pub acceptance_name: String,
    pub acceptance_command: String,
    pub name: String,
}

/// One lane, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Lane {
    pub id: String,
    pub repo: PathBuf,
    pub base: String,
    /// base's commit when the lane was dispatched: the diff's start.
    pub base_commit: String,
    pub branch: String,
    pub worktree: PathBuf,
    pub task: Task,
    pub builder: SeatRef,
    pub builder_session: Option<String>,
    pub verifier: SeatRef,
    pub verifier_session: Option<String>,
    pub machine: Machine,
    pub created_ms: i64,
    pub stage_since_ms: i64,
    pub last_check: Option<Outcome>,
    /// Why the lane waits for the operator, for lanes.get and the log.
    pub reason: Option<String>,
    /// Rework records sent to the builder: the N of `check-N`.
    pub checks: u32,
    pub archived: bool,
    /// lanes.close asked to remove the worktree.
    pub remove_worktree: bool,
    /// The daemon-owned checkout the lane holds from its check to its
    /// verdict (`lanes::pool`), under state/lanes/; None while it holds
    /// none. Kept in the record so that a restart knows which checkouts
    /// are a live lane's.
    #[serde(default)]
    pub checkout: Option<PathBuf>,
    /// The agent session id the builder's session was reopened with at
    /// this start. The next prompt to that session carries the task again
    /// unless its agent came back in that very session, with its history
    /// (an agent without session/load gets a brand-new one). None once the
    /// session has been told the task in this run.
    #[serde(skip)]
    pub builder_reopened: Option<String>,
    /// The commit the lane's branch points at, as last read (`Some(None)`:
    /// the branch or the repository is gone); None until first read.
    #[serde(skip)]
    pub head: Option<Option<String>>,
}

pub fn seat_ref(cfg: &crate::config::SeatConfig) -> SeatRef {
    SeatRef {
        harness: cfg.harness.clone(),
        provider: cfg.provider.clone(),
        family: cfg.family(),
        model: cfg.model.clone(),
    }
}

/// Reads the lanes not archived and the added repositories; called once at
/// start, on the reader thread. Their rows are handed to [`Lanes::loaded`].
pub fn read_at_start(conn: &rusqlite::Connection) -> rusqlite::Result<(Vec<String>, Vec<String>)> {
    let mut stmt = conn.prepare("SELECT record FROM lanes WHERE archived = 0")?;
    let lanes = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut stmt = conn.prepare("SELECT path FROM repos ORDER BY added_at")?;
    let repos = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok((lanes, repos))
}

/// The commit the lane's branch points at (seed 000, lanes[].head), as
/// last read or moved by the daemon, null when the branch or the
/// repository is gone; and whether the latest verdict is on another
/// commit than that (`stale`; a verdict with the branch gone is stale).
/// Before the first read (just after a start) the commit the lane works on
/// stands in.
pub fn head_and_stale(l: &Lane) -> (Option<String>, bool) {
    let head = match &l.head {
        Some(h) => h.clone(),
        None => l.machine.commit.clone(),
    };
    let stale = match &l.machine.last_verdict {
        Some((_, c)) => head.as_deref() != Some(c.as_str()),
        None => false,
    };
    (head, stale)
}
