//! HTTP/1.1 framing for the listener (RFC 9112): reading a request head into
//! a bounded buffer, parsing the request line, header fields and query, and
//! writing a response. Bodies are in [`super::body`].
//!
//! Strict on purpose: a request this module cannot frame unambiguously is
//! refused with 400 and its connection closed, because nothing after it can
//! be trusted to start a new request. Obsolete line folding, whitespace
//! before a colon, bare LF line ends, non-UTF-8 field values and heads over
//! `HTTP_HEAD_MAX` are refused, and so is a request without exactly one
//! non-empty Host, HTTP/1.0 included (RFC 9112, 3.2 allows 1.0 to omit
//! it, but the Host check is the daemon's defence against DNS rebinding,
//! so a request that names no host names none this daemon serves).
//!
//! Why not `httparse` (issue 10, item 25 suggested it): it takes a bare LF
//! as a line end and leaves Host, duplicate framing fields, field-value
//! characters and percent-decoding to the caller, so it would replace
//! only the part of this module that splits lines, and would loosen it.
//! The whole of this parser and of [`super::body`] is instead run in
//! tests against a deterministic stream of mutated requests and an
//! independent grammar check (`tests::fuzz_*`, bounded so CI runs them).

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use super::problem::Problem;
use crate::limits;

/// A byte source with the bytes read from it but not yet consumed.
pub struct Reader<R> {
    pub inner: R,
    buf: Vec<u8>,
}

/// How reading a head ended without a head.
#[derive(Debug)]
pub enum HeadError {
    /// The peer closed (or went quiet) before sending any byte of a head.
    Closed,
    /// The bytes cannot start a request; answer 400 and close.
    Bad(Problem),
    /// The connection failed or timed out in the middle of a head.
    Io(io::Error),
}

impl<R: Read> Reader<R> {
    pub fn new(inner: R) -> Reader<R> {
        Reader {
            inner,
            buf: Vec::new(),
        }
    }

    /// Bytes already read and not consumed: a pipelined next request.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Reads more bytes; 0 at end of stream.
    pub fn fill(&mut self) -> io::Result<usize> {
        let mut chunk = [0u8; 8192];
        let n = self.inner.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    pub fn peek(&self) -> &[u8] {
        &self.buf
    }

    pub fn consume(&mut self, n: usize) {
        self.buf.drain(..n.min(self.buf.len()));
    }

    /// Whether a whole request head is buffered, or bytes enough that
    /// reading the head can only fail (`HTTP_HEAD_MAX`): either way
    /// [`Reader::read_head`] then answers without reading. Empty lines
    /// before a request line are dropped first, as `read_head` does, so
    /// that a client sending only CRLFs buffers nothing.
    pub fn head_ready(&mut self) -> bool {
        let blank = self.buf.chunks(2).take_while(|c| *c == b"\r\n").count();
        if blank > 0 {
            self.consume(2 * blank);
        }
        self.buf.len() >= limits::HTTP_HEAD_MAX || find(&self.buf, b"\r\n\r\n").is_some()
    }

    /// Whether bytes of a next request are already buffered.
    pub fn head_pending(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Reads one request head within `HTTP_HEAD_DEADLINE_MS`.
    pub fn read_head(&mut self) -> Result<Head, HeadError> {
        self.read_head_until(
            Instant::now() + Duration::from_millis(limits::HTTP_HEAD_DEADLINE_MS),
            |_, _| Ok(()),
        )
    }

    /// Reads one request head by `deadline`, however the bytes trickle in:
    /// the per-read timeout alone lets a client that sends a byte every few
    /// seconds hold a handler thread for ever (slowloris). Past the
    /// deadline the connection is given up ([`HeadError::Io`], `TimedOut`).
    /// `cap` is told, before each read, how long is left, so that a
    /// blocking read can wait no longer.
    pub fn read_head_until(
        &mut self,
        deadline: Instant,
        mut cap: impl FnMut(&mut R, Duration) -> io::Result<()>,
    ) -> Result<Head, HeadError> {
        loop {
            // "a server SHOULD ignore at least one empty line (CRLF) received
            // prior to the request-line" (RFC 9112, 2.2)
            while self.buf.starts_with(b"\r\n") {
                self.consume(2);
            }
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let head = parse_head(&self.buf[..end]).map_err(HeadError::Bad);
                self.consume(end + 4);
                return head;
            }
            if self.buf.len() >= limits::HTTP_HEAD_MAX {
                return Err(HeadError::Bad(Problem::invalid(format!(
                    "the request line and headers exceed {} bytes",
                    limits::HTTP_HEAD_MAX
                ))));
            }
            let started = !self.buf.is_empty();
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(if started {
                    HeadError::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the request head did not arrive in time",
                    ))
                } else {
                    HeadError::Closed
                });
            }
            if let Err(e) = cap(&mut self.inner, left) {
                return Err(HeadError::Io(e));
            }
            match self.fill() {
                Ok(0) if !started => return Err(HeadError::Closed),
                Ok(0) => {
                    return Err(HeadError::Bad(Problem::invalid(
                        "the request head ended before its blank line",
                    )));
                }
                Ok(_) => {}
                Err(e)
                    if !started
                        && matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                {
                    return Err(HeadError::Closed);
                }
                Err(e) => return Err(HeadError::Io(e)),
            }
        }
    }
}

impl Reader<std::net::TcpStream> {
    /// [`Reader::read_head`] on a socket: each read waits at most what is
    /// left of the head's deadline (and `HTTP_READ_TIMEOUT_MS`, the
    /// socket's read timeout, which is put back after). The timeout is
    /// changed only once less than it is left: a keep-alive request reads
    /// its head without a system call besides the read.
    pub fn read_head_timed(&mut self) -> Result<Head, HeadError> {
        let per_read = Duration::from_millis(limits::HTTP_READ_TIMEOUT_MS);
        let deadline = Instant::now() + Duration::from_millis(limits::HTTP_HEAD_DEADLINE_MS);
        let mut shortened = false;
        let head = self.read_head_until(deadline, |s, left| {
            if left >= per_read {
                return Ok(());
            }
            shortened = true;
            s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
        });
        if shortened {
            let _ = self.inner.set_read_timeout(Some(per_read));
        }
        head
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A parsed request head.
#[derive(Debug, Clone, PartialEq)]
pub struct Head {
    pub method: String,
    /// The path part of the target, still percent-encoded.
    pub path: String,
    /// The query part without `?`, still percent-encoded.
    pub query: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor: u8,
    /// Field names lowercased, in the order received.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first value of a field.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a field, comma-separated lists split.
    pub fn list(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect()
    }

    pub fn count(&self, name: &str) -> usize {
        self.headers.iter().filter(|(n, _)| n == name).count()
    }

    /// Whether the client asked to keep the connection open afterwards.
    pub fn keep_alive(&self) -> bool {
        let conn = self.list("connection");
        let has = |t: &str| conn.iter().any(|c| c.eq_ignore_ascii_case(t));
        if self.minor == 0 {
            has("keep-alive")
        } else {
            !has("close")
        }
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses the bytes of a head (without its final blank line).
pub fn parse_head(bytes: &[u8]) -> Result<Head, Problem> {
    let all = split_crlf(bytes);
    if all.iter().any(|l| l.contains(&b'\n') || l.contains(&b'\r')) {
        return Err(Problem::invalid("lines must end with CRLF"));
    }
    let mut lines = all.into_iter();
    let first = lines.next().unwrap_or_default();
    let first =
        std::str::from_utf8(first).map_err(|_| Problem::invalid("request line is not ASCII"))?;
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Problem::invalid(
            "request line is not METHOD TARGET VERSION",
        ));
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(Problem::invalid("method is not a token"));
    }
    let minor = match version {
        "HTTP/1.1" => 1,
        "HTTP/1.0" => 0,
        _ => return Err(Problem::invalid("only HTTP/1.0 and HTTP/1.1 are served")),
    };
    if !target.starts_with('/') || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Problem::invalid("request target must be an absolute path"));
    }
    let target = target.split('#').next().unwrap_or_default();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut headers = Vec::new();
    for line in lines {
        if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
            return Err(Problem::invalid("obsolete line folding is not accepted"));
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(|| Problem::invalid("header line has no colon"))?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Err(Problem::invalid("header name is not a token"));
        }
        let value = std::str::from_utf8(value)
            .map_err(|_| Problem::invalid("header value is not UTF-8"))?;
        if value
            .bytes()
            .any(|b| b == 0 || b == b'\r' || (b < 0x20 && b != b'\t') || b == 0x7f)
        {
            return Err(Problem::invalid("header value holds a control character"));
        }
        if headers.len() == limits::HTTP_HEADERS_MAX {
            return Err(Problem::invalid(format!(
                "more than {} header fields",
                limits::HTTP_HEADERS_MAX
            )));
        }
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        headers.push((name, value.trim_matches([' ', '\t']).to_string()));
    }
    let mut hosts = headers.iter().filter(|(n, _)| n == "host");
    match (hosts.next(), hosts.next()) {
        (Some((_, h)), None) if !h.is_empty() => {}
        (Some(_), None) => return Err(Problem::invalid("the Host header is empty")),
        _ => {
            return Err(Problem::invalid(
                "a request needs exactly one Host header naming this listener",
            ));
        }
    }
    Ok(Head {
        method: method.to_string(),
        path: path.to_string(),
        query: query.to_string(),
        minor,
        headers,
    })
}

/// Splits at each CRLF.
fn split_crlf(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i + 1 < bytes.len() {
        if bytes[i] == b'\r' && bytes[i + 1] == b'\n' {
            out.push(&bytes[start..i]);
            i += 2;
            start = i;
        } else {
            i += 1;
        }
    }
    out.push(&bytes[start..]);
    out
}

/// Decodes `%XX` escapes (and `+` as space in queries) into UTF-8 text.
pub fn percent_decode(s: &str, plus_is_space: bool) -> Result<String, Problem> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                // Two hex digits exactly: from_str_radix alone would take
                // a sign ("%+f").
                let hex = b
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                out.push(hex.ok_or_else(|| Problem::invalid("malformed percent escape"))?);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| Problem::invalid("percent-decoded text is not UTF-8"))
}

/// The decoded query parameters. A name given twice is refused: the API
/// has no list parameters spelled by repetition.
pub fn parse_query(q: &str) -> Result<Vec<(String, String)>, Problem> {
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = percent_decode(k, true)?;
        let v = percent_decode(v, true)?;
        if out.iter().any(|(n, _)| *n == k) {
            return Err(Problem::invalid(format!(
                "query parameter {k} is given more than once"
            )));
        }
        out.push((k, v));
    }
    Ok(out)
}

/// The reason phrase of a status, also the problem `title`.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// A response ready to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn new(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    pub fn json(status: u16, body: Vec<u8>) -> Response {
        Response::new(status)
            .header("Content-Type", "application/json")
            .with_body(body)
    }

    pub fn with_body(mut self, body: Vec<u8>) -> Response {
        self.body = body;
        self
    }

    /// A problem answer, with the headers its status calls for.
    pub fn problem(p: &Problem) -> Response {
        let mut r = Response::new(p.status()).header("Content-Type", "application/problem+json");
        if p.status() == 401 {
            r = r.header("WWW-Authenticate", "Bearer");
        }
        if let Some(a) = &p.allow {
            r = r.header("Allow", a.clone());
        }
        // Every 429 says when to try again (seed 002: "Admission or rate
        // limit; includes Retry-After where a later new intent can
        // succeed"), a retained rejection replayed included, since the
        // answer is the same.
        let retry = p
            .retry_after
            .or((p.status() == 429).then_some(limits::HTTP_RETRY_429_S));
        if let Some(s) = retry {
            r = r.header("Retry-After", s.to_string());
        }
        r.with_body(p.body())
    }
}

/// Writes a response with its length. `head_only` leaves the body out (for
/// HEAD); `close` announces that the connection closes after it.
pub fn write_response(
    w: &mut impl Write,
    r: &Response,
    head_only: bool,
    close: bool,
) -> io::Result<()> {
    w.write_all(&response_bytes(r, head_only, close))?;
    w.flush()
}

/// The bytes [`write_response`] writes.
pub fn response_bytes(r: &Response, head_only: bool, close: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + r.body.len());
    write_status_and_headers(&mut out, r.status, &r.headers);
    if r.status != 204 && r.status != 304 {
        out.extend_from_slice(format!("Content-Length: {}\r\n", r.body.len()).as_bytes());
    }
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !head_only && r.status != 204 && r.status != 304 {
        out.extend_from_slice(&r.body);
    }
    out
}

/// The status line and header fields, without the final blank line.
pub fn write_status_and_headers(
    out: &mut Vec<u8>,
    status: u16,
    headers: &[(&'static str, String)],
) {
    out.extend_from_slice(
        format!(
            "HTTP/1.1 {status} {}\r\nDate: {}\r\n",
            reason(status),
            http_date(crate::clock::now_ms())
        )
        .as_bytes(),
    );
    for (n, v) in headers {
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// IMF-fixdate (RFC 9110, 5.6.7) of a Unix time in milliseconds.
pub fn http_date(ms: i64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = crate::clock::civil_from_days(days);
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} GMT",
        DAYS[days.rem_euclid(7) as usize],
        d,
        MONTHS[(m - 1) as usize],
        y,
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Head, Problem> {
        parse_head(text.as_bytes())
    }

    #[test]
    fn parses_a_request_head() {
        let h = head("GET /events?stream=x-a&after_seq=3 HTTP/1.1\r\nHost: 127.0.0.1:1\r\nAccept:  text/event-stream \r\nConnection: keep-alive, Upgrade").unwrap();
        assert_eq!(h.method, "GET");
        assert_eq!(h.path, "/events");
        assert_eq!(h.query, "stream=x-a&after_seq=3");
        assert_eq!(h.header("accept"), Some("text/event-stream"));
        assert_eq!(h.list("connection"), vec!["keep-alive", "Upgrade"]);
        assert!(h.keep_alive());
    }

    #[test]
    fn refuses_what_cannot_be_framed() {
        for bad in [
            "GET /x HTTP/1.1",                       // no Host
            "GET /x HTTP/1.1\r\nHost: a\r\nHost: b", // two Hosts
            "GET /x HTTP/2.0\r\nHost: a",            // version
            "GET http://a/x HTTP/1.1\r\nHost: a",    // absolute form
            "GET /x HTTP/1.1\r\nHost: a\r\n folded", // obs-fold
            "GET /x HTTP/1.1\r\nHost : a",           // space before colon
            "GET /x HTTP/1.1\nHost: a",              // bare LF
            "GET  /x HTTP/1.1\r\nHost: a",           // double space
            "G(T /x HTTP/1.1\r\nHost: a",            // method not a token
            "GET /x HTTP/1.1\r\nHost:",              // empty Host
            "GET /x HTTP/1.1\r\nHost: \t ",          // blank Host
            "GET /x HTTP/1.0",                       // 1.0 naming no host
            "GET /x HTTP/1.0\r\nHost:",              // 1.0, empty Host
        ] {
            assert!(head(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reads_heads_across_fragments_and_keeps_pipelined_bytes() {
        struct Trickle(Vec<u8>, usize);
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = (self.0.len() - self.1).min(3).min(buf.len());
                buf[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
                self.1 += n;
                Ok(n)
            }
        }
        let text =
            b"\r\nGET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n".to_vec();
        let mut r = Reader::new(Trickle(text, 0));
        assert_eq!(r.read_head().unwrap().path, "/a");
        assert_eq!(r.read_head().unwrap().path, "/b");
        assert!(matches!(r.read_head(), Err(HeadError::Closed)));
        let mut big = Reader::new(io::repeat(b'a').take(1 << 20));
        assert!(matches!(big.read_head(), Err(HeadError::Bad(_))));
    }

    #[test]
    fn a_head_trickled_in_is_given_up_at_its_deadline() {
        // One byte every 5 ms, never a blank line: each read succeeds, so
        // only the overall deadline ends it.
        struct Drip;
        impl Read for Drip {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                std::thread::sleep(Duration::from_millis(5));
                buf[0] = b'a';
                Ok(1)
            }
        }
        let mut r = Reader::new(Drip);
        let start = Instant::now();
        let mut caps = Vec::new();
        let got = r.read_head_until(start + Duration::from_millis(100), |_, left| {
            caps.push(left);
            Ok(())
        });
        assert!(
            matches!(got, Err(HeadError::Io(ref e)) if e.kind() == io::ErrorKind::TimedOut),
            "{got:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(2));
        assert!(r.buffered() < limits::HTTP_HEAD_MAX);
        // Each read is told what is left, less and less.
        assert!(
            caps.len() > 2
                && caps.windows(2).all(|w| w[1] <= w[0])
                && caps[0] <= Duration::from_millis(100)
        );
        // Nothing at all by the deadline is a quiet close, not an error.
        let mut idle = Reader::new(Drip);
        assert!(matches!(
            idle.read_head_until(Instant::now(), |_, _| Ok(())),
            Err(HeadError::Closed)
        ));
    }

    #[test]
    fn query_is_decoded_and_repeats_refused() {
        assert_eq!(
            parse_query("a=%2Fx+y&b=&c").unwrap(),
            vec![
                ("a".into(), "/x y".into()),
                ("b".into(), "".into()),
                ("c".into(), "".into())
            ]
        );
        assert!(parse_query("a=1&a=2").is_err());
        assert!(parse_query("a=%zz").is_err());
        assert!(parse_query("a=%ff").is_err());
        // Strict hex: no sign, no space.
        for bad in ["%+f", "%-1", "% f", "%f", "%"] {
            assert!(percent_decode(bad, false).is_err(), "{bad:?}");
        }
        assert_eq!(percent_decode("%2b%2B", false).unwrap(), "++");
    }

    // ---- Fuzz-style checks (issue 10, item 25) ----
    //
    // A deterministic PRNG mutates valid requests a bounded number of
    // times; each result goes through the parser and through an
    // independent statement of the grammar the module comment promises.
    // The two must agree: nothing panics, nothing invalid is accepted,
    // nothing valid refused.

    use crate::testutil::Rng;

    /// Bytes a mutation inserts: the ones framing turns on, and some not.
    const NASTY: &[u8] = b"\r\n \t:;,=%+-/?#0123456789abcdefABCDEFHTPx\x00\x7f\x80\xc3\xa9\"";

    fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
        let mut b = base.to_vec();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(b.len() + 1);
            match rng.below(5) {
                0 if at < b.len() => b[at] = *rng.pick(NASTY),
                1 if at < b.len() => {
                    b.remove(at);
                }
                2 => {
                    // A piece of the input repeated (a line, a field).
                    let end = (at + rng.below(24)).min(b.len());
                    let piece = b[at..end].to_vec();
                    let to = rng.below(b.len() + 1);
                    b.splice(to..to, piece);
                }
                _ => b.insert(at, *rng.pick(NASTY)),
            }
        }
        b
    }

    fn tchar(b: u8) -> bool {
        matches!(
            b,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        ) || b.is_ascii_alphanumeric()
    }

    /// The head grammar, stated separately from `parse_head`.
    fn head_is_valid(raw: &[u8]) -> bool {
        let text = raw;
        let mut lines: Vec<&[u8]> = Vec::new();
        let mut rest = text;
        while let Some(i) = (0..rest.len().saturating_sub(1)).find(|&i| &rest[i..i + 2] == b"\r\n")
        {
            lines.push(&rest[..i]);
            rest = &rest[i + 2..];
        }
        lines.push(rest);
        if lines
            .iter()
            .any(|l| l.contains(&b'\r') || l.contains(&b'\n'))
        {
            return false;
        }
        let parts: Vec<&[u8]> = lines[0].split(|&b| b == b' ').collect();
        let [method, target, version] = parts[..] else {
            return false;
        };
        if method.is_empty() || !method.iter().all(|&b| tchar(b)) {
            return false;
        }
        if target.first() != Some(&b'/') || !target.iter().all(|&b| (0x21..=0x7e).contains(&b)) {
            return false;
        }
        if version != b"HTTP/1.1" && version != b"HTTP/1.0" {
            return false;
        }
        let fields = &lines[1..];
        if fields.len() > limits::HTTP_HEADERS_MAX {
            return false;
        }
        let mut hosts = Vec::new();
        for f in fields {
            let Some(colon) = f.iter().position(|&b| b == b':') else {
                return false;
            };
            let (name, value) = (&f[..colon], &f[colon + 1..]);
            if name.is_empty() || !name.iter().all(|&b| tchar(b)) {
                return false;
            }
            if std::str::from_utf8(value).is_err()
                || value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f)
            {
                return false;
            }
            if name.eq_ignore_ascii_case(b"host") {
                hosts.push(value);
            }
        }
        hosts.len() == 1 && hosts[0].iter().any(|&b| b != b' ' && b != b'\t')
    }

    const HEADS: &[&str] = &[
        "GET /server HTTP/1.1\r\nHost: 127.0.0.1:80\r\nAuthorization: Bearer abc",
        "PUT /sessions/x?tail=5&a=%20b HTTP/1.1\r\nhost: h\r\nContent-Type: application/json\r\nContent-Length: 12",
        "POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue",
        "GET / HTTP/1.0\r\nHost: [::1]:8080\r\nConnection: keep-alive",
    ];

    #[test]
    fn fuzz_heads_agree_with_the_grammar() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for base in HEADS {
            assert!(head_is_valid(base.as_bytes()), "{base}");
            assert!(parse_head(base.as_bytes()).is_ok(), "{base}");
        }
        for i in 0..20_000 {
            let base = rng_pick(&mut rng, HEADS);
            let raw = mutate(&mut rng, base.as_bytes());
            let got = parse_head(&raw);
            assert_eq!(
                got.is_ok(),
                head_is_valid(&raw),
                "iteration {i}: {:?} -> {got:?}",
                String::from_utf8_lossy(&raw)
            );
            // Through the reader too, fragmented at random: the same
            // verdict, or a head cut short where a blank line appeared.
            let mut wire = raw.clone();
            wire.extend_from_slice(b"\r\n\r\n");
            let cuts: Vec<usize> = (0..3).map(|_| 1 + rng.below(8)).collect();
            let mut r = Reader::new(Pieces(wire, 0, cuts, 0));
            if let Ok(h) = r.read_head() {
                assert!(
                    !h.method.is_empty() && h.path.starts_with('/'),
                    "iteration {i}"
                );
                let _ = super::super::body::Framing::of(&h);
            }
        }
    }

    fn rng_pick<'a>(rng: &mut Rng, from: &[&'a str]) -> &'a str {
        from[rng.below(from.len())]
    }

    /// A reader handing out its bytes in pieces of the given sizes.
    struct Pieces(Vec<u8>, usize, Vec<usize>, usize);

    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let want = self.2[self.3 % self.2.len()];
            self.3 += 1;
            let n = (self.0.len() - self.1).min(want).min(buf.len());
            buf[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
            self.1 += n;
            Ok(n)
        }
    }

    #[test]
    fn fuzz_percent_decoding_is_strict_hex() {
        let mut rng = Rng(0xdead_beef_cafe_f00d);
        let alphabet = b"%+-0123456789abcdefABCDEFgz/ \xc3\xa9";
        for i in 0..20_000 {
            let len = rng.below(8);
            let raw: Vec<u8> = (0..len).map(|_| *rng.pick(alphabet)).collect();
            let Ok(text) = String::from_utf8(raw) else {
                continue;
            };
            // Every % opens exactly two hex digits; the result is UTF-8.
            let b = text.as_bytes();
            let mut out = Vec::new();
            let mut ok = true;
            let mut j = 0;
            while j < b.len() {
                if b[j] == b'%' {
                    match (b.get(j + 1), b.get(j + 2)) {
                        (Some(h), Some(l)) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => {
                            let v = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
                            out.push(v(*h) * 16 + v(*l));
                            j += 3;
                        }
                        _ => {
                            ok = false;
                            break;
                        }
                    }
                } else {
                    out.push(b[j]);
                    j += 1;
                }
            }
            let want = if ok {
                String::from_utf8(out).ok()
            } else {
                None
            };
            assert_eq!(
                percent_decode(&text, false).ok(),
                want,
                "iteration {i}: {text:?}"
            );
        }
    }

    #[test]
    fn dates_are_imf_fixdate() {
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(http_date(784_111_777_000), "Sun, 06 Nov 1994 08:49:37 GMT");
    }
}
