// Drive nexus-mcp with the official TypeScript SDK, as a host does: connect, list the
// tools (which is what makes the SDK validate structuredContent against each tool's
// outputSchema), then call tools and print what the SDK returned.
//
// Usage: node call_tools.mjs PLAN.json
//
// PLAN is a list of sessions, run one after the other. A session is
//   {"transport": "stdio", "command": "...", "args": [...], "env": {...}, "calls": [...]}
//   {"transport": "http", "url": "http://127.0.0.1:PORT/mcp", "headers": {...}, "calls": [...]}
// and a call is {"name": "...", "arguments": {...}, "meta": {...}} (meta optional).
//
// Output (stdout, one JSON document): a list with one entry per session,
//   {"tools": [...listed tools...], "calls": [{"result": CallToolResult} | {"threw": "..."}]}
// A call that throws is reported, not fatal: the tests assert that nothing threw. The exit
// status is 0 whenever every session connected, even if results are isError.

import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const CLIENT_INFO = { name: "nexus-mcp-tests-ts-sdk", version: "1.0.0" };
// Generous: a stdio session includes the server's start-up; the tests bound the whole run.
const REQUEST_TIMEOUT_MS = 60_000;

function transportFor(session) {
  if (session.transport === "stdio") {
    return new StdioClientTransport({
      command: session.command,
      args: session.args ?? [],
      env: session.env,
      cwd: session.cwd,
      stderr: "inherit",
    });
  }
  if (session.transport === "http") {
    return new StreamableHTTPClientTransport(new URL(session.url), {
      requestInit: { headers: session.headers ?? {} },
    });
  }
  throw new Error(`unknown transport: ${session.transport}`);
}

async function runSession(session) {
  const client = new Client(CLIENT_INFO, { capabilities: {} });
  const transport = transportFor(session);
  await client.connect(transport, { timeout: REQUEST_TIMEOUT_MS });
  const options = { timeout: REQUEST_TIMEOUT_MS };
  try {
    const { tools } = await client.listTools({}, options);
    const calls = [];
    for (const call of session.calls) {
      const params = { name: call.name, arguments: call.arguments ?? {} };
      if (call.meta !== undefined) params._meta = call.meta;
      try {
        calls.push({ result: await client.callTool(params, undefined, options) });
      } catch (error) {
        calls.push({ threw: error instanceof Error ? error.message : String(error) });
      }
    }
    return { tools, calls };
  } finally {
    if (transport instanceof StreamableHTTPClientTransport) {
      // End the MCP session on the server as a well-behaved host does.
      await transport.terminateSession().catch(() => {});
    }
    await client.close();
  }
}

const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));
const out = [];
for (const session of plan) {
  out.push(await runSession(session));
}
process.stdout.write(`${JSON.stringify(out)}\n`);
