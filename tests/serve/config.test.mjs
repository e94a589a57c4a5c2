// tests/serve/config.test.mjs: the INI file. A bad file refuses to start (exit 2) and names
// FILE:LINE for every error; a good one configures the server ([server] served_model_name,
// [sampling] defaults); --set overrides the file.
//
//   node --test tests/serve/config.test.mjs

import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, serveExpectExit, client, tmpdir, tokenize } from './harness.mjs';

const T = { timeout: 30000 };

function ini(name, text) {
    const f = path.join(tmpdir('ini'), name);
    fs.writeFileSync(f, text);
    return f;
}

async function refuses(text, lines, what) {
    const f = ini('bad.ini', text);
    const r = await serveExpectExit(['-c', f]);
    assert.equal(r.ready, false, `${what}: the server must not start`);
    assert.equal(r.code, 2, `${what}: exit code 2 (got ${r.code}, signal ${r.signal}); stderr:\n${r.stderr}`);
    for (const l of lines) assert.ok(r.stderr.includes(`${f}:${l}:`), `${what}: stderr names ${f}:${l}:\n${r.stderr}`);
    return r;
}

test('unknown key: exit 2, FILE:3: in stderr', T, () =>
    refuses('[server]\nhost = 127.0.0.1\nbogus_key = 1\n', [3], 'unknown key'));

test('unknown section: exit 2 with its line', T, () =>
    refuses('[server]\nhost = 127.0.0.1\n\n[nonsense]\nx = 1\n', [4], 'unknown section'));

test('duplicate key: exit 2 with the second line', T, () =>
    refuses('[scheduler]\nmax_running = 4\nmax_running = 8\n', [3], 'duplicate key'));

test('bad values: exit 2 with their lines', T, () =>
    refuses('[server]\nport = notaport\n[sampling]\ntemperature = -3\n', [2, 4], 'bad values'));

test('every error is reported, not only the first', T, () =>
    refuses('; comment\n[server]\nnope = 1\n[limits]\nmax_waiting = many\n[sampling]\nalso_nope = 2\n', [3, 5, 7], 'three errors'));

test('leading whitespace on a key line is an error', T, () =>
    refuses('[server]\nhost = 127.0.0.1\n  port = 0\n', [3], 'indented line'));

test('a missing -c file refuses to start', T, async () => {
    const r = await serveExpectExit(['-c', path.join(tmpdir('ini'), 'absent.ini')]);
    assert.equal(r.ready, false);
    assert.notEqual(r.code, 0, `exit code ${r.code}`);
    assert.ok(r.stderr.length > 0, 'a message');
});

test('a good INI configures the server; --set overrides it', { timeout: 60000 }, async () => {
    const f = ini(
        'good.ini',
        '; tandem serve test configuration\n[server]\nserved_model_name = tiny-from-ini\nstrict_model = off\n\n' +
            '[sampling]\ntemperature = 0\nmax_tokens = 5\ncompletion_max_tokens = 7\n\n[limits]\nmax_n = 2\n'
    );
    const s = await startServer(['-c', f]);
    try {
        assert.equal(s.model, 'tiny-from-ini', 'the ready line names served_model_name');
        const sdk = client(s);
        const list = await sdk.models.list();
        assert.equal(list.data[0].id, 'tiny-from-ini');
        const prompt = await tokenize('The cat sat');
        const chat = await sdk.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Hello' }], ignore_eos: true });
        assert.equal(chat.usage.completion_tokens, 5, '[sampling] max_tokens is the chat default');
        const comp = await sdk.completions.create({ model: 'x', prompt, ignore_eos: true });
        assert.equal(comp.usage.completion_tokens, 7, '[sampling] completion_max_tokens is the completions default');
        const r = await fetch(`${s.baseURL}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt, n: 3, max_tokens: 2 }) });
        assert.equal(r.status, 400, '[limits] max_n = 2 rejects n = 3');
    } finally {
        assert.equal(await s.stop(), 0);
    }
    const o = await startServer(['-c', f, '--set', 'server.served_model_name=tiny-from-set']);
    try {
        assert.equal(o.model, 'tiny-from-set', '--set beats the file');
    } finally {
        assert.equal(await o.stop(), 0);
    }
});
