// Consumer management with the official JavaScript client (@nats-io/jetstream's
// jetstreamManager), driven by tests/bridge/test_consumer_management_clients.py: one JSON
// command per line on stdin, one JSON answer per line ({"ok": ...} or {"error": ...}).
import { createInterface } from "node:readline";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";

let nc = null;
let jsm = null;

const COMPARED = ["durable_name", "name", "description", "deliver_policy", "ack_policy",
  "ack_wait", "max_deliver", "filter_subject", "max_waiting", "max_ack_pending"];

function seen(ci) {
  const config = {};
  for (const key of COMPARED) config[key] = ci.config[key] ?? null;
  return { name: ci.name, stream_name: ci.stream_name, config };
}

function failure(err) {
  return { code: err.api_error?.code ?? err.code ?? null,
    err_code: err.api_error?.err_code ?? null, description: err.message };
}

const commands = {
  async connect({ servers }) {
    nc = await connect({ servers });
    jsm = await jetstreamManager(nc);
    return true;
  },
  async add({ stream, config }) { return seen(await jsm.consumers.add(stream, config)); },
  async update({ stream, name, config }) {
    return seen(await jsm.consumers.update(stream, name, config));
  },
  async info({ stream, name }) { return seen(await jsm.consumers.info(stream, name)); },
  async list({ stream }) {
    const names = [];
    for await (const ci of jsm.consumers.list(stream)) names.push(ci.name);
    return names.sort();
  },
  async delete({ stream, name }) { return await jsm.consumers.delete(stream, name); },
  async close() { await nc.close(); return true; },
};

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  const { op, ...args } = JSON.parse(line);
  let answer;
  try {
    answer = { ok: await commands[op](args) };
  } catch (err) {
    answer = { failed: failure(err) };
  }
  process.stdout.write(JSON.stringify(answer) + "\n");
}
