//! The builder's setters of the application's hooks, as deadpool-postgres
//! has them: async closures over a connection's client.

use tokio_postgres::Client;

use super::PoolBuilder;
use crate::conn::hooks::{HookFuture, Hooks};

impl PoolBuilder {
    /// Runs `hook` on every new connection once it is open (after
    /// `after_connect`), before anyone uses it; an `Err` refuses the
    /// connection (the query or checkout that opened it fails with
    /// [`ErrorKind::Connect`](crate::ErrorKind::Connect)).
    ///
    /// Session state it sets (`SET`, temp tables) does not outlive the
    /// reset between two users of a connection: for settings every
    /// connection keeps, use [`session_setting`](Self::session_setting)
    /// or `after_connect`, which the resets keep.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), pgpipe::Error> {
    /// let pool = pgpipe::Pool::builder()
    ///     .url("postgres://app@db/app")
    ///     .post_create(|client| {
    ///         Box::pin(async move {
    ///             let row = client.query_one("SELECT current_setting('server_version_num')::int", &[]).await?;
    ///             let version: i32 = row.get(0);
    ///             if version < 150000 {
    ///                 return Err(format!("PostgreSQL {version} is too old").into());
    ///             }
    ///             Ok(())
    ///         })
    ///     })
    ///     .build()?;
    /// # let _ = pool;
    /// # Ok(())
    /// # }
    /// ```
    pub fn post_create<F>(mut self, hook: F) -> Self
    where
        F: for<'c> Fn(&'c Client) -> HookFuture<'c> + Send + Sync + 'static,
    {
        self.hooks.post_create = Some(Hooks::hook(hook));
        self
    }

    /// Runs `hook` on a connection each time the pool takes it back out of
    /// its idle set for a new user (deadpool's recycling), before the pool's
    /// own checks, rollback and reset; an `Err` closes that connection and
    /// another is taken.
    pub fn pre_recycle<F>(mut self, hook: F) -> Self
    where
        F: for<'c> Fn(&'c Client) -> HookFuture<'c> + Send + Sync + 'static,
    {
        self.hooks.pre_recycle = Some(Hooks::hook(hook));
        self
    }

    /// Runs `hook` on a connection being recycled, after the pool's
    /// checks, rollback and session reset (so it sees the session the next
    /// user gets); an `Err` closes that connection and another is taken.
    /// With it set, [`Pool::begin`](crate::Pool::begin) resets the session
    /// a round trip before its `BEGIN` instead of in the same write.
    pub fn post_recycle<F>(mut self, hook: F) -> Self
    where
        F: for<'c> Fn(&'c Client) -> HookFuture<'c> + Send + Sync + 'static,
    {
        self.hooks.post_recycle = Some(Hooks::hook(hook));
        self
    }
}
