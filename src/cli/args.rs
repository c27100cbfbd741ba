//! Small helpers the client subcommands share to read their arguments and
//! print values: a usage failure (exit 2), the Nth argument or a clear
//! "missing" error, nothing after the last expected argument, and a JSON
//! value as one plain word for a person ("-" for null).

use serde_json::Value;

use super::Failure;

pub fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

pub fn usage(m: &str) -> Failure {
    Failure {
        status: super::EXIT_USAGE,
        message: m.to_string(),
    }
}

pub fn arg<'a>(rest: &'a [String], i: usize, what: &str) -> Result<&'a str, Failure> {
    rest.get(i)
        .map(String::as_str)
        .ok_or_else(|| usage(&format!("missing {what}")))
}

pub fn done(rest: &[String], n: usize) -> Result<(), Failure> {
    match rest.get(n) {
        Some(a) => Err(usage(&format!("unexpected argument {a}"))),
        None => Ok(()),
    }
}
