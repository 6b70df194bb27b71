//! A generative adversary (#43): a session-changing built-in planted at
//! every kind of call site the proof follows (a view and a view over it, a
//! default, a check, a domain and a composite over it, an array of it, a
//! policy, a rule, a trigger's WHEN, a foreign key's SET DEFAULT, a
//! partition's check, an index expression, an updatable view's base, a
//! system view's rule, and SQL or a relation named in text), each reached
//! by a statement that names no function of its own, run through the
//! shared path, in a read group and on a connection from `get()`; no other
//! task may observe the change. Every plant has a positive control: on a
//! plain connection, the statement really changes the session.
//!
//! The changes: a session setting, a transaction-local one (what feeds
//! row-level security), the random generator's seed, a session advisory
//! lock. Every combination runs, on the machine's server and on every
//! other major installed (16, 17, 18 in CI).

use std::time::Duration;

use pgpipe::Pool;
use pgpipe_test_support::{Cluster, major_bin, unique, with_param};
use tokio_postgres::Client;

/// A session change a built-in makes, and how a task sees it.
#[derive(Clone, Copy, Debug)]
enum Change {
    Setting,
    LocalSetting,
    Seed,
    Lock,
}

impl Change {
    const ALL: [Change; 4] = [
        Change::Setting,
        Change::LocalSetting,
        Change::Seed,
        Change::Lock,
    ];

    /// The planted call.
    fn call(self) -> &'static str {
        match self {
            Change::Setting => "pg_catalog.set_config('pgpipe.leak', 'planted', false)",
            Change::LocalSetting => "pg_catalog.set_config('pgpipe.leak', 'planted', true)",
            Change::Seed => "pg_catalog.setseed(0.5)",
            Change::Lock => "pg_catalog.pg_advisory_lock(43043)",
        }
    }
}

/// Where a call is planted: the objects (`{s}` the schema, `{call}` the
/// call), what an administrator runs before each statement, and the
/// statement, which names no function of the schema's.
struct Site {
    name: &'static str,
    setup: &'static str,
    before: &'static str,
    statement: &'static str,
    /// A read: it may join a read group.
    read: bool,
}

const SITES: &[Site] = &[
    Site {
        name: "view",
        setup: "CREATE VIEW {s}.v AS SELECT ({call})::text AS x",
        before: "",
        statement: "SELECT x FROM v",
        read: true,
    },
    Site {
        name: "view over a view",
        setup: "CREATE VIEW {s}.vv AS SELECT x FROM {s}.v",
        before: "",
        statement: "SELECT x FROM vv",
        read: true,
    },
    Site {
        name: "column default",
        setup: "CREATE TABLE {s}.d (id int, x text DEFAULT ({call})::text)",
        before: "",
        statement: "INSERT INTO d (id) VALUES (1)",
        read: false,
    },
    Site {
        name: "check constraint",
        setup: "CREATE TABLE {s}.c (id int CHECK (length(({call})::text) >= 0))",
        before: "",
        statement: "INSERT INTO c VALUES (1)",
        read: false,
    },
    Site {
        name: "domain check, through a column",
        setup: "CREATE DOMAIN {s}.dm AS int CHECK (length(({call})::text) >= 0); \
                CREATE TABLE {s}.dt (v {s}.dm)",
        before: "",
        statement: "INSERT INTO dt VALUES (1)",
        read: false,
    },
    Site {
        name: "domain check, through a composite type",
        setup: "CREATE TYPE {s}.ct AS (v {s}.dm)",
        before: "",
        statement: "SELECT ('(1)'::ct).v",
        read: true,
    },
    Site {
        name: "domain check, through an array column",
        setup: "CREATE TABLE {s}.arr (v {s}.dm[])",
        before: "",
        statement: "INSERT INTO arr VALUES ('{1}')",
        read: false,
    },
    Site {
        name: "row-level security policy",
        setup: "CREATE TABLE {s}.p (id int); INSERT INTO {s}.p VALUES (1); \
                ALTER TABLE {s}.p ENABLE ROW LEVEL SECURITY; \
                CREATE POLICY pp ON {s}.p USING (length(({call})::text) >= 0)",
        before: "",
        statement: "SELECT id FROM p",
        read: true,
    },
    Site {
        name: "rule",
        setup: "CREATE TABLE {s}.ru (id int); \
                CREATE RULE rr AS ON INSERT TO {s}.ru DO ALSO SELECT ({call})::text",
        before: "",
        statement: "INSERT INTO ru VALUES (1)",
        read: false,
    },
    Site {
        name: "trigger WHEN",
        setup: "CREATE TABLE {s}.tw (id int); INSERT INTO {s}.tw VALUES (1); \
                CREATE TRIGGER tww BEFORE UPDATE ON {s}.tw FOR EACH ROW \
                WHEN (length(({call})::text) >= 0) \
                EXECUTE FUNCTION pg_catalog.suppress_redundant_updates_trigger()",
        before: "",
        statement: "UPDATE tw SET id = 2",
        read: false,
    },
    Site {
        name: "foreign key SET DEFAULT",
        setup: "CREATE TABLE {s}.parent (id int PRIMARY KEY); \
                INSERT INTO {s}.parent VALUES (1); \
                CREATE TABLE {s}.child (pid int DEFAULT (length(({call})::text) * 0 + 1) \
                REFERENCES {s}.parent ON DELETE SET DEFAULT)",
        before: "INSERT INTO {s}.parent VALUES (2) ON CONFLICT DO NOTHING; \
                 INSERT INTO {s}.child VALUES (2)",
        statement: "DELETE FROM parent WHERE id = 2",
        read: false,
    },
    Site {
        name: "partition check",
        setup: "CREATE TABLE {s}.pt (id int) PARTITION BY LIST (id); \
                CREATE TABLE {s}.pt1 PARTITION OF {s}.pt FOR VALUES IN (1); \
                ALTER TABLE {s}.pt1 ADD CHECK (length(({call})::text) >= 0)",
        before: "",
        statement: "INSERT INTO pt VALUES (1)",
        read: false,
    },
    Site {
        name: "index expression",
        setup: "CREATE FUNCTION {s}.imm(int) RETURNS int IMMUTABLE LANGUAGE plpgsql \
                AS $$ BEGIN PERFORM {call}; RETURN $1; END $$; \
                CREATE TABLE {s}.ix (id int); CREATE INDEX ON {s}.ix ({s}.imm(id))",
        before: "",
        statement: "INSERT INTO ix VALUES (1)",
        read: false,
    },
    Site {
        name: "updatable view's base table",
        setup: "CREATE TABLE {s}.base (id int, x text DEFAULT ({call})::text); \
                CREATE VIEW {s}.bv AS SELECT id FROM {s}.base",
        before: "",
        statement: "INSERT INTO bv (id) VALUES (1)",
        read: false,
    },
    Site {
        name: "SQL given as text",
        setup: "",
        before: "",
        statement: "SELECT query_to_xml('SELECT ({quoted})::text', false, false, '')",
        read: true,
    },
    Site {
        name: "a view named in text",
        setup: "",
        before: "",
        statement: "SELECT table_to_xml('v', false, false, '')",
        read: true,
    },
];

/// A session setting through a system view's rule, whatever the change.
const SYSTEM_RULE: Site = Site {
    name: "system view's rule (pg_settings)",
    setup: "CREATE VIEW {s}.ps AS SELECT name, setting FROM pg_catalog.pg_settings",
    before: "",
    statement: "UPDATE ps SET setting = '7777kB' WHERE name = 'work_mem'",
    read: false,
};

/// What a task sees of the session: the planted setting and `work_mem`,
/// the first `random()`, and the lock.
const OBSERVE: &str = "SELECT coalesce(current_setting('pgpipe.leak', true), '') || '/' || \
     current_setting('work_mem') || '/' || random()::text";

/// A plain connection of the test's own.
async fn plain(url: &str) -> Client {
    pgpipe_test_support::connect(url)
        .await
        .expect("a plain connection")
}

/// The plant's schema, role and objects, for one change.
struct Garden {
    schema: String,
    url: String,
    /// `random()` right after `setseed(0.5)`.
    seeded: String,
}

impl Garden {
    async fn plant(admin: &Client, server_url: &str, change: Change) -> Garden {
        let schema = unique("pgpipe_plant");
        let mut sql = format!(
            "CREATE SCHEMA {schema}; CREATE ROLE {schema} LOGIN; \
             GRANT USAGE ON SCHEMA {schema} TO {schema}; "
        );
        for site in SITES.iter().chain([&SYSTEM_RULE]) {
            sql.push_str(&fill(site.setup, &schema, change));
            sql.push_str("; ");
        }
        sql.push_str(&format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {schema}; \
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {schema}; \
             GRANT pg_read_all_settings TO {schema}"
        ));
        admin.batch_execute(&sql).await.expect("the plants go in");
        let url = with_param(
            &server_url.replacen("postgres@", &format!("{schema}@"), 1),
            "options",
            &format!("-c search_path={schema},public"),
        );
        let seeded = admin
            .simple_query("SELECT setseed(0.5); SELECT random()::text")
            .await
            .unwrap()
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            })
            .next_back()
            .unwrap();
        admin
            .batch_execute("SELECT setseed(random() * 2 - 1)")
            .await
            .unwrap();
        Garden {
            schema,
            url,
            seeded,
        }
    }

    /// Whether `seen` (an [`OBSERVE`] answer) or the server's locks show
    /// `change`.
    async fn shows(&self, admin: &Client, change: Change, seen: &str) -> bool {
        match change {
            Change::Setting | Change::LocalSetting => {
                seen.starts_with("planted/") || seen.contains("/7777kB/")
            }
            Change::Seed => seen.ends_with(&format!("/{}", self.seeded)),
            Change::Lock => {
                let held: i64 = admin
                    .query_one(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                         AND objid = 43043 AND granted",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0);
                held > 0
            }
        }
    }
}

fn fill(sql: &str, schema: &str, change: Change) -> String {
    sql.replace("{s}", schema)
        .replace("{quoted}", &change.call().replace('\'', "''"))
        .replace("{call}", change.call())
}

/// Every change at every site through every route on one server; the
/// leaks found, named.
async fn adversary(admin: &Client, server_url: &str) -> Vec<String> {
    let mut leaks = Vec::new();
    for change in Change::ALL {
        let garden = Garden::plant(admin, server_url, change).await;
        let pool = Pool::builder()
            .url(&garden.url)
            .max_size(1)
            .max_exclusive(1)
            .pipelining(true)
            .build()
            .unwrap();
        // The system view's rule changes a setting, whatever the change.
        let system = matches!(change, Change::Setting).then_some(&SYSTEM_RULE);
        for site in SITES.iter().chain(system) {
            let statement = fill(site.statement, &garden.schema, change);
            let before = fill(site.before, &garden.schema, change);
            let label = |route: &str| format!("{change:?} at {} via {route}", site.name);
            // The control: on a plain connection, in one transaction, the
            // statement changes the session.
            if !before.is_empty() {
                admin.batch_execute(&before).await.unwrap();
            }
            let control = plain(&garden.url).await;
            control.batch_execute("BEGIN").await.unwrap();
            control
                .batch_execute(&statement)
                .await
                .unwrap_or_else(|e| panic!("control {}: {e}", label("a plain connection")));
            let seen: String = control.query_one(OBSERVE, &[]).await.unwrap().get(0);
            assert!(
                garden.shows(admin, change, &seen).await,
                "control: {} did not change the session ({seen})",
                label("a plain connection")
            );
            drop(control);
            // The lock's holder is gone with its session.
            tokio::time::sleep(Duration::from_millis(20)).await;

            // The shared path: the next task's query.
            if !before.is_empty() {
                admin.batch_execute(&before).await.unwrap();
            }
            pool.execute(statement.as_str(), &[]).await.unwrap();
            let seen: String = pool.query_one(OBSERVE, &[]).await.unwrap().get(0);
            if garden.shows(admin, change, &seen).await {
                leaks.push(label("the shared path"));
            }
            // A read group: reads sent with it.
            if site.read {
                let planted = {
                    let (pool, statement) = (pool.clone(), statement.clone());
                    tokio::spawn(async move { pool.read().query(statement.as_str(), &[]).await })
                };
                let observers: Vec<_> = (0..8)
                    .map(|_| {
                        let pool = pool.clone();
                        tokio::spawn(async move {
                            pool.read()
                                .query_one(OBSERVE, &[])
                                .await
                                .unwrap()
                                .get::<_, String>(0)
                        })
                    })
                    .collect();
                planted.await.unwrap().unwrap();
                for observer in observers {
                    let seen = observer.await.unwrap();
                    if garden.shows(admin, change, &seen).await {
                        leaks.push(label("a read group"));
                        break;
                    }
                }
            }
            // get(): after the shared path's statement, and after its own.
            if !before.is_empty() {
                admin.batch_execute(&before).await.unwrap();
            }
            let held = pool.get().await.unwrap();
            held.batch_execute(&statement).await.unwrap();
            drop(held);
            let next = pool.get().await.unwrap();
            let seen: String = next.query_one(OBSERVE, &[]).await.unwrap().get(0);
            drop(next);
            if garden.shows(admin, change, &seen).await {
                leaks.push(label("get()"));
            }
        }
        pool.close_and_wait(Duration::from_secs(5)).await;
        let schema = &garden.schema;
        admin
            .batch_execute(&format!(
                "DROP SCHEMA {schema} CASCADE; DROP OWNED BY {schema}; DROP ROLE {schema}"
            ))
            .await
            .unwrap();
    }
    leaks
}

/// Runs the adversary in a database of its own on the server `admin` is
/// connected to (`url` reaches it as the superuser): its plants name
/// relations `v`, `d`, `p` …, which would make other tests' statements
/// that use such words unproven while it runs.
async fn in_a_database_of_its_own(admin: &Client, url: &str) -> Vec<String> {
    let database = unique("pgpipe_plants");
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .await
        .unwrap();
    let server = url.rsplit_once('/').expect("a URL with a database").0;
    let url = format!("{server}/{database}");
    let leaks = {
        let planted = plain(&url).await;
        adversary(&planted, &url).await
    };
    admin
        .batch_execute(&format!("DROP DATABASE {database} WITH (FORCE)"))
        .await
        .unwrap();
    leaks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_planted_session_change_reaches_another_task() {
    let admin = pgpipe_test_support::admin().await;
    let url = pgpipe_test_support::server_url(None, None, Some("postgres"));
    let leaks = in_a_database_of_its_own(&admin, &url).await;
    assert!(leaks.is_empty(), "leaks: {leaks:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_planted_session_change_reaches_another_task_on_every_major_installed() {
    for major in [16, 17, 18] {
        let Some(bin) = major_bin(major) else {
            continue;
        };
        let cluster = Cluster::builder().bin(bin).start().expect("cluster starts");
        let admin = plain(&cluster.url()).await;
        let leaks = in_a_database_of_its_own(&admin, &cluster.url()).await;
        assert!(leaks.is_empty(), "PostgreSQL {major}: leaks: {leaks:#?}");
    }
}
