//! What a connection's answers say about its session: the rules that keep
//! "no session state leaks to the next user" true on a shared connection.
//!
//! A pure function of the messages the tap frames, so that it can be tested
//! without a socket: the tap (`conn::tap`) feeds it each `ReadyForQuery`,
//! `ParameterStatus` and simple `Query` with its request number, and
//! applies the [`Verdict`]s it returns to the connection's state (a
//! quarantine takes effect only on a shared connection; an exclusive one
//! may hold any state its user likes, and is reset when it comes back).
//!
//! The rules:
//!
//! - A `ReadyForQuery` whose status is not `I` (idle) shows a transaction
//!   that no shared query may leave open, unless it answers a request
//!   inside one of the pool's own atomic batches ([`Verdict::Transaction`]).
//! - A `ParameterStatus` after start-up reports a setting some query
//!   changed ([`Verdict::SessionState`]), except for settings that describe
//!   the server rather than the session, for a `SET LOCAL` inside an atomic
//!   batch (its `COMMIT` undoes it), and behind a transaction pooler (it
//!   comes from whichever server is linked).
//! - `in_hot_standby` changing after start-up is a standby promoted under
//!   the connection: its host's role changed ([`Verdict::RoleChange`]).

use std::collections::VecDeque;

use crate::metrics::QuarantineReason;

/// Reported settings that describe the server, not a session: no session
/// can change them (`in_hot_standby` turns off when a standby is promoted).
const SERVER_STATE: [&[u8]; 4] = [
    b"in_hot_standby",
    b"server_version",
    b"server_encoding",
    b"integer_datetimes",
];

/// How the pool opens and closes the transaction block that carries a
/// statement's head-of-line budget behind a transaction pooler (the
/// `conn::run` module's `block`): a unit, as an atomic batch's `BEGIN` and
/// `COMMIT` are.
pub(crate) const BLOCK_BEGIN: &str = "/* pgpipe */ BEGIN; ";
pub(crate) const BLOCK_COMMIT: &str = "/* pgpipe */ COMMIT";

/// What the tap must do about an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The session shows a transaction outside any atomic batch:
    /// quarantine the connection, and suspect the catalog (something ran
    /// that the guard did not expect to: it may know more now).
    Transaction,
    /// A session setting changed: quarantine, and suspect the catalog.
    SessionState,
    /// A standby was promoted under the connection: quarantine (it finishes
    /// what it carries and takes nothing new), and have every host's role
    /// checked again.
    RoleChange,
}

impl Verdict {
    /// Why the connection is quarantined.
    pub(crate) fn reason(self) -> QuarantineReason {
        match self {
            Verdict::Transaction => QuarantineReason::Transaction,
            Verdict::SessionState => QuarantineReason::SessionState,
            Verdict::RoleChange => QuarantineReason::RoleChange,
        }
    }
}

/// The watch over one connection's session; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct SessionWatch {
    /// The atomic batches a shared connection carries, as the numbers of
    /// the requests that open and close them (`BEGIN`, and `COMMIT` or
    /// `ROLLBACK`, as simple queries: on a shared connection only the pool
    /// sends those, since the guard refuses transaction control there). The
    /// answers between them may show a transaction (`T`, or `E` after a
    /// failed item), and the `ParameterStatus` a `SET LOCAL` inside sends
    /// (and its `COMMIT` undoes); any other answer that shows a transaction
    /// is a [`Verdict::Transaction`], as is a `COMMIT` that leaves one open.
    /// Forgotten at the first write while the connection is not shared: a
    /// batch whose close went out then was never seen closing, and must not
    /// cover what comes after.
    units: VecDeque<(u64, u64)>,
    /// Behind a transaction pooler: a `ParameterStatus` is no session's
    /// doing.
    behind_transaction_pooler: bool,
}

impl SessionWatch {
    pub(crate) fn new(behind_transaction_pooler: bool) -> SessionWatch {
        SessionWatch {
            units: VecDeque::new(),
            behind_transaction_pooler,
        }
    }

    /// A write while the connection is not shared: no batch seen so far
    /// covers anything after it.
    #[inline]
    pub(crate) fn unshared(&mut self) {
        if !self.units.is_empty() {
            self.units.clear();
        }
    }

    /// While shared, request number `request` was written: the simple query
    /// whose SQL starts with `sql`.
    #[inline]
    pub(crate) fn on_simple_query(&mut self, sql: &[u8], request: u64) {
        match sql {
            b"BEGIN" => self.units.push_back((request, u64::MAX)),
            _ if sql.starts_with(BLOCK_BEGIN.as_bytes()) => {
                self.units.push_back((request, u64::MAX));
            }
            b"COMMIT" | b"ROLLBACK" => self.close_unit(request),
            _ if sql == BLOCK_COMMIT.as_bytes() => self.close_unit(request),
            _ => {}
        }
    }

    /// The unit open last closes at request number `request`.
    fn close_unit(&mut self, request: u64) {
        if let Some(open) = self.units.back_mut().filter(|(_, end)| *end == u64::MAX) {
            open.1 = request;
        }
    }

    /// A `ReadyForQuery` with transaction status `status` answers request
    /// number `request` (the first request is number 1).
    #[inline]
    pub(crate) fn on_ready(&mut self, status: u8, request: u64) -> Option<Verdict> {
        let in_batch = self.inside(request);
        (status != b'I' && !in_batch).then_some(Verdict::Transaction)
    }

    /// A `ParameterStatus` for the setting `name` was read after `answered`
    /// `ReadyForQuery` (none: still start-up).
    pub(crate) fn on_parameter(&mut self, name: &[u8], answered: u64) -> Option<Verdict> {
        if answered == 0 || self.behind_transaction_pooler {
            return None;
        }
        if name == b"in_hot_standby" {
            return Some(Verdict::RoleChange);
        }
        // Its request is the one the next ReadyForQuery answers.
        let changed = !SERVER_STATE.contains(&name) && !self.covers(answered + 1);
        changed.then_some(Verdict::SessionState)
    }

    /// Whether the answer to request number `request` may show an open
    /// transaction: it is a batch's `BEGIN` or one of its items. Answers
    /// come in request order, so batches answered in full are forgotten.
    fn inside(&mut self, request: u64) -> bool {
        self.front_for(request)
            .is_some_and(|(begin, end)| (begin..end).contains(&request))
    }

    /// Whether request number `request` belongs to a batch, its `COMMIT`
    /// included.
    fn covers(&mut self, request: u64) -> bool {
        self.front_for(request)
            .is_some_and(|(begin, end)| (begin..=end).contains(&request))
    }

    fn front_for(&mut self, request: u64) -> Option<(u64, u64)> {
        while self.units.front().is_some_and(|(_, end)| *end < request) {
            self.units.pop_front();
        }
        self.units.front().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch that saw start-up (request 1) answered, then `written`: the
    /// first bytes of each request's SQL (`""` for an extended-protocol
    /// request), numbered from 2.
    fn shared(written: &[&str]) -> SessionWatch {
        let mut watch = SessionWatch::new(false);
        assert_eq!(watch.on_ready(b'I', 1), None);
        for (n, sql) in written.iter().enumerate() {
            watch.on_simple_query(sql.as_bytes(), n as u64 + 2);
        }
        watch
    }

    /// Feeds ReadyForQuery with `statuses` to requests 2, 3, …; returns the
    /// verdict of each.
    fn answers(watch: &mut SessionWatch, statuses: &[u8]) -> Vec<Option<Verdict>> {
        (0..statuses.len())
            .map(|n| watch.on_ready(statuses[n], n as u64 + 2))
            .collect()
    }

    const BATCH: [&str; 6] = ["", "BEGIN", "", "", "COMMIT", ""];

    #[test]
    fn only_an_atomic_batchs_own_answers_may_show_its_transaction() {
        let fine = answers(&mut shared(&BATCH), b"ITTEII");
        assert!(fine.iter().all(Option::is_none), "{fine:?}");
        let before = answers(&mut shared(&BATCH), b"T");
        assert_eq!(before, [Some(Verdict::Transaction)], "the query before it");
        let left_open = answers(&mut shared(&BATCH), b"ITTTT");
        assert_eq!(
            left_open[4],
            Some(Verdict::Transaction),
            "a COMMIT leaving one"
        );
        let after = answers(&mut shared(&BATCH), b"ITTTIT");
        assert_eq!(after[5], Some(Verdict::Transaction), "the query after it");
        assert!(after[..5].iter().all(Option::is_none));
    }

    #[test]
    fn the_budgets_block_is_a_unit_and_nothing_else_that_starts_alike() {
        let head = format!("{BLOCK_BEGIN}SELECT 1");
        let block = ["", head.as_str(), "", BLOCK_COMMIT, ""];
        let fine = answers(&mut shared(&block), b"ITEII");
        assert!(fine.iter().all(Option::is_none), "{fine:?}");
        // A user's `BEGIN; …` is no unit of the pool's.
        let theirs = answers(&mut shared(&["", "BEGIN; SELECT 1", "", "COMMIT"]), b"ITT");
        assert_eq!(theirs[1], Some(Verdict::Transaction));
    }

    #[test]
    fn a_batch_is_forgotten_at_a_write_while_not_shared() {
        // BEGIN as request 2; the connection is taken back before its
        // COMMIT (3) is written; shared again for request 4.
        let mut watch = shared(&["BEGIN"]);
        watch.unshared();
        watch.on_simple_query(b"", 4);
        assert_eq!(watch.on_ready(b'T', 2), Some(Verdict::Transaction));
        // A ROLLBACK with no BEGIN open closes nothing.
        let mut watch = shared(&["ROLLBACK", ""]);
        assert_eq!(watch.on_ready(b'T', 2), Some(Verdict::Transaction));
    }

    #[test]
    fn a_batch_opened_in_one_write_covers_the_items_of_the_next() {
        let mut watch = shared(&["BEGIN"]);
        assert_eq!(watch.on_ready(b'T', 2), None);
        watch.on_simple_query(b"", 3);
        watch.on_simple_query(b"COMMIT", 4);
        assert_eq!(watch.on_ready(b'T', 3), None);
        assert_eq!(watch.on_ready(b'I', 4), None);
    }

    #[test]
    fn a_changed_setting_is_session_state_except_where_no_session_did_it() {
        let mut watch = shared(&[""]);
        assert_eq!(
            watch.on_parameter(b"application_name", 1),
            Some(Verdict::SessionState)
        );
        assert_eq!(
            watch.on_parameter(b"server_version", 1),
            None,
            "the server's"
        );
        assert_eq!(
            watch.on_parameter(b"in_hot_standby", 1),
            Some(Verdict::RoleChange),
            "a promotion is a role change, not session state"
        );
        assert_eq!(watch.on_parameter(b"TimeZone", 0), None, "start-up");
        let mut pooled = SessionWatch::new(true);
        assert_eq!(pooled.on_parameter(b"TimeZone", 5), None);
        assert_eq!(pooled.on_parameter(b"in_hot_standby", 5), None);
        // SET LOCAL inside a batch: its ParameterStatus comes before the
        // ReadyForQuery of the item that sent it, and its COMMIT undoes it.
        // Answered so far: start-up, the query before the batch, BEGIN.
        let mut watch = shared(&BATCH);
        assert_eq!(answers(&mut watch, b"IT"), [None, None]);
        assert_eq!(watch.on_parameter(b"TimeZone", 3), None, "its first item");
        assert_eq!(watch.on_ready(b'T', 4), None);
        assert_eq!(watch.on_ready(b'T', 5), None);
        assert_eq!(watch.on_parameter(b"TimeZone", 5), None, "its COMMIT");
        assert_eq!(watch.on_ready(b'I', 6), None);
        assert_eq!(watch.on_ready(b'I', 7), None);
        assert_eq!(
            watch.on_parameter(b"TimeZone", 7),
            Some(Verdict::SessionState),
            "after the batch"
        );
    }

    #[test]
    fn verdicts_name_their_quarantine() {
        assert_eq!(Verdict::Transaction.reason(), QuarantineReason::Transaction);
        assert_eq!(
            Verdict::SessionState.reason(),
            QuarantineReason::SessionState
        );
        assert_eq!(Verdict::RoleChange.reason(), QuarantineReason::RoleChange);
    }
}
