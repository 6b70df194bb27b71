//! What the rewriter knows of a connection's named statements: whether
//! each may share a group, learned from its `Parse`, and forgotten at its
//! `Close` or when it fails inside a group.

use rustc_hash::FxHashMap;

use super::cstring;
use crate::protocol::catalog::Catalog;

/// A statement name's key: what a request in flight keeps of the statement
/// it binds, to forget it as groupable when the server answers it with an
/// error inside a group.
#[inline]
pub(super) fn key(name: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = rustc_hash::FxHasher::default();
    name.hash(&mut hasher);
    hasher.finish()
}

/// The named statements of one connection that may share a group, by
/// [`key`]. A name is found only if it is the one stored under its key: two
/// names of one key keep the later, so a collision forgets a statement,
/// never lets one in.
#[derive(Debug, Default)]
pub(super) struct Groupable(FxHashMap<u64, Box<[u8]>>);

impl Groupable {
    /// Whether `name` (of key `key`) may share a group.
    #[inline]
    pub(super) fn has(&self, key: u64, name: &[u8]) -> bool {
        self.0.get(&key).is_some_and(|stored| **stored == *name)
    }

    #[cfg(test)]
    pub(super) fn contains(&self, name: &[u8]) -> bool {
        self.has(key(name), name)
    }

    pub(super) fn insert(&mut self, name: &[u8]) {
        if self.0.len() >= MAX_NAMES {
            self.0.clear();
        }
        self.0.insert(key(name), name.into());
    }

    pub(super) fn remove(&mut self, name: &[u8]) {
        self.forget(key(name));
    }

    /// Forgets the statement of key `key`.
    pub(super) fn forget(&mut self, key: u64) {
        self.0.remove(&key);
    }

    pub(super) fn clear(&mut self) {
        self.0.clear();
    }
}

/// Notes a named statement's SQL, from its `Parse` body; `reads`: it must
/// also plainly only read (see [`reads_only`](crate::protocol::sql_guard::reads_only)).
pub(super) fn learn(groupable: &mut Groupable, catalog: &Catalog, body: &[u8], reads: bool) {
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
        groupable.insert(name);
    } else {
        groupable.remove(name);
    }
}

/// Most statement names remembered as groupable (the pool's cache closes
/// what it evicts, so this bound is only a backstop).
const MAX_NAMES: usize = 4096;
