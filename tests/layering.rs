//! The layering of the source tree (DESIGN.md, "How subsystems talk";
//! issue 11, Acceptance): no domain module names the daemon or a surface.
//! The domain is every file under src/core/, src/lanes/, src/plugins/ (but
//! the plugin wire's own files, whose names hold `wire` or `view`: they are
//! the plugin surface), src/agents/, src/ledger/, src/lock/, src/tmux/,
//! and the protocol cores src/e2ee/ and src/trustlog/. A file names a module
//! when its text holds `crate::MODULE`, or `crate::{` with MODULE in the
//! braces, comments included: a doc link to a surface is a dependency too.
//!
//! `crate::daemon`, `crate::socket` and `crate::http` are refused in every
//! domain file: a subsystem takes `&mut self` and a read-only context and
//! returns effects, which the router in src/daemon/ applies (issue 11).

use std::path::{Path, PathBuf};

/// The domain's folders, from the crate root.
const DOMAIN: &[&str] = &[
    "src/core",
    "src/lanes",
    "src/plugins",
    "src/agents",
    "src/ledger",
    "src/e2ee",
    "src/trustlog",
    "src/lock",
    "src/tmux",
];

/// Modules no domain file may name: the state owner and the surfaces.
const OUTSIDE: &[&str] = &["daemon", "socket", "http"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, as paths from the crate root.
fn rust_files(dir: &Path, out: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        let rel = p
            .strip_prefix(root())
            .expect("under the root")
            .to_path_buf();
        if p.is_dir() {
            rust_files(&rel, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(rel.to_string_lossy().into_owned());
        }
    }
}

/// Whether the plugin surface's own file: a wire or view file of src/plugins/.
fn plugin_surface(path: &str) -> bool {
    path.starts_with("src/plugins/")
        && Path::new(path)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.contains("wire") || n.contains("view"))
}

/// Whether `text` names `crate::module`, directly or in a `crate::{...}`
/// group.
fn names(text: &str, module: &str) -> bool {
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let direct = format!("crate::{module}");
    let at_boundary = |s: &str, i: usize, len: usize| {
        s.as_bytes().get(i + len).is_none_or(|b| !ident(*b))
            && (i == 0 || !ident(s.as_bytes()[i - 1]))
    };
    if text
        .match_indices(&direct)
        .any(|(i, m)| at_boundary(text, i, m.len()))
    {
        return true;
    }
    // A group's top level only: `crate::{plugins::{daemon}}` is another
    // module's item.
    text.match_indices("crate::{").any(|(i, m)| {
        let mut depth = 0usize;
        let mut top = String::new();
        for c in text[i + m.len()..].chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                c if depth == 0 => top.push(c),
                _ => {}
            }
        }
        top.split(',').any(|item| {
            let item = item.trim();
            item == module
                || item
                    .strip_prefix(module)
                    .is_some_and(|r| r.starts_with("::") || r.starts_with(" as "))
        })
    })
}

fn domain_files() -> Vec<String> {
    let mut files = Vec::new();
    for dir in DOMAIN {
        rust_files(Path::new(dir), &mut files);
    }
    assert!(
        files.len() >= 20,
        "expected the domain's sources, found {files:?}"
    );
    files.retain(|f| !plugin_surface(f));
    files
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

#[test]
fn no_domain_file_names_the_daemon_or_a_surface() {
    let mut found = Vec::new();
    for f in domain_files() {
        let text = read(&f);
        for m in OUTSIDE {
            if names(&text, m) {
                found.push(format!("{f} names crate::{m}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the domain must not reach into the daemon or a surface; return \
         effects for the router, or a typed value and let the surface \
         build its wire:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_every_way_of_naming_a_module() {
    assert!(names("use crate::http::Answer;", "http"));
    assert!(names("crate::socket::views::seat(s)", "socket"));
    assert!(names("use crate::{config, daemon::Daemon};", "daemon"));
    assert!(names(
        "use crate::{\n    daemon,\n    limits,\n};",
        "daemon"
    ));
    assert!(names("/// [`crate::http`] hears it", "http"));
    // Other modules whose names start or end the same are not these.
    assert!(!names("use crate::https_like::X;", "http"));
    assert!(!names("use crate::{daemonic, limits};", "daemon"));
    assert!(!names("use crate::plugins::socket_helper;", "socket"));
    assert!(!names("use crate::{config, limits};", "daemon"));
    assert!(names("use crate::{plugins::{a, b}, http::Reply};", "http"));
    assert!(!names("use crate::{plugins::{http, b}, limits};", "http"));
}
