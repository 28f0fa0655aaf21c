// Sign in to an MCP server with the official TypeScript SDK's own OAuth flow, as an MCP host
// does: protected resource metadata, authorization server discovery, dynamic client
// registration, an authorization code with PKCE, then the tools.
//
// Usage: node oauth_flow.mjs PLAN.json
//
// PLAN: {"url": "http://127.0.0.1:P/mcp", "redirect_uri": "http://127.0.0.1:CB/callback",
//        "client_metadata": {...overrides of the registered metadata}, "scope": "...",
//        "client_information": {"client_id": ...} (optional: a pre-registered client, no DCR),
//        "calls": [{"name": "...", "arguments": {...}}],
//        "calls_after_refresh": [...]}  (optional: then the access token is spoiled, so that
//        the server answers 401 and the SDK refreshes it with the refresh token, and these run)
//
// The browser is the caller's: when the SDK redirects to the authorization server, this prints
// one line {"authorize": URL} on stdout and reads one line on stdin, the URL the browser was
// redirected to at redirect_uri (with code and state, or error). The state is checked here: the
// SDK does not check it. At most MAX_AUTHORIZATIONS sign-ins are asked for. A call the
// server answers 403 insufficient_scope (step-up) makes the SDK ask for another sign-in with
// the scope the challenge names; the call is then retried once ({"result", "stepped_up"}).
//
// Output, last line on stdout:
//   {"tools": [names], "calls": [{"result": CallToolResult} | {"threw": message}],
//    "calls_after_refresh": [...] (when asked), "refreshed": whether the tokens changed,
//    "tokens": {"scope", "token_type", "has_refresh_token"}, "authorizations": N,
//    "registration": {"token_endpoint_auth_method", "grant_types", "scope"},
//    "authorize_params": [{"resource", "scope", "code_challenge_method", "has_state"}],
//    "iss": [the iss parameter of each authorization response, or null],
//    "token_requests": [{"grant_type", "resource"}]}
// No token or secret is ever printed. On failure: one line {"error": "..."} and exit status 1.

import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const CLIENT_INFO = { name: "nexus-mcp-tests-oauth", version: "1.0.0" };
const REQUEST_TIMEOUT_MS = 60_000;
const MAX_AUTHORIZATIONS = 4;

class FlowFailed extends Error {}

// The OAuthClientProvider of SDK 1.32.2 (client/auth.d.ts), all in memory.
class MemoryOAuthProvider {
  constructor(plan) {
    this.plan = plan;
    // A client registered beforehand (no dynamic registration), as an operator gives one.
    this.client = plan.client_information;
    this.saved = undefined;
    this.verifier = undefined;
    this.lastState = undefined;
    this.pending = undefined;
  }

  get redirectUrl() {
    return this.plan.redirect_uri;
  }

  get clientMetadata() {
    return {
      client_name: CLIENT_INFO.name,
      redirect_uris: [this.plan.redirect_uri],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      token_endpoint_auth_method: "none",
      ...(this.plan.scope ? { scope: this.plan.scope } : {}),
      ...(this.plan.client_metadata ?? {}),
    };
  }

  state() {
    this.lastState = randomBytes(16).toString("base64url");
    return this.lastState;
  }

  clientInformation() {
    return this.client;
  }

  saveClientInformation(information) {
    this.client = information;
  }

  tokens() {
    return this.saved;
  }

  saveTokens(tokens) {
    this.saved = tokens;
  }

  redirectToAuthorization(url) {
    this.pending = new URL(url);
  }

  saveCodeVerifier(verifier) {
    this.verifier = verifier;
  }

  codeVerifier() {
    if (!this.verifier) throw new FlowFailed("no code verifier saved");
    return this.verifier;
  }

  invalidateCredentials(scope) {
    if (scope === "all" || scope === "client") this.client = undefined;
    if (scope === "all" || scope === "tokens") this.saved = undefined;
    if (scope === "all" || scope === "verifier") this.verifier = undefined;
  }
}

// Records what the SDK sends to a token endpoint (grant type and resource, never secrets).
function recordingFetch(tokenRequests) {
  return async (input, init) => {
    const body = init?.body;
    if (body instanceof URLSearchParams && body.has("grant_type")) {
      tokenRequests.push({ grant_type: body.get("grant_type"), resource: body.get("resource") });
    }
    return fetch(input, init);
  };
}

function authorizeParams(url) {
  const params = url.searchParams;
  return {
    resource: params.get("resource"),
    scope: params.get("scope"),
    code_challenge_method: params.get("code_challenge_method"),
    has_state: params.has("state"),
  };
}

async function main() {
  const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));
  const stdin = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  const provider = new MemoryOAuthProvider(plan);
  const tokenRequests = [];
  const authorizeSeen = [];
  const issSeen = [];
  const client = new Client(CLIENT_INFO, { capabilities: {} });
  const newTransport = () =>
    new StreamableHTTPClientTransport(new URL(plan.url), {
      authProvider: provider,
      fetch: recordingFetch(tokenRequests),
    });

  // One sign-in: the authorize URL out, the browser's redirect in, the code to the SDK.
  const signIn = async (current) => {
    const authorizeUrl = provider.pending;
    provider.pending = undefined;
    authorizeSeen.push(authorizeParams(authorizeUrl));
    if (authorizeSeen.length > MAX_AUTHORIZATIONS) {
      throw new FlowFailed("the server kept asking for authorization");
    }
    process.stdout.write(`${JSON.stringify({ authorize: authorizeUrl.href })}\n`);
    const line = await stdin.next();
    if (line.done) throw new FlowFailed("no redirect URL on stdin");
    const redirect = new URL(line.value.trim());
    const params = redirect.searchParams;
    issSeen.push(params.get("iss"));
    if (params.has("error")) {
      throw new FlowFailed(`authorization refused: ${params.get("error")}`);
    }
    if (!provider.lastState || params.get("state") !== provider.lastState) {
      throw new FlowFailed("state mismatch");
    }
    const code = params.get("code");
    if (!code) throw new FlowFailed("no code in the redirect");
    await current.finishAuth(code);
  };

  let transport = newTransport();
  for (;;) {
    try {
      await client.connect(transport, { timeout: REQUEST_TIMEOUT_MS });
      break;
    } catch (error) {
      if (!(error instanceof UnauthorizedError) || !provider.pending) throw error;
    }
    await signIn(transport);
    transport = newTransport();
  }

  const options = { timeout: REQUEST_TIMEOUT_MS };
  try {
    const { tools } = await client.listTools({}, options);
    const runCalls = async (list) => {
      const results = [];
      for (const call of list ?? []) {
        const params = { name: call.name, arguments: call.arguments ?? {} };
        try {
          results.push({ result: await client.callTool(params, undefined, options) });
        } catch (error) {
          if (error instanceof UnauthorizedError && provider.pending) {
            // Step-up (403 insufficient_scope): sign in again for the scope, then retry.
            try {
              await signIn(transport);
              results.push({ result: await client.callTool(params, undefined, options), stepped_up: true });
            } catch (again) {
              results.push({ threw: again instanceof Error ? again.message : String(again) });
            }
            continue;
          }
          results.push({ threw: error instanceof Error ? error.message : String(error) });
        }
      }
      return results;
    };
    const calls = await runCalls(plan.calls);
    const extra = {};
    if (plan.calls_after_refresh) {
      const before = provider.saved;
      provider.saved = { ...before, access_token: `${before?.access_token ?? ""}spoiled` };
      extra.calls_after_refresh = await runCalls(plan.calls_after_refresh);
      extra.refreshed = provider.saved.access_token !== `${before?.access_token ?? ""}spoiled`;
    }
    const tokens = provider.saved ?? {};
    const registered = provider.client ?? {};
    return {
      tools: tools.map((tool) => tool.name),
      calls,
      ...extra,
      tokens: {
        scope: tokens.scope ?? null,
        token_type: tokens.token_type ?? null,
        has_refresh_token: Boolean(tokens.refresh_token),
      },
      authorizations: authorizeSeen.length,
      registration: {
        token_endpoint_auth_method: registered.token_endpoint_auth_method ?? null,
        grant_types: registered.grant_types ?? null,
        scope: registered.scope ?? null,
      },
      authorize_params: authorizeSeen,
      iss: issSeen,
      token_requests: tokenRequests,
    };
  } finally {
    await transport.terminateSession().catch(() => {});
    await client.close();
  }
}

try {
  const out = await main();
  process.stdout.write(`${JSON.stringify(out)}\n`);
  process.exit(0);
} catch (error) {
  const message = error instanceof Error ? error.message : String(error);
  process.stdout.write(`${JSON.stringify({ error: message.split("\n")[0] })}\n`);
  process.exit(1);
}
