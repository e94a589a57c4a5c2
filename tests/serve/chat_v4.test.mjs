// tests/serve/chat_v4.test.mjs: /v1/chat/completions on a model whose tokenizer is DeepSeek
// V4's (tokenizer/chat.h): the OpenAI fields V4 prompts carry (tools, assistant tool_calls and
// reasoning_content, role "tool" results, developer) become the prompt encoding_dsv4 gives,
// checked as the logged prompt text and as prompt_tokens; the thinking switches; bad tool
// input is a 400.
//
//   node --test tests/serve/chat_v4.test.mjs
//
// The model is models/tandem-tiny with its three unused placeholder tokens renamed <think>,
// </think> and <｜latest_reminder｜> (in a temporary directory): the last makes the vocabulary
// V4's. ｜DSML｜ and <tool_result> stay plain text there. To make the model write a DSML block,
// its greedy answer's first tokens are given added tokens' texts (the ids it generates stay).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, raw, runTandem, tmpdir, waitFor, client, sseChunks, v4Model, MODEL, IS_TINY, BOS_TEXT, USER_TEXT, ASSISTANT_TEXT, EOS_TEXT } from './harness.mjs';

const T = { timeout: 60000, skip: IS_TINY ? false : 'needs models/tandem-tiny (its placeholder tokens)' };
let srv, dir;

before(async () => {
    if (!IS_TINY) return;
    dir = v4Model();
    srv = await startServer(['--model', dir, '--draft', 'none', '--set', 'log.log_requests=on', '--set', 'log.format=jsonl']);
}, { timeout: 90000 });

after(async () => {
    if (srv) assert.equal(await srv.stop(), 0);
}, { timeout: 40000 });

const SYS = 'You are a helpful assistant.';
const D = '｜DSML｜';
const chat = (body) => raw(srv.url, { method: 'POST', path: '/v1/chat/completions', body: { max_tokens: 2, temperature: 0, ...body } });

/* the prompt the server logged for its n-th request with this marker in it */
async function loggedPrompt(marker) {
    let found;
    await waitFor(() => {
        for (const line of srv.log().split('\n')) {
            if (!line.startsWith('{')) continue;
            const o = JSON.parse(line);
            if (o.event === 'request' && typeof o.prompt === 'string' && o.prompt.includes(marker)) found = o.prompt;
        }
        return found !== undefined;
    }, { what: `a logged prompt with ${marker}` });
    return found;
}

async function promptTokens(text) {
    const r = await runTandem(['tokenize', '--model', dir, '--text', text, '--no-special']);
    assert.equal(r.code, 0, r.stderr);
    return r.stdout.trim().split(/\s+/).length;
}

/* the request gets 200 and the prompt want, as text and as prompt_tokens */
async function expectPrompt(body, marker, want) {
    const r = await chat(body);
    assert.equal(r.status, 200, r.text);
    assert.equal(await loggedPrompt(marker), want);
    assert.equal(r.json().usage.prompt_tokens, await promptTokens(want), 'prompt_tokens = the rendered prompt, encoded whole');
    return r.json();
}

test('the V4 vocabulary is detected: /props says deepseek_v4', T, async () => {
    const r = await raw(srv.url, { path: '/props' });
    assert.equal(r.json().chat_format, 'deepseek_v4');
});

test('tools, tool_calls and tool results (re-ordered to call order) in chat mode', T, async () => {
    const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
    const body = {
        tools,
        tool_choice: 'auto',
        messages: [
            { role: 'system', content: SYS },
            { role: 'user', content: 'Weather in Paris and Rome? (m1)' },
            {
                role: 'assistant',
                content: null,
                tool_calls: [
                    { id: 'call_a', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } },
                    { id: 'call_b', type: 'function', function: { name: 'get_weather', arguments: { city: 'Rome', days: 2 } } },
                ],
            },
            { role: 'tool', tool_call_id: 'call_b', content: 'rainy' },
            { role: 'tool', tool_call_id: 'call_a', content: [{ type: 'text', text: 'sunny' }, { type: 'text', text: '21 C' }] },
        ],
    };
    const head =
        '\n\n## Tools\n\nYou have access to a set of tools to help answer the user\'s question. You can invoke tools by writing a "<' + D + 'tool_calls>" block like the following:\n\n' +
        `<${D}tool_calls>\n<${D}invoke name="$TOOL_NAME">\n<${D}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</${D}parameter>\n...\n</${D}invoke>\n` +
        `<${D}invoke name="$TOOL_NAME2">\n...\n</${D}invoke>\n</${D}tool_calls>\n\n` +
        'String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\n' +
        'If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n' +
        'Otherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n' +
        '{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}' +
        '\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n';
    const want =
        BOS_TEXT + SYS + head + USER_TEXT + 'Weather in Paris and Rome? (m1)' + ASSISTANT_TEXT + '</think>' +
        `\n\n<${D}tool_calls>\n<${D}invoke name="get_weather">\n<${D}parameter name="city" string="true">Paris</${D}parameter>\n</${D}invoke>\n` +
        `<${D}invoke name="get_weather">\n<${D}parameter name="city" string="true">Rome</${D}parameter>\n<${D}parameter name="days" string="false">2</${D}parameter>\n</${D}invoke>\n</${D}tool_calls>` +
        EOS_TEXT + USER_TEXT + '<tool_result>sunny\n\n21 C</tool_result>\n\n<tool_result>rainy</tool_result>' + ASSISTANT_TEXT + '</think>';
    await expectPrompt(body, '(m1)', want);
    // without a system message the tools come on one of their own, in front
    const r = await chat({ tools, messages: [{ role: 'user', content: 'Hi (m2)' }] });
    assert.equal(r.status, 200, r.text);
    assert.equal(await loggedPrompt('(m2)'), BOS_TEXT + head + USER_TEXT + 'Hi (m2)' + ASSISTANT_TEXT + '</think>');
});

test('thinking: earlier reasoning_content dropped, kept with drop_thinking false; reasoning_effort max', T, async () => {
    const messages = (m) => [
        { role: 'system', content: SYS },
        { role: 'user', content: 'hello' },
        { role: 'assistant', reasoning_content: 'The user greets me.', content: 'Hello! I am DeepSeek.' },
        { role: 'user', content: `1+1=? (${m})` },
    ];
    const turn1 = BOS_TEXT + SYS + USER_TEXT + 'hello' + ASSISTANT_TEXT;
    const j = await expectPrompt({ thinking: { type: 'enabled' }, messages: messages('m3') }, '(m3)',
        turn1 + '</think>Hello! I am DeepSeek.' + EOS_TEXT + USER_TEXT + '1+1=? (m3)' + ASSISTANT_TEXT + '<think>');
    assert.equal(typeof j.choices[0].message.reasoning_content, 'string', 'thinking on: the text before </think> is reasoning_content');
    await expectPrompt({ chat_template_kwargs: { thinking: true, drop_thinking: false }, messages: messages('m4') }, '(m4)',
        turn1 + '<think>The user greets me.</think>Hello! I am DeepSeek.' + EOS_TEXT + USER_TEXT + '1+1=? (m4)' + ASSISTANT_TEXT + '<think>');
    const p = await (async () => {
        const r = await chat({ chat_template_kwargs: { enable_thinking: true }, reasoning_effort: 'max', messages: [{ role: 'user', content: 'Think hard (m5)' }] });
        assert.equal(r.status, 200, r.text);
        return loggedPrompt('(m5)');
    })();
    assert.ok(p.startsWith(BOS_TEXT + 'Reasoning Effort: Absolute maximum with no shortcuts permitted.\n'), p);
    assert.ok(p.endsWith('unchecked.\n\n' + USER_TEXT + 'Think hard (m5)' + ASSISTANT_TEXT + '<think>'), p);
    // chat mode (the default) has no <think> and no effort paragraph
    await expectPrompt({ reasoning_effort: 'max', messages: [{ role: 'developer', content: 'Be brief. (m6)' }] }, '(m6)',
        BOS_TEXT + USER_TEXT + 'Be brief. (m6)' + ASSISTANT_TEXT + '</think>');
});

const BAD = [
    ['a tool result answering no call', [
        { role: 'user', content: 'x' },
        { role: 'assistant', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }] },
        { role: 'tool', tool_call_id: 'c9', content: 'r' },
    ], 'tool_call_id "c9" matches no tool call'],
    ['a tool result with no call before it', [{ role: 'tool', tool_call_id: 'c1', content: 'r' }], 'no assistant message with tool calls'],
    ['tool call arguments that are not JSON', [
        { role: 'user', content: 'x' },
        { role: 'assistant', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{"a": ' } }] },
    ], 'not valid JSON'],
    ['tool call arguments that are not an object', [
        { role: 'user', content: 'x' },
        { role: 'assistant', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: 5 } }] },
    ], "'arguments' must be a JSON object"],
    ['a tool call without a function name', [
        { role: 'user', content: 'x' },
        { role: 'assistant', tool_calls: [{ id: 'c1', type: 'function', function: { arguments: '{}' } }] },
    ], 'needs a "function" with a "name"'],
    ['an unknown role', [{ role: 'wizard', content: 'x' }], "role 'wizard' is not supported"],
    ['reasoning_content that is not a string', [{ role: 'user', content: 'x' }, { role: 'assistant', content: 'y', reasoning_content: 5 }], "'reasoning_content' must be a string"],
];
for (const [name, messages, want] of BAD) {
    test(`400 for ${name}`, T, async () => {
        const r = await chat({ messages });
        assert.equal(r.status, 400, r.text);
        assert.equal(r.json().error.type, 'invalid_request_error');
        assert.ok(r.json().error.message.includes(want), r.json().error.message);
    });
}

test('400 for tool_choice "required", tools that are not an array, tools on /v1/completions', T, async () => {
    const tools = [{ type: 'function', function: { name: 'f' } }];
    let r = await chat({ tools, tool_choice: 'required', messages: [{ role: 'user', content: 'x' }] });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json().error.param, 'tool_choice');
    r = await chat({ tools: { a: 1 }, messages: [{ role: 'user', content: 'x' }] });
    assert.equal(r.status, 400, r.text);
    r = await chat({ tools: [{ type: 'function' }], messages: [{ role: 'user', content: 'x' }] });
    assert.equal(r.status, 400, r.text);
    assert.ok(r.json().error.message.includes('no "function" object'), r.json().error.message);
    r = await raw(srv.url, { method: 'POST', path: '/v1/completions', body: { prompt: 'x', max_tokens: 2, tools } });
    assert.equal(r.status, 400, r.text);
    // and the server still answers
    r = await chat({ messages: [{ role: 'user', content: 'still there? (m7)' }] });
    assert.equal(r.status, 200, r.text);
});

test('thinking output: the text before a special </think> token is reasoning_content, after it content', T, async () => {
    // tandem-tiny answers "hello" with ", and all the earth, ...": with "," as </think> its
    // reasoning is empty and the rest is the answer (later "," tokens are </think> too: dropped)
    const s2 = await startServer(['--model', v4Model(true), '--draft', 'none']);
    try {
        const body = { messages: [{ role: 'user', content: 'hello' }], max_tokens: 8, temperature: 0, thinking: { type: 'enabled' } };
        const r = await raw(s2.url, { method: 'POST', path: '/v1/chat/completions', body });
        assert.equal(r.status, 200, r.text);
        const m = r.json().choices[0].message;
        assert.equal(m.reasoning_content, '', 'nothing before </think>');
        assert.ok(m.content.length > 0 && !m.content.includes('think>'), `content '${m.content}'`);
        const st = await raw(s2.url, { method: 'POST', path: '/v1/chat/completions', body: { ...body, stream: true } });
        let rc = '', c = '';
        for (const line of st.text.split('\n')) {
            if (!line.startsWith('data: {')) continue;
            const d = JSON.parse(line.slice(6)).choices[0]?.delta ?? {};
            rc += d.reasoning_content ?? '';
            c += d.content ?? '';
        }
        assert.deepEqual({ rc, c }, { rc: '', c: m.content }, 'streamed = not streamed');
    } finally {
        assert.equal(await s2.stop(), 0);
    }
});

// tandem-tiny answers "hello" (chat mode, greedy) with these ids ("imo: a kind of people
// living in the world"); given these texts they are a reply with a DSML tool call, and 664
// (a special token the decoder skips) ends it as EOS would, through stop_token_ids
const CALL_IDS = [322, 86, 33, 266, 1164, 277];
const CALL_TEXTS = [
    'Let me check.\n',
    `\n<${D}tool_calls>\n<${D}invoke name="get_weather">\n<${D}parameter name="city" string="true">`,
    'Paris',
    `</${D}parameter>\n<${D}parameter name="days" string="false">`,
    '[2, 3.50]',
    `</${D}parameter>\n</${D}invoke>\n</${D}tool_calls>`,
];
const STOP = { id: 664, content: '<｜stop▁here｜>', special: true };
const added = (texts) => CALL_IDS.map((id, i) => ({ id, content: texts[i] })).concat([STOP]);

test('tool calls: a DSML block in a V4 reply comes back as tool_calls, streamed or not', T, async () => {
    const s3 = await startServer(['--model', v4Model(false, added(CALL_TEXTS)), '--draft', 'none']);
    try {
        const ai = client(s3);
        const base = { model: s3.model, messages: [{ role: 'user', content: 'hello' }], temperature: 0, max_tokens: 16, stop_token_ids: [664] };
        const r = await ai.chat.completions.create(base);
        const ch = r.choices[0];
        assert.equal(ch.finish_reason, 'tool_calls', JSON.stringify(r));
        assert.equal(ch.message.content, 'Let me check.', 'the content is the text before the block');
        assert.equal(ch.message.tool_calls.length, 1);
        const tc = ch.message.tool_calls[0];
        assert.equal(tc.type, 'function');
        assert.equal(tc.id, `call_${r.id.slice('chatcmpl-'.length)}_0_0`);
        assert.equal(tc.function.name, 'get_weather');
        assert.equal(tc.function.arguments, '{"city": "Paris", "days": [2, 3.50]}', 'string values as JSON strings, others as written');
        assert.deepEqual(JSON.parse(tc.function.arguments), { city: 'Paris', days: [2, 3.5] });

        // streamed: the content as deltas, never a piece of the DSML, then the calls, then the end
        const st = await raw(s3.url, { method: 'POST', path: '/v1/chat/completions', body: { ...base, stream: true } });
        const { chunks, done, problems } = sseChunks(st.text);
        assert.deepEqual(problems, []);
        assert.ok(done, 'ends with [DONE]');
        let content = '';
        const calls = [];
        const finishes = [];
        for (const c of chunks) {
            const d = c.choices[0]?.delta ?? {};
            content += d.content ?? '';
            assert.ok(!(d.content ?? '').includes('DSML') && !(d.content ?? '').includes('\n'), `content delta ${JSON.stringify(d.content)}`);
            for (const t of d.tool_calls ?? []) calls.push(t);
            if (c.choices[0]?.finish_reason) finishes.push([c.choices[0].finish_reason, !!d.tool_calls]);
        }
        assert.equal(content, 'Let me check.');
        assert.deepEqual(calls.map((t) => ({ ...t, id: t.id.replace(/^call_[^_]+_/, 'call_X_') })), [
            { index: 0, id: 'call_X_0_0', type: 'function', function: { name: 'get_weather', arguments: tc.function.arguments } },
        ]);
        assert.deepEqual(finishes, [['tool_calls', false]], 'finish_reason in a chunk after the calls');

        // the SDK's stream helper assembles the same message
        const final = await ai.chat.completions.stream({ ...base, stream: true }).finalChatCompletion();
        assert.equal(final.choices[0].finish_reason, 'tool_calls');
        assert.equal(final.choices[0].message.content, 'Let me check.');
        assert.equal(final.choices[0].message.tool_calls[0].function.arguments, tc.function.arguments);

        // n = 2: each choice its calls, their ids distinct
        const two = await ai.chat.completions.create({ ...base, n: 2 });
        const ids = two.choices.map((c) => c.message.tool_calls?.[0]?.id);
        assert.equal(two.choices.filter((c) => c.finish_reason === 'tool_calls').length, 2);
        assert.equal(new Set(ids).size, 2, `ids ${ids}`);

        // tool_choice "none": the block stays text
        const none = await ai.chat.completions.create({ ...base, tool_choice: 'none' });
        assert.equal(none.choices[0].finish_reason, 'stop');
        assert.equal(none.choices[0].message.content, CALL_TEXTS.join(''));
        assert.equal(none.choices[0].message.tool_calls, undefined);
    } finally {
        assert.equal(await s3.stop(), 0);
    }
});

test('tool calls: no content before the block is null; a block cut short (max_tokens) or followed by text stays content, streamed alike', T, async () => {
    const texts = ['\n', ...CALL_TEXTS.slice(1)]; // the reply begins with the block
    const s3 = await startServer(['--model', v4Model(false, added(texts)), '--draft', 'none']);
    try {
        const ai = client(s3);
        const base = { model: s3.model, messages: [{ role: 'user', content: 'hello' }], temperature: 0 };
        const r = await ai.chat.completions.create({ ...base, max_tokens: 16, stop_token_ids: [664] });
        assert.equal(r.choices[0].finish_reason, 'tool_calls');
        assert.equal(r.choices[0].message.content, null, 'no text before the calls: null, as OpenAI');
        assert.equal(r.choices[0].message.tool_calls[0].function.name, 'get_weather');
        let streamed = '';
        for await (const c of await ai.chat.completions.create({ ...base, max_tokens: 16, stop_token_ids: [664], stream: true }))
            streamed += c.choices[0]?.delta?.content ?? '';
        assert.equal(streamed, '', 'nothing streams as content');
        const cases = [
            // the "\n" that may begin the mark held back, then released
            [{ max_tokens: 1 }, texts[0], 'length'],
            [{ max_tokens: 4 }, texts.slice(0, 4).join(''), 'length'],
            // the complete block, then 664 (skipped) and " living": text after a block is not a
            // reply the reference reads
            [{ max_tokens: 8 }, texts.join('') + ' living', 'length'],
        ];
        for (const [extra, want, finish] of cases) {
            const r = await ai.chat.completions.create({ ...base, ...extra });
            assert.equal(r.choices[0].message.content, want, JSON.stringify(extra));
            assert.equal(r.choices[0].finish_reason, finish);
            assert.equal(r.choices[0].message.tool_calls, undefined);
            let content = '';
            let fin = null;
            for await (const c of await ai.chat.completions.create({ ...base, ...extra, stream: true })) {
                const d = c.choices[0]?.delta ?? {};
                assert.equal(d.tool_calls, undefined);
                content += d.content ?? '';
                fin = c.choices[0]?.finish_reason ?? fin;
            }
            assert.deepEqual({ content, fin }, { content: want, fin: finish }, `streamed = not streamed (${JSON.stringify(extra)})`);
        }
        assert.ok(s3.log().includes('tool calls kept as text'), 'the failed read is logged');
    } finally {
        assert.equal(await s3.stop(), 0);
    }
});

test('tool calls in thinking mode: after the reasoning', T, async () => {
    // with "," as </think>, tandem-tiny thinks "" and answers "hello" with ids 294 422 269 1071
    const a = [
        { id: 294, content: 'Sure.' },
        { id: 422, content: `\n\n<${D}tool_calls>\n<${D}invoke name="f">\n<${D}parameter name="q" string="true">` },
        { id: 269, content: `x</${D}parameter>\n</${D}invoke>\n</${D}tool_calls>` },
        { id: 1071, content: '<｜stop▁here｜>', special: true },
    ];
    const s3 = await startServer(['--model', v4Model(true, a), '--draft', 'none']);
    try {
        const ai = client(s3);
        const body = { model: s3.model, messages: [{ role: 'user', content: 'hello' }], temperature: 0, max_tokens: 16, stop_token_ids: [1071], thinking: { type: 'enabled' } };
        const m = (await ai.chat.completions.create(body)).choices[0];
        assert.equal(m.finish_reason, 'tool_calls', JSON.stringify(m));
        assert.equal(m.message.reasoning_content, '');
        assert.equal(m.message.content, 'Sure.');
        assert.deepEqual(m.message.tool_calls.map((t) => t.function), [{ name: 'f', arguments: '{"q": "x"}' }]);
        const final = await ai.chat.completions.stream({ ...body, stream: true }).finalChatCompletion();
        assert.equal(final.choices[0].message.content, 'Sure.');
        assert.deepEqual(final.choices[0].message.tool_calls.map((t) => t.function), [{ name: 'f', arguments: '{"q": "x"}' }]);
    } finally {
        assert.equal(await s3.stop(), 0);
    }
});
