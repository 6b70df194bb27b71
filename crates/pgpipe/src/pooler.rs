//! What sits between the pool and PostgreSQL, and what it guarantees:
//! [`Pooler`], and how statements are prepared through it ([`Prepare`]).
//!
//! There is no in-band way to detect a server-side pooler or its version,
//! so the caller declares it. The defaults for an unknown transaction
//! pooler are the safe ones: one query in flight per connection, and no
//! server-side statement that outlives its `Sync`.

/// A server-side connection pooler between the pool and PostgreSQL.
///
/// | pooler | declare |
/// |---|---|
/// | none (PostgreSQL itself) | [`Pooler::None`] |
/// | PgBouncer, PgCat or Odyssey with `pool_mode = session`; pgpool-II; RDS Proxy when pinned | [`Pooler::Session`] |
/// | PgBouncer with `pool_mode = transaction` | [`Pooler::pgbouncer_transaction`] with its version and `max_prepared_statements` |
/// | Supavisor, or any transaction pooler whose behaviour you have not checked | [`Pooler::unknown_transaction`] |
///
/// ```
/// use pgpipe::{Pool, Pooler};
///
/// # fn demo() -> Result<(), pgpipe::Error> {
/// let pool = Pool::builder()
///     .url("postgres://app@pgbouncer:6432/app")
///     .pipelining(true)
///     .pooler(Pooler::pgbouncer_transaction((1, 18), 0))
///     .build()?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Pooler {
    /// Direct connections to PostgreSQL.
    #[default]
    None,
    /// A pooler that keeps one server session per client connection for the
    /// connection's whole life. Everything works as with
    /// [`None`](Pooler::None): pipelining, named statements, session
    /// cleanup.
    Session,
    /// A pooler that may hand the client's server to another client after
    /// any `ReadyForQuery` that shows no transaction open. There is no
    /// session to keep: session settings, `statement_timeout` and
    /// `after_connect` are refused at `build()`, session SQL is refused on
    /// every connection, and nothing is reset when a connection comes back.
    Transaction {
        /// The pooler keeps the server until every message it forwarded is
        /// answered (PgBouncer 1.21 and later). Without it, pgpipe keeps at
        /// most one query in flight per connection: a query reaching an
        /// older pooler in two pieces while an earlier answer completes
        /// runs partly on another client's server, and answers go to the
        /// wrong caller.
        tracks_pipeline: bool,
        /// The pooler maps protocol-level named statements across its
        /// servers (PgBouncer 1.21 and later with `max_prepared_statements`
        /// above 0; PgCat). Without it, statements are unnamed
        /// ([`Prepare::Unnamed`]): a named statement left on one server
        /// fails on another (`26000`, `42P05`), or silently runs another
        /// client's statement of the same name.
        tracks_prepared: bool,
    },
}

impl Pooler {
    /// PgBouncer in `pool_mode = transaction`, by its version and its
    /// `max_prepared_statements` setting: before 1.21 it tracks neither
    /// pipelines nor named statements; from 1.21 it tracks pipelines, and
    /// named statements when `max_prepared_statements` is above 0 (the
    /// default from 1.24 is 200).
    pub fn pgbouncer_transaction(version: (u16, u16), max_prepared_statements: u32) -> Pooler {
        let tracks_pipeline = version >= (1, 21);
        Pooler::Transaction {
            tracks_pipeline,
            tracks_prepared: tracks_pipeline && max_prepared_statements > 0,
        }
    }

    /// A transaction pooler whose guarantees are unknown (Supavisor, a
    /// managed pooler): it is assumed to track neither pipelines nor named
    /// statements.
    pub fn unknown_transaction() -> Pooler {
        Pooler::Transaction {
            tracks_pipeline: false,
            tracks_prepared: false,
        }
    }

    /// Whether the server session may change between transactions.
    pub(crate) fn is_transaction(self) -> bool {
        matches!(self, Pooler::Transaction { .. })
    }

    /// Whether more than one query may be in flight on one connection.
    pub(crate) fn allows_pipeline(self) -> bool {
        !matches!(
            self,
            Pooler::Transaction {
                tracks_pipeline: false,
                ..
            }
        )
    }

    /// Whether named statements work through it.
    pub(crate) fn allows_named(self) -> bool {
        !matches!(
            self,
            Pooler::Transaction {
                tracks_prepared: false,
                ..
            }
        )
    }
}

/// How statements are prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Prepare {
    /// One named statement per SQL text per connection, prepared on first
    /// use and cached (`statement_cache_capacity`): each later run is one
    /// Bind/Execute/Sync. The default, except through a transaction pooler
    /// that does not map named statements.
    Named,
    /// No server-side statement outlives its `Sync`. The parameter types of
    /// each SQL text are learned once per pool, in a transaction of their
    /// own on a connection of their own (so a pooler keeps them on one
    /// server), and every run is one Parse("")/Bind/Describe/Execute/Sync:
    /// one round trip, as with named statements, and the result columns
    /// always come from the live statement (no `0A000 cached plan must not
    /// change result type`).
    ///
    /// Only PostgreSQL's built-in types (and domains over them in results):
    /// tokio-postgres looks other types up with named statements of its
    /// own, so a statement with an enum, composite or other custom type is
    /// refused with [`ErrorKind::NotSupported`](crate::ErrorKind::NotSupported)
    /// (cast it: `$1::text::mood`, `SELECT mood::text`).
    Unnamed,
}
