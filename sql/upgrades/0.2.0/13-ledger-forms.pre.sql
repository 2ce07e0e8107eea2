-- 0.2.0: chained records get a versioned canonical form (sql/020_ledger.sql). Runs before the
-- functions, whose signatures name querylayer.ledger_forms.
--
-- 0.1.0 hashed each record as its whole row minus the chain columns. That column list is form 1
-- of each chained table, so every record written by 0.1.0 verifies unchanged: it says form 1.
-- The generated part of the upgrade checks these lists against what a fresh install registers.

CREATE TABLE querylayer.ledger_forms (
    table_name text NOT NULL REFERENCES querylayer.ledger_tables ON DELETE RESTRICT,
    form       smallint NOT NULL CHECK (form > 0),
    fields     text[] NOT NULL CHECK (cardinality(fields) > 0),
    PRIMARY KEY (table_name, form)
);
SELECT querylayer.make_append_only('querylayer.ledger_forms'::regclass);

ALTER TABLE querylayer.access_receipts ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.access_receipts ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.answers ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.answers ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.attestations ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.attestations ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.claim_evidence ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.claim_evidence ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.content_briefs ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.content_briefs ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.content_revisions ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.content_revisions ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.content_source_packages ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.content_source_packages ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.lineage_events ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.lineage_events ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.proposal_decisions ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.proposal_decisions ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.proposal_executions ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.proposal_executions ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.proposals ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.proposals ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.rights_documents ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.rights_documents ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.run_artifacts ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.run_artifacts ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.run_events ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.run_events ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.runs ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.runs ALTER COLUMN ledger_form DROP DEFAULT;
ALTER TABLE querylayer.semantic_models ADD COLUMN ledger_form smallint NOT NULL DEFAULT 1;
ALTER TABLE querylayer.semantic_models ALTER COLUMN ledger_form DROP DEFAULT;

INSERT INTO querylayer.ledger_forms (table_name, form, fields) VALUES
    ('querylayer.access_receipts', 1, '{action,allowed,answer_id,connection_id,created_at,decided_for,id,issued_at,policy_id,principal,purpose,reason,resource,rights_id,site_id}'),
    ('querylayer.answers', 1, '{agent_id,answer,connection_id,created_at,denied_sources,envelope,id,model_id,plans,principal,purpose,question,rights_id,server_key_id,site_id,synthesized_by}'),
    ('querylayer.attestations', 1, '{attestation,created_at,id,lineage_event_id,server_key_id,site_id}'),
    ('querylayer.claim_evidence', 1, '{agent_id,author_kind,claim,connection_id,content_id,created_at,id,member_id,quoted_span,retrieved_at,revision_id,run_id,site_id,source_sha256,source_url}'),
    ('querylayer.content_briefs', 1, '{brief,created_at,decision_id,id,proposal_id,site_id,title,topic_slug}'),
    ('querylayer.content_revisions', 1, '{agent_id,author_kind,connection_id,content_id,created_at,fields,id,member_id,revision_number,run_id,site_id,template_id}'),
    ('querylayer.content_source_packages', 1, '{agent_id,author_kind,connection_id,id,invalid_count,member_id,name,package_sha256,record_count,run_id,site_id,source,staged_at,warnings}'),
    ('querylayer.lineage_events', 1, '{answer_id,created_at,event,event_sha256,id,run_id,site_id,story_agent}'),
    ('querylayer.proposal_decisions', 1, '{decided_at,decision,id,member_id,member_role,note,proposal_id,site_id}'),
    ('querylayer.proposal_executions', 1, '{decision_id,detail,executed_at,id,proposal_id,site_id,status}'),
    ('querylayer.proposals', 1, '{agent_id,author_kind,connection_id,created_at,id,member_id,payload,risk,run_id,site_id,summary,type}'),
    ('querylayer.rights_documents', 1, '{document,id,imported_at,imported_by,problems,site_id,version}'),
    ('querylayer.run_artifacts', 1, '{affected_objects,agent_id,connection_id,created_at,harness,id,key,run_id,site_id,value}'),
    ('querylayer.run_events', 1, '{agent_id,connection_id,created_at,harness,id,kind,missing_outputs,outcome,reason_code,reasons,requested_outcome,run_id,site_id,summary}'),
    ('querylayer.runs', 1, '{agent_id,completion_conditions,connection_id,harness,id,input,organization_id,required_outputs,run_type,site_id,started_at}'),
    ('querylayer.semantic_models', 1, '{connection_id,document,id,imported_at,imported_by,name,site_id,source_sha256,version}');
