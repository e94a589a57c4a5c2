// tests/serve/prefix.test.mjs: the prefix cache through the server (scheduler.prefix_blocks):
// the same 520-token prompt twice, the second takes 519 tokens from the cache (all but its last,
// inside the first's tail)
// (usage.prompt_tokens_details.cached_tokens) and gives the first's ids, which are
// `tandem generate`'s, and /metrics counts it; a server without the cache reports 0; a server
// whose model is split over 2 processes (--ranks 2: the follower makes the cache's copies and
// checkpoints too) finds the same tokens and gives the same ids.
//
//   node --test tests/serve/prefix.test.mjs

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, solo, scrape, mval } from './harness.mjs';

const MAXT = 8;
let on, off, split, prompt, ref;

before(async () => {
    [on, off, split] = await Promise.all([
        startServer(['--draft', 'none', '--prefix-blocks', '8']),
        startServer(['--draft', 'none']),
        // (TD_RANK_CHECK: every step's residual streams compared across the ranks)
        startServer(['--draft', 'none', '--prefix-blocks', '8', '--ranks', '2'], { env: { TD_RANK_CHECK: '1' } }),
    ]);
    prompt = Array.from({ length: 520 }, (_, i) => ((i * 7919 + 13) % 8000) + 2);
    ref = await solo(prompt, { maxTokens: MAXT });
}, { timeout: 120000 });

after(async () => {
    for (const s of [on, off, split]) if (s && s.stop) assert.equal(await s.stop(), 0, 'server exit code');
}, { timeout: 60000 });

const T = { timeout: 60000 };

async function complete(srv) {
    const r = await client(srv).completions.create({
        model: srv.model, prompt, max_tokens: MAXT, temperature: 0, return_token_ids: true,
    });
    return { ids: r.choices[0].token_ids, cached: r.usage.prompt_tokens_details?.cached_tokens };
}

// the prompt twice on srv: the second takes 519 tokens from the cache (two blocks of 256 and 7
// of the tail: its last token is fed), both give tandem generate's ids
async function repeated(srv) {
    const a = await complete(srv);
    const b = await complete(srv);
    assert.equal(a.cached, 0, 'the first request found nothing');
    assert.equal(b.cached, 519, 'the second: two blocks of 256 and 7 of the tail');
    assert.deepEqual(b.ids, a.ids, 'the same ids warm and cold');
    assert.deepEqual(a.ids, ref.slice(0, a.ids.length), 'the ids of tandem generate');
}

test('a repeated prompt: 519 cached tokens, the same ids as generate', T, async () => {
    await repeated(on);
    // the engine's counters reach /metrics once a step has run after them
    await complete(on);
    const m = await scrape(on);
    assert.equal(mval(m, 'tandem_prefix_cache_queries_total'), 3);
    assert.equal(mval(m, 'tandem_prefix_cache_hits_total'), 2);
    assert.equal(mval(m, 'tandem_prefix_cache_hit_tokens_total'), 1038);
    // the two blocks and the tail (what the first request committed past them: 15 tokens)
    assert.equal(mval(m, 'tandem_prefix_cache_blocks', { state: 'cached' }), 3);
});

test('without the cache: cached_tokens 0', T, async () => {
    const a = await complete(off);
    const b = await complete(off);
    assert.equal(a.cached, 0);
    assert.equal(b.cached, 0);
    assert.deepEqual(b.ids, a.ids);
});

test('split over 2 ranks: the same cached tokens and ids', T, async () => {
    await repeated(split);
});
