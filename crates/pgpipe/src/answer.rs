//! What a query returns: [`Op`] says which kind of answer is wanted, and
//! [`Answer`] carries it.

use tokio_postgres::Row;

use crate::error::Error;

/// What a query returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Its rows.
    Query,
    /// The rows it affected.
    Execute,
    /// Its first row, and how many rows came (`query_one`, `query_opt`):
    /// the rows are read as for [`Query`](Op::Query), within the same
    /// limits, but only the first is kept, and no vector is made for it.
    First,
}

/// What one query of a [`Batch`](crate::Batch) returned: its rows, or for
/// an [`execute`](crate::Batch::execute) item the number of rows it
/// affected.
#[derive(Debug)]
#[non_exhaustive]
pub enum Answer {
    /// The rows of a `query` item.
    Rows(Vec<Row>),
    /// The affected-row count of an `execute` item.
    Count(u64),
}

impl Answer {
    /// The rows; none for an `execute` item.
    pub fn rows(&self) -> &[Row] {
        match self {
            Answer::Rows(rows) => rows,
            Answer::Count(_) => &[],
        }
    }

    /// The rows, taken; none for an `execute` item.
    pub fn into_rows(self) -> Vec<Row> {
        match self {
            Answer::Rows(rows) => rows,
            Answer::Count(_) => Vec::new(),
        }
    }

    /// Rows affected (`execute`), or rows returned (`query`).
    pub fn rows_affected(&self) -> u64 {
        match self {
            Answer::Count(n) => *n,
            Answer::Rows(rows) => rows.len() as u64,
        }
    }
}

/// What one query returned, inside the pool: an [`Answer`]'s two kinds,
/// and for [`Op::First`] the first row alone. Public callers see an
/// [`Answer`] ([`into_answer`](Reply::into_answer)) or the rows.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The rows of [`Op::Query`].
    Rows(Vec<Row>),
    /// The rows affected, of [`Op::Execute`].
    Count(u64),
    /// The first row of [`Op::First`], and how many rows came.
    First(Option<Row>, usize),
}

impl Reply {
    /// As [`Answer`].
    pub(crate) fn into_answer(self) -> Answer {
        match self {
            Reply::Rows(rows) => Answer::Rows(rows),
            Reply::Count(n) => Answer::Count(n),
            Reply::First(row, _) => Answer::Rows(row.into_iter().collect()),
        }
    }

    /// The rows, taken; none for [`Op::Execute`]. (Of [`Op::First`], the
    /// first row only: it is not asked for that.)
    #[inline]
    pub(crate) fn into_rows(self) -> Vec<Row> {
        match self {
            Reply::Rows(rows) => rows,
            Reply::Count(_) => Vec::new(),
            Reply::First(row, _) => row.into_iter().collect(),
        }
    }

    /// Rows affected ([`Op::Execute`]), or rows returned.
    #[inline]
    pub(crate) fn rows_affected(&self) -> u64 {
        match self {
            Reply::Count(n) => *n,
            Reply::Rows(rows) => rows.len() as u64,
            Reply::First(_, n) => *n as u64,
        }
    }

    /// The first row, and how many rows came.
    #[inline]
    fn first(self) -> (Option<Row>, usize) {
        match self {
            Reply::First(row, n) => (row, n),
            Reply::Rows(mut rows) => {
                let n = rows.len();
                rows.truncate(1);
                (rows.pop(), n)
            }
            Reply::Count(_) => (None, 0),
        }
    }
}

impl From<Vec<Row>> for Reply {
    fn from(rows: Vec<Row>) -> Reply {
        Reply::Rows(rows)
    }
}

/// The one row of `reply`, or a [`RowCount`](crate::ErrorKind::RowCount) error.
#[inline]
pub(crate) fn exactly_one(reply: impl Into<Reply>) -> Result<Row, Error> {
    let reply = reply.into();
    // The common answer taken as it is, before `first()` moves it apart:
    // without this, echo measured 12,349-12,368 instructions per query
    // against 12,337 (issue #25).
    if let Reply::First(Some(row), 1) = reply {
        return Ok(row);
    }
    match reply.first() {
        (Some(row), 1) => Ok(row),
        (_, n) => Err(Error::row_count("exactly one", n)),
    }
}

/// The row of `reply` if there is one; more is a
/// [`RowCount`](crate::ErrorKind::RowCount) error.
#[inline]
pub(crate) fn at_most_one(reply: impl Into<Reply>) -> Result<Option<Row>, Error> {
    match reply.into().first() {
        (row, 0 | 1) => Ok(row),
        (_, n) => Err(Error::row_count("at most one", n)),
    }
}
