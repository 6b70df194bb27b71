//! Counting PostgreSQL messages in a forwarded byte stream.
//!
//! The proxy is the ground truth that tests hold the pool's own figures
//! against, so it parses the stream itself rather than sharing the pool's
//! parser. It reads frame headers only (a type byte and a length), never a
//! payload.

/// Walks message boundaries in one direction and counts message types.
#[derive(Debug)]
pub(crate) struct MessageCounter {
    /// The message types to count: `S` (Sync) and `Q` (simple Query)
    /// upstream, each answered by one `Z` (ReadyForQuery) downstream.
    kinds: &'static [u8],
    /// A second type to count: `P` (Parse) upstream.
    second: Option<u8>,
    /// Upstream starts with an untyped start-up packet.
    startup: bool,
    header: [u8; 8],
    header_len: usize,
    body_left: u64,
    current: u8,
    /// After something unparseable (TLS): count nothing more.
    lost: bool,
    /// Messages of the second type seen so far.
    seconds: u64,
    /// Upstream: `Execute` messages seen so far (queries, however many
    /// share a `Sync`).
    executes: u64,
    /// Upstream: a request group has begun and its Sync (or Query) has not
    /// come yet.
    in_group: bool,
    /// Upstream: groups that began while an earlier group's answer was
    /// still owed.
    early_groups: u64,
}

const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

impl MessageCounter {
    /// Counts Sync messages from a client.
    pub(crate) fn upstream() -> MessageCounter {
        MessageCounter::new(b"SQ", Some(b'P'), true)
    }

    /// Counts ReadyForQuery messages from a server.
    pub(crate) fn downstream() -> MessageCounter {
        MessageCounter::new(b"Z", None, false)
    }

    fn new(kinds: &'static [u8], second: Option<u8>, startup: bool) -> MessageCounter {
        MessageCounter {
            kinds,
            second,
            seconds: 0,
            executes: 0,
            startup,
            header: [0; 8],
            header_len: 0,
            body_left: 0,
            current: 0,
            lost: false,
            in_group: false,
            early_groups: 0,
        }
    }

    /// Upstream groups that began before every answer owed on the
    /// connection was delivered (see [`feed_owing`](Self::feed_owing)).
    pub(crate) fn early_groups(&self) -> u64 {
        self.early_groups
    }

    /// Messages of the second type (Parse upstream) seen so far.
    pub(crate) fn seconds(&self) -> u64 {
        self.seconds
    }

    /// Upstream `Execute` messages seen so far.
    pub(crate) fn executes(&self) -> u64 {
        self.executes
    }

    /// Feeds a chunk; returns how many counted messages ended in it.
    #[cfg(test)]
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> u64 {
        self.feed_owing(bytes, 0)
    }

    /// Feeds an upstream chunk, where `owed` answers were still owed to the
    /// client before it (requests read minus ReadyForQuery delivered):
    /// a group that begins while any is owed, counting the requests earlier
    /// in this chunk, is an early group. CopyData, CopyDone, CopyFail,
    /// Terminate and password messages continue what is in flight and
    /// begin nothing.
    pub(crate) fn feed_owing(&mut self, mut bytes: &[u8], owed: i64) -> u64 {
        let mut counted = 0;
        while !bytes.is_empty() && !self.lost {
            if self.body_left > 0 {
                let take = self.body_left.min(bytes.len() as u64);
                self.body_left -= take;
                bytes = &bytes[take as usize..];
                if self.body_left == 0 && self.kinds.contains(&self.current) {
                    counted += 1;
                }
                continue;
            }
            let size = if self.startup { 8 } else { 5 };
            let take = (size - self.header_len).min(bytes.len());
            self.header[self.header_len..self.header_len + take].copy_from_slice(&bytes[..take]);
            self.header_len += take;
            bytes = &bytes[take..];
            if self.header_len < size {
                continue;
            }
            self.header_len = 0;
            if self.startup {
                let len = u32::from_be_bytes([
                    self.header[0],
                    self.header[1],
                    self.header[2],
                    self.header[3],
                ]);
                let code = u32::from_be_bytes([
                    self.header[4],
                    self.header[5],
                    self.header[6],
                    self.header[7],
                ]);
                if len < 8 || code == SSL_REQUEST || code == GSSENC_REQUEST {
                    self.lost = true;
                    continue;
                }
                self.startup = false;
                self.current = 0;
                self.body_left = u64::from(len - 8);
            } else {
                let len = i32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]);
                if len < 4 {
                    self.lost = true;
                    continue;
                }
                self.current = self.header[0];
                if self.second.is_some()
                    && !self.in_group
                    && !matches!(self.current, b'd' | b'c' | b'f' | b'X' | b'p')
                {
                    self.in_group = true;
                    if owed + counted as i64 > 0 {
                        self.early_groups += 1;
                    }
                }
                if self.second.is_some() && self.kinds.contains(&self.current) {
                    // Its Sync (or Query) is the group's last message.
                    self.in_group = false;
                }
                if Some(self.current) == self.second {
                    self.seconds += 1;
                }
                if self.second.is_some() && self.current == b'E' {
                    self.executes += 1;
                }
                self.body_left = (len - 4) as u64;
                if self.body_left == 0 && self.kinds.contains(&self.current) {
                    counted += 1;
                }
            }
        }
        counted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_syncs_after_startup_in_any_split() {
        let mut bytes = vec![0, 0, 0, 9, 0, 3, 0, 0, 7];
        bytes.extend_from_slice(&[b'P', 0, 0, 0, 6, 1, 2]);
        bytes.extend_from_slice(&[b'S', 0, 0, 0, 4, b'S', 0, 0, 0, 4]);
        for split in 0..bytes.len() {
            let mut counter = MessageCounter::upstream();
            let n = counter.feed(&bytes[..split]) + counter.feed(&bytes[split..]);
            assert_eq!(n, 2, "split at {split}");
        }
    }

    #[test]
    fn a_group_begun_while_an_answer_is_owed_is_early() {
        let mut startup = vec![0, 0, 0, 9, 0, 3, 0, 0, 7];
        let group = [b'P', 0, 0, 0, 6, 1, 2, b'S', 0, 0, 0, 4];
        let mut counter = MessageCounter::upstream();
        counter.feed_owing(&startup, 1);
        counter.feed_owing(&group, 0);
        assert_eq!(counter.early_groups(), 0, "nothing owed");
        // Two groups in one chunk: the second begins while the first's
        // answer is owed.
        startup.clear();
        startup.extend_from_slice(&group);
        startup.extend_from_slice(&group);
        counter.feed_owing(&startup, 0);
        assert_eq!(counter.early_groups(), 1);
        // Split inside a group: one group, begun with nothing owed.
        counter.feed_owing(&group[..6], 0);
        counter.feed_owing(&group[6..], 0);
        assert_eq!(counter.early_groups(), 1);
        // Begun while an answer is owed.
        counter.feed_owing(&group[..3], 1);
        counter.feed_owing(&group[3..], 1);
        assert_eq!(counter.early_groups(), 2);
    }

    #[test]
    fn counts_ready_for_query_downstream() {
        let bytes = [
            b'Z', 0, 0, 0, 5, b'I', b'D', 0, 0, 0, 4, b'Z', 0, 0, 0, 5, b'T',
        ];
        let mut counter = MessageCounter::downstream();
        let byte_by_byte: u64 = bytes.iter().map(|b| counter.feed(&[*b])).sum();
        assert_eq!(byte_by_byte, 2);
        assert_eq!(MessageCounter::downstream().feed(&bytes), 2);
    }
}
