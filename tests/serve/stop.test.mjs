// tests/serve/stop.test.mjs: stop strings that span token boundaries, streamed and not, without
// and with a drafter (whose verify steps commit several tokens at once). The stop string is cut
// from a greedy output's own text so that it starts inside one token and ends inside the next;
// the answer must be the text before it, finish_reason "stop", and usage.completion_tokens the
// tokens kept: those up to and including the token that completes the match (later tokens,
// e.g. the rest of a verify commit, are discarded).
//
//   node --test tests/serve/stop.test.mjs

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, solo, detokenize, tokenize, collect, raw, sseChunks } from './harness.mjs';

const MAXT = 40;
const servers = {};
let prompt, ref, full, texts, ends; // texts[k]: the text of ref[0..k); ends[k]: its length

before(async () => {
    [servers.none, servers.mtp] = await Promise.all([
        startServer(['--draft', 'none']),
        startServer(['--draft', 'mtp', '--draft-policy', 'fixed', '--draft-tokens', '3']),
    ]);
    prompt = await tokenize('The old king had three sons, and the youngest');
    ref = await solo(prompt, { maxTokens: MAXT });
    full = await detokenize(ref);
    texts = [''];
    for (let k = 1; k <= ref.length; k++) texts.push(await detokenize(ref.slice(0, k)));
    ends = texts.map((t) => t.length);
}, { timeout: 120000 });

after(async () => {
    for (const s of Object.values(servers)) if (s) assert.equal(await s.stop(), 0);
}, { timeout: 60000 });

/* A stop string starting 2 characters before the end of token k-1 and ending 2 characters
 * into token k, that first occurs there; { stop, before (the text before it), kept (tokens up
 * to and including token k) } or null. from: the smallest k to try. */
function crossing(from) {
    for (let k = Math.max(from, 2); k < ref.length - 1; k++) {
        const b = ends[k];
        // the prefixes must decode to prefixes of the full text (no split UTF-8 here)
        if (![k - 1, k, k + 1].every((j) => full.startsWith(texts[j]))) continue;
        if (ends[k] - ends[k - 1] < 3 || ends[k + 1] - ends[k] < 2) continue;
        const stop = full.slice(b - 2, b + 2);
        if (full.indexOf(stop) !== b - 2) continue;
        if (/[^\x20-\x7e]/.test(stop)) continue;
        return { stop, before: full.slice(0, b - 2), kept: k + 1, k };
    }
    return null;
}

const T = { timeout: 30000 };
for (const d of ['none', 'mtp']) {
    test(`[draft ${d}] stop string across a token boundary, not streamed`, T, async () => {
        const srv = servers[d];
        const c = crossing(3);
        assert.ok(c, `no usable stop string in ${JSON.stringify(full)}`);
        const r = await client(srv).completions.create({
            model: srv.model, prompt, max_tokens: MAXT, temperature: 0, stop: c.stop, return_token_ids: true,
        });
        const ch = r.choices[0];
        assert.equal(ch.text, c.before, `text before ${JSON.stringify(c.stop)}`);
        assert.equal(ch.finish_reason, 'stop');
        assert.equal(r.usage.completion_tokens, c.kept, `completion_tokens: tokens up to the one completing ${JSON.stringify(c.stop)}`);
        if (ch.token_ids) assert.deepEqual(ch.token_ids, ref.slice(0, c.kept), 'token_ids kept');
    });

    test(`[draft ${d}] stop string across a token boundary, streamed (raw SSE and SDK)`, T, async () => {
        const srv = servers[d];
        const c = crossing(3);
        assert.ok(c);
        const body = { model: srv.model, prompt, max_tokens: MAXT, temperature: 0, stop: [c.stop], stream: true, stream_options: { include_usage: true } };
        const r = await raw(srv.url, { method: 'POST', path: '/v1/completions', body });
        const { chunks, done, problems } = sseChunks(r.text);
        assert.deepEqual(problems, []);
        assert.ok(done);
        const s = collect(chunks);
        assert.equal(s.text[0], c.before, 'nothing of the stop string leaks into the stream');
        assert.equal(s.finish[0], 'stop');
        assert.equal(s.usage.completion_tokens, c.kept);
        // the same through the SDK's stream
        const st = await client(srv).completions.create(body);
        const got = [];
        for await (const x of st) got.push(x);
        assert.equal(collect(got).text[0], c.before);
    });

    test(`[draft ${d}] several stop strings: the earliest match wins`, T, async () => {
        const srv = servers[d];
        const first = crossing(3);
        assert.ok(first, 'a stop string');
        const later = crossing(first.k + 3);
        assert.ok(later, 'a second, later stop string');
        const r = await client(srv).completions.create({
            model: srv.model, prompt, max_tokens: MAXT, temperature: 0, stop: ['@@never@@', later.stop, first.stop],
        });
        assert.equal(r.choices[0].text, first.before);
        assert.equal(r.choices[0].finish_reason, 'stop');
        assert.equal(r.usage.completion_tokens, first.kept);
    });

    test(`[draft ${d}] a stop string that never occurs changes nothing`, T, async () => {
        const srv = servers[d];
        const r = await client(srv).completions.create({
            model: srv.model, prompt, max_tokens: MAXT, temperature: 0, stop: ['@@never@@', 'zzqx'],
        });
        assert.equal(r.choices[0].text, full);
        assert.equal(r.choices[0].finish_reason, ref.length < MAXT ? 'stop' : 'length');
        assert.equal(r.usage.completion_tokens, ref.length);
    });

    test(`[draft ${d}] stop string in the last generated token's text`, T, async () => {
        // the match completes in the last token that max_tokens allows: still "stop"
        const srv = servers[d];
        const c = crossing(3);
        const r = await client(srv).completions.create({
            model: srv.model, prompt, max_tokens: c.kept, temperature: 0, stop: c.stop,
        });
        assert.equal(r.choices[0].text, c.before);
        assert.equal(r.choices[0].finish_reason, 'stop');
        assert.equal(r.usage.completion_tokens, c.kept);
    });
}

test('stop_token_ids: generation ends at the listed token', T, async () => {
    const srv = servers.none;
    // the first token whose id has not appeared before, after the third
    let k = 3;
    while (k < ref.length && ref.slice(0, k).includes(ref[k])) k++;
    assert.ok(k < ref.length);
    const r = await client(srv).completions.create({
        model: srv.model, prompt, max_tokens: MAXT, temperature: 0, stop_token_ids: [ref[k]], return_token_ids: true,
    });
    const ch = r.choices[0];
    assert.equal(ch.finish_reason, 'stop');
    assert.ok(
        ch.text === (await detokenize(ref.slice(0, k))) || ch.text === (await detokenize(ref.slice(0, k + 1))),
        `text ${JSON.stringify(ch.text)} ends before or after the stop token`
    );
    if (ch.token_ids) assert.deepEqual(ch.token_ids, ref.slice(0, k + 1), 'the stop token is the last generated');
});

test('chat: stop string across a token boundary', T, async () => {
    const srv = servers.mtp;
    // the completions text again, now as a chat reply: use the chat output's own text
    const msgs = [{ role: 'user', content: 'Tell me a story about a king.' }];
    const sdk = client(srv);
    const base = { model: srv.model, messages: msgs, max_tokens: MAXT, temperature: 0 };
    const plain = await sdk.chat.completions.create(base);
    const text = plain.choices[0].message.content;
    // a 4-character stop from the middle whose first occurrence is there
    let at = Math.floor(text.length / 2);
    while (at < text.length - 4 && text.indexOf(text.slice(at, at + 4)) !== at) at++;
    assert.ok(at < text.length - 4, `no stop string in ${JSON.stringify(text)}`);
    const stop = text.slice(at, at + 4);
    const r = await sdk.chat.completions.create({ ...base, stop });
    assert.equal(r.choices[0].message.content, text.slice(0, at));
    assert.equal(r.choices[0].finish_reason, 'stop');
    const st = await sdk.chat.completions.create({ ...base, stop, stream: true });
    const chunks = [];
    for await (const c of st) chunks.push(c);
    assert.equal(collect(chunks).text[0], text.slice(0, at));
    assert.equal(collect(chunks).finish[0], 'stop');
});
