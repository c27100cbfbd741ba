//! Signals: the process blocks SIGTERM, SIGINT, SIGHUP and SIGCHLD in every
//! thread before it starts any, and one thread named `signals` takes them with
//! sigwait and hands each to the reactor as a message (DESIGN.md: "a signal
//! thread sets a flag and wakes the loop"). No handler runs in signal context,
//! so nothing here needs to be async-signal-safe, except
//! [`unblock_in_child`].
//!
//! A blocked mask survives fork and exec: a child of the daemon would start
//! with SIGTERM blocked and never see the SIGTERM of a stop (bash cannot
//! even trap it), only the SIGKILL after the grace period. std's spawn
//! empties the mask today, but its documentation does not promise it, so
//! every process the daemon starts (agents and tools through
//! `crate::children`, plugins, acceptance commands) empties it itself,
//! through [`unblock_in_child`] in its `pre_exec`.

use std::mem::MaybeUninit;

pub const WATCHED: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGCHLD];

fn watched_set() -> libc::sigset_t {
    let mut set = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set; sigaddset takes valid signal
    // numbers; the set is read only after sigemptyset wrote it.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for s in WATCHED {
            libc::sigaddset(set.as_mut_ptr(), s);
        }
        set.assume_init()
    }
}

/// Blocks the watched signals in the calling thread; threads spawned after
/// this inherit the mask. Call first thing in `serve`.
pub fn block() -> std::io::Result<()> {
    let set = watched_set();
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(r))
    }
}

/// Starts the `signals` thread; `deliver` runs on it for each signal.
pub fn spawn(deliver: impl Fn(libc::c_int) + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let set = watched_set();
            loop {
                let mut sig: libc::c_int = 0;
                // SAFETY: `set` is initialised and `sig` is a valid out pointer.
                let r = unsafe { libc::sigwait(&set, &mut sig) };
                if r == 0 {
                    deliver(sig);
                }
            }
        })?;
    Ok(())
}

/// Empties the calling thread's signal mask. Only for a `pre_exec`
/// closure, between fork and exec (module comment): in the daemon itself
/// it would let the watched signals reach a thread other than `signals`.
/// Async-signal-safe: it calls only sigemptyset and sigprocmask, on a set
/// on its own stack.
pub fn unblock_in_child() -> std::io::Result<()> {
    let mut none = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set before sigprocmask reads it;
    // a null old-set pointer is allowed.
    let r = unsafe {
        libc::sigemptyset(none.as_mut_ptr());
        libc::sigprocmask(libc::SIG_SETMASK, none.as_ptr(), std::ptr::null_mut())
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
