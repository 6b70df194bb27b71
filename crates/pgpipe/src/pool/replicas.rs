//! The pool's reads that a standby may serve: [`Pool::read`],
//! [`Pool::read_with`], and the write tokens they may wait for
//! ([`Pool::execute_tracked`]).

use tokio_postgres::types::ToSql;

use super::Pool;
use crate::answer::{Answer, exactly_one};
use crate::error::{Error, ErrorKind};
use crate::routed::Routed;
use crate::target::{Consistency, WriteToken};

impl Pool {
    /// A handle whose queries are reads that a standby may serve: a
    /// standby within `max_replica_lag`, else (by
    /// [`replica_fallback`](crate::PoolBuilder::replica_fallback)) the primary,
    /// through connections opened read-only. With one host, the primary's
    /// read-only connections: a write through this handle fails with 25006
    /// there as it would on a standby.
    ///
    /// ```no_run
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// let rows = pool.read().query("SELECT id, name FROM products", &[]).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn read(&self) -> Routed<'_> {
        Routed::new(&self.hosts, Consistency::Eventual)
    }

    /// As [`read`](Pool::read), seeing at least what `consistency` asks:
    /// [`Consistency::AtLeast`] a write's [`WriteToken`] (read your own
    /// writes), or [`Consistency::Strong`] (the primary).
    ///
    /// ```no_run
    /// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
    /// use pgpipe::Consistency;
    /// let (_, token) = pool
    ///     .execute_tracked("UPDATE users SET name = $1 WHERE id = $2", &[&"Ada", &7i64])
    ///     .await?;
    /// let me = pool
    ///     .read_with(Consistency::AtLeast(token))
    ///     .query_one("SELECT name FROM users WHERE id = $1", &[&7i64])
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn read_with(&self, consistency: Consistency) -> Routed<'_> {
        Routed::new(&self.hosts, consistency)
    }

    /// As [`execute`](Pool::execute), and returns where the write left the
    /// primary's WAL, for [`Consistency::AtLeast`]. The position is read on
    /// the same connection right behind the write, in the same round trip.
    /// If it cannot be read (the write succeeded all the same), the token
    /// is [`WriteToken::PRIMARY`]: reads with it go to the primary. A write
    /// the server stopped at the
    /// [`head_of_line_budget`](crate::PoolConfig::head_of_line_budget)
    /// (nothing of it committed) runs again as `execute` runs one, on a
    /// connection of its own, and the position is read after its answer.
    ///
    /// # Errors
    ///
    /// As [`execute`](Pool::execute).
    pub async fn execute_tracked(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(u64, WriteToken), Error> {
        let mut batch = self.batch();
        batch.execute(sql, params);
        batch.query(TOKEN_SQL, &[]);
        let mut results = batch.run().await?.into_iter();
        let (Some(written), Some(token)) = (results.next(), results.next()) else {
            unreachable!("a batch answers every item");
        };
        let (written, token) = match written {
            Ok(answer) => (answer.rows_affected(), token.map(Answer::into_rows)),
            // The server stopped the write at the pool's head-of-line
            // budget (a busy server, a lock wait): nothing of it committed,
            // and only the position query ran behind it. It runs again as
            // `execute` runs what the budget stopped (alone, to its end),
            // and the position is read after its answer: the primary's
            // insert position only grows, so it is past the write's commit.
            Err(e) if e.kind() == ErrorKind::Db && e.is_stopped() => {
                let written = self.execute(sql, params).await?;
                (written, self.query(TOKEN_SQL, &[]).await)
            }
            Err(e) => return Err(e),
        };
        // The write is done: whatever happens to the position query, report
        // it, with a token that sends its reads to the primary if the
        // position could not be read.
        let token = token
            .ok()
            .and_then(|rows| exactly_one(rows).ok())
            .and_then(|row| {
                let timeline = row.try_get::<_, i32>(0).ok()?;
                let lsn = row.try_get::<_, i64>(1).ok()?;
                Some(WriteToken {
                    timeline: u32::try_from(timeline).ok()?,
                    lsn: u64::try_from(lsn).ok()?,
                })
            })
            .unwrap_or(WriteToken::PRIMARY);
        Ok((written, token))
    }
}

/// The primary's WAL position and timeline, right behind a write.
const TOKEN_SQL: &str = "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int, \
     (pg_current_wal_insert_lsn() - '0/0')::int8";
