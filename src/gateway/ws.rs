//! The gateway's WebSocket frame reader (RFC 6455, section 5; seed 004,
//! "Transports", "Framing"; issue 12, relay throughput): what a
//! connection's reader thread reads after the handshake, which tungstenite
//! still does ([`super::conn`]).
//!
//! Why our own. tungstenite read every byte of a relayed frame into its
//! read buffer, then into the frame's payload, then into the message; at
//! 64 KiB frames those copies and the 4 KiB reads they came in were the
//! relay's largest costs after the envelope scan (issue 12's profile).
//! Here a payload goes from the socket straight into the message's own
//! `Vec` (one `read` for what the kernel holds, no buffer in between,
//! nothing zeroed first) and is unmasked there sixty-four bytes a turn. A
//! text message must be UTF-8 (8.1): the caller checks it, whole, where
//! it can do so for free ([`super::conn::take_message`]). Only headers and small
//! payloads pass through the connection's fixed read buffer
//! (`GATEWAY_READ_BUFFER`), so several small frames cost one `read`.
//!
//! What it enforces, as tungstenite did for the gateway: client frames
//! must be masked (5.1); no reserved bits or opcodes (5.2); control frames
//! are final and at most 125 bytes (5.5), and may come between the
//! fragments of a message (5.4); a continuation needs a message under way
//! and a new message needs none; a message (all its fragments) is at most
//! `GATEWAY_MAX_MESSAGE` bytes, refused from its header before anything
//! is read. Any breach is an error
//! and the connection is closed. The frames a server sends back (a pong,
//! the close reply) are built here too, unmasked (5.1).

use std::io::{self, Read};

/// One thing read off the connection.
#[derive(Debug, PartialEq)]
pub enum Event {
    /// A whole data message (every fragment), unmasked; `text` when its
    /// opcode was text, and then the caller must check it is UTF-8.
    Message { bytes: Vec<u8>, text: bool },
    /// A ping and its payload, to answer with a pong of the same payload.
    Ping(Vec<u8>),
    /// A pong: nothing to do.
    Pong,
    /// A close frame and its payload (status code and reason).
    Close(Vec<u8>),
}

/// Why reading stopped.
#[derive(Debug)]
pub enum WsError {
    /// The socket failed or ended (also in the middle of a frame).
    Io(io::Error),
    /// The peer broke RFC 6455; what it did.
    Protocol(&'static str),
}

impl From<io::Error> for WsError {
    fn from(e: io::Error) -> WsError {
        WsError::Io(e)
    }
}

/// A connection's frame reader: its read buffer and the message under way.
pub struct Reader {
    buf: Box<[u8]>,
    /// `buf[pos..end]` is read and not yet taken.
    pos: usize,
    end: usize,
    /// The fragmented message under way (its opcode said text), if any.
    partial: Option<(Vec<u8>, bool)>,
    max: usize,
}

impl Reader {
    /// A reader with a read buffer of `buffer` bytes (at least 14, a
    /// frame header's most) taking messages of at most `max` bytes.
    pub fn new(buffer: usize, max: usize) -> Reader {
        Reader {
            buf: vec![0; buffer.max(14)].into_boxed_slice(),
            pos: 0,
            end: 0,
            partial: None,
            max,
        }
    }

    /// Whether the read buffer holds a whole frame that ends a message or
    /// is a control frame: [`Reader::next`] then returns without reading.
    pub fn ready(&self) -> bool {
        let b = &self.buf[self.pos..self.end];
        if b.len() < 2 {
            return false;
        }
        let (len, head) = match b[1] & 0x7F {
            126 if b.len() >= 4 => (u16::from_be_bytes([b[2], b[3]]) as u64, 8usize),
            127 if b.len() >= 10 => (
                u64::from_be_bytes(b[2..10].try_into().unwrap_or([0xFF; 8])),
                14,
            ),
            126 | 127 => return false,
            n => (n as u64, 6),
        };
        let whole = b.len() >= head && (b.len() - head) as u64 >= len;
        whole && (b[0] & 0x80 != 0 || b[0] & 0x08 != 0)
    }

    /// Reads until `n` bytes are in the buffer; `n` fits it.
    fn fill(&mut self, src: &mut impl Read, n: usize) -> Result<(), WsError> {
        while self.end - self.pos < n {
            if self.pos == self.end {
                (self.pos, self.end) = (0, 0);
            } else if self.buf.len() - self.pos < n {
                self.buf.copy_within(self.pos..self.end, 0);
                (self.pos, self.end) = (0, self.end - self.pos);
            }
            match src.read(&mut self.buf[self.end..]) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
                Ok(k) => self.end += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Appends `len` payload bytes to `out`: what the buffer holds first,
    /// the rest straight from the socket into `out`'s spare room.
    fn payload(
        &mut self,
        src: &mut impl Read,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), WsError> {
        let have = (self.end - self.pos).min(len);
        out.extend_from_slice(&self.buf[self.pos..self.pos + have]);
        self.pos += have;
        let rest = (len - have) as u64;
        if rest == 0 {
            return Ok(());
        }
        if rest < self.buf.len() as u64 / 2 {
            // Small: through the buffer, which may take the next frames
            // with it in the same read.
            let rest = rest as usize;
            self.fill(src, rest)?;
            out.extend_from_slice(&self.buf[self.pos..self.pos + rest]);
            self.pos += rest;
            return Ok(());
        }
        // `read_to_end` reads into the reserved room without zeroing it.
        let want = out.len() + rest as usize;
        out.reserve_exact(rest as usize);
        (&mut *src).take(rest).read_to_end(out)?;
        if out.len() != want {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
        }
        Ok(())
    }

    /// The next event; control frames are returned as they come, also
    /// between the fragments of a message.
    pub fn next(&mut self, src: &mut impl Read) -> Result<Event, WsError> {
        loop {
            self.fill(src, 2)?;
            let (b0, b1) = (self.buf[self.pos], self.buf[self.pos + 1]);
            let fin = b0 & 0x80 != 0;
            if b0 & 0x70 != 0 {
                return Err(WsError::Protocol("reserved bits set"));
            }
            let opcode = b0 & 0x0F;
            if b1 & 0x80 == 0 {
                return Err(WsError::Protocol("an unmasked client frame"));
            }
            let head =
                2 + match b1 & 0x7F {
                    126 => 2,
                    127 => 8,
                    _ => 0,
                } + 4;
            self.fill(src, head)?;
            let h = &self.buf[self.pos..self.pos + head];
            let len = match b1 & 0x7F {
                126 => u16::from_be_bytes([h[2], h[3]]) as u64,
                127 => u64::from_be_bytes(h[2..10].try_into().unwrap_or([0xFF; 8])),
                n => n as u64,
            };
            let key: [u8; 4] = h[head - 4..head].try_into().unwrap_or([0; 4]);
            self.pos += head;
            if opcode >= 8 {
                if !fin || len > 125 {
                    return Err(WsError::Protocol("a fragmented or long control frame"));
                }
                let mut p = Vec::with_capacity(len as usize);
                self.payload(src, len as usize, &mut p)?;
                unmask(&mut p, key);
                return match opcode {
                    8 => Ok(Event::Close(p)),
                    9 => Ok(Event::Ping(p)),
                    10 => Ok(Event::Pong),
                    _ => Err(WsError::Protocol("a reserved control opcode")),
                };
            }
            let (mut msg, text) = match (opcode, self.partial.take()) {
                (0, Some(p)) => p,
                (1 | 2, None) => (Vec::new(), opcode == 1),
                (0, None) => return Err(WsError::Protocol("a continuation without a message")),
                (1 | 2, Some(_)) => {
                    return Err(WsError::Protocol("a new message inside a fragmented one"));
                }
                _ => return Err(WsError::Protocol("a reserved data opcode")),
            };
            if len > (self.max - msg.len()) as u64 {
                return Err(WsError::Protocol("a message past the size limit"));
            }
            let start = msg.len();
            self.payload(src, len as usize, &mut msg)?;
            unmask(&mut msg[start..], key);
            if !fin {
                self.partial = Some((msg, text));
                continue;
            }
            return Ok(Event::Message { bytes: msg, text });
        }
    }
}

/// XORs `data` with the repeated 4-byte `key`, sixty-four bytes a turn
/// with SSE2, which every x86_64 CPU has: a relayed 64 KiB frame is
/// unmasked once each way, and this loop was the largest share of the
/// gateway's own instructions on it.
#[cfg(target_arch = "x86_64")]
fn unmask(data: &mut [u8], key: [u8; 4]) {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm_set1_epi32, _mm_storeu_si128, _mm_xor_si128,
    };
    // SAFETY: SSE2 is part of the x86_64 baseline, so these instructions
    // exist on every CPU this is built for (the intrinsics are `unsafe`
    // only for that); each load and store touches `c[16 * j..16 * j + 16]`
    // of a chunk of exactly 64 bytes, and `_mm_loadu_si128` and
    // `_mm_storeu_si128` take any alignment.
    let k = unsafe { _mm_set1_epi32(i32::from_ne_bytes(key)) };
    let mut chunks = data.chunks_exact_mut(64);
    for c in &mut chunks {
        let p = c.as_mut_ptr().cast::<__m128i>();
        // SAFETY: as above.
        unsafe {
            for j in 0..4 {
                let v = _mm_loadu_si128(p.add(j));
                _mm_storeu_si128(p.add(j), _mm_xor_si128(v, k));
            }
        }
    }
    // Chunks of sixty-four keep the key's phase.
    unmask_words(chunks.into_remainder(), key);
}

#[cfg(not(target_arch = "x86_64"))]
use unmask_words as unmask;

/// [`unmask`] eight bytes at a time in a `u64`, and what is left of its
/// wide loop.
fn unmask_words(data: &mut [u8], key: [u8; 4]) {
    let k8 = [
        key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3],
    ];
    let word = u64::from_ne_bytes(k8);
    let mut chunks = data.chunks_exact_mut(8);
    for c in &mut chunks {
        let v = u64::from_ne_bytes((&*c).try_into().unwrap_or([0; 8])) ^ word;
        c.copy_from_slice(&v.to_ne_bytes());
    }
    // Chunks of eight keep the key's phase: the tail starts at key[0].
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= key[i % 4];
    }
}

/// The header of an unmasked, final frame of `opcode` and `len` bytes
/// (RFC 6455, 5.2): a server's frames are never masked.
pub fn header(opcode: u8, len: usize) -> ([u8; 10], usize) {
    let mut h = [0u8; 10];
    h[0] = 0x80 | opcode;
    if len < 126 {
        h[1] = len as u8;
        (h, 2)
    } else if len <= 0xFFFF {
        h[1] = 126;
        h[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        (h, 4)
    } else {
        h[1] = 127;
        h[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        (h, 10)
    }
}

/// A whole unmasked control frame (a pong, a close reply); `payload` is at
/// most 125 bytes, as the frame it answers.
pub fn control(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let (h, n) = header(opcode, payload.len());
    let mut f = h[..n].to_vec();
    f.extend_from_slice(payload);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client frame: masked with a fixed key.
    fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let key = [0x37, 0xFA, 0x21, 0x3D];
        let (h, n) = header(opcode, payload.len());
        let mut f = h[..n].to_vec();
        if !fin {
            f[0] &= 0x7F;
        }
        f[1] |= 0x80;
        f.extend_from_slice(&key);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        f
    }

    /// A source that hands out at most `step` bytes a read, to cut
    /// headers and payloads anywhere.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.0.len().min(buf.len()).min(self.1);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn all(bytes: &[u8], step: usize, buffer: usize) -> (Vec<Event>, Option<WsError>) {
        let mut r = Reader::new(buffer, 1 << 20);
        let mut src = Trickle(bytes, step);
        let mut got = Vec::new();
        loop {
            match r.next(&mut src) {
                Ok(e) => got.push(e),
                Err(WsError::Io(e))
                    if e.kind() == io::ErrorKind::UnexpectedEof && src.0.is_empty() =>
                {
                    return (got, None);
                }
                Err(e) => return (got, Some(e)),
            }
        }
    }

    fn text(s: &[u8]) -> Event {
        Event::Message {
            bytes: s.to_vec(),
            text: true,
        }
    }

    #[test]
    fn lengths_of_7_16_and_64_bits_read_alike_however_cut() {
        let big: Vec<u8> = (0..70_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let mid = &big[..300];
        let mut wire = frame(true, 1, b"hi");
        wire.extend(frame(true, 1, mid));
        wire.extend(frame(true, 2, &big));
        wire.extend(frame(true, 1, b""));
        for step in [1, 3, 7, 64, 4096, usize::MAX] {
            for buffer in [16, 64, 4096] {
                let (got, err) = all(&wire, step, buffer);
                assert!(err.is_none(), "step {step} buffer {buffer}: {err:?}");
                assert_eq!(
                    got,
                    vec![
                        text(b"hi"),
                        text(mid),
                        Event::Message {
                            bytes: big.clone(),
                            text: false
                        },
                        text(b""),
                    ]
                );
            }
        }
    }

    #[test]
    fn fragments_join_and_control_frames_come_between_them() {
        let mut wire = frame(false, 1, b"{\"a\":");
        wire.extend(frame(true, 9, b"p1"));
        wire.extend(frame(false, 0, b"\"\xC3"));
        wire.extend(frame(true, 10, b""));
        // A code point cut by a fragment boundary is still valid UTF-8.
        wire.extend(frame(true, 0, b"\xA9\"}\n"));
        wire.extend(frame(true, 8, &[0x03, 0xE8]));
        let (got, err) = all(&wire, 5, 64);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(
            got,
            vec![
                Event::Ping(b"p1".to_vec()),
                Event::Pong,
                text("{\"a\":\"é\"}\n".as_bytes()),
                Event::Close(vec![0x03, 0xE8]),
            ]
        );
    }

    #[test]
    fn breaches_of_rfc_6455_are_errors() {
        let unmasked = {
            let mut f = frame(true, 1, b"x");
            f[1] &= 0x7F;
            f.truncate(2);
            f.push(b'x');
            f
        };
        let rsv = {
            let mut f = frame(true, 1, b"x");
            f[0] |= 0x40;
            f
        };
        let long_ping = frame(true, 9, &[0; 126]);
        let split_ping = frame(false, 9, b"");
        let lone_cont = frame(true, 0, b"x");
        let mut nested = frame(false, 1, b"a");
        nested.extend(frame(true, 1, b"b"));
        let opcode3 = frame(true, 3, b"");
        let opcode11 = frame(true, 11, b"");
        for (name, wire) in [
            ("unmasked", unmasked),
            ("rsv", rsv),
            ("long ping", long_ping),
            ("fragmented ping", split_ping),
            ("lone continuation", lone_cont),
            ("nested message", nested),
            ("opcode 3", opcode3),
            ("opcode 11", opcode11),
        ] {
            let (got, err) = all(&wire, usize::MAX, 4096);
            assert!(
                matches!(err, Some(WsError::Protocol(_))),
                "{name}: {got:?} {err:?}"
            );
        }
    }

    #[test]
    fn a_message_past_the_limit_is_refused_from_its_header() {
        let mut r = Reader::new(4096, 100);
        // A header announcing 2^40 bytes, none of which follow.
        let mut wire = vec![0x82, 0xFF];
        wire.extend((1u64 << 40).to_be_bytes());
        wire.extend([0, 0, 0, 0]);
        assert!(matches!(
            r.next(&mut Trickle(&wire, usize::MAX)),
            Err(WsError::Protocol(_))
        ));
        // Fragments count together.
        let mut r = Reader::new(4096, 100);
        let mut wire = frame(false, 1, &[b'a'; 60]);
        wire.extend(frame(true, 0, &[b'a'; 60]));
        assert!(matches!(
            r.next(&mut Trickle(&wire, usize::MAX)),
            Err(WsError::Protocol(_))
        ));
        // Exactly the limit passes.
        let mut r = Reader::new(4096, 100);
        let wire = frame(true, 1, &[b'a'; 100]);
        assert!(r.next(&mut Trickle(&wire, usize::MAX)).is_ok());
    }

    #[test]
    fn a_frame_cut_by_the_end_of_the_stream_is_an_error() {
        let wire = frame(true, 1, &[b'a'; 5000]);
        let mut r = Reader::new(4096, 1 << 20);
        let err = r.next(&mut Trickle(&wire[..4000], 512)).unwrap_err();
        assert!(matches!(err, WsError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof));
    }

    #[test]
    fn unmasking_keeps_the_key_phase_and_server_frames_are_unmasked() {
        let key = [1, 2, 3, 0xF4];
        for n in [0, 3, 21, 64, 67, 130, 1000] {
            let want: Vec<u8> = (0..n).map(|i| i as u8 ^ key[i % 4]).collect();
            let mut d: Vec<u8> = (0..n).map(|i| i as u8).collect();
            unmask(&mut d, key);
            assert_eq!(d, want, "{n}");
            let mut d: Vec<u8> = (0..n).map(|i| i as u8).collect();
            unmask_words(&mut d, key);
            assert_eq!(d, want, "{n}");
        }
        assert_eq!(control(10, b"ab"), vec![0x8A, 2, b'a', b'b']);
        assert_eq!(&header(1, 126).0[..4], &[0x81, 126, 0, 126]);
        assert_eq!(header(1, 70_000).1, 10);
    }
}
