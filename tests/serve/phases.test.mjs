// tests/serve/phases.test.mjs: a client that goes away has its slot freed within one second in
// every phase its request can be in: waiting for a slot, prefilling a long prompt (no token
// yet, so nothing is ever written that could fail), and decoding; streamed or not. Each case
// prints how long the server took (abort -> the disconnect counted and the request gone).
//
//   node --test tests/serve/phases.test.mjs

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, scrape, mval, waitFor, sleep, MAX_CTX } from './harness.mjs';

let srv;

before(async () => {
    // one slot, and a prompt fed 8 rows a step: a 1000-token prompt prefills for ~125 steps
    srv = await startServer(['--draft', 'none', '--set', 'scheduler.max_running=1',
        '--set', 'scheduler.max_batch_tokens=8', '--set', 'server.sse_ping_s=30']);
}, { timeout: 90000 });

after(async () => {
    if (srv) assert.equal(await srv.stop(), 0);
}, { timeout: 40000 });

const longPrompt = Array.from({ length: Math.min(1000, MAX_CTX - 8) }, (_, i) => 100 + ((i * 37) % 4000));

function start(body, stream) {
    const ctl = new AbortController();
    const done = fetch(`${srv.url}/v1/completions`, {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ ...body, stream }), signal: ctl.signal,
    }).then((r) => r.text()).catch(() => null);
    return { ctl, done };
}

async function phaseOf(want, ms = 3000) {
    await waitFor(async () => {
        const r = await fetch(`${srv.url}/slots`);
        const s = await r.json();
        return want === 'queued' ? s.waiting > 0 : s.running > 0;
    }, { timeoutMs: ms, what: `a request ${want}` });
}

async function freedWithin(phase, before, ms) {
    const t0 = Date.now();
    await waitFor(async () => {
        const m = await scrape(srv);
        return mval(m, 'tandem_client_disconnects_total', { phase }) >= before + 1 &&
            mval(m, 'tandem_requests_running') === 0 && mval(m, 'tandem_requests_waiting') === 0 &&
            mval(m, 'tandem_slots_busy') === 0;
    }, { timeoutMs: ms, intervalMs: 10, what: `disconnect{phase="${phase}"} counted and the slot free within ${ms} ms` });
    return Date.now() - t0;
}

const T = { timeout: 30000 };
for (const stream of [true, false]) {
    const how = stream ? 'streamed' : 'not streamed';

    test(`prefill (${how}): a client gone during a long prefill frees the slot within 1 s`, T, async (t) => {
        const d0 = mval(await scrape(srv), 'tandem_client_disconnects_total', { phase: 'prefill' });
        const r = start({ prompt: longPrompt, max_tokens: 4, temperature: 0 }, stream);
        await phaseOf('running');
        await sleep(100);
        r.ctl.abort();
        const ms = await freedWithin('prefill', d0, 1000);
        t.diagnostic(`prefill ${how}: freed ${ms} ms after the abort`);
        await r.done;
    });

    test(`decode (${how}): a client gone while decoding frees the slot within 1 s`, T, async (t) => {
        const d0 = mval(await scrape(srv), 'tandem_client_disconnects_total', { phase: 'decode' });
        const r = start({ prompt: [5, 6, 7], max_tokens: 900, temperature: 0, ignore_eos: true }, stream);
        await phaseOf('running');
        await sleep(300);
        r.ctl.abort();
        const ms = await freedWithin('decode', d0, 1000);
        t.diagnostic(`decode ${how}: freed ${ms} ms after the abort`);
        await r.done;
    });

    test(`queued (${how}): a client gone while waiting for a slot leaves the queue within 1 s`, T, async (t) => {
        const busy = start({ prompt: [5, 6, 7], max_tokens: 300, temperature: 0, ignore_eos: true }, false);
        await phaseOf('running');
        const q0 = mval(await scrape(srv), 'tandem_client_disconnects_total', { phase: 'queued' });
        const r = start({ prompt: [8, 9], max_tokens: 8, temperature: 0 }, stream);
        await phaseOf('queued');
        r.ctl.abort();
        const t0 = Date.now();
        await waitFor(async () => {
            const m = await scrape(srv);
            return mval(m, 'tandem_client_disconnects_total', { phase: 'queued' }) >= q0 + 1 &&
                mval(m, 'tandem_requests_waiting') === 0;
        }, { timeoutMs: 1000, intervalMs: 10, what: 'disconnect{phase="queued"} within 1 s' });
        t.diagnostic(`queued ${how}: left the queue ${Date.now() - t0} ms after the abort`);
        busy.ctl.abort();
        await busy.done;
        await r.done;
        await freedWithin('decode', mval(await scrape(srv), 'tandem_client_disconnects_total', { phase: 'decode' }) - 1, 2000);
    });
}
