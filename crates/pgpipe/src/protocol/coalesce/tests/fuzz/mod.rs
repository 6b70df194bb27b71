//! Property tests of the read groups' rewriter against a model server
//! ([`server`]): a generated pipelined client stream goes through
//! [`Coalescer::outbound`] in random writes, the model answers what reaches
//! it, and its answers come back through [`Coalescer::pass`] or
//! [`Coalescer::inbound`] (as the tap chooses) in random reads, the two
//! interleaved at random. The same stream run on the model without a
//! rewriter gives each request's own answer; the client must see exactly
//! that answer at that request's place, or, for a request the server
//! skipped (or refused as a write behind the head), the skip error and
//! nothing else. A faithful server never confuses the rewriter, and
//! nothing panics.
//!
//! `PROPTEST_CASES` sets the number of cases (default [`CASES`]).

mod server;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError};

use super::*;
use server::{Does, Orders, STATEMENTS, Server};

/// Cases per property unless `PROPTEST_CASES` says otherwise: enough to
/// catch a misroute in a few seconds of `cargo test`.
const CASES: u32 = 256;

pub(super) fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// One request as a client writes it.
#[derive(Debug, Clone)]
enum Request {
    /// `Parse`, `Describe` of the statement, `Sync`: tokio-postgres' prepare.
    Prepare(usize),
    /// `Bind` of the unnamed portal, `Execute` with no row limit, `Sync`:
    /// tokio-postgres' query, the only shape that may join a group.
    Query(usize, Orders),
    /// As `Query`, through a named portal or with a row limit.
    Portal(usize, Orders, bool, u8),
    /// Two statements under one `Sync`.
    Twice(usize, usize, Orders),
    /// `Close` of the statement, `Sync`: the statement cache evicting it.
    Close(usize),
    /// A simple `Query`.
    Simple(Orders),
}

fn name(statement: usize) -> &'static [u8] {
    STATEMENTS[statement].0.as_bytes()
}

fn bind(portal: &[u8], statement: &[u8], orders: Option<Orders>) -> Vec<u8> {
    let mut body = [portal, b"\0", statement, b"\0", &[0, 0]].concat();
    match orders {
        Some(orders) => {
            let text = orders.text();
            body.extend_from_slice(&[0, 1]);
            body.extend_from_slice(&(text.len() as u32).to_be_bytes());
            body.extend_from_slice(text.as_bytes());
        }
        None => body.extend_from_slice(&[0, 0]),
    }
    body.extend_from_slice(&[0, 0]);
    message(b'B', &body)
}

fn execute(portal: &[u8], limit: u8) -> Vec<u8> {
    let body = [portal, b"\0", &u32::from(limit).to_be_bytes()].concat();
    message(b'E', &body)
}

fn sync() -> Vec<u8> {
    message(b'S', b"")
}

impl Request {
    fn bytes(&self) -> Vec<u8> {
        match *self {
            Request::Prepare(s) => {
                let (name, sql, _) = STATEMENTS[s];
                let describe = [b"S", name.as_bytes(), b"\0"].concat();
                [parse(name, sql), message(b'D', &describe), sync()].concat()
            }
            Request::Query(s, o) => [bind(b"", name(s), Some(o)), execute(b"", 0), sync()].concat(),
            Request::Portal(s, o, named, limit) => {
                let portal: &[u8] = if named { b"p" } else { b"" };
                let limit = if named { limit } else { limit.max(1) };
                [
                    bind(portal, name(s), Some(o)),
                    execute(portal, limit),
                    sync(),
                ]
                .concat()
            }
            Request::Twice(a, b, o) => [
                bind(b"", name(a), Some(o)),
                execute(b"", 0),
                bind(b"", name(b), Some(o)),
                execute(b"", 0),
                sync(),
            ]
            .concat(),
            Request::Close(s) => [message(b'C', &[b"S", name(s), b"\0"].concat()), sync()].concat(),
            Request::Simple(o) => message(b'Q', format!("SELECT '{}'\0", o.text()).as_bytes()),
        }
    }
}

/// A statement: mostly the groupable reads.
fn statement() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0..2usize, 1 => 0..STATEMENTS.len()]
}

fn orders() -> impl Strategy<Value = Orders> {
    let size = prop_oneof![8 => 0..16usize, 1 => 16..2000usize];
    (0..4usize, size, prop::bool::weighted(0.1)).prop_map(|(rows, size, fail)| Orders {
        tag: 0,
        rows,
        size,
        fail,
    })
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        2 => statement().prop_map(Request::Prepare),
        12 => (statement(), orders()).prop_map(|(s, o)| Request::Query(s, o)),
        1 => (statement(), orders(), any::<bool>(), 0..3u8)
            .prop_map(|(s, o, named, limit)| Request::Portal(s, o, named, limit)),
        1 => (statement(), statement(), orders()).prop_map(|(a, b, o)| Request::Twice(a, b, o)),
        1 => statement().prop_map(Request::Close),
        1 => orders().prop_map(Request::Simple),
    ]
}

/// A client's requests, each tagged with its index: every statement
/// prepared first (as the pool's cache does before using one), then a mix.
fn requests() -> impl Strategy<Value = Vec<Request>> {
    prop::collection::vec(request(), 1..40).prop_map(|mix| {
        let prepares = (0..STATEMENTS.len()).map(Request::Prepare);
        let mut all: Vec<Request> = prepares.chain(mix).collect();
        for (tag, request) in all.iter_mut().enumerate() {
            match request {
                Request::Query(_, o)
                | Request::Portal(_, o, ..)
                | Request::Twice(_, _, o)
                | Request::Simple(o) => o.tag = tag,
                Request::Prepare(_) | Request::Close(_) => {}
            }
        }
        all
    })
}

/// How the bytes move: sizes of the client's writes (and whether each is on
/// a shared connection), of the reads of the server's answers, and which of
/// the two happens next.
#[derive(Debug, Clone)]
struct Schedule {
    /// Writes are whole requests (as tokio-postgres writes them), so
    /// many each; else bytes, split anywhere. See [`grouped`].
    whole: bool,
    writes: Vec<(usize, bool)>,
    reads: Vec<usize>,
    order: Vec<bool>,
}

fn sizes() -> impl Strategy<Value = usize> {
    prop_oneof![1..8usize, 8..200usize, 200..5000usize]
}

fn schedule() -> impl Strategy<Value = Schedule> {
    (
        any::<bool>(),
        prop::collection::vec((sizes(), prop::bool::weighted(0.9)), 1..16),
        prop::collection::vec(sizes(), 1..16),
        prop::collection::vec(any::<bool>(), 1..32),
    )
        .prop_map(|(whole, writes, reads, order)| Schedule {
            whole,
            writes,
            reads,
            order,
        })
}

/// The messages of a stream, whole.
fn framed(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    while bytes.len() >= 5 {
        let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
        all.push(bytes[..1 + len].to_vec());
        bytes = &bytes[1 + len..];
    }
    assert!(bytes.is_empty(), "a message cut short");
    all
}

/// A client's view of a stream: one answer per request, each up to and
/// with its `ReadyForQuery`.
fn answers(bytes: &[u8]) -> Vec<Vec<Vec<u8>>> {
    let mut all = vec![Vec::new()];
    for m in framed(bytes) {
        let last = m[0] == b'Z';
        all.last_mut().unwrap().push(m);
        if last {
            all.push(Vec::new());
        }
    }
    assert!(
        all.pop().unwrap().is_empty(),
        "an answer with no ReadyForQuery"
    );
    all
}

fn is_skip(m: &[u8]) -> bool {
    m[0] == b'E' && m.windows(7).any(|w| w == b"CPP001\0")
}

/// What the client sees, and the model server, after `requests` were
/// written through a rewriter for `grouping` and answered.
///
/// A request's answer can reach the rewriter only after its `Sync` did:
/// tokio-postgres writes whole requests, and the server flushes at
/// `ReadyForQuery` or once 8 KB wait (which, for a request written in
/// pieces, may be before its `Sync` arrived: the rewriter would take that
/// answer as one to no request). So writes split anywhere are answered
/// with a flush at `ReadyForQuery` only.
fn grouped(
    requests: &[Vec<u8>],
    grouping: Grouping,
    head_faults: &[u8],
    s: &Schedule,
) -> Result<(Vec<u8>, Server), TestCaseError> {
    let mut c = Coalescer::new(grouping);
    c.arm();
    let read_only = grouping == Grouping::ReadOnlySession;
    let flush_above = s.whole.then_some(8192);
    let mut server = Server::new(read_only, head_faults, flush_above);
    // Where writes may end: between requests, or anywhere.
    let mut ends: Vec<usize> = requests
        .iter()
        .map(Vec::len)
        .scan(0, |at, n| {
            *at += n;
            Some(*at)
        })
        .collect();
    let stream = requests.concat();
    if !s.whole {
        ends = (1..=stream.len()).collect();
    }
    let (mut written, mut read, mut step, mut end) = (0, 0, 0, 0);
    let mut client = Vec::new();
    while written < stream.len() || read < server.output.len() {
        let write = written < stream.len()
            && (read == server.output.len() || s.order[step % s.order.len()]);
        if write {
            let (size, shared) = s.writes[step % s.writes.len()];
            end = (end + size).min(ends.len()) - 1;
            let chunk = &stream[written..ends[end]];
            end += 1;
            written += chunk.len();
            c.use_catalog(1, || Arc::new(Catalog::empty()));
            let mut out = Vec::new();
            c.outbound(chunk, shared, &mut out);
            server.receive(&out);
        } else {
            let size = s.reads[step % s.reads.len()];
            let chunk = &server.output[read..server.output.len().min(read + size)];
            read += chunk.len();
            let done = if c.passes_through() {
                client.extend_from_slice(chunk);
                c.pass(chunk)
            } else {
                c.inbound(chunk, &mut client)
            };
            if let Err(confused) = done {
                return Err(TestCaseError::fail(format!(
                    "a faithful server: {confused}"
                )));
            }
        }
        step += 1;
    }
    prop_assert!(c.requests.is_empty(), "left waiting: {:?}", c.requests);
    prop_assert!(c.passes_through());
    Ok((client, server))
}

/// Runs `requests` through a rewriter and checks what each request gets.
fn check(
    requests: &[Request],
    grouping: Grouping,
    head_faults: &[u8],
    s: &Schedule,
) -> Result<(), TestCaseError> {
    let bytes: Vec<Vec<u8>> = requests.iter().map(Request::bytes).collect();
    let mut alone = Server::new(grouping == Grouping::ReadOnlySession, &[], None);
    alone.receive(&bytes.concat());
    let own = answers(&alone.output);
    prop_assert_eq!(own.len(), requests.len(), "the model answers every request");
    let (client, server) = grouped(&bytes, grouping, head_faults, s)?;
    prop_assert!(server.violations.is_empty(), "{:?}", server.violations);
    let seen = answers(&client);
    prop_assert_eq!(seen.len(), requests.len(), "one ReadyForQuery per request");
    for (tag, (seen, own)) in seen.iter().zip(&own).enumerate() {
        let skipped = server.skipped.contains(&tag);
        let refused = server.refused.contains(&tag);
        let expected_skip = match seen.as_slice() {
            [e, z] if is_skip(e) && z[0] == b'Z' => skipped,
            [b, e, z] if is_skip(e) && z[0] == b'Z' && b[0] == b'2' => refused,
            _ => {
                prop_assert_eq!(seen, own, "request {}: {:?}", tag, requests[tag]);
                true
            }
        };
        prop_assert!(
            expected_skip,
            "request {} ({:?}) answered as skipped, but the server ran it",
            tag,
            requests[tag]
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn each_request_gets_its_own_answer_at_its_place_on_a_read_only_session(
        requests in requests(),
        s in schedule(),
    ) {
        check(&requests, Grouping::ReadOnlySession, &[], &s)?;
    }

    #[test]
    fn each_request_gets_its_own_answer_at_its_place_behind_a_read_only_head(
        requests in requests(),
        head_faults in prop::collection::vec(prop_oneof![8 => Just(0u8), 1 => 1..3u8], 0..8),
        s in schedule(),
    ) {
        check(&requests, Grouping::ReadOnlyHead, &head_faults, &s)?;
    }
}

#[test]
fn the_models_statements_are_grouped_as_the_guard_says() {
    let catalog = Catalog::empty();
    let mut groupable = learn::Groupable::default();
    for reads in [false, true] {
        for (name, sql, _) in STATEMENTS {
            let body = [name.as_bytes(), b"\0", sql.as_bytes(), b"\0\0\0"].concat();
            learn::learn(&mut groupable, &catalog, &body, reads);
        }
        let learned: Vec<_> = STATEMENTS
            .iter()
            .map(|(name, _, does)| (groupable.contains(name.as_bytes()), *does))
            .collect();
        assert_eq!(
            learned,
            [
                (true, Does::Read),
                (true, Does::Read),
                (!reads, Does::Write),
                (true, Does::Write),
                (false, Does::Set),
                (true, Does::Unparsable),
                (true, Does::Read),
            ],
            "reads only: {reads}"
        );
    }
}
