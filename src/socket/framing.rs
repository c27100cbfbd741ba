//! Line framing of the daemon socket (seed 004, "Framing"): one JSON object
//! per line ending in `\n`, empty lines skipped, and a line longer than the
//! limit closes the connection. Pure: bytes in, lines out.

/// Accumulates bytes from a stream and yields complete lines.
pub struct LineBuffer {
    buf: Vec<u8>,
    /// Where the next line starts.
    start: usize,
    /// How far `buf[start..]` has been searched for `\n` already, so that a
    /// long line arriving in many reads is scanned once.
    scanned: usize,
    max: usize,
}

/// A line exceeded the limit; the connection must be closed.
#[derive(Debug, PartialEq)]
pub struct LineTooLong;

impl LineBuffer {
    pub fn new(max: usize) -> LineBuffer {
        LineBuffer {
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            max,
        }
    }

    /// Appends bytes read from the stream.
    pub fn extend(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            self.scanned = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// The next complete, non-empty line without its `\n` (and without a
    /// `\r` before it), or `None` when more bytes are needed.
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>, LineTooLong> {
        let mut line = Vec::new();
        Ok(self.next_line_into(&mut line)?.map(|_| line))
    }

    /// Like [`LineBuffer::next_line`], but appends the line to `out` and
    /// returns where it lies there, so that a caller collecting the lines
    /// of one read in one buffer allocates nothing per line.
    pub fn next_line_into(
        &mut self,
        out: &mut Vec<u8>,
    ) -> Result<Option<std::ops::Range<usize>>, LineTooLong> {
        loop {
            let pending = &self.buf[self.start..];
            match memchr(&pending[self.scanned..]) {
                Some(i) => {
                    let end = self.start + self.scanned + i;
                    if end - self.start > self.max {
                        return Err(LineTooLong);
                    }
                    let got = content(&self.buf[self.start..end]).map(|line| {
                        let at = out.len();
                        out.extend_from_slice(line);
                        at..out.len()
                    });
                    self.start = end + 1;
                    self.scanned = 0;
                    self.compact();
                    if got.is_some() {
                        return Ok(got);
                    }
                }
                None => {
                    self.scanned = pending.len();
                    if pending.len() > self.max {
                        return Err(LineTooLong);
                    }
                    self.compact();
                    return Ok(None);
                }
            }
        }
    }

    /// Bytes held that are not yet a complete line.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    fn compact(&mut self) {
        // Move the partial line to the front once the consumed prefix is the
        // larger part, so the buffer's memory tracks what is still pending.
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        // An idle reader keeps no big buffer after one long line.
        if self.buf.is_empty() && self.buf.capacity() > crate::limits::LINE_BUFFER_IDLE_KEEP {
            self.buf = Vec::new();
            self.scanned = 0;
        }
    }
}

/// What a line (without its `\n`) carries: without a `\r` before the
/// `\n`, and `None` when it is empty or blank, as such lines are skipped.
pub fn content(line: &[u8]) -> Option<&[u8]> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    (!line.iter().all(u8::is_ascii_whitespace)).then_some(line)
}

/// The first `\n` in `hay`, eight bytes at a time: a relayed frame of the
/// gateway is one line of up to megabytes, and a byte-by-byte search was
/// the largest cost of relaying 64 KiB frames (issue 12's profile). A word
/// holds a `\n` when XOR with eight `\n`s leaves a zero byte, which
/// `(w - 0x01..) & !w & 0x80..` detects; that word is then searched byte by
/// byte, so the result is exact.
pub fn memchr(hay: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    const NEWLINES: u64 = ONES * b'\n' as u64;
    let newline = |c: &[u8]| c.iter().position(|&b| b == b'\n');
    let mut words = hay.chunks_exact(8);
    let mut at = 0;
    for c in &mut words {
        // One load; byte i of the slice is byte i of the word.
        let word = u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) ^ NEWLINES;
        if word.wrapping_sub(ONES) & !word & HIGHS != 0 {
            return newline(c).map(|i| at + i);
        }
        at += 8;
    }
    newline(words.remainder()).map(|i| at + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_word_search_finds_what_the_byte_search_finds() {
        // Every position of a newline in lines of every length up to 40,
        // with bytes around it that differ from '\n' by one bit.
        for len in 0..40 {
            for nl in (0..len).map(Some).chain([None]) {
                let mut hay: Vec<u8> = (0..len)
                    .map(|i| [0x0b, 0x09, 0x8a, 0x00, b'a'][i % 5])
                    .collect();
                if let Some(i) = nl {
                    hay[i] = b'\n';
                    if i + 3 < len {
                        hay[i + 3] = b'\n';
                    }
                }
                assert_eq!(
                    memchr(&hay),
                    hay.iter().position(|&b| b == b'\n'),
                    "{hay:?}"
                );
            }
        }
    }

    #[test]
    fn splits_lines_across_reads_and_skips_empty_ones() {
        let mut b = LineBuffer::new(100);
        b.extend(b"{\"a\":1}\n\n  \r\n{\"b\"");
        assert_eq!(b.next_line().unwrap(), Some(b"{\"a\":1}".to_vec()));
        assert_eq!(b.next_line().unwrap(), None);
        b.extend(b":2}\r\n");
        assert_eq!(b.next_line().unwrap(), Some(b"{\"b\":2}".to_vec()));
        assert_eq!(b.next_line().unwrap(), None);
        assert_eq!(b.pending(), 0);
    }

    #[test]
    fn a_line_over_the_limit_is_refused_before_its_end_arrives() {
        let mut b = LineBuffer::new(8);
        b.extend(b"123456789");
        assert_eq!(b.next_line(), Err(LineTooLong));
        let mut b = LineBuffer::new(8);
        b.extend(b"12345678\n123456789\n");
        assert_eq!(b.next_line().unwrap(), Some(b"12345678".to_vec()));
        assert_eq!(b.next_line(), Err(LineTooLong));
    }
}
