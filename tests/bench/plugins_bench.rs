//! Issue 4, the plugin host: 20 copies of bench_plugin.py (beside this
//! file), each installed under its own id, approved and running on one
//! daemon (core 0). The plugins time themselves and report through
//! `command.run` answers and files in their working directories.
//!
//! Figures:
//! - `plugin_rss`: (daemon VmRSS with 20 running idle plugins - with none)
//!   / 20, KiB; goal <= 256 KiB.
//! - `plugin_storage_get_vs_pipe`: median `storage.get` round trip timed in
//!   the plugin, against the same line echoed by a `cat` child over pipes
//!   from the same process, interleaved call by call; ratio <= 2.
//! - `plugin_storage_set_vs_fdatasync`: durable `storage.set`s a second,
//!   one at a time from one plugin, against a loop appending a line and
//!   fdatasync-ing it in the state directory; ratio >= 0.8.
//! - `plugin_storage_set_16_in_flight`: the same with 16 in flight, against
//!   one at a time; ratio >= 4 (group commit).
//! - `plugin_event_delivery`: `turn.end` events appended on the socket
//!   (pipelined, 48 in flight) delivered to 20 subscribed plugins:
//!   deliveries a second; and the delay from the event's `ts` to the
//!   plugin reading the line, median and p99, paced (one event at a time)
//!   and under that load.
//!
//! Each plugin's request budget is 50 a second with a burst of 200 (see
//! src/plugins/host.rs): the get loop paces its calls, and each set round
//! uses plugins whose budget is full.

use serde_json::json;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::util::{self, Figure, Rpc, TempDir};

pub const RSS: &str = "plugin_rss";
pub const GET: &str = "plugin_storage_get_vs_pipe";
pub const SET: &str = "plugin_storage_set_vs_fdatasync";
pub const SET16: &str = "plugin_storage_set_16_in_flight";
pub const EVENTS: &str = "plugin_event_delivery";

const PLUGINS: usize = 20;
const SETS: usize = 64;

pub fn run() {
    let figs = [RSS, GET, SET, SET16, EVENTS];
    if !figs.iter().any(|f| util::selected(f)) {
        return;
    }
    let Some(py) = util::python3() else {
        for f in figs {
            util::skipped(f, None, "python3 not found");
        }
        return;
    };
    if let Err(e) = measure(&py) {
        for f in figs.iter().filter(|f| util::selected(f)) {
            util::skipped(f, None, &format!("error: {e}"));
        }
    }
}

fn id_of(n: usize) -> String {
    format!("bench-{n:02}")
}

fn folder(tmp: &Path, n: usize) -> Result<PathBuf, String> {
    let f = tmp.join(format!("src-{n:02}"));
    std::fs::create_dir_all(&f).map_err(|e| e.to_string())?;
    std::fs::copy(util::bench_file("bench_plugin.py"), f.join("main.py"))
        .map_err(|e| e.to_string())?;
    let cmds: Vec<_> = ["get", "set", "count", "dump"]
        .iter()
        .map(|c| json!({"id": c, "title": c, "input": "text"}))
        .collect();
    let manifest = json!({
        "manifestVersion": 1, "api": "1.0", "id": id_of(n), "name": format!("Bench {n}"), "version": "1.0.0",
        "description": "Times storage calls and event delivery.", "main": "main.py",
        "permissions": ["storage.own", "events.read", "commands.add"], "commands": cmds,
    });
    std::fs::write(f.join("omniconflux-plugin.json"), manifest.to_string())
        .map_err(|e| e.to_string())?;
    Ok(f)
}

fn install(c: &mut Rpc, folder: &Path) -> Result<(), String> {
    let inst = c.call(
        "plugin.install",
        json!({"path": folder.display().to_string()}),
    )?;
    let id = inst["plugin"].as_str().ok_or("no plugin id")?.to_string();
    let got = c.call("plugin.get", json!({"plugin": id}))?;
    let m = &got["waiting"]["manifest"];
    let mut perms: Vec<String> = m["permissions"]
        .as_array()
        .ok_or("no permissions")?
        .iter()
        .filter_map(|p| p.as_str().map(String::from))
        .collect();
    let order = [
        "events.read",
        "lists.read",
        "commands.add",
        "storage.own",
        "tasks.create",
    ];
    perms.sort_by_key(|p| order.iter().position(|o| o == p));
    let cmds: Vec<_> = m["commands"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| c["id"].clone())
        .collect();
    let r = c.call(
        "plugin.approve",
        json!({"plugin": id, "snapshotHash": inst["snapshotHash"], "permissions": perms, "commands": cmds, "operator": "bench"}),
    )?;
    if r["approved"] != json!(true) {
        return Err(format!("not approved: {r}"));
    }
    Ok(())
}

fn command(c: &mut Rpc, n: usize, cmd: &str, input: &str) -> Result<String, String> {
    let r = c.call(
        "plugin.command.run",
        json!({"command": format!("{}.{cmd}", id_of(n)), "input": input}),
    )?;
    r["text"]
        .as_str()
        .map(String::from)
        .ok_or_else(|| format!("no text: {r}"))
}

fn settled_rss(pid: i32) -> f64 {
    std::thread::sleep(Duration::from_millis(700));
    let xs: Vec<f64> = (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            util::vm_rss_kib(pid).unwrap_or(f64::NAN)
        })
        .collect();
    util::median(&xs)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` as ms since the epoch.
fn ts_ms(ts: &str) -> Option<f64> {
    let b = ts.as_bytes();
    if b.len() < 24 {
        return None;
    }
    let n = |r: std::ops::Range<usize>| ts.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (h, mi, s, ms) = (n(11..13)?, n(14..16)?, n(17..19)?, n(20..23)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * (if mo > 2 { mo - 3 } else { mo + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((((days * 24 + h) * 60 + mi) * 60 + s) as f64 * 1000.0 + ms as f64)
}

fn fdatasync_rate(dir: &Path, n: usize) -> Result<f64, String> {
    let p = dir.join("fdatasync-bench.txt");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&p)
        .map_err(|e| e.to_string())?;
    let line = format!("{}\n", "v".repeat(100));
    let t0 = Instant::now();
    for _ in 0..n {
        f.write_all(line.as_bytes()).map_err(|e| e.to_string())?;
        f.sync_data().map_err(|e| e.to_string())?;
    }
    let r = n as f64 / t0.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&p);
    Ok(r)
}

fn measure(py: &Path) -> Result<(), String> {
    let tmp = TempDir::new("plug");
    let config = format!("[plugins]\npython = \"{}\"\n", py.display());
    let (daemon, dirs) = util::start_daemon(tmp.path(), &config, Some(0))?;
    let pid = daemon.pid();
    let mut c = Rpc::connect(&dirs.socket)?;
    c.call("plugin.list", json!({}))?;
    let rss0 = settled_rss(pid);
    for n in 0..PLUGINS {
        install(&mut c, &folder(tmp.path(), n)?)?;
    }
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let l = c.call("plugin.list", json!({}))?;
        let running = l["plugins"]
            .as_array()
            .map(|a| a.iter().filter(|p| p["state"] == "running").count())
            .unwrap_or(0);
        if running == PLUGINS {
            break;
        }
        if Instant::now() > end {
            return Err(format!(
                "{running} of {PLUGINS} plugins running after 60 s: {l}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Each answers a command once running and subscribed.
    for n in 0..PLUGINS {
        command(&mut c, n, "count", "")?;
    }
    let rss20 = settled_rss(pid);
    if util::selected(RSS) {
        let v = (rss20 - rss0) / PLUGINS as f64;
        Figure {
            name: RSS,
            placement: None,
            value: v,
            baseline: None,
            baseline_of: "",
            ratio: Some(v / 256.0),
            better: "lower",
            goal: json!("<= 256 KiB"),
            unit: "KiB of daemon VmRSS per running idle plugin",
            pass: v <= 256.0,
            rounds: 1,
            extra: vec![
                ("daemon_rss_kib_0_plugins", util::round3(rss0)),
                ("daemon_rss_kib_20_plugins", util::round3(rss20)),
            ],
        }
        .emit();
    }
    let work = |n: usize| dirs.state.join("plugins").join(id_of(n)).join("work");
    let rounds = util::rounds(5, 2);

    if util::selected(GET) {
        // A value to read.
        command(&mut c, 19, "set", "1 1")?;
        let per = if util::quick() { 60 } else { 100 };
        let (mut g, mut e) = (Vec::new(), Vec::new());
        for i in 0..rounds {
            eprintln!("bench: {GET} round {}/{rounds}", i + 1);
            command(&mut c, 19, "get", &format!("{per} 20"))?;
            let text =
                std::fs::read_to_string(work(19).join("get.txt")).map_err(|e| e.to_string())?;
            let (mut gs, mut es) = (Vec::new(), Vec::new());
            for l in text.lines() {
                let mut it = l.split_whitespace().filter_map(|x| x.parse::<f64>().ok());
                if let (Some(a), Some(b)) = (it.next(), it.next()) {
                    gs.push(a / 1000.0);
                    es.push(b / 1000.0);
                }
            }
            g.push(util::median(&gs));
            e.push(util::median(&es));
        }
        let (v, b) = (util::median(&g), util::median(&e));
        Figure {
            name: GET,
            placement: None,
            value: v,
            baseline: Some(b),
            baseline_of: "the same line echoed by a cat child over pipes, from the same plugin process, interleaved",
            ratio: Some(v / b),
            better: "lower",
            goal: json!("ratio <= 2"),
            unit: "us (median round trip, timed in the plugin)",
            pass: v / b <= 2.0,
            rounds,
            extra: vec![
                ("calls_per_round", json!(per)),
                ("gap_ms", json!(20)),
                ("value_spread", util::round3(util::spread(&g))),
                ("baseline_spread", util::round3(util::spread(&e))),
            ],
        }
        .emit();
    }

    if util::selected(SET) || util::selected(SET16) {
        let (mut one, mut sixteen, mut base, mut failed) =
            (Vec::new(), Vec::new(), Vec::new(), 0usize);
        for i in 0..rounds.min(9) {
            eprintln!("bench: {SET} round {}/{rounds}", i + 1);
            // Fresh plugins each round: each has its full burst of 200.
            let rate =
                |c: &mut Rpc, n: usize, k: usize, failed: &mut usize| -> Result<f64, String> {
                    let t = command(c, n, "set", &format!("{SETS} {k}"))?;
                    let mut it = t.split_whitespace().filter_map(|x| x.parse::<f64>().ok());
                    let ns = it.next().ok_or("no time")?;
                    *failed += it.next().unwrap_or(0.0) as usize;
                    Ok(SETS as f64 / (ns / 1e9))
                };
            one.push(rate(&mut c, 1 + 2 * i, 1, &mut failed)?);
            base.push(fdatasync_rate(&dirs.state, SETS)?);
            sixteen.push(rate(&mut c, 2 + 2 * i, 16, &mut failed)?);
        }
        let r = one.len();
        let (v1, b, v16) = (
            util::median(&one),
            util::median(&base),
            util::median(&sixteen),
        );
        if util::selected(SET) {
            Figure {
                name: SET,
                placement: None,
                value: v1,
                baseline: Some(b),
                baseline_of: "a loop appending a 101-byte line and fdatasync-ing it, in the state directory",
                ratio: Some(v1 / b),
                better: "higher",
                goal: json!("ratio >= 0.8"),
                unit: "storage.set/s, one at a time from one plugin",
                pass: v1 / b >= 0.8,
                rounds: r,
                extra: vec![
                    ("sets_per_round", json!(SETS)),
                    ("failed_sets", json!(failed)),
                    ("value_spread", util::round3(util::spread(&one))),
                    ("baseline_spread", util::round3(util::spread(&base))),
                ],
            }
            .emit();
        }
        if util::selected(SET16) {
            Figure {
                name: SET16,
                placement: None,
                value: v16,
                baseline: Some(v1),
                baseline_of: "the same plugin calls one at a time",
                ratio: Some(v16 / v1),
                better: "higher",
                goal: json!("ratio >= 4"),
                unit: "storage.set/s, 16 in flight from one plugin",
                pass: v16 / v1 >= 4.0,
                rounds: r,
                extra: vec![
                    ("sets_per_round", json!(SETS)),
                    ("fdatasync_per_s", util::round3(b)),
                    ("value_spread", util::round3(util::spread(&sixteen))),
                ],
            }
            .emit();
        }
    }

    if util::selected(EVENTS) {
        let paced = if util::quick() { 100 } else { 200 };
        let blast = if util::quick() { 1000 } else { 3000 };
        for n in 0..PLUGINS {
            command(&mut c, n, "dump", "")?;
        }
        // Paced: one event at a time.
        for _ in 0..paced {
            c.call(
                "events.append",
                json!({"stream": "x-bench", "kind": "turn.end", "data": {"reason": "completed"}}),
            )?;
            std::thread::sleep(Duration::from_millis(2));
        }
        // Load: pipelined, 48 in flight.
        let t0_ns = util::now_ns();
        let t0 = Instant::now();
        let (mut sent, mut done) = (0usize, 0usize);
        let mut waiting = std::collections::VecDeque::new();
        while done < blast {
            while sent < blast && waiting.len() < 48 {
                waiting.push_back(c.send("events.append", json!({"stream": "x-bench", "kind": "turn.end", "data": {"reason": "completed"}}))?);
                sent += 1;
            }
            let id = waiting.pop_front().ok_or("nothing in flight")?;
            c.wait(id)?;
            done += 1;
        }
        let commit_s = t0.elapsed().as_secs_f64();
        let want = paced + blast;
        let end = Instant::now() + Duration::from_secs(30);
        let mut dropped = 0usize;
        for n in 0..PLUGINS {
            loop {
                let t = command(&mut c, n, "count", "")?;
                let v: Vec<usize> = t
                    .split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect();
                if v.len() == 2 && (v[0] + v[1] >= want || Instant::now() > end) {
                    dropped += v[1];
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let (mut paced_d, mut load_d, mut last_ns, mut delivered) =
            (Vec::new(), Vec::new(), 0u128, 0usize);
        for n in 0..PLUGINS {
            command(&mut c, n, "dump", "")?;
            let text =
                std::fs::read_to_string(work(n).join("events.txt")).map_err(|e| e.to_string())?;
            for (i, l) in text.lines().enumerate() {
                let mut it = l.split_whitespace();
                let (Some(ts), Some(at)) = (
                    it.next().and_then(ts_ms),
                    it.next().and_then(|x| x.parse::<u128>().ok()),
                ) else {
                    continue;
                };
                let d = at as f64 / 1e6 - ts;
                if i < paced {
                    paced_d.push(d);
                } else {
                    load_d.push(d);
                    last_ns = last_ns.max(at);
                    delivered += 1;
                }
            }
        }
        let span_s = (last_ns.saturating_sub(t0_ns)) as f64 / 1e9;
        let rate = delivered as f64 / span_s;
        Figure {
            name: EVENTS,
            placement: None,
            value: rate,
            baseline: None,
            baseline_of: "",
            ratio: None,
            better: "higher",
            goal: json!("report: deliveries/s to 20 plugins, delay median and p99"),
            unit: "event deliveries/s (sum over 20 plugins)",
            pass: dropped == 0,
            rounds: 1,
            extra: vec![
                ("events_per_s", util::round3(blast as f64 / span_s)),
                ("commits_per_s_on_socket", util::round3(blast as f64 / commit_s)),
                ("dropped", json!(dropped)),
                ("paced_delay_median_ms", util::round3(util::median(&paced_d))),
                ("paced_delay_p99_ms", util::round3(util::quantile(&paced_d, 0.99))),
                ("load_delay_median_ms", util::round3(util::median(&load_d))),
                ("load_delay_p99_ms", util::round3(util::quantile(&load_d, 0.99))),
                ("ts_note", json!("ts has ms resolution and is stamped when the batch is submitted, before the commit")),
                ("events", json!({"paced": paced, "load": blast, "in_flight": 48})),
            ],
        }
        .emit();
    }
    drop(c);
    daemon.stop(Duration::from_secs(15));
    Ok(())
}
