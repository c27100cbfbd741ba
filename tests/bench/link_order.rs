//! Figure `link_order_coverage`: how much of the daemon's start-up code the
//! link order still covers, and the tool that rewrites it.
//!
//! src/build.rs has the linker place the functions listed in
//! src/link-order.txt side by side, so that the code an idle daemon ran at
//! start-up takes few 64 KiB windows of resident memory (`idle_rss`). The
//! list names symbols as the linker sees them; a renamed function, or
//! another compiler or dependency version, changes some names, and what the
//! list no longer names is laid out as without it. This figure runs `serve`
//! under callgrind from spawn past the ledger's integrity check and a
//! `ping`, takes every function of the binary that ran, and reports the
//! share the list names (goal >= 0.9). With `BENCH_LINK_ORDER=write` it
//! then rewrites the list with exactly those functions, sorted, for the
//! next build.

use serde_json::json;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::{self, DaemonDirs, Figure, LineClient, PING, Proc, TempDir};

pub const FIGURE: &str = "link_order_coverage";

const GOAL: f64 = 0.9;

/// The list src/build.rs hands the linker.
fn list_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join("link-order.txt")
}

const HEADER: &str = "\
# Functions the daemon runs from start to idle, laid out side by side in
# the release binary (src/build.rs says why). Written by
# `BENCH_FILTER=link_order BENCH_LINK_ORDER=write cargo bench --bench bench`
# from a callgrind run of `serve`; rewrite it when `link_order_coverage`
# falls under its goal. One symbol a line, sorted: the linker places them
# in this order, and sorted, a rewrite diffs by what changed.
";

pub fn run() {
    if !util::selected(FIGURE) {
        return;
    }
    let Some(valgrind) = util::valgrind_for(FIGURE) else {
        return;
    };
    let ran = match startup_functions(&valgrind) {
        Ok(r) if !r.is_empty() => r,
        Ok(_) => {
            util::skipped(FIGURE, None, "callgrind saw no function of the daemon run");
            return;
        }
        Err(e) => {
            util::skipped(FIGURE, None, &format!("error: {e}"));
            return;
        }
    };
    let listed: BTreeSet<String> = std::fs::read_to_string(list_path())
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    let covered = ran.iter().filter(|f| listed.contains(*f)).count();
    let coverage = covered as f64 / ran.len() as f64;
    let write = std::env::var("BENCH_LINK_ORDER").as_deref() == Ok("write");
    if write {
        let mut text = HEADER.to_string();
        for f in &ran {
            text.push_str(f);
            text.push('\n');
        }
        if let Err(e) = std::fs::write(list_path(), text) {
            util::skipped(
                FIGURE,
                None,
                &format!("unable to write {}: {e}", list_path().display()),
            );
            return;
        }
        eprintln!(
            "bench: {FIGURE}: wrote {} functions to {}; rebuild to use them",
            ran.len(),
            list_path().display()
        );
    }
    Figure {
        name: FIGURE,
        placement: None,
        value: coverage,
        baseline: None,
        baseline_of: "",
        ratio: Some(coverage),
        better: "higher",
        goal: json!(">= 0.9 of the functions run from start to idle are in src/link-order.txt"),
        unit: "share of start-up functions listed",
        pass: coverage >= GOAL,
        rounds: 1,
        extra: vec![
            ("functions_run", json!(ran.len())),
            ("functions_listed", json!(listed.len())),
            ("rewritten", json!(write)),
        ],
    }
    .emit();
}

/// The symbols of the daemon binary that ran from spawn to idle: ready,
/// the integrity check, a `ping`.
fn startup_functions(valgrind: &Path) -> Result<BTreeSet<String>, String> {
    let tmp = TempDir::new("order");
    let dirs = DaemonDirs::under(tmp.path());
    let out = tmp.path().join("callgrind.out");
    let mut daemon = Command::new(util::daemon_bin());
    util::daemon_args(&mut daemon, &dirs);
    // Symbols as the linker sees them, not demangled.
    let cmd = util::under_callgrind(valgrind, &out, tmp.path(), &daemon, &["--demangle=no"]);
    let mut p = Proc::spawn("valgrind omniconfluxd", cmd, Some(0), Some(&dirs.log))
        .map_err(|e| format!("unable to start valgrind: {e}"))?;
    let ready = util::wait_daemon_ready(&mut p, &dirs.socket, Duration::from_secs(120))
        .map_err(|e| format!("{e}; log: {}", util::log_tail(&dirs.log)))?;
    // The integrity check runs LEDGER_CHECK_DELAY_MS after the reactor
    // starts, on the reader thread; idle.rs waits as long before measuring.
    let settled =
        ready.answered + Duration::from_millis(omniconfluxd::limits::LEDGER_CHECK_DELAY_MS + 4_000);
    std::thread::sleep(settled.saturating_duration_since(Instant::now()));
    {
        let mut c = LineClient::connect(&dirs.socket).map_err(|e| e.to_string())?;
        c.exchange(PING).map_err(|e| e.to_string())?;
    }
    p.stop(Duration::from_secs(120));
    let text = std::fs::read_to_string(&out).map_err(|e| {
        format!(
            "no callgrind output: {e}; log: {}",
            util::log_tail(&dirs.log)
        )
    })?;
    Ok(functions_of(&text, &util::daemon_bin()))
}

/// The functions with costs in a callgrind output whose object is `bin`.
/// Callgrind names an object and a function in full the first time
/// (`ob=(3) /path`, `fn=(12) name`, also as `cob=`/`cfn=`), then by number
/// alone; a function's object is the `ob=` in force at its `fn=` line.
fn functions_of(text: &str, bin: &Path) -> BTreeSet<String> {
    let bin = bin.to_string_lossy();
    let mut objects: HashMap<&str, &str> = HashMap::new();
    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut ran: Vec<(&str, &str)> = Vec::new();
    let mut object = "";
    for line in text.lines() {
        let Some((key, rest)) = line.split_once('=') else {
            continue;
        };
        let Some(rest) = rest.strip_prefix('(') else {
            continue;
        };
        let Some((id, name)) = rest.split_once(')') else {
            continue;
        };
        let name = name.trim();
        match key {
            "ob" | "cob" => {
                if !name.is_empty() {
                    objects.insert(id, name);
                }
                if key == "ob" {
                    object = id;
                }
            }
            "fn" | "cfn" => {
                if !name.is_empty() {
                    names.insert(id, name);
                }
                if key == "fn" {
                    ran.push((object, id));
                }
            }
            _ => {}
        }
    }
    ran.into_iter()
        .filter(|(ob, _)| objects.get(ob).is_some_and(|o| *o == bin))
        .filter_map(|(_, f)| names.get(f).copied())
        // Code without a symbol shows as its address, and valgrind's own
        // names ("(below main)") hold spaces or parentheses: neither is a
        // symbol the linker could place.
        .filter(|n| !n.starts_with("0x") && !n.contains([' ', '(', ')']))
        .map(str::to_string)
        .collect()
}
