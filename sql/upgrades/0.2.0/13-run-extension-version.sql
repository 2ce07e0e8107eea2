-- 0.2.0: runs record the extension version that wrote them (sql/060_runs.sql), which opens form
-- 2 of runs. Earlier runs keep NULL and form 1.
ALTER TABLE querylayer.runs ADD COLUMN extension_version text;
ALTER TABLE querylayer.runs ALTER COLUMN extension_version SET DEFAULT querylayer.installed_version();
SELECT querylayer.add_ledger_form('querylayer.runs'::regclass);
