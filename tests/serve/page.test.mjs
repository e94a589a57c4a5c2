// tests/serve/page.test.mjs: the chat page at / in a real browser. Debian's chromium, headless,
// driven over the DevTools protocol by puppeteer-core (pinned in package-lock.json; it downloads
// no browser). A tandem-tiny server with DSpark serves the page; the page streams a greedy reply
// whose text must equal the API's for the same messages, with its accepted drafts marked and as
// many as the response's statistics count; regenerate gives the same reply; stop ends a long reply
// mid-stream and frees the server's slot; the screenshot is a non-blank PNG of the page's size.
// A server without a drafter serves the page too, which says so and marks nothing.
//
//   node --test tests/serve/page.test.mjs        (TD_CHROMIUM: the browser, default /usr/bin/chromium)
//   TD_SCREENSHOT=FILE: also save the DSpark reply's screenshot there (the README's)

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { startServer, serveExpectExit, raw, postJSON, tmpdir, waitFor, v4Model, IS_TINY } from './harness.mjs';

const CHROMIUM = process.env.TD_CHROMIUM || '/usr/bin/chromium';
const HAVE = fs.existsSync(CHROMIUM);
const VIEW = { width: 1200, height: 800 };
const PROMPT = 'Tell me about the old king and his three sons.';
const MAXT = 48;

let puppeteer, browser, srv, plain;

before(async () => {
    if (!HAVE) return;
    puppeteer = (await import('puppeteer-core')).default;
    [srv, plain] = await Promise.all([
        startServer(['--draft', 'dspark', '--draft-policy', 'fixed', '--set', 'metrics.per_request=summary']),
        startServer(['--draft', 'none']),
    ]);
    browser = await puppeteer.launch({
        executablePath: CHROMIUM,
        headless: true,
        // root in CI containers: no user namespaces for the sandbox
        args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', `--window-size=${VIEW.width},${VIEW.height}`],
    });
}, { timeout: 90000 });

after(async () => {
    if (browser) await browser.close();
    for (const s of [srv, plain]) if (s) assert.equal(await s.stop(), 0);
}, { timeout: 30000 });

const skip = HAVE ? false : `no browser at ${CHROMIUM} (set TD_CHROMIUM)`;

async function open(server) {
    const page = await browser.newPage();
    await page.setViewport(VIEW);
    const errors = [];
    page.on('pageerror', (e) => errors.push(String(e)));
    page.on('console', (m) => m.type() === 'error' && errors.push(m.text()));
    await page.goto(server.url + '/', { waitUntil: 'load' });
    await page.waitForSelector('#status-dot.ok', { timeout: 10000 });
    // a fresh conversation (localStorage is the profile's)
    await page.click('#new');
    return { page, errors };
}

async function setField(page, sel, value) {
    await page.$eval(sel, (el, v) => {
        el.value = v;
        el.dispatchEvent(new Event('change'));
    }, String(value));
}

async function ask(page, text) {
    await page.type('#prompt', text);
    await page.click('#send');
}

/* the last assistant message once it is in state `state` */
async function lastReply(page, state, timeout = 30000) {
    await page.waitForFunction(
        (st) => {
            const m = [...document.querySelectorAll('.msg.assistant')].pop();
            return m && m.dataset.state === st;
        },
        { timeout },
        state,
    );
    return page.evaluate(() => {
        const m = [...document.querySelectorAll('.msg.assistant')].pop();
        const toks = [...m.querySelectorAll('.content .t')];
        return {
            text: m.querySelector('.content').textContent,
            marked: toks.filter((t) => t.dataset.src !== '0').length,
            coloured: toks.filter((t) => t.dataset.src !== '0' && t.style.background).length,
            positions: [...new Set(toks.map((t) => Number(t.dataset.src)))].sort((a, b) => a - b),
            accepted: document.querySelector('#r-accepted').textContent,
            tokens: Number(document.querySelector('#r-tokens').textContent),
            mean: document.querySelector('#r-mean').textContent,
            server: document.querySelector('#r-server').textContent,
            bars: JSON.parse(document.querySelector('#r-bars').dataset.values || '[]'),
        };
    });
}

/* a PNG's size and whether its pixels are more than one colour (8-bit RGB(A), non-interlaced) */
function pngInfo(buf) {
    assert.equal(buf.subarray(0, 8).toString('hex'), '89504e470d0a1a0a', 'not a PNG');
    let off = 8, w = 0, h = 0, type = 0;
    const idat = [];
    while (off < buf.length) {
        const len = buf.readUInt32BE(off), kind = buf.toString('latin1', off + 4, off + 8);
        const data = buf.subarray(off + 8, off + 8 + len);
        if (kind === 'IHDR') {
            w = data.readUInt32BE(0), h = data.readUInt32BE(4), type = data[9];
            assert.equal(data[8], 8, 'not 8 bits a channel');
            assert.equal(data[12], 0, 'interlaced');
        }
        if (kind === 'IDAT') idat.push(data);
        off += 12 + len;
    }
    const bpp = type === 6 ? 4 : type === 2 ? 3 : 0;
    assert.ok(bpp, `PNG colour type ${type}`);
    const raw = zlib.inflateSync(Buffer.concat(idat)), stride = w * bpp;
    const img = Buffer.alloc(h * stride);
    for (let y = 0; y < h; y++) { // undo the per-row filters
        const f = raw[y * (stride + 1)], row = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
        for (let x = 0; x < stride; x++) {
            const a = x >= bpp ? img[y * stride + x - bpp] : 0, b = y ? img[(y - 1) * stride + x] : 0;
            const c = x >= bpp && y ? img[(y - 1) * stride + x - bpp] : 0;
            let p = row[x];
            if (f === 1) p += a;
            else if (f === 2) p += b;
            else if (f === 3) p += (a + b) >> 1;
            else if (f === 4) {
                const q = a + b - c, pa = Math.abs(q - a), pb = Math.abs(q - b), pc = Math.abs(q - c);
                p += pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
            }
            img[y * stride + x] = p & 255;
        }
    }
    const colours = new Set();
    for (let i = 0; i < img.length && colours.size < 64; i += bpp) colours.add(img.readUIntBE(i, 3));
    return { width: w, height: h, colours: colours.size };
}

test('the page streams a DSpark reply: the API\'s text, accepted drafts marked and counted', { skip, timeout: 120000 }, async () => {
    const { page, errors } = await open(srv);
    const props = (await raw(srv.url, { path: '/props' })).json();
    assert.equal(await page.$eval('#model', (e) => e.textContent), props.model);
    await setField(page, '#temperature', 0);
    await setField(page, '#max_tokens', MAXT);
    await ask(page, PROMPT);
    const got = await lastReply(page, 'done');
    const api = await postJSON(srv.url, '/v1/chat/completions', {
        model: srv.model, messages: [{ role: 'user', content: PROMPT }], temperature: 0, max_tokens: MAXT,
    });
    assert.equal(api.status, 200, api.text);
    const sd = api.json.usage.metrics.speculative_decoding;
    assert.equal(got.text, api.json.choices[0].message.content);
    assert.equal(api.json.choices[0].finish_reason, 'length'); // no EOS: every token has text
    assert.ok(sd.num_accepted_draft_tokens > 0, 'no accepted drafts: the test has no power');
    assert.equal(got.marked, sd.num_accepted_draft_tokens, 'marked tokens against the API\'s accepted drafts');
    assert.equal(got.coloured, got.marked, 'a marked token without its colour');
    assert.equal(Number(got.accepted), sd.num_accepted_draft_tokens);
    assert.equal(got.tokens, api.json.usage.completion_tokens);
    assert.equal(got.mean, sd.mean_acceptance_length.toFixed(2));
    assert.equal(got.server, `${sd.num_accepted_draft_tokens} · ${sd.mean_acceptance_length.toFixed(2)}`);
    assert.equal(got.bars.length, props.draft_tokens);
    assert.ok(got.positions.length > 2, `tokens from positions ${got.positions} only`);
    // the screenshot, as a person sees the reply
    const file = path.join(tmpdir('page'), 'dspark.png');
    await page.screenshot({ path: file });
    if (process.env.TD_SCREENSHOT) fs.copyFileSync(file, process.env.TD_SCREENSHOT);
    const png = pngInfo(fs.readFileSync(file));
    assert.equal(png.width, VIEW.width);
    assert.equal(png.height, VIEW.height);
    assert.ok(png.colours > 8, `the screenshot has ${png.colours} colours: blank`);
    // regenerate: greedy, so the same reply again
    await page.click('#regen');
    const again = await lastReply(page, 'done');
    assert.equal(again.text, got.text);
    assert.equal(again.marked, got.marked);
    assert.equal(await page.$$eval('.msg.assistant', (a) => a.length), 1, 'regenerate kept the old reply');
    assert.deepEqual(errors, []);
    await page.close();
});

test('stop ends a long reply mid-stream and the server lets it go', { skip, timeout: 120000 }, async () => {
    const { page, errors } = await open(srv);
    await setField(page, '#temperature', 0);
    await setField(page, '#max_tokens', 900);
    await ask(page, 'Tell me a very long story about the land.');
    await page.waitForFunction(() => Number(document.querySelector('#r-tokens').textContent) >= 20, { timeout: 30000 });
    await page.click('#stop');
    const got = await lastReply(page, 'stopped');
    assert.ok(got.tokens >= 20 && got.tokens < 900, `${got.tokens} tokens`);
    // nothing more arrives, and the server cancels it: no request running
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(Number(await page.$eval('#r-tokens', (e) => e.textContent)), got.tokens, 'tokens after stop');
    await waitFor(async () => (await raw(srv.url, { path: '/slots' })).json().running === 0, { what: 'the slot freed' });
    assert.ok(await page.$eval('#send', (b) => !b.disabled), 'send stays disabled after stop');
    assert.deepEqual(errors, []);
    await page.close();
});

test('a server without a drafter: the page says so and marks nothing', { skip, timeout: 120000 }, async () => {
    const { page, errors } = await open(plain);
    assert.match(await page.$eval('#drafter-note', (e) => e.textContent), /no drafter/);
    const disabled = await page.$$eval('#draft option', (os) => os.filter((o) => o.disabled).map((o) => o.value));
    assert.deepEqual(disabled.sort(), ['dspark', 'mtp']);
    await setField(page, '#temperature', 0);
    await setField(page, '#max_tokens', 24);
    await ask(page, PROMPT);
    const got = await lastReply(page, 'done');
    assert.ok(got.text.length > 0);
    assert.equal(got.marked, 0);
    assert.equal(got.accepted, 'no drafter');
    assert.deepEqual(errors, []);
    await page.close();
});

test('the page is off when server.web_ui = off', { skip, timeout: 60000 }, async () => {
    const off = await startServer(['--draft', 'none', '--set', 'server.web_ui=off']);
    try {
        const r = await raw(off.url, { path: '/' });
        assert.equal(r.status, 404);
        assert.match(r.json().error.message, /web_ui = off/);
        assert.equal((await raw(off.url, { path: '/props' })).json().web_ui, false);
    } finally {
        assert.equal(await off.stop(), 0);
    }
});

test('server.web_ui_dir: its index.html is the page; a folder without one refuses to start', { timeout: 60000 }, async () => {
    const dir = tmpdir('webui');
    fs.writeFileSync(path.join(dir, 'index.html'), '<!doctype html><title>mine</title>');
    const own = await startServer(['--draft', 'none', '--set', `server.web_ui_dir=${dir}`]);
    try {
        const r = await raw(own.url, { path: '/' });
        assert.equal(r.status, 200);
        assert.match(r.headers['content-type'], /^text\/html/);
        assert.equal(r.text, '<!doctype html><title>mine</title>');
    } finally {
        assert.equal(await own.stop(), 0);
    }
    const empty = tmpdir('webui-empty');
    const bad = await serveExpectExit(['--draft', 'none', '--set', `server.web_ui_dir=${empty}`]);
    assert.ok(!bad.ready && bad.code !== 0, `started: ${bad.stderr}`);
    assert.match(bad.stderr, /server\.web_ui_dir: .*index\.html/);
});

test('a thinking model: the reasoning streams apart, folds, and equals the API\'s', { skip: skip || (!IS_TINY && 'needs models/tandem-tiny'), timeout: 120000 }, async () => {
    // tandem-tiny's V4-vocabulary twin in which "." is </think>: its first sentence is reasoning
    const think = await startServer(['--model', v4Model('.'), '--draft', 'dspark', '--draft-policy', 'fixed', '--set', 'metrics.per_request=summary']);
    try {
        const { page, errors } = await open(think);
        assert.ok(await page.$eval('#think-row', (e) => !e.hidden), 'no thinking switch');
        await setField(page, '#temperature', 0);
        await setField(page, '#max_tokens', MAXT);
        await page.click('#thinking');
        await page.$eval('#thinking', (e) => e.dispatchEvent(new Event('change')));
        await ask(page, PROMPT);
        const got = await lastReply(page, 'done');
        const shown = await page.evaluate(() => {
            const m = [...document.querySelectorAll('.msg.assistant')].pop();
            const d = m.querySelector('details.reasoning');
            return d && { text: d.querySelector('.reasoning-text').textContent, open: d.open,
                          marked: d.querySelectorAll('.t:not([data-src="0"])').length };
        });
        const api = await postJSON(think.url, '/v1/chat/completions', {
            model: think.model, messages: [{ role: 'user', content: PROMPT }], temperature: 0, max_tokens: MAXT,
            thinking: { type: 'enabled' },
        });
        const m = api.json.choices[0].message;
        assert.ok(m.reasoning_content.length > 0 && m.content.length > 0, JSON.stringify(m));
        assert.ok(shown, 'no reasoning block');
        assert.equal(shown.text, m.reasoning_content);
        assert.equal(shown.open, false, 'the reasoning stays unfolded after the reply');
        assert.equal(got.text, m.content);
        const sd = api.json.usage.metrics.speculative_decoding;
        // the drafts the whole reply holds: in the reasoning, in the content, or a "." (</think>)
        assert.ok(shown.marked + got.marked <= sd.num_accepted_draft_tokens);
        assert.equal(Number(got.accepted), sd.num_accepted_draft_tokens);
        await page.click('details.reasoning summary');
        assert.ok(await page.$eval('details.reasoning', (d) => d.open), 'the reasoning does not unfold');
        assert.deepEqual(errors, []);
        await page.close();
    } finally {
        assert.equal(await think.stop(), 0);
    }
});

test('behind an API key: the page asks for it, then chats', { skip, timeout: 120000 }, async () => {
    const dir = tmpdir('webkey');
    fs.writeFileSync(path.join(dir, 'keys'), 'sk-page-test\n');
    const keyed = await startServer(['--draft', 'none', '--set', `server.api_key_file=${path.join(dir, 'keys')}`]);
    try {
        const page = await browser.newPage();
        await page.setViewport(VIEW);
        await page.goto(keyed.url + '/', { waitUntil: 'load' });
        await page.waitForSelector('#key-row:not([hidden])', { timeout: 10000 });
        assert.match(await page.$eval('#model', (e) => e.textContent), /API key/);
        await setField(page, '#apikey', 'sk-page-test');
        await page.waitForSelector('#status-dot.ok', { timeout: 10000 });
        await page.click('#new');
        await setField(page, '#max_tokens', 8);
        await ask(page, PROMPT);
        const got = await lastReply(page, 'done');
        assert.equal(got.tokens, 8);
        await page.evaluate(() => localStorage.clear()); // the key stays out of the other tests
        await page.close();
    } finally {
        assert.equal(await keyed.stop(), 0);
    }
});
