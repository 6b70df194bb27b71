//! What a query returns: [`Op`] says which kind of answer is wanted, and
//! [`Answer`] carries it.

use tokio_postgres::Row;

use crate::error::Error;

/// What a query returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Query,
    Execute,
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

/// The one row of `rows`, or a [`RowCount`](crate::ErrorKind::RowCount) error.
#[inline]
pub(crate) fn exactly_one(mut rows: Vec<Row>) -> Result<Row, Error> {
    match rows.len() {
        1 => Ok(rows.remove(0)),
        n => Err(Error::row_count("exactly one", n)),
    }
}

/// The row of `rows` if there is one; more is a
/// [`RowCount`](crate::ErrorKind::RowCount) error.
#[inline]
pub(crate) fn at_most_one(mut rows: Vec<Row>) -> Result<Option<Row>, Error> {
    match rows.len() {
        0 => Ok(None),
        1 => Ok(Some(rows.remove(0))),
        n => Err(Error::row_count("at most one", n)),
    }
}
