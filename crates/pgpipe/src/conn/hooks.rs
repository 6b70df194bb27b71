//! Hooks: async closures of the application's, run on a connection as it
//! is opened and around its recycling, as deadpool-postgres has them
//! (`post_create`, `pre_recycle`, `post_recycle`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio_postgres::Client;

/// What a hook returns: `Err` refuses the connection (see each hook).
pub type HookResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A hook's future, borrowing the connection's client.
pub type HookFuture<'c> = Pin<Box<dyn Future<Output = HookResult> + Send + 'c>>;

/// A hook: an async closure over the connection's client.
type Hook = Arc<dyn for<'c> Fn(&'c Client) -> HookFuture<'c> + Send + Sync>;

/// The hooks a pool runs; none by default.
#[derive(Clone, Default)]
pub(crate) struct Hooks {
    pub(crate) post_create: Option<Hook>,
    pub(crate) pre_recycle: Option<Hook>,
    pub(crate) post_recycle: Option<Hook>,
}

impl Hooks {
    /// Wraps a closure as a hook.
    pub(crate) fn hook<F>(f: F) -> Hook
    where
        F: for<'c> Fn(&'c Client) -> HookFuture<'c> + Send + Sync + 'static,
    {
        Arc::new(f)
    }
}

/// Runs `hook`, if there is one, on `client`.
pub(crate) async fn run(hook: &Option<Hook>, client: &Client) -> HookResult {
    match hook {
        Some(hook) => hook(client).await,
        None => Ok(()),
    }
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("post_create", &self.post_create.is_some())
            .field("pre_recycle", &self.pre_recycle.is_some())
            .field("post_recycle", &self.post_recycle.is_some())
            .finish()
    }
}
