// tests/serve/wire.test.mjs: the OpenAI wire format as the openai SDK, curl and raw sockets see
// it: /v1/models, health, headers (x-request-id, Content-Type), exact SSE framing, the first
// chunk, include_usage, stream == non-stream, chat.completions.stream(), tokenize/detokenize.
//
//   node --test tests/serve/wire.test.mjs

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import {
    startServer, client, raw, rawStream, sseChunks, solo, detokenize, tokenize, chatIds, collect,
    IS_TINY, MAX_CTX,
} from './harness.mjs';

let srv, sdk, prompt, ref, refText, chatMsgs, chatRef, chatRefText;
const MAXT = 24;

before(async () => {
    srv = await startServer(['--draft', 'none']);
    sdk = client(srv);
    prompt = await tokenize('The old man looked at the sea and said');
    ref = await solo(prompt, { maxTokens: MAXT });
    refText = await detokenize(ref);
    chatMsgs = [{ role: 'user', content: 'Tell me about the river.' }];
    chatRef = await solo(await chatIds(chatMsgs), { maxTokens: MAXT });
    chatRefText = await detokenize(chatRef);
}, { timeout: 90000 });

after(async () => {
    if (srv) assert.equal(await srv.stop(), 0, 'exit code after SIGTERM');
}, { timeout: 40000 });

const T = { timeout: 30000 };
const cbody = (extra = {}) => ({ model: srv.model, prompt, max_tokens: MAXT, temperature: 0, ...extra });
const chbody = (extra = {}) => ({ model: srv.model, messages: chatMsgs, max_tokens: MAXT, temperature: 0, ...extra });

test('models.list() reads /v1/models', T, async () => {
    const page = await sdk.models.list();
    assert.ok(Array.isArray(page.data) && page.data.length >= 1, 'data[] with a model');
    const m = page.data[0];
    assert.equal(m.id, srv.model, 'data[0].id is the name in the ready line');
    assert.equal(m.object, 'model');
    assert.equal(m.owned_by, 'tandem');
    assert.equal(typeof m.root, 'string', 'root (vllm bench serve reads it)');
    assert.ok(Number.isInteger(m.max_model_len) && m.max_model_len > 0, `max_model_len ${m.max_model_len}`);
    if (IS_TINY) assert.equal(m.max_model_len, MAX_CTX, 'max_model_len of tandem-tiny');
    const r = await raw(srv.url, { path: '/v1/models' });
    assert.equal(r.json().object, 'list');
});

test('/health, /livez, /readyz answer 200 when ready', T, async () => {
    for (const p of ['/health', '/livez', '/readyz']) {
        const r = await raw(srv.url, { path: p });
        assert.equal(r.status, 200, `${p} status`);
    }
    const h = await raw(srv.url, { path: '/health' });
    assert.match(h.headers['content-type'] ?? '', /^application\/json/);
    assert.equal(h.json().status, 'ok');
});

test('x-request-id on every response', T, async () => {
    const reqs = [
        { path: '/v1/models' },
        { path: '/health' },
        { path: '/livez' },
        { path: '/readyz' },
        { path: '/metrics' },
        { path: '/props' },
        { path: '/version' },
        { path: '/no/such/endpoint' },
        { method: 'POST', path: '/tokenize', body: { content: 'hello' } },
        { method: 'POST', path: '/v1/completions', body: cbody({ max_tokens: 2 }) },
        { method: 'POST', path: '/v1/completions', body: cbody({ max_tokens: 2, stream: true }) },
        { method: 'POST', path: '/v1/chat/completions', body: chbody({ max_tokens: 2 }) },
        { method: 'POST', path: '/v1/chat/completions', body: chbody({ max_tokens: 2, stream: true }) },
        { method: 'POST', path: '/v1/completions', body: '{"prompt": ' },
    ];
    for (const q of reqs) {
        const r = await raw(srv.url, q);
        const id = r.headers['x-request-id'];
        assert.ok(typeof id === 'string' && id.length > 0, `${q.method ?? 'GET'} ${q.path} (${r.status}) has no x-request-id`);
    }
    // the SDK reads it into request_id
    const { data, request_id } = await sdk.completions.create(cbody({ max_tokens: 2 })).withResponse();
    assert.ok(request_id, 'SDK request_id');
    assert.equal(data.object, 'text_completion');
});

test('Content-Type: application/json on JSON, text/event-stream on streams', T, async () => {
    const j = await raw(srv.url, { method: 'POST', path: '/v1/completions', body: cbody({ max_tokens: 2 }) });
    assert.equal(j.status, 200);
    assert.match(j.headers['content-type'] ?? '', /^application\/json\b/, 'non-streamed completion');
    const c = await raw(srv.url, { method: 'POST', path: '/v1/chat/completions', body: chbody({ max_tokens: 2 }) });
    assert.match(c.headers['content-type'] ?? '', /^application\/json\b/, 'non-streamed chat');
    const e = await raw(srv.url, { method: 'POST', path: '/v1/completions', body: { prompt: 5 } });
    assert.equal(e.status, 400);
    assert.match(e.headers['content-type'] ?? '', /^application\/json\b/, 'error');
    const s = await raw(srv.url, { method: 'POST', path: '/v1/completions', body: cbody({ max_tokens: 2, stream: true }) });
    assert.equal(s.status, 200);
    assert.match(s.headers['content-type'] ?? '', /^text\/event-stream\b/, 'stream');
    const m = await raw(srv.url, { path: '/metrics' });
    assert.match(m.headers['content-type'] ?? '', /^text\/plain\b/, '/metrics');
});

test('stream headers: HTTP/1.1 chunked, Cache-Control no-cache', T, async () => {
    const s = await raw(srv.url, { method: 'POST', path: '/v1/completions', body: cbody({ max_tokens: 2, stream: true }) });
    assert.equal(s.httpVersion, '1.1');
    assert.equal(s.headers['transfer-encoding'], 'chunked');
    assert.equal(s.headers['content-length'], undefined);
    assert.match(s.headers['cache-control'] ?? '', /no-cache/);
});

function checkFraming(text, object) {
    const { chunks, done, afterDone, problems } = sseChunks(text);
    assert.deepEqual(problems, [], 'SSE framing');
    assert.ok(done, 'the last event is data: [DONE]');
    assert.equal(afterDone, 0, 'nothing after [DONE]');
    assert.ok(text.endsWith('data: [DONE]\n\n'), 'ends with "data: [DONE]\\n\\n"');
    assert.ok(chunks.length >= 2, 'chunks before [DONE]');
    const { id, created, model } = chunks[0];
    assert.ok(typeof id === 'string' && id.length > 0, 'id');
    assert.ok(Number.isInteger(created) && created > 1.6e9, 'created (Unix seconds)');
    assert.equal(typeof model, 'string');
    for (const c of chunks) {
        assert.equal(c.object, object, 'object');
        assert.equal(c.id, id, 'the same id in every chunk');
        assert.equal(c.created, created, 'the same created in every chunk');
        assert.equal(c.model, model, 'model in every chunk');
    }
    return chunks;
}

test('exact SSE framing of a completions stream (raw bytes)', T, async () => {
    const r = await raw(srv.url, {
        method: 'POST',
        path: '/v1/completions',
        body: cbody({ stream: true, stream_options: { include_usage: true } }),
    });
    assert.equal(r.status, 200);
    const chunks = checkFraming(r.text, 'text_completion');
    const last = chunks[chunks.length - 1];
    assert.deepEqual(last.choices, [], 'the usage chunk has choices: []');
    assert.equal(last.usage.completion_tokens, ref.length);
    assert.equal(last.usage.prompt_tokens, prompt.length);
    assert.equal(last.usage.total_tokens, ref.length + prompt.length);
    const body = chunks.slice(0, -1);
    for (const c of body) {
        assert.ok(c.usage == null, 'usage is null in the chunks before the usage chunk');
        assert.equal(c.choices.length, 1);
        assert.equal(c.choices[0].index, 0);
    }
    assert.ok(body[body.length - 1].choices[0].finish_reason, 'the last choice chunk has a finish_reason');
    for (const c of body.slice(0, -1)) assert.equal(c.choices[0].finish_reason ?? null, null, 'finish_reason null before the end');
    assert.equal(collect(body).text[0], refText, 'streamed text == tandem generate');
});

test('exact SSE framing of a chat stream; first chunk = role + first token', T, async () => {
    const r = await raw(srv.url, {
        method: 'POST',
        path: '/v1/chat/completions',
        body: chbody({ stream: true, stream_options: { include_usage: true } }),
    });
    assert.equal(r.status, 200);
    const chunks = checkFraming(r.text, 'chat.completion.chunk');
    const first = chunks[0];
    assert.equal(first.choices[0].delta.role, 'assistant', 'role in the first chunk');
    const firstText = await detokenize(chatRef.slice(0, 1));
    if (/^[\x20-\x7e]+$/.test(firstText)) {
        assert.equal(first.choices[0].delta.content, firstText, "the first chunk carries the first token's text");
    } else {
        assert.equal(typeof first.choices[0].delta.content, 'string', 'content in the first chunk');
    }
    for (const c of chunks.slice(1)) assert.equal(c.choices[0]?.delta?.role, undefined, 'role only in the first chunk');
    const last = chunks[chunks.length - 1];
    assert.deepEqual(last.choices, []);
    assert.equal(last.usage.completion_tokens, chatRef.length);
    assert.equal(collect(chunks).text[0], chatRefText, 'streamed chat == tandem generate on the chat ids');
});

test('stream == non-stream (completions and chat, SDK)', T, async () => {
    const ns = await sdk.completions.create(cbody());
    const st = await sdk.completions.create(cbody({ stream: true, stream_options: { include_usage: true } }));
    const chunks = [];
    for await (const c of st) chunks.push(c);
    const s = collect(chunks);
    assert.equal(ns.object, 'text_completion');
    assert.equal(ns.choices[0].text, refText);
    assert.equal(s.text[0], ns.choices[0].text);
    assert.equal(s.finish[0], ns.choices[0].finish_reason);
    assert.deepEqual(
        { p: s.usage.prompt_tokens, c: s.usage.completion_tokens, t: s.usage.total_tokens },
        { p: ns.usage.prompt_tokens, c: ns.usage.completion_tokens, t: ns.usage.total_tokens }
    );
    assert.equal(ns.usage.completion_tokens, ref.length);

    const cns = await sdk.chat.completions.create(chbody());
    assert.equal(cns.object, 'chat.completion');
    assert.equal(cns.choices[0].message.role, 'assistant');
    assert.equal(cns.choices[0].message.content, chatRefText);
    const cst = await sdk.chat.completions.create(chbody({ stream: true, stream_options: { include_usage: true } }));
    const cchunks = [];
    for await (const c of cst) cchunks.push(c);
    const cs = collect(cchunks);
    assert.equal(cs.text[0], cns.choices[0].message.content);
    assert.equal(cs.finish[0], cns.choices[0].finish_reason);
    assert.equal(cs.usage.completion_tokens, cns.usage.completion_tokens);
    assert.equal(cns.usage.prompt_tokens, (await chatIds(chatMsgs)).length, 'chat prompt_tokens = the chat format ids');
});

test('chat.completions.stream().finalChatCompletion()', T, async () => {
    const stream = sdk.chat.completions.stream(chbody());
    let deltas = '';
    stream.on('content', (d) => (deltas += d));
    const final = await stream.finalChatCompletion();
    assert.equal(final.choices[0].message.role, 'assistant');
    assert.equal(final.choices[0].message.content, chatRefText);
    assert.equal(deltas, chatRefText);
    assert.ok(['stop', 'length'].includes(final.choices[0].finish_reason));
    assert.equal(final.choices[0].finish_reason, chatRef.length < MAXT ? 'stop' : 'length');
});

test('max_completion_tokens is honoured in chat', T, async () => {
    const { max_tokens, ...rest } = chbody();
    const r = await sdk.chat.completions.create({ ...rest, max_completion_tokens: 5 });
    assert.equal(r.usage.completion_tokens, Math.min(5, chatRef.length));
    assert.equal(r.choices[0].message.content, await detokenize(chatRef.slice(0, 5)));
});

test('POST /tokenize and /detokenize', T, async () => {
    const text = 'The river ran to the sea.';
    const withBos = await tokenize(text);
    const noBos = await tokenize(text, { special: false });
    for (const body of [{ content: text }, { prompt: text }]) {
        const r = await raw(srv.url, { method: 'POST', path: '/tokenize', body });
        assert.equal(r.status, 200, JSON.stringify(body));
        const toks = r.json().tokens;
        assert.ok(
            JSON.stringify(toks) === JSON.stringify(withBos) || JSON.stringify(toks) === JSON.stringify(noBos),
            `/tokenize ${JSON.stringify(body)} -> ${JSON.stringify(toks)}; tandem tokenize gives ${JSON.stringify(withBos)}`
        );
    }
    const d = await raw(srv.url, { method: 'POST', path: '/detokenize', body: { tokens: noBos } });
    assert.equal(d.status, 200);
    assert.equal(d.json().content, text, 'content (llama.cpp shape)');
    assert.equal(d.json().prompt, text, 'prompt (vLLM shape)');
});

test('GET /props and /version answer JSON', T, async () => {
    for (const p of ['/props', '/version']) {
        const r = await raw(srv.url, { path: p });
        assert.equal(r.status, 200, p);
        assert.match(r.headers['content-type'] ?? '', /^application\/json/);
        assert.equal(typeof r.json(), 'object');
    }
});

test('prompt forms: string, string[], int[], int[][]', T, async () => {
    const text = 'The river ran to the sea.';
    const tids = await tokenize(text);
    const a = await solo(tids, { maxTokens: 8 });
    const b = await solo(prompt, { maxTokens: 8 });
    const one = await sdk.completions.create({ model: srv.model, prompt: text, max_tokens: 8, temperature: 0 });
    assert.equal(one.choices[0].text, await detokenize(a), 'string prompt (encoded as generate "TEXT" does)');
    assert.equal(one.usage.prompt_tokens, tids.length);
    const two = await sdk.completions.create({ model: srv.model, prompt: [text, text], max_tokens: 8, temperature: 0 });
    assert.deepEqual(two.choices.map((c) => c.index).sort(), [0, 1]);
    for (const c of two.choices) assert.equal(c.text, await detokenize(a), 'string[] prompt');
    const mixed = await sdk.completions.create({ model: srv.model, prompt: [tids, prompt], max_tokens: 8, temperature: 0 });
    const byIndex = [...mixed.choices].sort((x, y) => x.index - y.index);
    assert.equal(byIndex[0].text, await detokenize(a), 'int[][] prompt 0');
    assert.equal(byIndex[1].text, await detokenize(b), 'int[][] prompt 1');
    assert.equal(mixed.usage.completion_tokens, a.length + b.length, 'usage sums the choices');
});

function curl(args) {
    return new Promise((resolve) => {
        execFile('curl', args, { timeout: 30000, encoding: 'utf8', maxBuffer: 16 << 20 }, (e, stdout, stderr) =>
            resolve({ code: e ? e.code ?? -1 : 0, stdout, stderr })
        );
    });
}

test('curl: non-streamed and streamed completions, keep-alive after a stream', T, async (t) => {
    const probe = await curl(['--version']);
    if (probe.code !== 0) return t.skip('no curl');
    const r = await curl(['-sS', '-i', '-H', 'Content-Type: application/json', '-d', JSON.stringify(cbody()), `${srv.url}/v1/completions`]);
    assert.equal(r.code, 0, r.stderr);
    const [head, ...rest] = r.stdout.split('\r\n\r\n');
    assert.match(head, /^HTTP\/1\.1 200/);
    assert.match(head, /\r\ncontent-type: application\/json/i);
    assert.match(head, /\r\nx-request-id: \S+/i);
    assert.equal(JSON.parse(rest.join('\r\n\r\n')).choices[0].text, refText);

    const s = await curl(['-sS', '-N', '-H', 'Content-Type: application/json', '-d', JSON.stringify(cbody({ stream: true })), `${srv.url}/v1/completions`]);
    assert.equal(s.code, 0, s.stderr);
    const { chunks, done, problems } = sseChunks(s.stdout);
    assert.deepEqual(problems, []);
    assert.ok(done, '[DONE] last');
    assert.equal(collect(chunks).text[0], refText);

    // the connection stays reusable after a chunked SSE response
    const k = await curl([
        '-sS', '-v', '-N', '-o', '/dev/null', '-H', 'Content-Type: application/json',
        '-d', JSON.stringify(cbody({ stream: true, max_tokens: 4 })), `${srv.url}/v1/completions`,
        '--next', '-sS', '-v', '-o', '/dev/null', `${srv.url}/health`,
    ]);
    assert.equal(k.code, 0, k.stderr);
    assert.match(k.stderr, /Re-using existing connection/i, 'curl re-used the connection after the stream');
});
