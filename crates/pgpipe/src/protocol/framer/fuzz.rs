//! Property tests of the framer: a generated stream (typed messages of any
//! type and length, sometimes after a start-up packet or an SSLRequest,
//! sometimes ending in a length the protocol does not allow, or plain
//! noise) fed in random chunks hands out, for each [`Keep`], exactly the
//! messages a separate reading of the stream finds, with their first byte,
//! kept prefix, kept body and place, whatever the chunking: the one-step
//! path for whole messages and the byte-by-byte one for split messages
//! must agree. Nothing panics.
//!
//! `PROPTEST_CASES` sets the number of cases (default 256).

use proptest::prelude::*;
use proptest::test_runner::Config;

use super::*;

fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// A typed message: its type and body.
fn typed() -> impl Strategy<Value = (u8, Vec<u8>)> {
    let kind = prop_oneof![
        4 => prop::sample::select(b"BEPSCQDZ".to_vec()),
        1 => any::<u8>(),
    ];
    let body = prop_oneof![
        8 => prop::collection::vec(any::<u8>(), 0..80),
        2 => (0..4000usize, any::<u8>()).prop_map(|(n, b)| vec![b; n]),
        1 => (CAPTURED - 2..CAPTURED + 3, any::<u8>()).prop_map(|(n, b)| vec![b; n]),
    ];
    (kind, body)
}

/// How a stream starts: typed at once, a start-up packet, an SSLRequest.
#[derive(Debug, Clone, Copy)]
enum Start {
    Typed,
    Startup,
    Ssl,
}

/// A stream, and what a separate reading of it finds: each message's type
/// (0 for the start-up packet), body and place.
#[derive(Debug, Clone)]
struct Stream {
    start: Start,
    bytes: Vec<u8>,
    messages: Vec<(u8, Vec<u8>, u64, u64)>,
}

fn stream() -> impl Strategy<Value = Stream> {
    let start =
        prop_oneof![6 => Just(Start::Typed), 1 => Just(Start::Startup), 1 => Just(Start::Ssl)];
    // Nothing, a message cut short, or a length the protocol does not
    // allow (under 4) and noise after it: no message in any of them.
    let tail = prop_oneof![
        4 => Just(Vec::new()),
        1 => (any::<u8>(), 1..100u32, prop::collection::vec(any::<u8>(), 0..40))
            .prop_map(|(k, more, body)| {
                let len = body.len() as u32 + 4 + more;
                [&[k][..], &len.to_be_bytes(), &body].concat()
            }),
        1 => (any::<u8>(), -5..4i32, prop::collection::vec(any::<u8>(), 0..40))
            .prop_map(|(k, n, noise)| [&[k][..], &n.to_be_bytes(), &noise].concat()),
    ];
    let typed = prop::collection::vec(typed(), 0..30);
    (start, typed, tail).prop_map(|(start, typed, tail)| {
        let mut bytes = Vec::new();
        let mut messages = Vec::new();
        match start {
            Start::Typed => {}
            Start::Startup => {
                bytes.extend_from_slice(&[0, 0, 0, 12, 0, 3, 0, 0, b'u', 0, b'x', 0]);
                messages.push((0, vec![b'u', 0, b'x', 0], 0, 12));
            }
            Start::Ssl => {
                bytes.extend_from_slice(&[0, 0, 0, 8]);
                bytes.extend_from_slice(&SSL_REQUEST.to_be_bytes());
            }
        }
        for (kind, body) in typed {
            let start = bytes.len() as u64;
            bytes.push(kind);
            bytes.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
            bytes.extend_from_slice(&body);
            messages.push((kind, body, start, bytes.len() as u64));
        }
        bytes.extend_from_slice(&tail);
        Stream {
            start,
            bytes,
            messages,
        }
    })
}

/// Every field of every message `K`'s framer hands out for `bytes` fed in
/// chunks of the given sizes (cycled), with capture on or off; and the
/// framer's phase and offset at the end.
fn walk<K: Keep>(s: &Stream, sizes: &[usize], capture: bool) -> (Vec<String>, Phase, u64) {
    let phase = match s.start {
        Start::Typed => Phase::Typed,
        Start::Startup | Start::Ssl => Phase::Startup,
    };
    let mut framer = Framer::<K>::keeping(phase);
    framer.capture_sql(capture);
    let mut seen = Vec::new();
    let mut rest = &s.bytes[..];
    for &size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (mut chunk, more) = rest.split_at(size.min(rest.len()));
        rest = more;
        while let Some(m) = framer.next(&mut chunk) {
            seen.push(format!("{m:?}"));
        }
        // Past what it can parse, it walks no further.
        let stopped = matches!(framer.phase, Phase::Opaque | Phase::Negotiating);
        assert!(
            chunk.is_empty() || stopped,
            "next leaves nothing of a chunk"
        );
    }
    (seen, framer.phase, framer.offset())
}

/// What `K`'s framer should hand out for `s`, from the separate reading.
fn expected<K: Keep>(s: &Stream, capture: bool) -> Vec<String> {
    if matches!(s.start, Start::Ssl) {
        return Vec::new();
    }
    s.messages
        .iter()
        .map(|(kind, body, start, end)| {
            let mut prefix = K::EMPTY;
            let kept = if K::prefix(*kind) {
                let n = body.len().min(prefix.as_ref().len());
                prefix.as_mut()[..n].copy_from_slice(&body[..n]);
                n
            } else {
                0
            };
            let whole = (capture && K::whole(*kind)).then(|| {
                if body.len() > CAPTURED {
                    Err(&body[..CAPTURED])
                } else {
                    Ok(&body[..])
                }
            });
            let m = Message {
                kind: *kind,
                first: body.first().copied(),
                prefix: &prefix.as_ref()[..kept],
                body: whole,
                start: if K::OFFSETS { *start } else { 0 },
                end: if K::OFFSETS { *end } else { 0 },
            };
            format!("{m:?}")
        })
        .collect()
}

fn check<K: Keep>(s: &Stream, sizes: &[usize], capture: bool) -> Result<(), TestCaseError> {
    let (seen, phase, offset) = walk::<K>(s, sizes, capture);
    prop_assert_eq!(&seen, &expected::<K>(s, capture));
    // The same end state as one feed of the whole stream.
    let (_, whole_phase, whole_offset) = walk::<K>(s, &[s.bytes.len().max(1)], capture);
    prop_assert_eq!(phase, whole_phase);
    prop_assert_eq!(offset, whole_offset);
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_chunking_frames_the_messages_a_separate_reading_finds(
        s in stream(),
        sizes in prop::collection::vec(prop_oneof![1..6usize, 6..300usize, 300..70_000usize], 1..12),
        capture: bool,
    ) {
        check::<Tap>(&s, &sizes, capture)?;
        check::<Writes>(&s, &sizes, capture)?;
        check::<Answers>(&s, &sizes, capture)?;
    }

    #[test]
    fn noise_never_panics(
        bytes in prop::collection::vec(any::<u8>(), 0..600),
        sizes in prop::collection::vec(1..40usize, 1..8),
        startup: bool,
    ) {
        let start = if startup { Start::Startup } else { Start::Typed };
        let s = Stream { start, bytes, messages: Vec::new() };
        for capture in [false, true] {
            prop_assert_eq!(walk::<Writes>(&s, &sizes, capture), walk::<Writes>(&s, &[1], capture));
            prop_assert_eq!(walk::<Tap>(&s, &sizes, capture), walk::<Tap>(&s, &[1], capture));
        }
    }
}
