//! Issue 16, agents are contained: what the namespace costs a session's
//! start. Two daemons run side by side, one with `[agents] isolation =
//! "namespace"` and one with `"none"`, and each round spawns one session on
//! each in turn (A B A B ...): `sessions.spawn` with a prompt sent to that
//! session's first `turn.end`, the fast agent (fast_acp_agent.py beside this
//! file) answering with one chunk. That is the agent's start (python's, the
//! ACP handshake) plus its first answer, with bwrap's setup on top for the
//! namespace. Each session is killed and its end awaited before the next.
//!
//! Both daemons, and so their agents and bwrap, run on core 0; the client
//! is not pinned.
//!
//! Figure `agent_spawn_first_output_namespace`: the median with the
//! namespace over the median without; goal <= 1.2. `paired_ratio_median`
//! is the median of the rounds' own ratios, steadier on a busy machine.

use serde_json::{Value, json};
use std::path::Path;
use std::time::Instant;

use crate::util::{self, Figure, Proc, Rpc, TempDir};

pub const NAME: &str = "agent_spawn_first_output_namespace";

pub fn run() {
    if !util::selected(NAME) {
        return;
    }
    let Some(py) = util::python3() else {
        util::skipped(NAME, None, "python3 not found");
        return;
    };
    if util::find_tool("bwrap").is_none() {
        util::skipped(NAME, None, "bwrap not found");
        return;
    }
    match measure(&py) {
        Ok((with, without, rounds)) => {
            let (v, b) = (util::median(&with), util::median(&without));
            Figure {
                name: NAME,
                placement: None,
                value: v,
                baseline: Some(b),
                baseline_of: "the same with [agents] isolation = \"none\"",
                ratio: Some(v / b),
                better: "lower",
                goal: json!("ratio <= 1.2"),
                unit: "ms, sessions.spawn sent to the first turn.end",
                pass: v / b <= 1.2,
                rounds,
                extra: vec![
                    (
                        "paired_ratio_median",
                        util::round3(util::median(
                            &with
                                .iter()
                                .zip(&without)
                                .map(|(w, o)| w / o)
                                .collect::<Vec<_>>(),
                        )),
                    ),
                    ("value_spread", util::round3(util::spread(&with))),
                    ("baseline_spread", util::round3(util::spread(&without))),
                ],
            }
            .emit();
        }
        Err(e) => util::skipped(NAME, None, &format!("error: {e}")),
    }
}

fn daemon(dir: &Path, py: &Path, isolation: &str) -> Result<(Proc, Rpc, String), String> {
    let config = format!(
        "[agents]\nisolation = \"{isolation}\"\n\n[[seat]]\nharness = \"fast\"\ncommand = \"{}\"\nargs = [\"{}\"]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\nenv = {{ FAST_CHUNKS = \"1\" }}\n",
        py.display(),
        util::bench_file("fast_acp_agent.py").display()
    );
    let (p, dirs) = util::start_daemon(dir, &config, Some(0))?;
    let mut c = Rpc::connect(&dirs.socket)?;
    c.call("events.subscribe", json!({}))?;
    let cwd = dir
        .canonicalize()
        .map_err(|e| e.to_string())?
        .display()
        .to_string();
    Ok((p, c, cwd))
}

/// Waits for the event `kind` of stream `sid`, keeping the others.
fn wait_for(c: &mut Rpc, sid: &str, kind: &str) -> Result<Value, String> {
    let is = |v: &Value| {
        v["method"] == "event" && v["params"]["kind"] == kind && v["params"]["stream"] == sid
    };
    if let Some(i) = c.notes.iter().position(is) {
        return Ok(c.notes.remove(i).unwrap_or(Value::Null));
    }
    loop {
        let v = c.read()?;
        if is(&v) {
            return Ok(v);
        }
        if v.get("method").is_some() && v["params"]["stream"] != sid {
            c.notes.push_back(v);
        }
    }
}

/// One session: spawn to first turn.end, in ms; then it is killed and its
/// end awaited.
fn one(c: &mut Rpc, cwd: &str) -> Result<f64, String> {
    c.notes.clear();
    let t0 = Instant::now();
    let r = c.call(
        "sessions.spawn",
        json!({"harness": "fast", "cwd": cwd, "prompt": "hello"}),
    )?;
    let sid = r["session_id"].as_str().ok_or("no session id")?.to_string();
    wait_for(c, &sid, "turn.end")?;
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    c.call("sessions.kill", json!({"session_id": sid}))?;
    wait_for(c, &sid, "session.end")?;
    Ok(ms)
}

fn measure(py: &Path) -> Result<(Vec<f64>, Vec<f64>, usize), String> {
    let tmp_a = TempDir::new("ns");
    let tmp_b = TempDir::new("nons");
    let (da, mut a, cwd_a) = daemon(tmp_a.path(), py, "namespace")?;
    let (db, mut b, cwd_b) = daemon(tmp_b.path(), py, "none")?;
    // A first session on each, not counted: the namespace daemon's bwrap
    // probe has answered after it, and both have paid their first spawn.
    one(&mut a, &cwd_a)?;
    one(&mut b, &cwd_b)?;
    let mode = a.call("server.info", json!({}))?["agent_isolation"]["mode"].clone();
    if mode != "namespace" {
        return Err(format!("agents are not contained here (mode {mode})"));
    }
    let rounds = util::rounds(30, 6);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        eprintln!("bench: {NAME} round {}/{rounds}", i + 1);
        // Which goes first alternates, so that neither always follows the
        // other's exit.
        if i % 2 == 0 {
            with.push(one(&mut a, &cwd_a)?);
            without.push(one(&mut b, &cwd_b)?);
        } else {
            without.push(one(&mut b, &cwd_b)?);
            with.push(one(&mut a, &cwd_a)?);
        }
    }
    drop((a, b));
    da.stop(std::time::Duration::from_secs(20));
    db.stop(std::time::Duration::from_secs(20));
    Ok((with, without, rounds))
}
