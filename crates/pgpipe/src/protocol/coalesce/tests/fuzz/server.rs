//! A model PostgreSQL backend for the extended and simple query protocol,
//! as far as read groups meet it: statements by name, the unnamed and named
//! portals, the skip to `Sync` after an error (simple `Query` messages are
//! skipped too), the implicit transaction that each `Sync` ends, and
//! `transaction_read_only` set by the rewriter's head. Its own framing, not
//! the crate's [`Framer`](crate::protocol::framer::Framer).
//!
//! What each statement does comes from its SQL ([`STATEMENTS`]); what one
//! execution does, from the text parameter each `Bind` carries: the
//! request's index (its tag), how many rows, how long each, and whether it
//! fails. Every `DataRow`, `CommandComplete` and `ErrorResponse` it sends
//! for a request carries that tag, so an answer given to the wrong request
//! shows.

use std::collections::{BTreeSet, HashMap, VecDeque};

use super::super::message;

/// What a statement does when executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Does {
    /// Returns rows.
    Read,
    /// Writes: refused (25006) in a read-only transaction.
    Write,
    /// A setting: no rows.
    Set,
    /// Its `Parse` fails (a relation that does not exist).
    Unparsable,
}

/// The head the rewriter writes (`head.rs`), by its name.
pub(super) const HEAD: &[u8] = b"pgpipe_read_only_head";

/// The statements the generated clients prepare: name, SQL, and what the
/// model does with it. The guard groups some of them (see the test
/// `the_models_statements_are_grouped_as_the_guard_says`).
pub(super) const STATEMENTS: &[(&str, &str, Does)] = &[
    ("s0", "SELECT $1::text", Does::Read),
    ("s1", "SELECT $1::text, 2 AS b", Does::Read),
    ("s2", "INSERT INTO t VALUES ($1)", Does::Write),
    // Reads to the guard; a view over a function that writes, to the server.
    ("s3", "SELECT * FROM v WHERE a = $1", Does::Write),
    ("s4", "SET LOCAL statement_timeout = 1", Does::Set),
    ("s5", "SELECT $1::text FROM missing", Does::Unparsable),
    // Longer than the rewriter keeps of a Bind: never grouped.
    (
        "s6_a_statement_name_longer_than_the_sixty_four_bytes_kept_of_a_bind",
        "SELECT $1::text",
        Does::Read,
    ),
];

/// One execution's orders, from a `Bind`'s text parameter `tag/rows/size/fail`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Orders {
    pub(super) tag: usize,
    pub(super) rows: usize,
    pub(super) size: usize,
    pub(super) fail: bool,
}

impl Orders {
    pub(super) fn text(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.tag,
            self.rows,
            self.size,
            u8::from(self.fail)
        )
    }

    fn parse(text: &[u8]) -> Orders {
        let text = std::str::from_utf8(text).expect("orders are text");
        let n: Vec<usize> = text
            .split('/')
            .map(|n| n.parse().expect("a number"))
            .collect();
        Orders {
            tag: n[0],
            rows: n[1],
            size: n[2],
            fail: n[3] == 1,
        }
    }
}

#[derive(Debug)]
struct Portal {
    does: Does,
    orders: Option<Orders>,
    /// Rows sent so far (a row limit suspends it).
    sent: usize,
}

/// The model backend of one connection.
#[derive(Debug, Default)]
pub(super) struct Server {
    /// The session is read-only of itself (a read lane's).
    read_only_session: bool,
    /// Faults for the rewriter's head, one per `Parse` or `Bind` of it: 0
    /// none, 1 an error, 2 its statement gone (26000).
    head_faults: VecDeque<u8>,
    input: Vec<u8>,
    /// Answers written but not yet flushed, and those sent.
    unsent: Vec<u8>,
    pub(super) output: Vec<u8>,
    /// PostgreSQL flushes at each `ReadyForQuery` and whenever its send
    /// buffer fills (8 KB); `None`: only at `ReadyForQuery`.
    flush_above: Option<usize>,
    statements: HashMap<Vec<u8>, Does>,
    portals: HashMap<Vec<u8>, Portal>,
    skipping: bool,
    /// `transaction_read_only` for the implicit transaction (the head ran).
    read_only_tx: bool,
    /// Tags of the requests that ran in the implicit transaction, and of
    /// those that wrote in it.
    in_tx: BTreeSet<usize>,
    wrote: Vec<usize>,
    /// Requests whose `Bind` was skipped, and whose write the head's
    /// read-only transaction refused.
    pub(super) skipped: BTreeSet<usize>,
    pub(super) refused: BTreeSet<usize>,
    /// What PostgreSQL does but a correct rewriter never lets happen.
    pub(super) violations: Vec<String>,
}

fn cstr(bytes: &[u8]) -> (&[u8], &[u8]) {
    let nul = bytes.iter().position(|&b| b == 0).expect("a C string");
    (&bytes[..nul], &bytes[nul + 1..])
}

fn error(code: &str, tag: Option<usize>) -> Vec<u8> {
    let body = format!("SERROR\0C{code}\0Mfailed #{tag:?}\0\0");
    message(b'E', body.as_bytes())
}

impl Server {
    pub(super) fn new(
        read_only_session: bool,
        head_faults: &[u8],
        flush_above: Option<usize>,
    ) -> Server {
        Server {
            read_only_session,
            flush_above,
            head_faults: head_faults.iter().copied().collect(),
            ..Server::default()
        }
    }

    /// Takes bytes from the client, answering each message they complete.
    pub(super) fn receive(&mut self, bytes: &[u8]) {
        self.input.extend_from_slice(bytes);
        let mut at = 0;
        while let Some(header) = self.input.get(at..at + 5) {
            let len = u32::from_be_bytes(header[1..5].try_into().unwrap()) as usize;
            let Some(body) = self.input.get(at + 5..at + 1 + len) else {
                break;
            };
            let (kind, body) = (header[0], body.to_vec());
            at += 1 + len;
            self.on_message(kind, &body);
            let full = self.flush_above.is_some_and(|n| self.unsent.len() >= n);
            if matches!(kind, b'S' | b'Q') || full {
                self.output.append(&mut self.unsent);
            }
        }
        self.input.drain(..at);
    }

    fn fail(&mut self, code: &str, tag: Option<usize>) {
        self.unsent.extend(error(code, tag));
        self.skipping = true;
        if let Some(&w) = self.wrote.iter().find(|&&w| Some(w) != tag) {
            self.violations.push(format!(
                "request {w}'s write answered, then rolled back by {tag:?}'s error"
            ));
        }
    }

    fn on_message(&mut self, kind: u8, body: &[u8]) {
        if kind == b'S' {
            self.skipping = false;
            self.read_only_tx = false;
            self.in_tx.clear();
            self.wrote.clear();
            self.portals.clear();
            self.unsent.extend(message(b'Z', b"I"));
            return;
        }
        if self.skipping {
            if kind == b'B' {
                let (_, rest) = cstr(body);
                let (_, rest) = cstr(rest);
                if let Some(orders) = bind_orders(rest) {
                    self.skipped.insert(orders.tag);
                }
            }
            return;
        }
        match kind {
            b'P' => self.parse(body),
            b'B' => self.bind(body),
            b'E' => self.execute(body),
            b'D' => {
                let (name, _) = cstr(&body[1..]);
                match self.statements.get(name) {
                    Some(Does::Read) => {
                        self.unsent.extend(message(b't', &[0, 1, 0, 0, 0, 25]));
                        self.unsent.extend(message(
                            b'T',
                            b"\0\x01a\0\0\0\0\0\0\0\0\0\0\x19\xff\xff\xff\xff\xff\xff\0\0",
                        ));
                    }
                    Some(_) => {
                        self.unsent.extend(message(b't', &[0, 1, 0, 0, 0, 25]));
                        self.unsent.extend(message(b'n', b""));
                    }
                    None => self.fail("26000", None),
                }
            }
            b'C' => {
                let (name, _) = cstr(&body[1..]);
                self.statements.remove(name);
                self.unsent.extend(message(b'3', b""));
            }
            b'Q' => self.simple(body),
            _ => panic!("the model has no answer to {:?}", kind as char),
        }
    }

    fn parse(&mut self, body: &[u8]) {
        let (name, rest) = cstr(body);
        let (sql, _) = cstr(rest);
        if name == HEAD && self.head_faults.pop_front().unwrap_or(0) != 0 {
            return self.fail("XX000", None);
        }
        if !name.is_empty() && self.statements.contains_key(name) {
            return self.fail("42P05", None);
        }
        let does = if name == HEAD {
            Does::Read
        } else {
            STATEMENTS
                .iter()
                .find(|(_, s, _)| s.as_bytes() == sql)
                .map(|(_, _, does)| *does)
                .expect("a known statement")
        };
        if does == Does::Unparsable {
            return self.fail("42P01", None);
        }
        self.statements.insert(name.to_vec(), does);
        self.unsent.extend(message(b'1', b""));
    }

    fn bind(&mut self, body: &[u8]) {
        let (portal, rest) = cstr(body);
        let (name, rest) = cstr(rest);
        let orders = bind_orders(rest);
        let tag = orders.map(|o| o.tag);
        if name == HEAD {
            match self.head_faults.pop_front().unwrap_or(0) {
                0 => {}
                1 => return self.fail("XX000", None),
                _ => {
                    self.statements.remove(HEAD);
                }
            }
        }
        let Some(&does) = self.statements.get(name) else {
            return self.fail("26000", tag);
        };
        if let Some(tag) = tag {
            self.in_tx.insert(tag);
            if self.in_tx.len() > 1 && !self.read_only_session && !self.read_only_tx {
                self.violations
                    .push(format!("request {tag} in a group with no read-only head"));
            }
        }
        let portal_state = Portal {
            does,
            orders,
            sent: 0,
        };
        self.portals.insert(portal.to_vec(), portal_state);
        self.unsent.extend(message(b'2', b""));
    }

    fn execute(&mut self, body: &[u8]) {
        let (portal, rest) = cstr(body);
        let limit = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        let Some(p) = self.portals.get_mut(portal) else {
            return self.fail("34000", None);
        };
        let Some(orders) = p.orders else {
            // The head.
            self.read_only_tx = true;
            self.unsent.extend(message(b'D', b"\0\x01\0\0\0\x02on"));
            self.unsent.extend(message(b'C', b"SELECT 1\0"));
            return;
        };
        let tag = Some(orders.tag);
        match p.does {
            _ if orders.fail => self.fail("22012", tag),
            Does::Write if self.read_only_tx || self.read_only_session => {
                if self.read_only_tx && !self.read_only_session {
                    self.refused.insert(orders.tag);
                }
                self.fail("25006", tag);
            }
            Does::Write => {
                self.wrote.push(orders.tag);
                let done = format!("INSERT 0 1 #{}\0", orders.tag);
                self.unsent.extend(message(b'C', done.as_bytes()));
            }
            Does::Set => {
                // A reported setting, as after a SET of one that is reported.
                self.unsent.extend(message(b'S', b"TimeZone\0UTC\0"));
                self.unsent.extend(message(b'C', b"SET\0"));
            }
            Does::Read | Does::Unparsable => {
                let want = orders.rows - p.sent;
                let n = if limit > 0 { want.min(limit) } else { want };
                if orders.rows == 2 {
                    // Notices come at any time.
                    let notice = format!("SNOTICE\0Mnote #{}\0\0", orders.tag);
                    self.unsent.extend(message(b'N', notice.as_bytes()));
                }
                for _ in 0..n {
                    self.unsent.extend(row(orders));
                }
                p.sent += n;
                if n < want {
                    self.unsent.extend(message(b's', b""));
                } else {
                    let done = format!("SELECT {} #{}\0", orders.rows, orders.tag);
                    self.unsent.extend(message(b'C', done.as_bytes()));
                }
            }
        }
    }

    /// A simple `Query` of `SELECT 'orders'`: runs and answers alone.
    fn simple(&mut self, body: &[u8]) {
        let orders = Orders::parse(&body[8..body.len() - 2]);
        if orders.fail {
            self.unsent.extend(error("22012", Some(orders.tag)));
        } else {
            self.unsent.extend(message(
                b'T',
                b"\0\x01a\0\0\0\0\0\0\0\0\0\0\x19\xff\xff\xff\xff\xff\xff\0\0",
            ));
            for _ in 0..orders.rows {
                self.unsent.extend(row(orders));
            }
            let done = format!("SELECT {} #{}\0", orders.rows, orders.tag);
            self.unsent.extend(message(b'C', done.as_bytes()));
        }
        self.unsent.extend(message(b'Z', b"I"));
    }
}

/// The orders in a `Bind`'s parameters (after its portal and statement
/// names): none for the head, which has no parameter.
fn bind_orders(rest: &[u8]) -> Option<Orders> {
    let formats = u16::from_be_bytes(rest[..2].try_into().unwrap()) as usize;
    let rest = &rest[2 + 2 * formats..];
    let params = u16::from_be_bytes(rest[..2].try_into().unwrap());
    if params == 0 {
        return None;
    }
    let len = u32::from_be_bytes(rest[2..6].try_into().unwrap()) as usize;
    Some(Orders::parse(&rest[6..6 + len]))
}

/// A `DataRow` of one column: the request's tag, padded to `size`.
fn row(orders: Orders) -> Vec<u8> {
    let mut value = format!("#{}", orders.tag).into_bytes();
    value.resize(value.len().max(orders.size), b'.');
    let mut body = vec![0, 1];
    body.extend_from_slice(&(value.len() as u32).to_be_bytes());
    body.extend_from_slice(&value);
    message(b'D', &body)
}
