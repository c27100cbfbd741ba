//! The benchmark harness: `cargo bench --bench bench` (see README.md beside
//! this file). It starts the real daemon binary, runs each figure and its
//! baseline interleaved round by round, and prints one `BENCH {json}` line
//! per figure (and placement) on standard output. It never asserts: a missed
//! goal is `"pass": false`, a missing baseline tool is `"skipped"`.
//!
//! `BENCH_FILTER=substring` runs only the figures whose name contains it;
//! `BENCH_QUICK=1` runs fewer and shorter rounds.
//!
//! Each figure is a module; a later issue adds its figures as a module and
//! one line in `main`.

mod append;
mod callgrind;
mod contain_bench;
mod e2ee_bench;
mod fanout;
mod gateway_bench;
mod http_bench;
mod idle;
mod lanes_bench;
mod link_order;
mod ping;
mod plugins_bench;
mod sessions_mem;
mod start;
mod tmux_bench;
mod trustlog_bench;
mod uplink_bench;
mod util;

fn main() {
    // `cargo bench` passes `--bench`; with `harness = false` we ignore it.
    let t0 = std::time::Instant::now();
    eprintln!(
        "bench: daemon {}, temp dirs under {}, {}",
        util::daemon_bin().display(),
        util::target_dir().join("bench-tmp").display(),
        if util::quick() {
            "quick rounds"
        } else {
            "full rounds"
        }
    );
    util::sweep_stale_temp_dirs();
    idle::run();
    start::run();
    ping::run();
    append::run();
    callgrind::run();
    callgrind::run_storage_get();
    link_order::run();
    fanout::run();
    sessions_mem::run();
    plugins_bench::run();
    lanes_bench::run();
    http_bench::run();
    contain_bench::run();
    e2ee_bench::run();
    trustlog_bench::run();
    gateway_bench::run();
    tmux_bench::run();
    uplink_bench::run();
    // Remove the parent of the per-run directories when nothing is left.
    let _ = std::fs::remove_dir(util::target_dir().join("bench-tmp"));
    eprintln!("bench: done in {:.0} s", t0.elapsed().as_secs_f64());
}
