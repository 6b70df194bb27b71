//! The pgpipe settings a run tries instead of the defaults.

/// pgpipe settings to try (the defaults when unset).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tuning {
    pub(crate) depth: Option<usize>,
    pub(crate) max_exclusive: Option<usize>,
    pub(crate) routing: Option<pgpipe::Routing>,
    pub(crate) window: Option<std::time::Duration>,
    /// `Some(None)` turns head-of-line awareness off.
    pub(crate) slow: Option<Option<std::time::Duration>>,
    /// `Some(None)` turns the head-of-line budget off.
    pub(crate) budget: Option<Option<std::time::Duration>>,
    /// `--pgbouncer-binary`'s version, 1.21 or later.
    pub(crate) bouncer: Option<(u16, u16)>,
}
