//! The tmux workers (DESIGN.md, "Threads and ownership": blocking work
//! runs on its own threads, bounded in number): `TMUX_WORKERS` threads
//! that take [`Job`]s from one bounded queue, run the tmux calls and the
//! discovery they need, and hand each outcome to the report function the
//! daemon gave them. A full queue refuses the job at once; nothing waits
//! on the reactor. The threads are started with the first job, so a
//! daemon no one asks about tmux starts none.

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use std::path::PathBuf;
use std::sync::Arc;

use super::driver::{self, Server, TmuxError};
use super::{Job, Report, discover, persistent};
use crate::limits;

/// What a worker needs besides the job: the home directory whose
/// `.claude/projects` holds Claude Code's transcripts.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub home: PathBuf,
}

/// The sending side of the job queue, and what starts the threads.
pub struct Pool {
    tx: Sender<Job>,
    rx: Receiver<Job>,
    started: bool,
    ctx: Ctx,
    report: Arc<dyn Fn(Report) + Send + Sync>,
}

impl Pool {
    pub fn new(ctx: Ctx, report: impl Fn(Report) + Send + Sync + 'static) -> Pool {
        let (tx, rx) = bounded(limits::TMUX_JOBS_QUEUED);
        Pool {
            tx,
            rx,
            started: false,
            ctx,
            report: Arc::new(report),
        }
    }

    /// Queues `job`; gives it back when the queue is full or no worker
    /// thread could be started.
    pub fn submit(&mut self, job: Job) -> Result<(), Box<Job>> {
        if !self.started {
            self.started = true;
            for i in 0..limits::TMUX_WORKERS {
                let rx = self.rx.clone();
                let ctx = self.ctx.clone();
                let report = self.report.clone();
                let spawned =
                    std::thread::Builder::new()
                        .name(format!("tmux-{i}"))
                        .spawn(move || {
                            for job in rx.iter() {
                                report(run(&ctx, job));
                            }
                        });
                if let Err(e) = spawned {
                    crate::warn!(
                        "unable to start a tmux worker thread: {}",
                        crate::errors::io_cause(&e)
                    );
                    if i == 0 {
                        self.started = false;
                        return Err(Box::new(job));
                    }
                }
            }
        }
        self.tx.try_send(job).map_err(|e| match e {
            TrySendError::Full(j) | TrySendError::Disconnected(j) => Box::new(j),
        })
    }
}

/// Runs one job to its report.
pub fn run(ctx: &Ctx, job: Job) -> Report {
    match job {
        Job::Scan { servers } => {
            let procs = discover::Procs::read();
            let mut found = Vec::new();
            let mut failed = Vec::new();
            for s in &servers {
                match driver::list_panes(s) {
                    Ok(panes) => {
                        let every = s.name == super::OWN_SERVER;
                        found.extend(discover::scan(s, panes, &procs, &ctx.home, every))
                    }
                    Err(e) => failed.push(e),
                }
            }
            Report::Scanned { found, failed }
        }
        Job::Call {
            ticket,
            server,
            pane,
            op,
        } => Report::Done {
            ticket,
            result: pane_op(&server, &pane, op),
        },
        Job::Transcript {
            sid,
            cwd,
            path,
            file,
            subagent,
        } => Report::Transcript {
            sid,
            read: super::transcript::follow(&ctx.home, &cwd, path, file, subagent),
        },
    }
}

fn pane_op(server: &Server, pane: &str, op: super::Op) -> Result<super::Done, TmuxError> {
    use super::{Done, Op};
    match op {
        Op::Capture => driver::capture(server, pane).map(Done::Screen),
        Op::Keys(keys) => driver::send_keys(server, pane, &keys).map(|()| Done::Ok),
        Op::Focus => driver::focus(server, pane).map(|()| Done::Ok),
        Op::Kill => driver::kill_pane(server, pane).map(|()| Done::Ok),
        Op::Input {
            text,
            submit,
            prepare,
        } => {
            if prepare {
                driver::leave_modes(server, pane)?;
                // Claude Code's vim mode shows "-- NORMAL --" under its
                // prompt; `i` returns it to insert mode. A screen without
                // it gets nothing: a stray Escape would stop a turn.
                let screen = driver::capture(server, pane)?;
                if screen.contains("-- NORMAL --") {
                    driver::send_keys(server, pane, &["i".to_string()])?;
                }
            }
            if !text.is_empty() {
                driver::send_text(server, pane, &text)?;
            }
            if submit {
                driver::send_keys(server, pane, &["Enter".to_string()])?;
            }
            Ok(Done::Ok)
        }
        Op::Spawn { session, cwd, argv } => {
            driver::new_pane(server, &session, &cwd, &argv).map(Done::Spawned)
        }
        Op::HostInfo => Ok(Done::Host(super::host::info())),
        Op::TermCreate { id, cwd } => persistent::create(server, &id, &cwd).map(Done::Terminal),
        Op::TermList => persistent::list(server).map(Done::Terminals),
        Op::TermKill { id } => persistent::kill(server, &id).map(|found| {
            if found {
                Done::Ok
            } else {
                Done::NoTerminal(id)
            }
        }),
        Op::TermRename { id, name } => persistent::rename(server, &id, &name).map(|found| {
            if found {
                Done::Ok
            } else {
                Done::NoTerminal(id)
            }
        }),
        Op::CompleteDir { home, path } => Ok(Done::Dirs(super::host::complete_dir(&home, &path))),
    }
}
