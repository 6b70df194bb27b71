//! Property tests of the read groups' rewriter against a model server
//! ([`server`]): a generated pipelined client stream goes through
//! [`Coalescer::outbound`] in random writes, the model answers what reaches
//! it, and its answers come back through [`Coalescer::pass`] or
//! [`Coalescer::inbound`] (as the tap chooses) in random reads, the two
//! interleaved at random. The same stream run on the model without a
//! rewriter gives each request's own answer; the client must see exactly
//! that answer at that request's place, or, for a request the server
//! skipped (or refused as a write behind the head), the skip error and
//! nothing else. The model also flags what PostgreSQL would let happen
//! but a correct rewriter never asks of it: a write answered and then
//! rolled back by another request's error, and, on a writable session,
//! requests sharing a transaction with no read-only head. A faithful
//! server never confuses the rewriter, and nothing panics.
//!
//! `PROPTEST_CASES` sets the number of cases (default [`CASES`]).

mod client;
mod server;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError};

use super::*;
use crate::protocol::framer::{Message, Tap};
use client::{Request, Schedule, deviation, requests, schedule};
use server::{Does, STATEMENTS, Server};

/// Cases per property unless `PROPTEST_CASES` says otherwise: enough to
/// catch a misroute in a few seconds of `cargo test`.
const CASES: u32 = 256;

fn config() -> Config {
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

/// What the tap reads of a written message (see `conn::tap::writes`): its
/// type, a simple query's first bytes (the 32 the tap's own framer keeps),
/// and the SQL of a `Query` or `Parse`.
type TapView = (u8, Vec<u8>, Option<Result<Vec<u8>, usize>>);

fn tap_view(m: &Message<'_>) -> TapView {
    let name = m.parameter_name();
    let name = if m.kind == b'Q' {
        &name[..name.len().min(32)]
    } else {
        &[]
    };
    let sql = matches!(m.kind, b'Q' | b'P').then_some(m.body).flatten();
    let sql = sql.map(|b| b.map(<[u8]>::to_vec).map_err(<[u8]>::len));
    (m.kind, name.to_vec(), sql)
}

/// What the tap reads of an answer (see `conn::tap::reads`): its type,
/// first body byte, and a ParameterStatus's name.
fn answer_view(m: &Message<'_>) -> (u8, Option<u8>, Vec<u8>) {
    let name = if m.kind == b'S' {
        m.parameter_name()
    } else {
        &[]
    };
    (m.kind, m.first, name.to_vec())
}

/// What came of one run: what the client saw, the model server, and
/// whether the rewriter lost step.
struct Run {
    client: Vec<u8>,
    server: Server,
    confused: Option<Confused>,
}

/// Runs `requests` through a rewriter for `grouping`, the model answering,
/// with `deviation` (bytes, and where in the server's answers) inserted.
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
    mut deviation: Option<(usize, Vec<u8>)>,
) -> Run {
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
    // The tap's own framer, reading the same writes with its capture on.
    let mut tap = Framer::<Tap>::new(Phase::Typed);
    tap.capture_sql(true);
    // As the tap reads: straight through while nothing needs rewriting,
    // up to a message that confuses the rewriter. With what the tap reads
    // of the answers from the rewriter's walk, which must be what its own
    // framer would read of what the client got.
    let (mut answered, mut own, mut tap_in, mut fed) =
        (Vec::new(), Vec::new(), Framer::<Tap>::new(Phase::Typed), 0);
    let mut deliver = |c: &mut Coalescer, chunk: &[u8], client: &mut Vec<u8>| {
        let seen = |m: &Message<'_>| answered.push(answer_view(m));
        let result = if c.passes_through() {
            match c.pass_seen(chunk, seen) {
                Ok(()) => {
                    client.extend_from_slice(chunk);
                    Ok(())
                }
                Err((confused, at)) => {
                    client.extend_from_slice(&chunk[..at]);
                    Err(confused)
                }
            }
        } else {
            c.inbound_seen(chunk, client, seen)
        };
        tap_in.feed(&client[fed..], |m| own.push(answer_view(&m)));
        fed = client.len();
        assert_eq!(
            answered, own,
            "the tap reads the rewriter's answers as its own"
        );
        result
    };
    while written < stream.len() || read < server.output.len() {
        let write = written < stream.len()
            && (read == server.output.len() || s.order[step % s.order.len()]);
        step += 1;
        if write {
            let (size, shared) = s.writes[step % s.writes.len()];
            end = (end + size).min(ends.len()) - 1;
            let chunk = &stream[written..ends[end]];
            end += 1;
            written += chunk.len();
            c.use_catalog(1, || Arc::new(Catalog::empty()));
            let mut out = Vec::new();
            let mut seen = Vec::new();
            c.outbound_seen(chunk, shared, &mut out, |m| seen.push(tap_view(m)));
            let mut own = Vec::new();
            tap.feed(chunk, |m| own.push(tap_view(&m)));
            assert_eq!(seen, own, "the tap reads the rewriter's walk as its own");
            server.receive(&out);
            continue;
        }
        let size = s.reads[step % s.reads.len()];
        let mut chunk = server.output[read..server.output.len().min(read + size)].to_vec();
        read += chunk.len();
        if let Some((at, bytes)) = deviation.take_if(|(at, _)| *at < read) {
            let at = chunk.len() - (read - at);
            chunk.splice(at..at, bytes);
        }
        if let Err(confused) = deliver(&mut c, &chunk, &mut client) {
            let confused = Some(confused);
            return Run {
                client,
                server,
                confused,
            };
        }
    }
    let mut confused = None;
    if let Some((_, bytes)) = deviation {
        confused = deliver(&mut c, &bytes, &mut client).err();
    }
    if confused.is_none() && !(c.requests.is_empty() && c.passes_through()) {
        confused = Some(Confused("left waiting"));
    }
    Run {
        client,
        server,
        confused,
    }
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
    let Run {
        client,
        server,
        confused,
    } = grouped(&bytes, grouping, head_faults, s, None);
    if let Some(confused) = confused {
        return Err(TestCaseError::fail(format!(
            "a faithful server: {confused}"
        )));
    }
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

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_deviating_server_never_makes_it_panic(
        requests in requests(),
        head in any::<bool>(),
        head_faults in prop::collection::vec(0..3u8, 0..4),
        s in schedule(),
        deviation in deviation(),
    ) {
        let bytes: Vec<Vec<u8>> = requests.iter().map(Request::bytes).collect();
        let grouping = if head { Grouping::ReadOnlyHead } else { Grouping::ReadOnlySession };
        grouped(&bytes, grouping, &head_faults, &s, Some(deviation));
    }

    #[test]
    fn any_bytes_either_way_never_make_it_panic(
        writes in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..8),
        reads in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..8),
        head in any::<bool>(),
    ) {
        let mut c = armed_as(if head { Grouping::ReadOnlyHead } else { Grouping::ReadOnlySession }, 10);
        c.head_prepared = head;
        let mut out = Vec::new();
        for (write, read) in writes.iter().zip(&reads) {
            // Plain queries with the noise between them.
            c.outbound(&[query(1), write.clone(), query(2), query(3)].concat(), true, &mut out);
            if c.passes_through() {
                let _ = c.pass(read);
            } else {
                let _ = c.inbound(read, &mut out);
            }
        }
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

/// A simple `Query` inside an unfinished extended request (a `Bind` with
/// no `Sync` before it) ends a request for the rewriter but not for the
/// server, which skips it behind a failed group member like anything
/// before the next `Sync`. tokio-postgres never writes one; another client
/// would find the rewriter waiting for answers that never come.
#[test]
#[ignore = "limitation: a Query inside an unfinished extended request, behind a failed group member"]
fn a_query_inside_an_unfinished_request_behind_a_failed_group() {
    let mut c = armed();
    let bind_then_query = [
        message(b'B', b"\0s2\0\0\0\0\0\0\0"),
        message(b'Q', b"SELECT 1\0"),
    ]
    .concat();
    let write = [query(1), bind_then_query, query(3), query(4)].concat();
    let mut out = Vec::new();
    c.outbound(&write, true, &mut out);
    // PostgreSQL: the first query fails, and everything up to the only Sync
    // left (the last) is skipped, the Query too.
    let answers = [
        message(b'2', &[]),
        message(b'E', b"boom"),
        message(b'Z', b"I"),
    ]
    .concat();
    let mut seen = Vec::new();
    c.inbound(&answers, &mut seen).unwrap();
    assert!(c.requests.is_empty(), "waiting for {:?}", c.requests);
}
