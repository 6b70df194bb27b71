//! The model of where a database's catalog keeps code: every column that
//! can hold an expression or name a function, and where the proof follows
//! it (`proof.sql`). The completeness test holds it against the server's
//! own list, on every major CI runs.

/// Every catalog column that can hold an expression (`pg_node_tree`) or
/// name a function (a reference to `pg_proc`), and where `proof.sql`
/// follows it. The completeness test asks the server for its list; a
/// column missing here is answered as unclassified (kind `u`), and the
/// pool proves nothing in that database.
pub(crate) const CALL_SITES: &[(&str, &str)] = &[
    ("pg_aggregate.aggcombinefn", "the aggregate (proc_bad)"),
    ("pg_aggregate.aggdeserialfn", "the aggregate (proc_bad)"),
    ("pg_aggregate.aggfinalfn", "the aggregate (proc_bad)"),
    ("pg_aggregate.aggfnoid", "the aggregate itself (proc_bad)"),
    ("pg_aggregate.aggmfinalfn", "the aggregate (proc_bad)"),
    ("pg_aggregate.aggminvtransfn", "the aggregate (proc_bad)"),
    ("pg_aggregate.aggmtransfn", "the aggregate (proc_bad)"),
    ("pg_aggregate.aggserialfn", "the aggregate (proc_bad)"),
    ("pg_aggregate.aggtransfn", "the aggregate (proc_bad)"),
    (
        "pg_am.amhandler",
        "relations and indexes of the method (am_bad, edge)",
    ),
    (
        "pg_amproc.amproc",
        "indexes and default classes' types (family_bad, edge)",
    ),
    ("pg_attrdef.adbin", "the relation (stored)"),
    (
        "pg_cast.castfunc",
        "the type it leads from or to that is not built in; both, between built-ins (edge)",
    ),
    ("pg_class.relpartbound", "the partition (stored)"),
    ("pg_constraint.conbin", "the relation or domain (stored)"),
    (
        "pg_conversion.conproc",
        "its name; a default one, everything (x)",
    ),
    (
        "pg_event_trigger.evtfoid",
        "every statement but plain DML (e)",
    ),
    (
        "pg_foreign_data_wrapper.fdwhandler",
        "foreign tables (edge), its name (n)",
    ),
    ("pg_foreign_data_wrapper.fdwvalidator", "its name (n)"),
    ("pg_index.indexprs", "the indexed relation (stored)"),
    ("pg_index.indpred", "the indexed relation (stored)"),
    ("pg_language.laninline", "its name (n); DO is never proven"),
    (
        "pg_language.lanplcallfoid",
        "its name (n); its functions are user code",
    ),
    ("pg_language.lanvalidator", "its name (n)"),
    ("pg_operator.oprcode", "the operator (op_bad)"),
    ("pg_operator.oprjoin", "the operator (op_bad)"),
    ("pg_operator.oprrest", "the operator (op_bad)"),
    (
        "pg_partitioned_table.partexprs",
        "the partitioned relation (stored)",
    ),
    ("pg_policy.polqual", "the relation (stored)"),
    ("pg_policy.polwithcheck", "the relation (stored)"),
    (
        "pg_proc.proargdefaults",
        "the function's own row: a user function's is unproven by its id, a built-in's is \
         vouched for by its declared volatility",
    ),
    ("pg_proc.prosqlbody", "as pg_proc.proargdefaults"),
    ("pg_proc.prosupport", "the function (proc_bad)"),
    (
        "pg_publication_rel.prqual",
        "never: evaluated by the WAL sender, not in this session",
    ),
    ("pg_range.rngcanonical", "the range type (edge)"),
    ("pg_range.rngsubdiff", "the range type (edge)"),
    ("pg_rewrite.ev_action", "the relation (stored)"),
    ("pg_rewrite.ev_qual", "the relation (stored)"),
    (
        "pg_statistic_ext.stxexprs",
        "the relation, which ANALYZE names (stored)",
    ),
    (
        "pg_transform.trffromsql",
        "never alone: only functions declaring the transform run it, and they are user code",
    ),
    (
        "pg_transform.trftosql",
        "never alone: only functions declaring the transform run it, and they are user code",
    ),
    ("pg_trigger.tgfoid", "the relation (edge)"),
    ("pg_trigger.tgqual", "the relation (stored)"),
    ("pg_ts_parser.prsend", "everything, when not built in (x)"),
    (
        "pg_ts_parser.prsheadline",
        "everything, when not built in (x)",
    ),
    (
        "pg_ts_parser.prslextype",
        "everything, when not built in (x)",
    ),
    ("pg_ts_parser.prsstart", "everything, when not built in (x)"),
    ("pg_ts_parser.prstoken", "everything, when not built in (x)"),
    (
        "pg_ts_template.tmplinit",
        "everything, when not built in (x)",
    ),
    (
        "pg_ts_template.tmpllexize",
        "everything, when not built in (x)",
    ),
    ("pg_type.typanalyze", "the type (edge)"),
    ("pg_type.typdefaultbin", "the domain (stored)"),
    ("pg_type.typinput", "the type (edge)"),
    ("pg_type.typmodin", "the type (edge)"),
    ("pg_type.typmodout", "the type (edge)"),
    ("pg_type.typoutput", "the type (edge)"),
    ("pg_type.typreceive", "the type (edge)"),
    ("pg_type.typsend", "the type (edge)"),
    ("pg_type.typsubscript", "the type (edge)"),
];
