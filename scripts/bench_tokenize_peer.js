#!/usr/bin/env node
// Peer benchmark for `corolla bench tokenize`: single-threaded encoding speed (MB/s) of
// @lenml/tokenizers (a JS port of transformers.js tokenizers) on the same texts: the golden
// corpus and the same generated text (the generator mirrors src/cli/bench_tokenize_cmd.cc; both
// print its checksum, which must match).
//
// usage: node scripts/bench_tokenize_peer.js --tokenizer DIR [--mb 10] [--golden-repeats 20]
//        (run from the repository root; the package is unpacked by scripts/fetch_tokenizers.sh
//        at .cache/tokenizers/pkg-tokenizers)
'use strict';
const fs = require('fs');
const path = require('path');

function parseArgs() {
  const args = { tokenizer: '', mb: 10, goldenRepeats: 20, goldenDir: 'tests/data/tokenizer-golden',
                 pkg: '.cache/tokenizers/pkg-tokenizers' };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; ++i) {
    const [name, inline] = argv[i].split('=', 2);
    const value = inline !== undefined ? inline : argv[++i];
    if (name === '--tokenizer') args.tokenizer = value;
    else if (name === '--mb') args.mb = Number(value);
    else if (name === '--golden-repeats') args.goldenRepeats = Number(value);
    else if (name === '--golden-dir') args.goldenDir = value;
    else if (name === '--package') args.pkg = value;
    else { console.error(`unknown option ${name}`); process.exit(2); }
  }
  if (!args.tokenizer) { console.error('--tokenizer DIR is required'); process.exit(2); }
  return args;
}

// Mirror of GenerateText in src/cli/bench_tokenize_cmd.cc.
function generateText(numBytes) {
  const words = ['the', 'of', 'and', 'to', 'in', 'is', 'that', 'for', 'it', 'with', 'as', 'was',
                 'on', 'are', 'by', 'this', 'be', 'from', 'or', 'have', 'model', 'token', 'server',
                 'request', 'return', 'value', 'error', 'function', 'memory', 'expert', 'layer',
                 'attention', 'cache'];
  const syllables = ['ka', 'ri', 'to', 'mon', 'zel', 'qua', 'ber', 'lin', 'dor', 'fi', 'ga', 'hu',
                     'sto', 'pre', 'ment', 'tion', 'ex', 'ul'];
  const punct = ['.', ',', '!', '?', ';', ':', '(', ')', '"', "'", '->', '==', '{', '}', '[', ']',
                 '#', '//', '+=', '...'];
  let state = 12345;
  const next = () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state >>> 8;
  };
  const parts = [];
  let size = 0;
  const add = (s) => { parts.push(s); size += Buffer.byteLength(s); };
  while (size < numBytes) {
    const r = next() % 100;
    if (r < 40) {
      add(words[next() % words.length]);
    } else if (r < 55) {
      for (let k = 2 + next() % 3; k > 0; --k) add(syllables[next() % syllables.length]);
    } else if (r < 63) {
      add(String(next() % 100000));
    } else if (r < 72) {
      for (let k = 1 + next() % 6; k > 0; --k) add(String.fromCodePoint(0x4E00 + next() % 2000));
    } else if (r < 77) {
      for (let k = 2 + next() % 6; k > 0; --k) add(String.fromCodePoint(0x430 + next() % 32));
    } else if (r < 84) {
      add(punct[next() % punct.length]);
    } else if (r < 90) {
      add('\n' + ' '.repeat(next() % 9));
      continue;
    } else if (r < 93) {
      add(String.fromCodePoint(0x1F600 + next() % 80));
    } else {
      add('var_');
      add(syllables[next() % syllables.length]);
      add(String(next() % 100));
    }
    add(' ');
  }
  return Buffer.from(parts.join(''), 'utf8');
}

function fnv1a(buf) {
  let h = 2166136261;
  for (const b of buf) h = Math.imul(h ^ b, 16777619) >>> 0;
  return h.toString(16).padStart(8, '0');
}

function main() {
  const args = parseArgs();
  const { TokenizerLoader } = require(path.resolve(args.pkg, 'dist/main.js'));
  const readJson = (p) => JSON.parse(fs.readFileSync(p, 'utf8'));
  let t0 = process.hrtime.bigint();
  const configPath = path.join(args.tokenizer, 'tokenizer_config.json');
  const tok = TokenizerLoader.fromPreTrained({
    tokenizerJSON: readJson(path.join(args.tokenizer, 'tokenizer.json')),
    tokenizerConfig: fs.existsSync(configPath) ? readJson(configPath) : {},
  });
  const seconds = (t) => Number(process.hrtime.bigint() - t) / 1e9;
  const loadS = seconds(t0);

  const golden = [];
  for (const name of ['qwen3', 'deepseek_v3'])
    for (const c of readJson(path.join(args.goldenDir, `${name}.json`)).cases) golden.push(c.text);
  let goldenBytes = 0, goldenTokens = 0;
  t0 = process.hrtime.bigint();
  for (let r = 0; r < args.goldenRepeats; ++r)
    for (const text of golden) {
      goldenTokens += tok.encode(text, { add_special_tokens: false }).length;
      goldenBytes += Buffer.byteLength(text);
    }
  const goldenS = seconds(t0);

  const big = generateText(args.mb * 1024 * 1024);
  const chunks = [];
  for (let pos = 0; pos < big.length;) {
    let cut = big.length - pos <= 4096 ? big.length : big.indexOf(10, pos + 4096);
    if (cut < 0) cut = big.length;
    chunks.push(big.subarray(pos, cut).toString('utf8'));
    pos = cut;
  }
  let bigTokens = 0;
  t0 = process.hrtime.bigint();
  for (const chunk of chunks) bigTokens += tok.encode(chunk, { add_special_tokens: false }).length;
  const bigS = seconds(t0);

  console.log(`@lenml/tokenizers bench: ${args.tokenizer} (load ${loadS.toFixed(2)} s), single thread`);
  console.log(`  golden corpus: ${golden.length} texts x ${args.goldenRepeats} passes, ` +
              `${(goldenBytes / 1e6).toFixed(2)} MB, ${goldenTokens} tokens: ` +
              `${(goldenBytes / 1e6 / goldenS).toFixed(1)} MB/s`);
  console.log(`  generated text (checksum ${fnv1a(big)}, ${big.length} bytes) in ${chunks.length} ` +
              `chunks, ${bigTokens} tokens: ${(big.length / 1e6 / bigS).toFixed(1)} MB/s`);
}

main();
