// tests/serve/disconnect.test.mjs: a client that goes away frees its slot. Mid-stream (decode):
// within 1 s tandem_requests_running is back to 0 and tandem_client_disconnects_total{phase=
// "decode"} is one more, generation stops, and the next request runs; other streams keep their
// exact output. Non-streamed and queued requests are noticed too (within sse_ping_s + 1 s).
//
//   node --test tests/serve/disconnect.test.mjs

import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import {
    serverForFile, client, solo, detokenize, tokenize, collect, scrape, mval, waitFor, sleep,
} from './harness.mjs';

let srv, prompt;
const PING_S = 1;

// two running slots so that a third request queues; pings every second
serverForFile(['--draft', 'none', '--set', 'scheduler.max_running=2', '--set', `server.sse_ping_s=${PING_S}`], 'The ship sailed out of the harbour and', (s, p) => ([srv, prompt] = [s, p]));

const T = { timeout: 30000 };
const long = () => ({ model: srv.model, prompt, max_tokens: 900, temperature: 0, ignore_eos: true });

async function idle(what, ms = 5000) {
    await waitFor(async () => {
        const m = await scrape(srv);
        return mval(m, 'tandem_requests_running') === 0 && mval(m, 'tandem_requests_waiting') === 0;
    }, { timeoutMs: ms, what });
}

/* Start a long SDK stream and abort it after `after` chunks; resolves with the abort time. */
async function abortAfter(after, body = long()) {
    const ctl = new AbortController();
    const st = await client(srv).completions.create({ ...body, stream: true }, { signal: ctl.signal });
    let n = 0;
    try {
        for await (const c of st) {
            if (c.choices?.length && ++n >= after) {
                ctl.abort();
                break;
            }
        }
    } catch (e) {
        if (!ctl.signal.aborted) throw e;
    }
    return Date.now();
}

test('a disconnect mid-stream frees the slot within 1 s; the next request runs', T, async () => {
    await idle('idle before');
    const m0 = await scrape(srv);
    const d0 = mval(m0, 'tandem_client_disconnects_total', { phase: 'decode' });
    const t = await abortAfter(3);
    const seen = await waitFor(async () => {
        const m = await scrape(srv);
        return mval(m, 'tandem_requests_running') === 0 &&
            mval(m, 'tandem_client_disconnects_total', { phase: 'decode' }) === d0 + 1 && m;
    }, { timeoutMs: 1000, intervalMs: 25, what: 'running 0 and disconnects{phase="decode"} +1 within 1 s of the abort' });
    assert.ok(Date.now() - t <= 1500);
    assert.equal(mval(seen, 'tandem_slots_busy'), 0, 'tandem_slots_busy back to 0');
    // generation stopped: the token counter holds still
    const g1 = mval(seen, 'tandem_generation_tokens_total');
    await sleep(300);
    assert.equal(mval(await scrape(srv), 'tandem_generation_tokens_total'), g1, 'no tokens generated after the disconnect');
    // the next request runs and is right
    const ref = await solo(prompt, { maxTokens: 8 });
    const r = await client(srv).completions.create({ model: srv.model, prompt, max_tokens: 8, temperature: 0 });
    assert.equal(r.choices[0].text, await detokenize(ref));
});

test('a disconnect does not disturb another stream (exact output)', T, async () => {
    await idle('idle before');
    const other = [...prompt, 777];
    const ref = await solo(other, { maxTokens: 48 });
    const sdk = client(srv);
    const bystander = (async () => {
        const st = await sdk.completions.create({ model: srv.model, prompt: other, max_tokens: 48, temperature: 0, stream: true, stream_options: { include_usage: true } });
        const chunks = [];
        for await (const c of st) chunks.push(c);
        return collect(chunks);
    })();
    await sleep(50);
    await abortAfter(2);
    const got = await bystander;
    assert.equal(got.text[0], await detokenize(ref));
    assert.equal(got.usage.completion_tokens, ref.length);
    await idle('idle after', 2000);
});

test('a dropped non-streamed request is noticed (within sse_ping_s + 1 s)', T, async () => {
    await idle('idle before');
    const m0 = await scrape(srv);
    const d0 = mval(m0, 'tandem_client_disconnects_total');
    const body = JSON.stringify(long());
    const u = new URL(srv.url);
    const req = http.request({ host: u.hostname, port: u.port, path: '/v1/completions', method: 'POST', agent: false,
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } });
    req.on('error', () => {});
    req.end(body);
    await waitFor(async () => mval(await scrape(srv), 'tandem_requests_running') === 1, { timeoutMs: 5000, what: 'the request runs' });
    await sleep(200);
    req.destroy();
    const t = Date.now();
    await waitFor(async () => {
        const m = await scrape(srv);
        return mval(m, 'tandem_requests_running') === 0 && mval(m, 'tandem_client_disconnects_total') === d0 + 1;
    }, { timeoutMs: (PING_S + 1) * 1000, intervalMs: 25, what: 'non-streamed disconnect noticed' });
    assert.ok(Date.now() - t <= (PING_S + 1) * 1000 + 500);
});

test('a queued request whose client goes away leaves the queue', T, async () => {
    await idle('idle before');
    const m0 = await scrape(srv);
    const q0 = mval(m0, 'tandem_client_disconnects_total', { phase: 'queued' });
    // fill both slots, then queue a third
    const ctls = [new AbortController(), new AbortController()];
    const sdk = client(srv);
    const runs = ctls.map((c) => sdk.completions.create({ ...long(), stream: true }, { signal: c.signal }).then(async (st) => {
        try { for await (const _ of st); } catch {}
    }).catch(() => {}));
    await waitFor(async () => mval(await scrape(srv), 'tandem_requests_running') === 2, { timeoutMs: 5000, what: 'two running' });
    const qctl = new AbortController();
    const queued = sdk.completions.create({ ...long(), stream: true }, { signal: qctl.signal }).then(async (st) => {
        try { for await (const _ of st); } catch {}
    }).catch(() => {});
    await waitFor(async () => mval(await scrape(srv), 'tandem_requests_waiting') === 1, { timeoutMs: 5000, what: 'one waiting' });
    qctl.abort();
    try {
        await waitFor(async () => {
            const m = await scrape(srv);
            return mval(m, 'tandem_requests_waiting') === 0 &&
                mval(m, 'tandem_client_disconnects_total', { phase: 'queued' }) === q0 + 1 &&
                mval(m, 'tandem_requests_running') === 2;
        }, { timeoutMs: (PING_S + 1) * 1000, intervalMs: 25, what: 'waiting 0, disconnects{phase="queued"} +1, the two still running' });
    } finally {
        for (const c of ctls) c.abort();
        await Promise.all([...runs, queued]);
    }
    await idle('idle after', 3000);
});
