//! Message boundaries of the PostgreSQL wire protocol, one direction at a
//! time: a type byte and a length, where each message starts and ends in
//! the stream, and of the payload only what its user asks to keep (its
//! [`Keep`]: for the tap, a setting's name and the SQL of `Query` and
//! `Parse` while [`Framer::capture_sql`] is on; for the read-group
//! rewriter's writes, the start of `Bind`, `Execute`, `Close` and `Query`,
//! whole `Parse` and `Query` bodies, and where each message sits in the
//! stream).
//!
//! The one walker of the protocol: the tap's two directions and the
//! rewriter's (`coalesce`) all frame with it. On a connection that groups
//! reads, the tap reads the writes from the rewriter's walk (one pass,
//! not two). [`Framer::next`] hands out
//! the whole messages a chunk of the stream completes, one at a time;
//! [`Framer::feed`] calls back with each. What a framer keeps is a type
//! (`Framer<Tap>`, `Framer<Writes>`, `Framer<Answers>`), so that each
//! compiles to what its user needs and nothing more: the tap's runs on
//! every byte of every connection.

mod keep;

use std::marker::PhantomData;

pub(crate) use keep::{Answers, Keep, Tap, Writes};

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

/// Walks message boundaries in one direction of the stream, keeping what
/// `K` says.
#[derive(Debug)]
pub(crate) struct Framer<K: Keep = Tap> {
    pub(crate) phase: Phase,
    header: [u8; 8],
    header_len: u8,
    kind: u8,
    /// The first body byte of the current message (ReadyForQuery's status).
    first: Option<u8>,
    /// How much of `prefix` the current message filled.
    prefix_len: u8,
    /// Whether the bodies `K` names are kept whole.
    capture: bool,
    /// Whether the current message's body was longer than [`CAPTURED`].
    overflowed: bool,
    /// Body bytes of the current message still to come.
    body_left: usize,
    /// The start of the current message's body, if `K` keeps it.
    prefix: K::Prefix,
    /// The kept body of the current message, up to [`CAPTURED`] bytes.
    captured: Vec<u8>,
    /// With `K::OFFSETS`: bytes of the stream walked so far (while it
    /// could be parsed), and where the current message starts.
    offset: u64,
    start: u64,
    keep: PhantomData<K>,
}

/// The longest body kept whole; a longer one is reported as cut short.
pub(crate) const CAPTURED: usize = 64 * 1024;

/// One complete message seen by a [`Framer`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Message<'a> {
    pub(crate) kind: u8,
    pub(crate) first: Option<u8>,
    /// The start of its body, for the types its framer's [`Keep`] names
    /// (empty for others).
    pub(crate) prefix: &'a [u8],
    /// With [`Framer::capture_sql`] on, the body of a type its framer's
    /// [`Keep`] keeps whole: whole (`Ok`), or cut short at [`CAPTURED`]
    /// bytes (`Err`).
    pub(crate) body: Option<Result<&'a [u8], &'a [u8]>>,
    /// Where it starts and ends in the stream (bytes since the framer was
    /// made), if its framer's [`Keep`] counts them; else 0.
    pub(crate) start: u64,
    pub(crate) end: u64,
}

impl Message<'_> {
    /// For a ParameterStatus (`S`) from the server, the setting's name (up
    /// to its first 31 bytes); for a simple Query (`Q`), its SQL's first
    /// bytes, the same way; empty for other messages.
    pub(crate) fn parameter_name(&self) -> &[u8] {
        let prefix = self.prefix;
        prefix
            .iter()
            .position(|&b| b == 0)
            .map_or(prefix, |end| &prefix[..end])
    }
}

pub(crate) const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

impl Framer<Tap> {
    /// The tap's framer for one direction, starting at `phase`.
    pub(crate) fn new(phase: Phase) -> Framer<Tap> {
        Framer::keeping(phase)
    }
}

impl<K: Keep> Framer<K> {
    /// A framer that keeps what `K` says, starting at `phase`.
    pub(crate) fn keeping(phase: Phase) -> Framer<K> {
        Framer {
            phase,
            header: [0; 8],
            header_len: 0,
            kind: 0,
            first: None,
            prefix_len: 0,
            capture: false,
            overflowed: false,
            body_left: 0,
            prefix: K::EMPTY,
            captured: Vec::new(),
            offset: 0,
            start: 0,
            keep: PhantomData,
        }
    }

    /// Keeps the bodies `K` names that start from now on whole, for
    /// [`Message::body`], or stops.
    pub(crate) fn capture_sql(&mut self, on: bool) {
        if self.capture && !on {
            self.captured = Vec::new();
        }
        self.capture = on;
    }

    #[inline]
    fn capturing(&self) -> bool {
        self.capture && K::whole(self.kind)
    }

    /// Whether it stands between two messages (not inside one).
    pub(crate) fn at_boundary(&self) -> bool {
        self.header_len == 0 && self.body_left == 0
    }

    /// With `K::OFFSETS`, bytes of the stream walked so far: where the next
    /// byte fed sits.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    #[inline]
    fn header_size(&self) -> usize {
        if self.phase == Phase::Startup { 8 } else { 5 }
    }

    /// Feeds bytes that went over the wire, calling `on_message` for each
    /// message that completes.
    #[inline]
    pub(crate) fn feed(&mut self, mut bytes: &[u8], mut on_message: impl FnMut(Message<'_>)) {
        while let Some(message) = self.next(&mut bytes) {
            on_message(message);
        }
    }

    /// Walks `bytes` up to the end of the next message they complete and
    /// returns it, leaving the rest in `bytes`; `None` once `bytes` is used
    /// up, or the stream can no longer be parsed (what was read of a
    /// message waits for the next call). Always inlined: `feed` is then the
    /// loop it was before `next` existed, with the callback inside it.
    #[inline(always)]
    pub(crate) fn next<'s, 'b: 's>(&'s mut self, bytes: &mut &'b [u8]) -> Option<Message<'s>> {
        if let Some(len) = self.whole_message_at(bytes) {
            return Some(self.take_whole(bytes, len));
        }
        self.next_in_pieces(bytes)
    }

    /// The length field of the typed message that `bytes` hold whole from
    /// their first byte, if the framer stands between two messages: the
    /// common case, a write or a read of whole messages, framed without
    /// copying its header or walking its body piece by piece.
    #[inline(always)]
    fn whole_message_at(&self, bytes: &[u8]) -> Option<usize> {
        if self.header_len != 0 || self.body_left != 0 || self.phase != Phase::Typed {
            return None;
        }
        let header: [u8; 4] = bytes.get(1..5)?.try_into().expect("4 bytes");
        let len = i32::from_be_bytes(header);
        // A length under 4 is no frame: the piecewise walk stops on it.
        let len = usize::try_from(len).ok().filter(|&len| len >= 4)?;
        (bytes.len() > len).then_some(len)
    }

    /// Hands out the message of length field `len` that `bytes` hold whole
    /// (see [`whole_message_at`](Self::whole_message_at)): what
    /// [`next_in_pieces`](Self::next_in_pieces) would give for it, in one
    /// step.
    ///
    /// Its prefix and kept body are borrowed from `bytes`, not copied:
    /// only a message split across calls needs the framer's own copies.
    #[inline(always)]
    fn take_whole<'s, 'b: 's>(&'s mut self, bytes: &mut &'b [u8], len: usize) -> Message<'s> {
        let kind = bytes[0];
        let body: &'b [u8] = &bytes[5..1 + len];
        *bytes = &bytes[1 + len..];
        self.kind = kind;
        let prefix: &'b [u8] = if K::prefix(kind) {
            &body[..body.len().min(self.prefix.as_ref().len())]
        } else {
            &[]
        };
        let kept = self.capturing().then(|| {
            if body.len() > CAPTURED {
                Err(&body[..CAPTURED])
            } else {
                Ok(body)
            }
        });
        let start = self.offset;
        if K::OFFSETS {
            self.start = start;
            self.offset += 1 + len as u64;
        }
        Message {
            kind,
            first: body.first().copied(),
            prefix,
            body: kept,
            start: if K::OFFSETS { start } else { 0 },
            end: self.offset,
        }
    }

    /// [`next`](Self::next) for messages split across calls, the start-up
    /// packet and the phases before the typed protocol: byte by byte
    /// through the header, then the body.
    fn next_in_pieces(&mut self, bytes: &mut &[u8]) -> Option<Message<'_>> {
        while !bytes.is_empty() && !matches!(self.phase, Phase::Opaque | Phase::Negotiating) {
            if self.body_left > 0 {
                let take = self.body_left.min(bytes.len());
                if self.first.is_none() {
                    self.first = Some(bytes[0]);
                }
                let room = self.prefix.as_ref().len() - usize::from(self.prefix_len);
                if room > 0 && K::prefix(self.kind) {
                    let keep = take.min(room);
                    let from = usize::from(self.prefix_len);
                    self.prefix.as_mut()[from..from + keep].copy_from_slice(&bytes[..keep]);
                    self.prefix_len += keep as u8;
                }
                if self.capturing() {
                    let room = CAPTURED.saturating_sub(self.captured.len());
                    self.captured.extend_from_slice(&bytes[..take.min(room)]);
                    self.overflowed |= take > room;
                }
                self.body_left -= take;
                if K::OFFSETS {
                    self.offset += take as u64;
                }
                *bytes = &bytes[take..];
                if self.body_left == 0 {
                    return Some(self.finish());
                }
                continue;
            }
            let (have, size) = (usize::from(self.header_len), self.header_size());
            if K::OFFSETS && have == 0 {
                self.start = self.offset;
            }
            let take = (size - have).min(bytes.len());
            self.header[have..have + take].copy_from_slice(&bytes[..take]);
            self.header_len += take as u8;
            if K::OFFSETS {
                self.offset += take as u64;
            }
            *bytes = &bytes[take..];
            if have + take == size && self.start_body() {
                return Some(self.finish());
            }
        }
        None
    }

    /// Reads the header just completed; returns whether the message is
    /// complete already (an empty body).
    fn start_body(&mut self) -> bool {
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
            return false;
        }
        if self.phase == Phase::Startup {
            let code = u32::from_be_bytes(self.header[4..8].try_into().expect("4 bytes"));
            if code == SSL_REQUEST || code == GSSENC_REQUEST {
                // Not a request the server answers with ReadyForQuery: a
                // one-byte yes or no to encryption, which the reader sees.
                self.phase = Phase::Negotiating;
                return false;
            }
            self.phase = Phase::Typed;
        }
        self.kind = kind;
        self.body_left = len as usize - counted;
        self.body_left == 0
    }

    fn finish(&mut self) -> Message<'_> {
        let body = self.capturing().then(|| {
            if self.overflowed {
                Err(&self.captured[..])
            } else {
                Ok(&self.captured[..])
            }
        });
        Message {
            kind: self.kind,
            first: self.first.take(),
            prefix: &self.prefix.as_ref()[..usize::from(self.prefix_len)],
            body,
            start: self.start,
            end: self.offset,
        }
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
    fn next_hands_out_whole_messages_with_their_place_in_the_stream() {
        let bind = message(b'B', b"\0s1\0\0\0\0\0\0\0");
        let parse = message(b'P', b"s2\0SELECT 1\0\0\0");
        let stream = [bind.clone(), parse.clone(), message(b'S', b"")].concat();
        let mut framer = Framer::<Writes>::keeping(Phase::Typed);
        framer.capture_sql(true);
        // Split anywhere: the same messages, at the same offsets.
        for split in 0..stream.len() {
            let base = framer.offset();
            let mut seen = Vec::new();
            for chunk in [&stream[..split], &stream[split..]] {
                let mut rest = chunk;
                while let Some(m) = framer.next(&mut rest) {
                    let body = m.body.map(|b| b.map(<[u8]>::to_vec).map_err(<[u8]>::len));
                    seen.push((m.kind, m.start, m.end, m.prefix.to_vec(), body));
                }
                assert!(rest.is_empty());
            }
            let (b, p) = (bind.len() as u64, parse.len() as u64);
            assert_eq!(
                seen,
                [
                    (b'B', base, base + b, bind[5..].to_vec(), None),
                    (
                        b'P',
                        base + b,
                        base + b + p,
                        vec![],
                        Some(Ok(parse[5..].to_vec()))
                    ),
                    (b'S', base + b + p, base + b + p + 5, vec![], None),
                ],
                "split at {split}"
            );
        }
        // The tap's framer keeps none of that.
        let mut tap = Framer::new(Phase::Typed);
        tap.capture_sql(true);
        let mut rest = &stream[..];
        let m = tap.next(&mut rest).expect("the Bind");
        assert!(m.prefix.is_empty() && m.body.is_none());
        assert_eq!(
            rest.len(),
            stream.len() - bind.len(),
            "only the Bind is walked"
        );
    }

    /// Every field of every message, for a stream fed in chunks of `size`.
    fn walk<K: Keep>(stream: &[u8], size: usize) -> Vec<String> {
        let mut framer = Framer::<K>::keeping(Phase::Typed);
        framer.capture_sql(true);
        let mut seen = Vec::new();
        for chunk in stream.chunks(size) {
            let mut rest = chunk;
            while let Some(m) = framer.next(&mut rest) {
                seen.push(format!("{m:?}"));
            }
        }
        seen
    }

    #[test]
    fn whole_messages_are_framed_as_the_piecewise_walk_frames_them() {
        // Whole messages take the one-step path, messages split across
        // chunks the byte-by-byte one: both must hand out the same.
        let long = vec![b'x'; CAPTURED + 3];
        let mut stream = Vec::new();
        for (kind, body) in [
            (b'B', &b"\0s1\0\0\0\0\0\0\0"[..]),
            (b'E', b"\0\0\0\0\0"),
            (b'S', b""),
            (b'P', b"s2\0SELECT 1\0\0\0"),
            (b'Q', b"SET a = 1\0"),
            (b'Z', b"T"),
            (b'Q', &long),
            (b'C', &[b'S'; 100]),
        ] {
            stream.extend(message(kind, body));
        }
        for size in [1, 2, 5, 7, 64, stream.len()] {
            assert_eq!(
                walk::<Tap>(&stream, size),
                walk::<Tap>(&stream, 1),
                "{size}"
            );
            assert_eq!(walk::<Writes>(&stream, size), walk::<Writes>(&stream, 1));
            assert_eq!(walk::<Answers>(&stream, size), walk::<Answers>(&stream, 1));
        }
        // A length under 4 stops both alike.
        let bad = [message(b'S', b""), vec![b'D', 0, 0, 0, 2, 1]].concat();
        assert_eq!(walk::<Tap>(&bad, bad.len()), walk::<Tap>(&bad, 1));
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

#[cfg(test)]
mod fuzz;
