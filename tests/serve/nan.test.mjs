// tests/serve/nan.test.mjs: a non-finite logits row fails only its own request. The server's test
// seam TANDEM_TEST_NAN=<seed> injects a NaN row into requests whose seed is that value after
// their third generated token: streamed, the client gets a `data: {"error":...}` event (the SDK
// raises APIError); not streamed, 500 with code nonfinite_logits; tandem_nonfinite_rows_total
// counts each; requests running beside it are unaffected and the server stays ready.
//
//   node --test tests/serve/nan.test.mjs

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { APIError, InternalServerError } from 'openai';
import {
    serverForFile, client, solo, detokenize, tokenize, collect, settled, mval, raw, parseSSE,
} from './harness.mjs';

const NAN_SEED = 4242;
let srv, prompt;

serverForFile(['--draft', 'none'], 'The bells rang out over the town', (s, p) => ([srv, prompt] = [s, p]), { env: { TANDEM_TEST_NAN: String(NAN_SEED) } });

const T = { timeout: 30000 };
const body = (extra = {}) => ({ model: srv.model, prompt, max_tokens: 24, temperature: 0, ...extra });
const nanRows = async () => mval(await settled(srv), 'tandem_nonfinite_rows_total');

test('streamed: an error event after the first tokens, no finish_reason (raw SSE)', T, async () => {
    const n0 = await nanRows();
    const ref = await solo(prompt, { maxTokens: 24 });
    const refText = await detokenize(ref);
    const r = await raw(srv.url, { method: 'POST', path: '/v1/completions', body: body({ seed: NAN_SEED, stream: true }) });
    assert.equal(r.status, 200, 'headers were sent before the failure');
    const { events, problems } = parseSSE(r.text);
    assert.deepEqual(problems, [], 'SSE framing');
    const parsed = events.filter((e) => e !== '[DONE]').map((e) => JSON.parse(e));
    const errAt = parsed.findIndex((p) => p.error);
    assert.ok(errAt >= 0, `an error event: ${r.text.slice(-300)}`);
    const e = parsed[errAt].error;
    assert.equal(typeof e.message, 'string');
    assert.equal(typeof e.type, 'string');
    assert.equal(parsed.length - 1, errAt, 'nothing but [DONE] after the error event');
    const before_ = parsed.slice(0, errAt);
    const c = collect(before_);
    assert.equal(c.finish[0], undefined, 'no finish_reason for the failed choice');
    assert.ok(refText.startsWith(c.text[0] ?? ''), 'the text sent before the error is a prefix of the real output');
    assert.ok((c.text[0] ?? '').length > 0, 'the first tokens were sent (the row fails after the 3rd)');
    assert.equal(await nanRows(), n0 + 1, 'tandem_nonfinite_rows_total +1');
});

test('streamed through the SDK: APIError', T, async () => {
    const n0 = await nanRows();
    const st = await client(srv).completions.create(body({ seed: NAN_SEED, stream: true }));
    let text = '';
    await assert.rejects(
        (async () => {
            for await (const c of st) text += c.choices[0]?.text ?? '';
        })(),
        (e) => e instanceof APIError
    );
    assert.equal(await nanRows(), n0 + 1);
    // chat, streamed, too
    const cst = await client(srv).chat.completions.create({ model: srv.model, messages: [{ role: 'user', content: 'Ring.' }], max_tokens: 24, temperature: 0, seed: NAN_SEED, stream: true });
    await assert.rejects((async () => { for await (const _ of cst); })(), (e) => e instanceof APIError);
    assert.equal(await nanRows(), n0 + 2);
});

test('not streamed: 500 with code nonfinite_logits', T, async () => {
    const n0 = await nanRows();
    const r = await raw(srv.url, { method: 'POST', path: '/v1/completions', body: body({ seed: NAN_SEED }) });
    assert.equal(r.status, 500);
    assert.match(r.headers['content-type'] ?? '', /^application\/json/);
    const e = r.json().error;
    assert.equal(e.code, 'nonfinite_logits');
    assert.equal(e.type, 'server_error');
    assert.equal(await nanRows(), n0 + 1);
    // the SDK (no retries) raises InternalServerError with the code
    await assert.rejects(client(srv).completions.create(body({ seed: NAN_SEED })), (x) => x instanceof InternalServerError && x.code === 'nonfinite_logits');
    assert.equal(await nanRows(), n0 + 2);
});

test('requests beside the failing one are unaffected', T, async () => {
    const others = [[...prompt, 300], [...prompt, 301], [...prompt, 302]];
    const refs = [];
    for (const p of others) refs.push(await detokenize(await solo(p, { maxTokens: 24 })));
    const sdk = client(srv);
    const run = async (p, seed) => {
        const st = await sdk.completions.create({ model: srv.model, prompt: p, max_tokens: 24, temperature: 0, seed, stream: true });
        const chunks = [];
        for await (const c of st) chunks.push(c);
        return collect(chunks);
    };
    const results = await Promise.allSettled([
        run(others[0], 1),
        run(prompt, NAN_SEED),
        run(others[1], 2),
        raw(srv.url, { method: 'POST', path: '/v1/completions', body: body({ seed: NAN_SEED }) }),
        run(others[2], 3),
    ]);
    assert.equal(results[1].status, 'rejected', 'the NaN stream fails');
    assert.equal(results[3].value?.status, 500, 'the NaN non-stream fails');
    for (const [i, ri] of [[0, 0], [1, 2], [2, 4]]) {
        assert.equal(results[ri].status, 'fulfilled', `stream ${i}: ${results[ri].reason}`);
        assert.equal(results[ri].value.text[0], refs[i], `stream ${i} exact`);
    }
    const m = await settled(srv);
    assert.equal(mval(m, 'tandem_requests_running'), 0);
    assert.equal((await raw(srv.url, { path: '/readyz' })).status, 200, 'still ready: a NaN row is not fatal');
});
