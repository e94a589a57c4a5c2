// serve_soak.mjs: a bounded soak of tandem serve on the CPU (issue 21's target).
//
//   node bench/serve_soak.mjs [--requests 10000] [--connections 32] [--tandem bin/tandem]
//                             [--model models/tandem-tiny] [--draft none] [--json out.json]
//
// Starts the server at a free port, records every prompt's solo output (one request at a time),
// then sends --requests requests over --connections concurrent clients: valid ones (completions
// and chat, streamed and not, with stop strings), clients that disconnect at a random moment
// (queued, prefilling or decoding), bad requests, and cancelled non-streamed ones. It checks:
// no crash; every valid request's text equals its solo output; after the load the server is
// idle (no running, waiting, busy slot, open stream or request held by the engine); resident
// memory at the end within 5% of its level after warm-up. Exit 0 when all hold.
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';

const args = process.argv.slice(2);
const opt = (name, def) => {
    const i = args.indexOf('--' + name);
    return i >= 0 ? args[i + 1] : def;
};
const N = +opt('requests', 10000), C = +opt('connections', 32);
const tandem = opt('tandem', process.env.TD_TANDEM || 'bin/tandem');
const model = opt('model', 'models/tandem-tiny'), draft = opt('draft', 'none');

let rng = 0x2545f491;
const rand = () => ((rng = (rng * 1103515245 + 12345) >>> 0) / 4294967296);

function startServer() {
    const p = spawn(tandem, ['serve', '--port', '0', '--model', model, '--draft', draft,
        '--set', 'scheduler.max_running=16', '--set', 'limits.max_waiting=64',
        '--set', 'server.sse_ping_s=1', '--set', 'log.level=warn'], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    return new Promise((res, rej) => {
        const t = setTimeout(() => rej(new Error('server did not start: ' + err)), 60000);
        p.stderr.on('data', (d) => {
            err += d;
            const m = err.match(/tandem: serving \S+ on (http:\/\/\S+) /);
            if (m) { clearTimeout(t); res({ proc: p, url: m[1], log: () => err }); }
        });
        p.on('exit', (code) => rej(new Error(`server exited ${code}: ${err}`)));
    });
}

const rss = (pid) => +readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1];

const prompts = [
    'Once upon a time', 'The little dog', 'In the morning', 'She said that', 'Tom and Lily',
    'A long time ago', 'The sun was', 'He wanted to', 'One day a girl', 'The big tree',
];
// a request shape: what it is and how to read its text
function shape(i) {
    const p = prompts[i % prompts.length], chat = (i >> 1) % 2 === 1, stop = i % 5 === 0 ? [' the'] : undefined;
    const body = chat
        ? { messages: [{ role: 'user', content: p }], max_tokens: 8 + (i % 3) * 4, temperature: 0, stop }
        : { prompt: p, max_tokens: 8 + (i % 3) * 4, temperature: 0, stop };
    return { key: `${chat}|${p}|${body.max_tokens}|${stop}`, path: chat ? '/v1/chat/completions' : '/v1/completions', body, chat };
}

async function run(url, s, stream, signal) {
    const r = await fetch(url + s.path, {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ ...s.body, stream }), signal,
    });
    if (!stream) {
        const j = await r.json();
        if (r.status !== 200) throw new Error(`status ${r.status}: ${JSON.stringify(j)}`);
        return s.chat ? j.choices[0].message.content : j.choices[0].text;
    }
    if (r.status !== 200) throw new Error(`status ${r.status}`);
    const raw = await r.text();
    let text = '', done = false;
    for (const ev of raw.split('\n\n')) {
        if (!ev.startsWith('data: ')) continue;
        const d = ev.slice(6);
        if (d === '[DONE]') { done = true; continue; }
        const j = JSON.parse(d);
        if (j.error) throw new Error('stream error: ' + j.error.message);
        for (const c of j.choices) text += s.chat ? (c.delta.content || '') : c.text;
    }
    if (!done) throw new Error('stream without [DONE]');
    return text;
}

const bad = [
    '{"prompt":', '[1,2,3]', '{"prompt":"x","max_tokens":"a"}', '{"prompt":"x","temperature":-1}',
    '{"messages":[]}', '{"prompt":"x","n":1000}', '{"prompt":""}', '{"prompt":[99999999]}',
];

async function main() {
    const t0 = Date.now();
    const srv = await startServer();
    const url = srv.url;
    const solo = new Map();
    for (let i = 0; i < 60; i++) { // every shape once, alone
        const s = shape(i);
        if (!solo.has(s.key)) solo.set(s.key, await run(url, s, false));
    }
    const counts = { ok: 0, mismatch: 0, disconnect: 0, cancel: 0, bad: 0, bad_wrong: 0, rejected: 0, failed: 0 };
    const failures = [];
    let next = 0, rss_warm = 0;
    async function client() {
        for (;;) {
            const i = next++;
            if (i >= N) return;
            if (i === Math.floor(N / 10)) rss_warm = rss(srv.proc.pid);
            const kind = rand();
            const s = shape(Math.floor(rand() * 1000));
            try {
                if (kind < 0.7) { // valid
                    const text = await run(url, s, rand() < 0.5);
                    if (text === solo.get(s.key)) counts.ok++;
                    else { counts.mismatch++; failures.push({ i, key: s.key, got: text, want: solo.get(s.key) }); }
                } else if (kind < 0.85) { // disconnect at a random moment (streamed or not)
                    const ac = new AbortController();
                    setTimeout(() => ac.abort(), Math.floor(rand() * 60));
                    await run(url, s, rand() < 0.5, ac.signal).catch(() => {});
                    counts[kind < 0.78 ? 'disconnect' : 'cancel']++;
                } else { // a bad request: 400 with an error object
                    const b = bad[Math.floor(rand() * bad.length)];
                    const r = await fetch(url + '/v1/completions', { method: 'POST', body: b });
                    const j = await r.json();
                    if (r.status === 400 && j.error && j.error.type === 'invalid_request_error') counts.bad++;
                    else { counts.bad_wrong++; failures.push({ i, bad: b, status: r.status, body: j }); }
                }
            } catch (e) {
                if (/status 429/.test(e.message)) counts.rejected++;
                else { counts.failed++; failures.push({ i, error: e.message }); }
            }
        }
    }
    await Promise.all(Array.from({ length: C }, client));
    await new Promise((r) => setTimeout(r, 1500)); // disconnects are seen within a second
    const slots = await (await fetch(url + '/slots')).json();
    const metrics = await (await fetch(url + '/metrics')).text();
    const gauge = (n) => +(metrics.match(new RegExp('^' + n + ' (\\S+)$', 'm')) || [0, NaN])[1];
    const rss_end = rss(srv.proc.pid);
    const idle = {
        running: gauge('tandem_requests_running'), waiting: gauge('tandem_requests_waiting'),
        slots_busy: gauge('tandem_slots_busy'), streams: gauge('tandem_sse_streams_active'),
        engine_requests_held: slots.engine_requests_held, outstanding: slots.outstanding,
    };
    srv.proc.kill('SIGTERM');
    const code = await new Promise((r) => srv.proc.on('exit', (c) => r(c)));
    const growth = rss_end / rss_warm - 1;
    const out = {
        requests: N, connections: C, draft, seconds: (Date.now() - t0) / 1e3, counts, idle,
        rss_kib: { after_warmup: rss_warm, end: rss_end, growth_pct: +(100 * growth).toFixed(2) },
        exit_code: code, failures: failures.slice(0, 10),
    };
    console.log(JSON.stringify(out, null, 1));
    if (opt('json')) writeFileSync(opt('json'), JSON.stringify(out, null, 1));
    const okIdle = Object.values(idle).every((v) => v === 0);
    const pass = okIdle && counts.mismatch === 0 && counts.failed === 0 && counts.bad_wrong === 0 &&
        Math.abs(growth) <= 0.05 && code === 0;
    console.log(pass ? 'soak: PASS' : 'soak: FAIL');
    process.exit(pass ? 0 : 1);
}
main().catch((e) => { console.error(e); process.exit(1); });
