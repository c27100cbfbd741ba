//! `omniconfluxd gateway [--listen ADDR]`: runs the gateway role alone, in
//! the foreground (issue 12; [`crate::gateway::standalone`] says what it
//! serves and where its state is).

use super::Failure;
use crate::config::PathFlags;
use crate::gateway::standalone::{self, RunError};

pub const USAGE: &str =
    "gateway [--listen ADDR]      run the gateway role alone, in the foreground;
                              ADDR is IP:PORT or an IP (port 8443); default
                              [gateway] listen, else 127.0.0.1:8443";

pub fn run(flags: &PathFlags, rest: &[String]) -> Result<(), Failure> {
    let mut flags = flags.clone();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--listen" => {
                let v = it
                    .next()
                    .ok_or_else(|| Failure::usage("--listen needs an address, IP:PORT or IP"))?;
                flags.gateway_listen = Some(v.clone());
            }
            other => return Err(Failure::usage(format!("unexpected argument {other}"))),
        }
    }
    standalone::run(&flags).map_err(|e| match e {
        RunError::Config(m) => Failure::usage(m),
        RunError::Startup(m) => Failure {
            status: super::EXIT_ERROR,
            message: m,
        },
    })
}
