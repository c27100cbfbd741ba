//! The command line's `lanes` and `repos` commands (issue 5): clients of the
//! lane methods of the daemon socket (src/lanes/methods.rs), plain text for
//! a person, the JSON result with `--json`.

use serde_json::{Value, json};

use super::Failure;
use super::client::Client;

/// The lines `omniconfluxd help` shows for these commands.
pub const USAGE: &str = "\
  lanes [list|show LANE|close LANE [--remove-worktree]|merge LANE|rework LANE NOTES]
                              list and drive lanes: verified work on a repository
  lanes dispatch --repo R --task T --builder B --verifier V
         --acceptance-name N --acceptance CMD [--name N] [--base B]
                              start a lane: B builds, CMD checks, V judges
  repos [list|add PATH]       the repositories lanes may work on";

use super::args::{arg, done, s, usage};

fn absolute(p: &str) -> String {
    std::path::absolute(p)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| p.to_string())
}

/// One line of `lanes list`: id, stage, state, builder→verifier, branch, rounds.
fn lane_line(l: &Value) -> String {
    let wait = if l["waits_for_operator"] == json!(true) {
        "  (waits for you)"
    } else {
        ""
    };
    format!(
        "{}  {:<16} {:<10} {}\u{2192}{}  {}  round {}/{}{wait}",
        s(&l["lane"]),
        s(&l["stage"]),
        s(&l["state"]),
        s(&l["builder"]["harness"]),
        s(&l["verifier"]["harness"]),
        s(&l["branch"]),
        s(&l["rounds"]),
        s(&l["max_rounds"]),
    )
}

/// `lanes show`: everything a person needs to decide what to do next.
fn print_lane(l: &Value) -> Result<(), Failure> {
    outln!("{}", lane_line(l))?;
    let row = |k: &str, v: String| outln!("  {k:<12}{v}");
    row("task", s(&l["task"]["name"]))?;
    row(
        "repo",
        format!("{} (base {})", s(&l["repo"]), s(&l["base"])),
    )?;
    row("worktree", s(&l["worktree"]))?;
    row("since", s(&l["since"]))?;
    row(
        "builder",
        format!(
            "{} ({}, session {})",
            s(&l["builder"]["harness"]),
            s(&l["builder"]["family"]),
            s(&l["builder"]["session"])
        ),
    )?;
    let vs = if l["verifier_session"].is_null() {
        String::new()
    } else {
        format!(", session {}", s(&l["verifier_session"]))
    };
    row(
        "verifier",
        format!(
            "{} ({}{vs})",
            s(&l["verifier"]["harness"]),
            s(&l["verifier"]["family"])
        ),
    )?;
    let acc = &l["task"]["acceptance"];
    row(
        "acceptance",
        format!("{}: {}", s(&acc["name"]), s(&acc["command"])),
    )?;
    match l["verdict"].as_object() {
        Some(v) => row(
            "verdict",
            format!("{} on {}", s(&v["verdict"]), s(&v["commit"])),
        )?,
        None => row("verdict", "none yet".into())?,
    }
    if let Some(r) = l["reason"].as_str() {
        row("reason", r.to_string())?;
    }
    match l["last_check"].as_object() {
        None => row("last check", "none yet".into())?,
        Some(c) => {
            row("last check", s(&c["summary"]))?;
            let tail = c["tail"].as_str().unwrap_or("").trim_end();
            for line in tail.lines() {
                outln!("    | {line}")?;
            }
        }
    }
    if l["archived"] == json!(true) {
        outln!("  (archived)")?;
    }
    Ok(())
}

fn print_result(
    json_out: bool,
    r: &Value,
    text: impl FnOnce(&Value) -> Result<(), Failure>,
) -> Result<(), Failure> {
    if json_out { outln!("{r}") } else { text(r) }
}

/// `lanes [list|show LANE|dispatch ...|close LANE [--remove-worktree]|merge LANE|rework LANE NOTES]`
pub fn lanes(
    mut c: impl FnMut() -> Result<Client, Failure>,
    json_out: bool,
    rest: &[String],
) -> Result<(), Failure> {
    let sub = rest.first().map(String::as_str).unwrap_or("list");
    match sub {
        "list" => {
            done(rest, 1)?;
            // Every page, so that a script gets the whole list in one array.
            let mut client = c()?;
            let mut all = Vec::new();
            let mut cursor = Value::Null;
            loop {
                let mut p = json!({"limit": 500});
                if !cursor.is_null() {
                    p["cursor"] = cursor.clone();
                }
                let page = client.call("verify.list", p)?;
                all.extend(page["lanes"].as_array().cloned().unwrap_or_default());
                cursor = page["next_cursor"].clone();
                if cursor.is_null() {
                    break;
                }
            }
            if json_out {
                outln!("{}", json!({"lanes": all}))?;
            } else if all.is_empty() {
                outln!("no lanes")?;
            } else {
                for l in &all {
                    outln!("{}", lane_line(l))?;
                }
            }
            Ok(())
        }
        "show" => {
            done(rest, 2)?;
            let r = c()?.call("lanes.get", json!({"lane": arg(rest, 1, "lane id")?}))?;
            print_result(json_out, &r, print_lane)
        }
        "dispatch" => {
            let p = dispatch_params(&rest[1..])?;
            let r = c()?.call("task.dispatch", p)?;
            print_result(json_out, &r, |r| {
                outln!("{}", s(&r["lane"]))?;
                outln!("  branch      {}", s(&r["branch"]))?;
                outln!("  worktree    {}", s(&r["worktree"]))?;
                outln!("  builder     session {}", s(&r["session"]))
            })
        }
        "close" => {
            let lane = arg(rest, 1, "lane id")?;
            let remove = match rest.get(2).map(String::as_str) {
                None => false,
                Some("--remove-worktree") => true,
                Some(other) => return Err(usage(&format!("unexpected argument {other}"))),
            };
            done(rest, 3)?;
            let r = c()?.call(
                "lanes.close",
                json!({"lane": lane, "remove_worktree": remove}),
            )?;
            print_result(json_out, &r, |r| {
                let wt = if remove {
                    "removing the worktree"
                } else {
                    "the worktree is kept"
                };
                outln!("{} closed; {wt}: {}", s(&r["lane"]), s(&r["worktree"]))
            })
        }
        "merge" => {
            done(rest, 2)?;
            let r = c()?.call("lanes.merge", json!({"lane": arg(rest, 1, "lane id")?}))?;
            print_result(json_out, &r, |r| {
                outln!(
                    "{} {}: merging {} into {}",
                    s(&r["lane"]),
                    s(&r["stage"]),
                    s(&r["branch"]),
                    s(&r["base"])
                )
            })
        }
        "rework" => {
            done(rest, 3)?;
            let lane = arg(rest, 1, "lane id")?;
            let notes = arg(rest, 2, "notes for the builder")?;
            let r = c()?.call("lanes.rework", json!({"lane": lane, "notes": notes}))?;
            print_result(json_out, &r, |r| {
                outln!(
                    "{} {}: sent back to {}",
                    s(&r["lane"]),
                    s(&r["stage"]),
                    s(&r["builder"]["harness"])
                )
            })
        }
        other => Err(usage(&format!(
            "unknown lanes command {other}; expected list, show, dispatch, close, merge or rework"
        ))),
    }
}

/// The flags of `lanes dispatch` as task.dispatch's params.
fn dispatch_params(args: &[String]) -> Result<Value, Failure> {
    const FLAGS: [&str; 8] = [
        "--repo",
        "--task",
        "--builder",
        "--verifier",
        "--acceptance-name",
        "--acceptance",
        "--name",
        "--base",
    ];
    let mut got: [Option<String>; 8] = Default::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let i = FLAGS
            .iter()
            .position(|f| f == a)
            .ok_or_else(|| usage(&format!("unexpected argument {a}")))?;
        let v = it
            .next()
            .ok_or_else(|| usage(&format!("{a} needs a value")))?;
        if got[i].replace(v.clone()).is_some() {
            return Err(usage(&format!("{a} is given twice")));
        }
    }
    let need = |i: usize| {
        got[i]
            .clone()
            .ok_or_else(|| usage(&format!("lanes dispatch needs {}", FLAGS[i])))
    };
    let mut p = json!({
        "repo": absolute(&need(0)?),
        "task": need(1)?,
        "builder": need(2)?,
        "verifier": need(3)?,
        "acceptance": {"name": need(4)?, "command": need(5)?},
    });
    if let Some(n) = &got[6] {
        p["name"] = json!(n);
    }
    if let Some(b) = &got[7] {
        p["base"] = json!(b);
    }
    Ok(p)
}

/// `repos [list|add PATH]`
pub fn repos(
    mut c: impl FnMut() -> Result<Client, Failure>,
    json_out: bool,
    rest: &[String],
) -> Result<(), Failure> {
    match rest.first().map(String::as_str).unwrap_or("list") {
        "list" => {
            done(rest, 1)?;
            let r = c()?.call("repos.list", json!({}))?;
            print_result(json_out, &r, |r| {
                let repos = r["repos"].as_array().cloned().unwrap_or_default();
                if repos.is_empty() {
                    outln!("no repositories; add one with: omniconfluxd repos add PATH")?;
                }
                for repo in repos {
                    let missing = if repo["exists"] == json!(false) {
                        "  (missing)"
                    } else {
                        ""
                    };
                    outln!("{}{missing}", s(&repo["path"]))?;
                    for wt in repo["worktrees"].as_array().into_iter().flatten() {
                        outln!("  {:<40} {}", s(&wt["branch"]), s(&wt["path"]))?;
                    }
                }
                Ok(())
            })
        }
        "add" => {
            done(rest, 2)?;
            let path = absolute(arg(rest, 1, "repository path")?);
            let r = c()?.call("repos.add", json!({"path": path}))?;
            print_result(json_out, &r, |r| outln!("added {}", s(&r["path"])))
        }
        other => Err(usage(&format!(
            "unknown repos command {other}; expected list or add"
        ))),
    }
}
