/* test_chat.c: the DeepSeek V4 chat encoding (tokenizer/chat_v4.c) against the strings the
 * reference encoding_dsv4.encode_messages gives for the same messages (released_formats.md 4.7),
 * and its refusals of bad input.
 *
 *   make build/tests/test_chat && build/tests/test_chat      (from the repo root)
 *
 * The V4 tokenizer is built here: DeepSeek's special tokens, <｜latest_reminder｜> and ｜DSML｜
 * among them, over the 256 byte-level characters and two merges ("\n\n", ".\n\n") with no
 * pre-tokenizer split, so a text is about one id per byte and a special token one id. Each
 * conversation must render to the expected string, and chat_encode must give exactly the ids of
 * that string encoded whole (HF's encode of the rendered prompt, without the post-processor):
 * encoding the layout's pieces one by one would split ".\n\n" where a message's text meets the
 * layout's. The same tokenizer without the V4 tokens is a V3 one.
 */
#include <jansson.h>

#include "check.h"
#include "model/fileio.h"
#include "tokenizer/chat.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#define BOS  "<｜begin▁of▁sentence｜>"
#define EOS  "<｜end▁of▁sentence｜>"
#define USER "<｜User｜>"
#define ASST "<｜Assistant｜>"
#define DSML "｜DSML｜"
#define SYS  "You are a helpful assistant."

static const char *specials[] = {BOS,       EOS,        USER, ASST,
                                 "<think>", "</think>", DSML, "<｜latest_reminder｜>"};
#define N_SPECIAL 8

/* GPT-2's byte -> character map, as ByteLevel uses it */
static uint32_t byte_char(int b) {
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return (uint32_t)b;
    int n = 0;
    for (int x = 0; x < b; x++)
        n += !((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF));
    return 256u + (uint32_t)n;
}

static void put(struct tok_buf *b, const char *s) {
    tok_buf_put(b, s, strlen(s));
}

/* with_v4 0: the same without <｜latest_reminder｜> and ｜DSML｜ (a V3 vocabulary) */
static struct tok *byte_tok(int with_v4) {
    struct tok_buf j = {0};
    char one[160];
    put(&j, "{\"model\":{\"type\":\"BPE\",\"merges\":[\"Ċ Ċ\",\". ĊĊ\"],\"vocab\":{"
            "\"ĊĊ\":264,\".ĊĊ\":265,");
    for (int i = 0; i < (with_v4 ? N_SPECIAL : N_SPECIAL - 2); i++) {
        snprintf(one, sizeof one, "\"%s\":%d,", specials[i], i);
        put(&j, one);
    }
    for (int b = 0; b < 256; b++) {
        char u[4];
        int k = tok_utf8_put(u, byte_char(b));
        int esc = b == '"' || b == '\\';
        snprintf(one, sizeof one, "\"%s%.*s\":%d%s", esc ? "\\" : "", k, u, N_SPECIAL + b,
                 b < 255 ? "," : "");
        put(&j, one);
    }
    put(&j, "}},\"added_tokens\":[");
    for (int i = 0; i < (with_v4 ? N_SPECIAL : N_SPECIAL - 2); i++) {
        snprintf(one, sizeof one, "%s{\"id\":%d,\"content\":\"%s\",\"special\":true}", i ? "," : "",
                 i, specials[i]);
        put(&j, one);
    }
    const char *tail = "],\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                       "\"use_regex\":false},\"decoder\":{\"type\":\"ByteLevel\"}}";
    put(&j, tail);
    const char *cfg = "{\"bos_token\":\"" BOS "\",\"eos_token\":\"" EOS "\"}";
    struct tok *t = NULL;
    char err[512];
    if (tok_load_mem(&t, j.p, j.n, cfg, err, sizeof err))
        fprintf(stderr, "v4 tokenizer: %s\n", err);
    tok_buf_free(&j);
    return t;
}

static const char *show(const char *s) {
    static char buf[4096];
    size_t o = 0;
    for (; s && *s && o + 8 < sizeof buf; s++) {
        if (*s == '\n')
            buf[o++] = '\\', buf[o++] = 'n';
        else
            buf[o++] = *s;
    }
    buf[o] = 0;
    return buf;
}

/* msgs render to want, and encode to the ids of want encoded whole */
static void expect(const struct chat *c, const char *name, const struct chat_msg *m, size_t n,
                   int gen, const char *want) {
    case_begin();
    char err[512] = "", cname[96];
    size_t len = 0;
    char *got = chat_render(c, m, n, gen, &len, err, sizeof err);
    CHECK(got && len == strlen(want) && !strcmp(got, want), "renders\n  '%s', not\n  '%s' %s",
          show(got), show(want), err);
    struct tok_ids ids = {0}, whole = {0};
    int rc = chat_encode(c, m, n, gen, &ids, err, sizeof err);
    CHECK(!rc, "chat_encode: %s", err);
    CHECK(!tok_encode(c->tok, want, strlen(want), 0, &whole, err, sizeof err), "%s", err);
    CHECK(ids.n == whole.n && !memcmp(ids.ids, whole.ids, ids.n * sizeof *ids.ids),
          "chat_encode gives %zu ids, the rendered text %zu", ids.n, whole.n);
    free(got);
    tok_ids_free(&ids);
    tok_ids_free(&whole);
    snprintf(cname, sizeof cname, "chat_v4_%s", name);
    case_end(cname, "");
}

/* msgs are refused with a message holding want, by chat_encode (out unchanged) and chat_render */
static void refuse(const struct chat *c, const char *name, const struct chat_msg *m, size_t n,
                   const char *want) {
    case_begin();
    char err[512] = "", err2[512] = "", cname[96];
    struct tok_ids ids = {0};
    tok_ids_push(&ids, 7);
    int rc = chat_encode(c, m, n, 1, &ids, err, sizeof err);
    CHECK(rc == -1 && ids.n == 1 && ids.ids[0] == 7, "chat_encode accepted it (rc %d, %zu ids)", rc,
          ids.n);
    CHECK(strstr(err, want), "message '%s' lacks '%s'", err, want);
    char *s = chat_render(c, m, n, 1, NULL, err2, sizeof err2);
    CHECK(!s && !strcmp(err, err2), "chat_render: %s, '%s'", s ? "accepted" : "refused", err2);
    free(s);
    tok_ids_free(&ids);
    snprintf(cname, sizeof cname, "chat_v4_refuses_%s", name);
    case_end(cname, err);
}

#define N(a) (sizeof(a) / sizeof *(a))

#define TOOLS_HEAD                                                                                 \
    "\n\n## Tools\n\nYou have access to a set of tools to help answer the user's question. You "   \
    "can invoke tools by writing a \"<" DSML "tool_calls>\" block like the following:\n\n<" DSML   \
    "tool_calls>\n<" DSML "invoke name=\"$TOOL_NAME\">\n<" DSML                                    \
    "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML             \
    "parameter>\n...\n</" DSML "invoke>\n<" DSML "invoke name=\"$TOOL_NAME2\">\n...\n</" DSML      \
    "invoke>\n</" DSML "tool_calls>\n\nString parameters should be specified as is and set "       \
    "`string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the "       \
    "value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered "  \
    "by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any "   \
    "tool calls or final response.\n\nOtherwise, output directly after </think> with tool "        \
    "calls or final response.\n\n### Available Tool Schemas\n\n"
#define TOOLS_TAIL                                                                                 \
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "    \
    "tool calls.\n"

static void test_turns(struct chat *c) {
    const struct chat_msg one[] = {{.role = CHAT_ROLE_SYSTEM, .content = SYS},
                                   {.role = CHAT_ROLE_USER, .content = "What is 2+2?"}};
    const struct chat_msg two[] = {{.role = CHAT_ROLE_SYSTEM, .content = SYS},
                                   {.role = CHAT_ROLE_USER, .content = "hello"},
                                   {.role = CHAT_ROLE_ASSISTANT,
                                    .reasoning = "The user greets me.",
                                    .content = "Hello! I am DeepSeek."},
                                   {.role = CHAT_ROLE_USER, .content = "1+1=?"}};
    c->think = CHAT_THINK_OFF;
    expect(c, "chat_one_turn", one, N(one), 1, BOS SYS USER "What is 2+2?" ASST "</think>");
    expect(c, "chat_second_turn", two, N(two), 1,
           BOS SYS USER "hello" ASST "</think>Hello! I am DeepSeek." EOS USER "1+1=?" ASST
                        "</think>");
    // without a generation prompt the last user turn stays open
    expect(c, "chat_no_generation_prompt", one, N(one), 0, BOS SYS USER "What is 2+2?");
    c->think = CHAT_THINK_ON;
    expect(c, "thinking_one_turn", one, N(one), 1, BOS SYS USER "What is 2+2?" ASST "<think>");
    // the earlier answer keeps its text, not its reasoning; its user turn closes the thinking
    expect(c, "thinking_second_turn_drops_reasoning", two, N(two), 1,
           BOS SYS USER "hello" ASST "</think>Hello! I am DeepSeek." EOS USER "1+1=?" ASST
                        "<think>");
    c->drop_thinking = 0;
    expect(c, "thinking_drop_thinking_off", two, N(two), 1,
           BOS SYS USER "hello" ASST
                        "<think>The user greets me.</think>Hello! I am DeepSeek." EOS USER
                        "1+1=?" ASST "<think>");
    c->drop_thinking = 1;
    // the answer after the last user turn keeps its reasoning
    const struct chat_msg done[] = {
        {.role = CHAT_ROLE_USER, .content = "hi"},
        {.role = CHAT_ROLE_ASSISTANT, .reasoning = "greet", .content = "Hello."}};
    expect(c, "thinking_last_answer_keeps_reasoning", done, N(done), 1,
           BOS USER "hi" ASST "<think>greet</think>Hello." EOS);
    c->effort = CHAT_EFFORT_MAX;
    expect(c, "reasoning_effort_max", one, N(one), 1,
           BOS "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be "
               "very thorough in your thinking and comprehensively decompose the problem to "
               "resolve the root cause, rigorously stress-testing your logic against all "
               "potential paths, edge cases, and adversarial scenarios.\nExplicitly write out "
               "your entire deliberation process, documenting every intermediate step, "
               "considered alternative, and rejected hypothesis to ensure absolutely no "
               "assumption is left unchecked.\n\n" SYS USER "What is 2+2?" ASST "<think>");
    c->think = CHAT_THINK_OFF; // the paragraph belongs to thinking mode only
    expect(c, "reasoning_effort_max_chat_mode", one, N(one), 1,
           BOS SYS USER "What is 2+2?" ASST "</think>");
    c->effort = CHAT_EFFORT_HIGH;
}

static void test_tools(struct chat *c) {
    // released_formats.md 4.7's example: a call in DSML, its result in the next user turn
    const struct chat_tool_call paris[] = {
        {.id = "call_1", .name = "get_weather", .arguments = "{\"city\": \"Paris\"}"}};
    const struct chat_msg call[] = {
        {.role = CHAT_ROLE_SYSTEM, .content = SYS},
        {.role = CHAT_ROLE_USER, .content = "What's the weather in Paris?"},
        {.role = CHAT_ROLE_ASSISTANT, .content = "", .tool_calls = paris, .n_tool_calls = 1},
        {.role = CHAT_ROLE_TOOL, .tool_call_id = "call_1", .content = "{\"temp\": 21}"}};
    c->think = CHAT_THINK_OFF;
    expect(c, "tool_call_and_result", call, N(call), 1,
           BOS SYS USER "What's the weather in Paris?" ASST "</think>\n\n<" DSML
                        "tool_calls>\n<" DSML "invoke name=\"get_weather\">\n<" DSML
                        "parameter name=\"city\" string=\"true\">Paris</" DSML "parameter>\n</" DSML
                        "invoke>\n</" DSML "tool_calls>" EOS USER
                        "<tool_result>{\"temp\": 21}</tool_result>" ASST "</think>");
    // two results given in the other order come back in call order; the user's text after
    // them joins the same turn; non-string arguments are written as json.dumps writes them
    const struct chat_tool_call both[] = {
        {.id = "call_a", .name = "get_weather", .arguments = "{\"city\":\"Paris\",\"days\":2}"},
        {.id = "call_b",
         .name = "get_time",
         .arguments = "{ \"zone\" : \"CET\", \"dst\": true, \"at\": {\"h\": 12.50, \"tags\": "
                      "[\"a\",null]} }"}};
    const struct chat_msg two[] = {
        {.role = CHAT_ROLE_SYSTEM, .content = SYS},
        {.role = CHAT_ROLE_USER, .content = "Weather and time in Paris?"},
        {.role = CHAT_ROLE_ASSISTANT,
         .content = "Checking.",
         .tool_calls = both,
         .n_tool_calls = 2},
        {.role = CHAT_ROLE_TOOL, .tool_call_id = "call_b", .content = "12:00"},
        {.role = CHAT_ROLE_TOOL, .tool_call_id = "call_a", .content = "sunny"},
        {.role = CHAT_ROLE_USER, .content = "Thanks. Dress code?"}};
    expect(c, "tool_results_in_call_order", two, N(two), 1,
           BOS SYS USER "Weather and time in Paris?" ASST "</think>Checking.\n\n<" DSML
                        "tool_calls>\n<" DSML "invoke name=\"get_weather\">\n<" DSML
                        "parameter name=\"city\" string=\"true\">Paris</" DSML "parameter>\n<" DSML
                        "parameter name=\"days\" string=\"false\">2</" DSML "parameter>\n</" DSML
                        "invoke>\n<" DSML "invoke name=\"get_time\">\n<" DSML
                        "parameter name=\"zone\" string=\"true\">CET</" DSML "parameter>\n<" DSML
                        "parameter name=\"dst\" string=\"false\">true</" DSML "parameter>\n<" DSML
                        "parameter name=\"at\" string=\"false\">{\"h\": 12.5, \"tags\": [\"a\", "
                        "null]}</" DSML "parameter>\n</" DSML "invoke>\n</" DSML
                        "tool_calls>" EOS USER
                        "<tool_result>sunny</tool_result>\n\n<tool_result>12:00</tool_result>\n\n"
                        "Thanks. Dress code?" ASST "</think>");
    // an empty name and an empty string (a document whose strings are all empty: the fuzzer's
    // find, an offset taken from a NULL buffer)
    const struct chat_tool_call empty[] = {{.id = "c", .name = "f", .arguments = "{\"\": \"\"}"}};
    const struct chat_msg em[] = {
        {.role = CHAT_ROLE_USER, .content = "U"},
        {.role = CHAT_ROLE_ASSISTANT, .tool_calls = empty, .n_tool_calls = 1}};
    expect(c, "tool_call_empty_strings", em, N(em), 0,
           BOS USER "U" ASST "</think>\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n<" DSML
                    "parameter name=\"\" string=\"true\"></" DSML "parameter>\n</" DSML
                    "invoke>\n</" DSML "tool_calls>" EOS);
    // a system message with tools gets the Tools section, one json.dumps line per function
    const char *tools =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"
        "\"Weather \\\"now\\\" in a city (\\u00e9)\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\","
        "\"minimum\":1,\"maximum\":1e1}},\"required\":[\"city\"]}}}]";
#define SCHEMA                                                                                     \
    "{\"name\": \"get_weather\", \"description\": \"Weather \\\"now\\\" in a city (é)\", "        \
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, "   \
    "\"days\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 10.0}}, \"required\": "        \
    "[\"city\"]}}"
    const struct chat_msg sys[] = {{.role = CHAT_ROLE_SYSTEM, .content = SYS, .tools = tools},
                                   {.role = CHAT_ROLE_USER, .content = "What is 2+2?"}};
    expect(c, "system_with_tools", sys, N(sys), 1,
           BOS SYS TOOLS_HEAD SCHEMA TOOLS_TAIL USER "What is 2+2?" ASST "</think>");
    // tools keep every reasoning in thinking mode (drop_thinking is turned off)
    const struct chat_msg keep[] = {{.role = CHAT_ROLE_SYSTEM, .content = SYS, .tools = tools},
                                    {.role = CHAT_ROLE_USER, .content = "hello"},
                                    {.role = CHAT_ROLE_ASSISTANT,
                                     .reasoning = "The user greets me.",
                                     .content = "Hello! I am DeepSeek."},
                                    {.role = CHAT_ROLE_USER, .content = "1+1=?"}};
    c->think = CHAT_THINK_ON;
    expect(c, "tools_keep_reasoning", keep, N(keep), 1,
           BOS SYS TOOLS_HEAD SCHEMA TOOLS_TAIL USER
           "hello" ASST "<think>The user greets me.</think>Hello! I am DeepSeek." EOS USER
           "1+1=?" ASST "<think>");
    // an empty tools array is no tools: nothing rendered, reasoning still dropped
    const struct chat_msg none[] = {
        {.role = CHAT_ROLE_SYSTEM, .content = SYS, .tools = " [ ] "}, two[1], keep[2], keep[3]};
    expect(c, "empty_tools", none, N(none), 1,
           BOS SYS USER "Weather and time in Paris?" ASST "</think>Hello! I am DeepSeek." EOS USER
                        "1+1=?" ASST "<think>");
    c->think = CHAT_THINK_OFF;
}

/* argument values other than strings are written as json.dumps writes them: ints verbatim,
 * floats as Python's repr, only '"', '\\' and control characters escaped */
static void test_json_values(struct chat *c) {
    const struct chat_tool_call f[] = {
        {.id = "c",
         .name = "f",
         .arguments =
             "{\"a\": 1e15, \"b\": 1e16, \"c\": 0.0001, \"d\": 0.00001, \"e\": -0.0, \"f\": "
             "2.5e-7, \"g\": 1E400, \"h\": 123456789012345678901234567890, \"i\": -0, "
             "\"j\": 0.1, \"k\": [1.0, 100.0e-2, 1.7976931348623157e308, 5e-324, "
             "-1.5E+3], \"l\": {\"s\": \"\\u00e9\\ud83d\\ude00\\n\\t\\\"\\\\\\/\\u0001"
             "\\u007f\"}, \"m\": \"raw \\\"v\\\"\"}"}};
    const struct chat_msg m[] = {{.role = CHAT_ROLE_USER, .content = "x"},
                                 {.role = CHAT_ROLE_ASSISTANT, .tool_calls = f, .n_tool_calls = 1}};
#define P(k, v) "<" DSML "parameter name=\"" k "\" string=\"false\">" v "</" DSML "parameter>\n"
    c->think = CHAT_THINK_OFF;
    expect(c, "json_values_as_python_writes_them", m, N(m), 1,
           BOS USER
           "x" ASST "</think>\n\n<" DSML "tool_calls>\n<" DSML
           "invoke name=\"f\">\n" P("a", "1000000000000000.0") P("b", "1e+16") P("c", "0.0001") P(
               "d", "1e-05") P("e", "-0.0") P("f", "2.5e-07") P("g", "Infinity")
               P("h", "123456789012345678901234567890") P("i", "0") P("j", "0.1") P(
                   "k", "[1.0, 1.0, 1.7976931348623157e+308, 5e-324, -1500.0]")
                   P("l",
                     "{\"s\": \"é😀\\n\\t\\\"\\\\/\\u0001\x7f\"}") "<" DSML "parameter name=\"m\" "
                                                                  "string=\"true\">raw \"v\"</" DSML
                                                                  "parameter>\n</" DSML
                                                                  "invoke>\n</" DSML
                                                                  "tool_calls>" EOS);
#undef P
}

static void test_developer_reminder(struct chat *c) {
    const struct chat_msg dev[] = {
        {.role = CHAT_ROLE_SYSTEM, .content = SYS},
        {.role = CHAT_ROLE_LATEST_REMINDER, .content = "2026-02-21, Paris"},
        {.role = CHAT_ROLE_DEVELOPER, .content = "Cite sources."},
        {.role = CHAT_ROLE_ASSISTANT, .reasoning = "r1", .content = "a1"},
        {.role = CHAT_ROLE_USER, .content = "More?"}};
    c->think = CHAT_THINK_OFF;
    expect(c, "developer_and_latest_reminder", dev, 3, 1,
           BOS SYS "<｜latest_reminder｜>2026-02-21, Paris" USER "Cite sources." ASST "</think>");
    // thinking mode drops a developer turn before the last user turn entirely (the answer to
    // it stays, without its <｜Assistant｜>), as the reference does
    c->think = CHAT_THINK_ON;
    expect(c, "developer_dropped_before_last_user", dev, N(dev), 1,
           BOS SYS "<｜latest_reminder｜>2026-02-21, Parisa1" EOS USER "More?" ASST "<think>");
    c->drop_thinking = 0;
    expect(c, "developer_kept_without_drop_thinking", dev, N(dev), 1,
           BOS SYS "<｜latest_reminder｜>2026-02-21, Paris" USER "Cite sources." ASST
                   "<think>r1</think>a1" EOS USER "More?" ASST "<think>");
    c->drop_thinking = 1;
    // a reminder after the last user turn comes after that turn's <｜Assistant｜>
    const struct chat_msg late[] = {{.role = CHAT_ROLE_USER, .content = "Hi"},
                                    {.role = CHAT_ROLE_LATEST_REMINDER, .content = "R"}};
    expect(c, "reminder_after_user", late, N(late), 1,
           BOS USER "Hi" ASST "<think><｜latest_reminder｜>R");
    c->think = CHAT_THINK_OFF;
}

static void test_refusals(struct chat *c) {
    const struct chat_tool_call paris[] = {
        {.id = "call_1", .name = "get_weather", .arguments = "{\"city\": \"Paris\"}"},
        {.id = "call_2", .name = "get_time", .arguments = "{}"}};
    struct chat_msg m[] = {{.role = CHAT_ROLE_USER, .content = "Weather?"},
                           {.role = CHAT_ROLE_ASSISTANT, .tool_calls = paris, .n_tool_calls = 1},
                           {.role = CHAT_ROLE_TOOL, .tool_call_id = "call_9", .content = "sunny"}};
    refuse(c, "unmatched_tool_result", m, 3,
           "message 2 (tool): tool_call_id \"call_9\" matches no tool call of message 1");
    refuse(c, "tool_result_without_call", (struct chat_msg[]){m[0], m[2]}, 2,
           "message 1 (tool): no assistant message with tool calls comes before");
    // a result answers the latest assistant message with calls, not an earlier one
    const struct chat_tool_call later[] = {{.id = "call_3", .name = "f", .arguments = "{}"}};
    const struct chat_msg stale[] = {
        m[0],
        m[1],
        {.role = CHAT_ROLE_TOOL, .tool_call_id = "call_1", .content = "sunny"},
        {.role = CHAT_ROLE_ASSISTANT, .tool_calls = later, .n_tool_calls = 1},
        {.role = CHAT_ROLE_TOOL, .tool_call_id = "call_1", .content = "again"}};
    refuse(c, "result_for_an_earlier_call", stale, N(stale),
           "message 4 (tool): tool_call_id \"call_1\" matches no tool call of message 3");
    m[1].n_tool_calls = 2;
    m[2].tool_call_id = NULL;
    refuse(c, "tool_result_without_id", m, 3,
           "message 2 (tool): no tool_call_id, and message 1 made 2 tool calls");
    m[2].tool_call_id = "call_1";
    const struct {
        const char *name, *args, *want;
    } bad_args[] = {
        {.name = "unterminated_arguments",
         .args = "{\"city\": \"Paris\"",
         .want = "message 1: tool call 0 arguments: not valid JSON: ',' or '}' was expected at "
                 "byte 16"},
        {.name = "arguments_not_an_object",
         .args = "[\"Paris\"]",
         .want = "tool call 0 arguments: a JSON object was expected"},
        {.name = "arguments_duplicate_key",
         .args = "{\"a\": 1, \"b\": 2, \"a\": 3}",
         .want = "the key \"a\" appears twice"},
        {.name = "arguments_lone_surrogate",
         .args = "{\"a\": \"\\ud800\"}",
         .want = "a lone high surrogate"},
        {.name = "arguments_trailing_text", .args = "{} x", .want = "text after the value"},
        {.name = "arguments_nan", .args = "{\"a\": NaN}", .want = "a value was expected"},
        {.name = "arguments_missing", .args = NULL, .want = "none given"},
    };
    struct chat_tool_call one[1] = {{.id = "call_1", .name = "get_weather"}};
    m[1].tool_calls = one;
    m[1].n_tool_calls = 1;
    for (size_t i = 0; i < N(bad_args); i++) {
        one[0].arguments = bad_args[i].args;
        refuse(c, bad_args[i].name, m, 3, bad_args[i].want);
    }
    one[0].arguments = "{}";
    one[0].name = "";
    refuse(c, "tool_call_without_name", m, 3, "message 1: tool call 0 has no name");
    one[0].name = "get_weather";
    struct chat_msg odd[] = {{.role = (enum chat_role)42, .content = "x"}};
    refuse(c, "unknown_role", odd, 1, "message 0: unknown role 42");
    struct chat_msg sys[] = {{.role = CHAT_ROLE_SYSTEM, .content = "S", .tools = "{\"a\": 1}"},
                             {.role = CHAT_ROLE_USER, .content = "U"}};
    refuse(c, "tools_not_an_array", sys, 2, "message 0: tools: not a JSON array");
    sys[0].tools = "[{\"type\": \"function\", \"name\": \"f\"}]";
    refuse(c, "tool_without_function", sys, 2, "message 0: tools[0]: no \"function\" object");
    sys[0].tools = "[{\"function\": {\"name\": \"f\"}}";
    refuse(c, "tools_invalid_json", sys, 2, "message 0: tools: not valid JSON");
    sys[0].tools = NULL;
    sys[1].tools = "[]";
    refuse(c, "tools_on_user", sys, 2, "message 1 (user): tools go on a system or developer");
    struct chat_msg dev[] = {{.role = CHAT_ROLE_DEVELOPER, .content = ""}};
    refuse(c, "empty_developer", dev, 1, "message 0 (developer): the content is empty");
    struct chat_msg user_calls[] = {
        {.role = CHAT_ROLE_USER, .content = "U", .tool_calls = paris, .n_tool_calls = 1}};
    refuse(c, "tool_calls_on_user", user_calls, 1, "only an assistant makes tool calls");
    struct chat_msg bad_utf8[] = {{.role = CHAT_ROLE_USER, .content = "ok \xff"}};
    refuse(c, "invalid_utf8", bad_utf8, 1, "message 0: the content is not valid UTF-8 (byte 3)");
}

// ---------------------------------------------------------------------------------------------
// the way back: a reply's DSML tool calls (chat_parse_calls)

/* the reply the model would write for an assistant message: its rendering after the last
 * "</think>" of the conversation, less the EOS (malloc'd) */
static char *reply_of(const struct chat *c, const struct chat_msg *a) {
    const struct chat_msg m[] = {{.role = CHAT_ROLE_USER, .content = "x"}, *a};
    char err[512];
    char *s = chat_render(c, m, 2, 0, NULL, err, sizeof err), *r = NULL;
    const char *t = NULL;
    for (const char *q = s; q && (q = strstr(q, "</think>")); q++)
        t = q + strlen("</think>");
    size_t n = t ? strlen(t) : 0;
    if (t && n >= strlen(EOS) && !strcmp(t + n - strlen(EOS), EOS)) r = strndup(t, n - strlen(EOS));
    if (!r) fprintf(stderr, "reply_of: %s\n", s ? show(s) : err);
    free(s);
    return r;
}

/* two JSON texts hold the same value (jansson's json_equal) */
static int same_json(const char *a, const char *b) {
    const size_t f = JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL;
    json_t *x = json_loads(a, f, NULL), *y = json_loads(b, f, NULL);
    int eq = x && y && json_equal(x, y);
    json_decref(x);
    json_decref(y);
    return eq;
}

/* encode calls with the encoder, parse the reply back: the same content, names and arguments
 * (as JSON values; as text too when the input is spelled as json.dumps spells it, exact 1) */
static void round_trip(const struct chat *c, const char *name, const char *content,
                       const struct chat_tool_call *tc, size_t n, int exact) {
    case_begin();
    const struct chat_msg a = {
        .role = CHAT_ROLE_ASSISTANT, .content = content, .tool_calls = tc, .n_tool_calls = n};
    char *reply = reply_of(c, &a), err[512] = "", cname[96];
    struct chat_reply r;
    int rc = reply ? chat_parse_calls(reply, strlen(reply), &r, err, sizeof err) : -2;
    CHECK(rc == 1, "rc %d: %s (reply '%s')", rc, err, show(reply));
    CHECK(rc != 1 || (r.content_len == strlen(content) && !memcmp(reply, content, r.content_len)),
          "content '%.*s'", (int)r.content_len, reply);
    CHECK(rc != 1 || r.n_calls == n, "%zu calls, not %zu", r.n_calls, n);
    for (size_t i = 0; rc == 1 && i < n && i < r.n_calls; i++) {
        CHECK(!strcmp(r.calls[i].name, tc[i].name), "call %zu is named '%s'", i, r.calls[i].name);
        CHECK(same_json(r.calls[i].arguments, tc[i].arguments), "call %zu: arguments %s, not %s", i,
              r.calls[i].arguments, tc[i].arguments);
        CHECK(!exact || !strcmp(r.calls[i].arguments, tc[i].arguments),
              "call %zu: arguments spelled %s, not %s", i, r.calls[i].arguments, tc[i].arguments);
    }
    if (rc == 1) chat_reply_free(&r);
    free(reply);
    snprintf(cname, sizeof cname, "dsml_round_trip_%s", name);
    case_end(cname, "");
}

#define CALLS(body)          "\n\n<" DSML "tool_calls>\n" body "\n</" DSML "tool_calls>"
#define INVOKE(name, params) "<" DSML "invoke name=\"" name "\">\n" params "\n</" DSML "invoke>"
#define PARAM(k, str, v)                                                                           \
    "<" DSML "parameter name=\"" k "\" string=\"" str "\">" v "</" DSML "parameter>"

/* text[0, n) is refused (-1, why holds want) and left whole as content */
static void refuse_reply_n(const char *name, const char *text, size_t n, const char *want) {
    case_begin();
    struct chat_reply r;
    char err[512] = "", cname[96];
    int rc = chat_parse_calls(text, n, &r, err, sizeof err);
    CHECK(rc == -1, "rc %d", rc);
    CHECK(r.content_len == n && !r.n_calls && !r.calls && !r.buf,
          "content %zu of %zu bytes, %zu calls", r.content_len, n, r.n_calls);
    CHECK(strstr(err, want), "message '%s' lacks '%s'", err, want);
    if (rc == 1) chat_reply_free(&r);
    snprintf(cname, sizeof cname, "dsml_refuses_%s", name);
    case_end(cname, err);
}

static void refuse_reply(const char *name, const char *text, const char *want) {
    refuse_reply_n(name, text, strlen(text), want);
}

static void test_parse_calls(struct chat *c) {
    c->think = CHAT_THINK_OFF;
    const struct chat_tool_call one[] = {
        {.id = "a", .name = "get_weather", .arguments = "{\"city\": \"Paris\", \"days\": 2}"}};
    round_trip(c, "one_call", "", one, 1, 1);
    round_trip(c, "content_before_the_block", "Let me check.\n\nOne moment.", one, 1, 1);
    // every JSON type, strings with quotes, newlines, DSML-looking text and non-ASCII, an empty
    // object, numbers as the model spelled them (12.50 is written 12.5 by the encoder)
    const struct chat_tool_call many[] = {
        {.id = "a", .name = "get_weather", .arguments = "{\"city\": \"Paris\", \"days\": 2}"},
        {.id = "b", .name = "noop", .arguments = "{}"},
        {.id = "c",
         .name = "mixed",
         .arguments =
             "{\"s\": \"a \\\"q\\\"\\nline\\t<" DSML "invoke name=\\\"x\\\">é😀\", "
             "\"n\": -1.5e-07, \"big\": 123456789012345678901234567890, \"t\": true, "
             "\"f\": false, \"z\": null, \"arr\": [1, \"two\", [3.0], {}], "
             "\"obj\": {\"k\": {\"v\": [null]}}, \"empty\": \"\", \"j\": \"{\\\"x\\\": 1}\"}"},
        {.id = "d", .name = "f", .arguments = "{ \"h\": 12.50, \"u\": \"\\u0001\" }"}};
    round_trip(c, "four_calls_every_json_type", "Checking.", many, 4, 0);
    round_trip(c, "three_calls_spelled_as_json_dumps", "", many, 3, 1);
    // no block: the whole text is content
    case_begin();
    struct chat_reply r;
    char err[512] = "";
    const char *plain =
        "Hello.\n\n<" DSML "tool_callsX"; // not the mark ("\n\n<" DSML "tool_calls")
    int rc = chat_parse_calls(plain, 10, &r, err, sizeof err);
    CHECK(rc == 0 && r.content_len == 10 && !r.n_calls, "rc %d, content %zu", rc, r.content_len);
    rc = chat_parse_calls("", 0, &r, err, sizeof err);
    CHECK(rc == 0 && r.content_len == 0 && !r.n_calls, "empty text: rc %d", rc);
    case_end("dsml_no_block_is_all_content", "");
    // every prefix of a complete reply that cuts into its block is refused, whole as content
    case_begin();
    char *reply = reply_of(c, &(struct chat_msg){.role = CHAT_ROLE_ASSISTANT,
                                                 .content = "Checking.",
                                                 .tool_calls = many,
                                                 .n_tool_calls = 4});
    size_t n = reply ? strlen(reply) : 0, mark = strlen("Checking.") + strlen(CHAT_V4_CALLS_MARK);
    CHECK(reply && chat_parse_calls(reply, n, &r, err, sizeof err) == 1, "the whole: %s", err);
    if (reply && r.n_calls) chat_reply_free(&r);
    size_t bad = 0;
    for (size_t k = 0; reply && k < n; k++) {
        char *cut = strndup(reply, k); // its own allocation: a read past k is ASan's to find
        rc = chat_parse_calls(cut, k, &r, err, sizeof err);
        if (rc != (k < mark ? 0 : -1) || r.content_len != k || r.n_calls) {
            if (!bad)
                case_fail("the first %zu of %zu bytes: rc %d, content %zu", k, n, rc,
                          r.content_len);
            bad++;
        }
        if (rc == 1) chat_reply_free(&r);
        free(cut);
    }
    free(reply);
    char extra[64];
    snprintf(extra, sizeof extra, "(%zu prefixes)", n);
    case_end("dsml_truncated_blocks_are_content", extra);
    // what the parser refuses
    refuse_reply("not_json", "x" CALLS(INVOKE("f", PARAM("n", "false", "{oops"))),
                 "the parameter \"n\" (string=\"false\") is not valid JSON");
    refuse_reply("empty_non_string", CALLS(INVOKE("f", PARAM("n", "false", ""))),
                 "is not valid JSON");
    refuse_reply("two_values", CALLS(INVOKE("f", PARAM("n", "false", "1 2"))), "not valid JSON");
    // a NUL byte inside a non-string value (the fuzzer's find: jansson read past it, and the
    // arguments, a C string, ended there)
    static const char nul[] = CALLS(INVOKE("f", PARAM("n", "false", "[2\0, 3]")));
    refuse_reply_n("nul_in_non_string", nul, sizeof nul - 1, "it holds a NUL byte");
    refuse_reply("duplicate_parameter",
                 CALLS(INVOKE("f", PARAM("a", "true", "1") "\n" PARAM("a", "false", "2"))),
                 "call 0: the parameter \"a\" is given twice");
    refuse_reply("text_after_the_block", CALLS(INVOKE("f", PARAM("a", "true", "1"))) "\nmore",
                 "5 bytes of text follow the tool_calls block");
    refuse_reply("no_string_attribute",
                 CALLS(INVOKE("f", "<" DSML "parameter name=\"a\">1</" DSML "parameter>")),
                 "has no string=\"true\" or string=\"false\"");
    refuse_reply("string_attribute_other", CALLS(INVOKE("f", PARAM("a", "yes", "1"))),
                 "has no string=");
    refuse_reply("blank_line_before_invoke",
                 "\n\n<" DSML "tool_calls>\n\n" INVOKE("f", "") "\n</" DSML "tool_calls>",
                 "\">\" and a newline were expected at byte 23");
    refuse_reply("no_newline_between_parameters",
                 CALLS(INVOKE("f", PARAM("a", "true", "1") PARAM("b", "true", "2"))),
                 "call 0: \">\" and a newline were expected");
    refuse_reply("empty_block", "\n\n<" DSML "tool_calls>\n</" DSML "tool_calls>",
                 "holds no invoke");
    refuse_reply("invoke_without_name", CALLS("<" DSML "invoke>\n</" DSML "invoke>"),
                 "call 0 (byte ");
    refuse_reply("invoke_empty_name", CALLS(INVOKE("", "")), "is not ' name=\"NAME\">'");
    refuse_reply("second_call_bad", CALLS(INVOKE("f", "") "\n<" DSML "invoke name=\"g\">"),
                 "call 1 (byte ");
    refuse_reply("parameter_without_end",
                 CALLS(INVOKE("f", "<" DSML "parameter name=\"a\" string=\"true\">1")),
                 "call 0: a parameter does not end");
    refuse_reply("value_not_utf8", CALLS(INVOKE("f", PARAM("a", "true", "\xff"))), "not UTF-8");
    refuse_reply("name_not_utf8", CALLS(INVOKE("f\xc3", "")), "is not ' name=");
    const char nul_name[] = CALLS(INVOKE("f\0g", "")),
               nul_key[] = CALLS(INVOKE("h", PARAM("a\0b", "true", "1")));
    refuse_reply_n("nul_in_a_name", nul_name, sizeof nul_name - 1, "call 0 (byte ");
    refuse_reply_n("nul_in_a_key", nul_key, sizeof nul_key - 1, "or its name holds NUL");
    refuse_reply("unclosed_block", "Hi" CALLS(INVOKE("f", "")) "\n<" DSML "tool_calls>",
                 "follow the tool_calls block");
    // a name's line may carry the reference's extra newline; string="false" strings and big
    // numbers stay as written
    case_begin();
    const char *ok = "Sure." CALLS(
        INVOKE("f", PARAM("s", "false", " \"v\" ") "\n" PARAM("n", "false", "1e2") "\n" PARAM(
                        "k", "false", "18446744073709551616")));
    rc = chat_parse_calls(ok, strlen(ok), &r, err, sizeof err);
    CHECK(rc == 1 && r.content_len == 5 && r.n_calls == 1, "rc %d: %s", rc, err);
    CHECK(rc != 1 || !strcmp(r.calls[0].arguments,
                             "{\"s\": \"v\", \"n\": 1e2, \"k\": 18446744073709551616}"),
          "arguments %s", r.calls[0].arguments);
    if (rc == 1) chat_reply_free(&r);
    case_end("dsml_values_verbatim", "");
}

/* special-token strings inside a message stay text with TOK_ENCODE_SPECIAL_AS_TEXT; the
 * layout's own tokens do not */
static void test_special_as_text(struct chat *c) {
    case_begin();
    const struct chat_msg m[] = {{.role = CHAT_ROLE_USER, .content = "<think>"}};
    struct tok_ids ids = {0};
    char err[512];
    c->think = CHAT_THINK_ON;
    c->encode_flags = TOK_ENCODE_SPECIAL_AS_TEXT;
    CHECK(!chat_encode(c, m, 1, 1, &ids, err, sizeof err), "%s", err);
    int32_t want[] = {0, 2}, think = 4; // BOS, <｜User｜>, then "<think>" as 7 bytes
    CHECK(ids.n == 2 + 7 + 2 && !memcmp(ids.ids, want, sizeof want) && ids.ids[2] != think &&
              ids.ids[9] == 3 && ids.ids[10] == think,
          "%zu ids", ids.n);
    c->encode_flags = 0;
    ids.n = 0;
    CHECK(!chat_encode(c, m, 1, 1, &ids, err, sizeof err) && ids.n == 5 && ids.ids[2] == think,
          "without the flag: %zu ids", ids.n);
    c->think = CHAT_THINK_OFF;
    tok_ids_free(&ids);
    case_end("chat_v4_special_as_text", "");
}

/* On a real BPE (tandem8k given V4's two tokens) the text between two special tokens is encoded
 * in one piece, as HF encodes the rendered prompt: "="Paris" or "." + "\n\n" pieces only form
 * across the layout's own text and the message's. */
static void test_bpe_one_piece(void) {
    case_begin();
    const char *dir = "tests/fixtures/tokenizers/tandem8k";
    char path[256], err[512] = "";
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char *json = td_file_read(path, 1 << 24, NULL, err, sizeof err),
         *at = json ? strstr(json, "\"added_tokens\":[") : NULL;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    char *cfg = td_file_read(path, 1 << 20, NULL, err, sizeof err);
    struct tok_buf j = {0};
    struct tok *t = NULL;
    if (at && cfg) {
        at += strlen("\"added_tokens\":[");
        tok_buf_put(&j, json, (size_t)(at - json));
        put(&j, "{\"id\":8194,\"content\":\"<｜latest_reminder｜>\",\"special\":true},"
                "{\"id\":8195,\"content\":\"" DSML "\",\"special\":true},");
        put(&j, at);
        if (tok_load_mem(&t, j.p, j.n, cfg, err, sizeof err)) case_fail("%s", err);
    } else {
        case_fail("%s is missing", dir);
    }
    struct chat c;
    if (t) chat_init(&c, t, err, sizeof err);
    CHECK(t && c.v4, "not V4");
    const struct chat_tool_call calls[] = {
        {.id = "a", .name = "get_weather", .arguments = "{\"city\": \"Paris\", \"days\": 2}"},
        {.id = "b", .name = "get_time", .arguments = "{\"zone\": \"CET\"}"}};
    const struct chat_msg m[] = {
        {.role = CHAT_ROLE_SYSTEM,
         .content = "Be brief.",
         .tools = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}]"},
        {.role = CHAT_ROLE_USER, .content = "Weather in Paris?"},
        {.role = CHAT_ROLE_USER, .content = "And the time."},
        {.role = CHAT_ROLE_ASSISTANT,
         .reasoning = "Two calls.",
         .content = "Checking.",
         .tool_calls = calls,
         .n_tool_calls = 2},
        {.role = CHAT_ROLE_TOOL, .tool_call_id = "b", .content = "noon."},
        {.role = CHAT_ROLE_TOOL, .tool_call_id = "a", .content = "\"sunny\""}};
    for (int think = 0; t && think < 2; think++) {
        c.think = think ? CHAT_THINK_ON : CHAT_THINK_OFF;
        size_t n;
        char *s = chat_render(&c, m, N(m), 1, &n, err, sizeof err);
        struct tok_ids ids = {0}, whole = {0};
        CHECK(s && !chat_encode(&c, m, N(m), 1, &ids, err, sizeof err), "%s", err);
        if (s) tok_encode(t, s, n, 0, &whole, err, sizeof err);
        CHECK(ids.n == whole.n && !memcmp(ids.ids, whole.ids, ids.n * sizeof *ids.ids),
              "think %d: chat_encode gives %zu ids, the rendered text %zu", think, ids.n, whole.n);
        free(s);
        tok_ids_free(&ids);
        tok_ids_free(&whole);
    }
    tok_free(t);
    tok_buf_free(&j);
    free(json);
    free(cfg);
    case_end("chat_v4_bpe_encodes_the_rendered_text", "(tandem8k + V4's tokens)");
}

/* a V3 vocabulary (no <｜latest_reminder｜>) keeps the V3 layout and refuses V4's fields */
static void test_v3(void) {
    case_begin();
    struct tok *t = byte_tok(0);
    char err[512] = "";
    struct chat c;
    if (t) chat_init(&c, t, err, sizeof err);
    CHECK(t && c.format == CHAT_FORMAT_DEEPSEEK && !c.v4 && c.think == CHAT_THINK_NONE,
          "not V3 (no chat template: no think markers)");
    if (t) {
        // the system prompts are joined in front, a developer message counts as one; the ids
        // are the rendered text encoded whole ("." and "\n\n" merge across the pieces)
        const struct chat_msg m[] = {{.role = CHAT_ROLE_SYSTEM, .content = "Be brief."},
                                     {.role = CHAT_ROLE_USER, .content = "Hi"},
                                     {.role = CHAT_ROLE_DEVELOPER, .content = "Use English."}};
        size_t n;
        char *s = chat_render(&c, m, 3, 1, &n, err, sizeof err);
        const char *want = BOS "Be brief.\n\nUse English." USER "Hi" ASST;
        CHECK(s && !strcmp(s, want), "renders '%s'", show(s));
        struct tok_ids ids = {0}, whole = {0};
        CHECK(!chat_encode(&c, m, 3, 1, &ids, err, sizeof err), "%s", err);
        tok_encode(t, want, strlen(want), 0, &whole, err, sizeof err);
        CHECK(ids.n == whole.n && !memcmp(ids.ids, whole.ids, ids.n * sizeof *ids.ids),
              "chat_encode gives %zu ids, the rendered text %zu", ids.n, whole.n);
        free(s);
        tok_ids_free(&ids);
        tok_ids_free(&whole);
        const struct chat_msg tool[] = {{.role = CHAT_ROLE_TOOL, .content = "x"}};
        CHECK(chat_encode(&c, tool, 1, 1, &ids, err, sizeof err) == -1 &&
                  strstr(err, "message 0: role tool needs the DeepSeek V4 chat format"),
              "a tool message on V3: '%s'", err);
        const struct chat_tool_call tc = {.name = "f", .arguments = "{}"};
        const struct chat_msg calls[] = {
            {.role = CHAT_ROLE_ASSISTANT, .tool_calls = &tc, .n_tool_calls = 1}};
        CHECK(chat_encode(&c, calls, 1, 1, &ids, err, sizeof err) == -1 &&
                  strstr(err, "message 0 (assistant): tool calls need the DeepSeek V4"),
              "tool calls on V3: '%s'", err);
        tok_ids_free(&ids);
    }
    tok_free(t);
    case_end("chat_v3_layout_and_refusals", "(developer as system; encoded whole)");
}

int main(void) {
    struct tok *t = byte_tok(1);
    struct chat c;
    char err[512];
    case_begin();
    CHECK(t && !chat_init(&c, t, err, sizeof err), "the V4 tokenizer does not load");
    CHECK(t && c.format == CHAT_FORMAT_DEEPSEEK && c.v4 && c.think == CHAT_THINK_OFF &&
              c.drop_thinking && c.effort == CHAT_EFFORT_HIGH,
          "chat_init: format %d, v4 %d, think %d", c.format, c.v4, c.think);
    case_end("chat_v4_detected", "(<｜latest_reminder｜> in the vocab; chat mode by default)");
    if (t) {
        test_turns(&c);
        test_tools(&c);
        test_json_values(&c);
        test_developer_reminder(&c);
        test_refusals(&c);
        test_special_as_text(&c);
        test_parse_calls(&c);
    }
    test_bpe_one_piece();
    test_v3();
    tok_free(t);
    return check_failures ? 1 : 0;
}
