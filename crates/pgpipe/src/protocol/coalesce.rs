//! Read groups: one `Sync` for the reads that go out in one write on a read
//! lane's shared connection.
//!
//! tokio-postgres ends every query with its own `Sync`, and the server ends
//! a transaction, sends `ReadyForQuery` and flushes at each one. On a read
//! lane (sessions opened `default_transaction_read_only=on`) the queries of
//! one socket write may share one: this rewriter drops the inner `Sync`s of
//! a write and, reading the answers, gives tokio-postgres the
//! `ReadyForQuery` each of its requests expects.
//!
//! Why it cannot misroute an answer:
//!
//! - It never changes, drops or reorders a message from the server; it only
//!   inserts `ReadyForQuery` (and, for skipped queries, an `ErrorResponse`)
//!   *between* them, at the end of a request's answer.
//! - A `Sync` is dropped only behind a request that is exactly
//!   `Bind`+`Execute` (one statement, no row limit: its answer ends with
//!   `CommandComplete`, `EmptyQueryResponse` or `ErrorResponse`, and nothing
//!   else), and only when another `Bind` follows in the same write. Every
//!   other request keeps its `Sync` and is passed through untouched.
//! - Answers are matched to requests in the order the requests were
//!   written, as the server answers them. Anything but the expected
//!   messages (a `ReadyForQuery` where the server owes none, a message while
//!   it skips) is a [`Confused`] error: the connection is closed and every
//!   query on it fails with `ConnectionLost`. It never guesses.
//! - After an error inside a group the server skips every message up to the
//!   group's `Sync`: those queries never ran. Each gets an `ErrorResponse`
//!   with SQLSTATE [`SKIPPED`], which the pool turns into "never sent" and
//!   runs again; their caller never sees it. What ran before the error was
//!   read-only, so the implicit transaction that the error rolls back held
//!   no write to lose.

use std::collections::VecDeque;

use crate::error::{SKIP_FILE, SKIP_ROUTINE, SKIPPED};

/// Most queries under one Sync: one failure skips the rest of its group,
/// and skipped queries run again, so a group stays small enough that a
/// failure costs little.
const MAX_GROUP: u64 = 32;

/// What the request being written holds so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Building {
    /// Nothing yet.
    #[default]
    Empty,
    /// One `Bind` of the unnamed portal to a groupable statement.
    Bound,
    /// … then one `Execute` of the unnamed portal with no row limit: the
    /// only shape whose `Sync` may be dropped.
    Plain,
    /// Anything else.
    Other,
}

/// Message boundaries in one direction, with their offsets in the stream.
#[derive(Debug)]
struct Walk {
    header: [u8; 5],
    header_len: usize,
    body_left: usize,
    kind: u8,
    /// Bytes of the stream before the current chunk.
    total: u64,
    /// Where the message being read started.
    start: u64,
    /// The first bytes of a `Bind`, `Execute` or `Close` body (portal,
    /// statement name, row limit).
    prefix: [u8; PREFIX],
    prefix_len: usize,
    /// A `Parse` body (statement name and SQL), up to [`MAX_PARSE`] bytes.
    parse: Vec<u8>,
    parse_whole: bool,
}

impl Default for Walk {
    fn default() -> Walk {
        Walk {
            header: [0; 5],
            header_len: 0,
            body_left: 0,
            kind: 0,
            total: 0,
            start: 0,
            prefix: [0; PREFIX],
            prefix_len: 0,
            parse: Vec::new(),
            parse_whole: false,
        }
    }
}

/// Longest `Parse` body read: a longer statement keeps its own `Sync`.
const MAX_PARSE: usize = 64 * 1024;

/// How much of a `Bind` or `Execute` body is kept.
const PREFIX: usize = 64;

/// One complete message: its type, where it starts and ends in the
/// stream, and for `Bind` and `Execute` the start of its body.
#[derive(Debug, Clone)]
struct Message {
    kind: u8,
    start: u64,
    end: u64,
    prefix: [u8; PREFIX],
    prefix_len: usize,
    /// For `Parse`: its whole body, if it was no longer than [`MAX_PARSE`].
    parse: Option<Vec<u8>>,
}

/// The NUL-terminated string at the start of `bytes`, and the rest.
fn cstring(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let nul = bytes.iter().position(|&b| b == 0)?;
    Some((&bytes[..nul], &bytes[nul + 1..]))
}

impl Message {
    /// The first NUL-terminated string of the body, and what follows it.
    fn split(&self) -> Option<(&[u8], &[u8])> {
        let body = &self.prefix[..self.prefix_len];
        let nul = body.iter().position(|&b| b == 0)?;
        Some((&body[..nul], &body[nul + 1..]))
    }
}

impl Walk {
    fn feed(&mut self, bytes: &[u8], done: &mut Vec<Message>) {
        let mut i = 0;
        while i < bytes.len() {
            if self.body_left == 0 {
                if self.header_len == 0 {
                    self.start = self.total + i as u64;
                }
                let take = (5 - self.header_len).min(bytes.len() - i);
                self.header[self.header_len..self.header_len + take]
                    .copy_from_slice(&bytes[i..i + take]);
                self.header_len += take;
                i += take;
                if self.header_len < 5 {
                    continue;
                }
                self.kind = self.header[0];
                self.prefix_len = 0;
                self.parse.clear();
                let [_, a, b, c, d] = self.header;
                // The length counts itself; a shorter one is malformed and
                // read as empty (the server rejects it anyway).
                self.body_left = (u32::from_be_bytes([a, b, c, d]) as usize).saturating_sub(4);
                self.parse_whole = self.body_left <= MAX_PARSE;
            } else {
                let take = self.body_left.min(bytes.len() - i);
                if matches!(self.kind, b'B' | b'E' | b'C') && self.prefix_len < PREFIX {
                    let keep = take.min(PREFIX - self.prefix_len);
                    self.prefix[self.prefix_len..self.prefix_len + keep]
                        .copy_from_slice(&bytes[i..i + keep]);
                    self.prefix_len += keep;
                }
                if self.kind == b'P' && self.parse.len() + take <= MAX_PARSE {
                    self.parse.extend_from_slice(&bytes[i..i + take]);
                }
                self.body_left -= take;
                i += take;
            }
            if self.body_left == 0 {
                self.header_len = 0;
                done.push(Message {
                    kind: self.kind,
                    start: self.start,
                    end: self.total + i as u64,
                    prefix: self.prefix,
                    prefix_len: self.prefix_len,
                    parse: (self.kind == b'P' && self.parse_whole)
                        .then(|| std::mem::take(&mut self.parse)),
                });
            }
        }
        self.total += bytes.len() as u64;
    }
}

/// The server sent what the requests written cannot explain.
#[derive(Debug)]
pub(crate) struct Confused(pub(crate) &'static str);

impl std::fmt::Display for Confused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "read group out of step ({}); closing the connection",
            self.0
        )
    }
}

impl std::error::Error for Confused {}

/// The rewriter of one connection; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Coalescer {
    /// From the first `ReadyForQuery` (start-up done, nothing in flight).
    armed: bool,
    outbound: Walk,
    inbound: Walk,
    /// What the request being written holds so far.
    building: Building,
    /// Requests written and not yet answered: whether each lost its `Sync`.
    requests: VecDeque<bool>,
    /// How many of them lost it.
    grouped: usize,
    /// The server is skipping to the end of a failed group.
    skipping: bool,
    /// Requests in the group being written.
    group: u64,
    /// Reusable event buffer.
    messages: Vec<Message>,
    /// Named statements prepared on this connection whose SQL may share a
    /// group ([`groupable`](super::sql_guard::groupable)), learned from
    /// their `Parse` and forgotten at their `Close`.
    groupable: rustc_hash::FxHashSet<Box<[u8]>>,
    /// What the database's catalog says reaches user code, and its
    /// generation: when it changes, what was learned from it is forgotten
    /// (those statements keep a `Sync` of their own from then on).
    catalog: (std::sync::Arc<super::catalog::Catalog>, u64),
    /// Server bytes not yet passed on (a message not yet whole), from
    /// stream offset `emitted`.
    carry: Vec<u8>,
    emitted: u64,
    /// `Sync`s dropped, and the sizes of groups written, since last taken.
    pub(crate) saved: u64,
    pub(crate) groups: Vec<u64>,
}

impl Coalescer {
    /// Starts rewriting: call at the first `ReadyForQuery`, with nothing
    /// written since.
    pub(crate) fn arm(&mut self) {
        self.armed = true;
    }

    pub(crate) fn is_armed(&self) -> bool {
        self.armed
    }

    /// The catalog's `generation`, and a way to read it if that is new:
    /// statements learned groupable under an older one are forgotten.
    pub(crate) fn use_catalog(
        &mut self,
        generation: u64,
        catalog: impl FnOnce() -> std::sync::Arc<super::catalog::Catalog>,
    ) {
        if self.catalog.1 != generation {
            self.groupable.clear();
            self.catalog = (catalog(), generation);
        }
    }

    /// Copies one write into `out`, dropping the `Sync`s that may be
    /// shared; `group` says whether this write may share them (a shared
    /// connection of a read lane).
    pub(crate) fn outbound(&mut self, buf: &[u8], group: bool, out: &mut Vec<u8>) {
        if !self.armed {
            out.extend_from_slice(buf);
            return;
        }
        let base = self.outbound.total;
        let mut messages = std::mem::take(&mut self.messages);
        messages.clear();
        self.outbound.feed(buf, &mut messages);
        let mut copied = 0;
        for message in &messages {
            self.building = match (self.building, message.kind) {
                // Bind: portal "", then a statement the pool let into groups.
                (Building::Empty, b'B') => match message.split() {
                    Some((b"", rest)) => {
                        let statement = rest.iter().position(|&b| b == 0).map(|n| &rest[..n]);
                        if statement.is_some_and(|name| self.groupable.contains(name)) {
                            Building::Bound
                        } else {
                            Building::Other
                        }
                    }
                    _ => Building::Other,
                },
                // Execute: portal "", no row limit.
                (Building::Bound, b'E') => match message.split() {
                    Some((b"", [0, 0, 0, 0, ..])) => Building::Plain,
                    _ => Building::Other,
                },
                (building, b'S') => {
                    let end = (message.end - base) as usize;
                    let shareable = group
                        && building == Building::Plain
                        && message.start >= base
                        && buf.get(end) == Some(&b'B')
                        && self.group + 1 < MAX_GROUP;
                    if shareable {
                        let start = (message.start - base) as usize;
                        out.extend_from_slice(&buf[copied..start]);
                        copied = end;
                        self.saved += 1;
                        self.group += 1;
                    } else if self.group > 0 {
                        self.groups.push(self.group + 1);
                        self.group = 0;
                    }
                    self.push(shareable);
                    Building::Empty
                }
                // Answered by a ReadyForQuery of their own.
                (_, b'Q' | b'F') => {
                    self.push(false);
                    Building::Empty
                }
                // A statement being prepared: its SQL says whether its
                // later Binds may join groups.
                (_, b'P') => {
                    self.learn(message);
                    Building::Other
                }
                // A statement closed (evicted from the pool's cache).
                (_, b'C') => {
                    let body = &message.prefix[..message.prefix_len];
                    if let Some((b'S', rest)) = body.split_first() {
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
        self.messages = messages;
    }

    fn push(&mut self, grouped: bool) {
        self.grouped += usize::from(grouped);
        self.requests.push_back(grouped);
    }

    fn pop(&mut self) -> Option<bool> {
        let grouped = self.requests.pop_front()?;
        self.grouped -= usize::from(grouped);
        Some(grouped)
    }

    /// Notes a named statement's SQL, from its `Parse`.
    fn learn(&mut self, message: &Message) {
        let Some(body) = &message.parse else { return };
        let Some((name, rest)) = cstring(body) else {
            return;
        };
        let Some((sql, _)) = cstring(rest) else {
            return;
        };
        let catalog = &self.catalog.0;
        let groupable = !name.is_empty()
            && std::str::from_utf8(sql).is_ok_and(|sql| super::sql_guard::groupable(sql, catalog));
        if groupable {
            if self.groupable.len() >= MAX_NAMES {
                self.groupable.clear();
            }
            self.groupable.insert(name.into());
        } else {
            self.groupable.remove(name);
        }
    }

    /// Whether what the server sends next needs no rewriting: no request
    /// lost its `Sync`, the server skips nothing, and nothing is held back.
    /// Its bytes may then go to the client as they are (see
    /// [`pass`](Coalescer::pass)), with no copy.
    pub(crate) fn passes_through(&self) -> bool {
        !self.armed || (!self.skipping && self.carry.is_empty() && self.grouped == 0)
    }

    /// Follows server bytes that go to the client unchanged (only when
    /// [`passes_through`](Coalescer::passes_through)): the requests they
    /// answer are done.
    pub(crate) fn pass(&mut self, bytes: &[u8]) -> Result<(), Confused> {
        if !self.armed {
            return Ok(());
        }
        let mut messages = std::mem::take(&mut self.messages);
        messages.clear();
        self.inbound.feed(bytes, &mut messages);
        self.emitted += bytes.len() as u64;
        let mut result = Ok(());
        for message in &messages {
            match message.kind {
                b'N' | b'A' | b'S' => {}
                _ if self.requests.is_empty() => {
                    result = Err(Confused("an answer to no request"));
                    break;
                }
                // COPY FROM STDIN: see `inbound`.
                b'Z' | b'G' => {
                    self.pop();
                }
                _ => {}
            }
        }
        self.messages = messages;
        result
    }

    /// Copies what the server sent into `out`, with a `ReadyForQuery` at
    /// the end of each answer whose `Sync` was dropped, and an error for
    /// each query the server skipped. Only whole messages go out: the rest
    /// waits for its end, so that anything inserted lands between
    /// messages, never inside one.
    pub(crate) fn inbound(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), Confused> {
        if !self.armed {
            out.extend_from_slice(bytes);
            return Ok(());
        }
        // `carry` holds the stream from offset `emitted` on.
        self.carry.extend_from_slice(bytes);
        let mut messages = std::mem::take(&mut self.messages);
        messages.clear();
        self.inbound.feed(bytes, &mut messages);
        let emitted = self.emitted;
        let mut copied = 0;
        let mut result: Result<(), (Confused, usize)> = Ok(());
        for message in &messages {
            // A message may have begun in bytes that went out unchanged
            // (see `pass`): nothing is ever inserted before such a one.
            let (start, end) = (
                message.start.saturating_sub(emitted) as usize,
                (message.end - emitted) as usize,
            );
            // Notices, notifications and reported settings come at any time.
            if matches!(message.kind, b'N' | b'A' | b'S') {
                continue;
            }
            let Some(&shared) = self.requests.front() else {
                result = Err((Confused("an answer to no request"), start));
                break;
            };
            if self.skipping {
                if message.kind != b'Z' {
                    result = Err((Confused("an answer where the server skips"), start));
                    break;
                }
                // The group's Sync: every query up to it was skipped, and
                // this ReadyForQuery answers the last of them.
                out.extend_from_slice(&self.carry[copied..start]);
                copied = start;
                while let Some(shared) = self.pop() {
                    skipped_error(out);
                    if !shared {
                        break;
                    }
                    ready(out);
                }
                self.skipping = false;
                continue;
            }
            match (shared, message.kind) {
                (true, b'2' | b'D') => {}
                (true, b'C' | b'I' | b'E') => {
                    out.extend_from_slice(&self.carry[copied..end]);
                    copied = end;
                    ready(out);
                    self.pop();
                    self.skipping = message.kind == b'E';
                }
                (true, _) => {
                    result = Err((Confused("an unexpected message in a read group"), start));
                    break;
                }
                (false, b'Z') => {
                    self.pop();
                }
                // COPY FROM STDIN (exclusive use only): the Sync behind its
                // Execute is ignored in copy-in mode; the one after CopyDone
                // is answered.
                (false, b'G') => {
                    self.pop();
                }
                (false, _) => {}
            }
        }
        // Up to the end of the last whole message, or on confusion up to
        // the message that confused it: what was answered before it is
        // delivered, nothing from it on.
        let whole = match &result {
            Err((_, at)) => *at,
            Ok(()) => messages.last().map_or(0, |m| (m.end - emitted) as usize),
        }
        .max(copied);
        out.extend_from_slice(&self.carry[copied..whole]);
        self.carry.drain(..whole);
        if self.carry.capacity() > SHRINK_ABOVE && self.carry.len() < SHRINK_ABOVE / 4 {
            self.carry.shrink_to(SHRINK_ABOVE / 4);
        }
        self.emitted += whole as u64;
        self.messages = messages;
        result.map_err(|(confused, _)| confused)
    }
}

/// Most statement names remembered as groupable (the pool's cache closes
/// what it evicts, so this bound is only a backstop).
const MAX_NAMES: usize = 4096;

/// Buffers past this size are given back once they empty.
pub(crate) const SHRINK_ABOVE: usize = 64 * 1024;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    /// Bind, Execute, Sync: one tokio-postgres query.
    fn query(n: u8) -> Vec<u8> {
        let bind = [b"\0s".as_slice(), &[b'0' + n], b"\0\0\0\0\0\0\0"].concat();
        [
            message(b'B', &bind),
            message(b'E', &[0; 5]),
            message(b'S', &[]),
        ]
        .concat()
    }

    fn parse(name: &str, sql: &str) -> Vec<u8> {
        let body = [name.as_bytes(), b"\0", sql.as_bytes(), b"\0\0\0"].concat();
        message(b'P', &body)
    }

    fn kinds(bytes: &[u8]) -> Vec<u8> {
        let mut walk = Walk::default();
        let mut done = Vec::new();
        walk.feed(bytes, &mut done);
        done.iter().map(|m| m.kind).collect()
    }

    /// Armed, with statements s0 … s9 known to be groupable.
    fn armed() -> Coalescer {
        let mut c = Coalescer::default();
        c.arm();
        for n in 0..10 {
            c.groupable.insert(format!("s{n}").into_bytes().into());
        }
        c
    }

    #[test]
    fn the_inner_syncs_of_one_write_are_dropped_and_the_last_kept() {
        let mut c = armed();
        let write = [query(1), query(2), query(3)].concat();
        let mut out = Vec::new();
        c.outbound(&write, true, &mut out);
        assert_eq!(kinds(&out), b"BEBEBES");
        assert_eq!(c.saved, 2);
        assert_eq!(c.requests, [true, true, false]);
        // Not a read lane's shared connection: untouched.
        let mut plain = armed();
        let mut out = Vec::new();
        plain.outbound(&write, false, &mut out);
        assert_eq!(out, write);
        // A prepare (Parse/Describe/Sync) keeps its Sync, and ends a group.
        let mut c = armed();
        let prepare = [message(b'P', b"x"), message(b'D', b"S"), message(b'S', &[])].concat();
        let write = [query(1), prepare, query(2), query(3)].concat();
        let mut out = Vec::new();
        c.outbound(&write, true, &mut out);
        assert_eq!(kinds(&out), b"BESPDSBEBES");
    }

    #[test]
    fn answers_get_a_ready_for_query_each_and_skipped_queries_an_error() {
        let mut c = armed();
        let mut out = Vec::new();
        c.outbound(
            &[query(1), query(2), query(3), query(4)].concat(),
            true,
            &mut out,
        );
        // 1 answers, 2 fails, 3 and 4 are skipped; one real ReadyForQuery.
        let answers = [
            message(b'2', &[]),
            message(b'D', b"row"),
            message(b'C', b"SELECT 1\0"),
            message(b'2', &[]),
            message(b'E', b"boom"),
            message(b'Z', b"I"),
        ]
        .concat();
        // Fed a byte at a time: boundaries never matter.
        let mut out = Vec::new();
        for byte in &answers {
            c.inbound(std::slice::from_ref(byte), &mut out).unwrap();
        }
        assert_eq!(kinds(&out), b"2DCZ2EZEZEZ");
        assert!(c.requests.is_empty());
        let skipped = String::from_utf8_lossy(&out);
        assert_eq!(skipped.matches(SKIPPED).count(), 2);
    }

    #[test]
    fn anything_out_of_step_is_an_error_never_a_guess() {
        let mut c = armed();
        let mut out = Vec::new();
        c.outbound(&[query(1), query(2)].concat(), true, &mut out);
        // A ReadyForQuery where the server owes none (its Sync was dropped).
        let error = c.inbound(&message(b'Z', b"I"), &mut out).unwrap_err();
        assert!(error.to_string().contains("unexpected"));
        let mut c = armed();
        c.outbound(&[query(1), query(2)].concat(), true, &mut out);
        c.inbound(
            &[message(b'2', &[]), message(b'E', b"x")].concat(),
            &mut out,
        )
        .unwrap();
        // While skipping, the server sends nothing but the group's end.
        assert!(c.inbound(&message(b'C', b"x"), &mut out).is_err());
        // An answer with no request.
        let mut c = armed();
        assert!(c.inbound(&message(b'C', b"x"), &mut Vec::new()).is_err());
    }

    #[test]
    fn only_plain_binds_of_groupable_statements_give_up_their_sync() {
        let write = [query(1), query(2), query(3)].concat();
        // Statement s2 was not let into groups: it keeps its Sync, and so
        // does the query before it (nothing joins a group with it after).
        let mut c = armed();
        c.groupable.remove(b"s2".as_slice());
        let mut out = Vec::new();
        c.outbound(&write, true, &mut out);
        assert_eq!(c.requests, [true, false, false]);
        // Learned from Parse: a plain read joins, SET LOCAL does not, and a
        // Close forgets.
        let mut c = Coalescer::default();
        c.arm();
        c.use_catalog(1, || {
            std::sync::Arc::new(super::super::catalog::Catalog::empty())
        });
        let mut out = Vec::new();
        let prepares = [
            parse("s1", "SELECT $1::int8"),
            parse("s2", "SET LOCAL statement_timeout = 1"),
            message(b'S', &[]),
        ]
        .concat();
        c.outbound(&prepares, true, &mut out);
        assert!(c.groupable.contains(b"s1".as_slice()));
        assert!(!c.groupable.contains(b"s2".as_slice()));
        c.outbound(
            &[message(b'C', b"Ss1\0"), message(b'S', &[])].concat(),
            true,
            &mut out,
        );
        assert!(!c.groupable.contains(b"s1".as_slice()));
        // A row limit, a named portal, two Binds: not the plain shape.
        let limited = [
            message(b'B', b"\0s1\0\0\0\0\0\0\0"),
            message(b'E', &[0, 0, 0, 0, 10]),
            message(b'S', &[]),
        ]
        .concat();
        let portal = [
            message(b'B', b"p\0s1\0\0\0\0\0\0\0"),
            message(b'E', b"p\0\0\0\0\0"),
            message(b'S', &[]),
        ]
        .concat();
        let twice = [
            message(b'B', b"\0s1\0\0\0\0\0\0\0"),
            message(b'E', &[0; 5]),
            message(b'B', b"\0s1\0\0\0\0\0\0\0"),
            message(b'E', &[0; 5]),
            message(b'S', &[]),
        ]
        .concat();
        for odd in [limited, portal, twice] {
            let mut c = armed();
            let mut out = Vec::new();
            c.outbound(&[odd.clone(), query(2)].concat(), true, &mut out);
            assert!(!c.requests[0], "{odd:?}");
        }
        // At most MAX_GROUP queries under one Sync.
        let mut c = armed();
        let many: Vec<u8> = (0..100).flat_map(|n| query(n % 9)).collect();
        let mut out = Vec::new();
        c.outbound(&many, true, &mut out);
        let longest = c
            .requests
            .iter()
            .fold((0, 0), |(run, best), &shared| {
                let run = if shared { run + 1 } else { 0 };
                (run, best.max(run))
            })
            .1;
        assert_eq!(longest + 1, MAX_GROUP as usize);
    }

    #[test]
    fn answers_before_a_confusion_are_delivered_and_nothing_after() {
        let mut c = armed();
        let mut out = Vec::new();
        c.outbound(&[query(1), query(2), query(3)].concat(), true, &mut out);
        let answers = [
            message(b'2', &[]),
            message(b'C', b"SELECT 1\0"),
            message(b'Z', b"I"),
            message(b'D', b"leak"),
        ]
        .concat();
        let mut out = Vec::new();
        assert!(c.inbound(&answers, &mut out).is_err());
        assert_eq!(kinds(&out), b"2CZ", "the first answer, then nothing");
    }

    #[test]
    fn answers_that_need_no_rewriting_pass_as_they_are() {
        let mut c = armed();
        let mut out = Vec::new();
        // A prepare and a lone query: nothing lost its Sync.
        let prepare = [parse("s1", "SELECT 1"), message(b'S', &[])].concat();
        c.outbound(&[prepare, query(1)].concat(), true, &mut out);
        assert!(c.passes_through());
        let answers = [
            message(b'1', &[]),
            message(b'Z', b"I"),
            message(b'2', &[]),
            message(b'C', b"SELECT 1\0"),
        ]
        .concat();
        // Split inside a message: the rest follows on the slow path after a
        // grouped write, and still lines up.
        let (first, rest) = answers.split_at(answers.len() - 3);
        c.pass(first).unwrap();
        c.outbound(&[query(2), query(3)].concat(), true, &mut out);
        assert!(!c.passes_through());
        let mut delivered = Vec::new();
        let more = [
            rest,
            &message(b'Z', b"I"),
            &message(b'2', &[]),
            &message(b'C', b"x\0"),
            &message(b'2', &[]),
            &message(b'C', b"y\0"),
            &message(b'Z', b"I"),
        ]
        .concat();
        c.inbound(&more, &mut delivered).unwrap();
        assert!(c.requests.is_empty());
        assert_eq!(&delivered[..3], rest);
        assert_eq!(kinds(&delivered[3..]), b"Z2CZ2CZ");
    }

    #[test]
    fn a_sync_split_across_writes_is_kept() {
        let mut c = armed();
        let write = [query(1), query(2)].concat();
        let (first, second) = write.split_at(write.len() / 2 + 3);
        let mut out = Vec::new();
        c.outbound(first, true, &mut out);
        c.outbound(second, true, &mut out);
        assert_eq!(out.len() + 5 * c.saved as usize, write.len());
        assert_eq!(c.requests.len(), 2);
    }
}
