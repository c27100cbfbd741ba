//! A blocking client of the daemon socket for the command line: one
//! connection, requests with rising integer ids, and notifications passed to
//! the caller while it waits (seed 004 framing).

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::errors::io_cause;
use crate::limits;

pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
}

/// A failed call, narrowed to the exit status it means.
#[derive(Debug)]
pub enum CallError {
    /// No daemon answers on the socket (exit 3).
    NoDaemon(String),
    /// The daemon answered with an error (exit 1): stable code and message.
    Daemon {
        code: String,
        message: String,
        data: Value,
    },
    /// The connection broke or a line was not a reply (exit 1).
    Protocol(String),
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client, CallError> {
        let stream = UnixStream::connect(path).map_err(|e| {
            CallError::NoDaemon(format!(
                "no daemon answers on {}: {}",
                path.display(),
                io_cause(&e)
            ))
        })?;
        let writer = stream
            .try_clone()
            .map_err(|e| CallError::Protocol(io_cause(&e)))?;
        Ok(Client {
            reader: BufReader::new(stream),
            writer,
            next_id: 1,
        })
    }

    /// A client of a connection already made (`attach`, which reads
    /// with it on one thread and writes on another clone).
    pub fn from_stream(stream: UnixStream) -> std::io::Result<Client> {
        Ok(Client {
            writer: stream.try_clone()?,
            reader: BufReader::new(stream),
            next_id: 1,
        })
    }

    /// Sends a request and waits for its reply; notifications that arrive
    /// meanwhile go to `on_note`.
    pub fn call_with(
        &mut self,
        method: &str,
        params: Value,
        mut on_note: impl FnMut(&Value),
    ) -> Result<Value, CallError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut line = serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .map_err(|e| CallError::Protocol(e.to_string()))?;
        line.push(b'\n');
        self.writer.write_all(&line).map_err(|e| {
            CallError::Protocol(format!("unable to send {method}: {}", io_cause(&e)))
        })?;
        loop {
            let msg = self.read_frame()?.ok_or_else(|| {
                CallError::Protocol(format!(
                    "the daemon closed the connection before answering {method}"
                ))
            })?;
            if msg.get("method").is_some() && msg.get("id").is_none() {
                on_note(&msg);
                continue;
            }
            if msg.get("id") == Some(&json!(id))
                || (msg.get("id") == Some(&Value::Null) && msg.get("error").is_some())
            {
                if let Some(err) = msg.get("error") {
                    return Err(CallError::Daemon {
                        code: err["data"]["code"]
                            .as_str()
                            .unwrap_or("unknown")
                            .to_string(),
                        message: err["message"].as_str().unwrap_or("").to_string(),
                        data: err.get("data").cloned().unwrap_or(Value::Null),
                    });
                }
                return Ok(msg.get("result").cloned().unwrap_or(Value::Null));
            }
        }
    }

    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, CallError> {
        self.call_with(method, params, |_| {})
    }

    /// The next frame, or `None` at end of stream.
    pub fn read_frame(&mut self) -> Result<Option<Value>, CallError> {
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = (&mut self.reader)
                .take(limits::SOCKET_MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut buf)
                .map_err(|e| {
                    CallError::Protocol(format!("unable to read from the daemon: {}", io_cause(&e)))
                })?;
            if n == 0 {
                return Ok(None);
            }
            if buf.len() > limits::SOCKET_MAX_LINE {
                return Err(CallError::Protocol(
                    "the daemon sent a line over the limit".into(),
                ));
            }
            if buf.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            return serde_json::from_slice(&buf).map(Some).map_err(|e| {
                CallError::Protocol(format!("the daemon sent a line that is not JSON: {e}"))
            });
        }
    }
}
