// A real OpenID provider (oidc-provider, pinned in package.json) on a loopback port, for the
// OAuth tests: the tests sign in against it as an MCP agent would, with nothing mocked.
//
// Usage: node oidc_provider.mjs CONFIG.json [PORT]
//
// When it listens it prints ONE line on stdout: {"issuer": "http://127.0.0.1:PORT", "port": PORT}
// (PORT 0, the default, picks a free one). SIGTERM or SIGINT stops it.
//
// CONFIG (JSON):
//   "accounts":  {LOGIN: {"password", "email", "groups": [...], "roles": [...]}}  (sub = LOGIN);
//                an account's "idToken": {CLAIM: value} makes the provider misbehave for
//                the relying-party tests: its ID tokens get these claims (aud, nonce, iss,
//                exp ...) after they are made, signed again with the provider's own key
//   "clients":   [oidc-provider client metadata: client_id, client_secret, redirect_uris,
//                 grant_types, token_endpoint_auth_method, scope, ...]; an extra key
//                 "claims": {"email", "groups", "roles"} is put into that client's
//                 client_credentials access tokens (it is not client metadata)
//   "resources": {RESOURCE_URL: {"scope": "space separated", "audience"?: string,
//                 "ttl"?: seconds, "format"?: "jwt" (default) | "opaque"}}; any other
//                 resource indicator is refused (invalid_target)
//   "defaultResource"?: RESOURCE_URL used when a request names none
//   "consent"?:  "auto" (default: the consent prompt is granted as requested) or "form"
//                (GET /interaction/UID renders a form that posts to /interaction/UID/confirm)
//   "scopes"?:   extra scope values to accept (resource scopes and openid, offline_access,
//                email, groups, roles are always accepted)
//   "jwks"?:     {"keys": [private JWKs]}; default: a fresh RSA key (RS256) per start
//   "port"?:     like the PORT argument
//
// Access tokens for a resource are RS256 JWTs (typ at+jwt) with aud = the resource URL (or its
// "audience"), scope, client_id, and the account's email, groups and roles. Login and consent
// are plain HTML forms so that an HTTP client can drive them (tests/support/oidc.py).

import {
  createPrivateKey,
  generateKeyPairSync,
  randomBytes,
  randomUUID,
  sign,
  timingSafeEqual,
} from "node:crypto";
import { readFileSync } from "node:fs";
import http from "node:http";
import Provider, { errors } from "oidc-provider";

const BASE_SCOPES = ["openid", "offline_access", "email", "groups", "roles"];
const CLAIMS = {
  openid: ["sub"],
  email: ["email", "email_verified"],
  groups: ["groups"],
  roles: ["roles"],
};
const FORM_LIMIT_BYTES = 64 * 1024;
const UID = /^\/interaction\/([A-Za-z0-9_-]{1,64})(?:\/(login|confirm|abort))?$/;

const config = JSON.parse(readFileSync(process.argv[2], "utf8"));
const accounts = config.accounts ?? {};
const resources = config.resources ?? {};
const consentMode = config.consent ?? "auto";
const clientClaims = new Map();
const clients = (config.clients ?? []).map(({ claims, ...metadata }) => {
  if (claims) clientClaims.set(metadata.client_id, claims);
  return metadata;
});

function signingKeys() {
  if (config.jwks) return config.jwks;
  const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  return { keys: [{ ...privateKey.export({ format: "jwk" }), kid: randomUUID(), use: "sig", alg: "RS256" }] };
}

const KEYS = signingKeys();

// An account's "idToken" overrides: its ID token's payload changed, signed again (RS256).
function tamperIdToken(token) {
  const [header, body] = token.split(".");
  const payload = JSON.parse(Buffer.from(body, "base64url").toString("utf8"));
  const account = Object.hasOwn(accounts, payload.sub) ? accounts[payload.sub] : undefined;
  if (!account?.idToken) return token;
  const head = JSON.parse(Buffer.from(header, "base64url").toString("utf8"));
  const jwk = KEYS.keys.find((key) => key.kid === head.kid) ?? KEYS.keys[0];
  const changed = Buffer.from(JSON.stringify({ ...payload, ...account.idToken })).toString("base64url");
  const input = `${header}.${changed}`;
  const signature = sign("sha256", Buffer.from(input), createPrivateKey({ key: jwk, format: "jwk" }));
  return `${input}.${signature.toString("base64url")}`;
}

function accountClaims(login) {
  const account = accounts[login];
  return { email: account.email, groups: account.groups ?? [], roles: account.roles ?? [] };
}

function scopesAccepted() {
  const all = new Set([...BASE_SCOPES, ...(config.scopes ?? [])]);
  for (const { scope } of Object.values(resources)) {
    for (const value of (scope ?? "").split(" ")) if (value) all.add(value);
  }
  return [...all];
}

function passwordMatches(login, password) {
  const account = Object.hasOwn(accounts, login) ? accounts[login] : undefined;
  if (!account || typeof password !== "string") return false;
  const expected = Buffer.from(String(account.password));
  const given = Buffer.from(password);
  return expected.length === given.length && timingSafeEqual(expected, given);
}

function configuration() {
  return {
    clients,
    jwks: KEYS,
    cookies: { keys: [randomBytes(32).toString("base64url")] },
    scopes: scopesAccepted(),
    claims: CLAIMS,
    // Scope claims (email, groups, roles) in ID tokens too, not only at userinfo.
    conformIdTokenClaims: false,
    responseTypes: ["code"],
    clientBasedCORS: () => false,
    async findAccount(_ctx, id) {
      if (!Object.hasOwn(accounts, id)) return undefined;
      return {
        accountId: id,
        async claims() {
          return { sub: id, email_verified: true, ...accountClaims(id) };
        },
      };
    },
    async extraTokenClaims(_ctx, token) {
      if (token.accountId && Object.hasOwn(accounts, token.accountId)) {
        return accountClaims(token.accountId);
      }
      if (!token.accountId && clientClaims.has(token.clientId)) {
        return clientClaims.get(token.clientId);
      }
      return undefined;
    },
    // A refresh token with every authorization code whose client may use one: MCP clients
    // register refresh_token without asking for offline_access.
    async issueRefreshToken(_ctx, client, code) {
      return client.grantTypeAllowed("refresh_token") && code.kind === "AuthorizationCode";
    },
    pkce: { required: (_ctx, client) => client.clientAuthMethod === "none" },
    interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      introspection: { enabled: true },
      revocation: { enabled: true },
      registration: { enabled: true },
      resourceIndicators: {
        enabled: true,
        async defaultResource(_ctx, _client, oneOf) {
          return oneOf ?? config.defaultResource ?? undefined;
        },
        // The one resource of a grant is the token's audience even when openid is asked too.
        useGrantedResource: async () => true,
        async getResourceServerInfo(_ctx, indicator) {
          const server = Object.hasOwn(resources, indicator) ? resources[indicator] : undefined;
          if (!server) throw new errors.InvalidTarget();
          return {
            scope: server.scope ?? "",
            audience: server.audience ?? indicator,
            accessTokenTTL: server.ttl ?? 3600,
            // "opaque": a reference token the resource server must introspect (RFC 7662).
            accessTokenFormat: server.format === "opaque" ? "opaque" : "jwt",
            ...(server.format === "opaque" ? {} : { jwt: { sign: { alg: "RS256" } } }),
          };
        },
      },
    },
  };
}

// --- the interactions: plain forms, no script ----------------------------------------------

const escapeHtml = (value) =>
  String(value).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

function page(res, status, title, body) {
  res.statusCode = status;
  res.setHeader("Content-Type", "text/html; charset=utf-8");
  res.setHeader("Cache-Control", "no-store");
  res.end(`<!DOCTYPE html><html><head><title>${escapeHtml(title)}</title></head><body>${body}</body></html>`);
}

function loginForm(res, uid, refused) {
  const note = refused ? '<p id="error">Invalid login or password.</p>' : "";
  page(
    res,
    200,
    "Sign in",
    `<h1>Sign in</h1>${note}<form method="post" action="/interaction/${escapeHtml(uid)}/login">` +
      '<input type="text" name="login" autocomplete="username">' +
      '<input type="password" name="password" autocomplete="current-password">' +
      '<button type="submit">Sign in</button></form>',
  );
}

function consentForm(res, uid, details) {
  const items = Object.entries(details.missingResourceScopes ?? {})
    .map(([resource, scopes]) => `<li>${escapeHtml(resource)}: ${escapeHtml(scopes.join(" "))}</li>`)
    .join("");
  page(
    res,
    200,
    "Authorize",
    `<h1>Authorize</h1><ul>${items}</ul><form method="post" action="/interaction/${escapeHtml(uid)}/confirm">` +
      '<input type="hidden" name="confirm" value="yes"><button type="submit">Allow</button></form>',
  );
}

async function readForm(req) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > FORM_LIMIT_BYTES) throw new Error("form too large");
    chunks.push(chunk);
  }
  return new URLSearchParams(Buffer.concat(chunks).toString("utf8"));
}

async function grantConsent(provider, req, res, details) {
  const { prompt, params, session } = details;
  const grant = details.grantId
    ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  const missing = prompt.details;
  if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(" "));
  if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
  for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes ?? {})) {
    grant.addResourceScope(indicator, scopes.join(" "));
  }
  const grantId = await grant.save();
  const consent = details.grantId ? {} : { grantId };
  await provider.interactionFinished(req, res, { consent }, { mergeWithLastSubmission: true });
}

async function interaction(provider, req, res, uid, action) {
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) throw new errors.SessionNotFound("interaction session id cookie not found");
  const prompt = details.prompt.name;
  if (req.method === "GET" && action === "abort") {
    const result = { error: "access_denied", error_description: "End-User aborted interaction" };
    return provider.interactionFinished(req, res, result, { mergeWithLastSubmission: false });
  }
  if (req.method === "GET" && action === undefined) {
    if (prompt === "login") return loginForm(res, uid, false);
    if (prompt === "consent" && consentMode === "auto") return grantConsent(provider, req, res, details);
    if (prompt === "consent") return consentForm(res, uid, details.prompt.details);
  }
  if (req.method === "POST" && action === "login" && prompt === "login") {
    const form = await readForm(req);
    const login = form.get("login") ?? "";
    if (!passwordMatches(login, form.get("password"))) return loginForm(res, uid, true);
    const result = { login: { accountId: login } };
    return provider.interactionFinished(req, res, result, { mergeWithLastSubmission: false });
  }
  if (req.method === "POST" && action === "confirm" && prompt === "consent") {
    await readForm(req);
    return grantConsent(provider, req, res, details);
  }
  return page(res, 400, "Bad request", "<p>This step does not fit the sign-in in progress.</p>");
}

// --- serving -------------------------------------------------------------------------------

let handler;
const server = http.createServer((req, res) => handler(req, res));
const port = Number(process.argv[3] ?? config.port ?? 0);

server.listen(port, "127.0.0.1", () => {
  const actual = server.address().port;
  const issuer = `http://127.0.0.1:${actual}`;
  const provider = new Provider(issuer, configuration());
  const issueIdToken = provider.IdToken.prototype.issue;
  provider.IdToken.prototype.issue = async function issue(options) {
    const token = await issueIdToken.call(this, options);
    return options?.use === "idtoken" ? tamperIdToken(token) : token;
  };
  const callback = provider.callback();
  handler = (req, res) => {
    const match = UID.exec(new URL(req.url, issuer).pathname);
    if (!match) return callback(req, res);
    interaction(provider, req, res, match[1], match[2]).catch((error) => {
      if (res.headersSent) return res.destroy();
      if (error instanceof errors.SessionNotFound) {
        return page(res, 400, "Session not found", "<p>The sign-in session was not found.</p>");
      }
      process.stderr.write(`interaction error: ${error?.stack ?? error}\n`);
      return page(res, 500, "Error", "<p>The sign-in failed.</p>");
    });
  };
  process.stdout.write(`${JSON.stringify({ issuer, port: actual })}\n`);
});

function stop() {
  server.close(() => process.exit(0));
  server.closeAllConnections();
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
