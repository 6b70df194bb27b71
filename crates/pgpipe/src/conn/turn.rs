//! Turns: the order in which requests join a connection's pipeline.
//!
//! tokio-postgres hands a request to its connection on the request
//! future's first poll, and the server runs requests in that order. On a
//! shared connection tasks on other threads poll at the same time, so two
//! requests one task polls back to back may have another task's request
//! between them. For independent queries that is harmless. For an atomic
//! batch on a shared connection it is not: a neighbour's query between its
//! `BEGIN` and `COMMIT` would run inside its transaction, be rolled back
//! with it, or abort it.
//!
//! So every request the pool sends on a connection goes out in a *turn*:
//! its first poll happens with the connection's turn lock held, and what
//! must stay together (an atomic batch; a query and the cleanup behind it)
//! is first-polled in one turn. The lock is held for those synchronous
//! polls only, never across an `await`. Plain requests share it (a read
//! lock: they need not exclude each other, only an atomic batch's group,
//! which takes it alone).
//!
//! A prepare is the one request that may send more requests later (when a
//! statement uses a type that is not PostgreSQL's own, tokio-postgres looks
//! it up with queries of its own, on later polls). Prepares are counted,
//! and a group that must stay together waits until none is under way.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::RwLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};

use tokio::sync::Notify;

use crate::sync::{read_lock, write_lock};

/// A connection's turn lock and its prepares under way; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    /// Held while requests are handed to the connection: shared by plain
    /// requests, alone by a group. It guards no data: poison (a parameter's
    /// `ToSql` panicking inside a turn) is ignored.
    lock: RwLock<()>,
    preparing: AtomicU32,
    prepared: Notify,
}

/// A prepare under way; counted until dropped.
pub(crate) struct Preparing<'a>(&'a Turns);

impl Drop for Preparing<'_> {
    fn drop(&mut self) {
        if self.0.preparing.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.prepared.notify_waiters();
        }
    }
}

impl Turns {
    /// Runs `request`, handing it to the connection in a turn of its own.
    pub(crate) fn send<F: Future>(&self, request: F) -> PlainRequest<'_, F> {
        PlainRequest {
            request: InTurn::new(self, request, Shared),
        }
    }

    /// Runs a prepare in a turn, counted as under way from now until it
    /// ends. Counted before its turn: a group that checks the count in its
    /// own turn either sees it, or goes out entirely before the prepare.
    pub(crate) fn prepare<F: Future>(&self, prepare: F) -> Prepare<'_, F> {
        self.preparing.fetch_add(1, Ordering::AcqRel);
        Prepare {
            _counted: Preparing(self),
            request: self.send(prepare),
        }
    }

    /// Runs the requests `make` builds if, in their turn, no prepare is
    /// under way on the connection and `ready()` holds: every request they
    /// send on their first poll then reaches the server with nothing in
    /// between. Waits while prepares are under way; `None` when `ready()`
    /// said no (nothing was sent).
    pub(crate) async fn send_together<F: Future>(
        &self,
        mut make: impl FnMut() -> F,
        ready: impl Fn() -> bool,
    ) -> Option<F::Output> {
        loop {
            loop {
                let mut done = pin!(self.prepared.notified());
                done.as_mut().enable();
                if self.preparing.load(Ordering::Acquire) == 0 {
                    break;
                }
                done.await;
            }
            let mut raced = false;
            let output = InTurn::new(
                self,
                make(),
                Alone(|| {
                    // A prepare may have started since: look again.
                    raced = self.preparing.load(Ordering::Acquire) > 0;
                    !raced && ready()
                }),
            )
            .await;
            if !raced {
                return output;
            }
        }
    }
}

/// How a request takes its turn, and whether it goes ahead in it.
pub(crate) trait Turn {
    /// Takes the turn lock and, if the turn goes ahead, runs `first_poll`
    /// in it.
    fn take<R>(self, lock: &RwLock<()>, first_poll: impl FnOnce() -> R) -> Option<R>;
}

/// A plain request's turn: shares the lock, always goes ahead.
pub(crate) struct Shared;

impl Turn for Shared {
    fn take<R>(self, lock: &RwLock<()>, first_poll: impl FnOnce() -> R) -> Option<R> {
        let _turn = read_lock(lock);
        Some(first_poll())
    }
}

/// A group's turn: takes the lock alone, goes ahead if its check, asked in
/// the turn, says so.
pub(crate) struct Alone<C>(C);

impl<C: FnOnce() -> bool> Turn for Alone<C> {
    fn take<R>(self, lock: &RwLock<()>, first_poll: impl FnOnce() -> R) -> Option<R> {
        let _turn = write_lock(lock);
        (self.0)().then(first_poll)
    }
}

pin_project_lite::pin_project! {
    /// A request whose first poll happens in a turn, if the turn (asked in
    /// it) says so. Output: the request's, or `None` from a turn that did
    /// not go ahead.
    pub(crate) struct InTurn<'a, F, T> {
        turns: &'a Turns,
        turn: Option<T>,
        #[pin]
        request: F,
    }
}

impl<'a, F, T> InTurn<'a, F, T> {
    fn new(turns: &'a Turns, request: F, turn: T) -> Self {
        InTurn {
            turns,
            turn: Some(turn),
            request,
        }
    }
}

impl<F: Future, T: Turn> Future for InTurn<'_, F, T> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        match this.turn.take() {
            Some(turn) => match turn.take(&this.turns.lock, || this.request.as_mut().poll(cx)) {
                Some(polled) => polled.map(Some),
                None => Poll::Ready(None),
            },
            None => this.request.poll(cx).map(Some),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request in a turn that always goes ahead: [`Turns::send`].
    pub(crate) struct PlainRequest<'a, F> {
        #[pin]
        request: InTurn<'a, F, Shared>,
    }
}

impl<F: Future> Future for PlainRequest<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project()
            .request
            .poll(cx)
            .map(|output| output.expect("a turn that always goes ahead"))
    }
}

pin_project_lite::pin_project! {
    /// A prepare in a turn, counted while it lives: [`Turns::prepare`].
    pub(crate) struct Prepare<'a, F> {
        _counted: Preparing<'a>,
        #[pin]
        request: PlainRequest<'a, F>,
    }
}

impl<F: Future> Future for Prepare<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().request.poll(cx)
    }
}
