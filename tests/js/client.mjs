// The official NATS JavaScript client (@nats-io/jetstream with @nats-io/transport-node), driven
// by tests/bridge/test_js_client.py: one JSON command per line on stdin, one JSON answer per
// line on stdout ({"ok": ...} or {"error": "..."}). Messages a command receives are kept under
// a handle, so that later commands can ack, nak, term or extend them.
import { createInterface } from "node:readline";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";

let nc = null;
let js = null;
let consumer = null;
const held = new Map();
let nextHandle = 1;
const statuses = [];

const COMPARED_HEADERS = ["Content-Type", "X-Order", "Nats-Msg-Id"];

function describe(msg) {
  const handle = nextHandle++;
  held.set(handle, msg);
  const headers = {};
  for (const name of COMPARED_HEADERS) {
    headers[name] = msg.headers ? msg.headers.get(name) || null : null;
  }
  const info = msg.info;
  return {
    handle,
    subject: msg.subject,
    data: msg.string(),
    headers,
    info: {
      stream: info.stream,
      consumer: info.consumer,
      deliveryCount: info.deliveryCount,
      redelivered: info.redelivered,
      streamSequence: info.streamSequence,
      deliverySequence: info.deliverySequence,
      pending: info.pending,
    },
  };
}

function message(args) {
  const msg = held.get(args.handle);
  if (!msg) throw new Error(`no message ${args.handle}`);
  return msg;
}

const commands = {
  async connect({ servers, checkApi }) {
    nc = await connect({ servers });
    js = jetstream(nc, { checkAPI: Boolean(checkApi) });
    return true;
  },
  async manager() {
    // jetstreamManager() asks $JS.API.INFO whether JetStream is there.
    const jsm = await jetstreamManager(nc);
    const info = await jsm.getAccountInfo();
    return { streams: info.streams, consumers: info.consumers, api_level: info.api?.level ?? null };
  },
  async consumer({ stream, name }) {
    consumer = await js.consumers.get(stream, name);
    return true;
  },
  async info() {
    const ci = await consumer.info();
    return {
      name: ci.name,
      stream_name: ci.stream_name,
      durable_name: ci.config.durable_name,
      ack_policy: ci.config.ack_policy,
      ack_wait: ci.config.ack_wait,
      max_deliver: ci.config.max_deliver,
      delivered: [ci.delivered.consumer_seq, ci.delivered.stream_seq],
      ack_floor: [ci.ack_floor.consumer_seq, ci.ack_floor.stream_seq],
      num_ack_pending: ci.num_ack_pending,
      num_redelivered: ci.num_redelivered,
      num_pending: ci.num_pending,
    };
  },
  async fetch({ max_messages, expires, idle_heartbeat }) {
    const opts = { max_messages, expires };
    if (idle_heartbeat) opts.idle_heartbeat = idle_heartbeat;
    const iter = await consumer.fetch(opts);
    const got = [];
    for await (const msg of iter) got.push(describe(msg));
    return got;
  },
  async next({ expires }) {
    const msg = await consumer.next({ expires });
    return msg ? describe(msg) : null;
  },
  async consume({ count, max_messages, ack }) {
    // Consume until `count` messages came, acking each (ack: true) as it arrives.
    const iter = await consumer.consume({ max_messages });
    const seen = [];
    (async () => {
      for await (const s of iter.status()) statuses.push(s.type);
    })().catch(() => {});
    for await (const msg of iter) {
      const described = describe(msg);
      seen.push(described);
      if (ack) msg.ack();
      if (seen.length >= count) break;
    }
    await iter.close();
    return seen;
  },
  async ordered({ stream }) {
    // No consumer name: an ordered consumer (ephemeral, ack none, recreated on a gap).
    consumer = await js.consumers.get(stream);
    return true;
  },
  async readOrdered({ count, max_messages, expires }) {
    // [data, stream sequence] of the next `count` messages, in the order they came.
    const iter = await consumer.consume({ max_messages, expires });
    const got = [];
    for await (const msg of iter) {
      got.push([msg.string(), msg.info.streamSequence]);
      if (got.length >= count) break;
    }
    await iter.close();
    return got;
  },
  async ack(args) {
    message(args).ack();
    return true;
  },
  async ackAck(args) {
    return await message(args).ackAck();
  },
  async nak(args) {
    message(args).nak(args.delay);
    return true;
  },
  async working(args) {
    message(args).working();
    return true;
  },
  async term(args) {
    message(args).term(args.reason);
    return true;
  },
  async statuses() {
    return statuses.splice(0);
  },
  async flush() {
    await nc.flush();
    return true;
  },
  async close() {
    await nc.close();
    return true;
  },
};

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  let answer;
  try {
    const { op, ...args } = JSON.parse(line);
    const run = commands[op];
    if (!run) throw new Error(`unknown op ${op}`);
    answer = { ok: await run(args) };
  } catch (err) {
    answer = { error: `${err?.name ?? "Error"}: ${err?.message ?? err}` };
  }
  process.stdout.write(JSON.stringify(answer) + "\n");
}
// stdin closed: the test is done with us. A connection left open would keep node running
// until the test's teardown gave up waiting and killed it.
if (nc && !nc.isClosed()) await nc.close();
