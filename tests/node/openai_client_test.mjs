// End-to-end test of `corolla serve` with the official openai npm client: starts the server on
// a free port with the built-in model (CPU), runs chat, streaming chat, completions, logprobs
// and error cases, then sends SIGTERM and expects a clean exit (0).
// Usage: node openai_client_test.mjs [path/to/corolla]   (run from anywhere)
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');
const binary = process.argv[2] || process.env.COROLLA_BINARY || path.join(root, 'build/src/corolla');
const golden = JSON.parse(readFileSync(path.join(root, 'models/corolla-demo/golden-chat.json'), 'utf8'));
const apiKey = 'sk-node-test';

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function waitHealthy(base, child, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`corolla serve exited early with ${child.exitCode}`);
    try {
      const r = await fetch(`${base}/health`);
      if (r.status === 200) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('the server did not become healthy');
}

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

test('chat completion returns the golden greedy text', async (client) => {
  for (const chat of golden.chats) {
    const r = await client.chat.completions.create({ model: 'corolla-demo', messages: chat.messages, temperature: 0 });
    assert.equal(r.choices[0].message.content, chat.greedy_text);
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.usage.completion_tokens, chat.greedy_ids.length);
  }
});

test('streaming chat yields the same text and usage', async (client) => {
  const chat = golden.chats[1];
  const stream = await client.chat.completions.create({
    model: 'corolla-demo', messages: chat.messages, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '', finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, chat.greedy_text);
  assert.equal(finish, 'stop');
  assert.equal(usage.completion_tokens, chat.greedy_ids.length);
});

test('completions from text and from token ids', async (client) => {
  const chat = golden.chats[0];
  const a = await client.completions.create({ model: 'corolla-demo', prompt: chat.prompt_text, temperature: 0, max_tokens: 40 });
  assert.equal(a.choices[0].text, chat.greedy_text);
  const b = await client.completions.create({ model: 'corolla-demo', prompt: chat.prompt_ids, temperature: 0, max_tokens: 3 });
  assert.equal(b.choices[0].finish_reason, 'length');
  assert.equal(b.usage.completion_tokens, 3);
});

test('logprobs and top_logprobs', async (client) => {
  const chat = golden.chats[0];
  const r = await client.chat.completions.create({
    model: 'corolla-demo', messages: chat.messages, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, chat.greedy_ids.length);
  for (const e of content) {
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 2);
    assert.equal(e.top_logprobs[0].token, e.token);
  }
  const c = await client.completions.create({ model: 'corolla-demo', prompt: chat.prompt_text, temperature: 0, max_tokens: 4, logprobs: 1 });
  assert.equal(c.choices[0].logprobs.token_logprobs.length, 4);
});

test('n choices, streamed with their indexes', async (client) => {
  const chat = golden.chats[1];
  const r = await client.chat.completions.create({ model: 'corolla-demo', messages: chat.messages, temperature: 0, n: 2 });
  assert.deepEqual(r.choices.map((c) => [c.index, c.message.content]), [[0, chat.greedy_text], [1, chat.greedy_text]]);
  const stream = await client.completions.create({
    model: 'corolla-demo', prompt: 'Once upon a time', temperature: 1, seed: 5, max_tokens: 8, n: 3, stream: true,
  });
  const texts = ['', '', ''];
  for await (const chunk of stream) for (const c of chunk.choices) texts[c.index] += c.text;
  const one = await client.completions.create({ model: 'corolla-demo', prompt: 'Once upon a time', temperature: 1, seed: 7, max_tokens: 8 });
  assert.equal(texts[2], one.choices[0].text);  // choice i samples with seed + i
});

test('errors come back as OpenAI errors', async (client, base) => {
  await assert.rejects(client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  await assert.rejects(client.chat.completions.create({ model: 'corolla-demo', messages: [] }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'messages');
  await assert.rejects(client.chat.completions.create({ model: 'corolla-demo', messages: [{ role: 'user', content: 'hi' }], max_tokens: 0 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'max_tokens');
  const wrongKey = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  const models = await client.models.list();
  assert.equal(models.data[0].id, 'corolla-demo');
});

const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const child = spawn(binary, ['serve', '--port', String(port), '--api-key', apiKey, '--max-model-len', '512', '--threads', '2'],
  { stdio: ['ignore', 'inherit', 'inherit'] });
let failed = 0;
try {
  await waitHealthy(base, child, 60000);
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout: 60000 });
  for (const t of tests) {
    try {
      await t.fn(client, base);
      console.log(`ok   ${t.name}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${t.name}\n${e.stack || e}${e.cause ? `\ncause: ${e.cause.stack || e.cause}` : ""}`);
    }
  }
} finally {
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  child.kill('SIGTERM');
  const { code, signal } = await exited;
  if (code !== 0) {
    failed++;
    console.log(`FAIL corolla serve exited with code ${code} signal ${signal} after SIGTERM`);
  } else {
    console.log('ok   SIGTERM exits 0');
  }
}
console.log(failed ? `${failed} failed` : 'all passed');
process.exit(failed ? 1 : 0);
