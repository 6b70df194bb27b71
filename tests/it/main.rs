//! pgpipe's integration tests. Every test talks to a real PostgreSQL (see
//! `pgpipe-test-support` for how it is found), shares it with other tests,
//! and uses names of its own.

mod atomic_units;
mod bad_input;
mod batch;
mod correctness;
mod counted;
mod dashboards;
mod executor;
mod failover;
mod faults;
mod guard_catalog;
mod guard_globals;
mod guard_lexical;
mod hol;
mod hooks;
mod hygiene;
mod lifecycle;
mod listener;
mod metrics;
mod overload;
mod owned_transactions;
mod pooler_transactions;
mod pooler_wire;
mod poolers;
mod porting;
mod primary_groups;
mod quarantine;
mod read_groups;
mod replicas;
mod restart;
mod routing;
mod session_safety;
mod sessions;
mod settings;
mod stalls;
mod statements;
mod storm;
mod support;
mod timeouts;
mod tls;
mod tls_modes;
mod transaction_modes;
mod truthful;
mod unnamed;
mod wire_batching;
