//! What sits behind a PostgreSQL URL, found out with scripted traffic from
//! several client connections at once, and the [`Pooler`] setting that is
//! safe there.
//!
//! pgpipe cannot tell a pooler from a server in-band, so the application
//! declares one ([`pgpipe::PoolBuilder::pooler`]). For a pooler nobody
//! vouches for, [`probe`] (or the `pgpipe-probe URL` command) asks the
//! server what it sees:
//!
//! - **In between?** A server reports its client's address and port: when
//!   they are this connection's own socket, nothing sits in between.
//! - **Sessions shared?** Four connections open at once, one at a time
//!   holding a transaction, each asking which server process runs it. One
//!   process serving two connections, or one connection served by two, is
//!   a transaction pooler.
//! - **Answers kept?** Pipelines of statements echoing their own numbers
//!   from four connections at once; and, through a transaction pooler, a
//!   request group written in two pieces around an earlier group's answer
//!   (as a network may deliver a pipeline) while other connections are
//!   busy: a pooler that hands its server on at the earlier
//!   `ReadyForQuery` runs the second piece on another server.
//! - **Named statements kept** across a transaction boundary, with the
//!   server they were prepared on held by other connections.
//! - **Session state kept** between transactions (not through a
//!   transaction pooler: a setting left there would reach other clients).
//! - **Cancel requests**: whether one stops its own statement and only it.
//!
//! It leaves nothing behind: its setting is reset, and a named statement a
//! pooler may have left on a server is closed there (`DEALLOCATE`, after
//! asking `pg_prepared_statements` on that server). It sends only
//! `SELECT`s of constants, of the server's own functions and of
//! `pg_sleep`, but a pooler that misroutes answers may give one of them to
//! another client: probe a pooler before its applications use it, or one
//! of its own.
//!
//! ```no_run
//! # async fn demo() -> Result<(), pgpipe_probe::Error> {
//! let findings = pgpipe_probe::probe("postgres://app@pgbouncer:6432/app").await?;
//! println!("{findings}");
//! let pool = pgpipe::Pool::builder()
//!     .url("postgres://app@pgbouncer:6432/app")
//!     .pooler(findings.pooler())
//!     .build();
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::time::Duration;

use pgpipe::Pooler;
use tokio_postgres::Config;
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;

mod cancel;
mod conn;
mod named;
mod pipelines;
mod raw;
mod sharing;
mod target;

pub use cancel::Cancel;

/// The evidence lines each check adds.
type Evidence = Vec<String>;

/// What answers at the URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behind {
    /// PostgreSQL itself: it reports the probe's own socket as its client.
    Server,
    /// Something in between that keeps one server session per client
    /// connection (a session pooler, or a plain TCP proxy).
    SessionPooler,
    /// A pooler that shares server sessions between client connections.
    TransactionPooler,
}

/// What the probe found, and why.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Findings {
    /// What answers at the URL.
    pub behind: Behind,
    /// Every pipelined answer, from several connections at once, reached
    /// its own statement.
    pub answers_kept: bool,
    /// Through a transaction pooler: a pipeline kept its server until its
    /// last answer, with other connections busy.
    pub pipeline_held: Option<bool>,
    /// Through a transaction pooler: a named statement ran on another
    /// server after a transaction boundary.
    pub named_statements_kept: Option<bool>,
    /// Not through a transaction pooler: a setting stayed between
    /// transactions.
    pub session_state_kept: Option<bool>,
    /// Where a cancel request landed.
    pub cancel: Cancel,
    /// What each check saw, in order.
    pub evidence: Vec<String>,
}

impl Findings {
    /// The setting that is safe behind this URL, from what was seen: what
    /// was not proven counts as absent.
    pub fn pooler(&self) -> Pooler {
        if !self.answers_kept && self.behind != Behind::TransactionPooler {
            // Answers crossed even with sessions kept: one statement in
            // flight per connection is all that is left to try.
            return Pooler::unknown_transaction();
        }
        match self.behind {
            Behind::Server => Pooler::None,
            Behind::SessionPooler if self.session_state_kept == Some(true) => Pooler::Session,
            Behind::SessionPooler => Pooler::unknown_transaction(),
            Behind::TransactionPooler => Pooler::Transaction {
                tracks_pipeline: self.answers_kept && self.pipeline_held == Some(true),
                tracks_prepared: self.named_statements_kept == Some(true),
            },
        }
    }
}

impl fmt::Display for Findings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let behind = match self.behind {
            Behind::Server => "PostgreSQL itself",
            Behind::SessionPooler => "a session pooler (one server session per connection)",
            Behind::TransactionPooler => "a transaction pooler (server sessions shared)",
        };
        writeln!(f, "behind the URL: {behind}")?;
        for line in &self.evidence {
            writeln!(f, "  - {line}")?;
        }
        write!(f, "declare: .pooler(Pooler::{:?})", self.pooler())
    }
}

/// How long any one step may wait for an answer: past it, an answer was
/// lost (which is itself a finding) or the server is not there.
const PATIENCE: Duration = Duration::from_secs(10);

/// Probes what sits behind `url` (its first host; no TLS). Takes about
/// ten seconds; see the [crate] docs for what it sends.
pub async fn probe(url: &str) -> Result<Findings, Error> {
    let config: Config = url
        .parse()
        .map_err(|error| Error::new(format!("not a PostgreSQL URL: {error}")))?;
    if config.get_ssl_mode() == SslMode::Require {
        return Err(Error::new(
            "the probe connects without TLS; this URL requires it".into(),
        ));
    }
    let mut evidence = Vec::new();
    let behind = match sharing::sessions(&config, &mut evidence).await? {
        sharing::Sessions::Direct => Behind::Server,
        sharing::Sessions::Kept => Behind::SessionPooler,
        sharing::Sessions::Shared => Behind::TransactionPooler,
    };
    let tally = pipelines::interleaved(&config, &mut evidence).await?;
    let answers_kept = tally.wrong == 0 && tally.failed == 0;
    let (mut pipeline_held, mut named_statements_kept, mut session_state_kept) = (None, None, None);
    if behind == Behind::TransactionPooler {
        pipeline_held =
            Some(answers_kept && pipelines::held_to_the_end(&config, &mut evidence).await?);
        named_statements_kept =
            Some(named::named(&config, &mut evidence).await? == named::Named::Survives);
    } else {
        session_state_kept = Some(sharing::state_kept(&config, &mut evidence).await?);
    }
    let cancel = cancel::cancel(&config, &mut evidence).await?;
    Ok(Findings {
        behind,
        answers_kept,
        pipeline_held,
        named_statements_kept,
        session_state_kept,
        cancel,
        evidence,
    })
}

/// Why the probe could not finish.
#[derive(Debug)]
pub struct Error {
    message: String,
    code: Option<SqlState>,
}

impl Error {
    fn new(message: String) -> Error {
        Error {
            message,
            code: None,
        }
    }

    /// No answer within the probe's patience: lost, or the server is not
    /// there.
    fn lost() -> Error {
        Error::new(format!("no answer within {:?}", PATIENCE))
    }

    /// The server's SQLSTATE, when it refused something.
    pub fn code(&self) -> Option<&SqlState> {
        self.code.as_ref()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<tokio_postgres::Error> for Error {
    fn from(error: tokio_postgres::Error) -> Error {
        Error {
            message: match error.as_db_error() {
                Some(db) => format!("{}: {}", db.code().code(), db.message()),
                None => error.to_string(),
            },
            code: error.code().cloned(),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Error {
        Error::new(error.to_string())
    }
}
