//! Byte by byte: what the rewriter writes and what it hands back.

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
    let mut framer = Framer::new(Phase::Typed);
    let mut done = Vec::new();
    framer.feed(bytes, |m| done.push(m.kind));
    done
}

/// Whether each request in flight lost its `Sync`.
fn shared(c: &Coalescer) -> Vec<bool> {
    c.requests
        .iter()
        .map(|r| !matches!(r, Req::Own | Req::Closing(_)))
        .collect()
}

/// Armed, with statements s0 … s9 known to be groupable.
fn armed() -> Coalescer {
    armed_as(Grouping::ReadOnlySession, 10)
}

/// Armed for `grouping`, with statements s0 … s`n-1` known to be groupable.
fn armed_as(grouping: Grouping, n: u8) -> Coalescer {
    let mut c = Coalescer::new(grouping);
    c.arm();
    for n in 0..n {
        c.groupable.insert(format!("s{n}").as_bytes());
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
    assert_eq!(shared(&c), [true, true, false]);
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
    // The statement that failed shares no group again on this connection
    // (each failure inside one skips its neighbours); the others still do.
    let mut out = Vec::new();
    c.outbound(&[query(2), query(3), query(4)].concat(), true, &mut out);
    assert_eq!(kinds(&out), b"BESBEBES");
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
    assert_eq!(shared(&c), [true, false, false]);
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
        assert!(!shared(&c)[0], "{odd:?}");
    }
    // At most MAX_GROUP queries under one Sync.
    let mut c = armed();
    let many: Vec<u8> = (0..100).flat_map(|n| query(n % 9)).collect();
    let mut out = Vec::new();
    c.outbound(&many, true, &mut out);
    let longest = shared(&c)
        .into_iter()
        .fold((0, 0), |(run, best), shared| {
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

#[test]
fn a_malformed_answer_is_an_error_and_what_came_before_is_delivered() {
    let mut c = armed();
    let mut out = Vec::new();
    c.outbound(&[query(1), query(2)].concat(), true, &mut out);
    let answers = [message(b'2', &[]), vec![b'C', 0, 0, 0, 3]].concat();
    let mut delivered = Vec::new();
    assert!(c.inbound(&answers, &mut delivered).is_err());
    assert_eq!(kinds(&delivered), b"2");
}

mod fuzz;
mod head;
