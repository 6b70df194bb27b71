//! What a query runs: SQL text, a pgpipe [`Statement`], or a
//! tokio-postgres `Statement` prepared on the connection it runs on.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::error::{Error, ErrorKind};

/// A statement from [`Executor::prepare`](crate::Executor::prepare): its
/// SQL, and what the server said of it (parameter and column types).
///
/// It runs on any [`Executor`](crate::Executor) by its SQL, through each
/// connection's statement cache: prepared once per connection, on the pool
/// as on a checkout. It dereferences to the tokio-postgres `Statement` it
/// was prepared as, for [`params`](tokio_postgres::Statement::params) and
/// [`columns`](tokio_postgres::Statement::columns).
#[derive(Clone)]
pub struct Statement {
    sql: Arc<str>,
    prepared: tokio_postgres::Statement,
}

impl Statement {
    pub(crate) fn new(sql: &str, prepared: tokio_postgres::Statement) -> Statement {
        Statement {
            sql: Arc::from(sql),
            prepared,
        }
    }

    /// Its SQL.
    pub fn sql(&self) -> &str {
        &self.sql
    }
}

impl Deref for Statement {
    type Target = tokio_postgres::Statement;

    fn deref(&self) -> &tokio_postgres::Statement {
        &self.prepared
    }
}

impl fmt::Debug for Statement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Statement")
            .field("sql", &self.sql)
            .field("params", &self.prepared.params())
            .finish_non_exhaustive()
    }
}

/// What the query methods of [`Executor`](crate::Executor) take, as
/// tokio-postgres' `ToStatement`: SQL text (`&str`, `String`), a pgpipe
/// [`Statement`], or a tokio-postgres `Statement`, which belongs to the
/// connection it was prepared on and so runs only there (on a
/// [`Connection`](crate::Connection) or a transaction on it; the pool
/// refuses it with [`ErrorKind::Params`](crate::ErrorKind::Params)).
///
/// Sealed: pgpipe reads the SQL of everything it runs.
pub trait ToQuery: sealed::Sealed + Sync {}

/// What a [`ToQuery`] is, as the executors read it (public only as the
/// sealed trait's return type: this module is private).
#[derive(Debug, Clone, Copy)]
#[doc(hidden)]
pub enum QueryRef<'a> {
    Sql(&'a str),
    Prepared(&'a tokio_postgres::Statement),
}

pub(crate) mod sealed {
    use super::QueryRef;

    pub trait Sealed {
        fn query_ref(&self) -> QueryRef<'_>;
    }
}

/// What a [`ToQuery`] is.
pub(crate) fn query_ref<Q: ToQuery + ?Sized>(query: &Q) -> QueryRef<'_> {
    sealed::Sealed::query_ref(query)
}

impl sealed::Sealed for str {
    fn query_ref(&self) -> QueryRef<'_> {
        QueryRef::Sql(self)
    }
}
impl ToQuery for str {}

impl sealed::Sealed for String {
    fn query_ref(&self) -> QueryRef<'_> {
        QueryRef::Sql(self)
    }
}
impl ToQuery for String {}

impl sealed::Sealed for Statement {
    fn query_ref(&self) -> QueryRef<'_> {
        QueryRef::Sql(&self.sql)
    }
}
impl ToQuery for Statement {}

impl sealed::Sealed for tokio_postgres::Statement {
    fn query_ref(&self) -> QueryRef<'_> {
        QueryRef::Prepared(self)
    }
}
impl ToQuery for tokio_postgres::Statement {}

impl<T: ToQuery + ?Sized> sealed::Sealed for &T {
    fn query_ref(&self) -> QueryRef<'_> {
        query_ref(&**self)
    }
}
impl<T: ToQuery + ?Sized> ToQuery for &T {}

/// The SQL the pool runs `query` as: a tokio-postgres `Statement` belongs to
/// one connection, and the pool's queries go to any.
pub(crate) fn pool_sql<Q: ToQuery + ?Sized>(query: &Q) -> Result<&str, Error> {
    match query_ref(query) {
        QueryRef::Sql(sql) => Ok(sql),
        QueryRef::Prepared(_) => Err(Error::new(
            ErrorKind::Params,
            "a tokio_postgres::Statement belongs to the connection it was prepared on, and the \
             pool runs each query on any of its connections: pass the SQL, or a \
             pgpipe::Statement from Executor::prepare; nothing was run",
        )),
    }
}
