// OAuth 2.1 with the official TypeScript SDK's OAuth support, with no pre-shared secret: the
// transport meets the edge's 401, the SDK discovers the authorization server, registers
// dynamically and hands over the authorization URL; a member consents (signed in, through the
// consent page's own form, as the browser test does with Chromium); the SDK exchanges the code
// (PKCE S256, the resource), lists and calls tools, refreshes (the old access token dies), and
// after a revocation (RFC 7009) its token gets the 401 again.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { request } from "node:http";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { auth, UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";
import { ALL_SCOPES, EDGE, READ_TOOLS, WRITE_TOOLS, admin, issued, structured } from "../harness.mjs";

const REDIRECT = "http://127.0.0.1:9/ts-callback";

/** The SDK's OAuthClientProvider, in memory; every secret it holds is recorded for the log check. */
class Memory {
  constructor() {
    this.client = undefined;
    this.saved = undefined;
    this.verifier = undefined;
    this.authorizationUrl = undefined;
  }
  get redirectUrl() {
    return REDIRECT;
  }
  get clientMetadata() {
    return {
      client_name: "QueryLayer TypeScript OAuth test", redirect_uris: [REDIRECT],
      grant_types: ["authorization_code", "refresh_token"], response_types: ["code"],
      token_endpoint_auth_method: "none",
    };
  }
  clientInformation() {
    return this.client;
  }
  saveClientInformation(client) {
    this.client = client;
  }
  tokens() {
    return this.saved;
  }
  saveTokens(tokens) {
    issued(tokens.access_token);
    if (tokens.refresh_token) issued(tokens.refresh_token);
    this.saved = tokens;
  }
  redirectToAuthorization(url) {
    this.authorizationUrl = url;
  }
  saveCodeVerifier(verifier) {
    this.verifier = verifier;
  }
  codeVerifier() {
    return this.verifier;
  }
  // What the SDK calls when the server refuses what the provider holds (a dead refresh token:
  // "tokens"; an unknown client: "all"), before it starts the authorization again.
  invalidateCredentials(scope) {
    if (scope === "all" || scope === "tokens") this.saved = undefined;
    if (scope === "all" || scope === "client") this.client = undefined;
    if (scope === "all" || scope === "verifier") this.verifier = undefined;
  }
}

/** One HTTP request with headers fetch would not let through (Origin, Cookie), no redirects. */
function http(method, url, { headers = {}, body } = {}) {
  return new Promise((resolve, reject) => {
    const req = request(url, { method, headers }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (chunk) => (text += chunk));
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, text }));
    });
    req.on("error", reject);
    if (body) req.write(body);
    req.end();
  });
}

/** A new owner of demo with a password (invited by an operator, set on the invitation page). */
async function newOwner() {
  const handle = `ts-owner-${randomUUID().slice(0, 8)}`;
  const invited = admin("invite-member", "--site", "demo", "--member", handle, "--role", "owner");
  issued(invited.token);
  const password = `correct horse ${randomUUID().slice(0, 12)}`;
  issued(password);
  const form = new URLSearchParams({ token: invited.token, password, confirm: password }).toString();
  const r = await http("POST", `${EDGE}/invite`, {
    headers: { Origin: EDGE, "content-type": "application/x-www-form-urlencoded" }, body: form,
  });
  assert.equal(r.status, 200, r.text);
  return { handle, password };
}

/** An attribute value as the page's template escaped it, read back. */
function unescapeHtml(text) {
  return text.replace(/&(#x[0-9a-f]+|#[0-9]+|amp|lt|gt|quot|apos);/gi, (_, entity) => {
    const named = { amp: "&", lt: "<", gt: ">", quot: '"', apos: "'" }[entity.toLowerCase()];
    if (named) return named;
    return String.fromCodePoint(entity[1].toLowerCase() === "x" ? parseInt(entity.slice(2), 16) : parseInt(entity.slice(1), 10));
  });
}

/** The member's consent to `authorizationUrl` with `scopes`, through the page's form. The code. */
async function consent(authorizationUrl, { handle, password }, scopes) {
  const form = (fields) => ({
    headers: { Origin: EDGE, "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams(fields).toString(),
  });
  const signedIn = await http("POST", `${EDGE}/sign-in`, form({ site: "demo", handle, password }));
  assert.equal(signedIn.status, 303, signedIn.text);
  const cookie = /ql_session=([^;]+)/.exec([].concat(signedIn.headers["set-cookie"]).join(";"))[1];
  issued(cookie);
  const page = await http("GET", authorizationUrl.toString(), { headers: { Cookie: `ql_session=${cookie}` } });
  assert.equal(page.status, 200, page.text);
  assert.match(page.text, /QueryLayer TypeScript OAuth test/);
  const hidden = [...page.text.matchAll(/<input type="hidden" name="([a-z_]+)" value="([^"]*)">/g)]
    .map(([, name, value]) => [name, unescapeHtml(value)]);
  const fields = [...hidden, ["decision", "allow"], ["agent", "demo-agent"], ["expires_in", "1 day"],
    ...scopes.map((s) => ["scopes", s])];
  const allowed = await http("POST", `${EDGE}/authorize`, {
    ...form(fields), headers: { ...form(fields).headers, Cookie: `ql_session=${cookie}` },
  });
  assert.equal(allowed.status, 303, allowed.text);
  const back = new URL(allowed.headers.location);
  assert.equal(`${back.origin}${back.pathname}`, REDIRECT);
  assert.equal(back.searchParams.get("iss"), EDGE);
  const code = back.searchParams.get("code");
  assert.ok(code, allowed.headers.location);
  issued(code);
  return code;
}

async function toolsList(token) {
  const r = await fetch(`${EDGE}/mcp`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${token}`, "content-type": "application/json",
      accept: "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25",
    },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list" }),
  });
  await r.text();
  return r;
}

test("the TypeScript SDK connects by itself, refreshes, and is refused after a revocation", async () => {
  const member = await newOwner();
  const provider = new Memory();
  const url = new URL(`${EDGE}/mcp`);
  // 1. No token: the 401 sends the SDK through discovery and registration to the authorization URL.
  const first = new StreamableHTTPClientTransport(url, { authProvider: provider });
  await assert.rejects(new Client({ name: "ts-oauth", version: "1.0.0" }).connect(first), UnauthorizedError);
  assert.ok(provider.client?.client_id?.startsWith("qlo_"), "registered dynamically");
  const authorizationUrl = provider.authorizationUrl;
  assert.equal(`${authorizationUrl.origin}${authorizationUrl.pathname}`, `${EDGE}/authorize`);
  assert.equal(authorizationUrl.searchParams.get("code_challenge_method"), "S256");
  assert.equal(authorizationUrl.searchParams.get("resource"), `${EDGE}/mcp`);
  // 2. The member allows the read scopes and the SDK exchanges the code.
  const readScopes = ALL_SCOPES.filter((s) => s.endsWith(":read"));
  await first.finishAuth(await consent(authorizationUrl, member, readScopes));
  const granted = provider.tokens();
  assert.ok(granted.access_token.startsWith("qlc_") && granted.refresh_token.startsWith("qlr_"));
  assert.deepEqual(granted.scope.split(" ").sort(), [...readScopes].sort());
  // 3. Tools: the read tools, not the write tools, and a call.
  const client = new Client({ name: "ts-oauth", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(url, { authProvider: provider }));
  const names = (await client.listTools()).tools.map((t) => t.name);
  for (const name of READ_TOOLS) assert.ok(names.includes(name), name);
  for (const name of WRITE_TOOLS) assert.ok(!names.includes(name), name);
  const site = structured(await client.callTool({ name: "querylayer_site_context", arguments: {} }));
  assert.deepEqual([...site.scopes].sort(), [...readScopes].sort());
  await client.close();
  // 4. A refresh through the SDK: new tokens, the old access token dead.
  assert.equal(await auth(provider, { serverUrl: url }), "AUTHORIZED");
  const refreshed = provider.tokens();
  assert.notEqual(refreshed.access_token, granted.access_token);
  assert.notEqual(refreshed.refresh_token, granted.refresh_token);
  assert.equal((await toolsList(granted.access_token)).status, 401);
  assert.equal((await toolsList(refreshed.access_token)).status, 200);
  // 5. Revocation (RFC 7009) of the refresh token ends the grant: the access token gets the 401,
  // with the challenge that starts the flow again.
  const revoked = await fetch(`${EDGE}/revoke`, {
    method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({ token: refreshed.refresh_token, client_id: provider.client.client_id }),
  });
  assert.equal(revoked.status, 200);
  const dead = await toolsList(refreshed.access_token);
  assert.equal(dead.status, 401);
  assert.match(dead.headers.get("www-authenticate"), /resource_metadata="[^"]+\/\.well-known\/oauth-protected-resource"/);
  // And the SDK, its refresh token spent with the grant, is sent back to the member.
  provider.authorizationUrl = undefined;
  const again = new StreamableHTTPClientTransport(url, { authProvider: provider });
  await assert.rejects(new Client({ name: "ts-oauth", version: "1.0.0" }).connect(again), UnauthorizedError);
  assert.ok(provider.authorizationUrl, "a new authorization is asked for");
});
