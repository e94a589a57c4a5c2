// tests/serve/greedy.test.mjs: greedy output through the server equals `tandem generate`'s for
// the same prompt ids: completions and chat, streamed and not, on servers without a drafter and
// with each drafter (speculation is lossless, so every server must give the no-draft ids), and
// with the experts split over two processes.
//
//   node --test tests/serve/greedy.test.mjs

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
    startServer, client, solo, soloText, detokenize, tokenize, chatIds, collect, stripEos, settled, mval,
} from './harness.mjs';

// each server's name and its arguments: every drafter, and DSpark with the model's experts split
// over 2 processes (model.ranks: rank 0 serves, a follower it starts runs its half of the experts)
const ARGS = {
    none: ['--draft', 'none'],
    mtp: ['--draft', 'mtp'],
    dspark: ['--draft', 'dspark'],
    ngram: ['--draft', 'ngram'],
    'dspark, 2 ranks': ['--draft', 'dspark', '--ranks', '2'],
};
const DRAFTERS = Object.keys(ARGS);
const MAXT = 32;
const TEXTS = ['Once upon a time there was a', 'The king said to his son', 'In the morning the'];
const CHAT = [{ role: 'user', content: 'What did the king say?' }];
const servers = {};
let prompts, refs, chatPrompt, chatRef;

before(async () => {
    // the servers load side by side; an idle server costs nothing
    const started = await Promise.allSettled(DRAFTERS.map((d) => startServer(ARGS[d])));
    started.forEach((r, i) => (servers[DRAFTERS[i]] = r.status === 'fulfilled' ? r.value : r.reason));
    prompts = await Promise.all(TEXTS.map((t) => tokenize(t)));
    refs = [];
    for (const p of prompts) refs.push(await solo(p, { maxTokens: MAXT }));
    chatPrompt = await chatIds(CHAT);
    chatRef = await solo(chatPrompt, { maxTokens: MAXT });
}, { timeout: 120000 });

after(async () => {
    const codes = {};
    for (const [d, s] of Object.entries(servers)) if (s && s.stop) codes[d] = await s.stop();
    for (const [d, c] of Object.entries(codes)) assert.equal(c, 0, `${d} server exit code`);
}, { timeout: 60000 });

function server(d) {
    const s = servers[d];
    if (s instanceof Error) throw s;
    return s;
}

const T = { timeout: 60000 };
const finishOf = (ids) => (ids.length < MAXT ? 'stop' : 'length');

for (const d of DRAFTERS) {
    test(`[draft ${d}] completions, ids prompt, not streamed: token_ids == generate`, T, async () => {
        const srv = server(d);
        const sdk = client(srv);
        for (let i = 0; i < prompts.length; i++) {
            const r = await sdk.completions.create({
                model: srv.model, prompt: prompts[i], max_tokens: MAXT, temperature: 0, return_token_ids: true,
            });
            const c = r.choices[0];
            assert.ok(Array.isArray(c.token_ids), 'choices[0].token_ids with return_token_ids');
            assert.deepEqual(stripEos(c.token_ids), stripEos(refs[i]), `prompt ${i}: ids`);
            assert.equal(c.text, await detokenize(refs[i]), `prompt ${i}: text`);
            assert.equal(c.finish_reason, finishOf(refs[i]));
            assert.equal(r.usage.completion_tokens, c.token_ids.length, 'usage.completion_tokens = tokens generated');
            assert.equal(r.usage.prompt_tokens, prompts[i].length);
        }
    });

    test(`[draft ${d}] completions streamed: text == generate`, T, async () => {
        const srv = server(d);
        const sdk = client(srv);
        for (let i = 0; i < prompts.length; i++) {
            const st = await sdk.completions.create({
                model: srv.model, prompt: prompts[i], max_tokens: MAXT, temperature: 0, stream: true,
                stream_options: { include_usage: true },
            });
            const chunks = [];
            for await (const c of st) chunks.push(c);
            const s = collect(chunks);
            assert.equal(s.text[0], await detokenize(refs[i]), `prompt ${i}`);
            assert.equal(s.finish[0], finishOf(refs[i]));
            assert.ok(
                s.usage.completion_tokens === refs[i].length || s.usage.completion_tokens === stripEos(refs[i]).length,
                `usage.completion_tokens ${s.usage.completion_tokens}, generate made ${refs[i].length}`
            );
        }
    });

    test(`[draft ${d}] chat, not streamed and streamed: content == generate on the chat ids`, T, async () => {
        const srv = server(d);
        const sdk = client(srv);
        const want = await detokenize(chatRef);
        const ns = await sdk.chat.completions.create({ model: srv.model, messages: CHAT, max_tokens: MAXT, temperature: 0 });
        assert.equal(ns.choices[0].message.content, want, 'non-streamed');
        assert.equal(ns.choices[0].finish_reason, finishOf(chatRef));
        assert.equal(ns.usage.prompt_tokens, chatPrompt.length, 'prompt_tokens = the chat format ids');
        const st = await sdk.chat.completions.create({
            model: srv.model, messages: CHAT, max_tokens: MAXT, temperature: 0, stream: true,
        });
        const chunks = [];
        for await (const c of st) chunks.push(c);
        const s = collect(chunks);
        assert.equal(s.text[0], want, 'streamed');
        assert.equal(s.finish[0], finishOf(chatRef));
    });
}

test('[draft none] text prompt == `tandem generate "TEXT"` text output', T, async () => {
    const srv = server('none');
    const sdk = client(srv);
    for (const text of TEXTS) {
        const want = await soloText(text, { maxTokens: MAXT });
        const r = await sdk.completions.create({ model: srv.model, prompt: text, max_tokens: MAXT, temperature: 0 });
        assert.equal(r.choices[0].text, want, JSON.stringify(text));
    }
});

test('the model drafters ran: speculation counters moved', T, async () => {
    for (const d of ['mtp', 'dspark']) {
        const m = await settled(server(d));
        assert.ok(mval(m, 'tandem_spec_drafts_total') > 0, `${d}: tandem_spec_drafts_total > 0 after the requests`);
        assert.ok(mval(m, 'tandem_spec_draft_tokens_total') > 0, `${d}: draft tokens`);
    }
    const none = await settled(server('none'));
    assert.equal(mval(none, 'tandem_spec_drafts_total'), 0, 'no drafts without a drafter');
});
