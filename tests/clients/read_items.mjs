// Drive nexus-mcp's prompts and resources with the official TypeScript SDK over stdio:
// connect, list prompts, resources and templates, then read and get what the plan names,
// and print what the SDK returned (or the error it threw: its code and message).
//
// Usage: node read_items.mjs PLAN.json
//   PLAN: {"command": "...", "args": [...], "env": {...}, "reads": [URI...],
//          "prompts": [{"name": "...", "arguments": {...}}]}
// Output (stdout, one JSON document):
//   {"prompts": [...], "resources": [...], "templates": [...],
//    "reads": [{"result": ...} | {"threw": {"code": N, "message": "..."}}],
//    "gets": [...likewise...]}

import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const TIMEOUT = { timeout: 60_000 };

function thrown(error) {
  return { threw: { code: error?.code ?? null, message: error instanceof Error ? error.message : String(error) } };
}

const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));
const client = new Client({ name: "nexus-mcp-tests-ts-items", version: "1.0.0" }, { capabilities: {} });
await client.connect(
  new StdioClientTransport({ command: plan.command, args: plan.args, env: plan.env, stderr: "inherit" }),
  TIMEOUT,
);
try {
  const { prompts } = await client.listPrompts({}, TIMEOUT);
  const { resources } = await client.listResources({}, TIMEOUT);
  const { resourceTemplates } = await client.listResourceTemplates({}, TIMEOUT);
  const reads = [];
  for (const uri of plan.reads ?? []) {
    try {
      reads.push({ result: await client.readResource({ uri }, TIMEOUT) });
    } catch (error) {
      reads.push(thrown(error));
    }
  }
  const gets = [];
  for (const prompt of plan.prompts ?? []) {
    try {
      gets.push({ result: await client.getPrompt(prompt, TIMEOUT) });
    } catch (error) {
      gets.push(thrown(error));
    }
  }
  process.stdout.write(`${JSON.stringify({ prompts, resources, templates: resourceTemplates, reads, gets })}\n`);
} finally {
  await client.close();
}
