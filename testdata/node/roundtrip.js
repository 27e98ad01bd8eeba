// roundtrip.js publishes messages with attributes through the official Node
// client and receives them back, against whatever PUBSUB_EMULATOR_HOST
// points at. It prints one JSON line per received message and exits 0 when
// all came back intact, 1 otherwise. Used by the broker's Go tests.
'use strict';

const {PubSub} = require('@google-cloud/pubsub');

async function main() {
  if (!process.env.PUBSUB_EMULATOR_HOST) {
    throw new Error('PUBSUB_EMULATOR_HOST is not set');
  }
  const suffix = process.env.ROUNDTRIP_SUFFIX || String(Date.now());
  const pubsub = new PubSub({projectId: 'dedupflow-node'});
  const [topic] = await pubsub.createTopic(`node-topic-${suffix}`);
  const [sub] = await topic.createSubscription(`node-sub-${suffix}`, {ackDeadlineSeconds: 10});

  const sent = new Map();
  for (let i = 0; i < 5; i++) {
    const attributes = {idx: String(i), lang: 'node', 'unicode-ü': 'värde'};
    const data = Buffer.from(`hello from node ${i}`);
    const id = await topic.publishMessage({data, attributes});
    sent.set(id, {data: data.toString(), attributes});
  }

  const received = new Map();
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timeout: received ${received.size} of ${sent.size}`)), 20000);
    sub.on('error', err => { clearTimeout(timer); reject(err); });
    sub.on('message', msg => {
      received.set(msg.id, {data: msg.data.toString(), attributes: msg.attributes});
      console.log(JSON.stringify({id: msg.id, data: msg.data.toString(), attributes: msg.attributes}));
      msg.ack();
      if (received.size === sent.size) { clearTimeout(timer); resolve(); }
    });
  });
  await sub.close();

  let ok = true;
  for (const [id, want] of sent) {
    const got = received.get(id);
    if (!got || got.data !== want.data || JSON.stringify(sortKeys(got.attributes)) !== JSON.stringify(sortKeys(want.attributes))) {
      console.error(`message ${id}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
      ok = false;
    }
  }
  await sub.delete();
  await topic.delete();
  await pubsub.close();
  process.exit(ok ? 0 : 1);
}

function sortKeys(o) {
  return Object.fromEntries(Object.entries(o).sort(([a], [b]) => a.localeCompare(b)));
}

main().catch(err => { console.error(err); process.exit(1); });
