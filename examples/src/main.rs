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
//! (default `info`: failed requests, and the pool's own events such as a
//! connection that could not be opened; `pgpipe=debug` adds more).

use pgpipe::Pool;
use pgpipe_examples::{AppState, environment, pool_settings, router};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let filter: Targets = std::env::var("RUST_LOG")
        .unwrap_or_else(|_| "info".into())
        .parse()?;
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer())
        .with(filter)
        .init();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let addr = std::env::var("LISTEN_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
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
    // On Ctrl-C: stop taking requests, let the ones in flight finish, then
    // close the pool once its work has drained.
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    if !pool
        .close_and_wait(std::time::Duration::from_secs(10))
        .await
    {
        tracing::warn!("closed with queries still running");
    }
    Ok(())
}
