// tests/serve/concurrency.test.mjs: seeds, n > 1 and many clients at once. Choice i of a request
// with n and seed S is sampled with seed S + i, so it equals a solo request with seed S + i and
// completion i of `tandem generate --n N --seed S`; 32 concurrent streaming clients (greedy and
// sampled) each get exactly what they get alone; batching changes no bits.
//
//   node --test tests/serve/concurrency.test.mjs

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, solo, soloN, detokenize, tokenize, collect, stripEos, pool } from './harness.mjs';

let none, mtp, prompt;
const MAXT = 16;

before(async () => {
    [none, mtp] = await Promise.all([startServer(['--draft', 'none']), startServer(['--draft', 'mtp', '--draft-policy', 'fixed', '--draft-tokens', '3'])]);
    prompt = await tokenize('She opened the door and');
}, { timeout: 90000 });

after(async () => {
    const a = none ? await none.stop() : 0;
    const b = mtp ? await mtp.stop() : 0;
    assert.equal(a, 0);
    assert.equal(b, 0);
}, { timeout: 60000 });

const T = { timeout: 90000 };
const ids = (r) => r.choices.slice().sort((a, b) => a.index - b.index).map((c) => c.token_ids);

test('n = 4 with seed S (temperature 1) == generate --n 4 --seed S == solo requests with seed S+i', T, async () => {
    const S = 1234;
    const sdk = client(none);
    const base = { model: none.model, prompt, max_tokens: MAXT, temperature: 1, return_token_ids: true };
    const r = await sdk.completions.create({ ...base, n: 4, seed: S });
    assert.equal(r.choices.length, 4);
    assert.deepEqual(r.choices.map((c) => c.index).sort(), [0, 1, 2, 3]);
    const got = ids(r);
    const gen = await soloN(prompt, 4, { maxTokens: MAXT, temperature: 1, seed: S });
    for (let i = 0; i < 4; i++) {
        assert.deepEqual(stripEos(got[i]), stripEos(gen[i]), `choice ${i} vs generate --n 4 --seed ${S} completion ${i}`);
        const one = await sdk.completions.create({ ...base, seed: S + i });
        assert.deepEqual(one.choices[0].token_ids, got[i], `choice ${i} vs a solo request with seed ${S + i}`);
    }
    assert.equal(r.usage.completion_tokens, got.reduce((s, x) => s + x.length, 0), 'usage sums the choices');
    assert.ok(new Set(got.map((x) => x.join(','))).size > 1, 'different seeds gave different samples');
});

test('n = 4 streamed: per-index text == the non-streamed choices', T, async () => {
    const S = 77;
    const sdk = client(none);
    const base = { model: none.model, prompt, max_tokens: MAXT, temperature: 1, seed: S, n: 4 };
    const ns = await sdk.completions.create(base);
    const st = await sdk.completions.create({ ...base, stream: true, stream_options: { include_usage: true } });
    const chunks = [];
    for await (const c of st) chunks.push(c);
    const s = collect(chunks);
    for (const c of ns.choices) {
        assert.equal(s.text[c.index], c.text, `choice ${c.index} text`);
        assert.equal(s.finish[c.index], c.finish_reason, `choice ${c.index} finish_reason`);
    }
    assert.equal(s.usage.completion_tokens, ns.usage.completion_tokens);
    // chat, n = 2, with top_k/top_p: the same rule
    const msgs = [{ role: 'user', content: 'Sing.' }];
    const cb = { model: none.model, messages: msgs, max_tokens: MAXT, temperature: 1, top_k: 40, top_p: 0.9, seed: S, n: 2 };
    const cns = await sdk.chat.completions.create(cb);
    const cst = await sdk.chat.completions.create({ ...cb, stream: true });
    const cc = [];
    for await (const c of cst) cc.push(c);
    const cs = collect(cc);
    for (const c of cns.choices) assert.equal(cs.text[c.index], c.message.content, `chat choice ${c.index}`);
    for (const i of [0, 1]) {
        const one = await sdk.chat.completions.create({ ...cb, n: 1, seed: S + i });
        assert.equal(one.choices[0].message.content, cns.choices.find((c) => c.index === i).message.content, `chat choice ${i} == seed ${S + i} alone`);
    }
});

test('the same seed twice gives the same sample', T, async () => {
    const sdk = client(none);
    const base = { model: none.model, prompt, max_tokens: MAXT, temperature: 1, seed: 99, return_token_ids: true };
    const a = await sdk.completions.create(base);
    const b = await sdk.completions.create(base);
    assert.deepEqual(a.choices[0].token_ids, b.choices[0].token_ids);
    const gen = await solo(prompt, { maxTokens: MAXT, temperature: 1, seed: 99 });
    assert.deepEqual(stripEos(a.choices[0].token_ids), stripEos(gen));
});

async function many(srv, count, draft) {
    // count clients: three in four greedy, the rest sampled with their own seed. Sampled output
    // depends on the drafter (speculative sampling is lossless in distribution, not per seed), so
    // the sampled references run generate with the server's drafter and k; greedy ones need none.
    const cases = [];
    for (let i = 0; i < count; i++) {
        const p = [...prompt, 300 + i * 37];
        const sampled = i % 4 === 3;
        cases.push({ p, sampled, seed: 1000 + i });
    }
    const refs = await pool(2, cases.map((c) => () => solo(c.p, c.sampled ? { maxTokens: MAXT, temperature: 1, seed: c.seed, ...draft } : { maxTokens: MAXT })));
    const want = await Promise.all(refs.map((r) => detokenize(r)));
    const sdk = client(srv);
    const got = await Promise.all(
        cases.map(async (c) => {
            const st = await sdk.completions.create({
                model: srv.model, prompt: c.p, max_tokens: MAXT, temperature: c.sampled ? 1 : 0, seed: c.seed,
                stream: true, stream_options: { include_usage: true },
            });
            const chunks = [];
            for await (const x of st) chunks.push(x);
            return collect(chunks);
        })
    );
    for (let i = 0; i < count; i++) {
        assert.equal(got[i].text[0], want[i], `client ${i} (${cases[i].sampled ? 'seed ' + cases[i].seed : 'greedy'}) text`);
        assert.ok(
            got[i].usage.completion_tokens === refs[i].length || got[i].usage.completion_tokens === stripEos(refs[i]).length,
            `client ${i} completion_tokens ${got[i].usage.completion_tokens} vs ${refs[i].length}`
        );
    }
}

test('32 concurrent streaming clients each get exactly their solo output (no drafter)', T, () => many(none, 32, { draft: 'none' }));

test('32 concurrent streaming clients each get exactly their solo output (mtp drafter)', T, () => many(mtp, 32, { draft: 'mtp', draftTokens: 3 }));
