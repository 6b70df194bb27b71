//! How a transaction begins: its isolation level, read-only, deferrable
//! ([`TransactionOptions`]), and [`TransactionBuilder`], what
//! [`Connection::build_transaction`] returns, as tokio-postgres' own.

use tokio_postgres::IsolationLevel;

use super::{Connection, Transaction};
use crate::error::Error;

/// A transaction's modes, as `BEGIN` takes them; each left unset is the
/// session's default.
///
/// ```no_run
/// use pgpipe::{Executor, IsolationLevel, TransactionOptions};
///
/// # async fn demo(pool: pgpipe::Pool) -> Result<(), pgpipe::Error> {
/// let report = TransactionOptions::new()
///     .isolation_level(IsolationLevel::Serializable)
///     .read_only(true)
///     .deferrable(true);
/// let tx = pool.begin_options(report).await?;
/// let rows = tx.query("SELECT * FROM orders", &[]).await?;
/// tx.commit().await?;
/// # let _ = rows;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct TransactionOptions {
    isolation_level: Option<IsolationLevel>,
    read_only: Option<bool>,
    deferrable: Option<bool>,
}

impl TransactionOptions {
    /// The session's defaults.
    pub fn new() -> TransactionOptions {
        TransactionOptions::default()
    }

    /// The isolation level.
    pub fn isolation_level(mut self, level: IsolationLevel) -> Self {
        self.isolation_level = Some(level);
        self
    }

    /// `READ ONLY` (`true`) or `READ WRITE`.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = Some(read_only);
        self
    }

    /// `DEFERRABLE` (`true`) or `NOT DEFERRABLE`: with serializable and
    /// read-only, waits for a snapshot no serialization failure can touch.
    pub fn deferrable(mut self, deferrable: bool) -> Self {
        self.deferrable = Some(deferrable);
        self
    }

    /// tokio-postgres' `builder`, given these modes.
    pub(crate) fn apply<'a>(
        &self,
        mut builder: tokio_postgres::TransactionBuilder<'a>,
    ) -> tokio_postgres::TransactionBuilder<'a> {
        if let Some(level) = self.isolation_level {
            builder = builder.isolation_level(level);
        }
        if let Some(read_only) = self.read_only {
            builder = builder.read_only(read_only);
        }
        if let Some(deferrable) = self.deferrable {
            builder = builder.deferrable(deferrable);
        }
        builder
    }

    /// The `BEGIN` statement for these modes.
    pub(crate) fn begin_sql(&self) -> String {
        let mut modes = Vec::new();
        if let Some(level) = self.isolation_level {
            modes.push(match level {
                IsolationLevel::ReadUncommitted => "ISOLATION LEVEL READ UNCOMMITTED",
                IsolationLevel::ReadCommitted => "ISOLATION LEVEL READ COMMITTED",
                IsolationLevel::RepeatableRead => "ISOLATION LEVEL REPEATABLE READ",
                IsolationLevel::Serializable => "ISOLATION LEVEL SERIALIZABLE",
                // tokio-postgres' enum is non-exhaustive: a level it adds
                // later is refused by the server rather than guessed here.
                _ => "ISOLATION LEVEL UNKNOWN",
            });
        }
        match self.read_only {
            Some(true) => modes.push("READ ONLY"),
            Some(false) => modes.push("READ WRITE"),
            None => {}
        }
        match self.deferrable {
            Some(true) => modes.push("DEFERRABLE"),
            Some(false) => modes.push("NOT DEFERRABLE"),
            None => {}
        }
        if modes.is_empty() {
            "BEGIN".to_owned()
        } else {
            format!("BEGIN {}", modes.join(", "))
        }
    }
}

/// A transaction to start on a checked-out connection with modes of its
/// own, from [`Connection::build_transaction`]: tokio-postgres' builder
/// of the same name, whose [`start`](TransactionBuilder::start) gives
/// pgpipe's [`Transaction`] (the connection's statement cache and the
/// pool's metrics).
#[derive(Debug)]
pub struct TransactionBuilder<'a> {
    conn: &'a mut Connection,
    options: TransactionOptions,
}

impl<'a> TransactionBuilder<'a> {
    pub(super) fn new(conn: &'a mut Connection) -> TransactionBuilder<'a> {
        TransactionBuilder {
            conn,
            options: TransactionOptions::new(),
        }
    }

    /// The isolation level.
    pub fn isolation_level(mut self, level: IsolationLevel) -> Self {
        self.options = self.options.isolation_level(level);
        self
    }

    /// `READ ONLY` (`true`) or `READ WRITE`.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.options = self.options.read_only(read_only);
        self
    }

    /// `DEFERRABLE` (`true`) or `NOT DEFERRABLE`.
    pub fn deferrable(mut self, deferrable: bool) -> Self {
        self.options = self.options.deferrable(deferrable);
        self
    }

    /// Begins the transaction.
    ///
    /// # Errors
    ///
    /// As [`Connection::transaction`].
    pub async fn start(self) -> Result<Transaction<'a>, Error> {
        self.conn.transaction_with(self.options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn begin_names_each_mode_given_and_nothing_else() {
        assert_eq!(TransactionOptions::new().begin_sql(), "BEGIN");
        let all = TransactionOptions::new()
            .isolation_level(IsolationLevel::Serializable)
            .read_only(true)
            .deferrable(false);
        assert_eq!(
            all.begin_sql(),
            "BEGIN ISOLATION LEVEL SERIALIZABLE, READ ONLY, NOT DEFERRABLE"
        );
        let level = TransactionOptions::new().isolation_level(IsolationLevel::RepeatableRead);
        assert_eq!(level.begin_sql(), "BEGIN ISOLATION LEVEL REPEATABLE READ");
    }
}
