// Refusals through the official TypeScript SDK.
import { test } from "node:test";
import assert from "node:assert/strict";
import { READ_TOOLS, WRITE_TOOLS, admin, connect, mint, structured, toolError } from "../harness.mjs";

async function assertCannotConnect(secret) {
  await assert.rejects(async () => {
    const client = await connect(secret);
    await client.listTools();
  }, (e) => String(e.message).includes("401") || e.code === 401);
}

test("a revoked connection fails before tool discovery", async () => {
  const connection = mint();
  admin("revoke-connection", "--id", connection.connection_id, "--reason", "e2e-ts");
  await assertCannotConnect(connection.secret);
});

test("an expired connection fails before tool discovery", async () => {
  const connection = mint(undefined, "2 seconds");
  await new Promise((resolve) => setTimeout(resolve, 2500));
  await assertCannotConnect(connection.secret);
});

test("a missing secret fails before tool discovery", async () => {
  await assertCannotConnect(undefined);
});

test("a read-only connection sees only read tools and gets a tool error on a write", async () => {
  const client = await connect(mint(["site:read", "content:read"]).secret);
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  // The core read tools are there, no core write tool is (the Python tier checks the exact set).
  for (const read of READ_TOOLS) assert.ok(names.includes(read), read);
  for (const write of WRITE_TOOLS) assert.ok(!names.includes(write), write);
  const error = toolError(await client.callTool({ name: "querylayer_begin_run", arguments: { run_type: "article.draft" } }));
  assert.equal(error.code, "forbidden");
  await client.close();
});

test("a missing required output ends blocked", async () => {
  const client = await connect(mint().secret);
  const run = structured(await client.callTool({ name: "querylayer_begin_run", arguments: {
    run_type: "article.draft", required_outputs: ["draft_id"] } }));
  const finished = structured(await client.callTool({ name: "querylayer_finish_run", arguments: {
    run_id: run.run_id, outcome: "completed" } }));
  assert.equal(finished.outcome, "blocked");
  assert.equal(finished.reason_code, "missing_required_outputs");
  assert.deepEqual(finished.missing_outputs, ["draft_id"]);
  await client.close();
});

test("arguments naming a site are a tool error, not authority", async () => {
  const client = await connect(mint().secret);
  const error = toolError(await client.callTool({ name: "querylayer_list_content", arguments: { site: "elsewhere" } }));
  assert.equal(error.code, "invalid_argument");
  await client.close();
});
