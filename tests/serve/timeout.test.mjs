// tests/serve/timeout.test.mjs: server.request_timeout_s ends a request that runs too long with a
// clear error (an error event in its stream, 504 when not streamed), frees its slot, and counts
// it as a timeout; requests within the limit are untouched.
//
//   node --test tests/serve/timeout.test.mjs

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, scrape, mval, waitFor } from './harness.mjs';

let srv;

before(async () => {
    srv = await startServer(['--draft', 'none', '--set', 'server.request_timeout_s=1']);
}, { timeout: 90000 });

after(async () => {
    if (srv) assert.equal(await srv.stop(), 0);
}, { timeout: 40000 });

const long = { prompt: [5, 6, 7], max_tokens: 900, temperature: 0, ignore_eos: true };
const post = (body) => fetch(`${srv.url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
});

test('streamed: a request past request_timeout_s ends with an error event', { timeout: 30000 }, async () => {
    const t0 = Date.now();
    const r = await post({ ...long, stream: true });
    assert.equal(r.status, 200);
    const text = await r.text();
    const ms = Date.now() - t0;
    const events = text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
    const last = JSON.parse(events[events.length - 1]);
    assert.equal(last.error?.code, 'request_timeout', `last event: ${events[events.length - 1]}`);
    assert.match(last.error.message, /timed out after 1 s/);
    assert.ok(events.length > 1, 'tokens came before the timeout');
    assert.ok(ms >= 900 && ms < 5000, `ended after ${ms} ms`);
});

test('not streamed: 504 with the error object, the slot freed, counted as a timeout', { timeout: 30000 }, async () => {
    const before = mval(await scrape(srv), 'tandem_requests_finished_total', { reason: 'timeout' });
    const r = await post(long);
    assert.equal(r.status, 504);
    const j = await r.json();
    assert.equal(j.error.code, 'request_timeout');
    await waitFor(async () => {
        const m = await scrape(srv);
        return mval(m, 'tandem_requests_finished_total', { reason: 'timeout' }) === before + 1 &&
            mval(m, 'tandem_requests_running') === 0;
    }, { timeoutMs: 2000, what: 'timeout counted and the slot free' });
});

test('a request within the limit is untouched', { timeout: 30000 }, async () => {
    const r = await post({ prompt: [5, 6, 7], max_tokens: 8, temperature: 0, ignore_eos: true });
    assert.equal(r.status, 200);
    const j = await r.json();
    assert.equal(j.choices[0].finish_reason, 'length');
    assert.equal(j.usage.completion_tokens, 8);
});
