-- What a statement can run, proven from the server's own catalog (see
-- proof.rs, which fills in the $LISTS$ from its reviewed lists). Rows of a
-- kind and a name; the kinds are read by Catalog::from_rows.
WITH RECURSIVE
allowed(name) AS (SELECT pg_catalog.unnest('{$ALLOWED$}'::pg_catalog.text[])),
denied(name) AS (SELECT pg_catalog.unnest('{$DENIED$}'::pg_catalog.text[])),
generic(name) AS (SELECT pg_catalog.unnest('{$GENERIC$}'::pg_catalog.text[])),
breaking(name) AS (SELECT pg_catalog.unnest('{$BREAKING$}'::pg_catalog.text[])),
-- Each function by its own row: proven when built in (below the first
-- normal object id), declared immutable or stable and not on the denied
-- list, or on the allow-list.
own AS (
    SELECT p.oid, p.proname::pg_catalog.text AS name,
           NOT (p.oid < 16384
                AND p.proname::pg_catalog.text NOT IN (SELECT name FROM denied)
                AND (p.provolatile <> 'v'
                     OR p.proname::pg_catalog.text IN (SELECT name FROM allowed))) AS bad,
           p.proname::pg_catalog.text IN (SELECT name FROM generic) AS generic
      FROM pg_catalog.pg_proc p),
-- Unproven by its own row, or through what it carries: an aggregate's
-- support functions, a planner support function. (Its argument defaults
-- and SQL body are a user function's, unproven by its id, or a built-in's,
-- vouched for by its declared volatility.)
proc_bad(oid) AS (
    SELECT oid FROM own WHERE bad
    UNION SELECT a.aggfnoid FROM pg_catalog.pg_aggregate a, own o
     WHERE o.bad AND o.oid IN (a.aggtransfn, a.aggfinalfn, a.aggcombinefn, a.aggserialfn,
                               a.aggdeserialfn, a.aggmtransfn, a.aggminvtransfn, a.aggmfinalfn)
    UNION SELECT p.oid FROM pg_catalog.pg_proc p JOIN own o ON o.oid = p.prosupport WHERE o.bad),
op_bad(oid) AS (
    SELECT o.oid FROM pg_catalog.pg_operator o
     WHERE o.oprcode IN (SELECT oid FROM proc_bad) OR o.oprrest IN (SELECT oid FROM proc_bad)
        OR o.oprjoin IN (SELECT oid FROM proc_bad)),
family_bad(oid) AS (
    SELECT p.amprocfamily FROM pg_catalog.pg_amproc p WHERE p.amproc IN (SELECT oid FROM proc_bad)
    UNION SELECT a.amopfamily FROM pg_catalog.pg_amop a WHERE a.amopopr IN (SELECT oid FROM op_bad)),
am_bad(oid) AS (
    SELECT a.oid FROM pg_catalog.pg_am a WHERE a.amhandler IN (SELECT oid FROM proc_bad)),
-- Stored expressions (stored.sql).
stored(owner, tree) AS (
$STORED$),
-- Edges: using `owner` may run what `used` is. From a stored expression,
-- every number that follows a field not known to hold something other
-- than an object id, and every member of an oid list; from the catalog,
-- the ids its columns hold.
edge_rows(used, owner) AS (
    SELECT DISTINCT n::pg_catalog.int8, s.owner::pg_catalog.int8 FROM stored s,
           LATERAL (SELECT m[2] FROM pg_catalog.regexp_matches(s.tree, ':(\w+) (\d+)', 'g') m
                     WHERE s.owner >= 16384 AND m[1] <> ALL ('{$NOT_IDS$}'::pg_catalog.text[])
                    UNION ALL
                    SELECT pg_catalog.unnest(pg_catalog.string_to_array(m[1], ' '))
                      FROM pg_catalog.regexp_matches(s.tree, ':\w+ \(o ([\d ]*)\)', 'g') m
                     WHERE s.owner >= 16384) ids(n)
     WHERE n <> '' AND pg_catalog.length(n) < 11 AND n::pg_catalog.int8 < 4294967296
    -- The server's own objects' (builtin.sql, read once per lane: $1).
    UNION ALL SELECT e >> 32, e & 4294967295 FROM pg_catalog.unnest($1::pg_catalog.int8[]) e
    UNION ALL SELECT t.tgfoid, t.tgrelid FROM pg_catalog.pg_trigger t
    UNION ALL SELECT a.atttypid, a.attrelid FROM pg_catalog.pg_attribute a
     WHERE a.attnum > 0 AND NOT a.attisdropped
    UNION ALL SELECT c.relam, c.oid FROM pg_catalog.pg_class c WHERE c.relam <> 0
    UNION ALL SELECT i.indexrelid, i.indrelid FROM pg_catalog.pg_index i
    UNION ALL SELECT o.opcfamily, i.indexrelid FROM pg_catalog.pg_index i,
           pg_catalog.unnest(i.indclass::pg_catalog.oid[]) k
      JOIN pg_catalog.pg_opclass o ON o.oid = k
    UNION ALL SELECT w.fdwhandler, f.ftrelid FROM pg_catalog.pg_foreign_table f
      JOIN pg_catalog.pg_foreign_server s ON s.oid = f.ftserver
      JOIN pg_catalog.pg_foreign_data_wrapper w ON w.oid = s.srvfdw
    UNION ALL SELECT c.confrelid, c.conrelid FROM pg_catalog.pg_constraint c WHERE c.contype = 'f'
    UNION ALL SELECT c.conrelid, c.confrelid FROM pg_catalog.pg_constraint c WHERE c.contype = 'f'
    UNION ALL SELECT h.inhrelid, h.inhparent FROM pg_catalog.pg_inherits h
    UNION ALL SELECT h.inhparent, h.inhrelid FROM pg_catalog.pg_inherits h
    -- A container type's own I/O (record_in, array_in …) runs its
    -- elements' I/O, which the edges below follow.
    UNION ALL SELECT t.typinput, t.oid FROM pg_catalog.pg_type t
     WHERE t.typinput NOT IN (SELECT oid FROM own WHERE generic)
    UNION ALL SELECT t.typoutput, t.oid FROM pg_catalog.pg_type t
     WHERE t.typoutput NOT IN (SELECT oid FROM own WHERE generic)
    UNION ALL SELECT t.typreceive, t.oid FROM pg_catalog.pg_type t
     WHERE t.typreceive NOT IN (SELECT oid FROM own WHERE generic)
    UNION ALL SELECT t.typsend, t.oid FROM pg_catalog.pg_type t
     WHERE t.typsend NOT IN (SELECT oid FROM own WHERE generic)
    UNION ALL SELECT t.typmodin, t.oid FROM pg_catalog.pg_type t WHERE t.typmodin <> 0
    UNION ALL SELECT t.typmodout, t.oid FROM pg_catalog.pg_type t WHERE t.typmodout <> 0
    UNION ALL SELECT t.typanalyze, t.oid FROM pg_catalog.pg_type t WHERE t.typanalyze <> 0
    UNION ALL SELECT t.typsubscript, t.oid FROM pg_catalog.pg_type t WHERE t.typsubscript <> 0
    UNION ALL SELECT t.typbasetype, t.oid FROM pg_catalog.pg_type t WHERE t.typbasetype <> 0
    UNION ALL SELECT t.typelem, t.oid FROM pg_catalog.pg_type t WHERE t.typelem <> 0
    UNION ALL SELECT t.typrelid, t.oid FROM pg_catalog.pg_type t WHERE t.typrelid <> 0
    UNION ALL SELECT r.rngcanonical, r.rngtypid FROM pg_catalog.pg_range r WHERE r.rngcanonical <> 0
    UNION ALL SELECT r.rngsubdiff, r.rngtypid FROM pg_catalog.pg_range r WHERE r.rngsubdiff <> 0
    UNION ALL SELECT r.rngsubtype, r.rngtypid FROM pg_catalog.pg_range r
    UNION ALL SELECT r.rngtypid, r.rngmultitypid FROM pg_catalog.pg_range r
    -- A cast runs for values of the type it leads from or to that is not
    -- built in (named, or a column's); between two built-in types, for
    -- both (and then nothing is proven: see 'x' below).
    UNION ALL SELECT k.castfunc, k.castsource FROM pg_catalog.pg_cast k
     WHERE k.castfunc <> 0 AND (k.castsource >= 16384 OR k.casttarget < 16384)
    UNION ALL SELECT k.castfunc, k.casttarget FROM pg_catalog.pg_cast k
     WHERE k.castfunc <> 0 AND (k.casttarget >= 16384 OR k.castsource < 16384)
    -- Sorting, grouping and hashing a type use its default btree and
    -- hash operator classes without naming them.
    UNION ALL SELECT o.opcfamily, o.opcintype FROM pg_catalog.pg_opclass o
      JOIN pg_catalog.pg_am a ON a.oid = o.opcmethod
     WHERE o.opcdefault AND a.amname IN ('btree', 'hash')),
-- The edges as one array, unnested: the planner estimates 100 rows for it
-- rather than multiplying the closure's estimates far past
-- jit_above_cost (JIT compiled this query for seconds).
edge(used, owner) AS (
    SELECT e >> 32, e & 4294967295 FROM pg_catalog.unnest(ARRAY(
        SELECT used::pg_catalog.int8 << 32 | owner::pg_catalog.int8 FROM edge_rows)) e),
-- Everything whose use may run an unproven function, and (a superset)
-- everything that may leave transaction-scoped state a read group's later
-- members would see.
seed(oid) AS (
    SELECT pg_catalog.unnest(ARRAY(
        SELECT oid::pg_catalog.int8 FROM proc_bad UNION SELECT oid FROM op_bad
        UNION SELECT oid FROM family_bad UNION SELECT oid FROM am_bad))),
bad(oid) AS (
    SELECT oid FROM seed
    UNION SELECT e.owner FROM edge e JOIN bad b ON b.oid = e.used),
breaks(oid) AS (
    SELECT oid FROM bad
    UNION SELECT p.oid::pg_catalog.int8 FROM pg_catalog.pg_proc p
     WHERE p.proname::pg_catalog.text IN (SELECT name FROM breaking)
    UNION SELECT e.owner FROM edge e JOIN breaks b ON b.oid = e.used),
-- Every catalog column that can hold an expression or name a function,
-- as this server has them.
sites(site) AS (
    SELECT c.relname::pg_catalog.text || '.' || a.attname::pg_catalog.text
      FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
     WHERE c.relnamespace = 'pg_catalog'::pg_catalog.regnamespace AND c.relkind = 'r'
       AND a.attnum > 0
       AND a.atttypid IN ('pg_catalog.pg_node_tree'::pg_catalog.regtype,
                          'pg_catalog.regproc'::pg_catalog.regtype)
    UNION SELECT k.fktable::pg_catalog.text || '.' || k.fkcols[1]::pg_catalog.text
      FROM pg_catalog.pg_get_catalog_foreign_keys() k
     WHERE k.pktable = 'pg_catalog.pg_proc'::pg_catalog.regclass)
SELECT 'f', pg_catalog.lower(name) FROM own WHERE oid IN (SELECT oid FROM proc_bad)
UNION SELECT 'p', pg_catalog.lower(name) FROM own
 GROUP BY pg_catalog.lower(name) HAVING NOT pg_catalog.bool_or(oid IN (SELECT oid FROM proc_bad))
UNION SELECT 'g', l.lanname::pg_catalog.text FROM pg_catalog.pg_language l
 WHERE l.lanname IN ('plperl', 'plperlu', 'plpythonu', 'plpython2u', 'plpython3u',
                     'pltcl', 'pltclu', 'plv8')
   AND EXISTS (SELECT FROM pg_catalog.pg_proc p WHERE p.prolang = l.oid)
UNION SELECT 'o', o.oprname::pg_catalog.text FROM pg_catalog.pg_operator o
 WHERE o.oid IN (SELECT oid FROM bad)
UNION SELECT 't', pg_catalog.lower(t.typname::pg_catalog.text) FROM pg_catalog.pg_type t
 WHERE t.oid IN (SELECT oid FROM bad)
UNION SELECT 'r', pg_catalog.lower(c.relname::pg_catalog.text) FROM pg_catalog.pg_class c
 WHERE c.oid IN (SELECT oid FROM bad)
UNION SELECT 'b', pg_catalog.lower(c.relname::pg_catalog.text) FROM pg_catalog.pg_class c
 WHERE c.oid IN (SELECT oid FROM breaks EXCEPT SELECT oid FROM bad)
UNION SELECT 'b', pg_catalog.lower(name) FROM breaking
UNION SELECT 'n', pg_catalog.lower(n) FROM (
    SELECT l.lanname::pg_catalog.text FROM pg_catalog.pg_language l
     WHERE l.lanplcallfoid IN (SELECT oid FROM proc_bad)
        OR l.laninline IN (SELECT oid FROM proc_bad)
        OR l.lanvalidator IN (SELECT oid FROM proc_bad)
    UNION SELECT w.fdwname::pg_catalog.text FROM pg_catalog.pg_foreign_data_wrapper w
     WHERE w.fdwhandler IN (SELECT oid FROM proc_bad)
        OR w.fdwvalidator IN (SELECT oid FROM proc_bad)
    UNION SELECT a.amname::pg_catalog.text FROM pg_catalog.pg_am a
     WHERE a.oid IN (SELECT oid FROM am_bad)
    UNION SELECT c.conname::pg_catalog.text FROM pg_catalog.pg_conversion c
     WHERE c.conproc IN (SELECT oid FROM proc_bad)) names(n)
UNION SELECT 'e', 'an event trigger' WHERE EXISTS (
    SELECT FROM pg_catalog.pg_event_trigger e
     WHERE e.evtenabled <> 'D' AND e.evtfoid IN (SELECT oid FROM proc_bad))
UNION SELECT 'x', 'a default conversion' WHERE EXISTS (
    SELECT FROM pg_catalog.pg_conversion c
     WHERE c.condefault AND c.conproc IN (SELECT oid FROM proc_bad))
UNION SELECT 'x', 'a text search parser or template' WHERE EXISTS (
    SELECT FROM pg_catalog.pg_ts_parser p WHERE p.oid >= 16384
    UNION ALL SELECT FROM pg_catalog.pg_ts_template t WHERE t.oid >= 16384)
UNION SELECT 'x', 'a built-in scalar type' WHERE EXISTS (
    SELECT FROM pg_catalog.pg_type t
     WHERE t.oid < 16384 AND t.oid IN (SELECT oid FROM bad) AND t.typrelid = 0
       AND NOT EXISTS (SELECT FROM pg_catalog.pg_type e WHERE e.oid = t.typelem AND e.typrelid <> 0))
UNION SELECT 'u', site FROM sites WHERE site <> ALL ('{$CALL_SITES$}'::pg_catalog.text[])
UNION SELECT 'c', $UNDO$
-- A session's replication origin, where the role may set one up (the
-- functions are revoked from PUBLIC: named in the cleanup of a role that
-- may not, they would fail it). Not asked in recovery, which refuses even
-- the question (and where no origin can be set up): CASE keeps the order.
UNION SELECT 'c', 'SELECT pg_catalog.pg_replication_origin_session_reset() '
               || 'WHERE CASE WHEN pg_catalog.pg_is_in_recovery() THEN false '
               || 'ELSE pg_catalog.pg_replication_origin_session_is_setup() END'
 WHERE pg_catalog.has_function_privilege(
           'pg_catalog.pg_replication_origin_session_reset()', 'execute')
   AND pg_catalog.has_function_privilege(
           'pg_catalog.pg_replication_origin_session_is_setup()', 'execute')
UNION SELECT 's', (SELECT pg_catalog.count(*) FROM pg_catalog.pg_settings s
    WHERE s.name LIKE '%.%' AND pg_catalog.split_part(s.name, '.', 1) NOT IN (
        SELECT e.extname FROM pg_catalog.pg_extension e
        UNION ALL SELECT l.lanname FROM pg_catalog.pg_language l))::pg_catalog.text
