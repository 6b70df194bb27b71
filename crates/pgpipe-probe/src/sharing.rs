//! Whether anything sits between the probe and the server, and whether
//! client connections open at the same time share server sessions.

use std::collections::HashMap;

use tokio_postgres::Config;
use tokio_postgres::types::Type;

use crate::conn::{Backend, Conn};
use crate::{Error, Evidence};

/// Client connections held open at once.
const CLIENTS: usize = 4;

/// Rounds: in each, one client holds a transaction open while the others
/// run a statement each.
const ROUNDS: usize = 8;

/// What the sharing check saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sessions {
    /// The server reports this very socket as its client.
    Direct,
    /// Something in between, but every client connection kept one server
    /// session of its own.
    Kept,
    /// Client connections open at once ran on the same server session, or
    /// one connection's statements ran in more than one.
    Shared,
}

/// Opens [`CLIENTS`] connections and watches which server session runs
/// each one's statements.
pub(crate) async fn sessions(config: &Config, evidence: &mut Evidence) -> Result<Sessions, Error> {
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(Conn::open(config).await?);
    }
    if let Some(seen) = clients[0].seen_as_itself().await? {
        evidence.push(format!(
            "the server reports this connection's own socket ({seen}) as its client: \
             nothing sits in between"
        ));
        return Ok(Sessions::Direct);
    }
    evidence.push(match clients[0].local() {
        Some(local) => format!(
            "the server does not report this connection's socket ({local}) as its client: \
             something sits in between"
        ),
        None => "a Unix socket: the server cannot say who connected".into(),
    });
    // Which clients each server session ran statements for.
    let mut runs: HashMap<Backend, Vec<usize>> = HashMap::new();
    let mut per_client: Vec<Vec<Backend>> = vec![Vec::new(); CLIENTS];
    for round in 0..ROUNDS {
        let holder = round % CLIENTS;
        clients[holder].run("BEGIN").await?;
        for (i, client) in clients.iter().enumerate() {
            let backend = client.backend().await?;
            runs.entry(backend.clone()).or_default().push(i);
            per_client[i].push(backend);
        }
        clients[holder].run("COMMIT").await?;
    }
    for (backend, seen_by) in &runs {
        let mut clients: Vec<usize> = seen_by.clone();
        clients.sort_unstable();
        clients.dedup();
        if clients.len() > 1 {
            evidence.push(format!(
                "server process {} ran statements of client connections {clients:?}, \
                 all open at once: server sessions are shared between transactions",
                backend.pid
            ));
            return Ok(Sessions::Shared);
        }
    }
    for (i, backends) in per_client.iter().enumerate() {
        if backends.iter().any(|b| *b != backends[0]) {
            evidence.push(format!(
                "client connection {i} ran in more than one server session: sessions are \
                 not kept between transactions"
            ));
            return Ok(Sessions::Shared);
        }
    }
    evidence.push(format!(
        "{CLIENTS} client connections open at once, {ROUNDS} rounds with one holding a \
         transaction: each kept one server session of its own"
    ));
    Ok(Sessions::Kept)
}

/// Whether a setting made in one transaction is there in the next on the
/// same client connection. The setting is a placeholder of the probe's
/// own, reset before returning.
pub(crate) async fn state_kept(config: &Config, evidence: &mut Evidence) -> Result<bool, Error> {
    let client = Conn::open(config).await?;
    let token = format!("probe-{}", std::process::id());
    client
        .rows(
            "SELECT pg_catalog.set_config('pgpipe_probe.mark', $1, false)",
            &[(&token, Type::TEXT)],
        )
        .await?;
    let rows = client
        .rows(
            "SELECT pg_catalog.current_setting('pgpipe_probe.mark', true)",
            &[],
        )
        .await?;
    let seen: Option<String> = rows[0].get(0);
    client.run("RESET pgpipe_probe.mark").await?;
    let kept = seen.as_deref() == Some(token.as_str());
    evidence.push(if kept {
        "a setting made in one transaction was there in the next (then reset)".into()
    } else {
        "a setting made in one transaction was gone in the next".into()
    });
    Ok(kept)
}
