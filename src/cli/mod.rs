//! The command line: `serve` runs the daemon; every other command is a client
//! of the daemon socket (issue 2, "What a user gets"). Client commands print
//! plain text for a person and, with `--json`, the JSON result for a script.
//!
//! Help and version (issue 9): `help`, `-h` and `--help` print the usage;
//! with a command (`help lanes`, `lanes --help`, also after the command's
//! own arguments) that command's part of it. Either runs nothing, so
//! `stop --help` stops nothing. `-V`/`--version` print `omniconfluxd` and
//! the crate version; with `--json`, `{"version": "X.Y.Z"}` as every other
//! command's `--json` prints JSON. The options may stand anywhere up to `--`, after
//! which every argument is the command's (`sessions input ID -- --help`).
//!
//! Exit status, as omniconfluxd(8) lists it: 0 success; 1 the daemon answered
//! with an error (its stable code and message on stderr), standard output
//! could not be written, or `serve` failed at run time; 2 a usage error or an
//! invalid config file; 3 no daemon answers.
//!
//! Standard output closed early (`omniconfluxd events --follow | head`,
//! `sessions | head -1`) is no failure: the reader has what it wanted, and
//! whatever the command asked of the daemon (`sessions spawn`, `approvals
//! allow`) was done before anything was printed. Every command prints
//! through [`out`] (`outln!`), which turns EPIPE into a quiet end of the
//! command with status 0, printing nothing more, not even on standard error;
//! `events --follow` notices when it next has an event to print. Any other
//! error writing standard output (a full disk) is status 1, naming the cause.

/// `println!` for every command: through [`out`], so that a closed
/// standard output ends the command quietly instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod args;
pub mod attach;
pub mod client;
pub mod gateway;
pub mod lanes;
pub mod lock;
pub mod pair;
pub mod plugin;
pub mod sessions;

use serde_json::{Value, json};
use std::ffi::OsString;
use std::path::PathBuf;

use crate::config::{self, PathFlags};
use client::{CallError, Client};

pub const EXIT_OK: i32 = 0;
pub const EXIT_ERROR: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_NO_DAEMON: i32 = 3;

/// A command's failure: the one line `main` prints and the exit status.
/// An empty message prints nothing ([`Failure::output_closed`]).
#[derive(Debug)]
pub struct Failure {
    pub status: i32,
    pub message: String,
}

impl Failure {
    /// Standard output is closed: the command stops, quietly and with
    /// status 0 (module comment).
    fn output_closed() -> Failure {
        Failure {
            status: EXIT_OK,
            message: String::new(),
        }
    }

    fn usage(message: impl Into<String>) -> Failure {
        Failure {
            status: EXIT_USAGE,
            message: message.into(),
        }
    }
}

impl From<CallError> for Failure {
    fn from(e: CallError) -> Failure {
        match e {
            CallError::NoDaemon(m) => Failure {
                status: EXIT_NO_DAEMON,
                message: m,
            },
            CallError::Daemon { code, message, .. } => Failure {
                status: EXIT_ERROR,
                message: format!("{code}: {message}"),
            },
            CallError::Protocol(m) => Failure {
                status: EXIT_ERROR,
                message: m,
            },
        }
    }
}

const USAGE_TEMPLATE: &str = "\
usage: omniconfluxd [OPTIONS] COMMAND [ARGS]
       omniconfluxd help [COMMAND] | COMMAND --help | --version

options (anywhere on the line):
  --config PATH               the config file (default: see omniconfluxd(8), FILES)
  --state-dir DIR             the state directory, holding the ledger
  --socket PATH               the daemon socket
  --json                      print results as JSON for a script
  -h, --help                  print this, or with a COMMAND that command's usage
  -V, --version               print the version
  --                          every argument after it is not an option

commands:
  serve [--http ADDR] [--gateway ADDR]
                              run the daemon in the foreground; --http also
                              serves the HTTP API on ADDR (IP:PORT; with port 0
                              the port chosen is logged and shown by status);
                              --gateway also runs the gateway role on ADDR
  {GATEWAY}
  {PAIR}
  status [--json]             whether a daemon answers, and what it holds
  call METHOD [PARAMS-JSON]   send any method and print the result
  events [--stream S] [--after N] [--follow] [--json]
                              print events, one JSON line each
  seats [list|probe]          the seats, configured or detected, and their state
  sessions [list|get ID|spawn HARNESS CWD [PROMPT]|input ID TEXT|interrupt ID|kill ID]
                              list, start and drive agent sessions
  {ATTACH}
  approvals [list [--all]|allow ID [REASON]|deny ID [REASON]]
                              the approvals inbox; answering is the operator's
  {LANES}
  {LOCK}
  stop                        ask the daemon to stop
  config check [PATH]         validate a config file and print it in full
  plugin ...                  manage plugins; see below
  version                     print the version
  help [COMMAND]              print this, or one command's usage

plugin commands:
  {PLUGIN}

see omniconfluxd(8) and omniconflux-plugin(7)";

fn usage_text() -> String {
    USAGE_TEMPLATE
        .replace("{PLUGIN}", plugin::USAGE)
        .replace("{LANES}", lanes::USAGE)
        .replace("{LOCK}", lock::USAGE.trim_start())
        .replace("{GATEWAY}", gateway::USAGE)
        .replace("{PAIR}", pair::USAGE.trim_start())
        .replace("{ATTACH}", attach::USAGE)
}

/// One command's usage: its entries in the commands list (and, for
/// `plugin`, the plugin commands), cut from the same text `help` prints so
/// that the two cannot disagree. `None` for a word that is no command.
fn command_usage(cmd: &str) -> Option<String> {
    let text = usage_text();
    let mut entries = Vec::new();
    let mut section = "";
    let mut mine = false;
    for line in text.lines() {
        if !line.starts_with(' ') {
            section = line;
            mine = false;
        } else if let Some(entry) = line.strip_prefix("  ").filter(|e| !e.starts_with(' ')) {
            mine = section.ends_with("commands:") && entry.split_whitespace().next() == Some(cmd);
        }
        if mine {
            entries.push(line);
        }
    }
    if entries.is_empty() {
        return None;
    }
    Some(format!(
        "usage: omniconfluxd [OPTIONS] {cmd} ...\n{}\n\n\
         options, anywhere on the line: --config PATH, --state-dir DIR,\n\
         --socket PATH, --json; omniconfluxd help lists them all; see omniconfluxd(8)",
        entries.join("\n")
    ))
}

/// Parsed global options and the rest of the arguments.
struct Args {
    flags: PathFlags,
    json: bool,
    /// `-h`/`--help` was given: print the usage of the command, if any.
    help: bool,
    /// `-V`/`--version` was given.
    version: bool,
    rest: Vec<String>,
}

fn parse_args(raw: Vec<OsString>) -> Result<Args, Failure> {
    let mut flags = PathFlags::default();
    let mut json = false;
    let mut help = false;
    let mut version = false;
    let mut options_end = false;
    let mut rest = Vec::new();
    let mut it = raw.into_iter();
    while let Some(a) = it.next() {
        let a = a.into_string().map_err(|a| {
            Failure::usage(format!("argument is not UTF-8: {}", a.to_string_lossy()))
        })?;
        if options_end {
            rest.push(a);
            continue;
        }
        let mut path_value = |name: &str| -> Result<PathBuf, Failure> {
            let v = it
                .next()
                .ok_or_else(|| Failure::usage(format!("{name} needs a value")))?;
            let p = PathBuf::from(v);
            if p.as_os_str().is_empty() {
                return Err(Failure::usage(format!("{name} needs a non-empty path")));
            }
            Ok(std::path::absolute(&p).unwrap_or(p))
        };
        match a.as_str() {
            "--config" => flags.config = Some(path_value("--config")?),
            "--state-dir" => flags.state_dir = Some(path_value("--state-dir")?),
            "--socket" => flags.socket = Some(path_value("--socket")?),
            "--json" => json = true,
            "-h" | "--help" => help = true,
            "-V" | "--version" => version = true,
            "--" => options_end = true,
            _ => rest.push(a),
        }
    }
    Ok(Args {
        flags,
        json,
        help,
        version,
        rest,
    })
}

/// Writes `text` to standard output, at once: a reader that stops early
/// (EPIPE) ends the command quietly, any other error fails it (module
/// comment). Everything a command prints goes through here, by `outln!`.
fn out(text: std::fmt::Arguments) -> Result<(), Failure> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Failure::output_closed()),
        Err(e) => Err(Failure {
            status: EXIT_ERROR,
            message: format!(
                "unable to write to standard output: {}",
                crate::errors::io_cause(&e)
            ),
        }),
    }
}

/// What `help [COMMAND]` and `COMMAND --help` print: one command's usage,
/// or all of it; a word that is no command is a usage error.
fn help(topic: Option<&str>) -> Result<(), Failure> {
    match topic {
        None => outln!("{}", usage_text())?,
        Some(cmd) => match command_usage(cmd) {
            Some(u) => outln!("{u}")?,
            None => {
                return Err(Failure::usage(format!(
                    "unknown command {cmd}; omniconfluxd help lists the commands"
                )));
            }
        },
    }
    Ok(())
}

/// What `version` and `--version` print: text, or with `--json` one JSON
/// object.
fn version(json: bool) -> Result<(), Failure> {
    if json {
        outln!("{}", json!({"version": env!("CARGO_PKG_VERSION")}))
    } else {
        outln!("omniconfluxd {}", env!("CARGO_PKG_VERSION"))
    }
}

/// Runs the command line; returns the exit status.
pub fn run(raw: Vec<OsString>) -> i32 {
    match run_inner(raw) {
        Ok(()) => EXIT_OK,
        Err(f) if f.message.is_empty() => f.status,
        Err(f) => {
            // Not eprintln!: a closed standard error must not panic either.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "omniconfluxd: {}", f.message);
            f.status
        }
    }
}

fn run_inner(raw: Vec<OsString>) -> Result<(), Failure> {
    let args = parse_args(raw)?;
    // `--help` wins over `--version`, and both over running the command:
    // `omniconfluxd stop --help` must never stop anything.
    if args.help {
        return help(args.rest.first().map(String::as_str));
    }
    if args.version {
        return version(args.json);
    }
    let Some(cmd) = args.rest.first().cloned() else {
        return Err(Failure::usage(format!(
            "no command given\n{}",
            usage_text()
        )));
    };
    let rest = &args.rest[1..];
    match cmd.as_str() {
        "help" => {
            args::done(rest, 1)?;
            help(rest.first().map(String::as_str))
        }
        "version" => {
            no_more(rest)?;
            version(args.json)
        }
        "serve" => {
            let mut flags = args.flags.clone();
            let mut it = rest.iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--http" => {
                        let v = it
                            .next()
                            .ok_or_else(|| Failure::usage("--http needs an address, IP:PORT"))?;
                        flags.http_listen = Some(v.clone());
                    }
                    "--gateway" => {
                        let v = it.next().ok_or_else(|| {
                            Failure::usage("--gateway needs an address, IP:PORT or IP")
                        })?;
                        flags.gateway_listen = Some(v.clone());
                    }
                    other => return Err(Failure::usage(format!("unexpected argument {other}"))),
                }
            }
            crate::daemon::Daemon::serve(&flags).map_err(|e| match e {
                crate::daemon::ServeError::Config(_) => Failure {
                    status: EXIT_USAGE,
                    message: e.to_string(),
                },
                crate::daemon::ServeError::Startup(_) => Failure {
                    status: EXIT_ERROR,
                    message: e.to_string(),
                },
            })
        }
        "config" => config_cmd(&args, rest),
        "status" => {
            no_more(rest)?;
            status(&args)
        }
        "call" => call(&args, rest),
        "plugin" => plugin::run(|| connect(&args), args.json, rest),
        "seats" => sessions::seats(|| connect(&args), args.json, rest),
        "sessions" => sessions::sessions(|| connect(&args), args.json, rest),
        "attach" => attach::attach(&socket_path(&args)?, rest),
        "approvals" => sessions::approvals(|| connect(&args), args.json, rest),
        "lanes" => lanes::lanes(|| connect(&args), args.json, rest),
        "repos" => lanes::repos(|| connect(&args), args.json, rest),
        "lock" => lock::lock(|| connect(&args), args.json, rest),
        "events" => events(&args, rest),
        "gateway" => gateway::run(&args.flags, rest),
        "pair" => pair::pair(|| connect_operator(&args), args.json, rest),
        "clients" => pair::clients(|| connect_operator(&args), args.json, rest),
        "stop" => {
            no_more(rest)?;
            connect(&args)?.call("server.stop", json!({}))?;
            outln!("{}", if args.json { "null" } else { "stop requested" })
        }
        other => Err(Failure::usage(format!(
            "unknown command {other}\n{}",
            usage_text()
        ))),
    }
}

fn no_more(rest: &[String]) -> Result<(), Failure> {
    match rest.first() {
        None => Ok(()),
        Some(a) => Err(Failure::usage(format!("unexpected argument {a}"))),
    }
}

/// Finds the socket the way the daemon does, and connects.
fn connect(args: &Args) -> Result<Client, Failure> {
    Ok(Client::connect(&socket_path(args)?)?)
}

/// The daemon socket's path, found the way the daemon finds it.
fn socket_path(args: &Args) -> Result<PathBuf, Failure> {
    let env = config::Env::from_process();
    let (_, paths) = config::load_effective(&args.flags, &env)
        .map_err(|e| Failure::usage(format!("invalid configuration: {e}")))?;
    Ok(paths.socket)
}

/// The node socket when a daemon answers there, else the standalone
/// gateway's socket beside it (`pair`, `clients`).
fn connect_operator(args: &Args) -> Result<Client, Failure> {
    let env = config::Env::from_process();
    let (_, paths) = config::load_effective(&args.flags, &env)
        .map_err(|e| Failure::usage(format!("invalid configuration: {e}")))?;
    match Client::connect(&paths.socket) {
        Ok(c) => Ok(c),
        Err(first) => {
            let gw = crate::gateway::standalone::socket_path(&paths.socket);
            Client::connect(&gw).map_err(|_| Failure::from(first))
        }
    }
}

fn config_cmd(args: &Args, rest: &[String]) -> Result<(), Failure> {
    match rest.first().map(String::as_str) {
        Some("check") => {}
        Some(other) => {
            return Err(Failure::usage(format!(
                "unknown config command {other}; expected check"
            )));
        }
        None => return Err(Failure::usage("config needs a command: check")),
    }
    let path = match rest.get(1) {
        Some(p) => PathBuf::from(p),
        None => args
            .flags
            .config
            .clone()
            .unwrap_or_else(|| config::Env::from_process().default_config_path()),
    };
    no_more(&rest[2.min(rest.len())..])?;
    let cfg = if rest.get(1).is_none() && args.flags.config.is_none() && !path.exists() {
        eprintln!(
            "omniconfluxd: no config file at {}; the defaults are in force",
            path.display()
        );
        config::FileConfig::default()
    } else {
        config::load(&path).map_err(|e| Failure::usage(e.to_string()))?
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&cfg).unwrap_or_default())
    } else {
        out(format_args!("{}", cfg.to_toml()))
    }
}

fn status(args: &Args) -> Result<(), Failure> {
    let info = connect(args)?.call("server.info", json!({}))?;
    if args.json {
        return outln!("{info}");
    }
    let s = |v: &Value| {
        v.as_str()
            .map(str::to_string)
            .unwrap_or_else(|| v.to_string())
    };
    outln!("daemon {} is running", s(&info["version"]))?;
    outln!("instance    {}", s(&info["instance_id"]))?;
    outln!("started     {}", s(&info["started_at"]))?;
    outln!(
        "uptime      {}",
        human_duration(info["uptime_ms"].as_u64().unwrap_or(0))
    )?;
    outln!(
        "ledger      {} ({})",
        s(&info["ledger"]["path"]),
        s(&info["ledger"]["state"])
    )?;
    if let Some(reason) = info["ledger"]["reason"].as_str() {
        outln!("            {reason}")?;
    }
    if let Some(addr) = info["http"]["address"].as_str() {
        outln!("http        {addr}")?;
    }
    if let Some(addr) = info["gateway"]["address"].as_str() {
        outln!("gateway     {addr}")?;
    }
    let c = &info["counts"];
    outln!(
        "holds       {} events in {} streams, {} connections",
        c["events"],
        c["streams"],
        c["connections"]
    )?;
    outln!(
        "            {} sessions ({} live), {} approvals waiting, {} lanes, {} plugins ({} running), {} seats",
        c["sessions"],
        c["sessions_live"],
        c["approvals_pending"],
        c["lanes"],
        c["plugins"],
        c["plugins_running"],
        c["seats"]
    )?;
    if info["uplink"].is_object() {
        let u = &info["uplink"];
        outln!(
            "uplink      {} to {} since {}, {} channels",
            s(&u["state"]),
            s(&u["via"]),
            s(&u["since"]),
            u["channels"]
        )?;
        if let Some(e) = u["last_error"].as_str() {
            outln!("            last error: {e}")?;
        }
    }
    outln!("you are     {}", s(&info["caller"]["class"]))?;
    outln!("agents      {}", agent_isolation(&info["agent_isolation"]))?;
    Ok(())
}

/// How agents run, in words (`agent_isolation` of server.info and seats.list).
pub fn agent_isolation(v: &Value) -> String {
    match (v["mode"].as_str(), v["reason"].as_str()) {
        (Some("namespace"), _) => "contained, each in its own namespace".into(),
        (Some("pending"), _) => "not started until bubblewrap is probed".into(),
        (_, Some(why)) => format!("uncontained: {why}"),
        _ => "unknown".into(),
    }
}

fn human_duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {}m", s / 3600, (s / 60) % 60),
        _ => format!("{}d {}h", s / 86_400, (s / 3600) % 24),
    }
}

fn call(args: &Args, rest: &[String]) -> Result<(), Failure> {
    let method = rest
        .first()
        .ok_or_else(|| Failure::usage("call needs a METHOD"))?;
    let params = match rest.get(1) {
        None => json!({}),
        Some(text) => {
            let v: Value = serde_json::from_str(text)
                .map_err(|e| Failure::usage(format!("PARAMS-JSON is not JSON: {e}")))?;
            if !v.is_object() {
                return Err(Failure::usage("PARAMS-JSON must be a JSON object"));
            }
            v
        }
    };
    no_more(&rest[2.min(rest.len())..])?;
    let result = connect(args)?.call(method, params)?;
    if args.json {
        outln!("{result}")
    } else {
        outln!(
            "{}",
            serde_json::to_string_pretty(&result).unwrap_or_default()
        )
    }
}

fn events(args: &Args, rest: &[String]) -> Result<(), Failure> {
    let mut stream = None;
    let mut after: i64 = 0;
    let mut follow = false;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--stream" => {
                stream = Some(
                    it.next()
                        .ok_or_else(|| Failure::usage("--stream needs a value"))?
                        .clone(),
                )
            }
            "--after" => {
                let v = it
                    .next()
                    .ok_or_else(|| Failure::usage("--after needs a value"))?;
                after = v.parse().map_err(|_| {
                    Failure::usage(format!("--after needs a whole number, found {v}"))
                })?;
            }
            "--follow" | "-f" => follow = true,
            other => return Err(Failure::usage(format!("unexpected argument {other}"))),
        }
    }
    if stream.is_none() && !follow {
        return Err(Failure::usage(
            "events needs --stream S, or --follow for every stream",
        ));
    }
    let mut client = connect(args)?;
    let print = |ev: &Value| outln!("{ev}");
    // Subscribe before reading history so that nothing committed in between
    // is missed; events seen in both are printed once, by seq.
    let mut live = Vec::new();
    if follow {
        let params = match &stream {
            Some(s) => json!({"streams": [s]}),
            None => json!({}),
        };
        client.call_with("events.subscribe", params, |n| {
            live.push(n["params"].clone())
        })?;
    }
    let mut last = after;
    if let Some(s) = &stream {
        loop {
            let page = client.call_with(
                "events.list",
                json!({"stream": s, "after_seq": last, "limit": 1000}),
                |n| live.push(n["params"].clone()),
            )?;
            for ev in page["events"].as_array().into_iter().flatten() {
                print(ev)?;
                last = ev["seq"].as_i64().unwrap_or(last);
            }
            if page["next_after_seq"].is_null() {
                break;
            }
        }
    }
    if !follow {
        return Ok(());
    }
    let fresh = |ev: &Value, last: i64| stream.is_none() || ev["seq"].as_i64().unwrap_or(0) > last;
    for ev in live.drain(..) {
        if fresh(&ev, last) {
            print(&ev)?;
        }
    }
    while let Some(frame) = client.read_frame()? {
        if frame["method"] == "event" && fresh(&frame["params"], last) {
            print(&frame["params"])?;
        }
    }
    Ok(())
}
