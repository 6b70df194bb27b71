//! The requests' side of the rewriter: copying each write on, with the
//! `Sync`s that may be shared dropped and a read-only head before each
//! group; learning from each `Parse` which statements may share a group.

use super::head::{head, plain_read, prepare_head};
use super::learn::{key, learn};
use super::{Building, Coalescer, MAX_GROUP, MAX_HEAD_FAILURES, Req, cstring, push};
use crate::protocol::framer::Message;

impl Coalescer {
    /// Copies one write into `out`, dropping the `Sync`s that may be
    /// shared; `group` says whether this write may share them (a shared
    /// connection of a read lane).
    #[cfg(test)]
    pub(crate) fn outbound(&mut self, buf: &[u8], group: bool, out: &mut Vec<u8>) {
        self.outbound_seen(buf, group, out, |_| {});
    }

    /// [`outbound`](Self::outbound), handing `seen` each message of the
    /// write as it is framed (only once armed: before, the write is copied
    /// unread), so that the tap need not frame it again. Messages whose
    /// bodies [`Writes`] keeps whole come with them, whatever the tap's
    /// own capture.
    pub(crate) fn outbound_seen(
        &mut self,
        buf: &[u8],
        group: bool,
        out: &mut Vec<u8>,
        mut seen: impl FnMut(&Message<'_>),
    ) {
        if !self.armed {
            out.extend_from_slice(buf);
            return;
        }
        if self.read_only_head
            && !self.head_prepared
            && self.head_failures < MAX_HEAD_FAILURES
            && self.building == Building::Empty
            && self.outbound.at_boundary()
        {
            // Before the connection's first request (or the first after the
            // head's statement was found gone), between requests.
            prepare_head(out);
            push(&mut self.requests, &mut self.grouped, Req::Prepare);
            self.head_prepared = true;
        }
        let base = self.outbound.offset();
        let mut input = buf;
        let mut copied = 0;
        while let Some(message) = self.outbound.next(&mut input) {
            seen(&message);
            if self.building == Building::Empty {
                self.request_start = message.start;
            }
            self.building = match (self.building, message.kind) {
                // Bind: portal "", then a statement the pool let into groups.
                (Building::Empty, b'B')
                    if self.vetted.is_some_and(|(at, _)| at == message.start) =>
                {
                    self.bound = self.vetted.map_or(0, |(_, key)| key);
                    Building::Bound
                }
                (Building::Empty, b'B') => match cstring(message.prefix) {
                    Some((b"", rest)) => {
                        let statement = rest.iter().position(|&b| b == 0).map(|n| &rest[..n]);
                        match statement.map(|name| (key(name), name)) {
                            Some((key, name)) if self.groupable.has(key, name) => {
                                self.bound = key;
                                Building::Bound
                            }
                            _ => Building::Other,
                        }
                    }
                    _ => Building::Other,
                },
                // Execute: portal "", no row limit.
                (Building::Bound, b'E') => match cstring(message.prefix) {
                    Some((b"", [0, 0, 0, 0, ..])) => Building::Plain,
                    _ => Building::Other,
                },
                (building, b'S') => {
                    self.vetted = None;
                    let end = (message.end - base) as usize;
                    let mut shareable = group
                        && building == Building::Plain
                        && message.start >= base
                        && buf.get(end) == Some(&b'B')
                        && self.group + 1 < MAX_GROUP;
                    if shareable && self.read_only_head {
                        // The next request runs in the group too: it must be
                        // a plain read as well, and a new group needs room
                        // for its head.
                        shareable = self.head_prepared
                            && self.head_failures < MAX_HEAD_FAILURES
                            && {
                                let next = plain_read(&buf[end..], &self.groupable);
                                self.vetted = next.map(|key| (message.end, key));
                                next.is_some()
                            }
                            && (self.group > 0 || self.request_start >= base);
                        if shareable && self.group == 0 {
                            let at = (self.request_start - base) as usize;
                            out.extend_from_slice(&buf[copied..at]);
                            copied = at;
                            head(out);
                            push(&mut self.requests, &mut self.grouped, Req::Head);
                        }
                    }
                    if shareable {
                        let start = (message.start - base) as usize;
                        out.extend_from_slice(&buf[copied..start]);
                        copied = end;
                        self.saved += 1;
                        self.group += 1;
                    }
                    let req = if shareable {
                        Req::Grouped(self.bound)
                    } else if self.group > 0 {
                        self.groups.push(self.group + 1);
                        self.group = 0;
                        Req::Closing(self.bound)
                    } else {
                        Req::Own
                    };
                    push(&mut self.requests, &mut self.grouped, req);
                    Building::Empty
                }
                // Answered by a ReadyForQuery of their own.
                (_, b'Q' | b'F') => {
                    push(&mut self.requests, &mut self.grouped, Req::Own);
                    Building::Empty
                }
                // A statement being prepared: its SQL says whether its
                // later Binds may join groups.
                (_, b'P') => {
                    if let Some(Ok(body)) = message.body {
                        let reads = self.read_only_head;
                        learn(&mut self.groupable, &self.catalog.0, body, reads);
                    }
                    Building::Other
                }
                // A statement closed (evicted from the pool's cache).
                (_, b'C') => {
                    if let Some((b'S', rest)) = message.prefix.split_first() {
                        if let Some((name, _)) = cstring(rest) {
                            self.groupable.remove(name);
                        }
                    }
                    Building::Other
                }
                _ => Building::Other,
            };
        }
        out.extend_from_slice(&buf[copied..]);
    }
}
