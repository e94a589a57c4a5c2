#!/usr/bin/env node
// bench/serve_load.mjs: the serving benchmark. Sends prompts from a jsonl file (one object a line
// with "turns": [text, ...]; the first turn is the prompt) to an OpenAI-compatible server, streamed
// with include_usage through the openai package, at Poisson arrivals (--rate, seeded) and/or a
// cap on requests in flight (--concurrency), and reports what vllm bench serve reports:
// completed/failed, request/output/total token throughput, goodput at the given SLOs, TTFT, TPOT
// ((e2e - ttft) / (tokens - 1)), ITL (gaps between chunks) and E2E latency at mean/p50/p90/p99,
// and speculation from /metrics deltas (acceptance rate = accepted / draft tokens, mean accepted
// length = 1 + accepted / drafts, per position = accepted at position / drafts).
//
//   node bench/serve_load.mjs --url http://127.0.0.1:8080 --dataset shared/data/prompts/mt-bench.jsonl \
//        --rate 8 --num-requests 200 --max-tokens 128 --json out.json
//
// Works against any server with /v1/completions or /v1/chat/completions (tandem, vLLM, SGLang,
// llama.cpp); speculation is read from tandem_spec_* or vllm:spec_decode_* counters when present.

import fs from 'node:fs';
import { performance } from 'node:perf_hooks';
import OpenAI from 'openai';

const USAGE = `usage: node bench/serve_load.mjs --url URL --dataset FILE.jsonl [options]
  --url URL              server root (http://host:port) or its /v1
  --dataset FILE         jsonl, one {"turns": [text, ...]} a line; the first turn is the prompt
  --endpoint E           chat (default: the first turn as a user message) | completions (raw text)
  --rate R               Poisson arrivals, R requests/s (default inf: all at once)
  --burstiness B         gamma-distributed gaps of shape B (default 1 = Poisson)
  --concurrency C        at most C requests in flight (default: no cap)
  --num-requests N       requests to send (default 100; prompts are cycled in a seeded order)
  --max-tokens N         max_tokens per request (default 128)
  --temperature T        default 0
  --ignore-eos           ask the server to ignore EOS (fixed output lengths)
  --goodput SLOS         e.g. ttft:500,tpot:50,e2el:10000 (milliseconds): a request is good when
                         it meets every SLO given; goodput = good requests / duration
  --seed S               arrival and prompt-order seed (default 0); also sent as the request seed
                         base (request i gets S + i) when --temperature > 0
  --model NAME           default: the server's first /v1/models entry
  --api-key KEY          default: $OPENAI_API_KEY or "none"
  --warmup N             N requests (concurrency 1) before the measurement (default 0)
  --timeout-s S          per-request timeout (default 600)
  --label TEXT           a label stored in the JSON
  --json FILE            write the configuration, results and speculation as JSON
  --save-requests        include every request's record in the JSON
  --quiet                no progress line`;

// ---- arguments

function parseArgs(argv) {
    const o = {
        url: null, dataset: null, endpoint: 'chat', rate: Infinity, burstiness: 1, concurrency: Infinity,
        numRequests: 100, maxTokens: 128, temperature: 0, ignoreEos: false, goodput: null, seed: 0,
        model: null, apiKey: process.env.OPENAI_API_KEY || 'none', warmup: 0, timeoutS: 600, label: null,
        json: null, saveRequests: false, quiet: false,
    };
    const num = (k, v, min = -Infinity) => {
        const x = v === 'inf' ? Infinity : Number(v);
        if (v === undefined || Number.isNaN(x) || x < min) die(`${k}: bad value ${JSON.stringify(v)}`);
        return x;
    };
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        const v = () => argv[++i];
        switch (a) {
            case '--url': o.url = v(); break;
            case '--dataset': o.dataset = v(); break;
            case '--endpoint': o.endpoint = v(); break;
            case '--rate': o.rate = num(a, v(), 0); break;
            case '--burstiness': o.burstiness = num(a, v(), 1e-9); break;
            case '--concurrency': o.concurrency = num(a, v(), 1); break;
            case '--num-requests': o.numRequests = num(a, v(), 1); break;
            case '--max-tokens': o.maxTokens = num(a, v(), 1); break;
            case '--temperature': o.temperature = num(a, v(), 0); break;
            case '--ignore-eos': o.ignoreEos = true; break;
            case '--goodput': o.goodput = parseSlos(v()); break;
            case '--seed': o.seed = num(a, v()); break;
            case '--model': o.model = v(); break;
            case '--api-key': o.apiKey = v(); break;
            case '--warmup': o.warmup = num(a, v(), 0); break;
            case '--timeout-s': o.timeoutS = num(a, v(), 1); break;
            case '--label': o.label = v(); break;
            case '--json': o.json = v(); break;
            case '--save-requests': o.saveRequests = true; break;
            case '--quiet': o.quiet = true; break;
            case '-h': case '--help': console.log(USAGE); process.exit(0);
            default: die(`unknown option ${a}\n${USAGE}`);
        }
    }
    if (!o.url || !o.dataset) die(USAGE);
    if (!['chat', 'completions'].includes(o.endpoint)) die(`--endpoint: chat or completions, not ${o.endpoint}`);
    if (!Number.isFinite(o.rate) && !Number.isFinite(o.concurrency) && o.numRequests > 4096) {
        // everything at once is legitimate, but say what it means
        process.stderr.write(`note: --rate inf without --concurrency sends all ${o.numRequests} requests at once\n`);
    }
    o.numRequests = Math.floor(o.numRequests);
    return o;
}

function parseSlos(s) {
    const slo = {};
    for (const part of String(s ?? '').split(',').filter(Boolean)) {
        const [k, v] = part.split(':');
        if (!['ttft', 'tpot', 'e2el'].includes(k) || !(Number(v) > 0)) die(`--goodput: bad SLO ${JSON.stringify(part)} (ttft|tpot|e2el:ms)`);
        slo[k] = Number(v);
    }
    if (!Object.keys(slo).length) die('--goodput: no SLO given');
    return slo;
}

function die(msg) {
    process.stderr.write(`serve_load: ${msg}\n`);
    process.exit(2);
}

// ---- seeded randomness (mulberry32; gamma by Marsaglia-Tsang)

function rng(seed) {
    let a = (seed >>> 0) ^ 0x9e3779b9;
    return () => {
        a = (a + 0x6d2b79f5) >>> 0;
        let t = a;
        t = Math.imul(t ^ (t >>> 15), t | 1);
        t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

function normal(u) {
    let x = 0;
    while (x === 0) x = u();
    return Math.sqrt(-2 * Math.log(x)) * Math.cos(2 * Math.PI * u());
}

function gamma(u, shape, scale) {
    if (shape < 1) return gamma(u, shape + 1, scale) * Math.pow(u() || 1e-12, 1 / shape);
    const d = shape - 1 / 3;
    const c = 1 / Math.sqrt(9 * d);
    for (;;) {
        let x, v;
        do {
            x = normal(u);
            v = 1 + c * x;
        } while (v <= 0);
        v = v * v * v;
        const w = u();
        if (w < 1 - 0.0331 * x ** 4 || Math.log(w) < 0.5 * x * x + d * (1 - v + Math.log(v))) return d * v * scale;
    }
}

/* Arrival offsets (seconds from the start) of n requests at `rate` with gamma(shape =
 * burstiness) gaps of mean 1/rate (vllm bench serve's model; burstiness 1 = Poisson). */
export function arrivals(n, rate, burstiness, seed) {
    if (!Number.isFinite(rate)) return new Array(n).fill(0);
    const u = rng(seed * 2 + 1);
    const out = [];
    let t = 0;
    for (let i = 0; i < n; i++) {
        out.push(t);
        t += gamma(u, burstiness, 1 / (rate * burstiness));
    }
    return out;
}

// ---- data

function loadPrompts(file, n, seed) {
    const lines = fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.trim());
    const prompts = [];
    for (const [i, l] of lines.entries()) {
        let o;
        try {
            o = JSON.parse(l);
        } catch (e) {
            die(`${file}:${i + 1}: not JSON: ${e.message}`);
        }
        const t = Array.isArray(o.turns) ? o.turns[0] : undefined;
        if (typeof t === 'string' && t.length) prompts.push(t);
    }
    if (!prompts.length) die(`${file}: no prompts (objects with "turns": [text, ...])`);
    // a seeded shuffle, cycled to n
    const u = rng(seed * 2 + 2);
    const order = prompts.map((_, i) => i);
    for (let i = order.length - 1; i > 0; i--) {
        const j = Math.floor(u() * (i + 1));
        [order[i], order[j]] = [order[j], order[i]];
    }
    return { total: prompts.length, picked: Array.from({ length: n }, (_, i) => prompts[order[i % order.length]]) };
}

// ---- statistics

/* percentile p (0..100) of sorted values, linear interpolation (numpy's default) */
function pct(sorted, p) {
    if (!sorted.length) return null;
    const x = (sorted.length - 1) * (p / 100);
    const lo = Math.floor(x);
    const hi = Math.ceil(x);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (x - lo);
}

export function summary(values) {
    const v = values.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
    if (!v.length) return { n: 0, mean: null, std: null, p50: null, p90: null, p99: null, min: null, max: null };
    const mean = v.reduce((s, x) => s + x, 0) / v.length;
    const std = Math.sqrt(v.reduce((s, x) => s + (x - mean) ** 2, 0) / v.length);
    return { n: v.length, mean, std, p50: pct(v, 50), p90: pct(v, 90), p99: pct(v, 99), min: v[0], max: v[v.length - 1] };
}

// ---- metrics (speculation counters)

function parseProm(text) {
    const out = [];
    for (const line of text.split('\n')) {
        if (!line || line.startsWith('#')) continue;
        const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
        if (!m) continue;
        const labels = {};
        for (const x of (m[2] || '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[x[1]] = x[2];
        out.push({ name: m[1], labels, value: Number(m[3]) });
    }
    return out;
}

const SPEC_NAMES = {
    tandem: {
        drafts: 'tandem_spec_drafts_total',
        draftTokens: 'tandem_spec_draft_tokens_total',
        accepted: 'tandem_spec_accepted_tokens_total',
        perPos: 'tandem_spec_accepted_tokens_per_pos_total',
    },
    vllm: {
        drafts: 'vllm:spec_decode_num_drafts_total',
        draftTokens: 'vllm:spec_decode_num_draft_tokens_total',
        accepted: 'vllm:spec_decode_num_accepted_tokens_total',
        perPos: 'vllm:spec_decode_num_accepted_tokens_per_pos_total',
    },
};

async function specSnapshot(root, apiKey) {
    let text;
    try {
        const r = await fetch(`${root}/metrics`, { headers: { authorization: `Bearer ${apiKey}` }, signal: AbortSignal.timeout(10000) });
        if (!r.ok) return null;
        text = await r.text();
    } catch {
        return null;
    }
    const samples = parseProm(text);
    const sum = (name) => samples.filter((s) => s.name === name).reduce((a, s) => a + s.value, 0);
    const present = (name) => samples.some((s) => s.name === name);
    const flavour = present(SPEC_NAMES.tandem.drafts) ? 'tandem' : present(SPEC_NAMES.vllm.drafts) ? 'vllm' : null;
    const running = present('tandem_requests_running') ? sum('tandem_requests_running') : present('vllm:num_requests_running') ? sum('vllm:num_requests_running') : null;
    const snap = { flavour, running, generation: present('tandem_generation_tokens_total') ? sum('tandem_generation_tokens_total') : null };
    if (!flavour) return snap;
    const n = SPEC_NAMES[flavour];
    snap.drafts = sum(n.drafts);
    snap.draftTokens = sum(n.draftTokens);
    snap.accepted = sum(n.accepted);
    snap.perPos = {};
    for (const s of samples) if (s.name === n.perPos && s.labels.position !== undefined) snap.perPos[s.labels.position] = (snap.perPos[s.labels.position] ?? 0) + s.value;
    return snap;
}

function specDelta(a, b) {
    if (!a || !b || !a.flavour || a.flavour !== b.flavour) return null;
    const drafts = b.drafts - a.drafts;
    const draftTokens = b.draftTokens - a.draftTokens;
    const accepted = b.accepted - a.accepted;
    const positions = Object.keys(b.perPos).map(Number).sort((x, y) => x - y);
    const perPosition = positions.map((p) => {
        const acc = b.perPos[p] - (a.perPos[p] ?? 0);
        return { position: p, accepted: acc, rate: drafts > 0 ? acc / drafts : null };
    });
    return {
        source: a.flavour,
        drafts,
        draft_tokens: draftTokens,
        accepted_tokens: accepted,
        acceptance_rate: draftTokens > 0 ? accepted / draftTokens : null,
        mean_acceptance_length: drafts > 0 ? 1 + accepted / drafts : null,
        per_position: perPosition,
    };
}

// ---- one request

async function oneRequest(sdk, o, model, prompt, i) {
    const rec = { i, ok: false, ttft: null, e2e: null, itl: [], outputTokens: 0, promptTokens: null, usageSeen: false, error: null, chunks: 0, start: 0 };
    const common = { model, stream: true, stream_options: { include_usage: true }, temperature: o.temperature };
    if (o.ignoreEos) common.ignore_eos = true;
    if (o.temperature > 0) common.seed = o.seed + i;
    const body = o.endpoint === 'chat'
        ? { ...common, messages: [{ role: 'user', content: prompt }], max_completion_tokens: o.maxTokens }
        : { ...common, prompt, max_tokens: o.maxTokens };
    const t0 = performance.now();
    rec.start = t0;
    let last = t0;
    let textChunks = 0;
    try {
        const stream = o.endpoint === 'chat'
            ? await sdk.chat.completions.create(body, { timeout: o.timeoutS * 1000 })
            : await sdk.completions.create(body, { timeout: o.timeoutS * 1000 });
        for await (const c of stream) {
            const now = performance.now();
            if (c.usage) {
                rec.usageSeen = true;
                rec.outputTokens = c.usage.completion_tokens ?? rec.outputTokens;
                rec.promptTokens = c.usage.prompt_tokens ?? null;
            }
            if (!c.choices || !c.choices.length) continue;
            // TTFT at the first chunk with choices, even if its text is empty; every later
            // chunk is one ITL sample (vllm bench serve's rule)
            if (rec.ttft === null) rec.ttft = now - t0;
            else rec.itl.push(now - last);
            last = now;
            rec.chunks++;
            const piece = c.choices[0].text ?? c.choices[0].delta?.content ?? '';
            if (piece) textChunks++;
        }
        rec.e2e = performance.now() - t0;
        if (!rec.usageSeen) rec.outputTokens = textChunks; // an estimate: chunks, not tokens
        rec.ok = rec.ttft !== null;
        if (!rec.ok) rec.error = 'stream ended without chunks';
    } catch (e) {
        rec.e2e = performance.now() - t0;
        rec.error = `${e?.constructor?.name ?? 'Error'}: ${e?.message ?? e}`.slice(0, 300);
    }
    rec.tpot = rec.ok && rec.outputTokens > 1 ? (rec.e2e - rec.ttft) / (rec.outputTokens - 1) : null;
    return rec;
}

// ---- the run

async function serverModel(sdk) {
    const page = await sdk.models.list();
    const m = page.data?.[0];
    if (!m) throw new Error('/v1/models has no model');
    return m.id;
}

export async function run(o) {
    const root = o.url.replace(/\/+$/, '').replace(/\/v1$/, '');
    const sdk = new OpenAI({ baseURL: `${root}/v1`, apiKey: o.apiKey, maxRetries: 0, timeout: o.timeoutS * 1000 });
    const model = o.model ?? (await serverModel(sdk));
    const data = loadPrompts(o.dataset, o.numRequests + o.warmup, o.seed);
    const warm = data.picked.slice(o.numRequests);
    const prompts = data.picked.slice(0, o.numRequests);
    for (const [i, p] of warm.entries()) await oneRequest(sdk, o, model, p, o.numRequests + i); // not measured

    const before = await specSnapshot(root, o.apiKey);
    const offsets = arrivals(o.numRequests, o.rate, o.burstiness, o.seed);
    const records = new Array(o.numRequests);
    let inFlight = 0;
    let peak = 0;
    let finished = 0;
    // a semaphore of o.concurrency slots; release() hands a slot straight to the next waiter
    const waiters = [];
    const acquire = async () => {
        if (inFlight < o.concurrency) {
            inFlight++;
            return;
        }
        await new Promise((r) => waiters.push(r));
    };
    const release = () => {
        const w = waiters.shift();
        if (w) w();
        else inFlight--;
    };
    const progress = o.quiet ? null : setInterval(() => {
        process.stderr.write(`\r${finished}/${o.numRequests} done, ${inFlight} in flight   `);
    }, 1000);
    const t0 = performance.now();
    const tasks = prompts.map(async (p, i) => {
        const due = t0 + offsets[i] * 1000;
        const wait = due - performance.now();
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        await acquire();
        peak = Math.max(peak, inFlight);
        try {
            records[i] = await oneRequest(sdk, o, model, p, i);
        } finally {
            finished++;
            release();
        }
    });
    await Promise.all(tasks);
    const duration = (performance.now() - t0) / 1000;
    if (progress) {
        clearInterval(progress);
        process.stderr.write('\r' + ' '.repeat(60) + '\r');
    }
    // the server may count a request a moment after its last bytes went out: wait (up to 2 s)
    // until nothing runs, then take the closing snapshot
    let after = await specSnapshot(root, o.apiKey);
    for (let t = 0; after && after.running && t < 40; t++) {
        await new Promise((r) => setTimeout(r, 50));
        after = await specSnapshot(root, o.apiKey);
    }
    await new Promise((r) => setTimeout(r, 100));
    after = (await specSnapshot(root, o.apiKey)) ?? after;
    return report(o, { model, duration, records, peak, before, after, t0, datasetPrompts: data.total });
}

function report(o, { model, duration, records, peak, before, after, t0, datasetPrompts }) {
    const ok = records.filter((r) => r.ok);
    const failed = records.filter((r) => !r.ok);
    const out = ok.reduce((s, r) => s + r.outputTokens, 0);
    const inTok = ok.reduce((s, r) => s + (r.promptTokens ?? 0), 0);
    const ms = (xs) => summary(xs);
    let good = null;
    if (o.goodput) {
        good = ok.filter((r) =>
            (o.goodput.ttft === undefined || r.ttft <= o.goodput.ttft) &&
            (o.goodput.tpot === undefined || (r.tpot ?? 0) <= o.goodput.tpot) &&
            (o.goodput.e2el === undefined || r.e2e <= o.goodput.e2el)
        ).length;
    }
    // peak output tokens/s over 1 s windows: each request's tokens spread over its decode time
    const perSecond = new Map();
    for (const r of ok) {
        if (r.outputTokens <= 0) continue;
        const a = r.start + r.ttft;
        const b = r.start + r.e2e;
        const n = r.outputTokens;
        for (let k = 0; k < n; k++) {
            const t = n === 1 ? a : a + ((b - a) * k) / (n - 1);
            const s = Math.floor((t - t0) / 1000);
            perSecond.set(s, (perSecond.get(s) ?? 0) + 1);
        }
    }
    const result = {
        label: o.label,
        model,
        config: {
            url: o.url, dataset: o.dataset, dataset_prompts: datasetPrompts, endpoint: o.endpoint,
            rate: Number.isFinite(o.rate) ? o.rate : 'inf', burstiness: o.burstiness,
            concurrency: Number.isFinite(o.concurrency) ? o.concurrency : null, num_requests: o.numRequests,
            max_tokens: o.maxTokens, temperature: o.temperature, ignore_eos: o.ignoreEos, seed: o.seed,
            goodput_slo_ms: o.goodput, warmup: o.warmup,
        },
        completed: ok.length,
        failed: failed.length,
        errors: [...new Set(failed.map((r) => r.error))].slice(0, 10),
        duration_s: duration,
        total_input_tokens: inTok,
        total_output_tokens: out,
        usage_reported: ok.every((r) => r.usageSeen),
        request_throughput: ok.length / duration,
        output_throughput: out / duration,
        total_token_throughput: (out + inTok) / duration,
        goodput: good === null ? null : good / duration,
        good_requests: good,
        peak_concurrency: peak,
        peak_output_throughput: perSecond.size ? Math.max(...perSecond.values()) : 0,
        ttft_ms: ms(ok.map((r) => r.ttft)),
        tpot_ms: ms(ok.map((r) => r.tpot)),
        itl_ms: ms(ok.flatMap((r) => r.itl)),
        e2el_ms: ms(ok.map((r) => r.e2e)),
        chunks_per_request: ok.length ? ok.reduce((s, r) => s + r.chunks, 0) / ok.length : null,
        speculation: specDelta(before, after),
        server_generation_tokens: before?.generation != null && after?.generation != null ? after.generation - before.generation : null,
    };
    if (o.saveRequests) {
        result.requests = records.map((r) => ({
            i: r.i, ok: r.ok, error: r.error, start_ms: r.start - t0, ttft_ms: r.ttft, e2el_ms: r.e2e, tpot_ms: r.tpot,
            output_tokens: r.outputTokens, prompt_tokens: r.promptTokens, chunks: r.chunks, itl_ms: r.itl,
        }));
    }
    return result;
}

function f(x, d = 2) {
    return x === null || x === undefined ? 'n/a' : typeof x === 'number' ? x.toFixed(d) : String(x);
}

export function printResult(r) {
    const L = (k, v) => console.log(`${(k + ':').padEnd(42)}${v}`);
    const line = (t) => console.log(t.length ? `${'='.repeat(Math.floor((50 - t.length - 2) / 2))} ${t} ${'='.repeat(Math.ceil((50 - t.length - 2) / 2))}` : '='.repeat(50));
    line('Serving Benchmark Result');
    L('Model', r.model);
    L('Endpoint', r.config.endpoint);
    L('Request rate (req/s)', r.config.rate);
    L('Max concurrency', r.config.concurrency ?? 'none');
    L('Successful requests', r.completed);
    L('Failed requests', r.failed);
    L('Benchmark duration (s)', f(r.duration_s));
    L('Total input tokens', r.total_input_tokens);
    L('Total generated tokens', r.total_output_tokens + (r.usage_reported ? '' : ' (estimated from chunks: no usage)'));
    L('Request throughput (req/s)', f(r.request_throughput));
    if (r.goodput !== null) L(`Request goodput (req/s)`, `${f(r.goodput)} (${r.good_requests} within ${JSON.stringify(r.config.goodput_slo_ms)} ms)`);
    L('Output token throughput (tok/s)', f(r.output_throughput));
    L('Peak output token throughput (tok/s)', f(r.peak_output_throughput, 0));
    L('Peak concurrent requests', r.peak_concurrency);
    L('Total token throughput (tok/s)', f(r.total_token_throughput));
    for (const [name, k] of [['Time to First Token', 'ttft_ms'], ['Time per Output Token (excl. 1st token)', 'tpot_ms'], ['Inter-token Latency', 'itl_ms'], ['End-to-end Latency', 'e2el_ms']]) {
        line(name.length > 44 ? name.slice(0, 44) : name);
        const s = r[k];
        const short = k.replace('_ms', '').toUpperCase();
        L(`Mean ${short} (ms)`, f(s.mean));
        L(`Median ${short} (ms)`, f(s.p50));
        L(`P90 ${short} (ms)`, f(s.p90));
        L(`P99 ${short} (ms)`, f(s.p99));
    }
    if (r.speculation) {
        const s = r.speculation;
        line('Speculative Decoding');
        L('Acceptance rate (%)', s.acceptance_rate === null ? 'n/a' : f(100 * s.acceptance_rate));
        L('Acceptance length', f(s.mean_acceptance_length));
        L('Drafts', s.drafts);
        L('Draft tokens', s.draft_tokens);
        L('Accepted tokens', s.accepted_tokens);
        if (s.per_position.length) L('Per-position acceptance rate', s.per_position.map((p) => f(p.rate, 3)).join(' '));
    }
    if (r.errors.length) {
        line('Errors');
        for (const e of r.errors) console.log(e);
    }
    line('');
}

async function main() {
    const o = parseArgs(process.argv.slice(2));
    const r = await run(o);
    printResult(r);
    if (o.json) fs.writeFileSync(o.json, JSON.stringify(r, null, 2) + '\n');
    if (r.completed === 0) process.exit(1);
}

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith('serve_load.mjs')) {
    main().catch((e) => {
        process.stderr.write(`serve_load: ${e?.stack ?? e}\n`);
        process.exit(1);
    });
}
