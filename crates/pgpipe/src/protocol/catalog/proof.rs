//! The reviewed lists the proof stands on, and the catalog query built
//! from them ([`CATALOG_SQL`], `proof.sql` beside this file).
//!
//! A statement is harmless when everything it can run is proven harmless:
//! every function it names, or reaches through what the objects it names
//! carry, is built in (below PostgreSQL's first normal object id, 16384)
//! and declared immutable or stable, or is on [`ALLOWED`]. Everything else
//! is code the guard cannot prove: user-defined functions in any language,
//! functions of extensions, volatile built-ins not listed here, and the
//! built-ins on [`DENIED`] that run SQL or a type's code named in text.
//! Deny by default: these lists are the only lists.
//!
//! What objects carry is read from the server's own parse: stored
//! expressions are `pg_node_tree` text, and every number in them that
//! follows a field not on [`NOT_IDS`] is taken as an object id (a number
//! taken wrongly costs a cleanup, never a leak). [`CALL_SITES`] names
//! every catalog column that can hold an expression or name a function,
//! with where the query follows it; a server with one more (a new major)
//! answers it as unclassified, and the pool then proves nothing there.

use std::sync::LazyLock;

use super::extensions::{REVIEWED_EXTENSIONS, UNDO};
use super::sites::CALL_SITES;

/// Volatile built-ins a statement may reach on a shared connection, with
/// the undo each needs.
pub(crate) const ALLOWED: &[(&str, &str)] = &[
    ("bernoulli", "nothing: a TABLESAMPLE method"),
    ("bthandler", "nothing: an index access method's handler"),
    ("brinhandler", "nothing: an index access method's handler"),
    ("clock_timestamp", "nothing: reads the clock"),
    (
        "gen_random_uuid",
        "nothing: draws from the strong source, not the session's",
    ),
    ("ginhandler", "nothing: an index access method's handler"),
    ("gisthandler", "nothing: an index access method's handler"),
    ("hashhandler", "nothing: an index access method's handler"),
    ("heap_tableam_handler", "nothing: the heap's handler"),
    (
        "nextval",
        "sequence state for currval() and lastval(), which are not on this list: \
         DISCARD SEQUENCES runs before every statement that can reach them",
    ),
    (
        "pg_advisory_xact_lock",
        "released when the statement's own transaction ends",
    ),
    (
        "pg_advisory_xact_lock_shared",
        "released when the statement's own transaction ends",
    ),
    (
        "pg_notify",
        "sent when the statement's own transaction commits",
    ),
    ("pg_sleep", "nothing"),
    ("pg_sleep_for", "nothing"),
    ("pg_sleep_until", "nothing"),
    (
        "pg_try_advisory_xact_lock",
        "released when the statement's own transaction ends",
    ),
    (
        "pg_try_advisory_xact_lock_shared",
        "released when the statement's own transaction ends",
    ),
    (
        "random",
        "nothing another task can see: advances the session's generator, which \
         every cleanup seeds again from the server's strong source",
    ),
    ("random_normal", "as random()"),
    (
        "RI_FKey_cascade_del",
        "nothing of its own: a foreign key's trigger, which runs SQL on the \
         tables the key names (followed by the closure)",
    ),
    ("RI_FKey_cascade_upd", "as RI_FKey_cascade_del"),
    ("RI_FKey_check_ins", "as RI_FKey_cascade_del"),
    ("RI_FKey_check_upd", "as RI_FKey_cascade_del"),
    ("RI_FKey_noaction_del", "as RI_FKey_cascade_del"),
    ("RI_FKey_noaction_upd", "as RI_FKey_cascade_del"),
    ("RI_FKey_restrict_del", "as RI_FKey_cascade_del"),
    ("RI_FKey_restrict_upd", "as RI_FKey_cascade_del"),
    ("RI_FKey_setdefault_del", "as RI_FKey_cascade_del"),
    ("RI_FKey_setdefault_upd", "as RI_FKey_cascade_del"),
    ("RI_FKey_setnull_del", "as RI_FKey_cascade_del"),
    ("RI_FKey_setnull_upd", "as RI_FKey_cascade_del"),
    (
        "setval",
        "as nextval: the session's sequence state, forgotten before code that can read it",
    ),
    ("spghandler", "nothing: an index access method's handler"),
    (
        "suppress_redundant_updates_trigger",
        "nothing: a trigger that compares rows",
    ),
    ("system", "nothing: a TABLESAMPLE method"),
    ("timeofday", "nothing: reads the clock"),
    (
        "tsvector_update_trigger",
        "nothing: a trigger that computes a column",
    ),
    (
        "tsvector_update_trigger_column",
        "as tsvector_update_trigger",
    ),
    (
        "unique_key_recheck",
        "nothing: a deferred unique constraint's trigger",
    ),
];

/// Built-ins declared immutable or stable that still run code the proof
/// cannot see: SQL given as text, a relation or a type named in text.
pub(crate) const DENIED: &[&str] = &[
    "array_in",
    "array_recv",
    "database_to_xml",
    "database_to_xml_and_xmlschema",
    "database_to_xmlschema",
    "domain_in",
    "domain_recv",
    "multirange_in",
    "multirange_recv",
    "pg_input_error_info",
    "pg_input_is_valid",
    "range_in",
    "range_recv",
    "record_in",
    "record_recv",
    "schema_to_xml",
    "schema_to_xml_and_xmlschema",
    "schema_to_xmlschema",
    "table_to_xml",
    "table_to_xml_and_xmlschema",
    "table_to_xmlschema",
    "ts_rewrite",
    "ts_stat",
];

/// A container type's own input and output functions: they run the
/// element, field or base type's, which the closure follows edge by edge.
/// Called by name they take a type by id and are on [`DENIED`].
pub(crate) const GENERIC: &[&str] = &[
    "array_in",
    "array_out",
    "array_recv",
    "array_send",
    "domain_in",
    "domain_recv",
    "multirange_in",
    "multirange_out",
    "multirange_recv",
    "multirange_send",
    "range_in",
    "range_out",
    "range_recv",
    "range_send",
    "record_in",
    "record_out",
    "record_recv",
    "record_send",
];

/// Proven functions whose effect lasts until the end of the transaction
/// it runs in: harmless in a statement's own implicit transaction, but a
/// read group's later members would see it (its transaction id, its
/// locks, its notifications).
pub(crate) const BREAKING: &[&str] = &[
    "pg_advisory_xact_lock",
    "pg_advisory_xact_lock_shared",
    "pg_current_xact_id",
    "pg_current_xact_id_if_assigned",
    "pg_notify",
    "pg_try_advisory_xact_lock",
    "pg_try_advisory_xact_lock_shared",
    "txid_current",
    "txid_current_if_assigned",
];

/// Fields of PostgreSQL's parse trees whose numbers are not object ids
/// (positions, counts, attribute numbers, enum values, a Const's bytes).
/// Every other field's number is taken as an id.
pub(crate) const NOT_IDS: &[&str] = &[
    "aggno",
    "aggsplit",
    "agglevelsup",
    "aggtransno",
    "checkAsUser",
    "cmd",
    "coerceformat",
    "coercionformat",
    "commandType",
    "constlen",
    "consttypmod",
    "constvalue",
    "cursorOptions",
    "fieldnum",
    "frameOptions",
    "funccolcount",
    "funcformat",
    "jointype",
    "kind",
    "limitOption",
    "location",
    "modulus",
    "ncolumns",
    "nulltesttype",
    "number",
    "onConflictAction",
    "override",
    "paramid",
    "paramkind",
    "paramtypmod",
    "partnatts",
    "querySource",
    "reftypmod",
    "relabelformat",
    "rellockmode",
    "remainder",
    "requiredPerms",
    "resno",
    "resorigcol",
    "resultRelation",
    "resulttypmod",
    "ressortgroupref",
    "rowcompare_type",
    "rtekind",
    "rtindex",
    "stmt_len",
    "stmt_location",
    "strategy",
    "strength",
    "subLinkId",
    "subLinkType",
    "tleSortGroupRef",
    "typeMod",
    "typmod",
    "varattno",
    "varattnosyn",
    "varlevelsup",
    "varno",
    "varnosyn",
    "vartypmod",
    "waitPolicy",
    "winref",
];

/// The edges of the server's own stored expressions, read once per lane
/// (`builtin.sql`): one row, one `int8[]`, passed to [`CATALOG_SQL`] as
/// `$1`.
pub(crate) static BUILTIN_SQL: LazyLock<String> = LazyLock::new(|| {
    format!("/* pgpipe */ {}", include_str!("builtin.sql"))
        .replace("$STORED$", include_str!("stored.sql"))
});

/// The catalog query: `proof.sql` with the lists filled in; `$1` is
/// [`BUILTIN_SQL`]'s answer.
pub(crate) static CATALOG_SQL: LazyLock<String> = LazyLock::new(|| {
    let list = |names: &mut dyn Iterator<Item = &str>| names.collect::<Vec<_>>().join(",");
    let undo = UNDO
        .iter()
        .map(|(extension, sql)| {
            format!(
                "SELECT pg_catalog.format('{}', n.nspname) FROM pg_catalog.pg_extension e \
                 JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace \
                 WHERE e.extname = '{extension}'",
                sql.replace('\'', "''")
            )
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let reviewed = list(&mut REVIEWED_EXTENSIONS.iter().copied());
    // Marked as the pool's own, as its other SQL is.
    format!("/* pgpipe */ {}", include_str!("proof.sql"))
        .replace("$STORED$", include_str!("stored.sql"))
        .replace("$ALLOWED$", &list(&mut ALLOWED.iter().map(|(n, _)| *n)))
        .replace("$DENIED$", &list(&mut DENIED.iter().copied()))
        .replace("$GENERIC$", &list(&mut GENERIC.iter().copied()))
        .replace("$BREAKING$", &list(&mut BREAKING.iter().copied()))
        .replace("$NOT_IDS$", &list(&mut NOT_IDS.iter().copied()))
        .replace(
            "$CALL_SITES$",
            &list(&mut CALL_SITES.iter().map(|(s, _)| *s)),
        )
        .replace(
            "UNION SELECT 'c', $UNDO$",
            &format!(
                "UNION SELECT 'c', u FROM ({undo}) undo(u)\n\
                 UNION SELECT 'k', e.extname::pg_catalog.text FROM pg_catalog.pg_extension e\n \
                 WHERE e.extname::pg_catalog.text <> ALL ('{{{reviewed}}}'::pg_catalog.text[])"
            ),
        )
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_list_is_filled_in_and_sorted() {
        assert!(!CATALOG_SQL.contains('$') || CATALOG_SQL.contains("$pgpipe$"));
        assert!(!CATALOG_SQL.contains("$ALLOWED$") && !CATALOG_SQL.contains("$UNDO$"));
        for list in [DENIED, GENERIC, BREAKING, REVIEWED_EXTENSIONS] {
            assert!(list.windows(2).all(|w| w[0] < w[1]), "{list:?}");
        }
        let sites: Vec<&str> = CALL_SITES.iter().map(|(s, _)| *s).collect();
        assert!(sites.windows(2).all(|w| w[0] < w[1]), "{sites:?}");
        // A denied name is never allowed.
        assert!(DENIED.iter().all(|d| ALLOWED.iter().all(|(a, _)| a != d)));
    }
}
