//! How long `authenticate` takes in the database for a fingerprint that is unknown, revoked or
//! expired: the three should take the same work, so that timing tells a caller nothing about
//! which kind it holds. Measured inside PostgreSQL (a
//! PL/pgSQL loop as querylayer_edge, each call in its own subtransaction, the kinds interleaved
//! round by round), as microseconds per call. Not a test: it prints. Run with
//! `scripts/bench-auth` (a private cluster with the release build).

use querylayer_e2e::{fingerprint, issued, json, TestDb};

const CALLS: i32 = 2000;
const ROUNDS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let db = TestDb::new();
    db.seed_demo();
    let mut dba = db.dba();
    let mut secret = |name: &str, expires: &str| {
        let v = json(
            &mut dba,
            "SELECT querylayer_api.create_connection('demo', 'demo-agent', $1, '{site:read}'::text[], now() + $2::text::interval)",
            &[&name, &expires],
        );
        let s = v["secret"].as_str().unwrap().to_string();
        issued(&s);
        (s, v["connection_id"].as_str().unwrap().to_string())
    };
    let (revoked, revoked_id) = secret("revoked", "1 hour");
    let (expired, _) = secret("expired", "1 second");
    db.dba().execute("SELECT querylayer_api.revoke_connection($1::text::uuid)", &[&revoked_id]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let kinds = [
        ("unknown", fingerprint("qlc_no_such_secret_no_such_secret_no_such_secret")),
        ("revoked", fingerprint(&revoked)),
        ("expired", fingerprint(&expired)),
    ];
    let mut edge = db.edge();
    edge.batch_execute(
        "SET statement_timeout = 0;
         CREATE FUNCTION pg_temp.bench_authenticate(p bytea, n integer) RETURNS float8
         LANGUAGE plpgsql AS $$
         DECLARE t0 timestamptz := clock_timestamp();
         BEGIN
             FOR i IN 1..n LOOP
                 BEGIN
                     PERFORM querylayer_api.authenticate(p);
                 EXCEPTION WHEN invalid_authorization_specification THEN NULL;
                 END;
             END LOOP;
             RETURN extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
         END $$",
    )
    .unwrap();
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for _ in 0..ROUNDS {
        for (i, (_, fp)) in kinds.iter().enumerate() {
            let micros: f64 =
                edge.query_one("SELECT pg_temp.bench_authenticate($1, $2)", &[fp, &CALLS]).unwrap().get(0);
            samples[i].push(micros);
        }
    }
    println!("authenticate in the database, median of {ROUNDS} rounds of {CALLS} calls (µs per call):");
    for ((name, _), s) in kinds.iter().zip(samples) {
        let (lo, hi) = (s.iter().cloned().fold(f64::MAX, f64::min), s.iter().cloned().fold(0.0, f64::max));
        println!("  {name:<18} {:>8.1}   (min {lo:.1}, max {hi:.1})", median(s));
    }
}
