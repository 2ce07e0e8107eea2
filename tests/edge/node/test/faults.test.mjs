// Faults through the official TypeScript SDK: "retry later" arrives as a JSON-RPC error the SDK
// raises with its code and data (not as a transport failure), and a write retried with its
// idempotency key takes effect once.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { McpError } from "@modelcontextprotocol/sdk/types.js";
import { connect, mint, structured } from "../harness.mjs";

const RETRY_LATER = -32010;

test("a write retried with its idempotency key takes effect once", async () => {
  const client = await connect(mint().secret);
  const args = { run_type: "retry.ts", input: { marker: randomUUID() }, idempotency_key: randomUUID() };
  const first = structured(await client.callTool({ name: "querylayer_begin_run", arguments: args }));
  const again = await client.callTool({ name: "querylayer_begin_run", arguments: args });
  assert.equal(structured(again).run_id, first.run_id);
  assert.equal(again._meta["querylayer/idempotent-replay"], true);
  await client.close();
});

// The burst runs last: the SDK's work on 80 answers keeps this process busy for about 10 s, long
// enough for the edge to close the pooled sockets' idle keep-alive connections before the pool
// notices, and a POST on such a socket fails with "other side closed" (docs/edge.md, "Keep-alive
// and a busy client"). The idempotency test must not depend on that.
test("over its rate a connection gets the retry-later error, with retry_after", async () => {
  const client = await connect(mint().secret);
  const outcomes = await Promise.allSettled(Array.from({ length: 80 }, () => client.listTools()));
  const refused = outcomes.filter((o) => o.status === "rejected").map((o) => o.reason);
  assert.ok(refused.length > 0, "some calls were over the rate");
  for (const error of refused) {
    assert.ok(error instanceof McpError, `an McpError, not a transport failure: ${error}`);
    assert.equal(error.code, RETRY_LATER);
    assert.equal(error.data.code, "rate_limited");
    assert.ok(error.data.retry_after >= 1);
  }
  await client.close();
});
