//! The answers' side of the rewriter: matching what the server sends to
//! the requests written, and inserting the `ReadyForQuery` (or skip error)
//! each grouped request expects.

use super::{Coalescer, Confused, Req, SHRINK_ABOVE, SKIP_FILE, SKIP_ROUTINE, SKIPPED, pop};
use crate::protocol::framer::{Message, Phase};

impl Coalescer {
    /// Whether what the server sends next needs no rewriting: no request
    /// lost its `Sync`, the server skips nothing, and nothing is held back.
    /// Its bytes may then go to the client as they are (see
    /// [`pass_seen`](Coalescer::pass_seen)), with no copy.
    pub(crate) fn passes_through(&self) -> bool {
        !self.armed || (!self.skipping && self.carry.is_empty() && self.grouped == 0)
    }

    /// [`pass_seen`](Coalescer::pass_seen), for tests.
    #[cfg(test)]
    pub(crate) fn pass(&mut self, bytes: &[u8]) -> Result<(), Confused> {
        self.pass_seen(bytes, |_| {})
            .map_err(|(confused, _)| confused)
    }

    /// [`inbound_seen`](Coalescer::inbound_seen), for tests.
    #[cfg(test)]
    pub(crate) fn inbound(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), Confused> {
        self.inbound_seen(bytes, out, |_| {})
    }

    /// Follows server bytes that go to the client unchanged (only when
    /// [`passes_through`](Coalescer::passes_through)): the requests they
    /// answer are done. `seen` gets each message they complete, as the
    /// client will read it (only once armed). On confusion, the error and
    /// where in `bytes` the message that caused it starts: only what comes
    /// before may reach the client.
    pub(crate) fn pass_seen(
        &mut self,
        bytes: &[u8],
        mut seen: impl FnMut(&Message<'_>),
    ) -> Result<(), (Confused, usize)> {
        if !self.armed {
            return Ok(());
        }
        let emitted = self.emitted;
        self.emitted += bytes.len() as u64;
        let mut input = bytes;
        let mut result = Ok(());
        while let Some(message) = self.inbound.next(&mut input) {
            match message.kind {
                b'N' | b'A' | b'S' => {}
                _ if self.requests.is_empty() => {
                    let at = message.start.saturating_sub(emitted) as usize;
                    result = Err((Confused("an answer to no request"), at));
                    break;
                }
                // COPY FROM STDIN: see `inbound`.
                b'Z' | b'G' => {
                    pop(&mut self.requests, &mut self.grouped);
                }
                _ => {}
            }
            seen(&message);
        }
        // Past a confusion: walked, not read.
        while self.inbound.next(&mut input).is_some() {}
        result
    }

    /// Copies what the server sent into `out`, with a `ReadyForQuery` at
    /// the end of each answer whose `Sync` was dropped, and an error for
    /// each query the server skipped. Only whole messages go out: the rest
    /// waits for its end, so that anything inserted lands between
    /// messages, never inside one. `seen` gets each message that goes out,
    /// in order, as the client will read it (only once armed: before,
    /// `bytes` go out unread), so that the tap need not frame them again.
    pub(crate) fn inbound_seen(
        &mut self,
        bytes: &[u8],
        out: &mut Vec<u8>,
        mut seen: impl FnMut(&Message<'_>),
    ) -> Result<(), Confused> {
        if !self.armed {
            out.extend_from_slice(bytes);
            return Ok(());
        }
        // `carry` holds the stream from offset `emitted` on.
        self.carry.extend_from_slice(bytes);
        let emitted = self.emitted;
        let mut input = bytes;
        let mut copied = 0;
        // The end of the last whole message.
        let mut last_end = None;
        let mut result: Result<(), (Confused, usize)> = Ok(());
        while let Some(message) = self.inbound.next(&mut input) {
            last_end = Some(message.end);
            let (kind, first) = (message.kind, message.first);
            // This message, passed on as it came (its name is kept only
            // for a ParameterStatus, which is passed on just below).
            let passed = || answer(kind, first);
            // A message may have begun in bytes that went out unchanged
            // (see `pass_seen`): nothing is ever inserted before such a one.
            let (start, end) = (
                message.start.saturating_sub(emitted) as usize,
                (message.end - emitted) as usize,
            );
            // Notices, notifications and reported settings come at any time.
            if matches!(kind, b'N' | b'A' | b'S') {
                seen(&message);
                continue;
            }
            let Some(&req) = self.requests.front() else {
                result = Err((Confused("an answer to no request"), start));
                break;
            };
            if self.skipping {
                if kind != b'Z' {
                    result = Err((Confused("an answer where the server skips"), start));
                    break;
                }
                // The group's Sync: every query up to it was skipped, and
                // this ReadyForQuery answers the last of them.
                out.extend_from_slice(&self.carry[copied..start]);
                copied = start;
                while let Some(req) = pop(&mut self.requests, &mut self.grouped) {
                    match req {
                        // Never in a group: written before a request, with
                        // a Sync of its own.
                        Req::Head | Req::Prepare => {}
                        Req::Grouped(_) => {
                            skipped_error(out);
                            ready(out);
                            seen(&SKIP);
                            seen(&READY);
                        }
                        Req::Own | Req::Closing(_) => {
                            skipped_error(out);
                            seen(&SKIP);
                            break;
                        }
                    }
                }
                self.skipping = false;
                seen(&passed());
                continue;
            }
            match (req, kind) {
                // The head's own answer is the rewriter's: taken.
                (Req::Head, b'2' | b'D' | b'C' | b'E') => {
                    out.extend_from_slice(&self.carry[copied..start]);
                    copied = end;
                    if matches!(kind, b'C' | b'E') {
                        pop(&mut self.requests, &mut self.grouped);
                    }
                    if kind == b'E' {
                        // The server skips the group, which never ran.
                        self.skipping = true;
                        self.head_failed(start, end);
                    }
                }
                (Req::Head, _) => {
                    result = Err((Confused("an unexpected answer to a group's head"), start));
                    break;
                }
                // The head's Parse: its answer is taken, up to its own
                // ReadyForQuery.
                (Req::Prepare, b'1' | b'E' | b'Z') => {
                    out.extend_from_slice(&self.carry[copied..start]);
                    copied = end;
                    match kind {
                        b'Z' => drop(pop(&mut self.requests, &mut self.grouped)),
                        b'E' => self.head_failed(start, end),
                        _ => {}
                    }
                }
                (Req::Prepare, _) => {
                    result = Err((Confused("an unexpected answer to the head's Parse"), start));
                    break;
                }
                (Req::Grouped(_), b'2' | b'D') => seen(&message),
                (Req::Grouped(name), b'C' | b'I' | b'E') => {
                    let refused = kind == b'E'
                        && refused_read_only(self.read_only_head, &self.carry[start..end]);
                    if kind == b'E' {
                        // Whatever the error, the statement shares no more
                        // groups on this connection: one that failed may fail
                        // again, and each failure inside a group skips the
                        // queries behind it (run again, but a neighbour
                        // skipped often enough would see it).
                        self.groupable.forget(name);
                    }
                    if refused {
                        // Refused only for the group's head: it runs again,
                        // with a Sync of its own.
                        out.extend_from_slice(&self.carry[copied..start]);
                        skipped_error(out);
                        seen(&SKIP);
                    } else {
                        out.extend_from_slice(&self.carry[copied..end]);
                        seen(&passed());
                    }
                    copied = end;
                    ready(out);
                    seen(&READY);
                    pop(&mut self.requests, &mut self.grouped);
                    self.skipping = kind == b'E';
                }
                (Req::Grouped(_), _) => {
                    result = Err((Confused("an unexpected message in a read group"), start));
                    break;
                }
                (Req::Closing(name), b'E')
                    if refused_read_only(self.read_only_head, &self.carry[start..end]) =>
                {
                    self.groupable.forget(name);
                    out.extend_from_slice(&self.carry[copied..start]);
                    copied = end;
                    skipped_error(out);
                    seen(&SKIP);
                }
                (Req::Closing(_), b'Z') => {
                    pop(&mut self.requests, &mut self.grouped);
                    seen(&message);
                }
                (Req::Closing(_), _) => seen(&message),
                (Req::Own, b'Z') => {
                    pop(&mut self.requests, &mut self.grouped);
                    seen(&message);
                }
                // COPY FROM STDIN (exclusive use only): the Sync behind its
                // Execute is ignored in copy-in mode; the one after CopyDone
                // is answered.
                (Req::Own, b'G') => {
                    pop(&mut self.requests, &mut self.grouped);
                    seen(&message);
                }
                (Req::Own, _) => seen(&message),
            }
        }
        // Past a confusion: walked, not read.
        while self.inbound.next(&mut input).is_some() {}
        // A length the protocol does not allow: the framer stopped, and
        // what follows would wait for an end forever.
        if result.is_ok() && self.inbound.phase == Phase::Opaque {
            let at = last_end.map_or(0, |end| (end - emitted) as usize);
            result = Err((Confused("a malformed message"), at));
        }
        // Up to the end of the last whole message, or on confusion up to
        // the message that confused it: what was answered before it is
        // delivered, nothing from it on.
        let whole = match &result {
            Err((_, at)) => *at,
            Ok(()) => last_end.map_or(0, |end| (end - emitted) as usize),
        }
        .max(copied);
        out.extend_from_slice(&self.carry[copied..whole]);
        self.carry.drain(..whole);
        if self.carry.capacity() > SHRINK_ABOVE && self.carry.len() < SHRINK_ABOVE / 4 {
            self.carry.shrink_to(SHRINK_ABOVE / 4);
        }
        self.emitted += whole as u64;
        result.map_err(|(confused, _)| confused)
    }
}

impl Coalescer {
    /// The error at `carry[start..end]` answered the head or its `Parse`:
    /// a head whose statement is gone is prepared again before the next
    /// write (one already there is kept), and after
    /// [`MAX_HEAD_FAILURES`](super::MAX_HEAD_FAILURES) the connection forms
    /// no more groups.
    fn head_failed(&mut self, start: usize, end: usize) {
        self.head_failures = self.head_failures.saturating_add(1);
        match sqlstate(&self.carry[start..end]) {
            Some(GONE) => self.head_prepared = false,
            Some(ALREADY_THERE) => self.head_prepared = true,
            _ => self.head_failures = super::MAX_HEAD_FAILURES,
        }
    }
}

/// Whether `error`, the answer to a grouped request, is the server refusing
/// a write in a read-only transaction (SQLSTATE 25006) behind the
/// rewriter's own head (`read_only_head`): without the group the statement
/// would have run. A function of the fields it reads, not of the whole
/// rewriter: the message being answered still borrows its framer.
fn refused_read_only(read_only_head: bool, error: &[u8]) -> bool {
    read_only_head && sqlstate(error) == Some(READ_ONLY)
}

/// SQLSTATE `invalid_sql_statement_name`: the head's statement is gone.
const GONE: &[u8] = b"26000";

/// SQLSTATE `duplicate_prepared_statement`: it is there already.
const ALREADY_THERE: &[u8] = b"42P05";

/// SQLSTATE `read_only_sql_transaction`.
const READ_ONLY: &[u8] = b"25006";

/// The SQLSTATE of an `ErrorResponse` message, whole.
fn sqlstate(message: &[u8]) -> Option<&[u8]> {
    let mut fields = message.get(5..)?;
    while let Some((&field, rest)) = fields.split_first() {
        let nul = rest.iter().position(|&b| b == 0)?;
        if field == b'C' {
            return Some(&rest[..nul]);
        }
        fields = &rest[nul + 1..];
    }
    None
}

/// An answer's message as `seen` gets it: its type and first body byte
/// (a `ReadyForQuery`'s status); nothing else is kept of answers but a
/// ParameterStatus's name, and those are handed on as they were framed.
fn answer(kind: u8, first: Option<u8>) -> Message<'static> {
    Message {
        kind,
        first,
        prefix: &[],
        body: None,
        start: 0,
        end: 0,
    }
}

/// The inserted [`ready`] and [`skipped_error`], as `seen` gets them.
const READY: Message<'static> = Message {
    kind: b'Z',
    first: Some(b'I'),
    prefix: &[],
    body: None,
    start: 0,
    end: 0,
};
const SKIP: Message<'static> = Message {
    kind: b'E',
    first: Some(b'S'),
    prefix: &[],
    body: None,
    start: 0,
    end: 0,
};

/// `ReadyForQuery`, idle.
fn ready(out: &mut Vec<u8>) {
    out.extend_from_slice(&[b'Z', 0, 0, 0, 5, b'I']);
}

/// The `ErrorResponse` of a query the server skipped.
fn skipped_error(out: &mut Vec<u8>) {
    let mut body = Vec::with_capacity(160);
    for (field, value) in [
        (b'S', "ERROR"),
        (b'V', "ERROR"),
        (b'C', SKIPPED),
        (
            b'M',
            "not run: an earlier query in its read group failed (pgpipe runs it again)",
        ),
        (b'F', SKIP_FILE),
        (b'R', SKIP_ROUTINE),
    ] {
        body.push(field);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    out.push(b'E');
    out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    out.extend_from_slice(&body);
}
