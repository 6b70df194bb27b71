//! The shapes of tokio-postgres' `query_raw`: parameters from any iterator,
//! rows as a stream.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use futures_core::Stream;
use tokio_postgres::Row;
use tokio_postgres::types::{BorrowToSql, Format, IsNull, ToSql, Type};

use crate::error::Error;

/// The rows of [`Executor::query_raw`](crate::Executor::query_raw), as a
/// stream, like tokio-postgres' `RowStream`. pgpipe reads an answer whole
/// (within `max_result_rows` and `max_result_bytes`) before handing it
/// back, so the rows are all here: the stream never waits.
#[derive(Debug)]
pub struct RowStream {
    rows: std::vec::IntoIter<Row>,
}

impl RowStream {
    pub(crate) fn new(rows: Vec<Row>) -> RowStream {
        RowStream {
            rows: rows.into_iter(),
        }
    }
}

impl Stream for RowStream {
    type Item = Result<Row, Error>;

    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Ready(self.rows.next().map(Ok))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.rows.size_hint()
    }
}

/// A parameter from `query_raw`'s iterator, held (`Sync`) while the query
/// waits for its connection.
#[derive(Debug)]
pub(crate) struct RawParam<P>(pub(crate) P);

impl<P: BorrowToSql + Sync + fmt::Debug> ToSql for RawParam<P> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        self.0.borrow_to_sql().to_sql_checked(ty, out)
    }

    fn accepts(_: &Type) -> bool {
        // Checked per value, in `to_sql_checked`.
        true
    }

    fn to_sql_checked(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        self.0.borrow_to_sql().to_sql_checked(ty, out)
    }

    fn encode_format(&self, ty: &Type) -> Format {
        self.0.borrow_to_sql().encode_format(ty)
    }
}

type BoxError = Box<dyn std::error::Error + Sync + Send>;
