//! Threads that run the start-up probes (bubblewrap, the seats' commands,
//! systemd-inhibit), and the priority they run at (issue 2, start to
//! ready).
//!
//! A probe forks and execs programs that set up namespaces or talk to the
//! system bus, milliseconds of CPU right after start. Nothing waits for a
//! probe's answer before the first spawn, yet on a machine with one free
//! core (or with the daemon pinned to one) the probes took that core from
//! the reactor answering its first requests. So a probe thread lowers its
//! own scheduling priority (`PROBE_NICE`) before it starts anything; the
//! programs it runs inherit it. It still gets its share of a busy core,
//! so a probe is never starved.

use std::thread::JoinHandle;

use crate::limits;

/// Spawns the thread `name` running `probe` at the probes' priority.
pub fn spawn(name: &str, probe: impl FnOnce() + Send + 'static) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            lower_priority();
            probe()
        })
}

/// Sets this thread's nice value to `PROBE_NICE`. On Linux, a
/// PRIO_PROCESS priority applies to the one thread `who` names; 0 is the
/// calling thread. Raising one's own nice value needs no privilege, and a
/// failure leaves the probe at normal priority, which is only slower to
/// give way.
fn lower_priority() {
    // SAFETY: setpriority takes plain integers and changes only the
    // calling thread's nice value.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, limits::PROBE_NICE);
    }
}
