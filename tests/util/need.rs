//! The one rule for a test that needs something it does not bring itself: a
//! program from a Debian package, an npm package, a working bubblewrap.
//! Under CI (the `CI` variable set and not `false` or `0`; `.ci/run` installs
//! everything) a missing one fails the test with a message naming what
//! installs it, so a green run has run every test. Elsewhere (a developer's
//! `cargo test`) the test stops early and says so on the test run's own
//! stderr, not in the captured output cargo shows only for failures.
//!
//! Std only: tests/util/mod.rs includes it for the tests in tests/, and
//! unit tests include it with `#[path]`, so both follow the same rule.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;

/// Whether this run is CI's, where nothing may be missing.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// `found`, or what to do without it: `Err(why)` fails the test under CI
/// with `why` and `install`, and elsewhere returns `None` after saying so.
pub fn have<T>(found: Result<T, String>, install: &str) -> Option<T> {
    let why = match found {
        Ok(t) => return Some(t),
        Err(why) => why,
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    if under_ci() {
        panic!("{test} needs what is missing here: {why}; install {install}");
    }
    // A copy of the descriptor, not eprintln!, whose output the harness
    // captures and shows only when the test fails.
    if let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() {
        let _ = std::fs::File::from(fd).write_all(
            format!("{test}: not run: {why}; install {install} (under CI=true this fails)\n")
                .as_bytes(),
        );
    }
    None
}

/// `program` found on PATH, or why not, for `have`.
pub fn program(program: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{program} is not on PATH"))
}
