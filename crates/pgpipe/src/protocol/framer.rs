//! Message boundaries of the PostgreSQL wire protocol, one direction at a
//! time: a type byte and a length, and of the payload only what a caller
//! asks to keep (a setting's name; the SQL of `Query` and `Parse` while
//! [`Framer::capture_sql`] is on).

/// Where a direction of the stream is in the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Frontend only: the untyped start-up packet (length, then a code).
    Startup,
    /// Typed messages: a type byte, then an i32 length that counts itself.
    Typed,
    /// Frontend only: an SSLRequest went out; the server's one-byte answer
    /// decides between TLS (opaque) and plaintext (a start-up packet next).
    Negotiating,
    /// TLS or anything unparseable follows: count bytes only.
    Opaque,
}

/// Walks message boundaries in one direction of the stream.
#[derive(Debug)]
pub(crate) struct Framer {
    pub(crate) phase: Phase,
    header: [u8; 8],
    header_len: usize,
    /// Body bytes of the current message still to come.
    body_left: usize,
    kind: u8,
    /// The first body byte of the current message (ReadyForQuery's status).
    first: Option<u8>,
    /// The start of a ParameterStatus body: the setting's name.
    prefix: [u8; PREFIX],
    prefix_len: usize,
    /// Whether the bodies of `Query` and `Parse` messages are kept whole.
    capture: bool,
    /// The kept body of the current message, up to [`CAPTURED`] bytes.
    captured: Vec<u8>,
    /// Whether the current message's body was longer than that.
    overflowed: bool,
}

/// The longest `Query` or `Parse` body kept whole; a longer one is
/// reported as cut short.
const CAPTURED: usize = 64 * 1024;

/// How much of a ParameterStatus body is kept: enough for the names of the
/// settings the server reports.
const PREFIX: usize = 32;

/// One complete message seen by a [`Framer`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Message<'a> {
    pub(crate) kind: u8,
    pub(crate) first: Option<u8>,
    prefix: [u8; PREFIX],
    prefix_len: usize,
    /// With [`Framer::capture_sql`] on, a `Query` or `Parse` body: whole
    /// (`Ok`), or cut short at [`CAPTURED`] bytes (`Err`).
    pub(crate) body: Option<Result<&'a [u8], &'a [u8]>>,
}

impl Message<'_> {
    /// For a ParameterStatus (`S`) from the server, the setting's name (up
    /// to its first 31 bytes); for a simple Query (`Q`), its SQL's first
    /// bytes, the same way; empty for other messages.
    pub(crate) fn parameter_name(&self) -> &[u8] {
        let prefix = &self.prefix[..self.prefix_len];
        prefix
            .iter()
            .position(|&b| b == 0)
            .map_or(prefix, |end| &prefix[..end])
    }
}

pub(crate) const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

impl Framer {
    pub(crate) fn new(phase: Phase) -> Framer {
        Framer {
            phase,
            header: [0; 8],
            header_len: 0,
            body_left: 0,
            kind: 0,
            first: None,
            prefix: [0; PREFIX],
            prefix_len: 0,
            capture: false,
            captured: Vec::new(),
            overflowed: false,
        }
    }

    /// Keeps the bodies of `Query` and `Parse` messages that start from now
    /// on whole, for the callback of [`feed`](Framer::feed), or stops.
    pub(crate) fn capture_sql(&mut self, on: bool) {
        if self.capture && !on {
            self.captured = Vec::new();
        }
        self.capture = on;
    }

    fn capturing(&self) -> bool {
        self.capture && matches!(self.kind, b'Q' | b'P')
    }

    /// Whether it stands between two messages (not inside one).
    pub(crate) fn at_boundary(&self) -> bool {
        self.header_len == 0 && self.body_left == 0
    }

    fn header_size(&self) -> usize {
        if self.phase == Phase::Startup { 8 } else { 5 }
    }

    /// Feeds bytes that went over the wire, calling `on_message` for each
    /// message that completes.
    pub(crate) fn feed(&mut self, mut bytes: &[u8], mut on_message: impl FnMut(Message<'_>)) {
        while !bytes.is_empty() && !matches!(self.phase, Phase::Opaque | Phase::Negotiating) {
            if self.body_left > 0 {
                let take = self.body_left.min(bytes.len());
                if self.first.is_none() {
                    self.first = Some(bytes[0]);
                }
                if matches!(self.kind, b'S' | b'Q') && self.prefix_len < PREFIX {
                    let keep = take.min(PREFIX - self.prefix_len);
                    self.prefix[self.prefix_len..self.prefix_len + keep]
                        .copy_from_slice(&bytes[..keep]);
                    self.prefix_len += keep;
                }
                if self.capturing() {
                    let room = CAPTURED.saturating_sub(self.captured.len());
                    self.captured.extend_from_slice(&bytes[..take.min(room)]);
                    self.overflowed |= take > room;
                }
                self.body_left -= take;
                bytes = &bytes[take..];
                if self.body_left == 0 {
                    self.finish(&mut on_message);
                }
                continue;
            }
            let need = self.header_size() - self.header_len;
            let take = need.min(bytes.len());
            self.header[self.header_len..self.header_len + take].copy_from_slice(&bytes[..take]);
            self.header_len += take;
            bytes = &bytes[take..];
            if self.header_len == self.header_size() {
                self.start_body(&mut on_message);
            }
        }
    }

    fn start_body(&mut self, on_message: &mut impl FnMut(Message<'_>)) {
        self.header_len = 0;
        self.first = None;
        self.prefix_len = 0;
        self.captured.clear();
        self.overflowed = false;
        let (kind, len_bytes, counted) = match self.phase {
            Phase::Startup => (0, &self.header[0..4], 8),
            _ => (self.header[0], &self.header[1..5], 4),
        };
        let len = i32::from_be_bytes(len_bytes.try_into().expect("4 bytes"));
        if len < counted as i32 {
            // Not a frame this parser understands: stop parsing, keep counting.
            self.phase = Phase::Opaque;
            return;
        }
        if self.phase == Phase::Startup {
            let code = u32::from_be_bytes(self.header[4..8].try_into().expect("4 bytes"));
            if code == SSL_REQUEST || code == GSSENC_REQUEST {
                // Not a request the server answers with ReadyForQuery: a
                // one-byte yes or no to encryption, which the reader sees.
                self.phase = Phase::Negotiating;
                return;
            }
            self.phase = Phase::Typed;
        }
        self.kind = kind;
        self.body_left = len as usize - counted;
        if self.body_left == 0 {
            self.finish(on_message);
        }
    }

    fn finish(&mut self, on_message: &mut impl FnMut(Message<'_>)) {
        let body = self.capturing().then(|| {
            if self.overflowed {
                Err(&self.captured[..])
            } else {
                Ok(&self.captured[..])
            }
        });
        on_message(Message {
            kind: self.kind,
            first: self.first.take(),
            prefix: self.prefix,
            prefix_len: std::mem::take(&mut self.prefix_len),
            body,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn sql_is_captured_whole_across_writes_and_cut_short_past_its_bound() {
        let mut framer = Framer::new(Phase::Typed);
        framer.capture_sql(true);
        let mut stream = message(b'Q', b"SELECT setseed(0.5)\0");
        stream.extend(message(b'P', b"s1\0LOAD 'x'\0\0\0"));
        stream.extend(message(b'S', b""));
        // Each message's kind, and its body kept whole (or its kept length).
        type Kept = Option<Result<Vec<u8>, usize>>;
        let mut seen: Vec<(u8, Kept)> = Vec::new();
        for chunk in stream.chunks(3) {
            framer.feed(chunk, |m| {
                seen.push((
                    m.kind,
                    m.body.map(|b| b.map(<[u8]>::to_vec).map_err(<[u8]>::len)),
                ));
            });
        }
        assert_eq!(
            seen,
            [
                (b'Q', Some(Ok(b"SELECT setseed(0.5)\0".to_vec()))),
                (b'P', Some(Ok(b"s1\0LOAD 'x'\0\0\0".to_vec()))),
                (b'S', None),
            ]
        );
        let long = vec![b'x'; CAPTURED + 10];
        let mut cut = None;
        framer.feed(&message(b'Q', &long), |m| {
            cut = m.body.map(|b| b.map(<[u8]>::len).map_err(<[u8]>::len));
        });
        assert_eq!(cut, Some(Err(CAPTURED)));
        framer.capture_sql(false);
        let mut kept = true;
        framer.feed(&message(b'Q', b"SELECT 1\0"), |m| kept = m.body.is_some());
        assert!(!kept, "nothing kept while capture is off");
    }

    fn messages(phase: Phase, chunks: &[&[u8]]) -> Vec<(u8, Option<u8>)> {
        let mut framer = Framer::new(phase);
        let mut seen = Vec::new();
        for chunk in chunks {
            framer.feed(chunk, |m| seen.push((m.kind, m.first)));
        }
        seen
    }

    #[test]
    fn counts_syncs_across_split_writes() {
        // Bind(empty body) + Sync + Sync, split inside a header.
        let bytes: &[u8] = &[b'B', 0, 0, 0, 5, 9, b'S', 0, 0, 0, 4, b'S', 0, 0, 0, 4];
        for split in 0..bytes.len() {
            let (a, b) = bytes.split_at(split);
            let seen = messages(Phase::Typed, &[a, b]);
            let syncs = seen.iter().filter(|(k, _)| *k == b'S').count();
            assert_eq!(syncs, 2, "split at {split}");
        }
    }

    #[test]
    fn random_streams_split_anywhere_are_counted_exactly() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let mut stream = Vec::new();
            let mut syncs = 0;
            for _ in 0..(next() % 50) {
                let kind = [b'B', b'E', b'S', b'P', b'D', b'C'][(next() % 6) as usize];
                let body = if kind == b'S' {
                    0
                } else {
                    (next() % 300) as usize
                };
                syncs += usize::from(kind == b'S');
                stream.push(kind);
                stream.extend_from_slice(&((body + 4) as i32).to_be_bytes());
                stream.extend((0..body).map(|_| (next() % 256) as u8));
            }
            let mut framer = Framer::new(Phase::Typed);
            let mut seen = 0;
            let mut rest = stream.as_slice();
            while !rest.is_empty() {
                let n = 1 + (next() as usize % rest.len().min(97));
                framer.feed(&rest[..n], |m| seen += usize::from(m.kind == b'S'));
                rest = &rest[n..];
            }
            assert_eq!(seen, syncs);
            assert_eq!(framer.phase, Phase::Typed);
        }
    }

    #[test]
    fn reads_ready_for_query_status_byte_split_from_header() {
        let seen = messages(Phase::Typed, &[&[b'Z', 0, 0, 0, 5], b"T"]);
        assert_eq!(seen, vec![(b'Z', Some(b'T'))]);
    }

    #[test]
    fn startup_packet_then_typed_messages() {
        let mut startup = vec![0, 0, 0, 9, 0, 3, 0, 0, 0];
        startup.extend_from_slice(&[b'S', 0, 0, 0, 4]);
        let seen = messages(Phase::Startup, &[&startup]);
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[1].0, b'S');
    }

    #[test]
    fn an_ssl_request_is_not_a_request_and_waits_for_the_answer() {
        let mut bytes = vec![0, 0, 0, 8];
        bytes.extend_from_slice(&SSL_REQUEST.to_be_bytes());
        bytes.extend_from_slice(&[b'S', 0, 0, 0, 4]);
        let seen = messages(Phase::Startup, &[&bytes]);
        assert!(
            seen.is_empty(),
            "neither the SSLRequest nor what follows it"
        );
    }

    #[test]
    fn nonsense_length_stops_parsing_instead_of_panicking() {
        let seen = messages(Phase::Typed, &[&[b'D', 0xff, 0xff, 0xff, 0xff, 1, 2, 3]]);
        assert!(seen.is_empty());
        let seen = messages(Phase::Typed, &[&[b'D', 0, 0, 0, 2]]);
        assert!(seen.is_empty());
    }

    #[test]
    fn a_parameter_status_keeps_the_setting_name() {
        let mut bytes = vec![b'S', 0, 0, 0, 4 + 15 + 4];
        bytes.extend_from_slice(b"in_hot_standby\0off\0");
        let mut names = Vec::new();
        let mut framer = Framer::new(Phase::Typed);
        for chunk in bytes.chunks(3) {
            framer.feed(chunk, |m| names.push(m.parameter_name().to_vec()));
        }
        assert_eq!(names, vec![b"in_hot_standby".to_vec()]);
    }
}
