-- Issue 12: a context made by an envelope runs only the functions mapped to the route its
-- sender signed.
CREATE TABLE querylayer.envelope_routes (
    method        text NOT NULL CHECK (method ~ '^[A-Z]{1,16}$'),
    path          text NOT NULL CHECK (path ~ '^/[!-~]*$' AND length(path) <= 512),
    function_name text NOT NULL CHECK (function_name ~ '^querylayer_api\.[a-z_]+$'),
    PRIMARY KEY (method, path, function_name)
);
INSERT INTO querylayer.envelope_routes (method, path, function_name) VALUES
    ('POST', '/v1/answer', 'querylayer_api.answer_signed_request'),
    ('POST', '/v1/answer', 'querylayer_api.prepare_signed_answer'),
    ('POST', '/v1/answer', 'querylayer_api.complete_answer'),
    ('POST', '/v1/models/import/osi', 'querylayer_api.import_semantic_model');
