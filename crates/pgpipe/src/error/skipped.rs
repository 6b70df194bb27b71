//! The skipped-query errors of read groups: the SQLSTATE and source fields
//! the read-group rewriter (`protocol::coalesce`) gives them, and how an
//! error is recognised as one.

/// The SQLSTATE of a query the server skipped because an earlier query in
/// its group failed (class `PP` is not PostgreSQL's).
pub(crate) const SKIPPED: &str = "PP001";

/// The identity of the skipped-query errors the rewriter makes, in fields
/// no SQL can set (`RAISE` sets neither the source file nor the routine):
/// a query's own error with SQLSTATE `PP001` is never taken for a skip.
pub(crate) const SKIP_FILE: &str = "pgpipe/protocol/coalesce.rs";
pub(crate) const SKIP_ROUTINE: &str = "pgpipe_read_group_skip";

/// A skipped-query error the read-group rewriter made: its SQLSTATE, and
/// source fields that no SQL can set (a function's `RAISE … ERRCODE =
/// 'PP001'` is the function's own error, never taken for a skip).
pub(super) fn is_skip(db: &tokio_postgres::error::DbError) -> bool {
    db.code().code() == SKIPPED
        && db.file() == Some(SKIP_FILE)
        && db.routine() == Some(SKIP_ROUTINE)
}
