//! `tracing` spans and events, with the `tracing` feature; without it the
//! macros here expand to nothing and cost nothing.
//!
//! Span fields follow OpenTelemetry's database conventions where one fits:
//! `db.system.name = "postgresql"`, `db.operation.name` (the statement's
//! first keyword, which the guard reads anyway), and pgpipe's own
//! `pgpipe.pool`, `pgpipe.route` (`shared` or `exclusive`), `pgpipe.slow`,
//! `pgpipe.ahead` (queries before it on its connection) and
//! `pgpipe.queued_us`; on failure `error.type`, `db.response.status_code`
//! and `otel.status_code`. A query slower than `log_slow_statements` is a
//! `warn` event of target `pgpipe::slow`. Never a parameter, and never SQL
//! text.

/// The first keyword of `sql`, upper case, for `db.operation.name`; one of
/// a fixed set, so that it is never user data.
#[cfg(feature = "tracing")]
pub(crate) fn operation(sql: &str) -> &'static str {
    const KNOWN: [&str; 12] = [
        "SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "VALUES", "TABLE", "MERGE", "CALL", "DO",
        "EXPLAIN", "SHOW",
    ];
    let word = sql
        .trim_start_matches(|c: char| c.is_whitespace() || c == '(')
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("");
    KNOWN
        .iter()
        .find(|k| k.eq_ignore_ascii_case(word))
        .copied()
        .unwrap_or("OTHER")
}

/// One query's span, handed down the query path: with the feature off it
/// is nothing, and its methods compile to nothing.
#[derive(Clone, Copy)]
pub(crate) struct Trace<'a> {
    #[cfg(feature = "tracing")]
    span: &'a tracing::Span,
    #[cfg(not(feature = "tracing"))]
    span: std::marker::PhantomData<&'a ()>,
}

impl<'a> Trace<'a> {
    #[cfg(feature = "tracing")]
    pub(crate) fn new(span: &'a tracing::Span) -> Trace<'a> {
        Trace { span }
    }

    #[cfg(not(feature = "tracing"))]
    pub(crate) fn new() -> Trace<'a> {
        Trace {
            span: std::marker::PhantomData,
        }
    }

    /// The query has its place: how many were ahead of it, how long it
    /// waited (from `since`, when known).
    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    pub(crate) fn admitted(&self, ahead: u64, since: Option<std::time::Instant>) {
        #[cfg(feature = "tracing")]
        {
            self.span.record("pgpipe.ahead", ahead);
            if let Some(since) = since {
                self.span
                    .record("pgpipe.queued_us", since.elapsed().as_micros() as u64);
            }
        }
    }

    /// It failed: the span records the error as OpenTelemetry's database
    /// conventions name it (`error.type`: the SQLSTATE, or the error's
    /// kind when the server sent none; `db.response.status_code`: the
    /// SQLSTATE) and `otel.status_code = "ERROR"`.
    #[cfg(feature = "tracing")]
    pub(crate) fn failed(&self, error: &crate::error::Error) {
        {
            let kind = format!("{:?}", error.kind());
            match error.code() {
                Some(code) => {
                    self.span.record("error.type", code.code());
                    self.span.record("db.response.status_code", code.code());
                }
                None => {
                    self.span.record("error.type", kind.as_str());
                }
            }
            self.span.record("otel.status_code", "ERROR");
        }
    }

    /// It took `took`, past the pool's `log_slow_statements`.
    #[cfg(feature = "tracing")]
    pub(crate) fn slow(&self, sql: &str, took: std::time::Duration, ok: bool) {
        tracing::warn!(
            target: "pgpipe::slow",
            parent: self.span,
            duration_ms = took.as_secs_f64() * 1e3,
            db.operation.name = operation(sql),
            outcome = if ok { "ok" } else { "error" },
            "slow statement"
        );
    }

    /// Its shared connection was lost under it.
    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    pub(crate) fn lost(&self, error: &crate::error::Error) {
        #[cfg(feature = "tracing")]
        tracing::debug!(target: "pgpipe", parent: self.span, error = %error, "a shared connection was lost");
    }
}

/// A `warn`-level event about the pool's own doings, with the feature on.
macro_rules! pool_warn {
    ($($arg:tt)*) => {
        #[cfg(feature = "tracing")]
        tracing::warn!(target: "pgpipe", $($arg)*);
    };
}

pub(crate) use pool_warn;
