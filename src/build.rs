//! Build script: lays out side by side in the release binary the functions
//! a plugin's `storage.get` runs, then those the daemon runs at start-up,
//! from the list in `src/link-order.txt`.
//!
//! Why the request path: a plugin's request that comes after a pause finds
//! the daemon's code out of the caches and the TLB, and its round trip is
//! mostly those misses (issue 11: about 20 us from the read to the write,
//! seen with perf, for some 6,000 instructions). Its 38 functions lay
//! scattered over the 7 MB of `.text`; placed first they span about
//! 215 KiB (a few of them are large, the reactor's loop and the host's call
//! table, and only parts of those run). `ratio_to_c_responder` of
//! `plugin_storage_get_vs_pipe`, nine alternating runs of each binary:
//! 0.894-1.205, median 1.03, against 0.88-1.249, median 1.21, without.
//!
//! Why start-up: an idle daemon's resident memory is mostly mapped code,
//! and the kernel maps code 64 KiB around each page it faults in
//! (fault-around). Start-up (config, the ledger's open, migrations and
//! integrity check, the threads) runs about 1,300 functions, 1 MB of code,
//! scattered over the 7 MB of `.text`, so nearly every 64 KiB window of it
//! became resident (4.2 MiB). Placed together they take 1.3 MiB (issue 11,
//! `idle_rss`).
//!
//! The list names symbols as the linker sees them. A name the binary no
//! longer has (a renamed function, another compiler or dependency version
//! hashes Rust symbols differently) is skipped by the linker, and that
//! function is placed as it would be without the list: the list can go
//! stale, never wrong. The benchmark figure `link_order_coverage` says how
//! much of start-up and of the request path the list still covers and
//! rewrites it (tests/bench/README.md).
//!
//! `--symbol-ordering-file` is LLD's (Rust links with it by default on
//! x86_64 Linux since 1.90); GNU ld has no such option. So the option is
//! used only when linking a probe program with it succeeds, with the same
//! compiler, target and flags as this build; otherwise the binary is linked
//! as before and the build says why in a warning.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn main() {
    println!("cargo:rerun-if-changed=src/link-order.txt");
    println!("cargo:rerun-if-changed=src/build.rs");
    // The list only pays where the code is laid out for use: the release
    // build. The debug build keeps its plain link (and needs no probe).
    if std::env::var("PROFILE").as_deref() != Ok("release") {
        return;
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let order = manifest.join("src").join("link-order.txt");
    let args = [
        format!("-Wl,--symbol-ordering-file={}", order.display()),
        "-Wl,--no-warn-symbol-ordering".to_string(),
    ];
    // `-Wl,` splits its argument on commas.
    if order.to_string_lossy().contains(',') {
        println!(
            "cargo:warning=start-up and request code not grouped: the checkout's path holds a comma"
        );
        return;
    }
    match probe(&args) {
        Ok(()) => {
            for a in &args {
                println!("cargo:rustc-link-arg-bins={a}");
            }
        }
        Err(why) => {
            println!(
                "cargo:warning=start-up and request code not grouped (idle memory and request latency are higher): {why}"
            )
        }
    }
}

/// Links an empty program with `args`, as this build links (compiler,
/// target, linker, flags), in OUT_DIR.
fn probe(args: &[String]) -> Result<(), String> {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = std::env::var("TARGET").map_err(|e| format!("no TARGET: {e}"))?;
    let mut cmd = Command::new(&rustc);
    cmd.args([
        "--crate-name",
        "link_order_probe",
        "--crate-type",
        "bin",
        "--target",
    ])
    .arg(&target)
    .arg("-o")
    .arg(out.join("link-order-probe"))
    .arg("-");
    if let Ok(flags) = std::env::var("CARGO_ENCODED_RUSTFLAGS") {
        cmd.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    }
    if let Some(linker) = std::env::var_os("RUSTC_LINKER") {
        cmd.arg("-C")
            .arg(format!("linker={}", Path::new(&linker).display()));
    }
    for a in args {
        cmd.arg("-C").arg(format!("link-arg={a}"));
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("unable to run {}: {e}", Path::new(&rustc).display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        stdin
            .write_all(b"fn main() {}\n")
            .map_err(|e| format!("unable to write the probe program: {e}"))?;
    }
    let done = child
        .wait_with_output()
        .map_err(|e| format!("unable to wait for the probe link: {e}"))?;
    if done.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&done.stderr);
    let first = stderr
        .lines()
        .find(|l| l.contains("error"))
        .unwrap_or("the linker refused the option");
    Err(format!(
        "the linker does not take --symbol-ordering-file ({})",
        first.trim()
    ))
}
