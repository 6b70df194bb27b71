//! One client connection of the probe's own, and the backend it reaches,
//! as the server names it.

use std::net::SocketAddr;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config, NoTls, Row};

use crate::target::Target;
use crate::{Error, PATIENCE};

/// One server process, as the server names it: its process id and when
/// its postmaster started (two servers' process ids may be equal).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Backend {
    pub(crate) pid: i32,
    postmaster: String,
}

impl Backend {
    /// The columns that name it, to add to a probe's `SELECT`, read back
    /// by [`Backend::from_row`] from `first` on.
    pub(crate) const COLUMNS: &'static str =
        "pg_catalog.pg_backend_pid(), pg_catalog.pg_postmaster_start_time()::pg_catalog.text";

    pub(crate) fn from_row(row: &Row, first: usize) -> Backend {
        Backend {
            pid: row.get(first),
            postmaster: row.get(first + 1),
        }
    }
}

/// A client connection of the probe's own (no TLS), its connection task
/// running until the client is dropped.
pub(crate) struct Conn {
    pub(crate) client: Client,
    /// The socket's own address, for TCP.
    local: Option<SocketAddr>,
}

impl Conn {
    /// Opens a connection to the config's first host.
    pub(crate) async fn open(config: &Config) -> Result<Conn, Error> {
        let (socket, local) = Target::of(config)?.connect().await?;
        let (client, connection) = within(config.connect_raw(socket, NoTls)).await?;
        tokio::spawn(connection);
        Ok(Conn { client, local })
    }

    /// One statement, unnamed (nothing outlives its `Sync`), within
    /// [`PATIENCE`].
    pub(crate) async fn rows(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        within(self.client.query_typed(sql, params)).await
    }

    /// Simple-protocol SQL (`BEGIN`, `COMMIT`, `RESET`), within
    /// [`PATIENCE`].
    pub(crate) async fn run(&self, sql: &str) -> Result<(), Error> {
        within(self.client.batch_execute(sql)).await
    }

    /// The backend that runs this connection's next statement.
    pub(crate) async fn backend(&self) -> Result<Backend, Error> {
        let sql = format!("SELECT {}", Backend::COLUMNS);
        let rows = self.rows(&sql, &[]).await?;
        Ok(Backend::from_row(&rows[0], 0))
    }

    /// Whether the server sees this very socket as its client: its address
    /// and port are the ones it reports. Nothing sits in between then.
    pub(crate) async fn seen_as_itself(&self) -> Result<Option<SocketAddr>, Error> {
        let rows = self
            .rows(
                "SELECT pg_catalog.host(pg_catalog.inet_client_addr()), \
                 pg_catalog.inet_client_port()",
                &[],
            )
            .await?;
        let (addr, port): (Option<String>, Option<i32>) = (rows[0].get(0), rows[0].get(1));
        let seen = addr.zip(port).and_then(|(addr, port)| {
            let ip = addr.parse::<std::net::IpAddr>().ok()?;
            Some(SocketAddr::new(ip, u16::try_from(port).ok()?))
        });
        Ok(seen.filter(|seen| Some(*seen) == self.local))
    }

    /// The socket's own address, for the evidence.
    pub(crate) fn local(&self) -> Option<SocketAddr> {
        self.local
    }
}

/// Whether `rows` is one row whose first column is `want`: an echo's own
/// answer.
pub(crate) fn echoes(rows: &[Row], want: i64) -> bool {
    rows.len() == 1 && rows[0].try_get::<_, i64>(0).ok() == Some(want)
}

/// A driver call within [`PATIENCE`].
pub(crate) async fn within<T>(
    call: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(PATIENCE, call).await {
        Ok(answer) => answer.map_err(Error::from),
        Err(_) => Err(Error::lost()),
    }
}
