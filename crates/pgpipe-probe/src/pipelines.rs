//! Whether pipelined answers stay with their client connection: under
//! interleaving from several connections at once, and (through a
//! transaction pooler) when a request group reaches it in two pieces
//! around an earlier answer.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_util::future::join_all;
use tokio_postgres::Config;
use tokio_postgres::types::Type;

use crate::conn::{Backend, Conn, echoes};
use crate::raw::{self, Answer, Raw};
use crate::{Error, Evidence};

/// Client connections pipelining at once.
const CLIENTS: usize = 4;

/// Pipelines per connection, and statements per pipeline.
const PIPELINES: i64 = 8;
const DEPTH: i64 = 32;

/// Tries of the release check.
const TRIES: usize = 3;

/// Answers counted by the interleaving check.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    pub(crate) right: u64,
    pub(crate) wrong: u64,
    pub(crate) failed: u64,
}

/// Several connections at once, each sending pipelines of statements that
/// echo their own number: every answer is checked against its statement.
pub(crate) async fn interleaved(config: &Config, evidence: &mut Evidence) -> Result<Tally, Error> {
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(Conn::open(config).await?);
    }
    let tallies = join_all(clients.iter().enumerate().map(|(c, client)| async move {
        let mut tally = Tally::default();
        for p in 0..PIPELINES {
            let ids: Vec<i64> = (0..DEPTH)
                .map(|q| (c as i64 + 1) * 1_000_000 + p * 1_000 + q)
                .collect();
            let answers = join_all(ids.iter().map(|id| async move {
                client
                    .rows("SELECT $1::pg_catalog.int8", &[(id, Type::INT8)])
                    .await
            }))
            .await;
            for (id, answer) in ids.iter().zip(answers) {
                match answer {
                    Ok(rows) if echoes(&rows, *id) => tally.right += 1,
                    Ok(_) => tally.wrong += 1,
                    Err(_) => tally.failed += 1,
                }
            }
        }
        tally
    }))
    .await;
    let tally = tallies.iter().fold(Tally::default(), |sum, t| Tally {
        right: sum.right + t.right,
        wrong: sum.wrong + t.wrong,
        failed: sum.failed + t.failed,
    });
    evidence.push(format!(
        "{CLIENTS} connections at once, {PIPELINES} pipelines of {DEPTH} statements each: \
         {} answers right, {} wrong, {} failed",
        tally.right, tally.wrong, tally.failed
    ));
    Ok(tally)
}

/// Through a transaction pooler: one connection writes a request group
/// and the first message of the next (`Parse`), and the rest of it
/// (`Bind`, `Execute`, `Sync`) only after the first group's answer, while
/// other connections run statements back to back, as a network may
/// deliver a pipeline. A pooler that keeps the server until every message
/// it forwarded is answered runs both halves on one server; one that hands
/// it on at the first `ReadyForQuery` runs the second half elsewhere (an
/// error, or another client's statement). Whether every try kept it.
pub(crate) async fn held_to_the_end(
    config: &Config,
    evidence: &mut Evidence,
) -> Result<bool, Error> {
    let quick = format!("SELECT 1, {}", Backend::COLUMNS);
    let second = format!("SELECT 2, {}", Backend::COLUMNS);
    for attempt in 1..=TRIES {
        let mut own = Raw::open(config).await?;
        let mut others = Vec::with_capacity(CLIENTS - 1);
        for _ in 1..CLIENTS {
            others.push(Conn::open(config).await?);
        }
        let (mut head, mut rest) = (BytesMut::new(), BytesMut::new());
        raw::parse(&quick, &mut head)?;
        raw::bind_execute_sync(&mut head)?;
        raw::parse(&second, &mut head)?;
        raw::bind_execute_sync(&mut rest)?;
        let until = Instant::now() + Duration::from_millis(600);
        let own_side = async {
            own.send(&head).await?;
            let first = own.answer().await?;
            // Meanwhile the others are busy: a pooler that let the server
            // go has handed it on by now.
            tokio::time::sleep(Duration::from_millis(150)).await;
            own.send(&rest).await?;
            Ok::<_, Error>((first, own.answer().await?))
        };
        let (answers, wrong) = tokio::join!(own_side, busy(&others, until));
        let (first, then) = answers?;
        let server = |answer: &Answer, want: &str| match answer {
            Answer::Rows(rows) if rows.len() == 1 && rows[0][0].as_deref() == Some(want) => {
                Some(rows[0][1..].to_vec())
            }
            _ => None,
        };
        let kept = match (server(&first, "1"), server(&then, "2")) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        };
        if !kept || wrong > 0 {
            evidence.push(format!(
                "try {attempt}: a request group written in two pieces around an earlier \
                 answer got {then:?} (the earlier one {first:?}); {wrong} of the other \
                 connections' statements got a wrong answer or none: the pooler hands its \
                 server on while messages it forwarded are unanswered"
            ));
            return Ok(false);
        }
    }
    evidence.push(format!(
        "{TRIES} tries of a request group written in two pieces around an earlier answer, \
         other connections busy meanwhile: both halves ran on one server, every answer right"
    ));
    Ok(true)
}

/// Statements back to back on each connection until `until`: how many got
/// a wrong answer or none (each connection stops at its first).
async fn busy(clients: &[Conn], until: Instant) -> u64 {
    let wrong = join_all(clients.iter().enumerate().map(|(c, client)| async move {
        let mut id = (c as i64 + 1) * 1_000_000;
        while Instant::now() < until {
            id += 1;
            match client
                .rows("SELECT $1::pg_catalog.int8", &[(&id, Type::INT8)])
                .await
            {
                Ok(rows) if echoes(&rows, id) => {}
                _ => return 1,
            }
        }
        0
    }))
    .await;
    wrong.into_iter().sum()
}
