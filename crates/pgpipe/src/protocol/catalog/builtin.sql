-- The edges of the server's own stored expressions (system and
-- information_schema views, the catalogs' checks and domains): one array
-- of `used << 32 | owner`, read once per lane and passed to proof.sql as
-- $1. They cannot be altered, so the fields that name code and relations
-- are enough there, and far cheaper to find than every number.
WITH stored(owner, tree) AS (
$STORED$)
SELECT pg_catalog.array_agg(DISTINCT m[1]::pg_catalog.int8 << 32 | s.owner::pg_catalog.int8)
  FROM stored s,
       pg_catalog.regexp_matches(s.tree,
           ':(?:funcid|opfuncid|opno|aggfnoid|winfnoid|relid|hashfuncid|negfuncid) (\d+)', 'g') m
 WHERE s.owner < 16384 AND pg_catalog.length(m[1]) < 11
   AND m[1]::pg_catalog.int8 < 4294967296
