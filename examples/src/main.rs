//! A web service sharing one pipelined pgpipe pool across its handlers.
//!
//! Run it (PostgreSQL from `DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`):
//!
//! ```text
//! cargo run --release -p pgpipe-examples --bin web-service
//! curl localhost:3000/accounts/1
//! curl -X POST localhost:3000/transfers -H 'content-type: application/json' \
//!      -d '{"from": 1, "to": 2, "amount": 5}'
//! curl localhost:3000/metrics
//! ```
//!
//! `LISTEN_ADDR` changes the address (default `127.0.0.1:3000`: keep the
//! metrics off public interfaces). The pool's settings come from `PGPIPE__`
//! variables (`PGPIPE__MAX_SIZE=16 PGPIPE__WAIT_TIMEOUT=2s`; see
//! [`pgpipe_examples::environment`]), and `RUST_LOG` picks what is logged
//! (default `info,pgpipe=warn`: failed requests, and the pool's own events
//! such as a connection that could not be opened; `pgpipe=info` adds a
//! line per query, checkout and batch as its span closes, with its fields
//! and timing; `pgpipe=debug` more).
//!
//! On `SIGTERM` (Docker, Kubernetes) it drains: `/readyz` answers `503` at
//! once while requests are still served for `SHUTDOWN_DELAY` seconds (5),
//! then it stops taking connections, lets the requests in flight finish
//! (for up to `SHUTDOWN_TIMEOUT` seconds, 15), closes the pool and exits
//! 0. Ctrl-C does the same without the delay. See
//! [`pgpipe_examples::shutdown`].

use std::time::Duration;

use pgpipe::Pool;
use pgpipe_examples::shutdown::{self, Signal};
use pgpipe_examples::{AppState, environment, pool_settings, router};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // pgpipe's spans (`pgpipe.query`, `pgpipe.checkout`, `pgpipe.batch`)
    // are at `info`; with `FmtSpan::CLOSE` each enabled one is a line when
    // it ends. They are off by default (`pgpipe=warn`): one line per query.
    let filter: Targets = std::env::var("RUST_LOG")
        .unwrap_or_else(|_| "info,pgpipe=warn".into())
        .parse()?;
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_span_events(FmtSpan::CLOSE))
        .with(filter)
        .init();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let addr = std::env::var("LISTEN_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let (delay, timeout) = (shutdown::delay()?, shutdown::timeout()?);
    let registry = prometheus::Registry::new();
    let pool = Pool::builder()
        .url(&url)
        .pool_config(pool_settings(environment())?)
        .registry(&registry)
        .pool_name("bank")
        .build()?;
    let state = AppState::new(pool.clone(), registry, "pgpipe_example");
    state.create_schema(1000).await?;
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    tracing::info!("listening on http://{}", listener.local_addr()?);

    // On a signal: say "not ready", keep serving while the load balancer
    // notices (SIGTERM only), then stop taking connections.
    let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel();
    let stop = {
        let state = state.clone();
        async move {
            let signal = shutdown::signal().await;
            state.start_draining();
            let delay = if signal == Signal::Terminate {
                delay
            } else {
                Duration::ZERO
            };
            tracing::info!(%signal, "shutting down: not ready, still serving for {delay:?}");
            tokio::time::sleep(delay).await;
            tracing::info!("no new connections; waiting up to {timeout:?} for requests in flight");
            let _ = stopped_tx.send(());
        }
    };
    let server = axum::serve(listener, router(state))
        .with_graceful_shutdown(stop)
        .into_future();
    tokio::pin!(server);
    tokio::select! {
        served = &mut server => served?,
        Ok(()) = stopped_rx => match tokio::time::timeout(timeout, &mut server).await {
            Ok(served) => served?,
            Err(_) => tracing::warn!("requests still in flight after {timeout:?}; abandoning them"),
        },
    }
    // Then close the pool once its work has drained: each connection is
    // closed with a Terminate message, not left to the process's exit.
    if pool.close_and_wait(Duration::from_secs(10)).await {
        tracing::info!("pool closed");
    } else {
        tracing::warn!("pool closed with queries still running");
    }
    Ok(())
}
