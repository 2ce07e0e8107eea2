//! OpenLineage (spec 2-0-2) run events for governed answers and story runs: their shape, the
//! deterministic run id, and the event hash that attestations sign.
//!
//! # The event
//!
//! ```json
//! {"eventType":"COMPLETE","eventTime":"…Z",
//!  "run":{"runId":"<uuid>","facets":{
//!     "queryLayer_typeDid":{"_producer":…,"_schemaURL":…,"protocol","conversationId","payloadSha256","signature"},
//!     "queryLayer_governance":{"_producer":…,"_schemaURL":…,"principal","deniedSources":[…]}}},
//!  "job":{"namespace":"querylayer","name":"querylayer-navigator-loop"},
//!  "inputs":[{"namespace":"sail","name":"sail.qg_lakehouse.…"}],
//!  "outputs":[{"namespace":"querylayer","name":"querylayer:answer:<16 hex>"}],
//!  "producer":"https://querylayer.dev/edge",
//!  "schemaURL":"https://openlineage.io/spec/2-0-2/OpenLineage.json"}
//! ```
//!
//! * The producer of every event and facet is [`PRODUCER`].
//! * `inputs` are the sources that were actually read (the planned sources, each once, in plan
//!   order). A denied source is not an input — it was never touched — and is recorded in the
//!   governance facet instead. A source's namespace is its first dotted segment (the catalog,
//!   `sail` for `sail.qg_lakehouse.t`) and its name the whole source string.
//! * `runId` is [`run_id_for`] of the envelope signature: UUIDv5 in the namespace
//!   `uuid5(NAMESPACE_URL, "https://querygraph.ai/openlineage")`, the reference's derivation, so
//!   run ids are comparable with QueryGraph's.
//!
//! # The hash
//!
//! [`RunEvent::to_json`] is the compact JSON in the field order above (struct order, independent
//! of `serde_json` features); [`event_hash`] is the lowercase hex SHA-256 of those bytes. Store
//! the event as that text (or as PostgreSQL `json`, which keeps text as is — not `jsonb`, which
//! reorders keys) so the hash can be recomputed.

use chrono::{DateTime, Utc};
use querylayer_envelope::Envelope;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// The producer URI of every event and facet this crate writes.
pub const PRODUCER: &str = "https://querylayer.dev/edge";
/// The OpenLineage schema events declare.
pub const SCHEMA_URL: &str = "https://openlineage.io/spec/2-0-2/OpenLineage.json";
/// The namespace of QueryLayer's jobs and outputs.
pub const JOB_NAMESPACE: &str = "querylayer";
/// The job of a governed answer.
pub const ANSWER_JOB: &str = "querylayer-navigator-loop";
/// The job of a story specialist's run (suffixed with `.<agent name>`).
pub const STORY_JOB: &str = "querylayer-qglake-story";
/// The namespace of a source with no dotted catalog prefix.
pub const DEFAULT_INPUT_NAMESPACE: &str = "querylayer";
/// The run facet naming the signed envelope of the run.
pub const TYPEDID_FACET: &str = "queryLayer_typeDid";
/// Its schema URL.
pub const TYPEDID_FACET_SCHEMA: &str =
    "https://querylayer.dev/schemas/openlineage/typedid-run-facet/1-0-0.json";
/// The run facet recording who asked and which sources were denied.
pub const GOVERNANCE_FACET: &str = "queryLayer_governance";
/// Its schema URL.
pub const GOVERNANCE_FACET_SCHEMA: &str =
    "https://querylayer.dev/schemas/openlineage/governance-run-facet/1-0-0.json";
/// The reference's name for the run-id namespace.
pub const RUN_NAMESPACE_URL: &str = "https://querygraph.ai/openlineage";

/// `uuid5(NAMESPACE_URL, "https://querygraph.ai/openlineage")` = `773caf44-8e72-55ee-a7b7-5dc1a7899e0c`.
pub fn run_namespace() -> Uuid {
    Uuid::new_v5(&Uuid::NAMESPACE_URL, RUN_NAMESPACE_URL.as_bytes())
}

/// The run id derived from a name (an envelope signature): lowercase hyphenated UUIDv5.
pub fn run_id_for(name: &str) -> String {
    Uuid::new_v5(&run_namespace(), name.as_bytes()).hyphenated().to_string()
}

/// Lowercase hex SHA-256 of the event's exact JSON text.
pub fn event_hash(event_json: &str) -> String {
    hex::encode(Sha256::digest(event_json.as_bytes()))
}

/// The OpenLineage namespace of a source: its first dotted segment when that is a plain name.
pub fn source_namespace(source: &str) -> &str {
    match source.split_once('.') {
        Some((catalog, _))
            if !catalog.is_empty()
                && catalog.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
        {
            catalog
        }
        _ => DEFAULT_INPUT_NAMESPACE,
    }
}

/// A dataset reference (`{namespace, name}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetRef {
    pub namespace: String,
    pub name: String,
}

/// The job of an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub namespace: String,
    pub name: String,
}

/// The envelope facts a run is tied to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvelopeRef {
    pub protocol: String,
    pub conversation_id: String,
    pub payload_sha256: String,
    pub signature: String,
}

impl From<&Envelope> for EnvelopeRef {
    fn from(e: &Envelope) -> EnvelopeRef {
        EnvelopeRef {
            protocol: e.protocol.clone(),
            conversation_id: e.conversation_id.clone(),
            payload_sha256: e.payload_sha256.clone(),
            signature: e.signature.clone(),
        }
    }
}

/// The `queryLayer_typeDid` run facet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeDidFacet {
    #[serde(rename = "_producer")]
    pub producer: String,
    #[serde(rename = "_schemaURL")]
    pub schema_url: String,
    pub protocol: String,
    #[serde(rename = "conversationId")]
    pub conversation_id: String,
    #[serde(rename = "payloadSha256")]
    pub payload_sha256: String,
    pub signature: String,
}

/// The `queryLayer_governance` run facet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GovernanceFacet {
    #[serde(rename = "_producer")]
    pub producer: String,
    #[serde(rename = "_schemaURL")]
    pub schema_url: String,
    /// The RBAC/ODRL subject the run acted for.
    pub principal: String,
    /// Sources the run was refused (each with a receipt), never read.
    #[serde(rename = "deniedSources")]
    pub denied_sources: Vec<String>,
}

/// The run facets this crate writes, in this order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunFacets {
    #[serde(rename = "queryLayer_typeDid")]
    pub typedid: TypeDidFacet,
    #[serde(rename = "queryLayer_governance")]
    pub governance: GovernanceFacet,
}

/// The run of an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    #[serde(rename = "runId")]
    pub run_id: String,
    pub facets: RunFacets,
}

/// An OpenLineage RunEvent; serializes in the documented key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEvent {
    #[serde(rename = "eventType")]
    pub event_type: String,
    #[serde(rename = "eventTime")]
    pub event_time: String,
    pub run: Run,
    pub job: Job,
    pub inputs: Vec<DatasetRef>,
    pub outputs: Vec<DatasetRef>,
    pub producer: String,
    #[serde(rename = "schemaURL")]
    pub schema_url: String,
}

impl RunEvent {
    /// The compact JSON text whose hash is attested.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("run events serialize")
    }

    /// [`event_hash`] of [`RunEvent::to_json`].
    pub fn hash(&self) -> String {
        event_hash(&self.to_json())
    }
}

/// What a COMPLETE run event is built from.
#[derive(Debug, Clone, Copy)]
pub struct RunSpec<'a> {
    /// e.g. [`ANSWER_JOB`].
    pub job_name: &'a str,
    pub event_time: DateTime<Utc>,
    /// Sources read, in order; repeats are dropped.
    pub inputs: &'a [String],
    /// The output dataset name (namespace [`JOB_NAMESPACE`]).
    pub output_name: &'a str,
    /// The signed envelope the run produced; its signature names the run.
    pub envelope: &'a EnvelopeRef,
    pub principal: &'a str,
    pub denied_sources: &'a [String],
}

/// Builds the COMPLETE run event described in the module documentation.
pub fn complete_run_event(spec: &RunSpec) -> RunEvent {
    let mut inputs: Vec<DatasetRef> = Vec::new();
    for s in spec.inputs {
        if !inputs.iter().any(|d| &d.name == s) {
            inputs.push(DatasetRef { namespace: source_namespace(s).to_string(), name: s.clone() });
        }
    }
    RunEvent {
        event_type: "COMPLETE".into(),
        event_time: crate::format_timestamp(spec.event_time),
        run: Run {
            run_id: run_id_for(&spec.envelope.signature),
            facets: RunFacets {
                typedid: TypeDidFacet {
                    producer: PRODUCER.into(),
                    schema_url: TYPEDID_FACET_SCHEMA.into(),
                    protocol: spec.envelope.protocol.clone(),
                    conversation_id: spec.envelope.conversation_id.clone(),
                    payload_sha256: spec.envelope.payload_sha256.clone(),
                    signature: spec.envelope.signature.clone(),
                },
                governance: GovernanceFacet {
                    producer: PRODUCER.into(),
                    schema_url: GOVERNANCE_FACET_SCHEMA.into(),
                    principal: spec.principal.to_string(),
                    denied_sources: spec.denied_sources.to_vec(),
                },
            },
        },
        job: Job { namespace: JOB_NAMESPACE.into(), name: spec.job_name.to_string() },
        inputs,
        outputs: vec![DatasetRef { namespace: JOB_NAMESPACE.into(), name: spec.output_name.to_string() }],
        producer: PRODUCER.into(),
        schema_url: SCHEMA_URL.into(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::Value;

    /// Validates an event against the vendored official schema's `#/$defs/RunEvent`, with formats.
    pub(crate) fn assert_valid_run_event(event: &Value) {
        let mut schema: Value =
            serde_json::from_str(include_str!("../testdata/openlineage-2-0-2.json")).unwrap();
        let root = schema.as_object_mut().unwrap();
        root.remove("oneOf");
        root.insert("$ref".into(), Value::String("#/$defs/RunEvent".into()));
        let validator =
            jsonschema::options().should_validate_formats(true).build(&schema).expect("the schema compiles");
        let errors: Vec<String> =
            validator.iter_errors(event).map(|e| format!("{} at {}", e, e.instance_path())).collect();
        assert!(errors.is_empty(), "{errors:#?}\n{event:#}");
    }

    fn envelope() -> EnvelopeRef {
        EnvelopeRef {
            protocol: "querygraph.typedid.v1".into(),
            conversation_id: "qg:e7d681b47d3e50ed".into(),
            payload_sha256: "e7d681b47d3e50edb4207d8ae075281e3877188e280a1829c5aa2a5ff3d56070".into(),
            signature: "ed25519:1fabd2e9297bccaf77e160690798250f281b358e27e675d7e91649f31fafa3ea7b62541530cd5d08f302f042e6fe99e83d1e2d2762bdf40000d3029bd0f5ca08".into(),
        }
    }

    fn event() -> RunEvent {
        let inputs = vec![
            "sail.qg_lakehouse.government_finance__countydata".to_string(),
            "sail.qg_lakehouse.access_2018__access_data".to_string(),
            "sail.qg_lakehouse.government_finance__countydata".to_string(),
        ];
        let denied = vec!["sail.qg_lakehouse.haalsi_baseline__restricted_raw".to_string()];
        complete_run_event(&RunSpec {
            job_name: ANSWER_JOB,
            event_time: Utc.with_ymd_and_hms(2026, 11, 30, 3, 1, 41).unwrap(),
            inputs: &inputs,
            output_name: "querylayer:answer:e7d681b47d3e50ed",
            envelope: &envelope(),
            principal: "did:example:qg-navigator",
            denied_sources: &denied,
        })
    }

    #[test]
    fn run_ids_use_the_reference_derivation() {
        assert_eq!(run_namespace().to_string(), "773caf44-8e72-55ee-a7b7-5dc1a7899e0c");
        // The fixture shared with the reference: run_id_for("test").
        assert_eq!(run_id_for("test"), "09c4d056-5e38-59fd-b4bb-f97972d8664f");
        // The reference demo's run id is uuid5 of its envelope signature.
        assert_eq!(run_id_for(&envelope().signature), "992bf660-7ed9-5b42-a0c6-1643a2cc5025");
    }

    #[test]
    fn the_event_validates_against_the_openlineage_schema() {
        let e = event();
        assert_valid_run_event(&serde_json::to_value(&e).unwrap());
        // A broken event is refused, so the check has teeth.
        let mut bad = serde_json::to_value(&e).unwrap();
        bad["run"]["runId"] = Value::String("not-a-uuid".into());
        bad["eventType"] = Value::String("DONE".into());
        let mut schema: Value =
            serde_json::from_str(include_str!("../testdata/openlineage-2-0-2.json")).unwrap();
        schema.as_object_mut().unwrap().remove("oneOf");
        schema["$ref"] = Value::String("#/$defs/RunEvent".into());
        let validator = jsonschema::options().should_validate_formats(true).build(&schema).unwrap();
        assert!(validator.iter_errors(&bad).count() >= 2);
    }

    #[test]
    fn json_is_compact_insertion_ordered_and_inputs_are_read_sources_once() {
        let e = event();
        let text = e.to_json();
        assert!(text.starts_with(r#"{"eventType":"COMPLETE","eventTime":"2026-11-30T03:01:41.000000Z","run":{"runId":"992bf660-7ed9-5b42-a0c6-1643a2cc5025","facets":{"queryLayer_typeDid":{"_producer":"https://querylayer.dev/edge","_schemaURL":"#), "{text}");
        assert!(text.ends_with(r#""producer":"https://querylayer.dev/edge","schemaURL":"https://openlineage.io/spec/2-0-2/OpenLineage.json"}"#));
        assert!(!text.contains(": ") && !text.contains(", ") && !text.contains('\n'), "compact");
        assert_eq!(e.inputs.len(), 2);
        assert_eq!(
            e.inputs[0],
            DatasetRef {
                namespace: "sail".into(),
                name: "sail.qg_lakehouse.government_finance__countydata".into()
            }
        );
        assert_eq!(
            e.run.facets.governance.denied_sources,
            ["sail.qg_lakehouse.haalsi_baseline__restricted_raw"]
        );
        assert_eq!(e.hash(), event_hash(&text));
        assert_eq!(e.hash().len(), 64);
        // Reading the text back gives the same event and the same bytes.
        let back: RunEvent = serde_json::from_str(&text).unwrap();
        assert_eq!(back.to_json(), text);
        assert_eq!(source_namespace("tpcds.public.store_sales"), "tpcds");
        assert_eq!(source_namespace("SELECT 1"), DEFAULT_INPUT_NAMESPACE);
    }
}
