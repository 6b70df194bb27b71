//! A query's deadline (`query_timeout`), and what becomes of a query still
//! on the wire when it passes: cancelled if it is alone on its connection,
//! abandoned if it is pipelined with neighbours.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::Target;
use crate::error::Error;
use crate::metrics::CloseReason;

/// The throwaway statement that takes a cancel still pending on the
/// backend: the pool's own, not a holder's (it starts with
/// [`POOL_OWN`](crate::conn::state::held::POOL_OWN)).
const ABSORB: &str = "/* pgpipe */ SELECT 1";

/// What becomes of a query still on the wire when its deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Late {
    /// It is alone on its connection: cancel it, and wait until its answer
    /// is in, so that the connection is in step and no late cancel can hit
    /// the next statement. Past [`CANCEL_GRACE`] the connection is closed.
    Cancel,
    /// It is pipelined with neighbours: a cancel would hit whatever the
    /// backend runs, so it runs to its end and its answer is dropped.
    Abandon,
}

/// How long a cancelled query has to answer before its connection is closed.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// Waits until a cancelled query has answered and its cancel request went
/// through, or, if the connection died, only for the query.
async fn settle<T>(
    target: Target<'_>,
    mut cancel: std::pin::Pin<Box<impl Future<Output = ()>>>,
    mut query: std::pin::Pin<&mut impl Future<Output = Result<T, Error>>>,
) -> Result<T, Error> {
    let (mut cancelled, mut outcome) = (false, None);
    std::future::poll_fn(|cx| {
        if !cancelled && cancel.as_mut().poll(cx).is_ready() {
            cancelled = true;
        }
        if outcome.is_none() {
            if let Poll::Ready(result) = query.as_mut().poll(cx) {
                outcome = Some(result);
            }
        }
        match outcome.take() {
            Some(result) if cancelled || target.is_dead() => Poll::Ready(result),
            taken => {
                outcome = taken;
                Poll::Pending
            }
        }
    })
    .await
}

/// Runs the query `make` makes on `target` within `deadline`; past it,
/// `late` decides what becomes of the query (see [`Late`]).
///
/// It takes a maker rather than the query: a query future is kilobytes,
/// and one made here is made in place, where one passed in is copied into
/// this future's state first (a `memcpy` per query, ~200 instructions).
pub(crate) async fn within_deadline<T, F>(
    deadline: Option<Duration>,
    target: Target<'_>,
    make: impl FnOnce() -> F,
    late: impl FnOnce() -> Late,
) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>>,
{
    let Some(deadline) = deadline else {
        return make().await;
    };
    let mut query = pin!(make());
    if let Ok(result) = tokio::time::timeout(deadline, query.as_mut()).await {
        return result;
    }
    match late() {
        Late::Abandon => Err(Error::query_timeout(
            "it was pipelined with other queries, so it was not cancelled and runs to its end",
        )),
        // A cancel request through a transaction pooler reaches no server
        // while the query still waits for one, and the connection would
        // stay stuck behind it: close the connection instead. The pooler
        // then drops the query if it had no server yet, or closes the
        // server it ran on.
        Late::Cancel if target.state.traits.behind_transaction_pooler() => {
            target.state.kill(CloseReason::Broken);
            Err(Error::query_timeout(
                "its connection to the pooler was closed, which ends it there",
            ))
        }
        Late::Cancel => {
            // Boxed: a cancel request (a socket, maybe TLS) is a large
            // future, and a rare one.
            let cancel = Box::pin(target.cancel_and_wait());
            match tokio::time::timeout(CANCEL_GRACE, settle(target, cancel, query)).await {
                // Still running, or the cancel never got through: this
                // connection cannot be trusted to be in step with its next
                // user.
                Err(_) => target.state.kill(CloseReason::Broken),
                // Lost meanwhile: nothing left to hit.
                Ok(_) if target.is_dead() => {}
                // The cancel ended the query: it is used up.
                Ok(Err(e)) if e.code() == Some(&SqlState::QUERY_CANCELED) => {}
                // The query ended first, so the cancel may still be pending
                // on the backend (PostgreSQL acts on it at the next
                // statement): a throwaway statement takes it, not the next
                // caller's.
                Ok(_) => {
                    // In a turn: never between an atomic batch's requests.
                    let absorb = target.state.turns.send(target.client.batch_execute(ABSORB));
                    if tokio::time::timeout(CANCEL_GRACE, absorb).await.is_err() {
                        target.state.kill(CloseReason::Broken);
                    }
                }
            }
            Err(Error::query_timeout("it was cancelled"))
        }
    }
}
