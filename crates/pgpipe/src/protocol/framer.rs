//! Message boundaries of the PostgreSQL wire protocol, one direction at a
//! time: a type byte and a length, never the payload.

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
}

/// How much of a ParameterStatus body is kept: enough for the names of the
/// settings the server reports.
const PREFIX: usize = 32;

/// One complete message seen by a [`Framer`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Message {
    pub(crate) kind: u8,
    pub(crate) first: Option<u8>,
    prefix: [u8; PREFIX],
    prefix_len: usize,
}

impl Message {
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
        }
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
    pub(crate) fn feed(&mut self, mut bytes: &[u8], mut on_message: impl FnMut(Message)) {
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

    fn start_body(&mut self, on_message: &mut impl FnMut(Message)) {
        self.header_len = 0;
        self.first = None;
        self.prefix_len = 0;
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

    fn finish(&mut self, on_message: &mut impl FnMut(Message)) {
        on_message(Message {
            kind: self.kind,
            first: self.first.take(),
            prefix: self.prefix,
            prefix_len: std::mem::take(&mut self.prefix_len),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
