// tests/serve/harness.mjs: what the serve tests share. Starts `tandem serve` on a free port,
// runs `tandem generate` for solo references, and speaks HTTP without the SDK where exact
// bytes and headers matter.
//
//   const srv = await startServer(['--draft', 'none']);   // srv.url, srv.baseURL, srv.model
//   const ids = await solo([1, 2, 3], { maxTokens: 16 });  // greedy reference ids
//   const r = await raw(srv.url, { method: 'POST', path: '/v1/completions', body: {...} });
//   await srv.stop();                                      // SIGTERM; resolves with the exit code
//
// Environment: TD_TANDEM (the binary, default bin/tandem), TD_MODEL (model directory, default
// models/tandem-tiny when it exists; passed to serve and generate alike), TD_BACKEND (when set:
// `--backend B` for generate and `--set model.backend=B` for serve, so both run on one backend).

import { spawn, execFile } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { before, after } from 'node:test';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
export const TANDEM = process.env.TD_TANDEM || path.join(ROOT, 'bin/tandem');
export const MODEL =
    process.env.TD_MODEL ||
    (fs.existsSync(path.join(ROOT, 'models/tandem-tiny/config.json'))
        ? path.join(ROOT, 'models/tandem-tiny')
        : '');
export const BACKEND = process.env.TD_BACKEND || '';
export const EOS = 1; // models/tandem-tiny's generation_config.json
export const MAX_CTX = 1024; // models/tandem-tiny's max_position_embeddings
export const IS_TINY = !MODEL || path.basename(MODEL) === 'tandem-tiny';

// the ready line the server prints to stderr once it accepts requests
export const READY_RE = /^tandem: serving (\S+) on (http:\/\/[^ ]+) /;

const live = new Set(); // children still running, killed if this process exits first
process.on('exit', () => {
    for (const p of live) {
        try {
            p.kill('SIGKILL');
        } catch {}
    }
});

export function tmpdir(tag = 'serve') {
    return fs.mkdtempSync(path.join(os.tmpdir(), `tandem-${tag}-`));
}

function modelArgs() {
    const a = [];
    if (MODEL) a.push('--model', MODEL);
    return a;
}

function serveArgs(args, dir) {
    const a = ['serve', '--port', '0', '--set', `log.file=${path.join(dir, 'server.log')}`];
    a.push(...modelArgs());
    if (BACKEND) a.push('--set', `model.backend=${BACKEND}`);
    return a.concat(args);
}

function tail(file, n = 40) {
    try {
        return fs.readFileSync(file, 'utf8').split('\n').slice(-n).join('\n');
    } catch {
        return '(no log)';
    }
}

/* Start `tandem serve ARGS` and wait for its ready line. Options: env (added to ours),
 * timeoutMs (default 60 s). Resolves with
 *   { url, baseURL, model, proc, dir, stderr(), log(), exited, stop(signal, timeoutMs) }
 * where exited resolves with { code, signal } and stop() sends the signal (default SIGTERM)
 * and resolves with the exit code (null if killed by a signal); a server still running after
 * timeoutMs (default 30 s) is killed and stop() rejects. */
export function startServer(args = [], { env = {}, timeoutMs = 60000 } = {}) {
    const dir = tmpdir('serve');
    const argv = serveArgs(args, dir);
    const proc = spawn(TANDEM, argv, {
        cwd: ROOT,
        env: { ...process.env, ...env },
        stdio: ['ignore', 'ignore', 'pipe'],
    });
    live.add(proc);
    let err = '';
    let exitInfo = null;
    const exited = new Promise((resolve) => {
        proc.on('exit', (code, signal) => {
            live.delete(proc);
            exitInfo = { code, signal };
            resolve(exitInfo);
        });
    });
    const logFile = path.join(dir, 'server.log');
    const describe = () =>
        `command: ${TANDEM} ${argv.join(' ')}\n--- stderr ---\n${err}\n--- log tail ---\n${tail(logFile)}`;
    return new Promise((resolve, reject) => {
        let buf = '';
        let done = false;
        const timer = setTimeout(() => {
            if (done) return;
            done = true;
            proc.kill('SIGKILL');
            reject(new Error(`tandem serve: no ready line within ${timeoutMs} ms\n${describe()}`));
        }, timeoutMs);
        proc.on('error', (e) => {
            if (done) return;
            done = true;
            clearTimeout(timer);
            reject(new Error(`tandem serve: cannot start ${TANDEM}: ${e.message}`));
        });
        exited.then(({ code, signal }) => {
            if (done) return;
            done = true;
            clearTimeout(timer);
            reject(new Error(`tandem serve exited (code ${code}, signal ${signal}) before its ready line\n${describe()}`));
        });
        proc.stderr.setEncoding('utf8');
        proc.stderr.on('data', (s) => {
            err += s;
            if (done) return;
            buf += s;
            let nl;
            while ((nl = buf.indexOf('\n')) >= 0) {
                const line = buf.slice(0, nl);
                buf = buf.slice(nl + 1);
                const m = READY_RE.exec(line);
                if (!m) continue;
                done = true;
                clearTimeout(timer);
                const url = m[2].replace(/\/+$/, '');
                const srv = {
                    url,
                    baseURL: url + '/v1',
                    model: m[1],
                    proc,
                    dir,
                    exited,
                    stderr: () => err,
                    log: () => tail(logFile, 200),
                    describe,
                    stop: async (signal = 'SIGTERM', ms = 30000) => {
                        if (exitInfo) return exitInfo.code;
                        proc.kill(signal);
                        let t;
                        const timeout = new Promise((r) => (t = setTimeout(r, ms, 'timeout')));
                        const r = await Promise.race([exited, timeout]);
                        clearTimeout(t);
                        if (r === 'timeout') {
                            proc.kill('SIGKILL');
                            await exited;
                            throw new Error(`tandem serve did not exit within ${ms} ms of ${signal}\n${describe()}`);
                        }
                        return r.code;
                    },
                };
                resolve(srv);
                return;
            }
        });
    });
}

/* Run `tandem serve ARGS` expecting it to exit without serving (bad configuration).
 * Resolves with { code, signal, stderr, ready } (ready: whether a ready line appeared, in
 * which case the server is killed). */
/* One server for a whole test file: started before its first test with `args`, the prompt
 * `text` tokenized, both handed to `set(srv, promptIds)`; stopped after its last test, which
 * asserts a clean exit (0). */
export function serverForFile(args, text, set, opts = {}) {
    let srv;
    before(async () => {
        srv = await startServer(args, opts);
        set(srv, await tokenize(text));
    }, { timeout: 90000 });
    after(async () => {
        if (srv) assert.equal(await srv.stop(), 0);
    }, { timeout: 40000 });
}

export function serveExpectExit(args, { env = {}, timeoutMs = 20000, raw = false } = {}) {
    const dir = tmpdir('serve-fail');
    const argv = raw ? args : serveArgs(args, dir);
    return new Promise((resolve) => {
        const proc = spawn(TANDEM, argv, { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
        live.add(proc);
        let err = '';
        let ready = false;
        const timer = setTimeout(() => proc.kill('SIGKILL'), timeoutMs);
        proc.stderr.setEncoding('utf8');
        proc.stderr.on('data', (s) => {
            err += s;
            if (!ready && err.split('\n').some((l) => READY_RE.test(l))) {
                ready = true;
                proc.kill('SIGKILL');
            }
        });
        proc.on('error', (e) => {
            err += `spawn error: ${e.message}`;
        });
        proc.on('close', (code, signal) => {
            clearTimeout(timer);
            live.delete(proc);
            resolve({ code, signal, stderr: err, ready });
        });
    });
}

/* Run the tandem binary; resolves with { code, stdout, stderr }. */
export function runTandem(args, { timeoutMs = 60000 } = {}) {
    return new Promise((resolve) => {
        execFile(TANDEM, args, { cwd: ROOT, timeout: timeoutMs, maxBuffer: 64 << 20, encoding: 'utf8' }, (e, stdout, stderr) => {
            resolve({ code: e ? (typeof e.code === 'number' ? e.code : -1) : 0, stdout, stderr, error: e });
        });
    });
}

async function mustRun(args, what) {
    const r = await runTandem(args);
    if (r.code !== 0) throw new Error(`${what} failed (${r.code}): tandem ${args.join(' ')}\n${r.stderr}`);
    return r.stdout;
}

function genArgs(opts) {
    const a = ['--max-tokens', String(opts.maxTokens ?? 16), '--temperature', String(opts.temperature ?? 0)];
    if (opts.seed !== undefined) a.push('--seed', String(opts.seed));
    if (opts.topK !== undefined) a.push('--top-k', String(opts.topK));
    if (opts.topP !== undefined) a.push('--top-p', String(opts.topP));
    if (opts.n !== undefined) a.push('--n', String(opts.n));
    a.push('--draft', opts.draft ?? 'none');
    if (opts.draftTokens !== undefined) a.push('--draft-tokens', String(opts.draftTokens));
    if (opts.ignoreEos) a.push('--ignore-eos');
    a.push(...modelArgs());
    if (BACKEND) a.push('--backend', BACKEND);
    return a;
}

const parseIds = (line) => line.trim().split(/\s+/).filter(Boolean).map(Number);

/* `tandem generate --prompt-ids IDS --print-ids` for one completion; resolves with its ids.
 * opts: maxTokens (16), temperature (0), seed, topK, topP, draft ('none'), ignoreEos. */
export async function solo(ids, opts = {}) {
    return (await soloN(ids, 1, opts))[0];
}

/* The same with --n N: completion i uses seed S + i; resolves with N id arrays. */
export async function soloN(ids, n, opts = {}) {
    const out = await mustRun(['generate', '--prompt-ids', ids.join(' '), '--print-ids', ...genArgs({ ...opts, n })], 'generate');
    const lines = out.split('\n').filter((l, i, all) => i < all.length - 1 || l !== '');
    if (lines.length !== n) throw new Error(`generate printed ${lines.length} lines for --n ${n}: ${JSON.stringify(out)}`);
    return lines.map(parseIds);
}

/* `tandem generate "TEXT"` (one completion, text out); resolves with the text as printed
 * (generate ends its output with one newline, which is dropped here). */
export async function soloText(text, opts = {}) {
    const out = await mustRun(['generate', text, ...genArgs(opts)], 'generate');
    return out.endsWith('\n') ? out.slice(0, -1) : out;
}

/* text -> ids with the model's tokenizer (`tandem tokenize`); special: add BOS as the
 * post-processor does (true by default, as `generate "TEXT"` encodes its prompt). */
export async function tokenize(text, { special = true } = {}) {
    const a = ['tokenize', '--model', MODEL || path.join(ROOT, 'models/tandem-tiny'), '--text', text];
    if (!special) a.push('--no-special');
    return parseIds(await mustRun(a, 'tokenize'));
}

const detokCache = new Map();
/* ids -> text (`tandem detokenize --skip-special`), cached. */
export async function detokenize(ids, { skipSpecial = true } = {}) {
    const key = `${skipSpecial}:${ids.join(',')}`;
    if (detokCache.has(key)) return detokCache.get(key);
    if (ids.length === 0) return '';
    const a = ['detokenize', '--model', MODEL || path.join(ROOT, 'models/tandem-tiny'), '--ids', ids.join(' ')];
    if (skipSpecial) a.push('--skip-special');
    const s = await mustRun(a, 'detokenize');
    detokCache.set(key, s);
    return s;
}

// the model's chat format (tokenizer/chat.h, CHAT_FORMAT_DEEPSEEK without thinking markers):
// BOS, system texts joined by "\n\n", <｜User｜>text per user turn, <｜Assistant｜> to open the reply
export const BOS_TEXT = '<｜begin▁of▁sentence｜>';
export const USER_TEXT = '<｜User｜>';
export const ASSISTANT_TEXT = '<｜Assistant｜>';
export const EOS_TEXT = '<｜end▁of▁sentence｜>';
export function renderChat(messages) {
    const sys = messages.filter((m) => m.role === 'system').map((m) => m.content);
    let s = BOS_TEXT + sys.join('\n\n');
    for (const m of messages) {
        if (m.role === 'user') s += USER_TEXT + m.content;
        else if (m.role === 'assistant') s += ASSISTANT_TEXT + m.content + EOS_TEXT;
    }
    return s + ASSISTANT_TEXT;
}
/* The prompt ids the server should feed for a chat request (special-token strings in the
 * rendered text are matched as tokens; no post-processor BOS on top of the rendered one). */
export async function chatIds(messages) {
    return tokenize(renderChat(messages), { special: false });
}

/* Drop one trailing EOS: the engine keeps the EOS it stopped at among the generated ids
 * (`generate --print-ids` prints it); whether a server's token_ids keep it is its choice. */
export const stripEos = (ids) => (ids.length && ids[ids.length - 1] === EOS ? ids.slice(0, -1) : ids);

// ---- HTTP

/* One HTTP/1.1 request with node:http on a fresh connection (no keep-alive pool).
 * opts: method ('GET'), path, headers, body (object -> JSON, string or Buffer), timeoutMs
 * (30 s). Resolves with { status, headers (lower-case), body (Buffer), text, json() };
 * rejects with the socket error (err.code ECONNREFUSED, ECONNRESET, ...). */
export function raw(base, { method = 'GET', path: p = '/', headers = {}, body, timeoutMs = 30000 } = {}) {
    const u = new URL(p, base);
    let data = body;
    const h = { ...headers };
    if (body !== undefined && !Buffer.isBuffer(body) && typeof body !== 'string') {
        data = JSON.stringify(body);
        h['content-type'] ??= 'application/json';
    }
    if (data !== undefined) h['content-length'] = Buffer.byteLength(data);
    return new Promise((resolve, reject) => {
        const req = http.request(
            { host: u.hostname, port: u.port, path: u.pathname + u.search, method, headers: h, agent: false },
            (res) => {
                const parts = [];
                res.on('data', (c) => parts.push(c));
                res.on('end', () => {
                    clearTimeout(timer);
                    const buf = Buffer.concat(parts);
                    const text = buf.toString('utf8');
                    resolve({
                        status: res.statusCode,
                        headers: res.headers,
                        rawHeaders: res.rawHeaders,
                        httpVersion: res.httpVersion,
                        body: buf,
                        text,
                        json: () => JSON.parse(text),
                    });
                });
                res.on('error', reject);
            }
        );
        const timer = setTimeout(() => req.destroy(new Error(`${method} ${p}: no complete answer within ${timeoutMs} ms`)), timeoutMs);
        req.on('error', (e) => {
            clearTimeout(timer);
            reject(e);
        });
        if (data !== undefined) req.write(data);
        req.end();
    });
}

/* A streaming POST with node:http: resolves once the response headers arrive with
 * { status, headers, res, req, chunks (Buffers so far), done (promise of the whole Buffer),
 *   destroy() }. onData(buf) is called per received piece. */
export function rawStream(base, p, body, { headers = {}, onData, timeoutMs = 60000 } = {}) {
    const u = new URL(p, base);
    const data = typeof body === 'string' ? body : JSON.stringify(body);
    return new Promise((resolve, reject) => {
        const req = http.request(
            {
                host: u.hostname,
                port: u.port,
                path: u.pathname,
                method: 'POST',
                headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data), ...headers },
                agent: false,
            },
            (res) => {
                const chunks = [];
                const done = new Promise((ok, bad) => {
                    res.on('data', (c) => {
                        chunks.push(c);
                        if (onData) onData(c);
                    });
                    res.on('end', () => {
                        clearTimeout(timer);
                        ok(Buffer.concat(chunks));
                    });
                    res.on('error', bad);
                    res.on('aborted', () => bad(new Error('response aborted')));
                });
                done.catch(() => {});
                resolve({ status: res.statusCode, headers: res.headers, res, req, chunks, done, destroy: () => req.destroy() });
            }
        );
        const timer = setTimeout(() => req.destroy(new Error(`POST ${p}: stream not complete within ${timeoutMs} ms`)), timeoutMs);
        req.on('error', (e) => {
            clearTimeout(timer);
            reject(e);
        });
        req.end(data);
    });
}

/* Parse an SSE body strictly as the server must frame it: events separated by one blank
 * line, each one `data: <payload>` line or a `: comment` line, nothing else. Returns
 * { events: [payload strings], comments, problems: [strings] }. */
export function parseSSE(text) {
    const problems = [];
    const events = [];
    let comments = 0;
    if (!text.endsWith('\n\n')) problems.push(`body does not end with a blank line: ${JSON.stringify(text.slice(-40))}`);
    if (text.includes('\r')) problems.push('body contains \\r');
    const blocks = text.split('\n\n');
    if (blocks[blocks.length - 1] === '') blocks.pop();
    for (const b of blocks) {
        if (b.startsWith(':') && !b.includes('\n')) {
            comments++;
            continue;
        }
        if (b.includes('\n')) {
            problems.push(`event of several lines: ${JSON.stringify(b.slice(0, 120))}`);
            continue;
        }
        if (!b.startsWith('data: ')) {
            problems.push(`line that is not 'data: ...': ${JSON.stringify(b.slice(0, 120))}`);
            continue;
        }
        events.push(b.slice(6));
    }
    return { events, comments, problems };
}

/* Chunks of a completed SSE body: { chunks (parsed JSON, before [DONE]), done (whether the
 * last event is [DONE]), afterDone (events after it), problems }. */
export function sseChunks(text) {
    const { events, comments, problems } = parseSSE(text);
    const chunks = [];
    let doneAt = -1;
    events.forEach((e, i) => {
        if (e === '[DONE]') {
            if (doneAt < 0) doneAt = i;
            return;
        }
        if (doneAt >= 0) return;
        try {
            chunks.push(JSON.parse(e));
        } catch {
            problems.push(`data that is not JSON: ${JSON.stringify(e.slice(0, 120))}`);
        }
    });
    return { chunks, done: doneAt === events.length - 1 && doneAt >= 0, afterDone: doneAt >= 0 ? events.length - 1 - doneAt : 0, comments, problems };
}

export async function postJSON(base, p, body, headers = {}) {
    const r = await fetch(new URL(p, base), {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(60000),
    });
    const text = await r.text();
    let json = null;
    try {
        json = JSON.parse(text);
    } catch {}
    return { status: r.status, headers: r.headers, text, json };
}

/* An openai client for srv; opts go to the constructor (maxRetries defaults to 0 here so that
 * a failure shows at once; tests of retries set it). */
export function client(srv, opts = {}) {
    return new OpenAI({ baseURL: srv.baseURL, apiKey: 'sk-none', maxRetries: 0, timeout: 60000, ...opts });
}

// ---- metrics

/* GET /metrics parsed: Map "name{a="x",b="y"}" (labels sorted) -> number, plus .types
 * (family -> type) and .text. */
export async function scrape(srv) {
    const r = await raw(srv.url, { path: '/metrics' });
    if (r.status !== 200) throw new Error(`/metrics answered ${r.status}: ${r.text.slice(0, 200)}`);
    return parseProm(r.text);
}

export function parseProm(text) {
    const m = new Map();
    m.types = new Map();
    m.text = text;
    for (const line of text.split('\n')) {
        if (line.startsWith('# TYPE ')) {
            const [, , name, type] = line.split(/\s+/);
            m.types.set(name, type);
            continue;
        }
        if (!line || line.startsWith('#')) continue;
        const mm = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
        if (!mm) continue;
        const labels = parseLabels(mm[2] || '');
        m.set(seriesKey(mm[1], labels), Number(mm[3] === '+Inf' ? Infinity : mm[3]));
    }
    return m;
}

function parseLabels(s) {
    const out = {};
    const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
    let x;
    while ((x = re.exec(s))) out[x[1]] = x[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    return out;
}

function seriesKey(name, labels) {
    const ks = Object.keys(labels).sort();
    return ks.length ? `${name}{${ks.map((k) => `${k}="${labels[k]}"`).join(',')}}` : name;
}

/* A scrape once the server is at rest: nothing running or waiting, and the counters (series
 * ending in _total or _count) the same in two scrapes 50 ms apart. A response can reach its
 * client a moment before the server has counted it, so tests that reconcile counters with
 * responses read them through this (bounded by timeoutMs; the last scrape after that).
 * The HTTP request counters are left out of the comparison: every scrape moves them. */
export async function settled(srv, { timeoutMs = 3000 } = {}) {
    const t0 = Date.now();
    // (tandem_http_* count the scrapes themselves)
    const counters = (m) =>
        [...m].filter(([k]) => /_(total|count)(\{|$)/.test(k) && !k.startsWith('tandem_http_')).map(([k, v]) => `${k}=${v}`).join('\n');
    let prev = await scrape(srv);
    for (;;) {
        await sleep(50);
        const m = await scrape(srv);
        const idle = mval(m, 'tandem_requests_running') === 0 && mval(m, 'tandem_requests_waiting') === 0;
        if (idle && counters(m) === counters(prev)) return m;
        if (Date.now() - t0 > timeoutMs) return m;
        prev = m;
    }
}

/* Sum of the series of family `name` whose labels include `labels` (0 when none). */
export function mval(m, name, labels = {}) {
    let sum = 0;
    for (const [k, v] of m) {
        const brace = k.indexOf('{');
        const n = brace < 0 ? k : k.slice(0, brace);
        if (n !== name) continue;
        const ls = brace < 0 ? {} : parseLabels(k.slice(brace));
        if (Object.entries(labels).every(([a, b]) => ls[a] === String(b))) sum += v;
    }
    return sum;
}

/* Whether family `name` has any series. */
export function has(m, name) {
    for (const k of m.keys()) if (k === name || k.startsWith(name + '{')) return true;
    return false;
}

// ---- waiting

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/* Poll fn() every intervalMs until it returns a truthy value; that value, or an Error
 * naming what after timeoutMs (with the last value seen). */
export async function waitFor(fn, { timeoutMs = 5000, intervalMs = 50, what = 'condition' } = {}) {
    const t0 = Date.now();
    let last;
    for (;;) {
        last = await fn();
        if (last) return last;
        if (Date.now() - t0 > timeoutMs) throw new Error(`${what}: not reached within ${timeoutMs} ms (last: ${JSON.stringify(last)})`);
        await sleep(intervalMs);
    }
}

/* Run fns with at most `limit` at a time; resolves with their results in order. */
export async function pool(limit, fns) {
    const out = new Array(fns.length);
    let next = 0;
    const worker = async () => {
        while (next < fns.length) {
            const i = next++;
            out[i] = await fns[i]();
        }
    };
    await Promise.all(Array.from({ length: Math.min(limit, fns.length) }, worker));
    return out;
}

/* Concatenated text per choice index of completions or chat chunks, with the finish reason
 * and usage seen. */
export function collect(chunks) {
    const text = [];
    const finish = [];
    let usage = null;
    for (const c of chunks) {
        if (c.usage) usage = c.usage;
        for (const ch of c.choices || []) {
            const i = ch.index ?? 0;
            const piece = ch.text ?? ch.delta?.content ?? '';
            text[i] = (text[i] ?? '') + (piece ?? '');
            if (ch.finish_reason) finish[i] = ch.finish_reason;
        }
    }
    return { text, finish, usage };
}

// ---- a model with DeepSeek V4's vocabulary

/* models/tandem-tiny with its three unused placeholder tokens renamed <think>, </think> and
 * <｜latest_reminder｜> (the last makes the vocabulary V4's), in a temporary directory.
 * commaCloses: </think> is the id of "," instead (a special token the model writes early), or of
 * the token named when it is a string; added: more added tokens ({ id, content, special }) put
 * first, which decode as their content. */
const RENAME = { '<｜place▁holder▁no▁0｜>': '<think>', '<｜place▁holder▁no▁1｜>': '</think>', '<｜place▁holder▁no▁2｜>': '<｜latest_reminder｜>' };

/* tandem-tiny with a V4 vocabulary: every file linked but the tokenizer's, which is rewritten;
 * commaCloses: </think> is the id of "," instead (a special token the model writes first);
 * added: more added tokens ({ id, content, special }) put first, which decode as their content */
export function v4Model(commaCloses = false, added = []) {
    const d = tmpdir('v4model');
    for (const f of fs.readdirSync(MODEL)) {
        if (f === 'tokenizer.json' || f === 'tokenizer_config.json') continue;
        fs.symlinkSync(path.join(MODEL, f), path.join(d, f));
    }
    let tj = fs.readFileSync(path.join(MODEL, 'tokenizer.json'), 'utf8');
    let tc = fs.readFileSync(path.join(MODEL, 'tokenizer_config.json'), 'utf8');
    for (const [from, to] of Object.entries(RENAME)) {
        if (commaCloses && to === '</think>') continue;
        tj = tj.split(from).join(to);
        tc = tc.split(from).join(to);
    }
    if (commaCloses || added.length) {
        const t = JSON.parse(tj);
        const tok = (id, content, special) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special });
        const closer = typeof commaCloses === 'string' ? commaCloses : ',';
        if (commaCloses) t.added_tokens.unshift(tok(t.model.vocab[closer], '</think>', true));
        for (const a of added) t.added_tokens.unshift(tok(a.id, a.content, !!a.special));
        tj = JSON.stringify(t);
    }
    fs.writeFileSync(path.join(d, 'tokenizer.json'), tj);
    fs.writeFileSync(path.join(d, 'tokenizer_config.json'), tc);
    return d;
}
