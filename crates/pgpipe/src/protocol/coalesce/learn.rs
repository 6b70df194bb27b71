//! What the rewriter knows of a connection's named statements: whether
//! each may share a group, learned from its `Parse`.

use super::cstring;
use crate::protocol::catalog::Catalog;

/// A statement name's key: what a request in flight keeps of the statement
/// it binds, to forget it as groupable if the server refuses it in a group
/// (a collision forgets one more, never keeps one).
pub(super) fn key(name: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = rustc_hash::FxHasher::default();
    name.hash(&mut hasher);
    hasher.finish()
}

/// Notes a named statement's SQL, from its `Parse` body; `reads`: it must
/// also plainly only read (see [`reads_only`](crate::protocol::sql_guard::reads_only)).
pub(super) fn learn(
    groupable: &mut rustc_hash::FxHashSet<Box<[u8]>>,
    catalog: &Catalog,
    body: &[u8],
    reads: bool,
) {
    let Some((name, rest)) = cstring(body) else {
        return;
    };
    let Some((sql, _)) = cstring(rest) else {
        return;
    };
    let shares = !name.is_empty()
        && std::str::from_utf8(sql).is_ok_and(|sql| {
            crate::protocol::sql_guard::groupable(sql, catalog)
                && (!reads || crate::protocol::sql_guard::reads_only(sql))
        });
    if shares {
        if groupable.len() >= MAX_NAMES {
            groupable.clear();
        }
        groupable.insert(name.into());
    } else {
        groupable.remove(name);
    }
}

/// Most statement names remembered as groupable (the pool's cache closes
/// what it evicts, so this bound is only a backstop).
const MAX_NAMES: usize = 4096;
