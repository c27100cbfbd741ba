//! Figure `link_order_coverage`: how much of the daemon's start-up code and
//! of its `storage.get` path the link order still covers, and the tool that
//! rewrites it.
//!
//! src/build.rs has the linker place the functions listed in
//! src/link-order.txt side by side, in two blocks: first the functions a
//! plugin's `storage.get` runs, so that a request arriving after a pause
//! finds its code on few pages (`plugin_storage_get_vs_pipe`), then those
//! an idle daemon ran at start-up, so that they take few 64 KiB windows of
//! resident memory (`idle_rss`). The list names symbols as the linker sees
//! them; a renamed function, or another compiler or dependency version,
//! changes some names, and what the list no longer names is laid out as
//! without it. This figure runs `serve` under callgrind from spawn past the
//! ledger's integrity check and a `ping`, and takes every function of the
//! binary that ran; then a plugin's gets, few and many, under callgrind as
//! `storage_get_instructions` counts them, and takes the functions of the
//! binary whose own instructions grow with the gets. It reports the share
//! of each the list names, the request path's in its first block (goal for
//! both: at least 0.9). With `BENCH_LINK_ORDER=write` it then rewrites the
//! list with exactly those functions, each block sorted, for the next
//! build.

use serde_json::json;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::callgrind::{self, GETS_FEW, GETS_MANY};
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
# Functions laid out side by side in the release binary, in this order
# (src/build.rs says why): those a plugin's storage.get runs, then those
# the daemon runs from start to idle. Written by
# `BENCH_FILTER=link_order BENCH_LINK_ORDER=write cargo bench --bench bench`
# from callgrind runs of `serve`; rewrite it when `link_order_coverage`
# falls under its goal. One symbol a line, each block sorted, so that a
# rewrite diffs by what changed.
";

/// The comment lines that open the two blocks.
const REQUEST_BLOCK: &str = "# request path: a plugin's storage.get";
const STARTUP_BLOCK: &str = "# start-up";

pub fn run() {
    if !util::selected(FIGURE) {
        return;
    }
    let Some(valgrind) = util::valgrind_for(FIGURE) else {
        return;
    };
    let ran = (|| -> Result<_, String> {
        let startup = startup_functions(&valgrind)?;
        let request = request_functions(&valgrind)?;
        if startup.is_empty() || request.is_empty() {
            return Err("callgrind saw no function of the daemon run".into());
        }
        Ok((startup, request))
    })();
    let (startup, request) = match ran {
        Ok(r) => r,
        Err(e) => {
            util::skipped(FIGURE, None, &format!("error: {e}"));
            return;
        }
    };
    let text = std::fs::read_to_string(list_path()).unwrap_or_default();
    let (listed, first) = blocks(&text);
    let share = |ran: &BTreeSet<String>, of: &BTreeSet<String>| {
        ran.iter().filter(|f| of.contains(*f)).count() as f64 / ran.len() as f64
    };
    let coverage = share(&startup, &listed);
    let request_coverage = share(&request, &first);
    // Every function the list misses, in every run, so that a run that
    // read low can be told from one where the list went stale.
    for (name, ran, of) in [
        ("start-up", &startup, &listed),
        ("request-path", &request, &first),
    ] {
        for f in ran.iter().filter(|f| !of.contains(*f)) {
            eprintln!("bench: {FIGURE}: {name} function not in its block: {f}");
        }
    }
    let write = std::env::var("BENCH_LINK_ORDER").as_deref() == Ok("write");
    if write {
        let mut text = format!("{HEADER}{REQUEST_BLOCK}\n");
        for f in &request {
            text.push_str(f);
            text.push('\n');
        }
        text.push_str(STARTUP_BLOCK);
        text.push('\n');
        for f in startup.difference(&request) {
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
            "bench: {FIGURE}: wrote {} request-path and {} start-up functions to {}; rebuild to use them",
            request.len(),
            startup.difference(&request).count(),
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
        goal: json!(">= 0.9 of the functions run from start to idle are in src/link-order.txt, and >= 0.9 of those a plugin's storage.get runs are in its first block"),
        unit: "share of start-up functions listed",
        pass: coverage >= GOAL && request_coverage >= GOAL,
        rounds: 1,
        extra: vec![
            ("functions_run", json!(startup.len())),
            ("functions_listed", json!(listed.len())),
            ("request_functions_run", json!(request.len())),
            ("request_coverage", util::round3(request_coverage)),
            ("rewritten", json!(write)),
        ],
    }
    .emit();
}

/// The symbols the list names, and those of its first block (the request
/// path's).
fn blocks(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut all, mut first) = (BTreeSet::new(), BTreeSet::new());
    let mut in_first = false;
    for l in text.lines().map(str::trim) {
        if l.starts_with('#') {
            if l == REQUEST_BLOCK {
                in_first = true;
            } else if l == STARTUP_BLOCK {
                in_first = false;
            }
            continue;
        }
        if l.is_empty() {
            continue;
        }
        if in_first {
            first.insert(l.to_string());
        }
        all.insert(l.to_string());
    }
    (all, first)
}

/// The symbols of the daemon binary whose own instructions grow by at
/// least one a get between a run of few and one of many of a plugin's
/// `storage.get`s (callgrind.rs, `storage_get_instructions`).
fn request_functions(valgrind: &Path) -> Result<BTreeSet<String>, String> {
    let py = util::python3().ok_or("python3 not found")?;
    let annotate = util::find_tool("callgrind_annotate").ok_or("callgrind_annotate not found")?;
    let opts = ["--demangle=no"];
    let few = callgrind::storage_get_run(valgrind, Some(&annotate), &py, GETS_FEW, &opts)?;
    let many = callgrind::storage_get_run(valgrind, Some(&annotate), &py, GETS_MANY, &opts)?;
    let mut grew: HashMap<&str, f64> = HashMap::new();
    for (k, v) in &many.by_fn {
        *grew.entry(symbol(k)).or_default() += v;
    }
    for (k, v) in &few.by_fn {
        *grew.entry(symbol(k)).or_default() -= v;
    }
    let n = (GETS_MANY - GETS_FEW) as f64;
    Ok(grew
        .into_iter()
        .filter(|(f, v)| *v / n >= 1.0 && many.ran.contains(*f))
        .map(|(f, _)| f.to_string())
        .collect())
}

/// The function of a callgrind_annotate entry `file:function [object]`
/// (mangled names hold no colon).
fn symbol(entry: &str) -> &str {
    let e = entry.split(" [").next().unwrap_or(entry);
    e.rsplit_once(':').map_or(e, |(_, f)| f)
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
pub fn functions_of(text: &str, bin: &Path) -> BTreeSet<String> {
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
