// tests/serve/overload.test.mjs: a full waiting queue answers 429 rate_limit_error with
// Retry-After, which the openai SDK obeys (maxRetries 2: three attempts, Retry-After apart, then
// RateLimitError; or success once the queue drains); SIGTERM drains: a running stream finishes,
// new requests get 503 or a refused connection, and the process exits 0.
//
//   node --test tests/serve/overload.test.mjs

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RateLimitError } from 'openai';
import {
    serverForFile, startServer, client, solo, detokenize, tokenize, collect, scrape, mval, waitFor, sleep, raw, rawStream, sseChunks,
} from './harness.mjs';

let srv, prompt;

serverForFile(['--draft', 'none', '--set', 'limits.max_waiting=1', '--set', 'scheduler.max_running=1'], 'The wind blew over the hills and', (s, p) => ([srv, prompt] = [s, p]));

const T = { timeout: 60000 };
const body = (max_tokens, extra = {}) => ({ model: srv.model, prompt, max_tokens, temperature: 0, ignore_eos: true, ...extra });

/* Occupy the one running slot and the one waiting place with long streams; resolves with a
 * function that aborts both and waits until the server is idle again. */
async function fill(maxTokens = 900) {
    const sdk = client(srv);
    const ctls = [];
    const runs = [];
    for (const want of ['running', 'waiting']) {
        const ctl = new AbortController();
        ctls.push(ctl);
        runs.push(
            sdk.completions.create(body(maxTokens, { stream: true }), { signal: ctl.signal })
                .then(async (st) => {
                    try { for await (const _ of st); } catch {}
                })
                .catch(() => {})
        );
        await waitFor(async () => mval(await scrape(srv), `tandem_requests_${want}`) === 1, { timeoutMs: 5000, what: `one ${want}` });
    }
    return async () => {
        for (const c of ctls) c.abort();
        await Promise.all(runs);
        await waitFor(async () => {
            const m = await scrape(srv);
            return mval(m, 'tandem_requests_running') === 0 && mval(m, 'tandem_requests_waiting') === 0;
        }, { timeoutMs: 5000, what: 'idle after the fill' });
    };
}

/* fetch that records every attempt the SDK makes (time, status, Retry-After). */
function recordingFetch(log) {
    return async (url, init) => {
        const t = Date.now();
        const r = await fetch(url, init);
        log.push({ t, status: r.status, retryAfter: r.headers.get('retry-after'), retryCount: init?.headers?.['x-stainless-retry-count'] });
        return r;
    };
}

test('429 rate_limit_error + Retry-After when the waiting queue is full', T, async () => {
    const release = await fill();
    try {
        const r = await raw(srv.url, { method: 'POST', path: '/v1/completions', body: body(4) });
        assert.equal(r.status, 429);
        assert.match(r.headers['content-type'] ?? '', /^application\/json/);
        assert.ok(r.headers['x-request-id'], 'x-request-id');
        const ra = r.headers['retry-after'];
        assert.ok(ra !== undefined, 'Retry-After header');
        assert.ok(/^\d+$/.test(ra) || !Number.isNaN(Date.parse(ra)), `Retry-After ${ra}: seconds or an HTTP date`);
        const e = r.json().error;
        assert.equal(e.type, 'rate_limit_error');
        assert.equal(typeof e.message, 'string');
        // chat is admitted through the same queue
        const c = await raw(srv.url, { method: 'POST', path: '/v1/chat/completions', body: { model: srv.model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 } });
        assert.equal(c.status, 429, 'chat too');
        // the health endpoints still answer
        assert.equal((await raw(srv.url, { path: '/livez' })).status, 200);
        const m = await scrape(srv);
        assert.equal(mval(m, 'tandem_requests_waiting'), 1, 'the rejected requests were not queued');
    } finally {
        await release();
    }
});

test('the SDK retries a 429 twice, Retry-After apart, then raises RateLimitError', T, async (t) => {
    const release = await fill();
    try {
        const probe = await raw(srv.url, { method: 'POST', path: '/v1/completions', body: body(4) });
        assert.equal(probe.status, 429);
        const ra = Number(probe.headers['retry-after']);
        if (!(ra >= 0 && ra <= 10)) return t.skip(`Retry-After ${probe.headers['retry-after']}: too long to wait for here`);
        const log = [];
        const sdk = client(srv, { maxRetries: 2, fetch: recordingFetch(log) });
        const t0 = Date.now();
        await assert.rejects(sdk.completions.create(body(4)), (e) => {
            assert.ok(e instanceof RateLimitError, `RateLimitError, got ${e?.constructor?.name}: ${e?.message}`);
            assert.equal(e.status, 429);
            assert.equal(e.type, 'rate_limit_error');
            return true;
        });
        const took = Date.now() - t0;
        assert.equal(log.length, 3, `three attempts (1 + maxRetries 2), saw ${log.length}`);
        assert.deepEqual(log.map((a) => a.status), [429, 429, 429]);
        for (let i = 1; i < log.length; i++) {
            const gap = log[i].t - log[i - 1].t;
            assert.ok(gap >= ra * 1000 - 50, `attempt ${i} came ${gap} ms after the previous one; Retry-After ${ra} s`);
            assert.ok(gap <= ra * 1000 + 1500, `attempt ${i} came ${gap} ms after the previous one; Retry-After ${ra} s`);
        }
        assert.ok(took >= 2 * ra * 1000 - 100, `RateLimitError after ${took} ms`);
    } finally {
        await release();
    }
});

test('an SDK retry succeeds once the queue has room', T, async () => {
    // a short running request and a short waiting one: the queue frees within a second or so
    const ref = await solo(prompt, { maxTokens: 6 });
    const sdk = client(srv);
    const first = sdk.completions.create(body(60));
    await waitFor(async () => mval(await scrape(srv), 'tandem_requests_running') === 1, { timeoutMs: 5000, what: 'one running' });
    const second = sdk.completions.create(body(5));
    await waitFor(async () => mval(await scrape(srv), 'tandem_requests_waiting') === 1, { timeoutMs: 5000, what: 'one waiting' });
    const log = [];
    const retrying = client(srv, { maxRetries: 2, fetch: recordingFetch(log) });
    const r = await retrying.completions.create({ model: srv.model, prompt, max_tokens: 6, temperature: 0 });
    assert.equal(r.choices[0].text, await detokenize(ref));
    assert.ok(log.length >= 2, `at least one retry (attempts: ${JSON.stringify(log.map((a) => a.status))})`);
    assert.equal(log[0].status, 429);
    assert.equal(log[log.length - 1].status, 200);
    await Promise.all([first, second]);
});

test('/readyz is 503 while the waiting queue is full, 200 after', T, async () => {
    const release = await fill();
    try {
        const r = await raw(srv.url, { path: '/readyz' });
        assert.equal(r.status, 503);
        assert.equal((await raw(srv.url, { path: '/livez' })).status, 200, '/livez stays 200');
    } finally {
        await release();
    }
    assert.equal((await raw(srv.url, { path: '/readyz' })).status, 200);
});

test('SIGTERM drains: the running stream finishes, new requests are refused or 503, exit 0', T, async () => {
    const d = await startServer(['--draft', 'none', '--set', 'server.drain_s=30']);
    let code;
    try {
        const N = 120;
        const ref = await solo(prompt, { maxTokens: N, ignoreEos: true });
        let got = 0;
        let signalled = null;
        const s = await rawStream(d.url, '/v1/completions', { model: d.model, prompt, max_tokens: N, temperature: 0, ignore_eos: true, stream: true }, {
            onData: () => {
                if (++got === 2 && !signalled) signalled = (d.proc.kill('SIGTERM'), Date.now());
            },
        });
        assert.equal(s.status, 200);
        await waitFor(() => signalled, { timeoutMs: 10000, what: 'two pieces of the stream, then SIGTERM' });
        await sleep(100);
        // new work is turned away while the stream drains
        for (const q of [
            { method: 'POST', path: '/v1/completions', body: { model: d.model, prompt, max_tokens: 2 } },
            { path: '/readyz' },
        ]) {
            try {
                const r = await raw(d.url, { ...q, timeoutMs: 5000 });
                assert.equal(r.status, 503, `${q.path} while draining: ${r.status} ${r.text.slice(0, 200)}`);
                if (q.method === 'POST') assert.equal(r.json().error.type, 'unavailable_error');
            } catch (e) {
                assert.ok(['ECONNREFUSED', 'ECONNRESET', 'EPIPE'].includes(e.code) || /socket hang up/.test(e.message), `${q.path} while draining: ${e.message}`);
            }
        }
        const text = (await s.done).toString('utf8');
        const { chunks, done, problems } = sseChunks(text);
        assert.deepEqual(problems, []);
        assert.ok(done, 'the draining stream ends with [DONE]');
        const c = collect(chunks);
        assert.equal(c.text[0], await detokenize(ref), 'the draining stream is complete and right');
        assert.equal(c.finish[0], 'length');
        const { code: exitCode } = await Promise.race([d.exited, sleep(30000).then(() => ({ code: 'timeout' }))]);
        code = exitCode;
        assert.equal(code, 0, `exit code after SIGTERM (stderr: ${d.stderr().slice(-500)})`);
    } finally {
        if (code === undefined) await d.stop('SIGKILL').catch(() => {});
    }
});
