#!/usr/bin/env node
// Converts js-tiktoken's o200k_base ranks into a Hugging Face tokenizer.json (byte-level BPE)
// with Muse's control tokens added as special tokens at ids 200000..202047 (design/CHAT.md).
// Usage: node t/tools/tiktoken_to_tokenizer_json.mjs OUT.json
// Needs js-tiktoken installed under t/node (npm ci --prefix t/node).
import { writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, '..', 'node', 'package.json'));
const o200k = require('js-tiktoken/ranks/o200k_base');

const FIRST_MUSE_ID = 200000;
const MUSE_VOCAB_SIZE = 202048;
const MUSE_CONTROL = new Map([
    [200000, '<|begin_of_text|>'],
    [200001, '<|end_of_text|>'],
    [200007, '<|eom|>'],
    [200008, '<|eot|>'],
    [200022, '<|start|>'],
    [200023, '<|message|>'],
]);

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the rest move to U+0100...
function byteToUnicodeTable() {
    const table = new Array(256);
    let shifted = 0;
    for (let b = 0; b < 256; b++) {
        const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        table[b] = String.fromCodePoint(printable ? b : 256 + shifted++);
    }
    return table;
}

// Ranks keyed by the token's bytes as a latin1 string (one char per byte).
function loadRanks(encoding) {
    const ranks = new Map();
    for (const line of encoding.bpe_ranks.split('\n').filter(Boolean)) {
        const [, offsetText, ...tokens] = line.split(' ');
        const offset = Number.parseInt(offsetText, 10);
        tokens.forEach((b64, i) => {
            ranks.set(Buffer.from(b64, 'base64').toString('latin1'), offset + i);
        });
    }
    return ranks;
}

// tiktoken's merge loop over the token's bytes, using only ranks below maxRank.
function partsBelowRank(bytes, ranks, maxRank) {
    const parts = bytes.split('');
    for (;;) {
        let best = -1;
        let bestRank = maxRank;
        for (let i = 0; i + 1 < parts.length; i++) {
            const rank = ranks.get(parts[i] + parts[i + 1]);
            if (rank !== undefined && rank < bestRank) {
                bestRank = rank;
                best = i;
            }
        }
        if (best < 0) return parts;
        parts.splice(best, 2, parts[best] + parts[best + 1]);
    }
}

function convert(encoding) {
    const ranks = loadRanks(encoding);
    const byteChar = byteToUnicodeTable();
    const toVocabString = (bytes) => Array.from(bytes, (c) => byteChar[c.charCodeAt(0)]).join('');
    const byRank = [...ranks.entries()].sort((a, b) => a[1] - b[1]);
    const maxRank = byRank[byRank.length - 1][1];
    if (maxRank >= FIRST_MUSE_ID) throw new Error(`o200k rank ${maxRank} collides with Muse ids`);

    const vocab = {};
    const merges = [];
    for (const [bytes, rank] of byRank) {
        vocab[toVocabString(bytes)] = rank;
        if (bytes.length < 2) continue;
        const parts = partsBelowRank(bytes, ranks, rank);
        // A token its own lower merges cannot reach gets no merge (ignore_merges finds it whole).
        if (parts.length === 2) merges.push(`${toVocabString(parts[0])} ${toVocabString(parts[1])}`);
    }

    const added = [];
    let reserved = 0;
    for (let id = FIRST_MUSE_ID; id < MUSE_VOCAB_SIZE; id++) {
        const content = MUSE_CONTROL.get(id) ?? `<|reserved_special_token_${reserved++}|>`;
        added.push({
            id,
            content,
            single_word: false,
            lstrip: false,
            rstrip: false,
            normalized: false,
            special: true,
        });
    }

    return {
        version: '1.0',
        truncation: null,
        padding: null,
        added_tokens: added,
        normalizer: null,
        pre_tokenizer: {
            type: 'Sequence',
            pretokenizers: [
                {
                    type: 'Split',
                    pattern: { Regex: encoding.pat_str },
                    behavior: 'Isolated',
                    invert: false,
                },
                { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
            ],
        },
        post_processor: null,
        decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
        model: {
            type: 'BPE',
            dropout: null,
            unk_token: null,
            continuing_subword_prefix: null,
            end_of_word_suffix: null,
            fuse_unk: false,
            byte_fallback: false,
            ignore_merges: true,
            vocab,
            merges,
        },
    };
}

const out = process.argv[2];
if (!out) {
    console.error('usage: tiktoken_to_tokenizer_json.mjs OUT.json');
    process.exit(2);
}
writeFileSync(out, JSON.stringify(convert(o200k)));
