//! The pools under test, behind one interface.

use std::collections::HashMap;
use std::error::Error;
use std::fmt;
use std::sync::Arc;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{NoTls, Row, Statement};

use crate::tuning::Tuning;

/// Which pool, and how big.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// pgpipe with pipelining on.
    PgpipeOn(usize),
    /// pgpipe with pipelining off: one exclusive connection per query.
    PgpipeOff(usize),
    /// deadpool-postgres with `prepare_cached`.
    Deadpool(usize),
    /// One tokio-postgres client shared by every task (its own pipelining).
    SharedClient,
    /// pgpipe through PgBouncer in transaction mode, declared so: 1.18,
    /// unnamed statements, one query on the wire per connection; 1.21+
    /// (`Tuning::bouncer`), pipelined, named statements tracked.
    PgpipeBouncer(usize),
    /// deadpool-postgres through the same PgBouncer, as its users must run
    /// it there: no statement cache, every query one `query_typed` group.
    DeadpoolBouncer(usize),
    /// pgpipe through a PgBouncer in session mode (`Pooler::Session`):
    /// pipelining and named statements as with a direct connection.
    PgpipeSession(usize),
}

impl Kind {
    /// The targets of `--pgbouncer`: the two pools through PgBouncer, and
    /// pgpipe direct for scale.
    pub(crate) const THROUGH_PGBOUNCER: [Kind; 4] = [
        Kind::PgpipeBouncer(4),
        Kind::DeadpoolBouncer(16),
        Kind::PgpipeSession(4),
        Kind::PgpipeOn(4),
    ];

    /// Whether it connects through PgBouncer in transaction mode.
    pub(crate) fn through_pgbouncer(self) -> bool {
        matches!(self, Kind::PgpipeBouncer(_) | Kind::DeadpoolBouncer(_))
    }

    /// Whether it connects through PgBouncer in session mode.
    pub(crate) fn through_session_pgbouncer(self) -> bool {
        matches!(self, Kind::PgpipeSession(_))
    }

    /// The targets every run compares.
    pub(crate) const ALL: [Kind; 7] = [
        Kind::PgpipeOn(1),
        Kind::PgpipeOn(4),
        Kind::PgpipeOff(4),
        Kind::PgpipeOff(16),
        Kind::Deadpool(4),
        Kind::Deadpool(16),
        Kind::SharedClient,
    ];

    pub(crate) fn name(self) -> String {
        match self {
            Kind::PgpipeOn(n) => format!("pgpipe on ({n})"),
            Kind::PgpipeOff(n) => format!("pgpipe off ({n})"),
            Kind::Deadpool(n) => format!("deadpool ({n})"),
            Kind::SharedClient => "shared client (1)".into(),
            Kind::PgpipeBouncer(n) => format!("pgpipe via pgbouncer ({n})"),
            Kind::DeadpoolBouncer(n) => format!("deadpool via pgbouncer ({n})"),
            Kind::PgpipeSession(n) => format!("pgpipe via session pgbouncer ({n})"),
        }
    }

    /// A short tag for application names and JSON.
    pub(crate) fn tag(self) -> String {
        match self {
            Kind::PgpipeOn(n) => format!("pgpipe_on_{n}"),
            Kind::PgpipeOff(n) => format!("pgpipe_off_{n}"),
            Kind::Deadpool(n) => format!("deadpool_{n}"),
            Kind::SharedClient => "shared_client".into(),
            Kind::PgpipeBouncer(n) => format!("pgpipe_bouncer_{n}"),
            Kind::DeadpoolBouncer(n) => format!("deadpool_bouncer_{n}"),
            Kind::PgpipeSession(n) => format!("pgpipe_session_{n}"),
        }
    }
}

/// How pgpipe runs a transfer's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxVia {
    /// `pool.get()`, then `conn.transaction()`.
    Get,
    /// `pool.begin()`.
    Begin,
    /// `pool.atomic_batch()`.
    AtomicBatch,
}

/// A pool ready to run queries.
pub(crate) enum Target {
    Pgpipe(pgpipe::Pool, prometheus::Registry),
    Deadpool(deadpool_postgres::Pool),
    /// With each statement's parameter types, written out by hand as its
    /// users must for `query_typed`.
    DeadpoolTyped(deadpool_postgres::Pool, Arc<HashMap<String, Vec<Type>>>),
    Shared(SharedClient),
}

/// One client and the statements prepared on it.
pub(crate) struct SharedClient {
    client: Arc<tokio_postgres::Client>,
    statements: HashMap<String, Statement>,
}

pub(crate) type BoxError = Box<dyn Error + Send + Sync>;

impl Target {
    /// Builds the pool for `kind` against `url`, preparing `statements` where
    /// the target needs them up front.
    pub(crate) async fn open(
        kind: Kind,
        url: &str,
        statements: &[String],
        tuning: Tuning,
        direct: &tokio_postgres::Client,
    ) -> Result<Target, BoxError> {
        Ok(match kind {
            Kind::PgpipeBouncer(n) | Kind::PgpipeSession(n) => {
                let pooler = match kind {
                    Kind::PgpipeSession(_) => pgpipe::Pooler::Session,
                    _ => match tuning.bouncer {
                        Some(version) => pgpipe::Pooler::pgbouncer_transaction(version, 200),
                        None => pgpipe::Pooler::pgbouncer_transaction((1, 18), 0),
                    },
                };
                let registry = prometheus::Registry::new();
                let mut builder = pgpipe::Pool::builder()
                    .url(url)
                    .max_size(n)
                    .pipelining(true)
                    .pooler(pooler)
                    .queue_capacity(100_000)
                    .registry(&registry);
                if let Some(budget) = tuning.budget {
                    builder = builder.head_of_line_budget(budget);
                }
                let pool = builder.build()?;
                Target::Pgpipe(pool, registry)
            }
            Kind::DeadpoolBouncer(n) => {
                // The types a user would write beside each query.
                let mut types = HashMap::new();
                for sql in statements {
                    let statement = direct.prepare(sql).await?;
                    types.insert(sql.clone(), statement.params().to_vec());
                }
                Target::DeadpoolTyped(deadpool(url, n)?, Arc::new(types))
            }
            Kind::PgpipeOn(n) | Kind::PgpipeOff(n) => {
                let mut builder = pgpipe::Pool::builder()
                    .url(url)
                    .max_size(n)
                    .pipelining(matches!(kind, Kind::PgpipeOn(_)))
                    .queue_capacity(100_000);
                if let (Kind::PgpipeOn(_), Some(depth)) = (kind, tuning.depth) {
                    builder = builder.max_pipeline_depth(depth);
                }
                if let Some(max) = tuning.max_exclusive {
                    builder = builder.max_exclusive(max.min(n));
                }
                if let (Kind::PgpipeOn(_), Some(routing)) = (kind, tuning.routing) {
                    builder = builder.routing(routing);
                }
                if let (Kind::PgpipeOn(_), Some(window)) = (kind, tuning.window) {
                    builder = builder.batch_window(window);
                }
                if let (Kind::PgpipeOn(_), Some(slow)) = (kind, tuning.slow) {
                    builder = builder.slow_query_threshold(slow);
                }
                if let (Kind::PgpipeOn(_), Some(budget)) = (kind, tuning.budget) {
                    builder = builder.head_of_line_budget(budget);
                }
                let registry = prometheus::Registry::new();
                Target::Pgpipe(builder.registry(&registry).build()?, registry)
            }
            Kind::Deadpool(n) => Target::Deadpool(deadpool(url, n)?),
            Kind::SharedClient => {
                let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
                tokio::spawn(connection);
                let mut prepared = HashMap::new();
                for sql in statements {
                    prepared.insert(sql.clone(), client.prepare(sql).await?);
                }
                Target::Shared(SharedClient {
                    client: Arc::new(client),
                    statements: prepared,
                })
            }
        })
    }

    /// Runs one query.
    pub(crate) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, BoxError> {
        match self {
            Target::Pgpipe(pool, _) => Ok(pool.query(sql, params).await?),
            Target::Deadpool(pool) => {
                let client = pool.get().await?;
                let statement = client.prepare_cached(sql).await?;
                Ok(client.query(&statement, params).await?)
            }
            Target::DeadpoolTyped(pool, types) => {
                let client = pool.get().await?;
                let types = types.get(sql).ok_or("statement not described up front")?;
                let typed: Vec<(&(dyn ToSql + Sync), Type)> =
                    params.iter().copied().zip(types.iter().cloned()).collect();
                Ok(client.query_typed(sql, &typed).await?)
            }
            Target::Shared(shared) => {
                let statement = shared
                    .statements
                    .get(sql)
                    .ok_or("statement not prepared up front")?;
                Ok(shared.client.query(statement, params).await?)
            }
        }
    }

    /// Runs one read: through pgpipe's read handle, else as [`query`](Target::query).
    pub(crate) async fn read(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, BoxError> {
        match self {
            Target::Pgpipe(pool, _) => Ok(pool.read().query(sql, params).await?),
            other => other.query(sql, params).await,
        }
    }

    /// A transaction moving one unit from account `a` to `b` with `sql`
    /// (`UPDATE … SET n = n + $2 WHERE id = $1`): on pgpipe as `via` says,
    /// on deadpool always an interactive transaction. One shared client
    /// cannot hold a transaction for one task among many.
    pub(crate) async fn transfer(
        &self,
        sql: &str,
        a: i64,
        b: i64,
        via: TxVia,
    ) -> Result<(), BoxError> {
        use pgpipe::Executor;
        match self {
            Target::Pgpipe(pool, _) if via == TxVia::AtomicBatch => {
                let mut batch = pool.atomic_batch();
                batch.execute(sql, &[&a, &-1i64]);
                batch.execute(sql, &[&b, &1i64]);
                for result in batch.run().await? {
                    result?;
                }
                Ok(())
            }
            Target::Pgpipe(pool, _) if via == TxVia::Begin => {
                let tx = pool.begin().await?;
                tx.execute(sql, &[&a, &-1i64]).await?;
                tx.execute(sql, &[&b, &1i64]).await?;
                Ok(tx.commit().await?)
            }
            Target::Pgpipe(pool, _) => {
                let mut conn = pool.get().await?;
                let tx = conn.transaction().await?;
                tx.execute(sql, &[&a, &-1i64]).await?;
                tx.execute(sql, &[&b, &1i64]).await?;
                Ok(tx.commit().await?)
            }
            Target::Deadpool(pool) | Target::DeadpoolTyped(pool, _) => {
                let mut client = pool.get().await?;
                let tx = client.transaction().await?;
                let statement = tx.prepare_cached(sql).await?;
                tx.execute(&statement, &[&a, &-1i64]).await?;
                tx.execute(&statement, &[&b, &1i64]).await?;
                Ok(tx.commit().await?)
            }
            Target::Shared(_) => Err("one shared client cannot hold a transaction".into()),
        }
    }

    pub(crate) fn close(&self) {
        match self {
            Target::Pgpipe(pool, _) => pool.close(),
            Target::Deadpool(pool) | Target::DeadpoolTyped(pool, _) => pool.close(),
            Target::Shared(_) => {}
        }
    }
}

/// deadpool-postgres as the benchmark runs it: `n` connections, fast
/// recycling.
fn deadpool(url: &str, n: usize) -> Result<deadpool_postgres::Pool, BoxError> {
    let config: tokio_postgres::Config = url.parse()?;
    let manager = deadpool_postgres::Manager::from_config(
        config,
        NoTls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    Ok(deadpool_postgres::Pool::builder(manager)
        .max_size(n)
        .build()?)
}

/// pgpipe's own figures: round trips saved, and what latency saved is
/// made of: the time its pipelined queries would have taken with
/// pipelining off (the estimate), the time they took, and how many.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Savings {
    pub(crate) round_trips: f64,
    pub(crate) without: f64,
    pub(crate) taken: f64,
    pub(crate) pipelined: f64,
}

impl Savings {
    /// The figures since `before`.
    pub(crate) fn since(self, before: Savings) -> Savings {
        Savings {
            round_trips: self.round_trips - before.round_trips,
            without: self.without - before.without,
            taken: self.taken - before.taken,
            pipelined: self.pipelined - before.pipelined,
        }
    }

    /// The estimated latency saved per pipelined query (negative where
    /// pipelining cost time), in milliseconds.
    pub(crate) fn per_query_ms(self) -> Option<f64> {
        (self.pipelined > 0.0).then(|| (self.without - self.taken) * 1e3 / self.pipelined)
    }
}

impl Target {
    /// pgpipe's savings counters so far; `None` for other pools.
    pub(crate) fn savings(&self) -> Option<Savings> {
        let Target::Pgpipe(_, registry) = self else {
            return None;
        };
        let mut savings = Savings::default();
        for family in registry.gather() {
            let metrics = family.get_metric().iter();
            let total: f64 = metrics.clone().map(|m| m.get_counter().get_value()).sum();
            match family.name() {
                "pgpipe_pipeline_round_trips_saved_total" => savings.round_trips = total,
                "pgpipe_pipeline_latency_without_pipelining_seconds_total" => {
                    savings.without = total;
                }
                "pgpipe_query_duration_seconds" => {
                    let pipelined = metrics.filter(|m| {
                        m.get_label()
                            .iter()
                            .any(|l| l.name() == "mode" && l.value() == "pipelined")
                    });
                    for m in pipelined {
                        savings.taken += m.get_histogram().get_sample_sum();
                        savings.pipelined += m.get_histogram().get_sample_count() as f64;
                    }
                }
                _ => {}
            }
        }
        Some(savings)
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Pgpipe(pool, _) => pool.fmt(f),
            Target::Deadpool(pool) | Target::DeadpoolTyped(pool, _) => {
                f.debug_tuple("Deadpool").field(&pool.status()).finish()
            }
            Target::Shared(_) => f.write_str("SharedClient"),
        }
    }
}
