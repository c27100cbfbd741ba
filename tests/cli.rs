//! The command line as a user of well-made CLIs meets it (issue 9):
//! `--version`, `help`, `COMMAND --help` and an unknown command, through the
//! real binary. None of these asks a daemon: each runs with a socket no
//! daemon listens on, so a command that tried to run would exit 3.

mod util;

use util::{TestDir, cli_commands, run_cli};

/// Runs the binary with a socket where no daemon answers.
fn cli(dir: &TestDir, args: &[&str]) -> (i32, String, String) {
    let sock = dir.join("none.sock").display().to_string();
    let mut all = vec!["--socket", sock.as_str()];
    all.extend_from_slice(args);
    run_cli(&all)
}

#[test]
fn version_answers_with_the_crate_version() {
    let dir = TestDir::new("cliversion");
    let want = format!("omniconfluxd {}\n", env!("CARGO_PKG_VERSION"));
    for args in [&["--version"][..], &["-V"], &["version"], &["status", "-V"]] {
        assert_eq!(
            cli(&dir, args),
            (0, want.clone(), String::new()),
            "{args:?}"
        );
    }
    let json = format!("{{\"version\":\"{}\"}}\n", env!("CARGO_PKG_VERSION"));
    for args in [&["--version", "--json"][..], &["--json", "version"]] {
        assert_eq!(
            cli(&dir, args),
            (0, json.clone(), String::new()),
            "{args:?}"
        );
    }
}

#[test]
fn help_lists_every_command() {
    let dir = TestDir::new("clihelp");
    let (code, out, err) = cli(&dir, &["help"]);
    assert_eq!((code, err.as_str()), (0, ""), "{out}");
    assert!(
        out.starts_with("usage: omniconfluxd [OPTIONS] COMMAND"),
        "{out}"
    );
    for flag in ["--help", "-h"] {
        assert_eq!(
            cli(&dir, &[flag]),
            (0, out.clone(), String::new()),
            "{flag}"
        );
    }
    for cmd in cli_commands() {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("  {cmd} ")) || l == format!("  {cmd}")),
            "help does not list {cmd}:\n{out}"
        );
    }
    for option in [
        "--config",
        "--state-dir",
        "--socket",
        "--json",
        "--help",
        "--version",
    ] {
        assert!(out.contains(option), "help does not name {option}:\n{out}");
    }
}

#[test]
fn every_command_prints_its_own_usage_and_runs_nothing() {
    let dir = TestDir::new("clicmdhelp");
    for cmd in cli_commands() {
        let (code, out, err) = cli(&dir, &["help", &cmd]);
        assert_eq!((code, err.as_str()), (0, ""), "help {cmd}: {out}");
        assert!(
            out.starts_with(&format!("usage: omniconfluxd [OPTIONS] {cmd} ...\n  {cmd}")),
            "help {cmd}:\n{out}"
        );
        // The same from `COMMAND --help` and `COMMAND -h`, also after the
        // command's own arguments; `stop --help` stops nothing.
        for args in [
            vec![cmd.as_str(), "--help"],
            vec![cmd.as_str(), "-h"],
            vec!["--help", cmd.as_str()],
            vec![cmd.as_str(), "list", "--help"],
        ] {
            assert_eq!(
                cli(&dir, &args),
                (0, out.clone(), String::new()),
                "{args:?}"
            );
        }
    }
    let (_, lanes, _) = cli(&dir, &["lanes", "--help"]);
    assert!(lanes.contains("  lanes dispatch --repo R"), "{lanes}");
    let (_, plugin, _) = cli(&dir, &["plugin", "--help"]);
    assert!(plugin.contains("  plugin install PATH"), "{plugin}");
}

#[test]
fn an_unknown_command_is_a_usage_error() {
    let dir = TestDir::new("cliunknown");
    let (code, out, err) = cli(&dir, &["frobnicate"]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(
        err.starts_with("omniconfluxd: unknown command frobnicate\n"),
        "{err}"
    );
    assert!(
        err.contains("usage: omniconfluxd [OPTIONS] COMMAND"),
        "{err}"
    );
    let (code, out, err) = cli(&dir, &["help", "frobnicate"]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert_eq!(
        err,
        "omniconfluxd: unknown command frobnicate; omniconfluxd help lists the commands\n"
    );
    let (code, out, err) = cli(&dir, &["frobnicate", "--help"]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    let (code, _, err) = cli(&dir, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.starts_with("omniconfluxd: no command given\n"), "{err}");
}

#[test]
fn after_a_double_dash_help_is_an_argument() {
    let dir = TestDir::new("clidashes");
    // `call -- --help` sends the method "--help": the client goes to the
    // socket, where no daemon answers.
    let (code, out, err) = cli(&dir, &["call", "--", "--help"]);
    assert_eq!((code, out.as_str()), (3, ""), "{err}");
}
