//! The read-only head of a group on a session that is not read-only of
//! itself ([`Grouping::ReadOnlyHead`](super::Grouping::ReadOnlyHead)), and
//! the look-ahead that keeps anything but a plain read out of such a group.

use super::cstring;
use super::learn::{Groupable, key};

/// The head of a group on a session that is not read-only of itself:
/// `transaction_read_only` for the group's implicit transaction, which
/// ends at its `Sync` (`set_config(…, true)`; `SET LOCAL` would warn
/// outside a transaction block).
const HEAD_SQL: &[u8] = b"SELECT set_config('transaction_read_only', 'on', true)";

/// The name the head is prepared under, once per connection (see
/// [`prepare_head`]): a protocol-level statement, so the session cleanup,
/// which deallocates only those prepared by SQL, keeps it.
const HEAD_NAME: &[u8] = b"pgpipe_read_only_head";

/// `Parse` of [`HEAD_SQL`] as [`HEAD_NAME`], and a `Sync` of its own: written
/// before a connection's first request, its answer taken.
pub(super) fn prepare_head(out: &mut Vec<u8>) {
    let parse_len = 4 + HEAD_NAME.len() + 1 + HEAD_SQL.len() + 1 + 2;
    out.push(b'P');
    out.extend_from_slice(&(parse_len as u32).to_be_bytes());
    out.extend_from_slice(HEAD_NAME);
    out.push(0);
    out.extend_from_slice(HEAD_SQL);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&[b'S', 0, 0, 0, 4]);
}

/// `Bind` of [`HEAD_NAME`] to the unnamed portal and `Execute` of it: the
/// head of one group. The unnamed portal is a grouped request's too, and
/// each `Bind` replaces it.
pub(super) fn head(out: &mut Vec<u8>) {
    let bind_len = 4 + 1 + HEAD_NAME.len() + 1 + 2 + 2 + 2;
    out.push(b'B');
    out.extend_from_slice(&(bind_len as u32).to_be_bytes());
    out.push(0);
    out.extend_from_slice(HEAD_NAME);
    // No formats, no parameters, no result formats.
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0]);
    // Execute: portal "", no row limit.
    out.extend_from_slice(&[b'E', 0, 0, 0, 9, 0, 0, 0, 0, 0]);
}

/// Whether `next` starts with one whole request that may share a group
/// behind a read-only head: `Bind` of the unnamed portal to a statement
/// learned groupable, `Execute` of it with no row limit, `Sync`. If so, the
/// [`key`] of its statement.
pub(super) fn plain_read(next: &[u8], groupable: &Groupable) -> Option<u64> {
    /// `Execute` of the unnamed portal with no row limit, then `Sync`: the
    /// only bytes that may follow such a `Bind`.
    const EXECUTE_SYNC: [u8; 15] = [b'E', 0, 0, 0, 9, 0, 0, 0, 0, 0, b'S', 0, 0, 0, 4];
    let (&kind, rest) = next.split_first()?;
    let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    if kind != b'B' || len < 4 {
        return None;
    }
    let (bind, rest) = (rest.get(4..len)?, &rest[len..]);
    if !rest.starts_with(&EXECUTE_SYNC) {
        return None;
    }
    // Portal "", then the statement's name.
    let (b"", rest) = cstring(bind)? else {
        return None;
    };
    let (name, _) = cstring(rest)?;
    let key = key(name);
    groupable.has(key, name).then_some(key)
}
