//! Lanes: the daemon's unit of verified work (issue 5; seed 000, lanes.list,
//! lane.start, lane.stage, lane.verdict, tasks.create). A builder seat works
//! on a task in a new worktree, the daemon runs the acceptance command in
//! its own checkout, a verifier seat of another provider family judges the
//! result, rework goes back to the builder, and a pass is merged.
//!
//! - `machine`: the stage loop, pure.
//! - `verdict`: the verifier's answer, parsed strictly.
//! - `git`: worktrees, commits, diffs and merges (blocking; lane workers).
//! - `check`: the isolated acceptance command (blocking; lane workers).
//! - `controller`: every lane's record, on the reactor; carries out what
//!   the machine decides by returning effects the daemon's router applies.
//! - `work`: the lane workers' typed jobs and reports (blocking).
//! - `pool`: the daemon-owned checkouts, kept per repository between lanes.

pub mod check;
pub mod controller;
pub mod git;
pub mod machine;
pub mod pool;
pub mod verdict;
pub mod work;
