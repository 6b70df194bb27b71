//! One prepared-statement cache per connection, shared by every task that
//! runs queries on it.
//!
//! - **In-flight dedup.** When N tasks miss the same SQL at once, one of them
//!   gets a [`Ticket`] and prepares; the others wait for its result. Sending
//!   N `Parse` messages for one name is exactly the bug node-postgres' first
//!   pipelining PR hit ("prepared statement … already exists").
//! - **Cancellation.** A ticket dropped before it completes (its task was
//!   cancelled) removes the pending entry and wakes the waiters, who retry:
//!   nobody is stranded.
//! - **Bounded.** At most `capacity` statements; on overflow the least
//!   recently used one is dropped, and tokio-postgres closes it on the server
//!   once no query is still using it.
//! - **Self-healing.** [`invalidate`](StatementCache::invalidate) drops an
//!   entry that the server no longer accepts (`0A000 cached plan must not
//!   change result type`, `26000`), so the next lookup prepares it again.
//!
//! Hits take a read lock and bump an atomic "last used" tick; only misses and
//! evictions take the write lock. Keys hash with FxHash, not SipHash: the
//! table holds at most `capacity` entries, so a flood of colliding keys
//! costs at most that many comparisons, and SipHash cost ~230 instructions
//! per query on the hot path.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use rustc_hash::FxHashMap;
use tokio::sync::watch;
use tokio_postgres::Statement;

use crate::sync::{read_lock, write_lock};

/// What a prepare produced, as handed to every task waiting for it.
pub(crate) type Prepared<S = Statement> = Result<S, Arc<tokio_postgres::Error>>;

/// A statement cache; see the module docs. Generic over what it caches
/// only so that its bookkeeping can be unit-tested without a server.
pub(crate) struct StatementCache<S = Statement> {
    capacity: usize,
    entries: RwLock<FxHashMap<Arc<str>, Entry<S>>>,
    clock: AtomicU64,
    generations: AtomicU64,
    /// Statements evicted and not yet counted in the metrics.
    evicted: AtomicU64,
}

struct Entry<S> {
    generation: u64,
    last_used: AtomicU64,
    state: EntryState<S>,
}

enum EntryState<S> {
    Ready(S),
    Pending(watch::Receiver<Option<Prepared<S>>>),
}

/// The answer to a lookup.
pub(crate) enum Lookup<S = Statement> {
    /// Cached; the `u64` identifies this entry for [`StatementCache::invalidate`].
    Ready(S, u64),
    /// Another task is preparing it: wait with [`wait`]. The `u64` is as for
    /// `Ready`.
    Pending(watch::Receiver<Option<Prepared<S>>>, u64),
    /// Nobody has it: prepare it and [`complete`](StatementCache::complete).
    Miss(Ticket<S>),
}

/// The right, and the duty, to prepare one SQL text for the cache.
pub(crate) struct Ticket<S = Statement> {
    cache: Arc<StatementCache<S>>,
    sql: Arc<str>,
    generation: u64,
    sender: Option<watch::Sender<Option<Prepared<S>>>>,
}

impl<S> StatementCache<S> {
    pub(crate) fn new(capacity: usize) -> Arc<StatementCache<S>> {
        Arc::new(StatementCache {
            capacity: capacity.max(1),
            entries: RwLock::new(FxHashMap::default()),
            clock: AtomicU64::new(0),
            generations: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        })
    }

    /// The statement for `sql` if it is cached and ready; nothing is
    /// registered when it is not (then [`lookup`](StatementCache::lookup)).
    #[inline]
    pub(crate) fn get(&self, sql: &str) -> Option<(S, u64)>
    where
        S: Clone,
    {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        match read_lock(&self.entries).get(sql)?.answer(now) {
            Lookup::Ready(statement, generation) => Some((statement, generation)),
            _ => None,
        }
    }

    /// Looks `sql` up, registering a pending entry on a miss.
    pub(crate) fn lookup(self: &Arc<Self>, sql: &str) -> Lookup<S>
    where
        S: Clone,
    {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        {
            let entries = read_lock(&self.entries);
            if let Some(found) = entries.get(sql) {
                return found.answer(now);
            }
        }
        let mut entries = write_lock(&self.entries);
        if let Some(found) = entries.get(sql) {
            return found.answer(now);
        }
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = watch::channel(None);
        let sql: Arc<str> = Arc::from(sql);
        entries.insert(
            Arc::clone(&sql),
            Entry {
                generation,
                last_used: AtomicU64::new(now),
                state: EntryState::Pending(receiver),
            },
        );
        Lookup::Miss(Ticket {
            cache: Arc::clone(self),
            sql,
            generation,
            sender: Some(sender),
        })
    }

    /// Stores the result of a prepare and hands it to the waiters. A failed
    /// prepare is not cached: the next lookup tries again.
    pub(crate) fn complete(&self, mut ticket: Ticket<S>, result: Prepared<S>) -> u64
    where
        S: Clone,
    {
        {
            let mut entries = write_lock(&self.entries);
            let ours =
                matches!(entries.get(&ticket.sql), Some(e) if e.generation == ticket.generation);
            if ours {
                match &result {
                    Ok(statement) => {
                        if let Some(entry) = entries.get_mut(&ticket.sql) {
                            entry.state = EntryState::Ready(statement.clone());
                        }
                        self.evict_beyond_capacity(&mut entries);
                    }
                    Err(_) => {
                        entries.remove(&ticket.sql);
                    }
                }
            }
        }
        if let Some(sender) = ticket.sender.take() {
            sender.send_replace(Some(result));
        }
        ticket.generation
    }

    /// Statements evicted since the last call (for the metrics).
    pub(crate) fn take_evicted(&self) -> u64 {
        self.evicted.swap(0, Ordering::Relaxed)
    }

    /// Drops the entry for `sql` if it is still the one identified by
    /// `generation` (a concurrent task may already have replaced it).
    pub(crate) fn invalidate(&self, sql: &str, generation: u64) {
        let mut entries = write_lock(&self.entries);
        if matches!(entries.get(sql), Some(e) if e.generation == generation) {
            entries.remove(sql);
        }
    }

    /// Number of cached (ready) statements.
    pub(crate) fn len(&self) -> usize {
        let entries = read_lock(&self.entries);
        entries
            .values()
            .filter(|e| matches!(e.state, EntryState::Ready(_)))
            .count()
    }

    fn evict_beyond_capacity(&self, entries: &mut FxHashMap<Arc<str>, Entry<S>>) {
        let mut ready = entries
            .values()
            .filter(|e| matches!(e.state, EntryState::Ready(_)))
            .count();
        while ready > self.capacity {
            let oldest = entries
                .iter()
                .filter(|(_, e)| matches!(e.state, EntryState::Ready(_)))
                .min_by_key(|(_, e)| e.last_used.load(Ordering::Relaxed))
                .map(|(sql, _)| Arc::clone(sql));
            match oldest {
                Some(sql) => {
                    entries.remove(&sql);
                    ready -= 1;
                    self.evicted.fetch_add(1, Ordering::Relaxed);
                }
                None => break,
            }
        }
    }
}

impl<S: Clone> Entry<S> {
    fn answer(&self, now: u64) -> Lookup<S> {
        self.last_used.store(now, Ordering::Relaxed);
        match &self.state {
            EntryState::Ready(statement) => Lookup::Ready(statement.clone(), self.generation),
            EntryState::Pending(receiver) => Lookup::Pending(receiver.clone(), self.generation),
        }
    }
}

impl<S> Ticket<S> {
    /// The SQL this ticket prepares.
    pub(crate) fn sql(&self) -> &str {
        &self.sql
    }
}

impl<S> Drop for Ticket<S> {
    fn drop(&mut self) {
        if self.sender.is_some() {
            // Never completed: its task was cancelled. Remove the pending
            // entry; dropping the sender wakes the waiters, who look again.
            self.cache.invalidate(&self.sql, self.generation);
        }
    }
}

/// Waits for another task's prepare. `None` means that task was cancelled
/// and the caller should look up again.
pub(crate) async fn wait<S: Clone>(
    mut receiver: watch::Receiver<Option<Prepared<S>>>,
) -> Option<Prepared<S>> {
    let answer = match receiver.wait_for(Option::is_some).await {
        Ok(value) => value.clone(),
        Err(_) => None,
    };
    // The sender may have completed just before going away.
    answer.or_else(|| receiver.borrow().clone())
}

impl<S> fmt::Debug for StatementCache<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatementCache")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .finish()
    }
}

impl<S> fmt::Debug for Ticket<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stands in for a prepared statement: which prepare made it.
    type Cache = StatementCache<u32>;

    fn ready(cache: &Arc<Cache>, sql: &str) -> Option<(u32, u64)> {
        match cache.lookup(sql) {
            Lookup::Ready(statement, generation) => Some((statement, generation)),
            _ => None,
        }
    }

    fn prepare(cache: &Arc<Cache>, sql: &str, statement: u32) -> u64 {
        match cache.lookup(sql) {
            Lookup::Miss(ticket) => cache.complete(ticket, Ok(statement)),
            _ => panic!("{sql} was expected to miss"),
        }
    }

    #[tokio::test]
    async fn concurrent_misses_prepare_once_and_share_the_result() {
        let cache = Cache::new(8);
        let Lookup::Miss(ticket) = cache.lookup("SELECT 1") else {
            panic!("first lookup misses")
        };
        let Lookup::Pending(receiver, _) = cache.lookup("SELECT 1") else {
            panic!("second lookup waits for the first")
        };
        let waiter = tokio::spawn(wait(receiver));
        cache.complete(ticket, Ok(7));
        assert_eq!(waiter.await.unwrap().unwrap().unwrap(), 7);
        assert_eq!(ready(&cache, "SELECT 1").map(|(s, _)| s), Some(7));
    }

    #[tokio::test]
    async fn a_cancelled_preparer_wakes_its_waiters_to_look_again() {
        let cache = Cache::new(8);
        let Lookup::Miss(ticket) = cache.lookup("SELECT 1") else {
            panic!("first lookup misses")
        };
        let Lookup::Pending(receiver, _) = cache.lookup("SELECT 1") else {
            panic!("second lookup waits")
        };
        drop(ticket); // its task was cancelled
        assert!(wait(receiver).await.is_none(), "told to look again");
        assert!(matches!(cache.lookup("SELECT 1"), Lookup::Miss(_)));
    }

    #[test]
    fn the_least_recently_used_statement_is_evicted_past_capacity() {
        let cache = Cache::new(2);
        prepare(&cache, "a", 1);
        prepare(&cache, "b", 2);
        assert!(ready(&cache, "a").is_some()); // "b" is now the oldest
        prepare(&cache, "c", 3);
        assert_eq!(cache.len(), 2);
        assert!(ready(&cache, "b").is_none(), "evicted");
        assert!(ready(&cache, "a").is_some() && ready(&cache, "c").is_some());
    }

    #[test]
    fn invalidation_drops_only_the_generation_it_names() {
        let cache = Cache::new(8);
        let old = prepare(&cache, "SELECT *", 1);
        cache.invalidate("SELECT *", old);
        let new = prepare(&cache, "SELECT *", 2);
        assert_ne!(old, new);
        // A late invalidation of the old plan leaves the new one alone.
        cache.invalidate("SELECT *", old);
        assert_eq!(ready(&cache, "SELECT *"), Some((2, new)));
    }
}
