//! omniconfluxd: the daemon that supervises AI coding-agent sessions, and its
//! command line. The binary's `main` is a thin wrapper over [`cli::run`]; the
//! library exists so that the benchmark harness and tests reach the same code.

pub mod agents;
pub mod clock;
pub mod ids;
pub mod limits;
pub mod plugins;
