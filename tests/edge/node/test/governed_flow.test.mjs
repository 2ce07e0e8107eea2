// The governed flow through the official TypeScript SDK (protocol 2025-11-25).
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { ALL_SCOPES, READ_TOOLS, WRITE_TOOLS, connect, console_, memberToken, mint, structured } from "../harness.mjs";

test("governed flow: the live pointer moves only after a member approves", async () => {
  const connection = mint(ALL_SCOPES);
  const client = await connect(connection.secret);
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  assert.deepEqual(names, [...names].sort());
  for (const core of [...READ_TOOLS, ...WRITE_TOOLS]) assert.ok(names.includes(core), core);

  const run = structured(await client.callTool({ name: "querylayer_begin_run", arguments: {
    run_type: "article.draft", input: { topic: "onboarding" },
    required_outputs: ["draft_id"], completion_conditions: ["a draft exists"] } }));
  const draft = structured(await client.callTool({ name: "querylayer_create_draft", arguments: {
    run_id: run.run_id, template: "article", slug: `ts-${randomUUID().slice(0, 10)}`,
    fields: { title: "Onboarding", body: "Welcome." } } }));
  assert.equal(draft.published_revision_id, null);
  structured(await client.callTool({ name: "querylayer_record_artifact", arguments: {
    run_id: run.run_id, key: "draft_id", value: draft.revision_id } }));
  const proposal = structured(await client.callTool({ name: "querylayer_request_publish_approval", arguments: {
    run_id: run.run_id, items: [{ content_id: draft.content_id, action: "publish", revision_id: draft.revision_id }] } }));
  assert.equal(proposal.state, "pending");
  const finished = structured(await client.callTool({ name: "querylayer_finish_run", arguments: {
    run_id: run.run_id, outcome: "completed" } }));
  assert.equal(finished.outcome, "completed");

  const token = memberToken();
  const approved = await console_(token, "POST", `/proposals/${proposal.proposal_id}/approve`, { note: "ok from ts" });
  assert.equal(approved.status, 200);
  assert.equal(approved.body.state, "applied");

  const { items } = structured(await client.callTool({ name: "querylayer_list_content", arguments: { state: "published" } }));
  const live = items.find((i) => i.content_id === draft.content_id);
  assert.equal(live.published_revision_id, draft.revision_id);
  await client.close();
});
