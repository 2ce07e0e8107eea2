-- The checks of a slug, a run type, an artifact's key and an idempotency key, met on every draft,
-- run, artifact and keyed call, state the same rules with the length apart: a bounded repetition
-- ({0,199}) costs PostgreSQL's regex engine about ten microseconds a match, twenty times the test
-- it stands for (docs/performance.md, "0.10.0: answers from what the call holds"). Each table is
-- read once to validate its new check, which its rows already meet.
ALTER TABLE querylayer.content_items DROP CONSTRAINT content_items_slug_check,
    ADD CONSTRAINT content_items_slug_check CHECK (length(slug) <= 200 AND slug ~ '^[a-z0-9][a-z0-9/_-]*$');
ALTER TABLE querylayer.runs DROP CONSTRAINT runs_run_type_check,
    ADD CONSTRAINT runs_run_type_check CHECK (length(run_type) <= 80 AND run_type ~ '^[a-z][a-z0-9_.:-]*$');
ALTER TABLE querylayer.run_artifacts DROP CONSTRAINT run_artifacts_key_check,
    ADD CONSTRAINT run_artifacts_key_check CHECK (length(key) <= 128 AND key ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$');
ALTER TABLE querylayer.idempotency_keys DROP CONSTRAINT idempotency_keys_key_check,
    ADD CONSTRAINT idempotency_keys_key_check CHECK (length(key) <= 255 AND key ~ '^[!-~]+$');
