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

use crate::util::{self, DaemonDirs, Figure, LineClient, PING, Proc, TempDir};

pub const FIGURE: &str = "ping_instructions";

const FEW: u64 = 200;
const MANY: u64 = 1200;

pub fn run() {
    if !util::selected(FIGURE) {
        return;
    }
    let Some(valgrind) = util::find_tool("valgrind") else {
        util::skipped(FIGURE, None, "valgrind not found; apt-get install valgrind");
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
    let mut cmd = Command::new(valgrind);
    cmd.arg("--tool=callgrind")
        .arg("--vgdb=no")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(util::daemon_bin());
    util::daemon_args(&mut cmd, &dirs);
    // valgrind's own temporary files stay in the run's directory.
    cmd.env("TMPDIR", tmp.path());
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
    let text = std::fs::read_to_string(&out).map_err(|e| {
        format!(
            "no callgrind output: {e}; log: {}",
            util::log_tail(&dirs.log)
        )
    })?;
    // A daemon with several threads writes one file, its totals on one line.
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .ok_or_else(|| "no totals in the callgrind output".into())
}
