-- Stored expressions (the server's parse trees, pg_node_tree) by the
-- object whose use evaluates them: a fragment of proof.sql and builtin.sql.
    SELECT a.adrelid, a.adbin::pg_catalog.text FROM pg_catalog.pg_attrdef a
    UNION ALL SELECT CASE WHEN c.conrelid <> 0 THEN c.conrelid ELSE c.contypid END,
                     c.conbin::pg_catalog.text
      FROM pg_catalog.pg_constraint c WHERE c.conbin IS NOT NULL
    UNION ALL SELECT i.indrelid, pg_catalog.concat(i.indexprs::pg_catalog.text, ' ',
                                                   i.indpred::pg_catalog.text)
      FROM pg_catalog.pg_index i WHERE i.indexprs IS NOT NULL OR i.indpred IS NOT NULL
    UNION ALL SELECT c.oid, c.relpartbound::pg_catalog.text
      FROM pg_catalog.pg_class c WHERE c.relpartbound IS NOT NULL
    UNION ALL SELECT p.partrelid, p.partexprs::pg_catalog.text
      FROM pg_catalog.pg_partitioned_table p WHERE p.partexprs IS NOT NULL
    UNION ALL SELECT p.polrelid, pg_catalog.concat(p.polqual::pg_catalog.text, ' ',
                                                   p.polwithcheck::pg_catalog.text)
      FROM pg_catalog.pg_policy p
    UNION ALL SELECT r.ev_class, pg_catalog.concat(r.ev_action::pg_catalog.text, ' ',
                                                   r.ev_qual::pg_catalog.text)
      FROM pg_catalog.pg_rewrite r
    UNION ALL SELECT t.tgrelid, t.tgqual::pg_catalog.text
      FROM pg_catalog.pg_trigger t WHERE t.tgqual IS NOT NULL
    UNION ALL SELECT s.stxrelid, s.stxexprs::pg_catalog.text
      FROM pg_catalog.pg_statistic_ext s WHERE s.stxexprs IS NOT NULL
    UNION ALL SELECT t.oid, t.typdefaultbin::pg_catalog.text
      FROM pg_catalog.pg_type t WHERE t.typdefaultbin IS NOT NULL
