//! One request group on the wire at a time, enforced on the bytes
//! themselves.
//!
//! A transaction pooler that cannot track a pipeline (PgBouncer before
//! 1.21, an unknown one) may hand its server to another client at any
//! `ReadyForQuery` that shows no transaction. A group (everything up to and
//! including a `Sync`, a simple `Query` or a `FunctionCall`) that reaches it
//! before the previous group's `ReadyForQuery` may run partly on this
//! client's server and partly on the next one's: answers then reach the
//! wrong caller.
//!
//! The rule is therefore a property of the connection's send order, not of
//! any caller: the tap asks the [`Gate`] how much of each write may go out.
//! Everything tokio-postgres writes passes here, including requests it
//! issues on its own (the `ROLLBACK` of a dropped transaction, a statement's
//! `Close`), so no path can bypass it. A write is cut at the end of the
//! message that closes a group, and the next group's first byte waits until
//! every group written has its `ReadyForQuery` (the tap's request and
//! ready counts, which follow the protocol, not a caller's guess).
//!
//! Messages that continue the group in flight rather than start one go out
//! at any time: `CopyData`, `CopyDone` and `CopyFail` (the server waits for
//! them before it answers a `COPY FROM STDIN`), and `Terminate`.

/// Where the outbound stream is between message boundaries. Only the type
/// byte and the length are read, never a payload.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Gate {
    header: [u8; 5],
    header_len: usize,
    /// Body bytes of the current message still to come.
    body_left: usize,
    /// A length the gate cannot follow: it stops holding anything back
    /// (the server will close the connection on such bytes anyway).
    lost: bool,
}

/// Messages that end a request group: each is answered by one
/// `ReadyForQuery`.
fn ends_group(kind: u8) -> bool {
    matches!(kind, b'S' | b'Q' | b'F')
}

/// Messages that belong to the group in flight: they may go out while its
/// answer is owed.
fn continues_group(kind: u8) -> bool {
    matches!(kind, b'd' | b'c' | b'f' | b'X')
}

impl Gate {
    /// How many leading bytes of `bytes` may be written now, where `owed`
    /// says whether a group written earlier still waits for its
    /// `ReadyForQuery`. Never cuts into a message that has begun; stops
    /// before the first byte of a group while one is owed, and so at the end
    /// of a message that closes a group when more follows.
    pub(crate) fn allowed(&self, bytes: &[u8], mut owed: bool) -> usize {
        if self.lost {
            return bytes.len();
        }
        let mut at = *self;
        let mut pos = 0;
        while pos < bytes.len() {
            if at.body_left == 0 && at.header_len == 0 {
                // A message starts here.
                let kind = bytes[pos];
                if owed && !continues_group(kind) {
                    return pos;
                }
            }
            let before = pos;
            pos += at.step(&bytes[pos..]);
            if at.lost {
                return bytes.len();
            }
            if at.completed() && ends_group(at.header[0]) && before < pos {
                owed = true;
            }
        }
        pos
    }

    /// Moves past bytes that were written.
    pub(crate) fn advance(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && !self.lost {
            let n = self.step(bytes);
            bytes = &bytes[n..];
        }
    }

    /// Whether the last step finished a message.
    fn completed(&self) -> bool {
        self.header_len == 0 && self.body_left == 0
    }

    /// Consumes bytes of one message (or of its header); returns how many.
    fn step(&mut self, bytes: &[u8]) -> usize {
        if self.body_left > 0 {
            let take = self.body_left.min(bytes.len());
            self.body_left -= take;
            return take;
        }
        let take = (5 - self.header_len).min(bytes.len());
        self.header[self.header_len..self.header_len + take].copy_from_slice(&bytes[..take]);
        self.header_len += take;
        if self.header_len == 5 {
            let len = i32::from_be_bytes([
                self.header[1],
                self.header[2],
                self.header[3],
                self.header[4],
            ]);
            if len < 4 {
                self.lost = true;
                return take;
            }
            self.header_len = 0;
            self.body_left = len as usize - 4;
        }
        take
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, body: usize) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&((body + 4) as i32).to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, body));
        m
    }

    /// Two extended-protocol queries in one write.
    fn two_groups() -> (Vec<u8>, usize) {
        let mut bytes = Vec::new();
        for kind in [b'P', b'B', b'E'] {
            bytes.extend(message(kind, 11));
        }
        bytes.extend(message(b'S', 0));
        let first = bytes.len();
        for kind in [b'B', b'E', b'S'] {
            bytes.extend(message(kind, if kind == b'S' { 0 } else { 3 }));
        }
        (bytes, first)
    }

    #[test]
    fn a_write_stops_at_the_end_of_its_first_group() {
        let (bytes, first) = two_groups();
        let gate = Gate::default();
        assert_eq!(gate.allowed(&bytes, false), first);
        assert_eq!(gate.allowed(&bytes, true), 0, "a group is owed");
    }

    #[test]
    fn split_anywhere_no_byte_of_the_second_group_passes_while_the_first_is_owed() {
        let (bytes, first) = two_groups();
        for split in 0..=bytes.len() {
            let mut gate = Gate::default();
            let mut written = 0;
            // The first piece, then everything else, with the first group's
            // answer owed once its Sync is out.
            let piece = &bytes[..split];
            let n = gate.allowed(piece, false);
            gate.advance(&piece[..n]);
            written += n;
            let owed = written >= first;
            let n = gate.allowed(&bytes[written..], owed);
            gate.advance(&bytes[written..written + n]);
            written += n;
            assert_eq!(written, first, "split at {split}");
            // The answer arrives: the rest goes.
            let n = gate.allowed(&bytes[written..], false);
            assert_eq!(written + n, bytes.len(), "split at {split}");
        }
    }

    #[test]
    fn copy_data_goes_out_while_its_copy_is_owed() {
        let mut bytes = message(b'd', 100);
        bytes.extend(message(b'c', 0));
        bytes.extend(message(b'S', 0));
        let after_done = bytes.len() - 5;
        assert_eq!(Gate::default().allowed(&bytes, true), after_done);
    }

    #[test]
    fn a_message_that_has_begun_is_finished() {
        let bytes = message(b'B', 20);
        let mut gate = Gate::default();
        gate.advance(&bytes[..3]);
        assert_eq!(gate.allowed(&bytes[3..], true), bytes.len() - 3);
    }

    #[test]
    fn nonsense_lengths_hold_nothing_back() {
        let bytes = [b'B', 0xff, 0xff, 0xff, 0xff, 1, 2, 3];
        assert_eq!(Gate::default().allowed(&bytes, false), bytes.len());
    }
}
