//! Optional figure: instructions the daemon executes per `ping` exchange,
//! counted by `valgrind --tool=callgrind`. Unlike the timings this count
//! barely moves between runs, so it shows a change of the request path
//! that the noisy round-trip figure cannot.
//!
//! Two runs of the daemon under callgrind answer a few and many pings on
//! one connection; the difference of their totals divided by the difference
//! of the counts is the cost of one exchange, start-up and stop cancelling
//! out.

use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::util::{self, DaemonDirs, Figure, LineClient, PING, Proc, Rpc, TempDir};

pub const FIGURE: &str = "ping_instructions";

const FEW: u64 = 200;
const MANY: u64 = 1200;

pub fn run() {
    if !util::selected(FIGURE) {
        return;
    }
    let Some(valgrind) = util::valgrind_for(FIGURE) else {
        return;
    };
    let r = (|| -> Result<(f64, f64), String> {
        let few = total_ir(&valgrind, FEW)?;
        let many = total_ir(&valgrind, MANY)?;
        Ok((few, many))
    })();
    match r {
        Ok((few, many)) => {
            let per = (many - few) / (MANY - FEW) as f64;
            Figure {
                name: FIGURE,
                placement: None,
                value: per.round(),
                baseline: None,
                baseline_of: "",
                ratio: None,
                better: "lower",
                goal: json!("none: a repeatable count to compare between commits"),
                unit: "instructions per ping (all daemon threads)",
                pass: true,
                rounds: 1,
                extra: vec![
                    ("total_few", json!(few)),
                    ("total_many", json!(many)),
                    ("pings", json!([FEW, MANY])),
                ],
            }
            .emit();
        }
        Err(e) => util::skipped(FIGURE, None, &format!("error: {e}")),
    }
}

/// The daemon's total instruction count for a run that answers `pings`.
fn total_ir(valgrind: &Path, pings: u64) -> Result<f64, String> {
    let tmp = TempDir::new("cg");
    let dirs = DaemonDirs::under(tmp.path());
    let out = tmp.path().join("callgrind.out");
    let mut daemon = Command::new(util::daemon_bin());
    util::daemon_args(&mut daemon, &dirs);
    let cmd = util::under_callgrind(valgrind, &out, tmp.path(), &daemon, &[]);
    let mut p = Proc::spawn("valgrind omniconfluxd", cmd, Some(0), Some(&dirs.log))
        .map_err(|e| format!("unable to start valgrind: {e}"))?;
    util::wait_daemon_ready(&mut p, &dirs.socket, Duration::from_secs(120))
        .map_err(|e| format!("{e}; log: {}", util::log_tail(&dirs.log)))?;
    {
        let mut c = LineClient::connect(&dirs.socket).map_err(|e| e.to_string())?;
        for _ in 0..pings {
            c.exchange(PING).map_err(|e| e.to_string())?;
        }
    }
    p.stop(Duration::from_secs(120));
    util::callgrind_total(&out, &dirs.log)
}

/// The second figure of this module: instructions the daemon executes per
/// `storage.get` of a plugin (issue 11's round trip), all threads.
pub const STORAGE_GET: &str = "storage_get_instructions";

/// Gets in the two runs: both within the plugin's burst of 200 requests,
/// so that no get is refused `rate-limited` and the loop needs no pacing.
pub const GETS_FEW: u64 = 20;
pub const GETS_MANY: u64 = 170;

/// Functions listed in the breakdown, by their share of the difference.
const TOP: usize = 30;

/// One run of `storage_get_instructions`: the total, the self cost of
/// each function (callgrind_annotate: `file:function [object]`, one entry
/// for each file a function's inlined code comes from), and the
/// functions of the daemon's binary that ran.
pub struct CgRun {
    pub total: f64,
    pub by_fn: std::collections::HashMap<String, f64>,
    pub ran: std::collections::BTreeSet<String>,
}

/// bench_plugin.py (plugins_bench.rs) installed on a daemon under callgrind
/// loops `storage.get` of a 100-byte value FEW and MANY times, back to back,
/// as it starts (its `autoget` file; the `cat` echo it also does is its own
/// child's work, which callgrind does not count). The difference of the totals over
/// the difference of the counts is one get: the line read from the pipe,
/// parsed, checked, answered and written, and the reactor's wake-up around
/// it. The per-function breakdown of that difference goes to standard
/// error and, its first entries, into the figure.
pub fn run_storage_get() {
    if !util::selected(STORAGE_GET) {
        return;
    }
    let Some(valgrind) = util::valgrind_for(STORAGE_GET) else {
        return;
    };
    let Some(py) = util::python3() else {
        util::skipped(STORAGE_GET, None, "python3 not found");
        return;
    };
    let annotate = util::find_tool("callgrind_annotate");
    let r = (|| -> Result<(CgRun, CgRun), String> {
        let few = storage_get_run(&valgrind, annotate.as_deref(), &py, GETS_FEW, &[])?;
        let many = storage_get_run(&valgrind, annotate.as_deref(), &py, GETS_MANY, &[])?;
        Ok((few, many))
    })();
    let (few, many) = match r {
        Ok(x) => x,
        Err(e) => {
            util::skipped(STORAGE_GET, None, &format!("error: {e}"));
            return;
        }
    };
    let n = (GETS_MANY - GETS_FEW) as f64;
    let per = (many.total - few.total) / n;
    let mut diff: Vec<(String, f64)> = many
        .by_fn
        .iter()
        .map(|(f, v)| {
            (
                f.clone(),
                (v - few.by_fn.get(f).copied().unwrap_or(0.0)) / n,
            )
        })
        .filter(|(_, v)| v.abs() >= 1.0)
        .collect();
    diff.sort_by(|a, b| b.1.total_cmp(&a.1));
    eprintln!("bench: {STORAGE_GET}: self instructions per get, by function");
    for (f, v) in diff.iter().take(TOP * 2) {
        eprintln!("bench: {v:>10.0}  {f}");
    }
    let top: Vec<_> = diff
        .iter()
        .take(TOP)
        .map(|(f, v)| json!([v.round(), f]))
        .collect();
    Figure {
        name: STORAGE_GET,
        placement: None,
        value: per.round(),
        baseline: None,
        baseline_of: "",
        ratio: None,
        better: "lower",
        goal: json!("none: a repeatable count to compare between commits"),
        unit: "instructions per plugin storage.get (all daemon threads)",
        pass: true,
        rounds: 1,
        extra: vec![
            ("total_few", json!(few.total)),
            ("total_many", json!(many.total)),
            ("gets", json!([GETS_FEW, GETS_MANY])),
            ("top_self_per_get", json!(top)),
        ],
    }
    .emit();
}

/// One run: `gets` gets under callgrind with `options`.
pub fn storage_get_run(
    valgrind: &Path,
    annotate: Option<&Path>,
    py: &Path,
    gets: u64,
    options: &[&str],
) -> Result<CgRun, String> {
    use crate::plugins_bench;
    let tmp = TempDir::new("cgget");
    // No plugin ping or process watch while it runs: they come with time,
    // not with gets, and a slower run would count more of them. Agents
    // uncontained: while the agents' probe has not answered, a lane job
    // runs git on the host, and once it has, in their namespace, which
    // works out the hidden paths; the lanes' first job at start falls on
    // either side of the probe from run to run, so one run of a pair
    // counted that work and the other did not (26 start-up functions taken
    // for the get path, request_coverage 0.59 in four runs of eleven).
    let config = format!(
        "[plugins]\npython = \"{}\"\nping_interval_ms = 3600000\nwatch_interval_ms = 3600000\n\n[agents]\nisolation = \"none\"\n",
        py.display()
    );
    // Installed and approved on a daemon not under valgrind: valgrind
    // 3.19 has no pidfd_send_signal, so under it the daemon cannot tell
    // the operator's connection from an unverified one.
    let (plain, dirs) = util::start_daemon(tmp.path(), &config, Some(0))?;
    {
        let mut c = Rpc::connect(&dirs.socket)?;
        plugins_bench::install(&mut c, &plugins_bench::folder(tmp.path(), 0)?)?;
    }
    plain.stop(Duration::from_secs(20));
    let work = dirs
        .state
        .join("plugins")
        .join(plugins_bench::id_of(0))
        .join("work");
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(work.join("autoget.done"));
    std::fs::write(work.join("autoget"), format!("{gets}\n")).map_err(|e| e.to_string())?;
    let out = tmp.path().join("callgrind.out");
    let serve = util::serve_with_config(&dirs, tmp.path(), &config);
    let cmd = util::under_callgrind(valgrind, &out, tmp.path(), &serve, options);
    let mut p = Proc::spawn("valgrind omniconfluxd", cmd, Some(0), Some(&dirs.log))
        .map_err(|e| format!("unable to start valgrind: {e}"))?;
    let ready = util::wait_daemon_ready(&mut p, &dirs.socket, Duration::from_secs(120))
        .map_err(|e| format!("{e}; log: {}", util::log_tail(&dirs.log)))?;
    // The plugin starts with the daemon and runs its loop at once.
    let end = std::time::Instant::now() + Duration::from_secs(300);
    while !work.join("autoget.done").exists() {
        if std::time::Instant::now() > end || p.exited() {
            return Err(format!(
                "the plugin's get loop did not finish; log: {}",
                util::log_tail(&dirs.log)
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Both runs live past the ledger's integrity check, a one-off read
    // LEDGER_CHECK_DELAY_MS (2 s) after the reactor starts, so that both
    // count it.
    let check_done = ready.answered + Duration::from_secs(6);
    std::thread::sleep(check_done.saturating_duration_since(std::time::Instant::now()));
    p.stop(Duration::from_secs(120));
    let text = util::read_callgrind(&out, &dirs.log)?;
    let total = util::callgrind_total_in(&text)?;
    let by_fn = match annotate {
        Some(a) => self_costs(a, &out)?,
        None => Default::default(),
    };
    let ran = crate::link_order::functions_of(&text, &util::daemon_bin());
    Ok(CgRun { total, by_fn, ran })
}

/// Each function's own instructions, from `callgrind_annotate`'s lines
/// `1,234 (5.6%)  file:function [object]`.
fn self_costs(
    annotate: &Path,
    out: &Path,
) -> Result<std::collections::HashMap<String, f64>, String> {
    let o = Command::new(annotate)
        .args(["--threshold=100", "--auto=no", "--inclusive=no"])
        .arg(out)
        .output()
        .map_err(|e| format!("unable to run callgrind_annotate: {e}"))?;
    let text = String::from_utf8_lossy(&o.stdout);
    let mut m = std::collections::HashMap::new();
    for l in text.lines() {
        let l = l.trim_start();
        let Some((n, rest)) = l.split_once(' ') else {
            continue;
        };
        let Ok(v) = n.replace(',', "").parse::<f64>() else {
            continue;
        };
        let rest = rest.trim_start();
        let rest = match rest.strip_prefix('(') {
            Some(r) => r.split_once(')').map_or(r, |(_, t)| t).trim_start(),
            None => rest,
        };
        if rest.is_empty() || rest.starts_with("PROGRAM TOTALS") {
            continue;
        }
        *m.entry(rest.to_string()).or_insert(0.0) += v;
    }
    Ok(m)
}
