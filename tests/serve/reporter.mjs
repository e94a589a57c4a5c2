// tests/serve/reporter.mjs: a node:test reporter printing one line per test, as tests/run.sh
// counts them: "OK <name>", "FAIL <name>: <why>", "SKIP <name>[: why]". Names are
// "serve/<file stem>: <test name>". The full failure (message, stack) goes to stderr.
//
//   node --test --test-reporter=./tests/serve/reporter.mjs --test-reporter-destination=stdout FILES

import path from 'node:path';

const stem = (f) => (f ? path.basename(f).replace(/\.test\.mjs$/, '').replace(/\.mjs$/, '') : '?');
const oneLine = (s, max = 400) => {
    const t = String(s).replace(/\s*\n\s*/g, ' | ').trim();
    return t.length > max ? t.slice(0, max) + '...' : t;
};

function why(err) {
    if (!err) return 'failed';
    let e = err;
    // node:test wraps the test's error in ERR_TEST_FAILURE with the real one as cause
    while (e && e.code === 'ERR_TEST_FAILURE' && e.cause) e = e.cause;
    if (e && typeof e === 'object') {
        const msg = e.message ?? String(e);
        if (e.failureType === 'cancelledByParent') return 'cancelled (the file ended or an earlier hook failed)';
        return oneLine(msg || e.name || 'failed');
    }
    return oneLine(e);
}

export default async function* reporter(source) {
    for await (const ev of source) {
        const d = ev.data;
        if (ev.type === 'test:pass' || ev.type === 'test:fail') {
            if (d.details?.type === 'suite') continue; // describe() blocks: their tests report
            const name = `serve/${stem(d.file)}: ${d.name}`;
            if (ev.type === 'test:pass') {
                if (d.skip !== undefined && d.skip !== false) {
                    yield `SKIP ${name}${typeof d.skip === 'string' && d.skip ? ': ' + oneLine(d.skip) : ''}\n`;
                } else if (d.todo !== undefined && d.todo !== false) {
                    yield `SKIP ${name}: todo\n`;
                } else {
                    yield `OK ${name}\n`;
                }
            } else {
                const r = why(d.details?.error);
                yield `FAIL ${name}: ${r}\n`;
                let e = d.details?.error;
                while (e && e.code === 'ERR_TEST_FAILURE' && e.cause) e = e.cause;
                process.stderr.write(`--- FAIL ${name}\n${e?.stack ?? e?.message ?? e}\n`);
            }
        } else if (ev.type === 'test:stderr' || ev.type === 'test:stdout') {
            process.stderr.write(d.message);
        }
    }
}
