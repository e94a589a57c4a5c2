// tests/serve/loading.test.mjs: while the model loads the server is live but not ready: /livez
// answers 200, /health and /readyz 503 {"status":"loading"}, and every other request 503
// unavailable_error with Retry-After (the SDK retries it); then it serves. A model that cannot
// load ends the process with exit 1 and the reason. (TANDEM_TEST_LOAD_DELAY_MS, a test seam,
// makes the tiny model's load slow enough to watch.)
//
//   node --test tests/serve/loading.test.mjs

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { TANDEM, ROOT, MODEL, waitFor } from './harness.mjs';

function launch(args, env = {}) {
    const p = spawn(TANDEM, ['serve', '--port', '0', '--set', 'log.level=warn', ...args],
        { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    p.stderr.on('data', (d) => { err += d; });
    const exited = new Promise((r) => p.on('exit', (code) => r(code)));
    return { p, stderr: () => err, exited };
}

const modelArgs = MODEL ? ['--model', MODEL] : [];

test('loading: live, not ready, requests get 503 loading; then it serves', { timeout: 60000 }, async () => {
    const s = launch(['--draft', 'none', ...modelArgs], { TANDEM_TEST_LOAD_DELAY_MS: '2500' });
    try {
        let url;
        await waitFor(async () => {
            const m = s.stderr().match(/^tandem: loading \S+, listening on (http:\/\/\S+) /m);
            return m && (url = m[1]);
        }, { timeoutMs: 20000, intervalMs: 20, what: 'the loading line' });
        assert.ok(!/tandem: serving/.test(s.stderr()), 'ready before the load finished');
        assert.equal((await fetch(`${url}/livez`)).status, 200);
        for (const p of ['/health', '/readyz']) {
            const r = await fetch(url + p);
            assert.equal(r.status, 503, p);
            assert.deepEqual(await r.json(), { status: 'loading' });
        }
        const r = await fetch(`${url}/v1/completions`, {
            method: 'POST', headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ prompt: [5, 6], max_tokens: 2 }),
        });
        assert.equal(r.status, 503);
        assert.equal(r.headers.get('retry-after'), '1');
        const e = await r.json();
        assert.equal(e.error.type, 'unavailable_error');
        assert.equal(e.error.code, 'loading');
        await waitFor(async () => /tandem: serving/.test(s.stderr()), { timeoutMs: 30000, what: 'the ready line' });
        assert.equal((await fetch(`${url}/readyz`)).status, 200);
        const ok = await fetch(`${url}/v1/completions`, {
            method: 'POST', headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ prompt: [5, 6], max_tokens: 2, temperature: 0 }),
        });
        assert.equal(ok.status, 200);
        s.p.kill('SIGTERM');
        assert.equal(await s.exited, 0);
    } finally {
        s.p.kill('SIGKILL');
    }
});

test('a model that cannot load: exit 1 with the reason', { timeout: 30000 }, async () => {
    const s = launch(['--model', '/nonexistent-model-dir']);
    assert.equal(await s.exited, 1);
    assert.match(s.stderr(), /nonexistent-model-dir.*tokenizer\.json|config\.json/);
});
