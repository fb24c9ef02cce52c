#!/usr/bin/env node
// Parity of muse's BPE tokenizer with js-tiktoken's o200k_base on >= 1 MB of varied text,
// through `tokenize` / `detokenize` (run by build/t/test_tokenizer, which links the same code
// as muse-engine). Set MUSE_BUILD for another build dir, MUSE_TOKENIZE_BIN for another binary.
'use strict';
const { execFileSync, spawnSync } = require('node:child_process');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const root = path.resolve(__dirname, '..', '..');
const build = path.resolve(root, process.env.MUSE_BUILD || 'build');
const nodeDir = path.join(root, 't', 'node');
const converter = path.join(root, 't', 'tools', 'tiktoken_to_tokenizer_json.mjs');
const binary = process.env.MUSE_TOKENIZE_BIN || path.join(build, 't', 'test_tokenizer');

let testNumber = 0;
let failures = 0;
function ok(cond, name, ...diagnostics) {
    testNumber++;
    if (!cond) failures++;
    console.log(`${cond ? '' : 'not '}ok ${testNumber} - ${name}`);
    if (!cond) for (const d of diagnostics) console.log(`# ${String(d).replace(/\n/g, '\n# ')}`);
}
function bailOut(why) {
    console.log(`Bail out! ${why}`);
    process.exit(1);
}

function ensureNodeModules() {
    if (fs.existsSync(path.join(nodeDir, 'node_modules', 'js-tiktoken', 'package.json'))) return;
    const r = spawnSync('npm', ['ci', '--prefix', nodeDir, '--no-audit', '--no-fund'], {
        encoding: 'utf8',
    });
    if (r.status !== 0) bailOut(`npm ci --prefix t/node failed: ${r.stderr || r.error}`);
}

// The converted tokenizer.json, cached under build/ by the converter's and the lock's hash.
function tokenizerJson() {
    const hash = crypto.createHash('sha256');
    hash.update(fs.readFileSync(converter));
    hash.update(fs.readFileSync(path.join(nodeDir, 'package-lock.json')));
    const cacheDir = path.join(build, 'tokenizer-cache');
    const file = path.join(cacheDir, `o200k_muse-${hash.digest('hex').slice(0, 16)}.json`);
    if (fs.existsSync(file)) return file;
    fs.mkdirSync(cacheDir, { recursive: true });
    const tmp = `${file}.${process.pid}.tmp`;
    execFileSync(process.execPath, [converter, tmp], { stdio: 'inherit' });
    fs.renameSync(tmp, file);
    return file;
}

// ---- deterministic text ----

function prng(seed) {
    let s = seed >>> 0;
    return () => {
        s = (s + 0x6d2b79f5) >>> 0;
        let t = s;
        t = Math.imul(t ^ (t >>> 15), t | 1);
        t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

const WORDS = {
    english: `the of and to in is was that for it with as his on be at by had are but from or
        have an they which one you were her all she there would their we him been has when who
        will more no if out so said what up its about into than them can only other new some
        could time these two may then do first any my now such like our over man me even most
        made after also did many before must through back years where much your way well down
        should because each just those people Mr how too little state good very make world still
        own see men work long get here between both life being under never day same another know
        while last might us great old year off come since against go came right used take three
        tokenizer merges bytes encoder Unicode quickly jumped lazy fox HTTP JSON API URL iPhone
        McDonald O'Neil rock'n'roll don't can't won't it's I'm you're we've they'd she'll
        DON'T CAN'T IT'S I'M YOU'RE WE'VE THEY'D SHE'LL John's JOHN'S naïve café résumé`,
    accented: `café naïve résumé Ångström Straße œuvre mañana São Paulo Zürich Kraków Dvořák
        façade jalapeño ÉCOLE ÎLE-DE-FRANCE Ørsted Þór Ðakovo żółć Łódź İstanbul ışık Ağrı
        cœur Noël Müller Åland ELEVĒ Gödel`,
    cyrillic: `Привет мир это тест токенизатора Москва Санкт-Петербург ЖЕЛЕЗНАЯ ДОРОГА ёлка
        съешь ещё этих мягких французских булок да выпей чаю Україна їжак Ґанок Беларусь`,
    greek: `Καλημέρα κόσμε ΑΘΗΝΑ φιλοσοφία ψυχή Ωμέγα ἀρχή λόγος`,
    arabic: `مرحبا بالعالم هذا اختبار اللغة العربية مُحَمَّد كِتَابٌ الْقُرْآن ٣٤٥ ١٢`,
    hebrew: `שלום עולם זהו מבחן עִבְרִית`,
    hindi: `नमस्ते दुनिया यह एक परीक्षण है हिन्दी भाषा क्षत्रिय श्री ज्ञान १२३४ प्रोग्रामिंग`,
    thai: `สวัสดีชาวโลก ภาษาไทย การทดสอบ`,
    korean: `안녕하세요 세계 이것은 토크나이저 테스트입니다 한국어 문장 서울특별시 감사합니다`,
};
const CHINESE = `我们的世界是一个美丽的地方今天天气很好人工智能正在改变生活学习中文需要时间和耐心北京上海广州深圳`;
const CHINESE_PUNCT = ['，', '。', '！', '？', '、', '「', '」', '：', '；', '（', '）', ' '];
const JAPANESE = [
    'こんにちは', '世界', 'です', 'ありがとう', 'ございます', 'カタカナ', 'テスト', '東京都',
    '日本語', 'の', 'を', 'は', 'が', 'トークナイザー', 'ｶﾀｶﾅ', '漢字', 'ひらがな', 'ラーメン',
];
const JAPANESE_PUNCT = ['。', '、', '！', '？', '「', '」', '・', '〜', '\n'];
const EMOJI = [
    '😀', '👍', '👍🏽', '👨‍👩‍👧‍👦', '👩🏾‍💻', '🏳️‍🌈', '🏴‍☠️', '🇫🇷', '🇯🇵', '🇺🇸🇬🇧', '1️⃣', '❤️',
    '🔥🔥🔥', '✨', '🤖', '🧑‍🚀', '☕', '🎉🎊', '💯', '🙏🏻', '🫠', '⭐️', '©', '™', '→', '∑∫√', '♪',
];
const PUNCT = [
    '!!!', '???', '...', '?!', '---', '===', '***', '//', '/*', '*/', '->', '=>', '::', '<=>',
    '(((', ')))', '[]', '{}', '""', "''", '``', '“quoted”', '‘single’', '—', '–', '…', '«»',
    '<|eot|>', '<|start|>', '<|endoftext|>', '<|message|>', '#!', '@@', '$$', '%%', '^_^',
    ';)', ':-)', '¿¡', '§', '¶', '•', "'s", "'ll", "'re", "'ve", "'d", "'m", "'t", "'S", "'LL",
    '’s', '’ll',
];
const CODE = [
    `#include <stdio.h>\n\nint main(int argc, char **argv)\n{\n\tfor (int i = 0; i < argc; i++)\n\t\tprintf("%s\\n", argv[i]);\n\treturn 0;\n}\n`,
    `def fibonacci(n: int) -> list[int]:\n    """Return the first n numbers."""\n    a, b = 0, 1\n    out = []\n    for _ in range(n):\n        out.append(a)\n        a, b = b, a + b\n    return out\n\n\nif __name__ == "__main__":\n    print(fibonacci(10))\n`,
    `const fetchData = async (url) => {\n  const res = await fetch(url, { headers: { 'Content-Type': 'application/json' } });\n  if (!res.ok) throw new Error(\`HTTP \${res.status}\`);\n  return res.json();\n};\n`,
    `fn main() {\n    let v: Vec<u32> = (1..=10).map(|x| x * x).collect();\n    println!("{:?}", v);\n    match v.get(3) { Some(&n) if n > 5 => {}, _ => unreachable!() }\n}\n`,
    `package main\n\nimport "fmt"\n\nfunc main() {\n\tch := make(chan int, 3)\n\tgo func() { ch <- 42 }()\n\tfmt.Println(<-ch)\n}\n`,
    `<!DOCTYPE html>\n<html lang="en">\n  <head><meta charset="utf-8"><title>Test &amp; more</title></head>\n  <body><p class="x">Hello&nbsp;world</p></body>\n</html>\n`,
    `{"name": "muse", "version": "0.1.0", "ids": [1, 2, 3], "nested": {"a": null, "b": true, "c": -1.5e-10}}\n`,
    `#!/bin/sh\nset -eu\nfor f in *.txt; do\n  grep -c 'foo\\|bar' "$f" || echo "none in $f" >&2\ndone | sort -n | uniq -c\n`,
    `SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total > 100.00 GROUP BY u.id HAVING n >= 3;\n`,
    `\\begin{equation}\n  E = mc^2 \\quad \\sum_{i=1}^{N} x_i^2 \\leq \\int_0^\\infty e^{-t}\\,dt\n\\end{equation}\n`,
    `    // deeply\n        // indented\n            // comment\n\t\t\t// with tabs\n`,
];

function makeText(minBytes) {
    const rand = prng(20260104);
    const pick = (arr) => arr[Math.floor(rand() * arr.length)];
    const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
    const wordLists = Object.fromEntries(
        Object.entries(WORDS).map(([k, v]) => [k, v.split(/\s+/).filter(Boolean)])
    );
    const digits = (n) => Array.from({ length: n }, () => int(0, 9)).join('');
    const generators = [
        () => {
            const w = Array.from({ length: int(5, 30) }, () => pick(wordLists.english));
            w[0] = w[0][0].toUpperCase() + w[0].slice(1);
            return w.join(' ') + pick(['.', '!', '?', ',', ';', ':']) + pick([' ', '\n', '  ']);
        },
        () => Array.from({ length: int(3, 12) }, () => pick(wordLists[pick(Object.keys(WORDS))])).join(' ') + ' ',
        () => {
            let s = '';
            for (let i = int(5, 60); i > 0; i--) s += rand() < 0.15 ? pick(CHINESE_PUNCT) : CHINESE[int(0, CHINESE.length - 1)];
            return s;
        },
        () => Array.from({ length: int(3, 15) }, () => pick(JAPANESE) + (rand() < 0.3 ? pick(JAPANESE_PUNCT) : '')).join(''),
        () => pick(CODE),
        () => Array.from({ length: int(1, 6) }, () => pick(EMOJI)).join(rand() < 0.5 ? '' : ' ') + ' ',
        () => {
            const n = int(1, 40);
            return pick(['', '-', '+', '$', ' ', '#']) + digits(n) + pick(['', '.' + digits(int(1, 8)), ',000', '%', 'e10', 'th', ' ']) + ' ';
        },
        () => pick([' ', '\n', '\t', '\r\n', ' \n', '\u00a0', '\u3000', '\u2003']).repeat(int(1, 80)),
        () => pick(PUNCT) + (rand() < 0.5 ? ' ' : ''),
        () => {
            // mixed scripts glued together
            const parts = ['abc', 'Дом', '日本', 'ö', 'ß', 'x', '42', 'ΣΩ', 'ﬁ', 'İ', '한글', 'e\u0301', 'n\u0303'];
            return Array.from({ length: int(2, 8) }, () => pick(parts)).join('') + pick([' ', '', '\n']);
        },
        () => {
            // random BMP letters from stable blocks: unusual pieces stress the merge order
            const blocks = [[0x41, 0x5a], [0x61, 0x7a], [0xc0, 0x24f], [0x391, 0x3c9], [0x410, 0x44f], [0x4e00, 0x4fff], [0xac00, 0xacff], [0x3041, 0x3096], [0x5d0, 0x5ea], [0x905, 0x939]];
            let s = '';
            for (let i = int(1, 25); i > 0; i--) {
                const [lo, hi] = pick(blocks);
                s += String.fromCodePoint(int(lo, hi));
            }
            return s + pick([' ', '', '. ', '\n']);
        },
        () => {
            // long runs of one character (js-tiktoken's merge loop is cubic in a piece's length)
            const c = pick(['a', 'A', '.', '-', '=', '_', '9', ' ', '\n', '啊', 'é', '😀']);
            return c.repeat(c.length === Buffer.byteLength(c) ? int(10, 150) : int(5, 30)) + ' ';
        },
    ];
    const chunks = [];
    let bytes = 0;
    while (bytes < minBytes) {
        const s = pick(generators)();
        chunks.push(s);
        bytes += Buffer.byteLength(s, 'utf8');
    }
    return chunks.join('');
}

// ---- running both sides ----

function runOurs(args, input) {
    const r = spawnSync(binary, args, { input, maxBuffer: 1 << 30 });
    if (r.status !== 0) bailOut(`${binary} ${args.join(' ')} failed (${r.status}): ${r.stderr}`);
    return r.stdout;
}
function oursEncode(tok, text) {
    const line = runOurs(['tokenize', '--tokenizer', tok], Buffer.from(text, 'utf8')).toString().trim();
    return line === '' ? [] : line.split(',').map(Number);
}

function firstMismatch(got, want) {
    const n = Math.min(got.length, want.length);
    for (let i = 0; i < n; i++) if (got[i] !== want[i]) return i;
    return got.length === want.length ? -1 : n;
}

function compareIds(enc, name, text, got, want) {
    const at = firstMismatch(got, want);
    if (at < 0) return ok(true, name);
    const before = enc.decode(want.slice(Math.max(0, at - 8), at));
    ok(false, name,
        `first mismatch at token ${at} of ${want.length} (ours ${got.length})`,
        `context before: ${JSON.stringify(before)}`,
        `js-tiktoken: ${JSON.stringify(want.slice(at, at + 8))} = ${JSON.stringify(enc.decode(want.slice(at, at + 8)))}`,
        `ours:        ${JSON.stringify(got.slice(at, at + 8))} = ${JSON.stringify(enc.decode(got.slice(at, at + 8)))}`);
}

const started = Date.now();
const elapsed = () => `${((Date.now() - started) / 1000).toFixed(1)} s`;

function main() {
    if (!fs.existsSync(binary)) bailOut(`${binary} missing: run make first`);
    ensureNodeModules();
    const { Tiktoken } = require(path.join(nodeDir, 'node_modules', 'js-tiktoken', 'dist', 'lite.cjs'));
    const o200k = require(path.join(nodeDir, 'node_modules', 'js-tiktoken', 'dist', 'ranks', 'o200k_base.cjs'));
    const enc = new Tiktoken(o200k);
    const tok = tokenizerJson();
    const reference = (s) => enc.encode(s, [], []); // special tokens are plain text

    console.log(`# tokenizer ready at ${elapsed()}`);
    const text = makeText(1 << 20);
    const bytes = Buffer.byteLength(text, 'utf8');
    console.log(`# ${bytes} bytes of generated text`);
    const want = reference(text);
    console.log(`# js-tiktoken encoded at ${elapsed()}`);
    const got = oursEncode(tok, text);
    console.log(`# muse encoded at ${elapsed()}`);
    compareIds(enc, `1 MB mixed text: ${want.length} ids identical to js-tiktoken`, text, got, want);

    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'muse-parity-'));
    const textFile = path.join(tmp, 'text.txt');
    fs.writeFileSync(textFile, text);
    const viaFile = runOurs(['tokenize', '--tokenizer', tok, '--text-file', textFile]).toString().trim();
    ok(viaFile === got.join(','), '--text-file gives the same ids as stdin');
    const back = runOurs(['detokenize', '--tokenizer', tok], Buffer.from(got.join(',')));
    ok(Buffer.compare(back, Buffer.from(text, 'utf8')) === 0, 'detokenize(tokenize(text)) == text',
        `got ${back.length} bytes, want ${bytes}`);
    const backFlag = runOurs(['detokenize', '--tokenizer', tok, '--ids', got.slice(0, 500).join(',')]);
    ok(backFlag.toString() === enc.decode(got.slice(0, 500)), 'detokenize --ids matches js-tiktoken decode');
    fs.rmSync(tmp, { recursive: true, force: true });

    const cases = [
        ['<|eot|>', 'control token text'],
        ['<|start|>user<|message|>hi<|eot|><|begin_of_text|>', 'chat markup typed by a user'],
        ['   leading spaces and trailing   ', 'leading/trailing spaces'],
        ['\n\n\n', 'only newlines'],
        [' ', 'one space'],
        ['x', 'one letter'],
        ["He's here, they'll go; I'M SURE we'd've", 'contractions'],
        ['1234567890123', 'digit groups'],
    ];
    for (const [s, what] of cases) compareIds(enc, `${what}: ${JSON.stringify(s)}`, s, oursEncode(tok, s), reference(s));
    const eotIds = oursEncode(tok, '<|eot|>');
    ok(eotIds.length > 1 && !eotIds.includes(200008) && eotIds.every((id) => id < 200000),
        '"<|eot|>" in text gives plain text tokens, not 200008', `got ${eotIds}`);

    const r = spawnSync(binary, ['tokenize', '--tokenizer', tok, '--text-file', '/nonexistent/x'], { encoding: 'utf8' });
    ok(r.status === 2 && r.stderr.includes('--text-file'), 'missing --text-file: exit 2 naming the flag', r.stderr);
    const r2 = spawnSync(binary, ['detokenize', '--tokenizer', tok, '--ids', '1,2,x'], { encoding: 'utf8' });
    ok(r2.status === 2 && r2.stderr.includes('--ids'), 'bad --ids: exit 2 naming the flag', r2.stderr);
    const r3 = spawnSync(binary, ['detokenize', '--tokenizer', tok, '--ids', '999999'], { encoding: 'utf8' });
    ok(r3.status === 2 && r3.stderr.includes('--ids'), 'out of range id: exit 2', r3.stderr);

    console.log(`# done at ${elapsed()}`);
    console.log(`1..${testNumber}`);
    process.exit(failures ? 1 : 0);
}

main();
