//! Test-side HTTP: hand-written HTTP/1.1 over std's TcpStream (no client
//! crate), a client-side SSE parser, and a validator for the JSON Schema
//! subset `vendor-schemas/openapi.yaml` uses.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};

use super::PATIENCE;

/// One response as read from the wire.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The problem code of an error answer.
    pub fn code(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        self.json()["code"].as_str().unwrap_or_default().to_string()
    }
}

/// A connection to the daemon's HTTP listener.
pub struct Conn {
    pub r: BufReader<TcpStream>,
    pub w: TcpStream,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).expect("connect to the HTTP listener");
        s.set_read_timeout(Some(PATIENCE)).expect("timeout");
        Conn {
            r: BufReader::new(s.try_clone().expect("clone")),
            w: s,
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.w.write_all(bytes).expect("write to the daemon");
    }

    /// Reads one response head; `None` when the connection closed first.
    pub fn read_head(&mut self) -> Option<(u16, Vec<(String, String)>)> {
        let mut line = String::new();
        match self.r.read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {line:?}"));
        let mut headers = Vec::new();
        loop {
            let mut l = String::new();
            self.r.read_line(&mut l).expect("header line");
            let l = l.trim_end_matches(['\r', '\n']);
            if l.is_empty() {
                break;
            }
            let (n, v) = l.split_once(':').expect("header colon");
            headers.push((n.to_string(), v.trim().to_string()));
        }
        Some((status, headers))
    }

    /// Reads one whole response (Content-Length bodies, or to the close).
    pub fn read(&mut self) -> Option<Resp> {
        let (status, headers) = self.read_head()?;
        let len = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse::<usize>().expect("length"));
        let mut body = Vec::new();
        match len {
            Some(n) => {
                body.resize(n, 0);
                self.r.read_exact(&mut body).expect("body");
            }
            None if status == 204 || status == 304 => {}
            None => {
                self.r.read_to_end(&mut body).expect("body");
            }
        }
        Some(Resp {
            status,
            headers,
            body,
        })
    }

    /// Whether the daemon closed the connection (end of stream next).
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.r.read(&mut b), Ok(0) | Err(_))
    }

    /// Whether the daemon still holds the connection open with nothing
    /// sent on it, this moment (a read would wait).
    pub fn open_and_quiet(&mut self) -> bool {
        if !self.r.buffer().is_empty() {
            return false;
        }
        self.w.set_nonblocking(true).expect("nonblocking");
        let mut b = [0u8; 1];
        let quiet =
            matches!(self.w.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        self.w.set_nonblocking(false).expect("blocking");
        quiet
    }
}

/// Builds a request text.
pub fn request(
    method: &str,
    target: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Vec<u8> {
    let mut out = format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n");
    for (n, v) in headers {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    if let Some(b) = body {
        out.push_str(&format!("Content-Length: {}\r\n", b.len()));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    if let Some(b) = body {
        bytes.extend_from_slice(b);
    }
    bytes
}

/// A client-side SSE parser (WHATWG HTML, "Parsing an event stream"):
/// lines end in CRLF, LF or CR, possibly split across reads, and UTF-8 is
/// decoded per complete line, so a character split across two reads is
/// whole. Lines and events past `max` bytes are refused.
pub struct SseParser {
    line: Vec<u8>,
    data: String,
    has_data: bool,
    after_cr: bool,
    started: bool,
    max: usize,
}

#[derive(Debug, PartialEq, Eq)]
pub enum SseError {
    TooLarge,
    NotUtf8,
}

impl SseParser {
    pub fn new(max: usize) -> SseParser {
        SseParser {
            line: Vec::new(),
            data: String::new(),
            has_data: false,
            after_cr: false,
            started: false,
            max,
        }
    }

    /// Feeds bytes; returns the data of every event completed by them.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<String>, SseError> {
        let mut out = Vec::new();
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue; // the LF of a CRLF
                }
            }
            match b {
                b'\r' | b'\n' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.line);
                    self.line_done(line, &mut out)?;
                }
                _ => {
                    if self.line.len() >= self.max {
                        return Err(SseError::TooLarge);
                    }
                    self.line.push(b);
                }
            }
        }
        Ok(out)
    }

    fn line_done(&mut self, mut line: Vec<u8>, out: &mut Vec<String>) -> Result<(), SseError> {
        if !self.started {
            self.started = true;
            if line.starts_with(&[0xEF, 0xBB, 0xBF]) {
                line.drain(..3);
            }
        }
        if line.is_empty() {
            if self.has_data {
                out.push(std::mem::take(&mut self.data));
                self.has_data = false;
            }
            return Ok(());
        }
        let text = String::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
        if text.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match text.split_once(':') {
            Some((f, v)) => (f.to_string(), v.strip_prefix(' ').unwrap_or(v).to_string()),
            None => (text, String::new()),
        };
        if field == "data" {
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(&value);
            self.has_data = true;
            if self.data.len() > self.max {
                return Err(SseError::TooLarge);
            }
        }
        Ok(())
    }
}

/// Reads SSE batches from a watch connection.
pub struct Watch {
    pub conn: Conn,
    parser: SseParser,
    ready: std::collections::VecDeque<Value>,
}

impl Watch {
    pub fn new(conn: Conn) -> Watch {
        Watch {
            conn,
            parser: SseParser::new(1 << 20),
            ready: Default::default(),
        }
    }

    /// Drops every batch already received, this moment included: what
    /// `next` returns after this was sent after it was called.
    pub fn discard_received(&mut self) {
        self.ready.clear();
        self.conn.w.set_nonblocking(true).expect("nonblocking");
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.conn.r.read(&mut buf) {
            if n == 0 {
                break;
            }
            let _ = self.parser.feed(&buf[..n]).expect("valid SSE");
        }
        self.conn.w.set_nonblocking(false).expect("blocking");
    }

    /// The next batch; `None` at end of stream.
    pub fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(v) = self.ready.pop_front() {
                return Some(v);
            }
            let mut buf = [0u8; 4096];
            let n = self.conn.r.read(&mut buf).unwrap_or(0);
            if n == 0 {
                return None;
            }
            for data in self.parser.feed(&buf[..n]).expect("valid SSE") {
                self.ready.push_back(
                    serde_json::from_str(&data)
                        .unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {data}")),
                );
            }
        }
    }
}

/// The OpenAPI document.
pub fn openapi() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("vendor-schemas/openapi.yaml");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("read openapi.yaml"))
        .expect("openapi.yaml is JSON text")
}

/// The schema of an operation's response.
pub fn response_schema<'a>(
    doc: &'a Value,
    path: &str,
    method: &str,
    status: u16,
    media: &str,
) -> &'a Value {
    let content = &doc["paths"][path][method]["responses"][status.to_string()]["content"][media];
    assert!(
        content.is_object(),
        "openapi.yaml has no {method} {path} {status} {media}"
    );
    if media == "text/event-stream" {
        &content["x-data-schema"]
    } else {
        &content["schema"]
    }
}

/// Checks a reply against its documented response schema.
pub fn check_reply(doc: &Value, path: &str, method: &str, r: &Resp) {
    let media = r
        .header("content-type")
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    let schema = response_schema(doc, path, method, r.status, &media);
    if let Err(e) = validate(doc, schema, &r.json(), "$") {
        panic!(
            "{method} {path} {} does not match openapi.yaml: {e}\n{}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }
}

fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let ptr = r.strip_prefix('#').expect("local refs only");
            resolve(
                doc,
                doc.pointer(ptr)
                    .unwrap_or_else(|| panic!("unresolved $ref {r}")),
            )
        }
        None => schema,
    }
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.as_i64().is_some() || v.as_u64().is_some(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        other => panic!("unknown type {other} in openapi.yaml"),
    }
}

/// Validates `v` against the subset of JSON Schema the document uses:
/// $ref, type (one or a list), const, enum, properties, required,
/// additionalProperties (false or a schema), items, maxItems, minimum,
/// maximum, minLength, maxLength, oneOf and x-max-utf8-bytes (a string's
/// bound in encoded bytes, seed 002). Any other keyword fails loudly
/// so that the document cannot silently outgrow the validator.
pub fn validate(doc: &Value, schema: &Value, v: &Value, at: &str) -> Result<(), String> {
    let s = resolve(doc, schema);
    let Some(obj) = s.as_object() else {
        return Err(format!("{at}: schema is not an object"));
    };
    for key in obj.keys() {
        const KNOWN: &[&str] = &[
            "type",
            "const",
            "enum",
            "properties",
            "required",
            "additionalProperties",
            "items",
            "maxItems",
            "minimum",
            "maximum",
            "minLength",
            "maxLength",
            "oneOf",
            "description",
            "default",
            "x-max-utf8-bytes",
        ];
        assert!(
            KNOWN.contains(&key.as_str()),
            "openapi.yaml uses {key}, which the test validator does not check"
        );
    }
    if let (Some(max), Some(text)) = (
        s.get("x-max-utf8-bytes").and_then(Value::as_u64),
        v.as_str(),
    ) {
        if text.len() as u64 > max {
            return Err(format!("{at}: {} UTF-8 bytes, more than {max}", text.len()));
        }
    }
    if let Some(t) = s.get("type") {
        let ok = match t {
            Value::String(t) => type_matches(t, v),
            Value::Array(ts) => ts.iter().any(|t| type_matches(t.as_str().unwrap_or(""), v)),
            _ => false,
        };
        if !ok {
            return Err(format!("{at}: {v} is not of type {t}"));
        }
    }
    if let Some(c) = s.get("const") {
        if c != v {
            return Err(format!("{at}: {v} is not {c}"));
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return Err(format!(
                "{at}: {v} is not one of {}",
                Value::Array(e.clone())
            ));
        }
    }
    if let (Some(min), Some(n)) = (s.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        if n < min {
            return Err(format!("{at}: {n} < {min}"));
        }
    }
    if let (Some(max), Some(n)) = (s.get("maximum").and_then(Value::as_f64), v.as_f64()) {
        if n > max {
            return Err(format!("{at}: {n} > {max}"));
        }
    }
    if let Some(text) = v.as_str() {
        let n = text.chars().count() as u64;
        if s.get("minLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| n < m)
            || s.get("maxLength")
                .and_then(Value::as_u64)
                .is_some_and(|m| n > m)
        {
            return Err(format!("{at}: length {n} out of bounds"));
        }
    }
    if let Some(alts) = s.get("oneOf").and_then(Value::as_array) {
        let hits = alts
            .iter()
            .filter(|a| validate(doc, a, v, at).is_ok())
            .count();
        if hits != 1 {
            return Err(format!(
                "{at}: {v} matches {hits} of oneOf's schemas, not exactly one"
            ));
        }
    }
    if let Some(map) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        for r in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let r = r.as_str().unwrap_or_default();
            if !map.contains_key(r) {
                return Err(format!("{at}: missing required {r}"));
            }
        }
        for (k, val) in map {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => validate(doc, ps, val, &format!("{at}.{k}"))?,
                None => match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => return Err(format!("{at}: unexpected member {k}")),
                    Some(extra @ Value::Object(_)) => {
                        validate(doc, extra, val, &format!("{at}.{k}"))?
                    }
                    _ => {}
                },
            }
        }
    }
    if let Some(items) = v.as_array() {
        if let Some(max) = s.get("maxItems").and_then(Value::as_u64) {
            if items.len() as u64 > max {
                return Err(format!("{at}: more than {max} items"));
            }
        }
        if let Some(is) = s.get("items") {
            for (i, item) in items.iter().enumerate() {
                validate(doc, is, item, &format!("{at}[{i}]"))?;
            }
        }
    }
    Ok(())
}
