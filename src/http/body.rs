//! Request bodies (seed 002, "Encoding, limits, and pagination"): "HTTP body
//! framing accepts valid fixed-length and chunked requests, enforcing the
//! same byte limit while reading. Ambiguous framing, unsupported content
//! encoding, and incomplete bodies fail without executing the operation."
//!
//! [`Framing::of`] decides how a body is delimited before anything is read;
//! [`read`] reads it and stops the moment the limit is passed, so a client
//! declaring or streaming gigabytes costs at most the limit in memory.
//! [`decode`] turns the bytes into a typed request, refusing unknown and
//! duplicate members (serde's `deny_unknown_fields` on every request type).

use serde::de::DeserializeOwned;
use std::io::Read;

use super::problem::{Code, Problem};
use super::wire::{Head, Reader};
use crate::limits;

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
}

impl Framing {
    /// Reads the framing headers, refusing ambiguity: Transfer-Encoding
    /// other than exactly `chunked`, Transfer-Encoding with Content-Length,
    /// Content-Length values that disagree or are not digits, and any
    /// content coding.
    pub fn of(head: &Head) -> Result<Framing, Problem> {
        // An empty field or list element is not "no body": RFC 9112, 6.3
        // makes an invalid Content-Length unrecoverable framing (else the
        // body would be read as the next request).
        for name in ["content-length", "transfer-encoding"] {
            if head
                .headers
                .iter()
                .filter(|(n, _)| n == name)
                .any(|(_, v)| v.split(',').any(|e| e.trim_matches([' ', '\t']).is_empty()))
            {
                return Err(Problem::invalid(format!("{name} has an empty value")));
            }
        }
        let te = head.list("transfer-encoding");
        let cl = head.list("content-length");
        if let Some(coding) = head
            .list("content-encoding")
            .into_iter()
            .find(|c| !c.eq_ignore_ascii_case("identity"))
        {
            return Err(Problem::new(
                Code::UnsupportedMediaType,
                format!("content coding {coding} is not accepted"),
            ));
        }
        if !te.is_empty() {
            if !cl.is_empty() {
                return Err(Problem::invalid(
                    "both Transfer-Encoding and Content-Length frame the body",
                ));
            }
            if head.minor == 0 || te.len() != 1 || !te[0].eq_ignore_ascii_case("chunked") {
                return Err(Problem::invalid(
                    "the only transfer coding accepted is chunked, alone, over HTTP/1.1",
                ));
            }
            return Ok(Framing::Chunked);
        }
        let Some(first) = cl.first() else {
            return Ok(Framing::None);
        };
        if cl.iter().any(|v| v != first)
            || first.is_empty()
            || first.len() > 19
            || !first.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(Problem::invalid("Content-Length is not one whole number"));
        }
        let n: u64 = first
            .parse()
            .map_err(|_| Problem::invalid("Content-Length is not one whole number"))?;
        Ok(if n == 0 {
            Framing::None
        } else {
            Framing::Length(n)
        })
    }
}

/// Why a body was not read in full.
#[derive(Debug)]
pub enum BodyError {
    /// Past the limit: 413. The rest was not read; close the connection.
    TooLarge(usize),
    /// Malformed chunked framing or an early end: 400; close.
    Bad(String),
    /// Over `HTTP_LARGE_BODIES_HELD`: 503 with Retry-After; close.
    Busy,
}

impl BodyError {
    /// The peer closed before the body's end.
    pub fn early_end() -> BodyError {
        BodyError::Bad("the body ended before its declared end".into())
    }

    pub fn problem(&self) -> Problem {
        match self {
            BodyError::TooLarge(limit) => Problem::new(
                Code::BodyTooLarge,
                format!("the body exceeds its limit of {limit} bytes"),
            ),
            BodyError::Bad(why) => Problem::invalid(why.clone()),
            BodyError::Busy => Problem::new(
                Code::Unavailable,
                "the daemon is receiving its maximum of large request bodies; try again",
            )
            .retry(1),
        }
    }
}

/// Reads a body incrementally from whatever is buffered, so that the same
/// code serves a blocking reader ([`read`]) and the listener's poller,
/// which must never wait on a peer (src/http/listener.rs). It consumes
/// framing bytes as it goes and keeps only the decoded body, so what one
/// connection holds is at most `limit` bytes plus one partial chunk line
/// (`HTTP_CHUNK_LINE_MAX`) and one read's worth of raw bytes.
#[derive(Debug)]
pub struct Decoder {
    limit: usize,
    out: Vec<u8>,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Bytes still owed by a fixed-length body, or by the current chunk.
    Data {
        left: u64,
        chunked: bool,
    },
    /// The chunk-size line of the next chunk.
    Size,
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer fields read so far, up to the blank line.
    Trailers(usize),
    Done,
}

impl Decoder {
    /// A decoder for a body of `framing`, refusing past `limit` bytes. A
    /// declared length over the limit is refused at once, before a read.
    pub fn new(framing: Framing, limit: usize) -> Result<Decoder, BodyError> {
        let state = match framing {
            Framing::None => State::Done,
            Framing::Length(n) if n > limit as u64 => return Err(BodyError::TooLarge(limit)),
            Framing::Length(n) => State::Data {
                left: n,
                chunked: false,
            },
            Framing::Chunked => State::Size,
        };
        let out = match framing {
            Framing::Length(n) => Vec::with_capacity(n as usize),
            _ => Vec::new(),
        };
        Ok(Decoder { limit, out, state })
    }

    /// Consumes what `r` holds; `Ok(true)` once the body is whole (the
    /// bytes after it stay in `r`), `Ok(false)` when it needs more bytes.
    pub fn advance<R: Read>(&mut self, r: &mut Reader<R>) -> Result<bool, BodyError> {
        loop {
            match self.state {
                State::Done => return Ok(true),
                State::Data { left, chunked } => {
                    let k = (left.min(usize::MAX as u64) as usize).min(r.buffered());
                    self.out.extend_from_slice(&r.peek()[..k]);
                    r.consume(k);
                    let left = left - k as u64;
                    self.state = match (left, chunked) {
                        (0, true) => State::DataEnd,
                        (0, false) => State::Done,
                        _ => {
                            self.state = State::Data { left, chunked };
                            return Ok(false);
                        }
                    };
                }
                State::Size => {
                    let Some(size_line) = line(r)? else {
                        return Ok(false);
                    };
                    // Whitespace may precede a chunk extension's ';' (BWS),
                    // never the size itself.
                    let size = size_line
                        .split(';')
                        .next()
                        .unwrap_or_default()
                        .trim_end_matches([' ', '\t']);
                    if size.is_empty()
                        || size.len() > 16
                        || !size.bytes().all(|b| b.is_ascii_hexdigit())
                    {
                        return Err(BodyError::Bad("chunk size is not hexadecimal".into()));
                    }
                    let size = u64::from_str_radix(size, 16)
                        .map_err(|_| BodyError::Bad("chunk size is not hexadecimal".into()))?;
                    if size == 0 {
                        self.state = State::Trailers(0);
                    } else if self.out.len() as u64 + size > self.limit as u64 {
                        return Err(BodyError::TooLarge(self.limit));
                    } else {
                        self.state = State::Data {
                            left: size,
                            chunked: true,
                        };
                    }
                }
                State::DataEnd => {
                    let Some(l) = line(r)? else {
                        return Ok(false);
                    };
                    if !l.is_empty() {
                        return Err(BodyError::Bad("chunk data is not followed by CRLF".into()));
                    }
                    self.state = State::Size;
                }
                // Trailer fields are read and ignored, up to the blank line.
                State::Trailers(n) => {
                    let Some(l) = line(r)? else {
                        return Ok(false);
                    };
                    if l.is_empty() {
                        self.state = State::Done;
                    } else if n == limits::HTTP_HEADERS_MAX {
                        return Err(BodyError::Bad("too many trailer fields".into()));
                    } else {
                        self.state = State::Trailers(n + 1);
                    }
                }
            }
        }
    }

    /// The decoded body, once [`Decoder::advance`] said it is whole.
    pub fn into_body(self) -> Vec<u8> {
        self.out
    }
}

/// One CRLF-terminated line of chunked framing, bounded, if buffered. A
/// control character inside it (a bare CR or LF above all) is refused: a
/// peer that reads it as a line end would frame the body differently.
fn line<R: Read>(r: &mut Reader<R>) -> Result<Option<String>, BodyError> {
    let window = &r.peek()[..r.buffered().min(limits::HTTP_CHUNK_LINE_MAX + 2)];
    let Some(i) = window.windows(2).position(|w| w == b"\r\n") else {
        if r.buffered() >= limits::HTTP_CHUNK_LINE_MAX + 2 {
            return Err(BodyError::Bad("chunk line is too long".into()));
        }
        return Ok(None);
    };
    if window[..i]
        .iter()
        .any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f)
    {
        return Err(BodyError::Bad(
            "chunk line holds a control character".into(),
        ));
    }
    let text = String::from_utf8(window[..i].to_vec())
        .map_err(|_| BodyError::Bad("chunk line is not ASCII".into()))?;
    r.consume(i + 2);
    Ok(Some(text))
}

/// Decodes a JSON request body into `T`. Unknown members, duplicate members
/// and wrong types are 400 with serde's description of what was expected.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    serde_json::from_slice(bytes).map_err(|e| {
        let msg = e.to_string();
        let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
        Problem::invalid(format!("the body does not fit the request: {msg}"))
    })
}

/// Checks that a body is JSON by its media type.
pub fn require_json(head: &Head) -> Result<(), Problem> {
    let ct = head.header("content-type").unwrap_or_default();
    let essence = ct.split(';').next().unwrap_or_default().trim();
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(Problem::new(
            Code::UnsupportedMediaType,
            "the body must be application/json",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::wire::parse_head;

    fn framing(h: &str) -> Result<Framing, Problem> {
        Framing::of(
            &parse_head(
                format!("POST /x HTTP/1.1\r\nHost: a\r\n{h}")
                    .trim_end()
                    .as_bytes(),
            )
            .unwrap(),
        )
    }

    #[test]
    fn framing_refuses_ambiguity() {
        assert_eq!(framing("Content-Length: 5").unwrap(), Framing::Length(5));
        assert_eq!(
            framing("Content-Length: 5\r\nContent-Length: 5").unwrap(),
            Framing::Length(5)
        );
        assert_eq!(
            framing("Transfer-Encoding: Chunked").unwrap(),
            Framing::Chunked
        );
        assert_eq!(framing("").unwrap(), Framing::None);
        for bad in [
            "Content-Length: 5\r\nContent-Length: 6",
            "Content-Length: 5, 6",
            "Content-Length: -1",
            "Content-Length: 0x10",
            "Transfer-Encoding: chunked\r\nContent-Length: 5",
            "Transfer-Encoding: gzip, chunked",
            "Transfer-Encoding: identity",
        ] {
            assert_eq!(framing(bad).unwrap_err().status(), 400, "{bad}");
        }
        assert_eq!(
            framing("Content-Encoding: zstd\r\nContent-Length: 5")
                .unwrap_err()
                .status(),
            415
        );
    }

    /// Reads a whole body of at most `limit` bytes from a blocking reader,
    /// as the listener does without blocking.
    pub fn read<R: Read>(
        r: &mut Reader<R>,
        framing: Framing,
        limit: usize,
    ) -> Result<Vec<u8>, BodyError> {
        let mut d = Decoder::new(framing, limit)?;
        while !d.advance(r)? {
            match r.fill() {
                Ok(0) => return Err(BodyError::early_end()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(BodyError::Bad(format!(
                        "the body could not be read: {}",
                        crate::errors::io_cause(&e)
                    )));
                }
            }
        }
        Ok(d.into_body())
    }

    fn reader(bytes: &[u8]) -> Reader<&[u8]> {
        Reader::new(bytes)
    }

    #[test]
    fn fixed_bodies_are_bounded_before_reading() {
        let mut r = reader(b"{\"a\":1}rest");
        assert_eq!(read(&mut r, Framing::Length(7), 10).unwrap(), b"{\"a\":1}");
        assert_eq!(r.peek(), b"rest");
        assert!(matches!(
            read(&mut reader(b""), Framing::Length(1 << 40), 10),
            Err(BodyError::TooLarge(10))
        ));
        assert!(matches!(
            read(&mut reader(b"abc"), Framing::Length(5), 10),
            Err(BodyError::Bad(_))
        ));
    }

    #[test]
    fn chunked_bodies_are_decoded_and_bounded_while_reading() {
        let mut r = reader(b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\nnext");
        assert_eq!(read(&mut r, Framing::Chunked, 10).unwrap(), b"abcde");
        assert_eq!(r.peek(), b"next");
        // The second chunk passes the limit: refused without reading it.
        let mut r = reader(b"6\r\nabcdef\r\nffffffff\r\n");
        assert!(matches!(
            read(&mut r, Framing::Chunked, 10),
            Err(BodyError::TooLarge(10))
        ));
        for bad in [&b"zz\r\n"[..], b"3\r\nabcX\r\n0\r\n\r\n", b"3\r\nab"] {
            assert!(
                matches!(
                    read(&mut reader(bad), Framing::Chunked, 10),
                    Err(BodyError::Bad(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn empty_framing_fields_and_loose_chunk_lines_are_refused() {
        for bad in [
            "Content-Length:",
            "Content-Length: ",
            "Content-Length: 5,",
            "Transfer-Encoding:",
            "Transfer-Encoding: chunked,",
        ] {
            assert_eq!(framing(bad).unwrap_err().status(), 400, "{bad:?}");
        }
        for bad in [
            &b"2;a\nb\r\nab\r\n0\r\n\r\n"[..], // bare LF in an extension
            b"2;a\rb\r\nab\r\n0\r\n\r\n",      // bare CR
            b" 2\r\nab\r\n0\r\n\r\n",          // space before the size
            b"\t2\r\nab\r\n0\r\n\r\n",
            b"+2\r\nab\r\n0\r\n\r\n",
            b"2\r\nab\r\n0\r\nX: a\nb\r\n\r\n", // bare LF in a trailer
        ] {
            assert!(
                matches!(
                    read(&mut reader(bad), Framing::Chunked, 10),
                    Err(BodyError::Bad(_))
                ),
                "{bad:?}"
            );
        }
        // Whitespace before an extension's ';' is allowed (BWS).
        let mut r = reader(b"2 ;a=b\r\nab\r\n0\r\n\r\n");
        assert_eq!(read(&mut r, Framing::Chunked, 10).unwrap(), b"ab");
    }

    use crate::testutil::Rng;

    /// Chunked decoding stated separately from [`read`]: `None` when the
    /// bytes are not a valid chunked body within `limit`.
    fn chunked_oracle(raw: &[u8], limit: usize) -> Option<Vec<u8>> {
        let mut pos = 0;
        let next_line = |pos: &mut usize| -> Option<Vec<u8>> {
            let rest = &raw[*pos..];
            let i = (0..rest.len().saturating_sub(1)).find(|&i| &rest[i..i + 2] == b"\r\n")?;
            let line = rest[..i].to_vec();
            if line.len() > limits::HTTP_CHUNK_LINE_MAX
                || line.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f)
                || std::str::from_utf8(&line).is_err()
            {
                return None;
            }
            *pos += i + 2;
            Some(line)
        };
        let mut out = Vec::new();
        loop {
            let line = next_line(&mut pos)?;
            let size_end = line.iter().position(|&b| b == b';').unwrap_or(line.len());
            let mut size = &line[..size_end];
            while let [rest @ .., b' ' | b'\t'] = size {
                size = rest;
            }
            if size.is_empty() || size.len() > 16 || !size.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let n = size.iter().fold(0u64, |acc, &d| {
                acc * 16 + (d as char).to_digit(16).unwrap_or(0) as u64
            });
            if n == 0 {
                break;
            }
            if out.len() as u64 + n > limit as u64 {
                return None;
            }
            let n = n as usize;
            out.extend_from_slice(raw.get(pos..pos + n)?);
            pos += n;
            if !next_line(&mut pos)?.is_empty() {
                return None;
            }
        }
        for _ in 0..=limits::HTTP_HEADERS_MAX {
            if next_line(&mut pos)?.is_empty() {
                return Some(out);
            }
        }
        None
    }

    #[test]
    fn fuzz_chunked_bodies_agree_with_the_grammar() {
        const BASES: &[&[u8]] = &[
            b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n",
            b"a\r\n0123456789\r\n0\r\n\r\n",
            b"1 ;a\r\nz\r\n0;last\r\n\r\n",
        ];
        const NASTY: &[u8] = b"\r\n \t;=0123456789abcdefABCDEFxg+-\x00\x7f\x80";
        let mut rng = Rng(0x0123_4567_89ab_cdef);
        for i in 0..20_000 {
            let mut b = BASES[rng.below(BASES.len())].to_vec();
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(b.len() + 1);
                let c = NASTY[rng.below(NASTY.len())];
                match rng.below(3) {
                    0 if at < b.len() => b[at] = c,
                    1 if at < b.len() => {
                        b.remove(at);
                    }
                    _ => b.insert(at, c),
                }
            }
            let got = read(&mut reader(&b), Framing::Chunked, 16).ok();
            // Resumed at every byte, as on the poller: the same verdict.
            let mut one = Reader::new(OneByte(&b));
            assert_eq!(
                read(&mut one, Framing::Chunked, 16).ok(),
                got,
                "iteration {i} byte by byte"
            );
            assert_eq!(
                got,
                chunked_oracle(&b, 16),
                "iteration {i}: {:?}",
                String::from_utf8_lossy(&b)
            );
        }
    }

    /// A reader handing out one byte per read.
    struct OneByte<'a>(&'a [u8]);

    impl Read for OneByte<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let Some((&b, rest)) = self.0.split_first() else {
                return Ok(0);
            };
            buf[0] = b;
            self.0 = rest;
            Ok(1)
        }
    }

    #[test]
    fn decode_refuses_unknown_and_duplicate_members() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct T {
            a: u32,
        }
        assert!(decode::<T>(b"{\"a\":1}").is_ok());
        assert!(decode::<T>(b"{\"a\":1,\"b\":2}").is_err());
        assert!(decode::<T>(b"{\"a\":1,\"a\":2}").is_err());
        assert!(decode::<T>(b"{\"a\":-1}").is_err());
    }
}
