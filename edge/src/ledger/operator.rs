//! What an operator login (querylayer_admin, or the worker's querylayer_worker) asks of the
//! governed functions: make checkpoints, catch the witnesses up, and build proofs and exports.
//! The database makes and signs checkpoints; this side only carries them, and checks every proof
//! it prints before printing it.

use std::io::Write;

use querylayer_ledger::{Checkpoint, Hash, InclusionProof, ProvenRecord, Tree, TrustedKeys, PROOF_FORMAT};
use serde::Deserialize;
use serde_json::Value;
use tokio_postgres::Client;

use super::witness::{Entry, Witness};

fn db(e: tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} (SQLSTATE {})", d.message(), d.code().code()),
        None => e.to_string(),
    }
}

async fn json(
    client: &Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Value, String> {
    let row = client.query_one(sql, params).await.map_err(db)?;
    Ok(row.get::<_, Option<Value>>(0).unwrap_or(Value::Null))
}

#[derive(Debug, Deserialize)]
pub struct SiteLedger {
    pub site: String,
    pub site_id: String,
    pub records: Option<i64>,
    pub checkpoint_seq: Option<i64>,
}

pub async fn sites(client: &Client) -> Result<Vec<SiteLedger>, String> {
    serde_json::from_value(json(client, "SELECT querylayer_api.ledger_sites()", &[]).await?)
        .map_err(|e| e.to_string())
}

/// Makes the next checkpoint of one site or of every site whose chain grew: what the database says.
pub async fn create_checkpoints(client: &Client, site: Option<&str>) -> Result<Value, String> {
    json(client, "SELECT querylayer_api.create_checkpoints(p_site => $1)", &[&site]).await
}

/// A site's checkpoints after `after` records (all of them, oldest first).
pub async fn checkpoints(client: &Client, site: &str, mut after: i64) -> Result<Vec<Checkpoint>, String> {
    let mut out: Vec<Checkpoint> = Vec::new();
    loop {
        let page: Vec<Checkpoint> = serde_json::from_value(
            json(client, "SELECT querylayer_api.ledger_checkpoints($1, $2, 1000)", &[&site, &after]).await?,
        )
        .map_err(|e| format!("unexpected checkpoint from the database: {e}"))?;
        let done = page.len() < 1000;
        if let Some(last) = page.last() {
            after = last.seq as i64;
        }
        out.extend(page);
        if done {
            return Ok(out);
        }
    }
}

/// The leaf hashes of a site's records after..=upto, as the database computes them.
pub async fn leaves(client: &Client, site: &str, after: i64, upto: i64) -> Result<Vec<Hash>, String> {
    let row = client
        .query_one("SELECT querylayer_api.ledger_leaves($1, $2, $3)", &[&site, &after, &upto])
        .await
        .map_err(db)?;
    let bytes: Vec<u8> = row.get(0);
    if bytes.len() as i64 != (upto - after) * 32 {
        return Err(format!("site {site}: {} leaf bytes for records {}..={upto}", bytes.len(), after + 1));
    }
    Ok(bytes.chunks(32).map(|c| c.try_into().expect("32 bytes")).collect())
}

/// The server keys the database publishes (every did:key, retired ones included).
pub async fn server_keys(client: &Client) -> Result<TrustedKeys, String> {
    let v = json(client, "SELECT querylayer_api.server_keys()", &[]).await?;
    Ok(TrustedKeys::new(
        v["keys"].as_array().into_iter().flatten().filter_map(|k| k["did_key"].as_str().map(str::to_string)),
    ))
}

/// Brings a witness up to the database's checkpoints of every site: the ones it lacks, with their
/// leaves, oldest first. Returns how many it appended.
pub async fn sync_witness(client: &Client, witness: &impl Witness) -> Result<usize, String> {
    let mut appended = 0;
    for site in sites(client).await? {
        let Some(newest) = site.checkpoint_seq else { continue };
        let latest = witness.latest(&site.site_id).await?;
        let mut after = latest.as_ref().map_or(0, |c| c.seq as i64);
        if let Some(held) = &latest {
            // The database must still hold, unchanged, the checkpoint the witness holds last.
            let same = checkpoints(client, &site.site, after - 1).await?.into_iter().next();
            if same.as_ref() != Some(held) {
                return Err(format!(
                    "site {}: the database's checkpoints do not extend the one {} holds ({} records, {}); it keeps no fork",
                    site.site,
                    witness.describe(),
                    held.seq,
                    held.checkpointed_at
                ));
            }
        }
        if after >= newest {
            continue;
        }
        for cp in checkpoints(client, &site.site, after).await? {
            let entry =
                Entry { leaves: leaves(client, &site.site, after, cp.seq as i64).await?, checkpoint: cp };
            witness.append(&entry).await?;
            after = entry.checkpoint.seq as i64;
            appended += 1;
        }
    }
    Ok(appended)
}

#[derive(Debug, Deserialize)]
struct StoredRecord {
    site: String,
    table: String,
    id: String,
    /// None while the record waits to be sealed into its site's chain.
    seq: Option<i64>,
    form: i32,
    canonical: Option<String>,
}

fn proof_for(
    tree: &Tree,
    cp: &Checkpoint,
    table: String,
    id: String,
    seq: i64,
    form: i32,
    canonical: String,
) -> InclusionProof {
    InclusionProof {
        format: PROOF_FORMAT.to_string(),
        path: tree.path(seq as u64 - 1).expect("within the tree").iter().map(hex::encode).collect(),
        record: ProvenRecord { table, id, seq: seq as u64, form, canonical },
        checkpoint: cp.clone(),
    }
}

/// The checkpoint of `site` to prove against: the one at `seq`, or the newest.
async fn checkpoint_at(client: &Client, site: &str, seq: Option<i64>) -> Result<Checkpoint, String> {
    let all = checkpoints(client, site, 0).await?;
    match seq {
        Some(s) => all
            .into_iter()
            .find(|c| c.seq as i64 == s)
            .ok_or_else(|| format!("site {site} has no checkpoint at {s} records")),
        None => all
            .into_iter()
            .last()
            .ok_or_else(|| format!("site {site} has no checkpoint yet: run querylayer ledger checkpoint")),
    }
}

/// An inclusion proof of one record, checked against the database's published keys.
pub async fn prove(
    client: &Client,
    record_id: uuid::Uuid,
    checkpoint_seq: Option<i64>,
) -> Result<InclusionProof, String> {
    let stored: StoredRecord =
        serde_json::from_value(json(client, "SELECT querylayer_api.ledger_record($1)", &[&record_id]).await?)
            .map_err(|e| format!("unexpected record from the database: {e}"))?;
    let Some(seq) = stored.seq else {
        return Err(format!(
            "record {} of site {} waits to be sealed into its chain: run querylayer ledger checkpoint (it seals first)",
            stored.id, stored.site
        ));
    };
    let cp = checkpoint_at(client, &stored.site, checkpoint_seq).await?;
    if seq as u64 > cp.seq {
        return Err(format!(
            "record {} is number {} of site {}, newer than its checkpoint of {} records: run querylayer ledger checkpoint",
            stored.id, seq, stored.site, cp.seq
        ));
    }
    let canonical = stored
        .canonical
        .ok_or_else(|| format!("record {} has an unknown ledger form {}", stored.id, stored.form))?;
    let tree = Tree::new(leaves(client, &stored.site, 0, cp.seq as i64).await?);
    let proof = proof_for(&tree, &cp, stored.table, stored.id, seq, stored.form, canonical);
    proof
        .verify(&server_keys(client).await?)
        .map_err(|e| format!("the database's record does not verify against its own checkpoint: {e}"))?;
    Ok(proof)
}

/// Writes one proof per record of `site` in [from, to) covered by the newest checkpoint, one
/// JSON line each; returns (written, left out because newer than the checkpoint).
pub async fn export(
    client: &Client,
    site: &str,
    from: Option<chrono::DateTime<chrono::Utc>>,
    to: Option<chrono::DateTime<chrono::Utc>>,
    out: &mut impl Write,
) -> Result<(u64, u64), String> {
    use futures_util::{pin_mut, TryStreamExt};
    let cp = checkpoint_at(client, site, None).await?;
    let tree = Tree::new(leaves(client, site, 0, cp.seq as i64).await?);
    let keys = server_keys(client).await?;
    let upto = i64::MAX;
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&site, &upto, &from, &to];
    let rows = client
        .query_raw("SELECT r FROM querylayer_api.ledger_records($1, $2, $3, $4) AS r", params)
        .await
        .map_err(db)?;
    pin_mut!(rows);
    let (mut written, mut newer) = (0, 0);
    while let Some(row) = rows.try_next().await.map_err(db)? {
        let r: Value = row.get(0);
        let seq = r["seq"].as_i64().unwrap_or(0);
        if seq as u64 > cp.seq {
            newer += 1;
            continue;
        }
        let text = |k: &str| r[k].as_str().unwrap_or_default().to_string();
        let proof = proof_for(
            &tree,
            &cp,
            text("table"),
            text("id"),
            seq,
            r["form"].as_i64().unwrap_or(0) as i32,
            text("canonical"),
        );
        proof.verify(&keys).map_err(|e| {
            format!("record {seq} ({}) does not verify against the checkpoint: {e}", proof.record.id)
        })?;
        writeln!(out, "{}", serde_json::to_string(&proof).expect("JSON")).map_err(|e| e.to_string())?;
        written += 1;
    }
    Ok((written, newer))
}
