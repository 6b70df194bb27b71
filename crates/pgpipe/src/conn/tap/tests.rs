//! The tap over bytes: counts, and the watch's verdicts applied to the
//! connection's state (the rules themselves are tested in
//! `protocol::watch`).

use std::sync::Arc;

use super::TappedStream;
use crate::conn::PoolWire;
use crate::conn::state::ConnState;
use crate::metrics::QuarantineReason;
use crate::protocol::framer::SSL_REQUEST;

#[test]
fn a_refused_ssl_request_falls_back_to_plaintext() {
    let state = Arc::new(ConnState::default());
    let mut tap = TappedStream::new((), Arc::clone(&state), Arc::new(PoolWire::default()));
    let mut ssl = vec![0, 0, 0, 8];
    ssl.extend_from_slice(&SSL_REQUEST.to_be_bytes());
    tap.observe_write(&ssl, None);
    tap.observe_read(b"N");
    let startup = [0, 0, 0, 9, 0, 3, 0, 0, 0];
    tap.observe_write(&startup, None);
    tap.observe_read(&[b'Z', 0, 0, 0, 5, b'I']);
    let counts = (state.counts.requests(), state.counts.readies());
    assert_eq!(counts, (1, 1));
}

#[test]
fn an_accepted_ssl_request_makes_the_raw_stream_opaque() {
    let state = Arc::new(ConnState::default());
    let mut tap = TappedStream::new((), Arc::clone(&state), Arc::new(PoolWire::default()));
    let mut ssl = vec![0, 0, 0, 8];
    ssl.extend_from_slice(&SSL_REQUEST.to_be_bytes());
    tap.observe_write(&ssl, None);
    tap.observe_read(b"S\x16\x03\x03");
    tap.observe_write(&[b'S', 0, 0, 0, 4], None);
    assert_eq!(state.counts.requests(), 0, "ciphertext is not parsed");
}

fn simple_query(sql: &str) -> Vec<u8> {
    let mut message = vec![b'Q'];
    message.extend_from_slice(&(sql.len() as i32 + 5).to_be_bytes());
    message.extend_from_slice(sql.as_bytes());
    message.push(0);
    message
}

const SYNC: [u8; 5] = [b'S', 0, 0, 0, 4];

fn ready(status: u8) -> [u8; 6] {
    [b'Z', 0, 0, 0, 5, status]
}

/// A tap on a shared connection, past start-up.
fn shared_tap() -> (Arc<ConnState>, TappedStream<()>) {
    let state = Arc::new(ConnState::default());
    state.load.share();
    let mut tap = TappedStream::new((), Arc::clone(&state), Arc::new(PoolWire::default()));
    tap.observe_write(&[0, 0, 0, 9, 0, 3, 0, 0, 0], None);
    tap.observe_read(&ready(b'I')); // start-up is over
    (state, tap)
}

/// A shared connection carrying one atomic batch (BEGIN, two items,
/// COMMIT) between two plain queries: only the batch's own answers may
/// show its transaction.
#[test]
fn only_an_atomic_batchs_own_answers_may_show_its_transaction() {
    let shared = || {
        let (state, mut tap) = shared_tap();
        let write = [
            &SYNC[..],
            &simple_query("BEGIN"),
            &SYNC,
            &SYNC,
            &simple_query("COMMIT"),
            &SYNC,
        ]
        .concat();
        tap.observe_write(&write, None);
        (state, tap)
    };
    // The batch's answers show it, the rest do not: nothing happens.
    let (state, mut tap) = shared();
    for status in [b'I', b'T', b'T', b'E', b'I', b'I'] {
        tap.observe_read(&ready(status));
    }
    assert!(!state.session.is_quarantined());
    // The query before it in a transaction: quarantined.
    let (state, mut tap) = shared();
    tap.observe_read(&ready(b'T'));
    assert!(state.session.is_quarantined());
    // A COMMIT that leaves one open: quarantined.
    let (state, mut tap) = shared();
    for status in [b'I', b'T', b'T', b'T', b'T'] {
        tap.observe_read(&ready(status));
    }
    assert!(state.session.is_quarantined());
    // The query after it in a transaction: quarantined.
    let (state, mut tap) = shared();
    for status in [b'I', b'T', b'T', b'T', b'I', b'T'] {
        tap.observe_read(&ready(status));
    }
    assert!(state.session.is_quarantined());
    // BEGIN written (and answered) before the rest of its batch: the
    // batch still covers the rest.
    let (state, mut tap) = shared_tap();
    tap.observe_write(&simple_query("BEGIN"), None);
    tap.observe_read(&ready(b'T'));
    tap.observe_write(&[&SYNC[..], &simple_query("COMMIT")].concat(), None);
    for status in [b'T', b'I'] {
        tap.observe_read(&ready(status));
    }
    assert!(!state.session.is_quarantined());
    // Its COMMIT written once the connection was no longer shared: the
    // batch is forgotten, and covers nothing after.
    let (state, mut tap) = shared_tap();
    tap.observe_write(&simple_query("BEGIN"), None);
    state.load.unshare();
    tap.observe_write(&simple_query("COMMIT"), None);
    state.load.share();
    tap.observe_write(&SYNC, None);
    for status in [b'T', b'I', b'T'] {
        tap.observe_read(&ready(status));
    }
    assert!(state.session.is_quarantined());
    // Written while the connection was exclusive: no batch is known.
    let state = Arc::new(ConnState::default());
    let mut tap = TappedStream::new((), Arc::clone(&state), Arc::new(PoolWire::default()));
    tap.observe_write(&[0, 0, 0, 9, 0, 3, 0, 0, 0], None);
    tap.observe_read(&ready(b'I'));
    tap.observe_write(&[&simple_query("BEGIN")[..], &SYNC].concat(), None);
    state.load.share();
    tap.observe_read(&ready(b'T'));
    assert!(state.session.is_quarantined());
}

fn parameter_status(name: &str, value: &str) -> Vec<u8> {
    let body = [name.as_bytes(), b"\0", value.as_bytes(), b"\0"].concat();
    let mut message = vec![b'S'];
    message.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
    message.extend_from_slice(&body);
    message
}

#[test]
fn a_changed_session_setting_quarantines_and_a_promotion_is_a_role_change() {
    let tapped = || {
        let state = Arc::new(ConnState::default());
        state.load.share();
        let wire = Arc::new(PoolWire::default());
        let signal = Arc::new(tokio::sync::Notify::new());
        wire.on_host(Arc::new(crate::conn::HostSignal::new(Arc::clone(&signal))));
        let mut tap = TappedStream::new((), Arc::clone(&state), wire);
        tap.observe_read(&[b'Z', 0, 0, 0, 5, b'I']); // start-up is over
        (state, tap, signal)
    };
    let (state, mut tap, signal) = tapped();
    tap.observe_read(&parameter_status("in_hot_standby", "off"));
    assert_eq!(
        state.session.quarantine_reason(),
        Some(QuarantineReason::RoleChange),
        "a promotion retires the connection as a role change, not session state"
    );
    let woken = signal.notified();
    tokio::pin!(woken);
    assert!(
        woken.as_mut().enable(),
        "the pool's monitor is told at once"
    );
    let (state, mut tap, _) = tapped();
    tap.observe_read(&parameter_status("server_version", "16"));
    assert!(
        !state.session.is_quarantined(),
        "server state is no session's doing"
    );
    tap.observe_read(&parameter_status("application_name", "x"));
    assert_eq!(
        state.session.quarantine_reason(),
        Some(QuarantineReason::SessionState)
    );
}
