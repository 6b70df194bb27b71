//! The generated client: its requests, as tokio-postgres writes them, and
//! how their bytes move (the writes, the reads, their order), and what a
//! deviating server may insert.

use proptest::prelude::*;

use super::super::{message, parse};
use super::server::{Orders, STATEMENTS};

/// One request as a client writes it.
#[derive(Debug, Clone)]
pub(super) enum Request {
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
    /// `Bind` of portal `p`, `Sync`: tokio-postgres' `bind` (outside a
    /// transaction block the portal is gone at the `Sync`).
    Bound(usize, Orders),
    /// `Execute` of portal `p` for so many rows, `Sync`: its `query_portal`.
    Resume(u8),
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
    pub(super) fn bytes(&self) -> Vec<u8> {
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
            Request::Bound(s, o) => [bind(b"p", name(s), Some(o)), sync()].concat(),
            Request::Resume(limit) => [execute(b"p", limit), sync()].concat(),
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
        1 => (statement(), orders()).prop_map(|(s, o)| Request::Bound(s, o)),
        1 => (0..3u8).prop_map(Request::Resume),
    ]
}

/// A client's requests, each tagged with its index: every statement
/// prepared first (as the pool's cache does before using one), then a mix.
pub(super) fn requests() -> impl Strategy<Value = Vec<Request>> {
    prop::collection::vec(request(), 1..40).prop_map(|mix| {
        let prepares = (0..STATEMENTS.len()).map(Request::Prepare);
        let mut all: Vec<Request> = prepares.chain(mix).collect();
        for (tag, request) in all.iter_mut().enumerate() {
            match request {
                Request::Query(_, o)
                | Request::Portal(_, o, ..)
                | Request::Twice(_, _, o)
                | Request::Simple(o)
                | Request::Bound(_, o) => o.tag = tag,
                Request::Prepare(_) | Request::Close(_) | Request::Resume(_) => {}
            }
        }
        all
    })
}

/// How the bytes move: sizes of the client's writes (and whether each is on
/// a shared connection), of the reads of the server's answers, and which of
/// the two happens next.
#[derive(Debug, Clone)]
pub(super) struct Schedule {
    /// Writes are whole requests (as tokio-postgres writes them), so
    /// many each; else bytes, split anywhere. See [`grouped`].
    pub(super) whole: bool,
    pub(super) writes: Vec<(usize, bool)>,
    pub(super) reads: Vec<usize>,
    pub(super) order: Vec<bool>,
}

fn sizes() -> impl Strategy<Value = usize> {
    prop_oneof![1..8usize, 8..200usize, 200..5000usize]
}

pub(super) fn schedule() -> impl Strategy<Value = Schedule> {
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

/// Something a faithful server would not send: a message of any type, or
/// noise.
pub(super) fn deviation() -> impl Strategy<Value = (usize, Vec<u8>)> {
    let kind = prop::sample::select(b"Z2CDEIns13tTNAS".to_vec());
    let bytes = prop_oneof![
        (kind, prop::collection::vec(any::<u8>(), 0..3)).prop_map(|(k, body)| message(k, &body)),
        prop::collection::vec(any::<u8>(), 1..12),
    ];
    (0..6000usize, bytes)
}
