// What the TypeScript end-to-end tests share: the running edge, the operator command line for
// issuing credentials, and clients of the official TypeScript MCP SDK. Every secret obtained is
// appended to $QUERYLAYER_TEST_SECRETS for the runner's log check.
import { spawnSync } from "node:child_process";
import { appendFileSync } from "node:fs";
import { randomUUID } from "node:crypto";
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

export const EDGE = process.env.QUERYLAYER_EDGE_URL.replace(/\/$/, "");
const BIN = process.env.QUERYLAYER_BIN;
const ADMIN_URL = process.env.QUERYLAYER_ADMIN_URL;
const SECRETS = process.env.QUERYLAYER_TEST_SECRETS;

// The scope catalogue, from the edge itself (`querylayer tools`: the registry and the scopes).
const REGISTRY = JSON.parse(spawnSync(BIN, ["tools"], { encoding: "utf8" }).stdout);
export const ALL_SCOPES = REGISTRY.scopes;
// A few core tools the SDK checks by name (the Python tier checks the exact sets from REGISTRY).
export const READ_TOOLS = ["querylayer_list_content", "querylayer_list_proposals", "querylayer_site_context"];
export const WRITE_TOOLS = ["querylayer_begin_run", "querylayer_create_draft", "querylayer_create_proposal",
  "querylayer_finish_run", "querylayer_record_artifact", "querylayer_request_publish_approval"];

export function issued(secret) {
  appendFileSync(SECRETS, secret + "\n");
}

export function admin(...args) {
  const done = spawnSync(BIN, ["admin", ...args, "--json"], {
    env: { ...process.env, DATABASE_URL: ADMIN_URL }, encoding: "utf8", timeout: 60_000,
  });
  assert.equal(done.status, 0, `querylayer admin ${args[0]} failed: ${done.stderr}`);
  return JSON.parse(done.stdout);
}

export function mint(scopes = ALL_SCOPES, expiresIn = "1 hour") {
  const out = admin("create-connection", "--site", "demo", "--agent", "demo-agent",
    "--scopes", scopes.join(","), "--expires-in", expiresIn,
    "--name", `e2e-ts ${randomUUID().slice(0, 12)}`, "--harness", "node");
  issued(out.secret);
  return out;
}

export function memberToken() {
  const out = admin("create-member-token", "--site", "demo", "--member", "demo-owner", "--expires-in", "1 hour");
  issued(out.token);
  return out.token;
}

export async function connect(secret) {
  const transport = new StreamableHTTPClientTransport(new URL(`${EDGE}/mcp`), {
    requestInit: secret ? { headers: { Authorization: `Bearer ${secret}` } } : undefined,
  });
  const client = new Client({ name: "querylayer-e2e", version: "1.0.0" });
  await client.connect(transport);
  return client;
}

export function structured(result) {
  assert.notEqual(result.isError, true, `tool error: ${result.content?.[0]?.text}`);
  assert.ok(result.structuredContent, "structuredContent");
  return result.structuredContent;
}

export function toolError(result) {
  assert.equal(result.isError, true, "expected a tool error");
  assert.equal(result.structuredContent, undefined, "tool errors carry no structuredContent");
  const error = JSON.parse(result.content[0].text).error;
  assert.deepEqual(result._meta["querylayer/error"], error);
  return error;
}

export async function console_(token, method, path, body) {
  const response = await fetch(`${EDGE}/api/console${path}`, {
    method,
    headers: { Authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: response.status, body: await response.json() };
}
