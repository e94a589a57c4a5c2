// tests/serve/metrics.test.mjs: /metrics agrees with the responses. The families exist with their
// types, counters only grow, the generation-token counter moves by exactly the sum of
// usage.completion_tokens, prompt tokens and finish reasons reconcile, the speculation counters
// are consistent (accepted <= drafted, per-position sums, per-position non-increasing), gauges
// return to 0 at rest; vllm_compat adds the vllm:spec_decode_* aliases; metrics.enabled = off
// turns the endpoint off.
//
//   node --test tests/serve/metrics.test.mjs

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { serverForFile, startServer, client, raw, scrape, settled, parseProm, mval, has, tokenize, collect, solo, detokenize } from './harness.mjs';

const K = 3;
let srv, prompt;

serverForFile(['--draft', 'mtp', '--draft-policy', 'fixed', '--draft-tokens', String(K)], 'The farmer went to the market with', (s, p) => ([srv, prompt] = [s, p]));

const T = { timeout: 60000 };

const FAMILIES = {
    tandem_requests_running: 'gauge',
    tandem_requests_waiting: 'gauge',
    tandem_slots_busy: 'gauge',
    tandem_requests_finished_total: 'counter',
    tandem_generation_tokens_total: 'counter',
    tandem_prompt_tokens_total: 'counter',
    tandem_client_disconnects_total: 'counter',
    tandem_spec_drafts_total: 'counter',
    tandem_spec_draft_tokens_total: 'counter',
    tandem_spec_accepted_tokens_total: 'counter',
    tandem_spec_accepted_tokens_per_pos_total: 'counter',
    tandem_nonfinite_rows_total: 'counter',
    tandem_history_blocks: 'gauge',
    tandem_ttft_seconds: 'histogram',
};

// a family's TYPE line names it with or without _total (classic text format vs OpenMetrics)
function typeOf(m, name) {
    return m.types.get(name) ?? m.types.get(name.replace(/_total$/, ''));
}

test('the families are present with their types; the text format is well formed', T, async () => {
    // one request first so that labelled families have series
    await client(srv).completions.create({ model: srv.model, prompt, max_tokens: 8, temperature: 0 });
    const r = await raw(srv.url, { path: '/metrics' });
    assert.equal(r.status, 200);
    assert.match(r.headers['content-type'] ?? '', /^text\/plain/);
    const m = parseProm(r.text);
    for (const [name, type] of Object.entries(FAMILIES)) {
        assert.equal(typeOf(m, name), type, `# TYPE ${name} ${type}`);
        assert.ok(r.text.includes(`# HELP ${name}`) || r.text.includes(`# HELP ${name.replace(/_total$/, '')}`), `# HELP ${name}`);
    }
    for (const name of Object.keys(FAMILIES)) {
        if (FAMILIES[name] === 'histogram') continue;
        if (name === 'tandem_client_disconnects_total' || name === 'tandem_requests_finished_total') continue; // labelled, may have no series yet
        assert.ok(has(m, name), `series of ${name}`);
    }
    // every sample line parses; no duplicate series
    const seen = new Set();
    for (const line of r.text.split('\n')) {
        if (!line || line.startsWith('#')) continue;
        assert.match(line, /^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? [-+0-9.eEinfINFaN]+( \d+)?$/, `sample line: ${line}`);
        const key = line.split(' ')[0];
        assert.ok(!seen.has(key), `duplicate series ${key}`);
        seen.add(key);
    }
    assert.ok(r.text.endsWith('\n'));
    // the history pool: its blocks (every slot at max_context by default), none held when idle
    assert.ok(mval(m, 'tandem_history_blocks', { state: 'total' }) > 0, 'history pool blocks');
    assert.equal(mval(m, 'tandem_history_blocks', { state: 'held' }), 0, 'history blocks held when idle');
    // the histogram: cumulative buckets ending at +Inf == _count, a _sum
    const buckets = [...m.entries()].filter(([k]) => k.startsWith('tandem_ttft_seconds_bucket{'));
    assert.ok(buckets.length >= 2, 'ttft buckets');
    const les = buckets.map(([k, v]) => [/le="([^"]+)"/.exec(k)[1], v]).map(([le, v]) => [le === '+Inf' ? Infinity : Number(le), v]).sort((a, b) => a[0] - b[0]);
    assert.equal(les[les.length - 1][0], Infinity, 'a +Inf bucket');
    for (let i = 1; i < les.length; i++) assert.ok(les[i][1] >= les[i - 1][1], 'buckets are cumulative');
    assert.equal(les[les.length - 1][1], mval(m, 'tandem_ttft_seconds_count'), '+Inf bucket == _count');
    assert.ok(has(m, 'tandem_ttft_seconds_sum'));
});

test('usage reconciles with the counters (n = 1: tokens, prompt tokens, finish reasons, TTFT count)', T, async () => {
    const sdk = client(srv);
    const m0 = await settled(srv);
    const usages = [];
    const finishes = [];
    const p2 = [...prompt, 500];
    // a stop string from this prompt's own output, so that one request ends by "stop"
    const ref = await detokenize(await solo(p2, { maxTokens: 24 }));
    const stop = ref.slice(10, 14);
    const reqs = [
        () => sdk.completions.create({ model: srv.model, prompt, max_tokens: 10, temperature: 0 }),
        () => sdk.completions.create({ model: srv.model, prompt: p2, max_tokens: 24, temperature: 0, stop }),
        () => sdk.completions.create({ model: srv.model, prompt, max_tokens: 17, temperature: 1, seed: 3 }),
        () => sdk.chat.completions.create({ model: srv.model, messages: [{ role: 'user', content: 'Count the cows.' }], max_tokens: 20, temperature: 0 }),
    ];
    for (const f of reqs) {
        const r = await f();
        usages.push(r.usage);
        finishes.push(r.choices[0].finish_reason);
    }
    for (const body of [
        { path: '/v1/completions', b: { model: srv.model, prompt, max_tokens: 12, temperature: 0 } },
        { path: '/v1/chat/completions', b: { model: srv.model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 9, temperature: 0 } },
    ]) {
        const st = body.path === '/v1/completions'
            ? await sdk.completions.create({ ...body.b, stream: true, stream_options: { include_usage: true } })
            : await sdk.chat.completions.create({ ...body.b, stream: true, stream_options: { include_usage: true } });
        const chunks = [];
        for await (const c of st) chunks.push(c);
        const c = collect(chunks);
        usages.push(c.usage);
        finishes.push(c.finish[0]);
    }
    const m1 = await settled(srv);
    const d = (name, labels) => mval(m1, name, labels) - mval(m0, name, labels);
    const gen = usages.reduce((s, u) => s + u.completion_tokens, 0);
    const pro = usages.reduce((s, u) => s + u.prompt_tokens, 0);
    assert.equal(d('tandem_generation_tokens_total'), gen, 'tandem_generation_tokens_total delta == sum of usage.completion_tokens');
    assert.equal(d('tandem_prompt_tokens_total'), pro, 'tandem_prompt_tokens_total delta == sum of usage.prompt_tokens');
    assert.equal(d('tandem_requests_finished_total'), reqs.length + 2, 'finished requests');
    assert.ok(finishes.includes('stop'), `one request ended by its stop string (${finishes})`);
    for (const reason of ['stop', 'length']) {
        const n = finishes.filter((f) => f === reason).length;
        assert.equal(d('tandem_requests_finished_total', { reason }), n, `finished{reason="${reason}"}`);
    }
    assert.equal(d('tandem_ttft_seconds_count'), reqs.length + 2, 'one TTFT sample per request');
    for (const g of ['tandem_requests_running', 'tandem_requests_waiting', 'tandem_slots_busy']) assert.equal(mval(m1, g), 0, `${g} at rest`);
    // counters only grow
    for (const [k, v] of m0) {
        const name = k.split('{')[0];
        if (/_total$|_count$|_bucket$|_sum$/.test(name) && m1.has(k)) assert.ok(m1.get(k) >= v, `${k} went down`);
    }
});

test('n > 1: generation tokens == the sum over choices', T, async () => {
    const sdk = client(srv);
    const m0 = await settled(srv);
    const a = await sdk.completions.create({ model: srv.model, prompt, max_tokens: 11, temperature: 1, seed: 5, n: 3 });
    const st = await sdk.completions.create({ model: srv.model, prompt, max_tokens: 7, temperature: 1, seed: 9, n: 2, stream: true, stream_options: { include_usage: true } });
    const chunks = [];
    for await (const c of st) chunks.push(c);
    const b = collect(chunks).usage;
    const m1 = await settled(srv);
    assert.equal(
        mval(m1, 'tandem_generation_tokens_total') - mval(m0, 'tandem_generation_tokens_total'),
        a.usage.completion_tokens + b.completion_tokens
    );
});

test('speculation counters are consistent (mtp, k = 3)', T, async () => {
    const sdk = client(srv);
    const m0 = await settled(srv);
    await sdk.completions.create({ model: srv.model, prompt, max_tokens: 64, temperature: 0, ignore_eos: true });
    const m1 = await settled(srv);
    const d = (name, labels) => mval(m1, name, labels) - mval(m0, name, labels);
    const drafts = d('tandem_spec_drafts_total');
    const dtoks = d('tandem_spec_draft_tokens_total');
    const acc = d('tandem_spec_accepted_tokens_total');
    assert.ok(drafts > 0, 'drafts');
    assert.ok(dtoks >= drafts && dtoks <= drafts * K, `draft tokens ${dtoks} within [drafts, drafts * k] (drafts ${drafts})`);
    assert.ok(acc >= 0 && acc <= dtoks, `accepted ${acc} <= drafted ${dtoks}`);
    const per = [];
    for (let p = 0; p < K; p++) per.push(d('tandem_spec_accepted_tokens_per_pos_total', { position: p }));
    assert.equal(per.reduce((s, x) => s + x, 0), acc, `per-position sum ${per} == accepted ${acc}`);
    for (let p = 1; p < K; p++) assert.ok(per[p] <= per[p - 1], `position ${p} accepted no more often than ${p - 1}: ${per}`);
    assert.ok(per[0] <= drafts);
    // every generated token is an accepted draft or a step's own token
    assert.ok(d('tandem_generation_tokens_total') >= acc, 'generation tokens include the accepted drafts');
});

test('[metrics] vllm_compat = on adds vllm:spec_decode_*_total equal to ours', { timeout: 90000 }, async () => {
    const s = await startServer(['--draft', 'mtp', '--draft-policy', 'fixed', '--draft-tokens', String(K), '--set', 'metrics.vllm_compat=on']);
    try {
        await client(s).completions.create({ model: s.model, prompt, max_tokens: 32, temperature: 0, ignore_eos: true });
        const m = await settled(s);
        const lines = m.text.split('\n').filter((l) => l.startsWith('vllm:spec_decode') && /_total(\{|\s)/.test(l));
        assert.ok(lines.length >= 4, `vllm:spec_decode_*_total lines: ${lines.join(' | ')}`);
        assert.equal(mval(m, 'vllm:spec_decode_num_drafts_total'), mval(m, 'tandem_spec_drafts_total'));
        assert.equal(mval(m, 'vllm:spec_decode_num_draft_tokens_total'), mval(m, 'tandem_spec_draft_tokens_total'));
        assert.equal(mval(m, 'vllm:spec_decode_num_accepted_tokens_total'), mval(m, 'tandem_spec_accepted_tokens_total'));
        assert.equal(mval(m, 'vllm:spec_decode_num_accepted_tokens_per_pos_total'), mval(m, 'tandem_spec_accepted_tokens_per_pos_total'));
    } finally {
        assert.equal(await s.stop(), 0);
    }
});

test('[metrics] enabled = off: /metrics is not served, the rest is', { timeout: 90000 }, async () => {
    const s = await startServer(['--draft', 'none', '--set', 'metrics.enabled=off']);
    try {
        const r = await raw(s.url, { path: '/metrics' });
        assert.ok([404, 501].includes(r.status), `/metrics status ${r.status}`);
        assert.equal((await raw(s.url, { path: '/health' })).status, 200);
    } finally {
        assert.equal(await s.stop(), 0);
    }
});
