//! omniconfluxd: the daemon that supervises AI coding-agent sessions, and its
//! command line. The binary's `main` is a thin wrapper over [`cli::run`]; the
//! library exists so that the benchmark harness and tests reach the same code.

#[macro_use]
pub mod log;

pub mod agents;
pub mod children;
pub mod cli;
pub mod clock;
pub mod config;
pub mod core;
pub mod daemon;
pub mod e2ee;
pub mod errors;
pub mod gateway;
pub mod http;
pub mod ids;
pub mod isolation;
pub mod jsonscan;
pub mod lanes;
pub mod ledger;
pub mod limits;
pub mod lock;
pub mod notify;
pub mod plugins;
pub mod probe_thread;
pub mod procs;
pub mod reactor;
pub mod secret_file;
pub mod signals;
pub mod socket;
#[cfg(test)]
mod testutil;
pub mod tmux;
pub mod trustlog;
pub mod uplink;
