//! One pooled PostgreSQL connection, and running queries on it.
//!
//! This layer knows nothing of the router, exclusive checkouts, the pool or
//! batches: it imports nothing above itself (`docs/ARCHITECTURE.md` has the
//! command that checks it).
//!
//! - [`PgConn`] (here): the client, its [`ConnState`], its statement cache,
//!   where its socket went; session reset and cancel.
//! - [`state`]: [`ConnState`] in parts, by who writes them: the load word
//!   admission works on, the wire counts the tap keeps, the session, the
//!   lifecycle, what the connection is.
//! - [`tap`]: the socket wrapper that sees every byte, counts requests and
//!   answers into [`state`] and applies `protocol::watch`'s verdicts.
//! - [`wire`]: [`PoolWire`], what every tap reports, and the pool's clock.
//! - [`manager`]: the deadpool manager: open, recycle, lifetime jitter.
//! - [`step_aside`]: the I/O task's zero-length batch window.
//! - [`run`]: one query on one connection: cached statement, checks, send,
//!   collect, self-heal, session cleanup, deadline and cancel.
//! - [`params`]: parameter count and size checks before anything is sent.
//! - [`describe`]: parameter types by SQL text, for unnamed statements.
//! - [`connect`]: the socket, the start-up, the I/O driver, cancel requests.
//! - [`turn`]: the order in which requests join the pipeline.
//! - [`statement_cache`], [`notifications`], [`tls`].

pub(crate) mod budget;
pub(crate) mod connect;
pub(crate) mod describe;
pub(crate) mod hooks;
pub(crate) mod manager;
pub(crate) mod notifications;
pub(crate) mod params;
pub(crate) mod run;
pub(crate) mod state;
pub(crate) mod statement_cache;
mod step_aside;
pub(crate) mod tap;
pub(crate) mod tls;
pub(crate) mod turn;
pub(crate) mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::{Client, SimpleQueryMessage};

use crate::error::{Error, ErrorKind};
use crate::metrics::CloseReason;
use connect::Peer;
pub(crate) use manager::Manager;
use notifications::Notifications;
pub(crate) use run::Target;
pub(crate) use state::ConnState;
pub(crate) use state::held::POOL_OWN;
use statement_cache::{StatementCache, Ticket};
pub(crate) use wire::{HostSignal, PoolWire};

/// A pooled connection: the client, what the tap sees of its wire, and its
/// statement cache. Shared and exclusive use both borrow it from deadpool.
#[derive(Debug)]
pub(crate) struct PgConn {
    pub(crate) client: Client,
    pub(crate) state: Arc<ConnState>,
    pub(crate) cache: Arc<StatementCache>,
    /// With unnamed statements, the pool's parameter types by SQL text.
    pub(crate) descriptions: Option<Arc<describe::Descriptions>>,
    /// What `LISTEN` brought in and nobody read yet.
    pub(crate) notifications: Arc<Notifications>,
    /// Where the socket went, for cancel requests.
    pub(crate) peer: Peer,
    /// When it was opened, and how long it may live (jittered).
    created: Instant,
    lifetime: Option<Duration>,
    pub(crate) wire: Arc<PoolWire>,
    /// The last user's session is not reset yet: the checkout that took it
    /// resets it together with its own first request (see
    /// [`manager::CALLER_RESETS`]), before anything of its user's is sent.
    pub(crate) reset_owed: bool,
}

impl PgConn {
    /// True once the connection's I/O task has ended.
    pub(crate) fn is_dead(&self) -> bool {
        self.client.is_closed() || self.state.load.is_dead()
    }

    /// Whether it has outlived `max_lifetime`.
    pub(crate) fn is_expired(&self) -> bool {
        self.lifetime
            .is_some_and(|max| self.created.elapsed() >= max)
    }

    /// The connection as a place to run queries, outside any transaction.
    pub(crate) fn target(&self) -> Target<'_> {
        Target {
            client: &self.client,
            cache: &self.cache,
            descriptions: self.descriptions.as_ref(),
            state: &self.state,
            peer: &self.peer,
            wire: &self.wire,
            heal: true,
        }
    }

    /// Clears whatever session state a user left behind, before the next
    /// one. The pool's own prepared statements survive (no `DEALLOCATE
    /// ALL`), so the statement cache stays valid; statements made with SQL
    /// `PREPARE` are deallocated.
    pub(crate) async fn reset_session(&self) -> Result<(), Error> {
        let rollback = self.state.session.tx_status() != b'I';
        self.reset(rollback).await
    }

    /// As [`reset_session`](PgConn::reset_session), written right behind a
    /// `COMMIT` or `ROLLBACK` still on its way: that ends the transaction,
    /// so the reset starts none of its own.
    pub(crate) async fn reset_session_after_end(&self) -> Result<(), Error> {
        self.reset(false).await
    }

    async fn reset(&self, rollback: bool) -> Result<(), Error> {
        // The pool's own, not a holder's statements (`begin()` and `commit()`
        // send it on a held connection).
        if self.state.session.take_ddl() {
            self.wire.catalog_changed();
        }
        let mut sql = String::from(POOL_OWN);
        if rollback {
            sql.push_str("ROLLBACK; ");
        }
        sql.push_str(SESSION_CLEANUP);
        if let Some(undo) = self.wire.catalog_full().undo() {
            sql.push_str("; ");
            sql.push_str(undo);
        }
        if let Some(floor) = self.wire.settings_floor() {
            sql.push_str("; ");
            sql.push_str(&end_if_loaded(floor));
        }
        // Their names, rather than a `DO` block that deallocates them: that
        // block cost about 0.1 ms of server time on every reset (pgbench,
        // one client), and there is rarely anything to deallocate.
        sql.push_str(
            "; SELECT name AS pgpipe_sql_prepared FROM pg_catalog.pg_prepared_statements \
             WHERE from_sql",
        );
        if let Some(after) = self.state.traits.after_connect() {
            sql.push_str("; ");
            sql.push_str(after);
        }
        let failed = |e| Error::from_query(e, self.client.is_closed());
        let answers = self.client.simple_query(&sql).await.map_err(failed)?;
        if settings_counted(&answers).is_some_and(|n| self.wire.loaded_a_library(n)) {
            self.closing(CloseReason::ResetFailed);
            return Err(Error::new(
                ErrorKind::ConnectionLost,
                "a library was loaded into the session (it has more settings than a fresh \
                 one); no reset unloads it, so the connection was closed",
            ));
        }
        let deallocate: Vec<String> = answers
            .iter()
            .filter_map(|answer| match answer {
                SimpleQueryMessage::Row(row)
                    if row.columns().first().map(|c| c.name()) == Some("pgpipe_sql_prepared") =>
                {
                    row.get(0)
                        .map(|name| format!("DEALLOCATE \"{}\"", name.replace('"', "\"\"")))
                }
                _ => None,
            })
            .collect();
        if !deallocate.is_empty() {
            self.client
                .batch_execute(&format!("{POOL_OWN}{}", deallocate.join("; ")))
                .await
                .map_err(failed)?;
        }
        // After `UNLISTEN *`: what the last user did not read is theirs.
        self.notifications.clear();
        self.state.session.cleaned();
        Ok(())
    }

    /// Prepares a statement the cache missed and hands it to the cache (and
    /// so to every task waiting for it).
    pub(crate) async fn prepare_for_cache(&self, ticket: Ticket) -> u64 {
        let prepare = self.client.prepare(ticket.sql());
        let result = self.state.turns.prepare(prepare).await.map_err(Arc::new);
        let generation = self.cache.complete(ticket, result);
        self.state.statements_evicted(self.cache.take_evicted());
        generation
    }

    /// Notes why the pool is about to drop this connection.
    pub(crate) fn closing(&self, reason: CloseReason) {
        self.state.life.closing(reason);
    }

    /// Notes that it went back to the idle set now (for `idle_timeout`).
    pub(crate) fn returned(&self) {
        let now = self.wire.ticks();
        self.state.life.returned(now);
    }
}

/// Undoes every session change that can be undone in one round trip: the
/// role and session user, every setting, session advisory locks, temporary
/// objects, sequence state (`lastval`), `LISTEN`s and held cursors. Not
/// prepared statements (`DEALLOCATE ALL` would take the pool's own): the
/// session cleanup counts those, and the reset deallocates them.
///
/// And what `DISCARD ALL` leaves that SQL can take back or tell: the
/// session's random generator is seeded again from the server's strong
/// source (what a `setseed()` left, by any route, is gone); and
/// the session's settings of a library that is no installed extension's or
/// language's are counted (`pgpipe_settings`): a library that `LOAD`
/// brought in adds its own, and no reset unloads it, so a session with
/// more than the lane's fewest is closed (a language's or an extension's
/// library, loaded by calling its functions, is the database's own)
/// ([`PoolWire::loaded_a_library`]). Installed extensions' per-backend
/// state, and a replication origin set up for the session where the role
/// may set one up, are taken back by the undo the catalog holds, run after
/// this. (Nothing here names a function the role may not execute: the
/// server checks that before it runs a statement, and a cleanup that
/// fails closes the connection.)
pub(crate) const SESSION_CLEANUP: &str = concat!(
    "SET SESSION AUTHORIZATION DEFAULT; RESET ALL; \
     SELECT pg_catalog.pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES; \
     UNLISTEN *; CLOSE ALL; SELECT pg_catalog.setseed(('x' || pg_catalog.left(pg_catalog.md5(\
     pg_catalog.gen_random_uuid()::pg_catalog.text), 12))::pg_catalog.bit(48)::pg_catalog.int8 \
     / 281474976710656.0), ",
    foreign_settings!(),
    " AS pgpipe_settings"
);

/// The settings a session has of libraries that are no installed
/// extension's or language's: what a `LOAD` adds (see [`SESSION_CLEANUP`]).
macro_rules! foreign_settings {
    () => {
        "(SELECT pg_catalog.count(*) FROM pg_catalog.pg_settings s WHERE s.name LIKE '%.%' \
         AND pg_catalog.split_part(s.name, '.', 1) NOT IN (SELECT e.extname FROM \
         pg_catalog.pg_extension e UNION ALL SELECT l.lanname FROM pg_catalog.pg_language l))"
    };
}
use foreign_settings;

/// Ends the reset's own session, server-side, when it has more such
/// settings than `floor`: a reset that rides with the next user's first
/// request (`begin()`) must stop that request from running on it, and a
/// session that ends does (the request fails unsent).
fn end_if_loaded(floor: u64) -> String {
    format!(
        "SELECT pg_catalog.pg_terminate_backend(pg_catalog.pg_backend_pid()) WHERE {} > {floor}",
        foreign_settings!()
    )
}

/// The settings a cleanup or reset counted (see [`SESSION_CLEANUP`]).
pub(crate) fn settings_counted(answers: &[SimpleQueryMessage]) -> Option<u64> {
    answers.iter().find_map(|answer| match answer {
        SimpleQueryMessage::Row(row)
            if row.columns().get(2).map(|c| c.name()) == Some("pgpipe_settings") =>
        {
            row.get(2)?.parse().ok()
        }
        _ => None,
    })
}

impl Drop for PgConn {
    fn drop(&mut self) {
        let reason = match self.state.life.close_reason() {
            Some(reason) => reason,
            None if self.is_dead() => CloseReason::Broken,
            None => CloseReason::Shutdown,
        };
        self.state
            .life
            .count_close(self.wire.metrics.as_deref(), reason);
    }
}
