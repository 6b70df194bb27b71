//! Where a cancel request lands: on its own connection's statement, on
//! nothing, or on a neighbour's.

use std::time::Duration;

use tokio_postgres::Config;

use crate::conn::{Conn, echoes};
use crate::raw::{Answer, Raw};
use crate::{Error, Evidence};

/// What a cancel request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// It stopped its own connection's statement, and no other.
    Lands,
    /// Its statement ran to the end.
    Dropped,
    /// Another connection's statement failed meanwhile.
    HitsNeighbour,
}

/// One connection runs a 3 s sleep and another a 1 s one; 300 ms in, the
/// first connection's statement is cancelled.
pub(crate) async fn cancel(config: &Config, evidence: &mut Evidence) -> Result<Cancel, Error> {
    let mut own = Raw::open(config).await?;
    let neighbour = Conn::open(config).await?;
    own.query("SELECT pg_catalog.pg_sleep(3)").await?;
    let (sent, neighbour_answer) = tokio::join!(
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            own.cancel().await
        },
        neighbour.rows("SELECT 7::pg_catalog.int8 FROM pg_catalog.pg_sleep(1)", &[]),
    );
    let own_answer = own.answer().await;
    sent?;
    let neighbour_ok = neighbour_answer.as_ref().is_ok_and(|rows| echoes(rows, 7));
    let cancelled = matches!(&own_answer, Ok(Answer::Failed(error)) if error.starts_with("57014:"));
    let verdict = match (cancelled, neighbour_ok) {
        (_, false) => Cancel::HitsNeighbour,
        (true, true) => Cancel::Lands,
        (false, true) => Cancel::Dropped,
    };
    evidence.push(match verdict {
        Cancel::Lands => "a cancel request stopped its own statement; a neighbour's ran on".into(),
        Cancel::Dropped => format!(
            "a cancel request did not stop its statement ({}); a neighbour's ran on",
            match own_answer {
                Ok(Answer::Rows(_)) => "it ran to the end".to_string(),
                Ok(Answer::Failed(error)) => error,
                Err(error) => error.to_string(),
            }
        ),
        Cancel::HitsNeighbour => format!(
            "a neighbour's statement failed while another connection's was cancelled ({}); \
             the cancelled one: {}",
            match &neighbour_answer {
                Ok(rows) => format!("{} rows", rows.len()),
                Err(error) => error.to_string(),
            },
            match own_answer {
                Ok(Answer::Rows(_)) => "ran to the end".to_string(),
                Ok(Answer::Failed(error)) => error,
                Err(error) => error.to_string(),
            }
        ),
    });
    Ok(verdict)
}
