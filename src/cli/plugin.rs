//! `omniconfluxd plugin ...`: the command line of the plugin host (seed 000,
//! "Daemon methods that manage plugins"). Each subcommand is one `plugin.*`
//! call; `approve` first shows the operator what they approve (the
//! permissions, the commands and the diff of the copy that waits) and asks
//! before it sends, unless `--yes` is given for a script.

use serde_json::{Value, json};
use std::io::{BufRead, Write};

use super::{EXIT_ERROR, Failure};
use crate::cli::client::Client;

pub const USAGE: &str = "\
  plugin install PATH         copy a plugin folder into the store; it waits for approval
  plugin list                 installed plugins, their state and reason
  plugin show ID              everything about one plugin
  plugin approve ID [--yes] [--operator NAME]
                              show what waits, ask, and approve it
  plugin discard ID           delete the copy that waits
  plugin enable ID | disable ID
  plugin remove ID [--keep-tasks]
  plugin commands             commands of the plugins that can run
  plugin run PLUGIN.COMMAND [INPUT]";

fn usage(m: &str) -> Failure {
    Failure {
        status: super::EXIT_USAGE,
        message: format!("{m}\n{USAGE}"),
    }
}

fn print(
    json_out: bool,
    v: &Value,
    text: impl FnOnce(&Value) -> Result<(), Failure>,
) -> Result<(), Failure> {
    if json_out { outln!("{v}") } else { text(v) }
}

fn s(v: &Value) -> String {
    v.as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

/// Runs `plugin ARGS`.
pub fn run(
    client: impl FnOnce() -> Result<Client, Failure>,
    json_out: bool,
    rest: &[String],
) -> Result<(), Failure> {
    let sub = rest
        .first()
        .map(String::as_str)
        .ok_or_else(|| usage("plugin needs a command"))?;
    let args = &rest[1..];
    let one = |what: &str| -> Result<String, Failure> {
        match args {
            [id] => Ok(id.clone()),
            _ => Err(usage(&format!("plugin {what} needs exactly one plugin id"))),
        }
    };
    match sub {
        "install" => {
            let path = one("install")?;
            let abs =
                std::path::absolute(&path).map_err(|e| usage(&format!("bad path {path}: {e}")))?;
            let r = client()?.call("plugin.install", json!({"path": abs.display().to_string()}))?;
            print(json_out, &r, |r| {
                if r["unchanged"] == true {
                    outln!(
                        "{} {}: unchanged ({})",
                        s(&r["plugin"]),
                        s(&r["version"]),
                        s(&r["state"])
                    )?;
                } else {
                    outln!(
                        "{} {} installed by the {}; state {}",
                        s(&r["plugin"]),
                        s(&r["version"]),
                        s(&r["installedBy"]),
                        s(&r["state"])
                    )?;
                    outln!("snapshot {}", s(&r["snapshotHash"]))?;
                    outln!(
                        "approve it with: omniconfluxd plugin approve {}",
                        s(&r["plugin"])
                    )?;
                }
                Ok(())
            })?;
        }
        "list" => {
            let r = client()?.call("plugin.list", json!({}))?;
            print(json_out, &r, |r| {
                for p in r["plugins"].as_array().into_iter().flatten() {
                    let reason = if p["reason"].is_null() {
                        String::new()
                    } else {
                        format!(" ({})", s(&p["reason"]))
                    };
                    outln!(
                        "{:<24} {:<10} {}{}",
                        s(&p["plugin"]),
                        s(&p["version"]),
                        s(&p["state"]),
                        reason
                    )?;
                }
                Ok(())
            })?;
        }
        "show" => {
            let r = client()?.call("plugin.get", json!({"plugin": one("show")?}))?;
            print(json_out, &r, |r| {
                outln!("{}", serde_json::to_string_pretty(r).unwrap_or_default())
            })?;
        }
        "approve" => approve(client, json_out, args)?,
        "discard" | "enable" | "disable" => {
            let r = client()?.call(&format!("plugin.{sub}"), json!({"plugin": one(sub)?}))?;
            print(json_out, &r, |r| {
                outln!("{}", serde_json::to_string(r).unwrap_or_default())
            })?;
        }
        "remove" => {
            let (id, keep) = match args {
                [id] => (id.clone(), false),
                [id, flag] if flag == "--keep-tasks" => (id.clone(), true),
                _ => {
                    return Err(usage(
                        "plugin remove needs a plugin id and optionally --keep-tasks",
                    ));
                }
            };
            let r = client()?.call("plugin.remove", json!({"plugin": id, "stopTasks": !keep}))?;
            print(json_out, &r, |r| {
                outln!(
                    "{} removed; {} sessions stopped",
                    s(&r["plugin"]),
                    r["stopped"]
                )
            })?;
        }
        "commands" => {
            let r = client()?.call("plugin.commands", json!({}))?;
            print(json_out, &r, |r| {
                for c in r["commands"].as_array().into_iter().flatten() {
                    let avail = if c["available"] == true {
                        ""
                    } else {
                        " (not running)"
                    };
                    outln!("{:<40} {}{}", s(&c["command"]), s(&c["title"]), avail)?;
                }
                Ok(())
            })?;
        }
        "run" => {
            let (command, input) = match args {
                [c] => (c.clone(), None),
                [c, i] => (c.clone(), Some(i.clone())),
                _ => {
                    return Err(usage(
                        "plugin run needs PLUGIN.COMMAND and optionally one INPUT",
                    ));
                }
            };
            let mut p = json!({"command": command});
            if let Some(i) = input {
                p["input"] = json!(i);
            }
            let r = client()?.call("plugin.command.run", p)?;
            print(json_out, &r, |r| outln!("{}", s(&r["text"])))?;
        }
        other => return Err(usage(&format!("unknown plugin command {other}"))),
    }
    Ok(())
}

fn approve(
    client: impl FnOnce() -> Result<Client, Failure>,
    json_out: bool,
    args: &[String],
) -> Result<(), Failure> {
    let mut id = None;
    let mut yes = false;
    let mut operator = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .map(|u| format!("{u} via cli"))
        .unwrap_or_else(|| "cli".into());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--yes" | "-y" => yes = true,
            "--operator" => {
                operator = it
                    .next()
                    .ok_or_else(|| usage("--operator needs a name"))?
                    .clone()
            }
            other if id.is_none() => id = Some(other.to_string()),
            other => return Err(usage(&format!("unexpected argument {other}"))),
        }
    }
    let id = id.ok_or_else(|| usage("plugin approve needs a plugin id"))?;
    let operator: String = operator
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || " ._-".contains(*c))
        .take(64)
        .collect();
    let mut c = client()?;
    let got = c.call("plugin.get", json!({"plugin": id}))?;
    let w = &got["waiting"];
    if w.is_null() {
        return Err(Failure {
            status: EXIT_ERROR,
            message: format!("plugin-stale-snapshot: no copy of {id} waits for approval"),
        });
    }
    let m = &w["manifest"];
    if m.is_null() {
        return Err(Failure {
            status: EXIT_ERROR,
            message: format!("plugin-invalid: the copy of {id} that waits has no valid manifest"),
        });
    }
    let order = [
        "events.read",
        "lists.read",
        "commands.add",
        "storage.own",
        "tasks.create",
    ];
    let mut perms: Vec<String> = m["permissions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(s)
        .collect();
    perms.sort_by_key(|p| order.iter().position(|o| o == p));
    let cmds: Vec<String> = m["commands"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| s(&c["id"]))
        .collect();
    let mut out = std::io::stderr();
    let _ = writeln!(
        out,
        "plugin {id} {} ({}), installed by {} at {}",
        s(&m["version"]),
        s(&w["kind"]),
        s(&w["installedBy"]),
        s(&w["installedAt"])
    );
    let _ = writeln!(out, "snapshot    {}", s(&w["snapshotHash"]));
    let _ = writeln!(
        out,
        "permissions {}",
        if perms.is_empty() {
            "none".into()
        } else {
            perms.join(", ")
        }
    );
    let _ = writeln!(
        out,
        "commands    {}",
        if cmds.is_empty() {
            "none".into()
        } else {
            cmds.join(", ")
        }
    );
    let _ = writeln!(out, "what differs from the approved copy:");
    for e in w["diff"].as_array().into_iter().flatten() {
        if e["field"] == "files" {
            let _ = writeln!(
                out,
                "  files: {} added, {} removed, {} changed",
                e["added"], e["removed"], e["changed"]
            );
            for p in e["paths"].as_array().into_iter().flatten() {
                let _ = writeln!(out, "    {}", s(p));
            }
        } else {
            let _ = writeln!(
                out,
                "  {}: {} -> {}",
                s(&e["field"]),
                e["before"],
                e["after"]
            );
        }
    }
    if !yes {
        let _ = write!(out, "approve this copy as {operator:?}? [y/N] ");
        let _ = out.flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            return Err(Failure {
                status: EXIT_ERROR,
                message: "not approved".into(),
            });
        }
    }
    let r = c.call(
        "plugin.approve",
        json!({"plugin": id, "snapshotHash": w["snapshotHash"], "permissions": perms, "commands": cmds, "operator": operator}),
    )?;
    print(json_out, &r, |r| {
        outln!("{} approved; state {}", s(&r["plugin"]), s(&r["state"]))
    })?;
    Ok(())
}
