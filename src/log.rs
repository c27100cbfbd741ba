//! The daemon's log: one line per record on standard error, which the service
//! manager (journald) or the operator's terminal keeps. The daemon never opens
//! log files of its own. Lines are `LEVEL: message`; messages are lowercase,
//! one line, and never carry a token or another session's data.

use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};

/// Severity of a record, in the order the config's `log_level` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        match s {
            "error" => Some(Level::Error),
            "warn" => Some(Level::Warn),
            "info" => Some(Level::Info),
            "debug" => Some(Level::Debug),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);

/// Sets the most verbose level that is written; SIGHUP may change it.
pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Writes one record. Line breaks in the message are replaced so that one
/// record is always one line for journald and for scripts reading the log.
pub fn write(level: Level, args: std::fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let mut text = args.to_string();
    if text.contains(['\n', '\r']) {
        text = text.replace(['\n', '\r'], " ");
    }
    // <N> prefixes are the sd-daemon(3) priority markers journald understands;
    // a terminal shows them as harmless text, so they are only added under a
    // service manager.
    let prefix = if std::env::var_os("JOURNAL_STREAM").is_some() {
        match level {
            Level::Error => "<3>",
            Level::Warn => "<4>",
            Level::Info => "<6>",
            Level::Debug => "<7>",
        }
    } else {
        ""
    };
    let _ = writeln!(std::io::stderr().lock(), "{prefix}{}: {text}", level.name());
}

#[macro_export]
macro_rules! error { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Error, format_args!($($t)*)) } }
#[macro_export]
macro_rules! warn { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Warn, format_args!($($t)*)) } }
#[macro_export]
macro_rules! info { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Info, format_args!($($t)*)) } }
#[macro_export]
macro_rules! debug { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Debug, format_args!($($t)*)) } }
