//! Extensions and the per-backend state they keep: which were reviewed,
//! and the undo the cleanup runs for those that keep state it can take
//! back.

/// Extensions reviewed for per-backend state: none beyond settings
/// (`RESET ALL` undoes them) and caches no query can tell apart, or an
/// undo the cleanup runs ([`UNDO`]). Any other installed extension's
/// code may keep state no cleanup takes back: there, code the guard
/// cannot prove is refused on the shared path, and closes an exclusive
/// connection when it comes back.
pub(crate) const REVIEWED_EXTENSIONS: &[&str] = &[
    "address_standardizer",
    "amcheck",
    "bloom",
    "btree_gin",
    "btree_gist",
    "citext",
    "cube",
    "dblink",
    "dict_int",
    "dict_xsyn",
    "earthdistance",
    "fuzzystrmatch",
    "hstore",
    "intagg",
    "intarray",
    "isn",
    "lo",
    "ltree",
    "pageinspect",
    "pg_buffercache",
    "pg_freespacemap",
    "pg_prewarm",
    "pg_stat_statements",
    "pg_trgm",
    "pg_visibility",
    "pgcrypto",
    "pgrowlocks",
    "pgstattuple",
    "plpgsql",
    "postgis",
    "postgis_raster",
    "postgis_topology",
    "postgres_fdw",
    "seg",
    "sslinfo",
    "tablefunc",
    "tcn",
    "tsm_system_rows",
    "tsm_system_time",
    "unaccent",
    "uuid-ossp",
    "vector",
];

/// The per-backend state of a reviewed extension that the cleanup takes
/// back: `%1$I` is the extension's schema.
pub(crate) const UNDO: &[(&str, &str)] = &[
    ("postgres_fdw", "SELECT %1$I.postgres_fdw_disconnect_all()"),
    (
        "dblink",
        "SELECT %1$I.dblink_disconnect(c) FROM pg_catalog.unnest(%1$I.dblink_get_connections()) c; \
         DO $pgpipe$ BEGIN PERFORM %1$I.dblink_disconnect(); \
         EXCEPTION WHEN OTHERS THEN NULL; END $pgpipe$",
    ),
];
