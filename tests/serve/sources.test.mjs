// tests/serve/sources.test.mjs: Tandem's "tandem" field of a streamed choice (where each token
// came from) and the request's "draft" field. A DSpark server streams greedy replies; in every
// chunk the sources number the chunk's token_ids, each source is 0 (the target's own) or the
// draft position j that follows j - 1, and the pieces join to the delta's text. Over the
// stream the marked tokens equal usage's num_accepted_draft_tokens, also when a stop string
// cuts the output (the accepted drafts after the cut leave the count). "draft": "none" verifies
// no draft and gives the same text; a drafter this server does not run is a 400 naming it.
//
//   node --test tests/serve/sources.test.mjs

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, raw, sseChunks, postJSON } from './harness.mjs';

let srv;
const MSG = [{ role: 'user', content: 'Tell me about the old king and his three sons.' }];

before(async () => {
    srv = await startServer(['--draft', 'dspark', '--draft-policy', 'fixed', '--set', 'metrics.per_request=summary']);
}, { timeout: 60000 });

after(async () => {
    if (srv) assert.equal(await srv.stop(), 0);
}, { timeout: 30000 });

async function stream(body) {
    const r = await raw(srv.url, {
        method: 'POST',
        path: '/v1/chat/completions',
        body: { model: srv.model, messages: MSG, temperature: 0, stream: true, return_token_ids: true,
                stream_options: { include_usage: true }, ...body },
    });
    assert.equal(r.status, 200, r.text);
    const { chunks, done, problems } = sseChunks(r.text);
    assert.deepEqual(problems, []);
    assert.ok(done, 'no [DONE]');
    return chunks;
}

/* every chunk's "tandem" against its own fields; the whole stream's text, ids, sources, usage */
function check(chunks) {
    let text = '', ids = [], src = [], usage = null;
    for (const c of chunks) {
        if (c.usage) usage = c.usage;
        for (const ch of c.choices) {
            const tx = ch.tandem;
            assert.ok(tx && Array.isArray(tx.sources), `a choice without tandem.sources: ${JSON.stringify(ch)}`);
            assert.equal(tx.sources.length, ch.token_ids.length, 'sources and token_ids differ in number');
            const content = ch.delta.content ?? '';
            const joined = (tx.content || []).map(([t]) => t).join('');
            assert.equal(joined, content, 'the pieces do not join to the delta');
            for (const [t, s] of tx.content || []) {
                assert.ok(t.length > 0, 'an empty piece');
                assert.ok(Number.isInteger(s) && s >= 0, `piece source ${s}`);
            }
            text += content;
            ids.push(...ch.token_ids);
            src.push(...tx.sources);
        }
    }
    src.forEach((s, i) => {
        assert.ok(s === 0 || (i > 0 && s === src[i - 1] + 1), `token ${i}: source ${s} after ${src[i - 1]}`);
    });
    return { text, ids, src, usage, marked: src.filter((s) => s > 0).length };
}

test('stream: sources per token, pieces join to the text, marked tokens = accepted drafts', { timeout: 60000 }, async () => {
    const r = check(await stream({ max_tokens: 80 }));
    const sd = r.usage.metrics.speculative_decoding;
    assert.equal(r.src.length, r.usage.completion_tokens);
    assert.ok(r.marked > 0, 'no accepted drafts: the test has no power');
    assert.equal(r.marked, sd.num_accepted_draft_tokens);
    assert.equal(r.src[0], 0, 'the first token is the prompt\'s, the target\'s own');
    // the same request through the openai client: it ignores the extra field
    const ref = await client(srv).chat.completions.create({ model: srv.model, messages: MSG, temperature: 0, max_tokens: 80 });
    assert.equal(r.text, ref.choices[0].message.content);
});

test('stream with a stop string: the drafts after the cut leave the count', { timeout: 60000 }, async () => {
    const full = check(await stream({ max_tokens: 80 }));
    // a stop string late in the text, so that marked tokens were emitted after it
    const words = full.text.split(' ');
    let stop = null;
    for (let w = Math.floor(words.length / 2); w < words.length - 3 && !stop; w++) {
        const s = ' ' + words[w] + ' ' + words[w + 1];
        if (words[w].length > 2 && full.text.indexOf(s) === full.text.lastIndexOf(s)) stop = s;
    }
    assert.ok(stop, `no unique stop string in ${JSON.stringify(full.text)}`);
    const r = check(await stream({ max_tokens: 80, stop: [stop] }));
    assert.equal(r.text, full.text.slice(0, full.text.indexOf(stop)));
    assert.equal(r.marked, r.usage.metrics.speculative_decoding.num_accepted_draft_tokens);
    assert.ok(r.usage.completion_tokens < full.usage.completion_tokens);
});

test('"draft": "none" verifies no drafts and gives the same text; "auto" and "dspark" speculate', { timeout: 60000 }, async () => {
    const base = { model: srv.model, messages: MSG, temperature: 0, max_tokens: 60 };
    const runs = {};
    for (const d of ['none', 'auto', 'dspark']) {
        const r = await postJSON(srv.url, '/v1/chat/completions', { ...base, draft: d });
        assert.equal(r.status, 200, r.text);
        runs[d] = r.json;
    }
    assert.equal(runs.none.usage.metrics.speculative_decoding.num_draft_tokens, 0);
    assert.ok(runs.auto.usage.metrics.speculative_decoding.num_draft_tokens > 0);
    for (const d of ['auto', 'dspark'])
        assert.equal(runs[d].choices[0].message.content, runs.none.choices[0].message.content, d);
    const s = check(await stream({ max_tokens: 60, draft: 'none' }));
    assert.equal(s.marked, 0);
    assert.equal(s.text, runs.none.choices[0].message.content);
});

test('"draft" naming a drafter this server does not run, or not a string: 400', { timeout: 30000 }, async () => {
    for (const [d, want] of [['mtp', /drafts with dspark/], ['ngram', /one of: none, auto, dspark/], [3, /must be a string/]]) {
        const r = await postJSON(srv.url, '/v1/chat/completions', { model: srv.model, messages: MSG, draft: d });
        assert.equal(r.status, 400, r.text);
        assert.equal(r.json.error.param, 'draft');
        assert.match(r.json.error.message, want);
    }
    const p = (await raw(srv.url, { path: '/props' })).json();
    assert.deepEqual(p.drafters, ['none', 'auto', 'dspark']);
    assert.equal(p.web_ui, true);
});
