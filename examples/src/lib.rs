//! A small bank as a web service, sharing one [`pgpipe::Pool`] across its
//! handlers. Copy it.
//!
//! - `GET /accounts/{id}`: three independent queries issued concurrently;
//!   with pipelining they share one round trip.
//! - `POST /transfers` (`{"from": 1, "to": 2, "amount": 5}`): a transaction
//!   on an exclusive connection from `pool.get()`, its statements written
//!   once against `pgpipe::Executor`.
//! - `GET /metrics`: the pool's Prometheus metrics.
//!
//! The binary (`src/main.rs`) says how to run it.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pgpipe::tokio_postgres::types::ToSql;
use pgpipe::{ErrorKind, Executor, Pool};
use prometheus::{Registry, TextEncoder};
use serde::{Deserialize, Serialize};

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    pool: Pool,
    registry: Registry,
    tables: Arc<Tables>,
}

/// The service's table names (a prefix keeps parallel tests apart).
#[derive(Debug)]
struct Tables {
    accounts: String,
    transfers: String,
}

impl AppState {
    /// State for a pool whose metrics are in `registry`, with tables named
    /// `{prefix}_accounts` and `{prefix}_transfers`.
    pub fn new(pool: Pool, registry: Registry, prefix: &str) -> AppState {
        AppState {
            pool,
            registry,
            tables: Arc::new(Tables {
                accounts: format!("{prefix}_accounts"),
                transfers: format!("{prefix}_transfers"),
            }),
        }
    }

    /// Creates the tables and `accounts` accounts of 100 each. DDL is
    /// session-independent but runs on an exclusive connection like any
    /// administrative batch.
    ///
    /// # Errors
    ///
    /// When the server refuses.
    pub async fn create_schema(&self, accounts: i64) -> Result<(), pgpipe::Error> {
        let Tables {
            accounts: a,
            transfers: t,
        } = &*self.tables;
        let conn = self.pool.get().await?;
        conn.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {a} (id int8 PRIMARY KEY, balance int8 NOT NULL); \
             CREATE TABLE IF NOT EXISTS {t} (id bigserial PRIMARY KEY, from_id int8, to_id int8, \
                 amount int8, at timestamptz DEFAULT now()); \
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
        let Tables {
            accounts,
            transfers,
        } = &*self.tables;
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
        .with_state(state)
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
    let Tables {
        accounts,
        transfers,
    } = &*state.tables;
    let (balance_sql, transfers_sql, total_sql) = (
        format!("SELECT balance FROM {accounts} WHERE id = $1"),
        format!("SELECT count(*) FROM {transfers} WHERE from_id = $1 OR to_id = $1"),
        format!("SELECT sum(balance)::int8 FROM {accounts}"),
    );
    // Three independent queries at once: on a pipelined pool they go out
    // together and cost one round trip, not three. (The parameters are bound
    // to a name because `join!` keeps the futures past the statement.)
    let by_id: [&(dyn ToSql + Sync); 1] = [&id];
    let (balance, count, total) = tokio::try_join!(
        state.pool.query_opt(&balance_sql, &by_id),
        state.pool.query_one(&transfers_sql, &by_id),
        state.pool.query_one(&total_sql, &[]),
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
    // A transaction needs a connection of its own.
    let mut conn = state.pool.get().await?;
    let tx = conn.transaction().await?;
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
    let Tables {
        accounts,
        transfers,
    } = tables;
    // Lock both rows in id order, so two opposite transfers cannot deadlock.
    db.execute(
        &format!("SELECT 1 FROM {accounts} WHERE id IN ($1, $2) ORDER BY id FOR UPDATE"),
        &[&t.from, &t.to],
    )
    .await?;
    let debited = db
        .execute(
            &format!(
                "UPDATE {accounts} SET balance = balance - $2 WHERE id = $1 AND balance >= $2"
            ),
            &[&t.from, &t.amount],
        )
        .await?;
    if debited == 0 {
        return Ok(false);
    }
    db.execute(
        &format!("UPDATE {accounts} SET balance = balance + $2 WHERE id = $1"),
        &[&t.to, &t.amount],
    )
    .await?;
    db.execute(
        &format!("INSERT INTO {transfers} (from_id, to_id, amount) VALUES ($1, $2, $3)"),
        &[&t.from, &t.to, &t.amount],
    )
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
            // Overload is the client's cue to back off, not a server bug.
            AppError::Pool(e) if matches!(e.kind(), ErrorKind::Timeout | ErrorKind::QueueFull) => {
                (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response()
            }
            AppError::Pool(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        }
    }
}
