// Drives muse through the official `openai` npm client (t/node), as any user would:
// node openai_client_e2e.mjs BASE_URL [script|structured]. script (the default): the engine
// behind BASE_URL replays scripts chosen by the request seed: seed 0 = reasoning then an
// answer, seed 1 = reasoning then a weather.get call. structured: a real engine (the demo pack)
// behind BASE_URL; response_format json_schema (strict) through chat.completions.create, its
// stream and chat.completions.parse, and json_object; each content is JSON.parse()d and its
// fields checked against the schema here.
// Prints one JSON object of what the client saw; t/serve_openai_client.t asserts on it.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, '..', 'node', 'package.json'));
const OpenAI = require('openai').default;

const baseURL = process.argv[2];
const mode = process.argv[3] ?? 'script';
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 20000 });
const sdkDir = dirname(require.resolve('openai'));
const out = { sdk_version: JSON.parse(readFileSync(join(sdkDir, 'package.json'), 'utf8')).version };

const tools = [{
  type: 'function',
  function: {
    name: 'weather.get',
    description: 'Get weather',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } } },
  },
}];
const user = { role: 'user', content: 'What is the weather in Paris?' };

async function step(name, fn) {
  try {
    out[name] = await fn();
  } catch (err) {
    out[name] = { thrown: err.constructor.name, status: err.status, message: String(err.message) };
  }
}

// ---- structured outputs against a real engine ----

// The schema every json_schema request sends, and what its fields must be (checked by hand:
// the SDK does not validate).
const weather = {
  type: 'object',
  properties: {
    city: { type: 'string', minLength: 1, maxLength: 12 },
    days: { type: 'integer', minimum: 1, maximum: 14 },
    units: { enum: ['metric', 'imperial'] },
    tags: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 3 },
  },
  required: ['city', 'days', 'units', 'tags'],
  additionalProperties: false,
};

function weatherProblems(v) {
  const p = [];
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return ['not an object'];
  for (const k of Object.keys(v)) if (!(k in weather.properties)) p.push(`extra key ${k}`);
  for (const k of weather.required) if (!(k in v)) p.push(`missing ${k}`);
  const chars = (s) => [...s].length; // maxLength counts code points
  if (typeof v.city !== 'string' || chars(v.city) < 1 || chars(v.city) > 12) p.push('city');
  if (!Number.isInteger(v.days) || v.days < 1 || v.days > 14) p.push('days');
  if (!['metric', 'imperial'].includes(v.units)) p.push('units');
  if (!Array.isArray(v.tags) || v.tags.length > 3 ||
      v.tags.some((t) => typeof t !== 'string' || chars(t) > 6)) p.push('tags');
  return p;
}

const ask = { role: 'user', content: 'The weather in Paris for the next days, as JSON.' };
const jsonSchema = { type: 'json_schema', json_schema: { name: 'weather', schema: weather, strict: true } };

// Seeds 1..4 at temperature 1.0: each answer as the SDK hands it back.
async function structured() {
  await step('schema_create', async () => {
    const res = [];
    for (const seed of [1, 2, 3, 4]) {
      const r = await client.chat.completions.create({
        model: 'muse-spark', messages: [ask], seed, temperature: 1.0, max_tokens: 400,
        response_format: jsonSchema,
      });
      const c = r.choices[0];
      let parsed = null;
      let problems = null;
      if (c.finish_reason === 'stop') {
        try {
          parsed = JSON.parse(c.message.content);
          problems = weatherProblems(parsed);
        } catch (err) {
          problems = [`JSON.parse: ${err.message}`];
        }
      }
      res.push({ seed, finish: c.finish_reason, content: c.message.content, parsed, problems });
    }
    return res;
  });

  await step('schema_stream', async () => {
    const stream = await client.chat.completions.create({
      model: 'muse-spark', messages: [ask], seed: 1, temperature: 1.0, max_tokens: 400,
      response_format: jsonSchema, stream: true,
    });
    let content = '';
    let finish = null;
    for await (const chunk of stream) {
      content += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    let problems = null;
    try {
      problems = finish === 'stop' ? weatherProblems(JSON.parse(content)) : null;
    } catch (err) {
      problems = [`JSON.parse: ${err.message}`];
    }
    return { finish, content, problems };
  });

  // chat.completions.parse without zod: a plain json_schema response_format is JSON.parse()d
  // into message.parsed by the SDK itself (it raises on finish_reason length)
  await step('schema_parse', async () => {
    const res = [];
    for (const seed of [1, 2]) {
      const r = await client.chat.completions.parse({
        model: 'muse-spark', messages: [ask], seed, temperature: 1.0, max_tokens: 400,
        response_format: jsonSchema,
      });
      const m = r.choices[0].message;
      res.push({ seed, finish: r.choices[0].finish_reason, content: m.content, parsed: m.parsed,
                 problems: weatherProblems(m.parsed) });
    }
    return res;
  });

  await step('json_object', async () => {
    const res = [];
    for (const seed of [1, 2, 3]) {
      const r = await client.chat.completions.create({
        model: 'muse-spark', messages: [ask], seed, temperature: 1.0, max_tokens: 400,
        response_format: { type: 'json_object' },
      });
      const c = r.choices[0];
      let kind = null;
      if (c.finish_reason === 'stop') {
        try {
          const v = JSON.parse(c.message.content);
          kind = Array.isArray(v) ? 'array' : v === null ? 'null' : typeof v;
        } catch (err) {
          kind = `JSON.parse: ${err.message}`;
        }
      }
      res.push({ seed, finish: c.finish_reason, content: c.message.content, kind });
    }
    return res;
  });
}

if (mode === 'structured') {
  await structured();
  process.stdout.write(JSON.stringify(out) + '\n');
  process.exit(0);
}

await step('models', async () => (await client.models.list()).data.map((m) => m.id));

await step('stream', async () => {
  const stream = await client.chat.completions.create({
    model: 'muse-spark', messages: [user], seed: 0, stream: true,
    stream_options: { include_usage: true },
  });
  const seen = { chunks: 0, content: '', reasoning: '', finish: null, usage: null, ids: new Set() };
  for await (const chunk of stream) {
    seen.chunks++;
    seen.ids.add(chunk.id);
    const choice = chunk.choices[0];
    if (choice) {
      seen.content += choice.delta.content ?? '';
      seen.reasoning += choice.delta.reasoning_content ?? '';
      if (choice.finish_reason) seen.finish = choice.finish_reason;
    }
    if (chunk.usage) seen.usage = chunk.usage;
  }
  seen.ids = seen.ids.size;
  return seen;
});

await step('nonstream', async () => {
  const r = await client.chat.completions.create({ model: 'muse-spark', messages: [user], seed: 0 });
  return { object: r.object, content: r.choices[0].message.content,
           reasoning: r.choices[0].message.reasoning_content, finish: r.choices[0].finish_reason,
           usage: r.usage, token_sha: r.muse?.token_sha };
});

await step('tools', async () => {
  const first = await client.chat.completions.create({ model: 'muse-spark', messages: [user], tools, seed: 1 });
  const msg = first.choices[0].message;
  const call = msg.tool_calls?.[0];
  const args = JSON.parse(call.function.arguments);
  const result = { finish1: first.choices[0].finish_reason, name: call.function.name, args, id: call.id };
  // the tool result goes back the normal way: the assistant message as returned, then a tool message
  const second = await client.chat.completions.create({
    model: 'muse-spark', tools, seed: 0,
    messages: [user, msg, { role: 'tool', tool_call_id: call.id, content: `sunny in ${args.city}` }],
  });
  result.finish2 = second.choices[0].finish_reason;
  result.answer = second.choices[0].message.content;
  result.prompt1 = first.usage.prompt_tokens;
  result.prompt2 = second.usage.prompt_tokens;
  return result;
});

await step('tools_stream', async () => {
  const stream = await client.chat.completions.create({
    model: 'muse-spark', messages: [user], tools, seed: 1, stream: true,
  });
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    for (const tc of choice?.delta?.tool_calls ?? []) {
      calls[tc.index] ??= { id: '', name: '', arguments: '' };
      if (tc.id) calls[tc.index].id = tc.id;
      calls[tc.index].name += tc.function?.name ?? '';
      calls[tc.index].arguments += tc.function?.arguments ?? '';
    }
    if (choice?.finish_reason) finish = choice.finish_reason;
  }
  return { finish, calls: calls.map((c) => ({ ...c, args: JSON.parse(c.arguments) })) };
});

await step('bad_temperature', async () => {
  try {
    await client.chat.completions.create({ model: 'muse-spark', messages: [user], temperature: 5 });
    return { thrown: null };
  } catch (err) {
    return { thrown: err.constructor.name, is_bad_request: err instanceof OpenAI.BadRequestError,
             status: err.status, param: err.param, code: err.code, type: err.type };
  }
});

await step('unknown_model', async () => {
  try {
    await client.chat.completions.create({ model: 'gpt-4o', messages: [user] });
    return { thrown: null };
  } catch (err) {
    return { thrown: err.constructor.name, is_not_found: err instanceof OpenAI.NotFoundError,
             status: err.status, code: err.code };
  }
});

process.stdout.write(JSON.stringify(out) + '\n');

