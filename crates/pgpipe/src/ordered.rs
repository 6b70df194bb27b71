//! [`join_in_order`]: polls futures in index order, so that the requests
//! they send reach the connection, and so the server, in that order.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// Polls `futures` to completion, every one on every wake and always in
/// index order, handing each output to `done` with its index as it comes
/// (so that a caller cut short by a deadline keeps what was answered).
///
/// The order is the point: a query future hands its request to the
/// connection on its first poll, so the server receives (and runs) the
/// items in this order. `join_all` does not promise an order.
pub(crate) async fn each_in_order<F: Future>(
    futures: Vec<F>,
    mut done: impl FnMut(usize, F::Output),
) {
    let mut futures: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, slot) in futures.iter_mut().enumerate() {
            if let Some(future) = slot {
                match future.as_mut().poll(cx) {
                    Poll::Ready(output) => {
                        *slot = None;
                        done(i, output);
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
}

/// As [`each_in_order`], returning the outputs in index order.
pub(crate) async fn join_in_order<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    each_in_order(futures, |i, output| outputs[i] = Some(output)).await;
    // Every future ran to completion, so every output is there.
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn first_polls_happen_in_order_and_outputs_come_back_in_order() {
        let started = Arc::new(Mutex::new(Vec::new()));
        let futures = (0..5u64)
            .map(|i| {
                let started = Arc::clone(&started);
                async move {
                    started.lock().unwrap().push(i);
                    // Later items finish first.
                    tokio::time::sleep(std::time::Duration::from_millis(10 * (5 - i))).await;
                    i * 10
                }
            })
            .collect();
        let outputs = join_in_order(futures).await;
        assert_eq!(outputs, vec![0, 10, 20, 30, 40]);
        assert_eq!(*started.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }
}
