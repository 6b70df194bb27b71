//! The I/O task's zero-length batch window: the mechanism behind the
//! README's "How queries are batched".

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::ConnState;

/// Drives a connection's I/O, stepping aside once each time it is woken.
///
/// A query wakes its connection's task as it enqueues its request, and tokio
/// runs a task woken that way next. The connection would then write that one
/// request alone, while the tasks woken by the same burst of answers are
/// still queued behind it, about to send theirs. Going to the back of the
/// run queue once lets them enqueue first, so one write carries them all.
/// This is the zero-length batch window: no timer, and on an idle runtime
/// the task runs again at once. It only steps aside while the connection is
/// shared by more than one query in flight; alone (or exclusive) there is
/// nobody to wait for.
pub(super) struct StepAside<F> {
    inner: Pin<Box<F>>,
    state: Arc<ConnState>,
    stepped: bool,
}

impl<F: Future> StepAside<F> {
    pub(super) fn new(inner: F, state: Arc<ConnState>) -> StepAside<F> {
        StepAside {
            inner: Box::pin(inner),
            state,
            stepped: true,
        }
    }
}

impl<F: Future> Future for StepAside<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        if !self.stepped && self.state.load.in_flight() > 1 {
            self.stepped = true;
            // Waking itself while running sends the task to the back of the
            // run queue (tokio treats it as a yield).
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let poll = self.inner.as_mut().poll(cx);
        self.stepped = false;
        poll
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A future that counts its polls and never finishes.
    struct Counted(Arc<AtomicUsize>);

    impl Future for Counted {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Poll::Pending
        }
    }

    #[test]
    fn steps_aside_once_per_wake_only_when_queries_share_the_connection() {
        let state = Arc::new(ConnState::default());
        let polls = Arc::new(AtomicUsize::new(0));
        let mut io = std::pin::pin!(StepAside::new(
            Counted(Arc::clone(&polls)),
            Arc::clone(&state)
        ));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // Alone: every poll reaches the connection.
        state.load.admit(64);
        let _ = io.as_mut().poll(&mut cx);
        let _ = io.as_mut().poll(&mut cx);
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        // Shared by two queries: the first poll after a wake steps aside,
        // the next one goes through.
        state.load.admit(64);
        let _ = io.as_mut().poll(&mut cx);
        assert_eq!(polls.load(Ordering::SeqCst), 2, "stepped aside");
        let _ = io.as_mut().poll(&mut cx);
        assert_eq!(polls.load(Ordering::SeqCst), 3);
    }
}
