//! The `omniconfluxd` binary: the daemon and its command line in one. All the
//! work is in the library; this turns its outcome into an exit status.

fn main() {
    std::process::exit(omniconfluxd::cli::run(
        std::env::args_os().skip(1).collect(),
    ));
}
