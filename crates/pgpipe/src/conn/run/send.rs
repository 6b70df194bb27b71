//! Sending one checked query and reading its answer, within the result
//! caps.

use futures_core::Stream;
use tokio_postgres::RowStream;
use tokio_postgres::types::Type;

use super::{Limits, Prepared, Target};
use crate::answer::{Op, Reply};
use crate::conn::params::Params;
use crate::error::{Error, ErrorKind};

/// Whether [`send`] looks first that the connection is still usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Usable {
    /// Look: a query admitted to a connection since quarantined, or dead,
    /// fails as unsent and runs elsewhere.
    Check,
    /// The items of an atomic batch, which looked once for all of its
    /// requests: were one item to stay behind while the others went out,
    /// `COMMIT` would commit the batch without it.
    Checked,
}

/// Sends a checked query and reads its answer. The request is handed to
/// the connection on the first poll, so futures polled in order are sent
/// in order; first-polled in one turn (see [`Turns`](crate::conn::turn::Turns)),
/// with nothing in between.
pub(crate) async fn send(
    target: Target<'_>,
    sql: &str,
    statement: &Prepared,
    params: Params<'_, '_>,
    (op, usable): (Op, Usable),
    limits: Limits,
) -> Result<Reply, Error> {
    if usable == Usable::Check {
        if target.is_dead() {
            return Err(Error::new(ErrorKind::ConnectionLost, "the connection closed").unsent());
        }
        if let Some(reason) = target.state.session.quarantine_reason() {
            // Admitted before its connection was quarantined, and not yet
            // sent (it waited for a prepare, a batch window, a hand-off): it
            // goes elsewhere rather than out on a session known to be dirty.
            return Err(Error::quarantined(reason.label()));
        }
    }
    let failed = |e: tokio_postgres::Error| Error::from_query(e, target.client.is_closed());
    match (op, statement) {
        (Op::Query | Op::First, statement) => {
            collect(target, sql, statement, params, (op, limits)).await
        }
        (Op::Execute, Prepared::Named(statement, _)) => target
            .client
            .execute(statement, params)
            .await
            .map(Reply::Count)
            .map_err(failed),
        (Op::Execute, Prepared::Unnamed(types)) => {
            // Boxed: unnamed statements are the rare path.
            let stream = Box::pin(unnamed(target, sql, types, params))
                .await
                .map_err(failed)?;
            let mut stream = std::pin::pin!(stream);
            while let Some(row) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
                row.map_err(failed)?;
            }
            Ok(Reply::Count(stream.rows_affected().unwrap_or(0)))
        }
    }
}

/// Sends `sql` as an unnamed statement: Parse("")/Bind/Describe/Execute/
/// Sync in one group, nothing left on the server after its Sync.
async fn unnamed(
    target: Target<'_>,
    sql: &str,
    types: &[Type],
    params: Params<'_, '_>,
) -> Result<RowStream, tokio_postgres::Error> {
    let typed = params
        .iter()
        .zip(types)
        .map(|(param, ty)| (*param, ty.clone()));
    target.client.query_typed_raw(sql, typed).await
}

/// Reads a query's rows, within `limits`. Past a limit the rest of the
/// answer is read here and dropped, keeping nothing: the query keeps its
/// place until the server is done with it (so the router sees the
/// connection busy, and held up while it drains), the connection stays in
/// step, and an error hidden behind the rows still shows (an atomic batch
/// needs that: it means its transaction was rolled back).
async fn collect(
    target: Target<'_>,
    sql: &str,
    statement: &Prepared,
    params: Params<'_, '_>,
    (op, limits): (Op, Limits),
) -> Result<Reply, Error> {
    let failed = |e: tokio_postgres::Error| Error::from_query(e, target.client.is_closed());
    let stream = match statement {
        Prepared::Named(statement, _) => {
            target
                .client
                .query_raw(statement, params.iter().copied())
                .await
        }
        // Boxed, as below: the common future stays small.
        Prepared::Unnamed(types) => Box::pin(unnamed(target, sql, types, params)).await,
    }
    .map_err(failed)?;
    let mut stream = std::pin::pin!(stream);
    // Of `Op::First`, only the first row is kept; the rest are counted,
    // and held to the same limits as if they were kept.
    let mut reply = match op {
        Op::First => Reply::First(None, 0),
        _ => Reply::Rows(Vec::new()),
    };
    let (mut bytes, mut too_large) = (0usize, None);
    let mut _draining = None;
    while let Some(row) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
        let row = row.map_err(failed)?;
        if too_large.is_some() {
            continue; // draining
        }
        bytes += row.raw_size_bytes();
        too_large = past_limits(limits, bytes, reply.rows_affected() as usize);
        if too_large.is_some() {
            reply = Reply::Count(0); // nothing kept
            _draining = Some(target.state.counts.draining());
            continue;
        }
        match &mut reply {
            Reply::First(first @ None, n) => (*first, *n) = (Some(row), 1),
            Reply::First(_, n) => *n += 1,
            Reply::Rows(rows) => rows.push(row),
            Reply::Count(_) => {}
        }
    }
    match too_large {
        Some(message) => Err(Error::new(ErrorKind::TooLarge, message).ran()),
        None => Ok(reply),
    }
}

/// Why an answer of `rows` rows so far and `bytes` bytes with the next row
/// is over `limits`, if it is.
#[inline]
fn past_limits(limits: Limits, bytes: usize, rows: usize) -> Option<String> {
    if let Some(max) = limits.max_bytes.filter(|max| bytes > *max) {
        return Some(format!(
            "the result passed max_result_bytes ({max} bytes) after {rows} rows"
        ));
    }
    if let Some(max) = limits.max_rows.filter(|max| rows >= *max) {
        return Some(format!("the result passed max_result_rows ({max})"));
    }
    None
}
