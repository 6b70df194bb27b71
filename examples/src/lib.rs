//! A small bank as a web service, sharing one [`pgpipe::Pool`] across its
//! handlers. Copy it.
//!
//! - `GET /accounts/{id}`: three independent queries issued concurrently;
//!   with pipelining they share one round trip.
//! - `POST /transfers` (`{"from": 1, "to": 2, "amount": 5}`): a transaction
//!   on an exclusive connection from `pool.get()`, its statements written
//!   once against `pgpipe::Executor`.
//! - `GET /metrics`: the pool's Prometheus metrics.
//! - `GET /healthz` (the process answers) and `GET /readyz` (the pool can
//!   take work: open, not saturated, from `pool.status()`; and the service
//!   is not shutting down, see [`AppState::start_draining`]).
//!
//! Errors map to HTTP without the server's text: an overloaded or closed
//! pool is `503` with `Retry-After`, anything else `500` with a generic
//! body (the detail goes to the log). SQL is built once, not per request.
//!
//! Settings come from the environment ([`pool_settings`]), and errors and
//! the pool's own events go to a `tracing` subscriber.
//!
//! The binary (`src/main.rs`) says how to run it, and how it stops
//! ([`shutdown`]); `src/load.rs` is a load generator for it.

pub mod shutdown;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pgpipe::tokio_postgres::types::ToSql;
use pgpipe::{ErrorKind, Executor, Pool, PoolConfig};
use prometheus::{Registry, TextEncoder};
use serde::{Deserialize, Serialize};

/// Where the pool's settings come from: `PGPIPE__` variables, `__` between
/// nested keys, values parsed (`PGPIPE__MAX_SIZE=16`,
/// `PGPIPE__PIPELINING=false`, `PGPIPE__WAIT_TIMEOUT=2s`,
/// `PGPIPE__SESSION_SETTINGS__SEARCH_PATH=bank`). Every key of
/// [`PoolConfig`] can be set.
pub fn environment() -> config::Environment {
    config::Environment::with_prefix("PGPIPE")
        .separator("__")
        .try_parsing(true)
}

/// The pool's settings: this service's defaults (8 connections,
/// pipelining on), overridden by `source`, usually [`environment`]. A bad
/// value is an error naming its key; so is an unknown key.
pub fn pool_settings(source: config::Environment) -> Result<PoolConfig, config::ConfigError> {
    config::Config::builder()
        .set_default("max_size", 8)?
        .set_default("pipelining", true)?
        .add_source(source)
        .build()?
        .try_deserialize()
}

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    pool: Pool,
    registry: Registry,
    tables: Arc<Tables>,
    draining: Arc<AtomicBool>,
}

/// The service's table names (a prefix keeps parallel tests apart), and
/// its SQL, built once rather than per request.
#[derive(Debug)]
struct Tables {
    accounts: String,
    transfers: String,
    balance: String,
    count_transfers: String,
    total: String,
    lock_pair: String,
    debit: String,
    credit: String,
    record: String,
}

impl Tables {
    fn new(prefix: &str) -> Tables {
        let (a, t) = (format!("{prefix}_accounts"), format!("{prefix}_transfers"));
        Tables {
            balance: format!("SELECT balance FROM {a} WHERE id = $1"),
            count_transfers: format!(
                "SELECT (SELECT count(*) FROM {t} WHERE from_id = $1) \
                      + (SELECT count(*) FROM {t} WHERE to_id = $1)"
            ),
            total: format!("SELECT sum(balance)::int8 FROM {a}"),
            lock_pair: format!("SELECT 1 FROM {a} WHERE id IN ($1, $2) ORDER BY id FOR UPDATE"),
            debit: format!("UPDATE {a} SET balance = balance - $2 WHERE id = $1 AND balance >= $2"),
            credit: format!("UPDATE {a} SET balance = balance + $2 WHERE id = $1"),
            record: format!("INSERT INTO {t} (from_id, to_id, amount) VALUES ($1, $2, $3)"),
            accounts: a,
            transfers: t,
        }
    }
}

impl AppState {
    /// State for a pool whose metrics are in `registry`, with tables named
    /// `{prefix}_accounts` and `{prefix}_transfers`.
    pub fn new(pool: Pool, registry: Registry, prefix: &str) -> AppState {
        AppState {
            pool,
            registry,
            tables: Arc::new(Tables::new(prefix)),
            draining: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The service is shutting down: from now on `/readyz` answers `503`
    /// (`draining`), so that the load balancer stops sending requests here,
    /// while the requests that still arrive are served as before.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Creates the tables and `accounts` accounts of 100 each. DDL is
    /// session-independent but runs on an exclusive connection like any
    /// administrative batch.
    ///
    /// # Errors
    ///
    /// When the server refuses.
    pub async fn create_schema(&self, accounts: i64) -> Result<(), pgpipe::Error> {
        let (a, t) = (&self.tables.accounts, &self.tables.transfers);
        let conn = self.pool.get().await?;
        // The transfers are counted by account: index both sides, or every
        // read scans a table that only grows.
        conn.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {a} (id int8 PRIMARY KEY, balance int8 NOT NULL); \
             CREATE TABLE IF NOT EXISTS {t} (id bigserial PRIMARY KEY, from_id int8, to_id int8, \
                 amount int8, at timestamptz DEFAULT now()); \
             CREATE INDEX IF NOT EXISTS {t}_from ON {t} (from_id); \
             CREATE INDEX IF NOT EXISTS {t}_to ON {t} (to_id); \
             INSERT INTO {a} SELECT g, 100 FROM generate_series(1, {accounts}) g ON CONFLICT DO NOTHING;"
        ))
        .await?;
        Ok(())
    }

    /// Drops the tables.
    ///
    /// # Errors
    ///
    /// When the server refuses.
    pub async fn drop_schema(&self) -> Result<(), pgpipe::Error> {
        let conn = self.pool.get().await?;
        let (accounts, transfers) = (&self.tables.accounts, &self.tables.transfers);
        conn.batch_execute(&format!("DROP TABLE IF EXISTS {accounts}, {transfers}"))
            .await
            .map_err(pgpipe::Error::from)
    }
}

/// The service's routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/accounts/{id}", get(account))
        .route("/transfers", post(transfer))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { StatusCode::OK }))
        .route("/readyz", get(ready))
        .with_state(state)
}

/// Waiting queries past which the service says it is not ready: the
/// balancer should send new requests elsewhere until the queue drains.
const SATURATED: usize = 1024;

async fn ready(State(state): State<AppState>) -> Response {
    let status = state.pool.status();
    if state.draining.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response();
    }
    if state.pool.is_closed() {
        return (StatusCode::SERVICE_UNAVAILABLE, "closing").into_response();
    }
    if status.waiting + status.exclusive_waiting >= SATURATED {
        return (StatusCode::SERVICE_UNAVAILABLE, "saturated").into_response();
    }
    StatusCode::OK.into_response()
}

/// `GET /accounts/{id}`.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Account {
    /// The account.
    pub id: i64,
    /// Its balance.
    pub balance: i64,
    /// Transfers into or out of it.
    pub transfers: i64,
    /// The accounts' total, which transfers never change.
    pub total: i64,
}

async fn account(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<Account>, AppError> {
    let sql = &*state.tables;
    // Three independent queries at once: on a pipelined pool they go out
    // together and cost one round trip, not three. (The parameters are bound
    // to a name because `join!` keeps the futures past the statement.)
    let by_id: [&(dyn ToSql + Sync); 1] = [&id];
    let (balance, count, total) = tokio::try_join!(
        state.pool.query_opt(&sql.balance, &by_id),
        state.pool.query_one(&sql.count_transfers, &by_id),
        state.pool.query_one(&sql.total, &[]),
    )?;
    let balance = balance.ok_or(AppError::NotFound)?;
    Ok(Json(Account {
        id,
        balance: balance.get(0),
        transfers: count.get(0),
        total: total.get(0),
    }))
}

/// `POST /transfers`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Transfer {
    /// From this account.
    pub from: i64,
    /// To this one.
    pub to: i64,
    /// This much.
    pub amount: i64,
}

async fn transfer(
    State(state): State<AppState>,
    Json(t): Json<Transfer>,
) -> Result<StatusCode, AppError> {
    // A transaction needs a connection of its own; `begin()` takes one for
    // just as long as the transaction lasts.
    let tx = state.pool.begin().await?;
    if !move_money(&tx, &state.tables, &t).await? {
        return Err(AppError::Refused); // dropping `tx` rolls it back
    }
    tx.commit().await?;
    Ok(StatusCode::CREATED)
}

/// The transfer itself, written against [`pgpipe::Executor`]: it would run
/// as well on the pool (pipelined, without the transaction's guarantees)
/// as inside the transaction it is given here. Returns whether the money
/// was there to move.
async fn move_money(
    db: &impl Executor,
    tables: &Tables,
    t: &Transfer,
) -> Result<bool, pgpipe::Error> {
    // Lock both rows in id order, so two opposite transfers cannot deadlock.
    db.execute(&tables.lock_pair, &[&t.from, &t.to]).await?;
    let debited = db.execute(&tables.debit, &[&t.from, &t.amount]).await?;
    if debited == 0 {
        return Ok(false);
    }
    db.execute(&tables.credit, &[&t.to, &t.amount]).await?;
    db.execute(&tables.record, &[&t.from, &t.to, &t.amount])
        .await?;
    Ok(true)
}

async fn metrics(State(state): State<AppState>) -> Response {
    match TextEncoder::new().encode_to_string(&state.registry.gather()) {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// How a handler fails, as HTTP.
#[derive(Debug)]
pub enum AppError {
    /// No such account.
    NotFound,
    /// Not enough money.
    Refused,
    /// The pool or the database failed.
    Pool(pgpipe::Error),
}

impl From<pgpipe::Error> for AppError {
    fn from(e: pgpipe::Error) -> AppError {
        AppError::Pool(e)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            AppError::NotFound => StatusCode::NOT_FOUND.into_response(),
            AppError::Refused => (StatusCode::CONFLICT, "insufficient funds").into_response(),
            // Overload (or shutting down) is the client's cue to come back
            // later, not a server bug. Nothing ran, so a retry is safe.
            AppError::Pool(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Timeout | ErrorKind::QueueFull | ErrorKind::Closed
                ) =>
            {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::RETRY_AFTER, "1")],
                    "busy, retry shortly",
                )
                    .into_response()
            }
            // The detail (the server's message, table names) goes to the
            // log, never to the client.
            AppError::Pool(e) => {
                tracing::error!(error = %e, may_have_run = e.may_have_run(), "request failed");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
            }
        }
    }
}
