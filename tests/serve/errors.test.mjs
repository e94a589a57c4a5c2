// tests/serve/errors.test.mjs: bad requests, one test each, with the status and the OpenAI error
// envelope {"error":{message,type,param,code}} they must get; after every one the server still
// answers. Also API keys (401 authentication_error; health endpoints public).
//
//   node --test tests/serve/errors.test.mjs

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { AuthenticationError, BadRequestError } from 'openai';
import { startServer, client, raw, solo, detokenize, tmpdir, MAX_CTX, IS_TINY } from './harness.mjs';

const MAX_BODY = 65536;
const MAX_STOP_LEN = 16;
let srv;

before(async () => {
    srv = await startServer([
        '--draft', 'none',
        '--set', `limits.max_body_bytes=${MAX_BODY}`,
        '--set', `limits.max_stop_len=${MAX_STOP_LEN}`,
        '--set', 'limits.max_n=8',
    ]);
}, { timeout: 90000 });

after(async () => {
    if (srv) assert.equal(await srv.stop(), 0);
}, { timeout: 40000 });

const P = [1, 2, 3];
const C = (extra) => ({ method: 'POST', path: '/v1/completions', body: { prompt: P, max_tokens: 4, ...extra } });
const CH = (extra) => ({ method: 'POST', path: '/v1/chat/completions', body: { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, ...extra } });
const ANY = null; // an error type not fixed by the spec: any non-empty string

// [name, request, status, error type, extra check]
const CASES = [
    ['malformed JSON', { ...C(), body: '{"prompt": [1, 2, 3], "max_tokens": ' }, 400, 'invalid_request_error'],
    ['JSON that is not an object', { ...C(), body: '[1, 2, 3]' }, 400, 'invalid_request_error'],
    ['empty body', { ...C(), body: '' }, 400, 'invalid_request_error'],
    ['invalid UTF-8 in a string', { ...C(), body: Buffer.concat([Buffer.from('{"prompt": "a'), Buffer.from([0xff, 0xfe]), Buffer.from('b", "max_tokens": 2}')]) }, 400, 'invalid_request_error'],
    ['prompt of the wrong type (number)', C({ prompt: 5 }), 400, 'invalid_request_error'],
    ['prompt of the wrong type (booleans)', C({ prompt: [true, false] }), 400, 'invalid_request_error'],
    ['prompt mixing strings and ids', C({ prompt: ['a', 5] }), 400, 'invalid_request_error'],
    ['max_tokens of the wrong type', C({ max_tokens: 'ten' }), 400, 'invalid_request_error'],
    ['temperature of the wrong type', C({ temperature: 'hot' }), 400, 'invalid_request_error'],
    ['stream of the wrong type', C({ stream: 'yes' }), 400, 'invalid_request_error'],
    ['n not an integer', C({ n: 1.5 }), 400, 'invalid_request_error'],
    ['seed of the wrong type', C({ seed: 'abc' }), 400, 'invalid_request_error'],
    ['stop of the wrong type', C({ stop: 5 }), 400, 'invalid_request_error'],
    ['messages not an array', CH({ messages: 'hi' }), 400, 'invalid_request_error'],
    ['message without a role', CH({ messages: [{ content: 'hi' }] }), 400, 'invalid_request_error'],
    ['message with an unknown role', CH({ messages: [{ role: 'wizard', content: 'hi' }] }), 400, 'invalid_request_error'],
    ['message content of the wrong type', CH({ messages: [{ role: 'user', content: 5 }] }), 400, 'invalid_request_error'],
    ['temperature < 0', C({ temperature: -1 }), 400, 'invalid_request_error'],
    ['top_p > 1', C({ top_p: 1.5 }), 400, 'invalid_request_error'],
    ['top_p = 0', C({ top_p: 0 }), 400, 'invalid_request_error'],
    ['max_tokens = 0', C({ max_tokens: 0 }), 400, 'invalid_request_error'],
    ['max_tokens < 0', C({ max_tokens: -5 }), 400, 'invalid_request_error'],
    ['max_completion_tokens < 0 (chat)', CH({ max_tokens: undefined, max_completion_tokens: -1 }), 400, 'invalid_request_error'],
    ['n = 0', C({ n: 0 }), 400, 'invalid_request_error'],
    ['n too large (over limits.max_n)', C({ n: 9 }), 400, 'invalid_request_error'],
    ['n far too large', C({ n: 100000 }), 400, 'invalid_request_error'],
    ['empty prompt string', C({ prompt: '' }), 400, 'invalid_request_error'],
    ['empty prompt array', C({ prompt: [] }), 400, 'invalid_request_error'],
    ['empty prompt in an array', C({ prompt: [[1, 2], []] }), 400, 'invalid_request_error'],
    ['empty messages', CH({ messages: [] }), 400, 'invalid_request_error'],
    ['token id out of the vocabulary', C({ prompt: [1, 99999999] }), 400, 'invalid_request_error'],
    ['negative token id', C({ prompt: [1, -3] }), 400, 'invalid_request_error'],
    ['more than 4 stop strings', C({ stop: ['a', 'b', 'c', 'd', 'e'] }), 400, 'invalid_request_error'],
    ['stop string over limits.max_stop_len', C({ stop: ['x'.repeat(MAX_STOP_LEN + 1)] }), 400, 'invalid_request_error'],
    ['tools', CH({ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {} } } }] }), 400, 'invalid_request_error'],
    ['response_format json_schema', CH({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } } }), 400, 'invalid_request_error'],
    ['response_format json_object', CH({ response_format: { type: 'json_object' } }), 400, 'invalid_request_error'],
    ['logprobs (completions)', C({ logprobs: 2 }), 400, 'invalid_request_error'],
    ['logprobs (chat)', CH({ logprobs: true }), 400, 'invalid_request_error'],
    ['top_logprobs (chat)', CH({ logprobs: true, top_logprobs: 3 }), 400, 'invalid_request_error'],
    ['best_of > 1', C({ best_of: 2 }), 400, 'invalid_request_error'],
    ['echo', C({ echo: true }), 400, 'invalid_request_error'],
    ['suffix', C({ suffix: 'end' }), 400, 'invalid_request_error'],
    ['context overflow (ids)', C({ prompt: Array.from({ length: MAX_CTX + 76 }, (_, i) => 10 + (i % 500)) }), 400, 'invalid_request_error',
        (e) => {
            assert.equal(e.code, 'context_length_exceeded');
            assert.equal(e.n_prompt_tokens, MAX_CTX + 76, 'n_prompt_tokens');
            if (IS_TINY) assert.equal(e.n_ctx, MAX_CTX, 'n_ctx');
            else assert.ok(Number.isInteger(e.n_ctx));
        }],
    ['context overflow (chat)', CH({ messages: [{ role: 'user', content: 'the river and the sea '.repeat(300) }] }), 400, 'invalid_request_error',
        (e) => {
            assert.equal(e.code, 'context_length_exceeded');
            assert.ok(Number.isInteger(e.n_prompt_tokens) && e.n_prompt_tokens > MAX_CTX, `n_prompt_tokens ${e.n_prompt_tokens}`);
            assert.ok(Number.isInteger(e.n_ctx));
        }],
    ['unknown endpoint (POST)', { method: 'POST', path: '/v1/nope', body: {} }, 404, 'not_found_error'],
    ['unknown endpoint (GET)', { path: '/nope' }, 404, 'not_found_error'],
    ['wrong method: GET /v1/completions', { path: '/v1/completions' }, 405, ANY],
    ['wrong method: DELETE /v1/chat/completions', { method: 'DELETE', path: '/v1/chat/completions' }, 405, ANY],
    ['wrong method: POST /v1/models', { method: 'POST', path: '/v1/models', body: {} }, 405, ANY],
    ['body over limits.max_body_bytes', C({ prompt: 'x'.repeat(MAX_BODY + 1000) }), 413, ANY],
];

function checkEnvelope(r, type) {
    assert.match(r.headers['content-type'] ?? '', /^application\/json/, 'Content-Type of the error');
    assert.ok(r.headers['x-request-id'], 'x-request-id on the error');
    let body;
    assert.doesNotThrow(() => (body = r.json()), `a JSON body: ${r.text.slice(0, 200)}`);
    const e = body.error;
    assert.ok(e && typeof e === 'object', `{"error": {...}}: ${r.text.slice(0, 200)}`);
    assert.equal(typeof e.message, 'string');
    assert.ok(e.message.length > 0, 'a message');
    for (const k of ['type', 'param', 'code']) assert.ok(k in e, `error.${k} present (may be null)`);
    if (type) assert.equal(e.type, type, `error.type (message: ${e.message})`);
    else assert.ok(typeof e.type === 'string' && e.type.length > 0, 'error.type');
    return e;
}

async function stillAnswers() {
    const h = await raw(srv.url, { path: '/health' });
    assert.equal(h.status, 200, 'the server still answers /health');
}

for (const [name, req, status, type, check] of CASES) {
    test(`${status}: ${name}`, { timeout: 30000 }, async () => {
        const q = { ...req };
        if (q.body && typeof q.body === 'object' && !Buffer.isBuffer(q.body)) q.body = JSON.parse(JSON.stringify(q.body));
        const r = await raw(srv.url, q);
        assert.equal(r.status, status, `status (body: ${r.text.slice(0, 300)})`);
        const e = checkEnvelope(r, type);
        if (check) check(e);
        await stillAnswers();
    });
}

test('unknown fields are ignored; any model name is accepted', { timeout: 30000 }, async () => {
    const r = await raw(srv.url, C({ frobnicate: true, user: 'u1', metadata: { a: 1 }, model: 'gpt-3.5-turbo' }));
    assert.equal(r.status, 200, r.text.slice(0, 300));
    assert.equal(r.json().choices.length, 1);
});

test('the SDK maps a 400 to BadRequestError with type and code', { timeout: 30000 }, async () => {
    const sdk = client(srv);
    await assert.rejects(
        sdk.completions.create({ model: srv.model, prompt: Array.from({ length: MAX_CTX + 10 }, () => 42), max_tokens: 4 }),
        (e) => {
            assert.ok(e instanceof BadRequestError, `BadRequestError, got ${e?.constructor?.name}`);
            assert.equal(e.status, 400);
            assert.equal(e.type, 'invalid_request_error');
            assert.equal(e.code, 'context_length_exceeded');
            assert.ok(e.requestID, 'requestID from x-request-id');
            return true;
        }
    );
});

test('after all the bad requests the server still generates correctly', { timeout: 30000 }, async () => {
    const ref = await solo(P, { maxTokens: 12 });
    const r = await client(srv).completions.create({ model: srv.model, prompt: P, max_tokens: 12, temperature: 0, return_token_ids: true });
    assert.equal(r.choices[0].text, await detokenize(ref));
    const m = await raw(srv.url, { path: '/metrics' });
    assert.equal(m.status, 200);
});

// ---- API keys

test('api_key_file: wrong or missing key -> 401 authentication_error; health public; right key works', { timeout: 60000 }, async () => {
    const dir = tmpdir('keys');
    const keys = path.join(dir, 'keys.txt');
    fs.writeFileSync(keys, '# test keys\nsk-test-one\nsk-test-two\n');
    const s = await startServer(['--draft', 'none', '--set', `server.api_key_file=${keys}`]);
    try {
        for (const headers of [{}, { authorization: 'Bearer sk-wrong' }, { authorization: 'sk-test-one' }]) {
            const r = await raw(s.url, { ...C(), headers });
            assert.equal(r.status, 401, `${JSON.stringify(headers)}: ${r.status}`);
            const e = r.json().error;
            assert.equal(e.type, 'authentication_error');
            assert.ok(r.headers['x-request-id']);
        }
        const models = await raw(s.url, { path: '/v1/models' });
        assert.equal(models.status, 401, '/v1/models needs the key');
        for (const p of ['/health', '/livez', '/readyz']) {
            assert.equal((await raw(s.url, { path: p })).status, 200, `${p} is public`);
        }
        await assert.rejects(
            client(s, { apiKey: 'sk-wrong' }).completions.create({ model: s.model, prompt: P, max_tokens: 2 }),
            (e) => e instanceof AuthenticationError && e.status === 401 && e.type === 'authentication_error'
        );
        for (const key of ['sk-test-one', 'sk-test-two']) {
            const ok = await client(s, { apiKey: key }).completions.create({ model: s.model, prompt: P, max_tokens: 2 });
            assert.equal(ok.choices.length, 1, key);
        }
        const list = await client(s, { apiKey: 'sk-test-two' }).models.list();
        assert.equal(list.data[0].id, s.model);
    } finally {
        assert.equal(await s.stop(), 0);
    }
});
