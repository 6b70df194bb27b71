//! What a [`Framer`](super::Framer) keeps of which messages: a type per
//! user, so that each framer compiles to what its user needs.

/// What a [`Framer`](super::Framer) keeps of which messages.
pub(crate) trait Keep {
    /// Where a message's first body bytes are kept: its length is how many.
    type Prefix: AsRef<[u8]> + AsMut<[u8]> + Copy + std::fmt::Debug;
    /// An empty [`Prefix`](Keep::Prefix).
    const EMPTY: Self::Prefix;
    /// Whether each message's place in the stream is counted
    /// ([`Message::start`](super::Message::start), [`Message::end`](super::Message::end)).
    const OFFSETS: bool;
    /// Whether the first body bytes of a message of type `kind` are kept.
    fn prefix(kind: u8) -> bool;
    /// Whether the body of a message of type `kind` is kept whole while
    /// capture is on.
    fn whole(kind: u8) -> bool;
}

/// The tap's: the first 32 bytes of a `ParameterStatus` (`S`, the
/// setting's name) and of a simple `Query`; with
/// [`capture_sql`](super::Framer::capture_sql) on, `Query` and `Parse` bodies
/// whole. No offsets.
#[derive(Debug)]
pub(crate) struct Tap;

impl Keep for Tap {
    type Prefix = [u8; 32];
    const EMPTY: [u8; 32] = [0; 32];
    const OFFSETS: bool = false;
    #[inline]
    fn prefix(kind: u8) -> bool {
        matches!(kind, b'S' | b'Q')
    }
    #[inline]
    fn whole(kind: u8) -> bool {
        matches!(kind, b'Q' | b'P')
    }
}

/// The read-group rewriter's, for the writes: the first 64 bytes of
/// `Bind`, `Execute` and `Close` (portal, statement name, row limit); with
/// capture on, `Parse` bodies whole; offsets. And what the tap reads of
/// the same walk on such a connection (the tap's own, below 64 bytes):
/// the start of a simple `Query`, and its body whole.
#[derive(Debug)]
pub(crate) struct Writes;

impl Keep for Writes {
    type Prefix = [u8; 64];
    const EMPTY: [u8; 64] = [0; 64];
    const OFFSETS: bool = true;
    #[inline]
    fn prefix(kind: u8) -> bool {
        matches!(kind, b'B' | b'E' | b'C' | b'Q')
    }
    #[inline]
    fn whole(kind: u8) -> bool {
        matches!(kind, b'P' | b'Q')
    }
}

/// The read-group rewriter's, for the answers: types and offsets, and
/// for the tap, which reads the answers from this walk, the first 32 bytes
/// of a `ParameterStatus` (the setting's name), as its own framer keeps.
#[derive(Debug)]
pub(crate) struct Answers;

impl Keep for Answers {
    type Prefix = [u8; 32];
    const EMPTY: [u8; 32] = [0; 32];
    const OFFSETS: bool = true;
    #[inline]
    fn prefix(kind: u8) -> bool {
        kind == b'S'
    }
    #[inline]
    fn whole(_: u8) -> bool {
        false
    }
}
