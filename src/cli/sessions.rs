//! The command line's `seats`, `sessions` and `approvals` commands (issue
//! 3): clients of the daemon socket's methods of the same names, plain
//! text for a person, the JSON result with `--json`.

use serde_json::{Value, json};

use super::Failure;
use super::client::Client;

use super::args::{arg, done, s, usage};

/// `seats [probe]`
pub fn seats(
    mut c: impl FnMut() -> Result<Client, Failure>,
    json_out: bool,
    rest: &[String],
) -> Result<(), Failure> {
    match rest.first().map(String::as_str) {
        Some("probe") => {
            done(rest, 1)?;
            c()?.call("seats.probe", json!({}))?;
            outln!(
                "{}",
                if json_out {
                    "null"
                } else {
                    "probing the seats again"
                }
            )?;
            return Ok(());
        }
        Some("list") | None => done(rest, 1)?,
        Some(other) => {
            return Err(usage(&format!(
                "unknown seats command {other}; expected list or probe"
            )));
        }
    }
    let r = c()?.call("seats.list", json!({}))?;
    if json_out {
        outln!("{r}")?;
        return Ok(());
    }
    let seats = r["seats"].as_array().cloned().unwrap_or_default();
    if seats.is_empty() {
        outln!("no seats: none configured, and no known agent detected on the daemon's PATH")?;
    }
    for seat in seats {
        let reason = seat["reason"]
            .as_str()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        outln!(
            "{:<16} {:<10} {:<12} {:<10} {:<10} sign-in {}{reason}",
            s(&seat["harness"]),
            s(&seat["status"]),
            s(&seat["transport"]),
            s(&seat["provider"]),
            s(&seat["origin"]),
            s(&seat["sign_in"])
        )?;
    }
    if r["agent_isolation"]["mode"] == "none" {
        outln!(
            "agents run {}",
            super::agent_isolation(&r["agent_isolation"])
        )?;
    }
    Ok(())
}

/// Whether `id` has the shape of a tmux session's id, `<server>:%<n>`.
fn is_tmux_id(id: &str) -> bool {
    id.split_once(":%").is_some_and(|(server, n)| {
        !server.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
    })
}

fn print_session(v: &Value) -> Result<(), Failure> {
    if let Some(t) = v.get("tmux") {
        // A session in a tmux pane (issue 15): its agent and status, and
        // where it runs.
        return outln!(
            "{}  {:<17} {:<10} tmux {}:{}  {}",
            s(&v["id"]),
            s(&v["status"]),
            s(&v["agent"]),
            s(&t["session_name"]),
            s(&t["window_index"]),
            s(&v["cwd"])
        );
    }
    outln!(
        "{}  {:<17} {:<10} turn {:<3} {}  {}",
        s(&v["id"]),
        s(&v["state"]),
        s(&v["harness"]),
        s(&v["turn"]),
        if v["pending_approvals"].as_u64().unwrap_or(0) > 0 {
            format!("{} approvals waiting", v["pending_approvals"])
        } else {
            s(&v["end_reason"])
        },
        s(&v["cwd"])
    )
}

/// `sessions [list|get ID|spawn HARNESS CWD [PROMPT]|input ID TEXT|interrupt ID|kill ID]`
pub fn sessions(
    mut c: impl FnMut() -> Result<Client, Failure>,
    json_out: bool,
    rest: &[String],
) -> Result<(), Failure> {
    let sub = rest.first().map(String::as_str).unwrap_or("list");
    let (method, params) = match sub {
        "list" => {
            done(rest, 1)?;
            ("sessions.list", json!({}))
        }
        "get" => {
            done(rest, 2)?;
            (
                "sessions.get",
                json!({"session_id": arg(rest, 1, "session id")?}),
            )
        }
        "spawn" => {
            done(rest, 4)?;
            let cwd = arg(rest, 2, "working directory")?;
            let cwd = std::path::absolute(cwd)
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| cwd.to_string());
            let mut p = json!({"harness": arg(rest, 1, "harness")?, "cwd": cwd});
            if let Some(prompt) = rest.get(3) {
                p["prompt"] = json!(prompt);
            }
            ("sessions.spawn", p)
        }
        "input" => {
            done(rest, 3)?;
            let id = arg(rest, 1, "session id")?;
            let mut p = json!({"session_id": id, "text": arg(rest, 2, "text")?});
            if is_tmux_id(id) {
                // Typed into the pane and submitted, as a prompt is to a
                // session of the daemon's own.
                p["submit"] = json!(true);
                p["prepare"] = json!(true);
            }
            ("sessions.input", p)
        }
        "interrupt" | "kill" => {
            done(rest, 2)?;
            (
                if sub == "kill" {
                    "sessions.kill"
                } else {
                    "sessions.interrupt"
                },
                json!({"session_id": arg(rest, 1, "session id")?}),
            )
        }
        other => {
            return Err(usage(&format!(
                "unknown sessions command {other}; expected list, get, spawn, input, interrupt or kill"
            )));
        }
    };
    let r = c()?.call(method, params)?;
    if json_out {
        outln!("{r}")?;
        return Ok(());
    }
    match sub {
        "list" => {
            let list = r.as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                outln!("no sessions")?;
            }
            for v in &list {
                print_session(v)?;
            }
            Ok(())
        }
        "get" => outln!("{}", serde_json::to_string_pretty(&r).unwrap_or_default()),
        "spawn" => outln!("{}", s(&r["session_id"])),
        "input" => outln!(
            "{}",
            if r["queued"] == json!(true) {
                format!("queued ({} waiting)", r["queue_length"])
            } else {
                "sent".into()
            }
        ),
        "interrupt" => outln!(
            "{}",
            if r["interrupted"] == json!(true) {
                "interrupting the turn"
            } else {
                "no turn was running"
            }
        ),
        _ => outln!(
            "{}",
            if r["ended"] == json!(true) {
                "the session had ended"
            } else {
                "stopping the agent"
            }
        ),
    }
}

/// `approvals [list|allow ID [REASON]|deny ID [REASON]]`
pub fn approvals(
    mut c: impl FnMut() -> Result<Client, Failure>,
    json_out: bool,
    rest: &[String],
) -> Result<(), Failure> {
    let sub = rest.first().map(String::as_str).unwrap_or("list");
    match sub {
        "list" => {
            let all = match rest.get(1).map(String::as_str) {
                Some("--all") => true,
                Some(other) => return Err(usage(&format!("unexpected argument {other}"))),
                None => false,
            };
            done(rest, 2)?;
            let r = c()?.call("approvals.list", json!({"all": all}))?;
            if json_out {
                outln!("{r}")?;
                return Ok(());
            }
            let items = r["approvals"].as_array().cloned().unwrap_or_default();
            if items.is_empty() {
                outln!("no approvals waiting")?;
            }
            for a in items {
                let state = if a["state"] == "pending" {
                    "pending".to_string()
                } else {
                    format!("{} by {}", s(&a["decision"]), s(&a["answered_by"]))
                };
                outln!(
                    "{:<22} {:<7} {:<8} {:<24} {state}",
                    s(&a["request_id"]),
                    s(&a["risk"]),
                    s(&a["action"]),
                    s(&a["tool"])
                )?;
                // The exact action under the model-written title: what an
                // allow would really run (issue 10, item 12).
                let t = &a["target"];
                if let Some(text) = t["text"].as_str() {
                    let mut lines = text.lines();
                    let first = lines.next().unwrap_or_default();
                    outln!("    {}: {first}", s(&t["kind"]))?;
                    for l in lines {
                        outln!("      {l}")?;
                    }
                    if t["truncated"] == true {
                        outln!("      (cut at 8 KiB; the whole input: sessions.toolDetail)")?;
                    }
                }
            }
            Ok(())
        }
        "allow" | "deny" => {
            done(rest, 3)?;
            let mut p = json!({"request_id": arg(rest, 1, "request id")?, "decision": sub});
            if let Some(reason) = rest.get(2) {
                p["reason"] = json!(reason);
            }
            let r = c()?.call("approvals.answer", p)?;
            if json_out {
                outln!("{r}")?;
            } else {
                outln!(
                    "{} {}: delivered {}",
                    s(&r["request_id"]),
                    s(&r["decision"]),
                    s(&r["delivered"])
                )?;
            }
            Ok(())
        }
        other => Err(usage(&format!(
            "unknown approvals command {other}; expected list, allow or deny"
        ))),
    }
}
