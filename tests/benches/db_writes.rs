//! Governed writes against plain inserts, in one run on one cluster. Prints operations per
//! second and the ratio for:
//!   * `authenticate` + `record_artifact` (one transaction each) vs an INSERT of the same row
//!     shape into an unguarded table (no triggers, no row-level security, no chain);
//!   * `authenticate` + `create_draft` (a new revision of an existing item) vs an INSERT into an
//!     unguarded table shaped like `content_revisions`.
//! Rounds alternate between the governed and the plain path so that machine noise hits both.
//! Then, on one site, the run workflow `begin_run` + `record_artifact` + `finish_run` (each call
//! its own transaction with `authenticate`, as the edge sends them) by 1, 8 and 32 concurrent
//! connections: p99 of a workflow at c=32 against c=1, and throughput at c=8 against c=1.
//! Every ratio is printed with its target (issue 16, goals 1 and 3).
//! Run with `scripts/bench-db` (it starts a private cluster with the release build).

use postgres::Client;
use querylayer_e2e::{fingerprint, TestDb};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// Short rounds, alternating: the disk's flush time (most of a commit) drifts with whatever else
// the machine does, so each governed round is compared with the plain round just before it and
// the ratio is the median of those pairs.
const ROUND: Duration = Duration::from_millis(400);
const ROUNDS: usize = 15;

fn rate(mut op: impl FnMut(u64)) -> f64 {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < ROUND {
        op(n);
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Prints the governed and plain rates and their ratio against goal 1's target; returns the ratio.
fn compare(name: &str, mut governed: impl FnMut(u64), mut plain: impl FnMut(u64)) -> f64 {
    let (mut g, mut p, mut r) = (Vec::new(), Vec::new(), Vec::new());
    let mut seq = 0u64;
    for _ in 0..ROUNDS {
        let plain_rate = rate(|_| {
            seq += 1;
            plain(seq)
        });
        let governed_rate = rate(|_| {
            seq += 1;
            governed(seq)
        });
        p.push(plain_rate);
        g.push(governed_rate);
        r.push(governed_rate / plain_rate);
    }
    let (g, p, ratio) = (median(g), median(p), median(r));
    println!(
        "{name:<44} governed {g:>8.0}/s   plain {p:>8.0}/s   governed/plain {ratio:.2} (target >= 0.80)"
    );
    ratio
}

const WORKFLOW_SECONDS: Duration = Duration::from_secs(4);

/// One closed-loop measurement of the run workflow by `clients` connections on one site:
/// (workflows per second, p50, p99 of one workflow's latency).
fn workflows(db: &TestDb, fp: &[u8], clients: usize) -> (f64, Duration, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let mut client = db.edge();
            let fp = fp.to_vec();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let auth = client.prepare("SELECT querylayer_api.authenticate($1)").unwrap();
                let begin = client.prepare("SELECT querylayer_api.begin_run('bench.workflow')").unwrap();
                let record =
                    client.prepare("SELECT querylayer_api.record_artifact($1, 'result', $2)").unwrap();
                let finish = client.prepare("SELECT querylayer_api.finish_run($1, 'completed')").unwrap();
                let value = json!({"status": "ok"});
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let mut tx = client.transaction().unwrap();
                    tx.query_one(&auth, &[&fp]).unwrap();
                    let run: Value = tx.query_one(&begin, &[]).unwrap().get(0);
                    tx.commit().unwrap();
                    let run: uuid::Uuid = run["run_id"].as_str().unwrap().parse().unwrap();
                    let mut tx = client.transaction().unwrap();
                    tx.query_one(&auth, &[&fp]).unwrap();
                    tx.query_one(&record, &[&run, &value]).unwrap();
                    tx.commit().unwrap();
                    let mut tx = client.transaction().unwrap();
                    tx.query_one(&auth, &[&fp]).unwrap();
                    tx.query_one(&finish, &[&run]).unwrap();
                    tx.commit().unwrap();
                    latencies.push(t.elapsed());
                }
                latencies
            })
        })
        .collect();
    std::thread::sleep(WORKFLOW_SECONDS);
    stop.store(true, Ordering::Relaxed);
    let mut all: Vec<Duration> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let elapsed = start.elapsed().as_secs_f64();
    all.sort();
    let at = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    (all.len() as f64 / elapsed, at(0.50), at(0.99))
}

fn main() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let fp = fingerprint(&demo.secret);
    let mut edge = db.edge();
    db.superuser()
        .batch_execute(
            "CREATE TABLE public.plain_artifacts (LIKE querylayer.run_artifacts INCLUDING DEFAULTS);
             CREATE UNIQUE INDEX ON public.plain_artifacts (run_id, key);
             CREATE TABLE public.plain_revisions (LIKE querylayer.content_revisions INCLUDING DEFAULTS);
             CREATE UNIQUE INDEX ON public.plain_revisions (content_id, revision_number);
             GRANT ALL ON public.plain_artifacts, public.plain_revisions TO querylayer_edge;",
        )
        .unwrap();
    let mut plain = db.edge();

    let (run_id, content_id) = {
        let mut tx = edge.transaction().unwrap();
        tx.query_one("SELECT querylayer_api.authenticate($1)", &[&fp]).unwrap();
        let run: Value = tx.query_one("SELECT querylayer_api.begin_run('bench')", &[]).unwrap().get(0);
        let run_id = run["run_id"].as_str().unwrap().to_string();
        let draft: Value = tx
            .query_one(
                "SELECT querylayer_api.create_draft($1::text::uuid, 'article', '{\"title\": \"t\", \"body\": \"b\"}', NULL, 'bench')",
                &[&run_id],
            )
            .unwrap()
            .get(0);
        tx.commit().unwrap();
        (run_id, draft["content_id"].as_str().unwrap().to_string())
    };
    let run: uuid::Uuid = run_id.parse().unwrap();
    let content: uuid::Uuid = content_id.parse().unwrap();
    let value = json!({"status": "ok", "words": 812});
    let fields =
        json!({"title": "Benchmark", "body": "A paragraph of body text that stands in for an article."});
    let zero = vec![0u8; 32];

    let auth = edge.prepare("SELECT querylayer_api.authenticate($1)").unwrap();
    let record = edge.prepare("SELECT querylayer_api.record_artifact($1, $2, $3)").unwrap();
    let draft = edge.prepare("SELECT querylayer_api.create_draft($1, 'article', $2, $3)").unwrap();
    let insert_artifact = plain
        .prepare(
            "INSERT INTO public.plain_artifacts (site_id, run_id, key, value, affected_objects, agent_id, connection_id,
                                                 harness, chain_seq, prev_sha256, content_sha256, record_sha256, ledger_form)
             VALUES (gen_random_uuid(), $1, $2, $3, '[]', gen_random_uuid(), gen_random_uuid(), 'generic', 0, $4, $4, $4, 1)",
        )
        .unwrap();
    let insert_revision = plain
        .prepare(
            "INSERT INTO public.plain_revisions (site_id, content_id, revision_number, template_id, fields, author_kind,
                                                 agent_id, connection_id, run_id, chain_seq, prev_sha256, content_sha256, record_sha256, ledger_form)
             VALUES (gen_random_uuid(), $1, $2, gen_random_uuid(), $3, 'agent', gen_random_uuid(), gen_random_uuid(), $1, 0, $4, $4, $4, 1)",
        )
        .unwrap();

    let in_tx = |client: &mut Client, f: &mut dyn FnMut(&mut postgres::Transaction)| {
        let mut tx = client.transaction().unwrap();
        f(&mut tx);
        tx.commit().unwrap();
    };

    println!(
        "QueryLayer database benchmark (one connection, one transaction per operation; median of {ROUNDS} alternating rounds, the ratio the median of each round's pair)"
    );
    let artifact = compare(
        "authenticate + record_artifact vs INSERT",
        |i| {
            in_tx(&mut edge, &mut |tx| {
                tx.query_one(&auth, &[&fp]).unwrap();
                tx.query_one(&record, &[&run, &format!("k{i}"), &value]).unwrap();
            })
        },
        |i| {
            in_tx(&mut plain, &mut |tx| {
                tx.execute(&insert_artifact, &[&run, &format!("k{i}"), &value, &zero]).unwrap();
            })
        },
    );
    let draft = compare(
        "authenticate + create_draft vs INSERT",
        |_| {
            in_tx(&mut edge, &mut |tx| {
                tx.query_one(&auth, &[&fp]).unwrap();
                tx.query_one(&draft, &[&run, &fields, &content]).unwrap();
            })
        },
        |i| {
            in_tx(&mut plain, &mut |tx| {
                tx.execute(&insert_revision, &[&content, &(i as i32), &fields, &zero]).unwrap();
            })
        },
    );

    // The same, each transaction sent as one simple-query batch (one round trip on either side),
    // as the edge's one-round-trip call path sends it: the database's work alone.
    let fp_hex = hex::encode(&fp);
    let (value_text, fields_text) = (value.to_string(), fields.to_string());
    let artifact_batch = compare(
        "  record_artifact, one round trip each",
        |i| {
            edge.batch_execute(&format!(
                "BEGIN; SELECT querylayer_api.authenticate('\\x{fp_hex}'::bytea);
                 SELECT querylayer_api.record_artifact('{run}'::uuid, 'b{i}', '{value_text}'::jsonb); COMMIT"
            ))
            .unwrap()
        },
        |i| {
            plain
                .batch_execute(&format!(
                    "BEGIN; INSERT INTO public.plain_artifacts (site_id, run_id, key, value, affected_objects, agent_id,
                         connection_id, harness, chain_seq, prev_sha256, content_sha256, record_sha256, ledger_form)
                     VALUES (gen_random_uuid(), '{run}', 'b{i}', '{value_text}', '[]', gen_random_uuid(), gen_random_uuid(),
                             'generic', 0, '\\x00', '\\x00', '\\x00', 1); COMMIT"
                ))
                .unwrap()
        },
    );
    let draft_batch = compare(
        "  create_draft, one round trip each",
        |_| {
            edge.batch_execute(&format!(
                "BEGIN; SELECT querylayer_api.authenticate('\\x{fp_hex}'::bytea);
                 SELECT querylayer_api.create_draft('{run}'::uuid, 'article', '{fields_text}'::jsonb, '{content}'::uuid);
                 COMMIT"
            ))
            .unwrap()
        },
        |i| {
            plain
                .batch_execute(&format!(
                    "BEGIN; INSERT INTO public.plain_revisions (site_id, content_id, revision_number, template_id, fields,
                         author_kind, agent_id, connection_id, run_id, chain_seq, prev_sha256, content_sha256, record_sha256,
                         ledger_form)
                     VALUES (gen_random_uuid(), gen_random_uuid(), {i}, gen_random_uuid(), '{fields_text}', 'agent',
                             gen_random_uuid(), gen_random_uuid(), '{run}', 0, '\\x00', '\\x00', '\\x00', 1); COMMIT"
                ))
                .unwrap()
        },
    );

    println!();
    println!(
        "Run workflow on one site: begin_run + record_artifact + finish_run, one transaction per call \
         ({}s closed loop per level)",
        WORKFLOW_SECONDS.as_secs()
    );
    let mut levels = Vec::new();
    for clients in [1usize, 8, 32] {
        let (rate, p50, p99) = workflows(&db, &fp, clients);
        println!(
            "  c={clients:<3} {rate:>8.0} workflows/s   p50 {:>7.1} ms   p99 {:>7.1} ms",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
        levels.push((rate, p99));
    }
    let p99_ratio = levels[2].1.as_secs_f64() / levels[0].1.as_secs_f64();
    let rate_ratio = levels[1].0 / levels[0].0;
    println!();
    println!("Goals (issue 16), all measured in this run:");
    println!("  goal 1  record_artifact governed/plain          {artifact:>6.2}   target >= 0.80");
    println!("  goal 1  create_draft governed/plain             {draft:>6.2}   target >= 0.80");
    println!("  goal 1  record_artifact, one round trip each    {artifact_batch:>6.2}   target >= 0.80");
    println!("  goal 1  create_draft, one round trip each       {draft_batch:>6.2}   target >= 0.80");
    println!("  goal 3  workflow p99 c=32 / p99 c=1             {p99_ratio:>6.2}   target <= 5");
    println!("  goal 3  workflow throughput c=8 / c=1           {rate_ratio:>6.2}   target >= 2");
}
