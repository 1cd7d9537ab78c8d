// Push consumers with the official JavaScript client (@nats-io/jetstream 3.4's
// jsm.consumers.add with a deliver_subject, js.consumers.getPushConsumer and its consume()),
// driven by tests/bridge/test_push_consumers_js.py: one JSON command per line on stdin, one
// JSON answer per line ({"ok": ...} or {"failed": ...}). consume() runs in the background and
// acks each message; `received` reports what arrived so far.
import { createInterface } from "node:readline";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";

let nc = null;
let js = null;
let jsm = null;
const received = [];
const notices = {};
let messages = null;

const COMPARED = ["durable_name", "deliver_subject", "deliver_group", "ack_policy",
  "idle_heartbeat", "flow_control", "filter_subject", "max_ack_pending"];

function failure(err) {
  return { code: err.api_error?.code ?? err.code ?? null,
    err_code: err.api_error?.err_code ?? null, description: err.message };
}

const commands = {
  async connect({ servers }) {
    nc = await connect({ servers });
    js = jetstream(nc);
    jsm = await jetstreamManager(nc);
    return true;
  },
  async add({ stream, config }) {
    const ci = await jsm.consumers.add(stream, config);
    const seen = {};
    for (const key of COMPARED) seen[key] = ci.config[key] ?? null;
    return { name: ci.name, config: seen, push_bound: ci.push_bound ?? false };
  },
  async consume({ stream, name }) {
    const consumer = await js.consumers.getPushConsumer(stream, name);
    messages = await consumer.consume();
    (async () => {
      for await (const s of messages.status()) notices[s.type] = (notices[s.type] ?? 0) + 1;
    })();
    (async () => {
      for await (const m of messages) {
        const info = m.info;
        received.push({
          subject: m.subject,
          data: m.string(),
          stream: info.stream,
          consumer: info.consumer,
          deliveryCount: info.deliveryCount,
          deliverySequence: info.deliverySequence,
          redelivered: info.redelivered,
        });
        m.ack();
      }
    })();
    return consumer.isPushConsumer();
  },
  async received() { return received; },
  async notices() { return notices; },
  async info({ stream, name }) {
    const ci = await jsm.consumers.info(stream, name);
    return { num_ack_pending: ci.num_ack_pending, num_pending: ci.num_pending,
      delivered: ci.delivered.consumer_seq, push_bound: ci.push_bound ?? false };
  },
  async stop() { await messages?.close(); return true; },
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
