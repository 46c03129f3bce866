//! A database per environment against a real PostgreSQL (Debian's `postgresql`, started by
//! `support::postgres`): a baseline loaded once and sealed, branches that hold its rows, roles
//! that reach their own branch only, removal, a branch stopped midway, hostile names and a
//! loader that tries to act beyond its role.

use std::time::Duration;

use previewd::database::names::{self, BaselineKey};
use previewd::database::{BaselineTarget, Branched, DatabaseError, DatabaseServer, ServerLimits};
use previewd::sandbox::postgres::{LocalPostgres, PostgresOptions};

use crate::support::postgres::{
    code, connect, database_and_role, postgres, server, superuser, superuser_of,
};

const ROWS: &str = "CREATE TABLE orders (id int PRIMARY KEY, item text NOT NULL);
    INSERT INTO orders SELECT g, 'item ' || g FROM generate_series(1, 1000) g;";

fn key(test: &'static str) -> BaselineKey<'static> {
    BaselineKey {
        template_namespace: "team-a",
        template_name: test,
        database: "orders",
    }
}

/// Loads `sql` as version `version` of `key`'s baseline and seals it.
async fn sealed_baseline(
    server: &DatabaseServer,
    key: BaselineKey<'_>,
    version: &str,
    sql: &str,
) -> BaselineTarget {
    let target = BaselineTarget::new(key, version);
    let login = server
        .open_baseline(&target, "loader-password")
        .await
        .expect("open the baseline");
    server.load_sql(&login, sql).await.expect("load the rows");
    server.seal_baseline(&target).await.expect("seal");
    target
}

async fn count_orders(database: &str, password: &str) -> i64 {
    let address = postgres().superuser_address();
    let client = connect(&address, database, database, password)
        .await
        .expect("the environment's role logs in to its branch");
    let row = client
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .expect("count");
    row.get(0)
}

#[tokio::test]
async fn an_environments_branch_holds_the_baseline_and_its_role_reaches_nothing_else() {
    let server = server(ServerLimits::default());
    let baseline = sealed_baseline(&server, key("reach"), "v1", ROWS).await;
    let a = names::branch("reach-uid-a", "orders");
    let b = names::branch("reach-uid-b", "orders");
    let made = server.branch(&a, &baseline, "password-a").await.unwrap();
    assert!(matches!(made, Branched::Made { .. }), "{made:?}");
    server.branch(&b, &baseline, "password-b").await.unwrap();

    assert_eq!(count_orders(&a, "password-a").await, 1000);
    let address = postgres().superuser_address();
    let own = connect(&address, &a, &a, "password-a").await.unwrap();
    own.batch_execute("INSERT INTO orders VALUES (1001, 'mine'); CREATE TABLE notes (t text)")
        .await
        .expect("the role owns what the baseline made, and its branch");

    // A's role opens neither B's branch nor the baseline.
    let refused = connect(&address, &b, &a, "password-a").await.unwrap_err();
    assert_eq!(
        code(&refused),
        "42501",
        "A's role opened B's branch: {refused}"
    );
    let refused = connect(&address, &baseline.database, &a, "password-a")
        .await
        .unwrap_err();
    assert!(
        ["42501", "55000"].contains(&code(&refused).as_str()),
        "A's role opened the baseline: {refused}"
    );
    // The baseline role logs in no more once sealed.
    let refused = connect(
        &address,
        &baseline.database,
        &baseline.role,
        "loader-password",
    )
    .await
    .unwrap_err();
    assert_eq!(code(&refused), "28000", "{refused}");
    assert_eq!(
        count_orders(&b, "password-b").await,
        1000,
        "B untouched by A's rows"
    );

    // Removal drops the branch and its role, and nothing of B's.
    drop(own);
    server.drop_branch(&a).await.unwrap();
    assert_eq!(database_and_role(&a).await, (false, false));
    assert_eq!(database_and_role(&b).await, (true, true));
    server
        .drop_branch(&a)
        .await
        .expect("dropping what is gone is done");
    server.drop_branch(&b).await.unwrap();
    server.drop_baseline(key("reach")).await.unwrap();
    assert!(!database_and_role(&baseline.database).await.0);
    assert!(!database_and_role(&baseline.role).await.1);
}

#[tokio::test]
async fn a_branch_stopped_at_any_point_is_finished_once_with_no_orphan_and_no_duplicate() {
    // A server of its own: every database and role on it is this test's.
    let own = crate::support::postgres::start(PostgresOptions::default());
    let server = own.server("stopped", ServerLimits::default());
    let baseline = sealed_baseline(&server, key("stopped"), "v1", ROWS).await;
    for (round, stop_after_ms) in [0u64, 2, 5, 10, 20, 40, 80, 160].into_iter().enumerate() {
        let name = names::branch(&format!("stopped-uid-{round}"), "orders");
        // previewd stopped midway: the branch's future dropped where the time runs out (the
        // server may still be running the statement it was sent).
        let first = tokio::time::timeout(
            Duration::from_millis(stop_after_ms),
            server.branch(&name, &baseline, "first-password"),
        )
        .await;
        // previewd back: the reconcile tries again until the branch is there.
        let mut again = None;
        for _ in 0..50 {
            match server.branch(&name, &baseline, "final-password").await {
                Ok(done) => {
                    again = Some(done);
                    break;
                }
                Err(e) => {
                    eprintln!("round {round}: retrying after {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        let again = again.unwrap_or_else(|| panic!("round {round}: never finished"));
        if matches!(first, Ok(Ok(_))) {
            assert_eq!(again, Branched::Present, "round {round}");
        }
        assert!(server.branch_ready(&name).await.unwrap(), "round {round}");
        let client = connect(&own.superuser_address(), &name, &name, "final-password")
            .await
            .expect("the final password logs in");
        let rows: i64 = client
            .query_one("SELECT count(*) FROM orders", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(rows, 1000, "round {round}");
        drop(client);
        // Exactly one branch and one role on the whole server: no second copy, no orphan of
        // the stopped try under another name.
        let made = previewds_objects(&own).await;
        assert_eq!(
            made,
            (vec![name.clone()], vec![name.clone()]),
            "round {round}"
        );
        server.drop_branch(&name).await.unwrap();
        assert_eq!(
            previewds_objects(&own).await,
            (vec![], vec![]),
            "round {round}"
        );
    }
    server.drop_baseline(key("stopped")).await.unwrap();
}

/// The branch databases and branch roles on `postgres`, by name.
async fn previewds_objects(postgres: &LocalPostgres) -> (Vec<String>, Vec<String>) {
    let client = superuser_of(postgres).await;
    let names = |rows: Vec<tokio_postgres::Row>| rows.iter().map(|r| r.get(0)).collect();
    let databases = client
        .query(
            "SELECT datname FROM pg_database WHERE datname LIKE 'pvd\\_env\\_%' ORDER BY 1",
            &[],
        )
        .await
        .unwrap();
    let roles = client
        .query(
            "SELECT rolname FROM pg_roles WHERE rolname LIKE 'pvd\\_env\\_%' ORDER BY 1",
            &[],
        )
        .await
        .unwrap();
    (names(databases), names(roles))
}

#[tokio::test]
async fn hostile_names_and_values_reach_postgresql_only_as_one_name_and_one_value() {
    use previewd::database::sql::{ident, literal};
    let admin = server(ServerLimits::default());
    let hostile_name = "x\"; DROP ROLE previewd; ALTER ROLE previewd SUPERUSER; --";
    let hostile_password = "p'; ALTER ROLE previewd SUPERUSER; -- \\' \\\\ $$ $a$";
    admin
        .execute_as_admin(&format!(
            "CREATE ROLE {} LOGIN PASSWORD {}",
            ident(hostile_name).unwrap(),
            literal(hostile_password).unwrap()
        ))
        .await
        .expect("one role, named as written");
    assert!(database_and_role(hostile_name).await.1);
    let address = postgres().superuser_address();
    connect(&address, "postgres", hostile_name, hostile_password)
        .await
        .expect("the password is the value written, byte for byte");
    let previewd = superuser()
        .await
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = 'previewd'",
            &[],
        )
        .await
        .expect("previewd's admin is still there");
    assert!(!previewd.get::<_, bool>(0), "and still no superuser");
    admin
        .execute_as_admin(&format!("DROP ROLE {}", ident(hostile_name).unwrap()))
        .await
        .unwrap();

    // A template and a database named to break out become hashed names, and work.
    let hostile_key = BaselineKey {
        template_namespace: "team-a",
        template_name: "shop\"; DROP DATABASE postgres; --",
        database: "orders'; --",
    };
    let baseline = sealed_baseline(&admin, hostile_key, "v1", ROWS).await;
    let branch = names::branch("uid'\"; --", hostile_key.database);
    admin.branch(&branch, &baseline, "pw").await.unwrap();
    assert_eq!(count_orders(&branch, "pw").await, 1000);
    admin.drop_branch(&branch).await.unwrap();
    admin.drop_baseline(hostile_key).await.unwrap();
}

#[tokio::test]
async fn a_baseline_loader_acts_with_its_roles_rights_and_no_more() {
    let server = server(ServerLimits::default());
    let target = BaselineTarget::new(key("loader"), "v1");
    let login = server.open_baseline(&target, "loader-pw").await.unwrap();
    for escalation in [
        format!("ALTER ROLE {} SUPERUSER", login.user),
        "CREATE ROLE sneaky LOGIN PASSWORD 'x'".to_string(),
        "CREATE DATABASE sneaky".to_string(),
        "COPY (SELECT 1) TO PROGRAM 'id'".to_string(),
        "RESET ROLE; CREATE ROLE sneaky2".to_string(),
        "SET ROLE previewd".to_string(),
    ] {
        let refused = server.load_sql(&login, &escalation).await;
        match refused {
            Err(DatabaseError::Statement { message, .. }) => {
                assert!(message.contains("42501"), "{escalation}: {message}")
            }
            other => panic!("{escalation}: {other:?}"),
        }
    }
    assert_eq!(database_and_role("sneaky").await, (false, false));
    // What it may do: build its own database, and set its own password.
    server.load_sql(&login, ROWS).await.unwrap();
    let own_password = format!("ALTER ROLE {} PASSWORD 'chosen-by-the-loader'", login.user);
    server.load_sql(&login, &own_password).await.unwrap();
    // While it loads, another environment's login cannot open it.
    let other = sealed_baseline(&server, key("loader-other"), "v1", ROWS).await;
    let branch = names::branch("loader-uid", "orders");
    server.branch(&branch, &other, "pw").await.unwrap();
    let address = postgres().superuser_address();
    let refused = connect(&address, &target.database, &branch, "pw")
        .await
        .unwrap_err();
    assert_eq!(code(&refused), "42501", "{refused}");
    server.seal_baseline(&target).await.unwrap();
    // Sealed, the role logs in no more, whatever password it gave itself.
    let refused = connect(
        &address,
        &target.database,
        &login.user,
        "chosen-by-the-loader",
    )
    .await
    .unwrap_err();
    assert_eq!(code(&refused), "28000", "{refused}");
    server.drop_branch(&branch).await.unwrap();
    server.drop_baseline(key("loader")).await.unwrap();
    server.drop_baseline(key("loader-other")).await.unwrap();
}

#[tokio::test]
async fn a_role_that_revokes_previewd_and_leaves_objects_elsewhere_is_still_dropped_whole() {
    let own = crate::support::postgres::start(PostgresOptions::default());
    let server = own.server("leftovers", ServerLimits::default());
    let baseline = sealed_baseline(&server, key("leftovers"), "v1", ROWS).await;
    let name = names::branch("leftovers-uid", "orders");
    server.branch(&name, &baseline, "pw").await.unwrap();
    let address = own.superuser_address();
    // The pull request's code, with the environment's login: it tries to take previewd's
    // membership away (servers before 15 let a role do that; 15 refuses it, and previewd
    // takes the membership back before it drops anyway), leaves objects in the server's own
    // database (which `DROP ROLE` refuses to leave behind), and keeps a session open.
    let inside = connect(&address, &name, &name, "pw").await.unwrap();
    let revoked = inside
        .batch_execute(&format!("REVOKE \"{name}\" FROM previewd"))
        .await;
    eprintln!("the role's REVOKE of previewd: {revoked:?}");
    let elsewhere = connect(&address, "postgres", &name, "pw").await.unwrap();
    elsewhere
        .batch_execute(
            "SELECT lo_create(0); ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO PUBLIC",
        )
        .await
        .expect("a login may do both in a database PUBLIC can open");
    server
        .drop_branch(&name)
        .await
        .expect("dropped whatever the role did");
    assert_eq!(previewds_objects(&own).await, (vec![], vec![]));
    assert!(
        elsewhere.simple_query("SELECT 1").await.is_err(),
        "its session ended with it"
    );
}

#[tokio::test]
async fn a_function_planted_where_the_admin_looks_never_runs_as_the_admin() {
    // A server upgraded from PostgreSQL 14 keeps `public` open to CREATE for everyone.
    let own = crate::support::postgres::start(PostgresOptions::default());
    let address = own.superuser_address();
    let superuser = superuser_of(&own).await;
    superuser
        .batch_execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        .await
        .unwrap();
    let server = own.server("planted", ServerLimits::default());
    let baseline = sealed_baseline(&server, key("planted"), "v1", ROWS).await;
    let name = names::branch("planted-uid", "orders");
    server.branch(&name, &baseline, "pw").await.unwrap();
    // The environment's login plants a closer match for a function previewd's admin calls on
    // its catalogue queries: run as the admin, it would give the role CREATEDB.
    let planted = connect(&address, "postgres", &name, "pw").await.unwrap();
    planted
        .batch_execute(&format!(
            "CREATE FUNCTION public.starts_with(name, text) RETURNS boolean LANGUAGE plpgsql AS $$
             BEGIN EXECUTE 'ALTER ROLE \"{name}\" CREATEDB'; RETURN pg_catalog.starts_with($1::text, $2); END $$"
        ))
        .await
        .expect("public is open to CREATE here");
    server.branches().await.unwrap();
    let other = names::branch("planted-uid-2", "orders");
    server.branch(&other, &baseline, "pw").await.unwrap();
    server.drop_branch(&other).await.unwrap();
    let createdb: bool = superuser
        .query_one(
            "SELECT rolcreatedb FROM pg_roles WHERE rolname = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!createdb, "the planted function ran as previewd's admin");
}

#[tokio::test]
async fn a_new_baseline_version_is_branched_from_and_existing_branches_keep_theirs() {
    let server = server(ServerLimits::default());
    let v1 = sealed_baseline(&server, key("versions"), "v1", ROWS).await;
    let old = names::branch("versions-uid-old", "orders");
    server.branch(&old, &v1, "pw").await.unwrap();
    let v2 = sealed_baseline(
        &server,
        key("versions"),
        "v2",
        "CREATE TABLE orders (id int); INSERT INTO orders SELECT generate_series(1, 20);",
    )
    .await;
    assert!(!database_and_role(&v1.database).await.0, "v1 retired");
    let new = names::branch("versions-uid-new", "orders");
    server.branch(&new, &v2, "pw").await.unwrap();
    assert_eq!(count_orders(&new, "pw").await, 20);
    assert_eq!(
        count_orders(&old, "pw").await,
        1000,
        "the old branch keeps its rows"
    );
    let refused = server
        .branch(&names::branch("late", "orders"), &v1, "pw")
        .await;
    assert!(
        matches!(refused, Err(DatabaseError::BaselineNotReady(_))),
        "{refused:?}"
    );
    for name in [old, new] {
        server.drop_branch(&name).await.unwrap();
    }
    server.drop_baseline(key("versions")).await.unwrap();
}

#[tokio::test]
async fn a_full_server_refuses_a_new_branch_and_takes_one_again_once_a_branch_goes() {
    // A server of its own: the limit counts every branch on the server.
    let own = crate::support::postgres::start(PostgresOptions::default());
    let limits = ServerLimits {
        max_branches: 2,
        ..ServerLimits::default()
    };
    let server = own.server("small", limits);
    let baseline = sealed_baseline(&server, key("full"), "v1", ROWS).await;
    let [a, b, c] = ["a", "b", "c"].map(|uid| names::branch(uid, "orders"));
    server.branch(&a, &baseline, "pw").await.unwrap();
    server.branch(&b, &baseline, "pw").await.unwrap();
    let refused = server.branch(&c, &baseline, "pw").await;
    assert!(
        matches!(refused, Err(DatabaseError::Full { branches: 2, .. })),
        "{refused:?}"
    );
    assert_eq!(
        server.branches().await.unwrap().len(),
        2,
        "nothing of c made"
    );
    assert_eq!(
        server.branch(&b, &baseline, "pw").await.unwrap(),
        Branched::Present,
        "a branch already there is never refused its own place"
    );
    server.drop_branch(&a).await.unwrap();
    server.branch(&c, &baseline, "pw").await.unwrap();
    // Each role opens at most its connection limit.
    let address = own.superuser_address();
    let mut held = Vec::new();
    for _ in 0..limits.role_connection_limit {
        held.push(connect(&address, &c, &c, "pw").await.unwrap());
    }
    let refused = connect(&address, &c, &c, "pw").await.unwrap_err();
    assert_eq!(code(&refused), "53300", "{refused}");
}

mod in_previewd {
    //! The same, through previewd's controller against the real API server: a template asks
    //! for a database, and each environment gets its branch, its Secret and its egress.

    use std::time::Duration;

    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use kube::api::{Api, DeleteParams, PostParams};
    use previewd::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
    use previewd::reconcile::ControllerConfig;
    use previewd::reconcile::databases::DatabaseConfig;
    use previewd::sandbox::postgres::{LocalPostgres, PostgresOptions};
    use serde_json::json;

    use crate::support::postgres::{
        code, connect, database_and_role, postgres, register_server, unregister_server,
    };
    use crate::support::process::PreviewdProcess;
    use crate::support::{eventually, in_namespace, start_controller_with, wait_for_phase};

    /// The template `shop` (a ConfigMap, and the database `orders` on `server` from the SQL
    /// of ConfigMap `orders-baseline`) and the baseline.
    async fn shop(client: &kube::Client, namespace: &str, server: &str) {
        shop_of(client, namespace, server, 1000).await;
    }

    /// [`shop`] with a baseline of `rows` orders.
    async fn shop_of(client: &kube::Client, namespace: &str, server: &str, rows: u64) {
        let insert =
            format!("INSERT INTO orders SELECT g, 'item ' || g FROM generate_series(1, {rows}) g;");
        let baseline: ConfigMap = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "orders-baseline"},
            "data": {"01-schema.sql": "CREATE TABLE orders (id int PRIMARY KEY, item text);",
                     "02-rows.sql": insert},
        }))
        .unwrap();
        Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &baseline)
            .await
            .unwrap();
        let template: PreviewTemplate = serde_json::from_value(json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate", "metadata": {"name": "shop"},
            "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World"},
                     "manifests": {"inline": [{"name": "app.yaml", "template": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  sha: \"{{ sha }}\"\n"}]},
                     "databases": [{"name": "orders", "server": server, "baseline": {"sqlConfigMap": "orders-baseline"}}]}
        }))
        .unwrap();
        Api::<PreviewTemplate>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &template)
            .await
            .unwrap();
    }

    async fn open_pull_request(client: &kube::Client, namespace: &str, name: &str, number: u64) {
        let environment: PreviewEnvironment = serde_json::from_value(json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment", "metadata": {"name": name},
            "spec": {"template": "shop", "source": {"repository": "Codertocat/Hello-World",
                     "branch": name, "pullRequest": number, "headSha": "abc1234"}}
        }))
        .unwrap();
        Api::<PreviewEnvironment>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &environment)
            .await
            .unwrap();
    }

    fn config(namespace: &str) -> ControllerConfig {
        ControllerConfig {
            namespace: Some(namespace.to_string()),
            databases: DatabaseConfig {
                credentials_namespace: Some(namespace.to_string()),
            },
            ..Default::default()
        }
    }

    /// The environment's connection Secret, key by key.
    async fn connection(
        client: &kube::Client,
        environment: &PreviewEnvironment,
    ) -> std::collections::BTreeMap<String, String> {
        let namespace = environment
            .status
            .as_ref()
            .unwrap()
            .namespace
            .clone()
            .unwrap();
        let secret = Api::<Secret>::namespaced(client.clone(), &namespace)
            .get("database-orders")
            .await
            .expect("the environment's database Secret");
        secret
            .data
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
            .collect()
    }

    async fn rows(
        postgres: &LocalPostgres,
        details: &std::collections::BTreeMap<String, String>,
    ) -> i64 {
        let address = postgres.superuser_address();
        let client = connect(
            &address,
            &details["database"],
            &details["username"],
            &details["password"],
        )
        .await
        .expect("the Secret's login opens the branch");
        client
            .query_one("SELECT count(*) FROM orders", &[])
            .await
            .unwrap()
            .get(0)
    }

    #[tokio::test]
    async fn each_environment_gets_its_branch_its_secret_and_egress_and_removal_drops_it_after_its_namespace()
     {
        in_namespace("databases-life", |client, ns| async move {
            let server = format!("{ns}-pg");
            register_server(&client, &ns, &server, postgres(), None).await;
            shop(&client, &ns, &server).await;
            open_pull_request(&client, &ns, "pr-1", 1).await;
            open_pull_request(&client, &ns, "pr-2", 2).await;
            let _running = start_controller_with(&client, config(&ns)).await;
            let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
            let one = wait_for_phase(&environments, "pr-1", Phase::Ready, Duration::from_secs(60)).await;
            let two = wait_for_phase(&environments, "pr-2", Phase::Ready, Duration::from_secs(60)).await;

            let status = &one.status.as_ref().unwrap().databases;
            assert_eq!(status.len(), 1, "{status:?}");
            assert_eq!(status[0].state, "Ready");
            assert!(status[0].branched_in_ms.is_some(), "{status:?}");
            let (first, second) = (connection(&client, &one).await, connection(&client, &two).await);
            assert_eq!(first["database"], status[0].branch);
            assert_ne!(first["database"], second["database"]);
            assert_eq!(rows(postgres(), &first).await, 1000);
            assert_eq!(rows(postgres(), &second).await, 1000);
            let address = postgres().superuser_address();
            let across = connect(&address, &second["database"], &first["username"], &first["password"])
                .await
                .unwrap_err();
            assert_eq!(code(&across), "42501", "pr-1's login opened pr-2's branch: {across}");

            // The guard rail opens the server's address on its port, as a rule of its own.
            let namespace = one.status.as_ref().unwrap().namespace.clone().unwrap();
            let policy = Api::<NetworkPolicy>::namespaced(client.clone(), &namespace)
                .get("previewd-default-deny")
                .await
                .unwrap();
            let egress = serde_json::to_value(policy.spec.unwrap().egress.unwrap()).unwrap();
            let port = postgres().port();
            assert!(
                egress.as_array().unwrap().iter().any(|rule| rule
                    == &json!({"to": [{"ipBlock": {"cidr": "127.0.0.1/32"}}], "ports": [{"protocol": "TCP", "port": port}]})),
                "{egress:#}"
            );

            // Removal: the branch and its role go after the namespace, the other stays.
            environments.delete("pr-1", &DeleteParams::default()).await.unwrap();
            eventually("pr-1's record gone", Duration::from_secs(90), || {
                let environments = environments.clone();
                async move { environments.get_opt("pr-1").await.unwrap().is_none().then_some(()) }
            })
            .await;
            assert_eq!(database_and_role(&first["database"]).await, (false, false));
            assert_eq!(database_and_role(&second["database"]).await, (true, true));
            assert_eq!(rows(postgres(), &second).await, 1000);
            environments.delete("pr-2", &DeleteParams::default()).await.unwrap();
            eventually("pr-2's branch gone", Duration::from_secs(90), || {
                let name = second["database"].clone();
                async move { (database_and_role(&name).await == (false, false)).then_some(()) }
            })
            .await;
            unregister_server(&client, &server).await;
        })
        .await;
    }

    #[tokio::test]
    async fn a_full_server_queues_the_next_environment_with_its_position_until_a_branch_goes() {
        in_namespace("databases-queue", |client, ns| async move {
            let own = crate::support::postgres::start(PostgresOptions::default());
            let server = format!("{ns}-pg");
            register_server(&client, &ns, &server, &own, Some(1)).await;
            shop(&client, &ns, &server).await;
            open_pull_request(&client, &ns, "pr-1", 1).await;
            let _running = start_controller_with(&client, config(&ns)).await;
            let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
            wait_for_phase(&environments, "pr-1", Phase::Ready, Duration::from_secs(60)).await;
            open_pull_request(&client, &ns, "pr-2", 2).await;
            let queued = wait_for_phase(
                &environments,
                "pr-2",
                Phase::Queued,
                Duration::from_secs(60),
            )
            .await;
            let status = queued.status.unwrap();
            assert_eq!(status.queue_position, Some(1));
            let ready = &status.conditions[0];
            assert_eq!(ready.reason, "DatabaseServerFull", "{ready:?}");
            assert!(
                ready.message.contains("holds 1 branches"),
                "{}",
                ready.message
            );

            environments
                .delete("pr-1", &DeleteParams::default())
                .await
                .unwrap();
            wait_for_phase(&environments, "pr-2", Phase::Ready, Duration::from_secs(90)).await;
            unregister_server(&client, &server).await;
        })
        .await;
    }

    /// previewd SIGKILLed while it branches (its environment's role made, the copy under way
    /// or just done), then started again: the same branch is finished, once.
    #[tokio::test]
    async fn previewd_killed_while_it_branches_finishes_the_one_branch_when_it_comes_back() {
        in_namespace("databases-sigkill", |client, ns| async move {
            // A server of its own, so that every branch and role on it is this test's; a
            // baseline big enough (about 70 MiB) that the copy takes a while.
            let own = crate::support::postgres::start(PostgresOptions::default());
            let server = format!("{ns}-pg");
            register_server(&client, &ns, &server, &own, None).await;
            shop_of(&client, &ns, &server, 300_000).await;
            open_pull_request(&client, &ns, "pr-1", 1).await;
            let logs = tempfile::tempdir().unwrap();
            let first = previewd(&ns, "first", logs.path());
            let watcher = crate::support::postgres::superuser_of(&own).await;
            let started = tokio::time::Instant::now();
            loop {
                let roles = watcher
                    .query(
                        "SELECT 1 FROM pg_roles WHERE rolname LIKE 'pvd\\_env\\_%'",
                        &[],
                    )
                    .await
                    .unwrap();
                if !roles.is_empty() {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(120),
                    "no branch begun"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            first.signal(libc::SIGKILL);
            drop(first);
            let second = previewd(&ns, "second", logs.path());
            let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
            let ready = wait_for_phase(
                &environments,
                "pr-1",
                Phase::Ready,
                Duration::from_secs(120),
            )
            .await;
            let details = connection(&client, &ready).await;
            assert_eq!(rows(&own, &details).await, 300_000);
            let branch = details["database"].clone();
            assert_eq!(
                super::previewds_objects(&own).await,
                (vec![branch.clone()], vec![branch]),
                "one branch and one role on the server"
            );
            environments
                .delete("pr-1", &DeleteParams::default())
                .await
                .unwrap();
            eventually("pr-1's record gone", Duration::from_secs(90), || {
                let environments = environments.clone();
                async move {
                    environments
                        .get_opt("pr-1")
                        .await
                        .unwrap()
                        .is_none()
                        .then_some(())
                }
            })
            .await;
            assert_eq!(super::previewds_objects(&own).await, (vec![], vec![]));
            drop(second);
            unregister_server(&client, &server).await;
        })
        .await;
    }

    /// `previewd run` for `namespace`, databases on (credentials in that namespace).
    fn previewd(namespace: &str, name: &str, logs: &std::path::Path) -> PreviewdProcess {
        PreviewdProcess::start(
            name,
            &crate::support::shared().kubeconfig_path,
            &[
                "--watch-namespace",
                namespace,
                "--leader-elect",
                "false",
                "--database-credentials-namespace",
                namespace,
            ],
            &[],
            logs,
        )
    }
}
