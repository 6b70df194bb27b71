//! Groups on a writable session: the read-only head, its statement, and
//! what the server refuses behind it.

use super::*;
use crate::protocol::coalesce::learn::key;

/// As [`armed`], with a read-only head per group (prepared already), s0 …
/// s8 known to be groupable reads (s9 is not).
fn armed_with_head() -> Coalescer {
    let mut c = armed_as(Grouping::ReadOnlyHead, 9);
    c.head_prepared = true;
    c
}

/// The answer to a head: `BindComplete`, its row, `CommandComplete`.
fn head_answer() -> Vec<u8> {
    [
        message(b'2', &[]),
        message(b'D', b"\0\x01\0\0\0\x02on"),
        message(b'C', b"SELECT 1\0"),
    ]
    .concat()
}

#[test]
fn the_head_is_prepared_once_before_the_first_request_and_again_if_gone() {
    let mut c = armed_as(Grouping::ReadOnlyHead, 9);
    let mut out = Vec::new();
    c.outbound(&query(9), true, &mut out);
    assert_eq!(kinds(&out), b"PSBES");
    assert!(String::from_utf8_lossy(&out).contains("pgpipe_read_only_head"));
    let mut out = Vec::new();
    c.outbound(&[query(1), query(2)].concat(), true, &mut out);
    assert_eq!(kinds(&out), b"BEBEBES", "prepared once");
    // Its answer is taken; the request's is passed on.
    let answers = [
        message(b'1', &[]),
        message(b'Z', b"I"),
        message(b'2', &[]),
        message(b'C', b"SELECT 0\0"),
        message(b'Z', b"I"),
    ];
    let mut out = Vec::new();
    c.inbound(&answers.concat(), &mut out).unwrap();
    assert_eq!(kinds(&out), b"2CZ");
    // The head's statement gone (someone deallocated it): the group runs
    // again, and the head is prepared again before the next write.
    let gone = [error("26000"), message(b'Z', b"I")].concat();
    let mut out = Vec::new();
    c.inbound(&gone, &mut out).unwrap();
    assert_eq!(kinds(&out), b"EZEZ");
    assert_eq!(String::from_utf8_lossy(&out).matches(SKIPPED).count(), 2);
    let mut out = Vec::new();
    c.outbound(&[query(1), query(2)].concat(), true, &mut out);
    assert_eq!(kinds(&out), b"PSBEBEBES");
    // Its Parse refused: taken, and no more groups on this connection.
    let refused = [error("XX000"), message(b'Z', b"I")].concat();
    let mut out = Vec::new();
    c.inbound(&refused, &mut out).unwrap();
    assert!(out.is_empty());
    assert_eq!(c.requests.len(), 3);
    let mut out = Vec::new();
    c.outbound(&[query(1), query(2)].concat(), true, &mut out);
    assert_eq!(kinds(&out), b"BESBES");
}

#[test]
fn a_group_on_a_writable_session_starts_with_its_read_only_head() {
    let mut c = armed_with_head();
    let mut out = Vec::new();
    c.outbound(&[query(1), query(2), query(3)].concat(), true, &mut out);
    assert_eq!(kinds(&out), b"BEBEBEBES");
    assert!(String::from_utf8_lossy(&out).contains("pgpipe_read_only_head"));
    assert!(matches!(
        c.requests.make_contiguous(),
        [Req::Head, Req::Grouped(a), Req::Grouped(b), Req::Closing(c)]
            if [*a, *b, *c] == [key(b"s1"), key(b"s2"), key(b"s3")]
    ));
    // A request that is not a plain read is never in a group, not even as
    // its last: the read before it keeps its Sync.
    let mut c = armed_with_head();
    let mut out = Vec::new();
    c.outbound(&[query(1), query(2), query(9)].concat(), true, &mut out);
    assert_eq!(kinds(&out), b"BEBEBESBES");
    assert_eq!(shared(&c), [true, true, false, false]);
    // One read alone: no group, no head.
    let mut c = armed_with_head();
    let mut out = Vec::new();
    c.outbound(&[query(9), query(1)].concat(), true, &mut out);
    assert_eq!(kinds(&out), b"BESBES");
}

#[test]
fn the_heads_answer_is_taken_and_its_failure_skips_the_group() {
    let mut c = armed_with_head();
    let mut out = Vec::new();
    c.outbound(&[query(1), query(2)].concat(), true, &mut out);
    let head = head_answer();
    let reads = [
        message(b'2', &[]),
        message(b'D', b"row"),
        message(b'C', b"SELECT 1\0"),
        message(b'2', &[]),
        message(b'C', b"SELECT 0\0"),
        message(b'Z', b"I"),
    ]
    .concat();
    let mut out = Vec::new();
    for byte in [head, reads].concat() {
        c.inbound(&[byte], &mut out).unwrap();
    }
    assert_eq!(kinds(&out), b"2DCZ2CZ");
    assert!(c.requests.is_empty() && c.passes_through());
    // The head fails: both reads were skipped (run again by the pool), and
    // the connection forms no more groups.
    let mut c = armed_with_head();
    let mut out = Vec::new();
    c.outbound(&[query(1), query(2)].concat(), true, &mut out);
    let failed = [error("XX000"), message(b'Z', b"I")].concat();
    let mut out = Vec::new();
    c.inbound(&failed, &mut out).unwrap();
    assert_eq!(kinds(&out), b"EZEZ");
    assert_eq!(String::from_utf8_lossy(&out).matches(SKIPPED).count(), 2);
    let mut out = Vec::new();
    c.outbound(&[query(1), query(2)].concat(), true, &mut out);
    assert_eq!(kinds(&out), b"BESBES");
}

/// An `ErrorResponse` with SQLSTATE `code`.
fn error(code: &str) -> Vec<u8> {
    message(b'E', format!("SERROR\0C{code}\0Mno\0\0").as_bytes())
}

#[test]
fn a_read_the_server_refuses_as_a_write_in_a_group_runs_again_alone() {
    let head = head_answer();
    // The first member refused (25006): it and the rest of the group are
    // skipped, and s1 is forgotten as groupable.
    let mut c = armed_with_head();
    let mut out = Vec::new();
    c.outbound(&[query(1), query(2), query(3)].concat(), true, &mut out);
    let mut answers = Vec::new();
    let refused = [
        head.clone(),
        message(b'2', &[]),
        error("25006"),
        message(b'Z', b"I"),
    ];
    c.inbound(&refused.concat(), &mut answers).unwrap();
    assert_eq!(kinds(&answers), b"2EZEZEZ");
    assert_eq!(
        String::from_utf8_lossy(&answers).matches(SKIPPED).count(),
        3
    );
    assert!(c.requests.is_empty() && c.passes_through());
    let mut out = Vec::new();
    c.outbound(&[query(1), query(2), query(3)].concat(), true, &mut out);
    assert_eq!(kinds(&out), b"BESBEBEBES");
    // The last member refused: skipped; those before it keep their answers.
    let mut c = armed_with_head();
    let mut out = Vec::new();
    c.outbound(&[query(1), query(2)].concat(), true, &mut out);
    let read = [message(b'2', &[]), message(b'C', b"SELECT 0\0")].concat();
    let refused = [
        head.clone(),
        read,
        message(b'2', &[]),
        error("25006"),
        message(b'Z', b"I"),
    ];
    let mut answers = Vec::new();
    c.inbound(&refused.concat(), &mut answers).unwrap();
    assert_eq!(kinds(&answers), b"2CZ2EZ");
    assert_eq!(
        String::from_utf8_lossy(&answers).matches(SKIPPED).count(),
        1
    );
    let mut out = Vec::new();
    c.outbound(&[query(1), query(2)].concat(), true, &mut out);
    assert_eq!(kinds(&out), b"BESBES");
    // Any other error is the statement's own, and on a read-only session
    // even 25006 is: they reach the caller as they are.
    for (mut c, code) in [(armed_with_head(), "42P01"), (armed(), "25006")] {
        let mut out = Vec::new();
        c.outbound(&[query(1), query(2)].concat(), true, &mut out);
        let first = if c.read_only_head {
            head.clone()
        } else {
            Vec::new()
        };
        let failed = [first, message(b'2', &[]), error(code), message(b'Z', b"I")];
        let mut answers = Vec::new();
        c.inbound(&failed.concat(), &mut answers).unwrap();
        assert_eq!(kinds(&answers), b"2EZEZ");
        assert!(String::from_utf8_lossy(&answers).contains(code));
        assert_eq!(
            String::from_utf8_lossy(&answers).matches(SKIPPED).count(),
            1
        );
    }
}
