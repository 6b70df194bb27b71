//! Whether a protocol-level named statement prepared on one client
//! connection still runs after a transaction boundary, when the server
//! that has it is busy with other clients.

use std::time::Duration;

use futures_util::future::join_all;
use tokio_postgres::Config;
use tokio_postgres::types::Type;

use crate::conn::{Backend, Conn, within};
use crate::{Error, Evidence};

/// Runs of the statement, each with two other connections holding
/// transactions (and so, most likely, the server it was prepared on).
const RUNS: usize = 6;

/// What became of the named statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Named {
    /// It ran on another server than the one it was prepared on.
    Survives,
    /// It failed on another server.
    Lost,
    /// It always ran where it was prepared: nothing proven.
    Unproven,
}

/// Prepares a statement naming its server, and runs it [`RUNS`] times
/// while other connections hold transactions open. Whatever the answer,
/// the statement is closed where it was prepared.
pub(crate) async fn named(config: &Config, evidence: &mut Evidence) -> Result<Named, Error> {
    let own = Conn::open(config).await?;
    let holders = [Conn::open(config).await?, Conn::open(config).await?];
    // Its text is the probe's own (a token), to find it by on a server.
    let sql = format!(
        "SELECT {} /* pgpipe-probe {} */",
        Backend::COLUMNS,
        std::process::id()
    );
    let statement = within(own.client.prepare_typed(&sql, &[])).await?;
    let first = match within(own.client.query(&statement, &[])).await {
        Ok(rows) => Backend::from_row(&rows[0], 0),
        Err(error) => {
            evidence.push(format!(
                "a named statement failed at its first run after its prepare: {error}"
            ));
            clean_up(config, &sql, evidence).await;
            return Ok(Named::Lost);
        }
    };
    let mut verdict = Named::Unproven;
    for _ in 0..RUNS {
        for holder in &holders {
            holder.run("BEGIN").await?;
            holder.backend().await?;
        }
        let ran = within(own.client.query(&statement, &[])).await;
        for holder in &holders {
            holder.run("COMMIT").await?;
        }
        match ran {
            Ok(rows) if Backend::from_row(&rows[0], 0) != first => verdict = Named::Survives,
            Ok(_) => {}
            Err(error) => {
                evidence.push(format!(
                    "a named statement prepared on server process {} failed in a later \
                     transaction: {error}",
                    first.pid
                ));
                verdict = Named::Lost;
                break;
            }
        }
    }
    match verdict {
        Named::Survives => evidence.push(format!(
            "a named statement prepared on server process {} ran on another server after \
             a transaction boundary",
            first.pid
        )),
        Named::Unproven => evidence.push(format!(
            "a named statement always ran on the server it was prepared on ({RUNS} runs): \
             nothing proven, so it counts as not kept"
        )),
        Named::Lost => {}
    }
    drop(statement);
    clean_up(config, &sql, evidence).await;
    Ok(verdict)
}

/// Closes the statement on the server that has it: a pooler that does not
/// map names may have sent the driver's `Close` elsewhere. One, two, four
/// and so on up to sixteen connections at once each hold a transaction
/// (so each stays on one server, and together they cover more servers)
/// and ask their server for a statement of the probe's text under a name
/// of the driver's (`s` and a number; a pooler that maps names uses its
/// own, and closes them itself). Until it is found, or a connection's
/// `BEGIN` waits for a server (every server is held: all were asked).
async fn clean_up(config: &Config, text: &str, evidence: &mut Evidence) {
    let sql = "SELECT pg_catalog.max(name)::pg_catalog.text FROM pg_catalog.pg_prepared_statements \
               WHERE statement = $1 AND name ~ '^s[0-9]+$'";
    for n in [1, 2, 4, 8, 16] {
        let mut holders = Vec::with_capacity(n);
        for _ in 0..n {
            match Conn::open(config).await {
                Ok(conn) => holders.push(conn),
                Err(_) => break,
            }
        }
        // A `BEGIN` unanswered this long waits for a server; the ones
        // answered hold one each, and are asked without a hurry.
        let begun = join_all(
            holders
                .iter()
                .map(|holder| tokio::time::timeout(Duration::from_secs(2), holder.run("BEGIN"))),
        )
        .await;
        let serving: Vec<&Conn> = holders
            .iter()
            .zip(&begun)
            .filter(|(_, begun)| matches!(begun, Ok(Ok(()))))
            .map(|(holder, _)| holder)
            .collect();
        let found = join_all(serving.iter().map(|holder| async move {
            let rows = holder.rows(sql, &[(&text, Type::TEXT)]).await?;
            let name: Option<String> = rows[0].get(0);
            if let Some(name) = &name {
                holder.run(&format!("DEALLOCATE \"{name}\"")).await?;
            }
            Ok::<_, Error>(name.is_some())
        }))
        .await;
        for holder in &holders {
            let _ = tokio::time::timeout(Duration::from_secs(2), holder.run("COMMIT")).await;
        }
        if found.iter().any(|found| matches!(found, Ok(true))) {
            evidence
                .push("the named statement left on a server was closed there (DEALLOCATE)".into());
            return;
        }
        if serving.len() < n {
            evidence.push(match found.iter().find_map(|found| found.as_ref().err()) {
                Some(error) => format!("the named statement may be left on a server: {error}"),
                None => format!(
                    "the named statement was on none of the {} servers held at once: the \
                     driver's Close reached it",
                    serving.len()
                ),
            });
            return;
        }
    }
    evidence.push(
        "the named statement may be left on a server: sixteen connections at once did not \
         find it"
            .into(),
    );
}
