// The TypeScript SDK's MCP client, driven by tests/test_mcp_interop.py: it starts the
// command after `--` (the gate proxy) on stdio, or connects to `--url` over streamable
// HTTP (`evidence serve`'s /mcp, with `Authorization: Bearer $EVIDENCE_TOKEN`: the token
// never on the command line), initializes, lists the tools, makes the calls given as
// JSON and prints one JSON document on stdout, as the SDK hands it over.
//
//   node ts_client.mjs '{"calls": [{"name": "echo", "arguments": {...}, "meta": {...}}]}' \
//     -- COMMAND ARGS...
//   EVIDENCE_TOKEN=evd_... node ts_client.mjs JOB_JSON --url http://127.0.0.1:8750/mcp
//
// Every call is made after `tools/list`, as an agent does: the SDK then knows each
// tool's output schema and checks a result's `structuredContent` against it. A call the
// SDK answers with an exception (an MCP error, or its own check failing) is printed as
// `{"error": {"name", "code", "message"}}`, never as a result. Exit 0 once the calls
// were made (whatever they answered); 1 (and `{"fatal": ...}`) if the session failed.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const TIMEOUT_MS = 60_000;

function errorOf(err) {
  return {
    name: err?.name ?? typeof err,
    code: typeof err?.code === "number" ? err.code : null,
    message: String(err?.message ?? err),
  };
}

function transportOf(argv) {
  if (argv[1] === "--url" && argv.length === 3) {
    const headers = { Authorization: `Bearer ${process.env.EVIDENCE_TOKEN ?? ""}` };
    return new StreamableHTTPClientTransport(new URL(argv[2]), { requestInit: { headers } });
  }
  const split = argv.indexOf("--");
  if (split !== 1 || argv.length < 3) {
    throw new Error("usage: ts_client.mjs JOB_JSON (-- COMMAND ARGS... | --url URL)");
  }
  const [command, ...args] = argv.slice(split + 1);
  // The proxy gets this process's whole environment (the SDK's default keeps only a few
  // variables): the ledger's key and state directory, PYTHONPATH, the confinement's
  // additions.
  return new StdioClientTransport({ command, args, env: { ...process.env } });
}

async function main(argv) {
  const transport = transportOf(argv);
  const job = JSON.parse(argv[0]);
  const client = new Client({ name: "evidence-interop-ts", version: "0.1.0" });
  const out = { calls: [] };
  await client.connect(transport, { timeout: TIMEOUT_MS });
  try {
    out.server = client.getServerVersion() ?? null;
    out.instructions = client.getInstructions() ?? null;
    const listed = await client.listTools(undefined, { timeout: TIMEOUT_MS });
    out.tools = listed.tools.map((t) => ({
      name: t.name,
      inputSchema: t.inputSchema,
      outputSchema: t.outputSchema ?? null,
    }));
    for (const call of job.calls ?? []) {
      const params = { name: call.name, arguments: call.arguments ?? {} };
      if (call.meta) params._meta = call.meta;
      try {
        const result = await client.callTool(params, undefined, { timeout: TIMEOUT_MS });
        out.calls.push({ name: call.name, result });
      } catch (err) {
        out.calls.push({ name: call.name, error: errorOf(err) });
      }
    }
  } finally {
    await client.close();
  }
  return out;
}

main(process.argv.slice(2)).then(
  (out) => {
    process.stdout.write(`${JSON.stringify(out)}\n`);
  },
  (err) => {
    process.stdout.write(`${JSON.stringify({ fatal: errorOf(err) })}\n`);
    process.exitCode = 1;
  },
);
