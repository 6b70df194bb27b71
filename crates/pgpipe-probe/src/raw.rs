//! A connection that writes protocol messages exactly when the probe says:
//! a request group that reaches the pooler in two pieces, the second after
//! an earlier answer (a driver cannot script it); and a cancel request
//! sent as libpq sends one (tokio-postgres ends its socket's sending half
//! right after it, which makes PgBouncer 1.18 drop it or exit,
//! pgbouncer#801).

use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::IsNull;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, SCRAM_SHA_256, ScramSha256};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::Config;

use crate::target::{Socket, Target};
use crate::{Error, PATIENCE};

/// What one request group came back with.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Its rows' columns, as text.
    Rows(Vec<Vec<Option<String>>>),
    /// The server's error: its SQLSTATE and message.
    Failed(String),
}

/// A started-up connection, written to by hand.
pub(crate) struct Raw {
    stream: Socket,
    read: BytesMut,
    target: Target,
    /// The backend's process id and secret key, for a cancel request.
    key: Option<(i32, i32)>,
}

impl Raw {
    /// Connects and authenticates (trust, password, MD5 or SCRAM-SHA-256),
    /// up to the first `ReadyForQuery`.
    pub(crate) async fn open(config: &Config) -> Result<Raw, Error> {
        let target = Target::of(config)?;
        let (stream, _) = target.connect().await?;
        let mut raw = Raw {
            stream,
            read: BytesMut::new(),
            target,
            key: None,
        };
        let user = config
            .get_user()
            .ok_or_else(|| Error::new("the URL names no user".into()))?;
        let mut params = vec![("user", user), ("client_encoding", "UTF8")];
        if let Some(db) = config.get_dbname() {
            params.push(("database", db));
        }
        params.push(("application_name", "pgpipe-probe"));
        let mut buf = BytesMut::new();
        frontend::startup_message(params, &mut buf)?;
        raw.send(&buf).await?;
        let password = config.get_password().unwrap_or_default().to_vec();
        let mut scram = None;
        loop {
            let mut buf = BytesMut::new();
            match raw.next().await? {
                Message::AuthenticationOk => {}
                Message::AuthenticationCleartextPassword => {
                    frontend::password_message(&password, &mut buf)?;
                }
                Message::AuthenticationMd5Password(body) => {
                    let hash = md5_hash(user.as_bytes(), &password, body.salt());
                    frontend::password_message(hash.as_bytes(), &mut buf)?;
                }
                Message::AuthenticationSasl(_) => {
                    let started = ScramSha256::new(&password, ChannelBinding::unsupported());
                    frontend::sasl_initial_response(SCRAM_SHA_256, started.message(), &mut buf)?;
                    scram = Some(started);
                }
                Message::AuthenticationSaslContinue(body) => {
                    let scram = scram
                        .as_mut()
                        .ok_or_else(|| Error::new("SCRAM out of order".into()))?;
                    scram.update(body.data())?;
                    frontend::sasl_response(scram.message(), &mut buf)?;
                }
                Message::AuthenticationSaslFinal(body) => {
                    let scram = scram
                        .as_mut()
                        .ok_or_else(|| Error::new("SCRAM out of order".into()))?;
                    scram.finish(body.data())?;
                }
                Message::BackendKeyData(body) => {
                    raw.key = Some((body.process_id(), body.secret_key()));
                }
                Message::ErrorResponse(body) => return Err(Error::new(error_text(&body))),
                Message::ReadyForQuery(_) => return Ok(raw),
                _ => {}
            }
            if !buf.is_empty() {
                raw.send(&buf).await?;
            }
        }
    }

    /// Writes `bytes` as they are.
    pub(crate) async fn send(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.stream.write_all(bytes).await?;
        Ok(self.stream.flush().await?)
    }

    /// Sends `sql` in the simple protocol.
    pub(crate) async fn query(&mut self, sql: &str) -> Result<(), Error> {
        let mut buf = BytesMut::new();
        frontend::query(sql, &mut buf)?;
        self.send(&buf).await
    }

    /// Asks the server to cancel what this connection runs: the request on
    /// a socket of its own, then nothing more until the other end closes
    /// it (within [`PATIENCE`]), as libpq does.
    pub(crate) async fn cancel(&self) -> Result<(), Error> {
        let (pid, secret) = self
            .key
            .ok_or_else(|| Error::new("the server sent no cancel key".into()))?;
        let (mut socket, _) = self.target.connect().await?;
        let mut buf = BytesMut::new();
        frontend::cancel_request(pid, secret, &mut buf);
        socket.write_all(&buf).await?;
        socket.flush().await?;
        let closed = tokio::time::timeout(PATIENCE, async {
            // A reset is a close too.
            let mut scratch = [0u8; 64];
            while socket.read(&mut scratch).await.is_ok_and(|read| read > 0) {}
        });
        closed.await.map_err(|_| Error::lost())
    }

    /// The next message from the other end, within [`PATIENCE`].
    async fn next(&mut self) -> Result<Message, Error> {
        loop {
            if let Some(message) = Message::parse(&mut self.read)? {
                return Ok(message);
            }
            let read = tokio::time::timeout(PATIENCE, self.stream.read_buf(&mut self.read))
                .await
                .map_err(|_| Error::lost())??;
            if read == 0 {
                return Err(Error::new("the connection was closed".into()));
            }
        }
    }

    /// Reads one request group's answer, up to its `ReadyForQuery`.
    pub(crate) async fn answer(&mut self) -> Result<Answer, Error> {
        let mut rows = Vec::new();
        let mut failed = None;
        loop {
            match self.next().await? {
                Message::DataRow(body) => {
                    let buffer = body.buffer();
                    let row = body
                        .ranges()
                        .map(|range| {
                            Ok(range.map(|r| String::from_utf8_lossy(&buffer[r]).into_owned()))
                        })
                        .collect()?;
                    rows.push(row);
                }
                Message::ErrorResponse(body) => failed = Some(error_text(&body)),
                Message::ReadyForQuery(_) => {
                    return Ok(match failed {
                        Some(error) => Answer::Failed(error),
                        None => Answer::Rows(rows),
                    });
                }
                _ => {}
            }
        }
    }
}

/// `Parse` of `sql` as the unnamed statement.
pub(crate) fn parse(sql: &str, buf: &mut BytesMut) -> Result<(), Error> {
    Ok(frontend::parse("", sql, std::iter::empty(), buf)?)
}

/// `Bind` (no parameters, text results), `Execute` and `Sync` of the
/// unnamed statement.
pub(crate) fn bind_execute_sync(buf: &mut BytesMut) -> Result<(), Error> {
    frontend::bind(
        "",
        "",
        std::iter::empty(),
        std::iter::empty::<()>(),
        |(), _| Ok(IsNull::No),
        std::iter::empty(),
        buf,
    )
    .map_err(|_| Error::new("a Bind message could not be written".into()))?;
    frontend::execute("", 0, buf)?;
    frontend::sync(buf);
    Ok(())
}

fn error_text(body: &postgres_protocol::message::backend::ErrorResponseBody) -> String {
    let (mut code, mut message) = (String::new(), String::new());
    let mut fields = body.fields();
    while let Ok(Some(field)) = fields.next() {
        match field.type_() {
            b'C' => code = String::from_utf8_lossy(field.value_bytes()).into_owned(),
            b'M' => message = String::from_utf8_lossy(field.value_bytes()).into_owned(),
            _ => {}
        }
    }
    format!("{code}: {message}")
}
