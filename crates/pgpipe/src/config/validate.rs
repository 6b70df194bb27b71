//! The checks of a [`PoolConfig`]: every setting, and every combination
//! that cannot work (through a transaction pooler above all), is an error
//! message at build time, never a panic later.

use std::time::Duration;

use super::{DEFAULT_DEPTH, PoolConfig};
use crate::pooler::Prepare;

impl PoolConfig {
    /// Settings that cannot work through the declared pooler, with what to
    /// do instead.
    fn check_pooler(&self) -> Result<(), String> {
        if !self.pooler.is_transaction() {
            return Ok(());
        }
        let no_session = "a transaction pooler gives each transaction whichever server is free, \
                          so there is no session to keep";
        if self.statement_timeout.is_some() {
            return Err(format!(
                "statement_timeout cannot be set through a transaction pooler: {no_session} \
                 (and PgBouncer before 1.20 refuses the start-up `options` it needs); set it \
                 with ALTER ROLE … SET statement_timeout, or use the pooler's query_timeout"
            ));
        }
        if !self.session_settings.is_empty() {
            return Err(format!(
                "session_settings cannot be set through a transaction pooler: {no_session}; \
                 set them with ALTER ROLE … SET or ALTER DATABASE … SET"
            ));
        }
        if self.after_connect.is_some() {
            return Err(format!(
                "after_connect cannot run through a transaction pooler: {no_session}"
            ));
        }
        if self.prepare == Some(Prepare::Named) && !self.pooler.allows_named() {
            return Err(
                "prepare = Named needs a pooler that maps named statements across its \
                 servers (PgBouncer 1.21+ with max_prepared_statements > 0); without one a \
                 statement prepared on one server is missing, or another client's, on the \
                 next: leave prepare unset (unnamed statements)"
                    .into(),
            );
        }
        // A depth other than the default was asked for (the builder also
        // refuses the default value when it was set explicitly).
        if self.max_pipeline_depth != DEFAULT_DEPTH {
            self.check_depth_through_pooler()?;
        }
        Ok(())
    }

    /// Refuses a depth above 1 through a pooler that cannot track a
    /// pipeline.
    pub(crate) fn check_depth_through_pooler(&self) -> Result<(), String> {
        if self.pooler.allows_pipeline() || self.max_pipeline_depth <= 1 {
            return Ok(());
        }
        Err(format!(
            "max_pipeline_depth {} needs a pooler that tracks pipelines (PgBouncer 1.21+); \
             this one can move a connection to another server between two pipelined \
             queries and mix up their answers, so pgpipe keeps one query in flight per \
             connection: leave max_pipeline_depth unset, or use the pooler's session mode",
            self.max_pipeline_depth
        ))
    }

    /// Checks the settings together; every invalid combination is an error
    /// message here, never a panic later.
    pub(crate) fn validate(&self) -> Result<(), String> {
        self.check_pooler()?;
        if self.max_size == 0 {
            return Err("max_size must be at least 1".into());
        }
        if self.host_recheck < std::time::Duration::from_millis(100)
            || self.host_recheck > std::time::Duration::from_secs(3600)
        {
            return Err("host_recheck must be between 100 ms and 1 h".into());
        }
        if self.max_pipeline_depth == 0 || self.max_pipeline_depth > 1 << 20 {
            return Err("max_pipeline_depth must be between 1 and 1048576".into());
        }
        if self.max_batch == 0 {
            return Err("max_batch must be at least 1".into());
        }
        if self.statement_cache_capacity == 0 {
            return Err("statement_cache_capacity must be at least 1".into());
        }
        if self.batch_window > Duration::from_secs(1) {
            return Err("batch_window must be at most 1 s".into());
        }
        if !self.batch_window.is_zero() && !self.pipelining {
            return Err("batch_window needs pipelining(true)".into());
        }
        if self.connect_timeout.is_zero() {
            return Err("connect_timeout must be above zero".into());
        }
        let positive = [
            ("query_timeout", self.query_timeout),
            ("statement_timeout", self.statement_timeout),
            ("stall_timeout", self.stall_timeout),
            ("max_lifetime", self.max_lifetime),
            ("idle_timeout", self.idle_timeout),
            ("slow_query_threshold", self.slow_query_threshold),
            ("head_of_line_budget", self.head_of_line_budget),
            ("log_slow_statements", self.log_slow_statements),
        ];
        if let Some((name, _)) = positive
            .iter()
            .find(|(_, d)| d.is_some_and(|d| d.is_zero()))
        {
            return Err(format!("{name} must be above zero (or unset)"));
        }
        // PostgreSQL keeps statement_timeout in an int of milliseconds.
        let too_long = |t: &Duration| t.as_millis() > i32::MAX as u128;
        for (name, timeout) in [
            ("statement_timeout", self.statement_timeout),
            ("head_of_line_budget", self.head_of_line_budget),
        ] {
            if timeout.as_ref().is_some_and(too_long) {
                return Err(format!(
                    "{name} must be at most {} ms (PostgreSQL's limit)",
                    i32::MAX
                ));
            }
        }
        if self
            .head_of_line_budget
            .is_some_and(|b| b < Duration::from_millis(1))
        {
            return Err("head_of_line_budget must be at least 1 ms (or unset)".into());
        }
        if let Some((name, _)) = self.session_settings.iter().find(|(name, _)| {
            name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        }) {
            return Err(format!(
                "session setting {name:?} is not a setting's name (letters, digits, _ and .)"
            ));
        }
        if self.min_idle > self.max_size {
            return Err(format!(
                "min_idle ({}) must not exceed max_size ({})",
                self.min_idle, self.max_size
            ));
        }
        if self.max_result_bytes == Some(0) || self.max_result_rows == Some(0) {
            return Err(
                "max_result_bytes and max_result_rows must be at least 1 (or unset)".into(),
            );
        }
        match self.max_exclusive {
            Some(0) => Err("max_exclusive must be at least 1".into()),
            Some(n) if n > self.max_size => Err(format!(
                "max_exclusive ({n}) must not exceed max_size ({})",
                self.max_size
            )),
            _ => Ok(()),
        }
    }
}
