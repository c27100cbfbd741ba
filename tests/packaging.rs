//! The shipped documentation cannot drift from the code: the example config
//! passes `omniconfluxd config check` and sets every key to its default; every
//! key of the config is in the example and in omniconfluxd.toml(5), with the
//! reload rule `config::diff` applies; every stable error code and every
//! socket method is in omniconfluxd(8). packaging/install honours its
//! settings and keeps an operator's config; the shell completions offer
//! every command. Std only; nothing here sleeps.

mod util;

use std::path::{Path, PathBuf};
use std::process::Command;

use omniconfluxd::config::{self, FileConfig};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("unable to read {}: {e}", p.display()))
}

/// `(section, key, default value as TOML)` for every key, from the defaults
/// the crate prints; a key added to the code shows up here by itself.
fn keys() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    for line in FileConfig::default().to_toml().lines() {
        let line = line.trim();
        if let Some(s) = line.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = s.to_string();
        } else if let Some((k, v)) = line.split_once('=') {
            out.push((section.clone(), k.trim().to_string(), v.trim().to_string()));
        }
    }
    assert!(out.len() >= 7, "expected the config's keys, found {out:?}");
    out
}

/// The lines of `text` between the line `start` and the next line starting
/// with `next`.
fn block<'a>(text: &'a str, start: &str, next: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| l.trim() != start)
        .skip(1)
        .take_while(|l| !l.starts_with(next))
        .collect()
}

#[test]
fn example_config_passes_config_check() {
    let example = root().join("packaging/omniconfluxd.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_omniconfluxd"))
        .args(["config", "check"])
        .arg(&example)
        .output()
        .expect("run omniconfluxd config check");
    assert!(
        out.status.success(),
        "config check of {} failed: {}",
        example.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    // It prints the effective config: the example changes nothing.
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        FileConfig::default().to_toml()
    );
}

#[test]
fn example_config_sets_every_key_to_its_default() {
    let text = read("packaging/omniconfluxd.toml");
    let cfg = config::parse(&text).unwrap_or_else(|e| panic!("packaging/omniconfluxd.toml: {e}"));
    cfg.check(&text)
        .unwrap_or_else(|e| panic!("packaging/omniconfluxd.toml: {e}"));
    assert_eq!(
        cfg,
        FileConfig::default(),
        "the example must show the defaults"
    );
    for (section, key, value) in keys() {
        let lines = block(&text, &format!("[{section}]"), "[");
        let written = lines.iter().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (!l.trim_start().starts_with('#') && k.trim() == key).then(|| v.trim())
        });
        assert_eq!(
            written,
            Some(value.as_str()),
            "packaging/omniconfluxd.toml must set {section}.{key} = {value}"
        );
    }
}

#[test]
fn every_key_is_in_the_toml_man_page_with_default_and_reload_rule() {
    let page = read("man/omniconfluxd.toml.5");
    for (section, key, value) in keys() {
        let lines = block(&page, &format!(".SH \"[{section}]\""), ".SH");
        let entry: Vec<&str> = lines
            .iter()
            .skip_while(|l| **l != format!(".B {key}"))
            .skip(1)
            .take_while(|l| **l != ".TP")
            .copied()
            .collect();
        assert!(
            !entry.is_empty(),
            "omniconfluxd.toml(5) has no entry `.B {key}` under [{section}]"
        );
        let entry = entry.join("\n");
        assert!(
            entry.contains(&format!("Default: \\fB{value}\\fR")),
            "omniconfluxd.toml(5) must give {section}.{key} the default {value}:\n{entry}"
        );
        // Change the key alone and ask the code whether a reload applies it.
        let changed = match value.as_str() {
            v if v.starts_with('"') => "\"changed\"".to_string(),
            // An array (http.allowed_origins) defaults to empty: one item changes it.
            v if v.starts_with('[') => "[\"changed\"]".to_string(),
            "true" => "false".to_string(),
            "false" => "true".to_string(),
            v => (v.parse::<i64>().expect("an integer default") - 1).to_string(),
        };
        let new = config::parse(&format!("[{section}]\n{key} = {changed}\n"))
            .expect("a changed value parses");
        let report = config::diff(&FileConfig::default(), &new);
        let full = format!("{section}.{key}");
        let rule = if report.applied.contains(&full) {
            "Reload: live"
        } else if report.needs_restart.contains(&full) {
            "Reload: restart"
        } else {
            panic!("config::diff does not report {full}")
        };
        assert!(
            entry.contains(rule),
            "omniconfluxd.toml(5) must say `{rule}` for {full}:\n{entry}"
        );
    }
}

/// The quoted strings of `src` that follow `=> "` on a line containing `marker`.
fn quoted_after_arrow(src: &str, marker: &str) -> Vec<String> {
    src.lines()
        .filter(|l| l.contains(marker))
        .filter_map(|l| {
            let rest = &l[l.find("=> \"")? + 4..];
            Some(rest[..rest.find('"')?].to_string())
        })
        .collect()
}

#[test]
fn every_error_code_and_method_is_in_the_daemon_man_page() {
    let page = read("man/omniconfluxd.8");
    let errors = block(&page, ".SH ERRORS", ".SH").join("\n");
    let codes = quoted_after_arrow(&read("src/errors.rs"), "Code::");
    assert!(
        codes.len() >= 12,
        "expected the stable codes of src/errors.rs, found {codes:?}"
    );
    for code in codes {
        assert!(
            errors
                .lines()
                .any(|l| l.split('\t').next() == Some(code.as_str())),
            "omniconfluxd(8) ERRORS has no row for {code}"
        );
    }
    let protocol = block(&page, ".SH SOCKET PROTOCOL", ".SH").join("\n");
    let exchanges = block(&page, ".SS Exchanges", ".S");
    // The dispatch table's arms: `"server.info" => server_info(d, &req, p),`.
    let methods: Vec<String> = read("src/socket/methods/mod.rs")
        .lines()
        .filter(|l| l.contains("(d, &req, p)") && l.trim_start().starts_with('"'))
        .filter_map(|l| l.trim_start().split('"').nth(1).map(str::to_string))
        .collect();
    assert!(
        methods.len() >= 6,
        "expected the methods of src/socket/methods/mod.rs, found {methods:?}"
    );
    for m in methods.iter().chain(std::iter::once(&"ping".to_string())) {
        assert!(
            protocol
                .lines()
                .any(|l| l.split('\t').next() == Some(m.as_str())),
            "omniconfluxd(8) has no table row for {m}"
        );
        let shown = exchanges
            .windows(3)
            .any(|w| w[0] == format!(".B {m}") && w[1..].contains(&".EX"));
        assert!(shown, "omniconfluxd(8) Exchanges has no exchange for {m}");
    }
}

#[test]
fn units_run_the_daemon_in_the_foreground_with_reload() {
    for unit in [
        "packaging/omniconfluxd.service",
        "packaging/omniconfluxd-user.service",
    ] {
        let text = read(unit);
        for line in [
            "Type=notify",
            "ExecStart=/usr/bin/omniconfluxd serve",
            "ExecReload=/bin/kill -HUP $MAINPID",
        ] {
            assert!(text.lines().any(|l| l == line), "{unit} must have {line}");
        }
    }
    assert!(Path::new(&root().join("packaging/omniconflux.sysusers")).exists());
    assert!(Path::new(&root().join("packaging/omniconflux.tmpfiles")).exists());
}

/// A user manager's PATH lacks ~/.local/bin, where Claude Code's native
/// installer puts `claude`: the user unit sets one that has it, first, and
/// still ends in the system directories; the man page says how to extend it.
#[test]
fn the_user_unit_finds_agents_in_the_operators_local_bin() {
    let unit = read("packaging/omniconfluxd-user.service");
    let paths: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.strip_prefix("Environment=PATH="))
        .collect();
    assert_eq!(
        paths,
        ["%h/.local/bin:/usr/local/bin:/usr/bin:/bin"],
        "one PATH, ~/.local/bin first"
    );
    assert!(
        !read("packaging/omniconfluxd.service").contains("%h/"),
        "the system unit's user has no home of its own to search"
    );
    let page = read("man/omniconfluxd.8");
    assert!(page.contains("systemctl \\-\\-user edit omniconfluxd"));
}

/// Runs packaging/install with `settings` as NAME=VALUE arguments.
fn install(settings: &[(&str, String)]) -> (i32, String, String) {
    let out = Command::new("sh")
        .arg(root().join("packaging/install"))
        .args(settings.iter().map(|(k, v)| format!("{k}={v}")))
        .env_remove("DESTDIR")
        .env_remove("PREFIX")
        .env_remove("SYSCONFDIR")
        .env_remove("BIN")
        .env_remove("COMPRESS_MAN")
        .output()
        .expect("run packaging/install");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn install_honours_prefix_sysconfdir_and_bin_and_keeps_a_config() {
    let dir = util::TestDir::new("pkginstall");
    let dest = dir.join("stage");
    let mine = dest.join("usr/local/etc/omniconflux/omniconfluxd.toml");
    std::fs::create_dir_all(mine.parent().unwrap()).unwrap();
    std::fs::write(&mine, "# the operator's own\n").unwrap();
    let bin = env!("CARGO_BIN_EXE_omniconfluxd");
    let (code, out, err) = install(&[
        ("DESTDIR", dest.display().to_string()),
        ("PREFIX", "/usr/local".into()),
        ("SYSCONFDIR", "/usr/local/etc".into()),
        ("BIN", bin.into()),
        ("COMPRESS_MAN", "gzip".into()),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "/usr/local/bin/omniconfluxd",
            "/usr/local/share/man/man8/omniconfluxd.8.gz",
            "/usr/local/share/man/man5/omniconfluxd.toml.5.gz",
            "/usr/local/share/man/man7/omniconflux-plugin.7.gz",
            "/usr/local/lib/systemd/system/omniconfluxd.service",
            "/usr/local/lib/systemd/user/omniconfluxd.service",
            "/usr/local/lib/sysusers.d/omniconflux.conf",
            "/usr/local/lib/tmpfiles.d/omniconflux.conf",
            "/usr/local/share/bash-completion/completions/omniconfluxd",
            "/usr/local/share/zsh/site-functions/_omniconfluxd",
        ]
    );
    // The operator's config is kept, and both warnings say why.
    assert_eq!(
        std::fs::read_to_string(&mine).unwrap(),
        "# the operator's own\n"
    );
    assert!(
        err.contains("omniconfluxd.toml exists and is kept"),
        "{err}"
    );
    assert!(
        err.contains("the system unit reads /etc/omniconflux/omniconfluxd.toml"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(dest.join("usr/local/bin/omniconfluxd")).unwrap(),
        std::fs::read(bin).unwrap()
    );
    for unit in ["system", "user"] {
        let text = std::fs::read_to_string(
            dest.join(format!("usr/local/lib/systemd/{unit}/omniconfluxd.service")),
        )
        .unwrap();
        assert!(
            text.lines()
                .any(|l| l == "ExecStart=/usr/local/bin/omniconfluxd serve"),
            "{unit} unit:\n{text}"
        );
    }
    for (section, page) in [
        ("8", "omniconfluxd.8"),
        ("5", "omniconfluxd.toml.5"),
        ("7", "omniconflux-plugin.7"),
    ] {
        let gz = dest.join(format!("usr/local/share/man/man{section}/{page}.gz"));
        let out = Command::new("gzip").arg("-dc").arg(&gz).output().unwrap();
        assert!(out.status.success(), "gzip -dc {}", gz.display());
        assert_eq!(
            out.stdout,
            read(&format!("man/{page}")).into_bytes(),
            "{page}"
        );
    }
}

#[test]
fn install_refuses_a_missing_binary_and_unknown_settings() {
    let dir = util::TestDir::new("pkgrefuse");
    let dest = ("DESTDIR", dir.join("stage").display().to_string());
    let (code, _, err) = install(&[
        dest.clone(),
        ("BIN", dir.join("none").display().to_string()),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cargo build --release --locked"), "{err}");
    let (code, _, err) = install(&[dest.clone(), ("DESTNIR", "x".into())]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unknown argument DESTNIR=x"), "{err}");
    let (code, _, err) = install(&[dest, ("PREFIX", "usr".into())]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("PREFIX must be an absolute path"), "{err}");
    assert!(
        !dir.join("stage").exists(),
        "nothing is installed after a refusal"
    );
}

/// What the bash completion offers for `words`, the last being completed.
fn bash_complete(words: &[&str]) -> Vec<String> {
    let out = Command::new("bash")
        .arg("-c")
        .arg(
            "source \"$0\"; COMP_WORDS=(\"$@\"); COMP_CWORD=$(($# - 1)); _omniconfluxd; \
             printf '%s\\n' \"${COMPREPLY[@]}\"",
        )
        .arg(root().join("packaging/completions/omniconfluxd.bash"))
        .args(words)
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "bash completion failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completion_offers_every_command() {
    let offered = bash_complete(&["omniconfluxd", "--json", ""]);
    let mut commands = util::cli_commands();
    commands.sort();
    let mut got = offered.clone();
    got.sort();
    assert_eq!(got, commands, "bash completion of a command");
    assert_eq!(
        bash_complete(&["omniconfluxd", "--socket", "/s", "lanes", ""]),
        ["list", "show", "close", "merge", "rework", "dispatch"]
    );
    assert_eq!(
        bash_complete(&["omniconfluxd", "lanes", "dispatch", "--rep"]),
        ["--repo"]
    );
    assert_eq!(bash_complete(&["omniconfluxd", "--ver"]), ["--version"]);
}

#[test]
fn zsh_completion_describes_every_command() {
    let path = root().join("packaging/completions/_omniconfluxd");
    let text = read("packaging/completions/_omniconfluxd");
    assert!(text.starts_with("#compdef omniconfluxd\n"));
    for cmd in util::cli_commands() {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("'{cmd}:"))),
            "_omniconfluxd does not describe {cmd}"
        );
    }
    let Some(zsh) = util::need::have(util::need::program("zsh"), "the Debian package zsh") else {
        return;
    };
    let out = Command::new(zsh).arg("-n").arg(&path).output().unwrap();
    assert!(
        out.status.success(),
        "zsh -n {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_command_and_option_is_in_the_daemon_man_page() {
    let page = read("man/omniconfluxd.8");
    let synopsis = block(&page, ".SH SYNOPSIS", ".SH");
    for cmd in util::cli_commands() {
        assert!(
            synopsis.contains(&format!(".B omniconfluxd {cmd}").as_str())
                || synopsis
                    .iter()
                    .any(|l| l.starts_with(&format!(".B omniconfluxd {cmd} "))),
            "omniconfluxd(8) SYNOPSIS has no line for {cmd}"
        );
    }
    let options = block(&page, ".SH OPTIONS", ".SH").join("\n");
    for option in [
        "\\-\\-config",
        "\\-\\-state\\-dir",
        "\\-\\-socket",
        "\\-\\-json",
        ".BR \\-h \", \" \\-\\-help\n",
        ".BR \\-V \", \" \\-\\-version\n",
        ".B \\-\\-\n",
    ] {
        assert!(
            options.contains(option),
            "omniconfluxd(8) OPTIONS does not give {option}"
        );
    }
}
