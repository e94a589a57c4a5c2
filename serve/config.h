/* serve/config.h: the configuration of `tandem serve` (design/server.md §3.4).
 *
 *   struct srv_config c;
 *   char err[4096];
 *   if (srv_config_load(&c, "etc/tandem.ini", err, sizeof err) ||   // defaults, then the file
 *       srv_config_env(&c, NULL, err, sizeof err) ||                // TANDEM_SECTION_KEY
 *       srv_config_set(&c, "server.port=9000", "--set", err, sizeof err) ||
 *       srv_config_check(&c, err, sizeof err)) {                    // cross-key rules, once more
 *       fprintf(stderr, "%s\n", err);
 *       return 2;
 *   }
 *
 * Precedence: --set > environment > file > built-in default. One table of keys in config.c drives
 * parsing, validation, --set, the environment, printing, JSON and --help-config; the file is
 * parsed by libinih with strict rules: unknown section or key, a duplicate key, an indented
 * (continuation) line, a line over SRV_LINE_MAX bytes and a bad value are errors with the file's
 * line number, and every one is reported. Loading sets libinih's runtime globals (Debian's
 * build) and puts them back: not thread-safe, call it at startup.
 */
#ifndef SRV_CONFIG_H
#define SRV_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SRV_STR      512  /* string values hold at most SRV_STR - 1 bytes */
#define SRV_LINE_MAX 4096 /* bytes in one line of an INI file, without its line ending */

enum srv_per_request { SRV_PER_REQUEST_NONE, SRV_PER_REQUEST_SUMMARY, SRV_PER_REQUEST_DETAILED };
enum srv_policy { SRV_POLICY_ADAPTIVE, SRV_POLICY_FIXED }; /* = TD_POLICY_* */
enum srv_web_ui { SRV_WEB_UI_AUTO, SRV_WEB_UI_ON, SRV_WEB_UI_OFF };
enum srv_log_format { SRV_LOG_TEXT, SRV_LOG_JSONL };
enum srv_log_level { SRV_LOG_ERROR, SRV_LOG_WARN, SRV_LOG_INFO, SRV_LOG_DEBUG };

/* booleans are 0/1 ints; `tandem serve --help-config` prints every key with its range */
struct srv_config {
    /* [server] */
    char host[SRV_STR]; /* default 127.0.0.1 */
    int port;           /* 8080, 0..65535 (0 = any free port; the server prints the one it bound) */
    char api_key_file[SRV_STR];      /* "" = no auth */
    char served_model_name[SRV_STR]; /* "" = basename of model.path */
    int strict_model;                /* off */
    int max_connections;             /* 512, 1..65536 */
    int per_ip_connections;          /* 0 = unlimited */
    int idle_timeout_s;              /* 30 */
    int request_timeout_s;           /* 1800, 0 = none */
    int sse_ping_s;                  /* 10, 1..3600 : comment ping / liveness check while silent */
    int drain_s;                     /* 30: grace period after SIGTERM */
    char cors_origins[SRV_STR];      /* "" = none; comma-separated list or "*" */
    int web_ui;                      /* enum srv_web_ui: the chat page at / (auto: on loopback) */
    char web_ui_dir[SRV_STR];        /* "" = the page built in; else DIR/index.html */
    /* [model] */
    char path[SRV_STR];     /* "" = the default model (resolved by the caller) */
    int max_context;        /* 4096, 2..16777216 (tokens per sequence; capped by the model) */
    char backend[SRV_STR];  /* auto | cpu | cuda */
    char kv_dtype[SRV_STR]; /* fp32 | bf16 | fp8 */
    int dummy_weights;      /* off */
    int deterministic;      /* off */
    int graphs;             /* on */
    int ranks;              /* 1, 1..64: the model's experts split over this many processes */
    int gpus;               /* 0, 0..64: ... over this many GPUs, NCCL between (0: no split) */
    /* [speculation] */
    char method[SRV_STR];     /* auto | none | ngram | random | mtp | dspark ; default auto */
    int k;                    /* 0 = the drafter's default, 0..16 */
    char dspark_dir[SRV_STR]; /* "" = model.path/dspark */
    double confidence_min;    /* 0, in [0, 1) */
    int policy;               /* enum srv_policy: adaptive (default) | fixed */
    /* [scheduler] */
    int max_running;      /* 16, 1..4096 (sequences decoding at once) */
    int max_batch_tokens; /* 256, 1..1048576 */
    int prefill_chunk;    /* 0 = no cap, 0..1048576 (prompt rows a step) */
    int prefix_blocks;    /* 0 = no prefix cache, else its blocks of 256 tokens */
    int history_blocks;   /* the history pool's blocks; 0 = max_running x max_context / 256, or
                             what the cache memory holds when less */
    long max_cache_mib;   /* 0 = automatic */
    /* [sampling] defaults when a request omits a field */
    double temperature;        /* 1.0, 0..100 */
    double top_p;              /* 1.0, (0,1] */
    int top_k;                 /* 0 */
    int max_tokens;            /* 4096: chat default */
    int completion_max_tokens; /* 16: /v1/completions default (vLLM's) */
    int ignore_eos;            /* off */
    /* [limits] */
    int max_waiting;              /* 256, 0..1000000: beyond this 429 */
    int max_prompt_tokens;        /* 0 = max_context - 1 */
    int max_n;                    /* 8, 1..128 */
    int max_stop;                 /* 4, 0..64 */
    int max_stop_len;             /* 128, 1..4096 bytes */
    long max_body_bytes;          /* 8388608, 1..1073741824 */
    long max_stream_buffer_bytes; /* 4194304: a client that lets more pile up is cancelled */
    /* [metrics] */
    int metrics_enabled;              /* on  (key: metrics.enabled) */
    int vllm_compat;                  /* off */
    enum srv_per_request per_request; /* none | summary | detailed */
    /* [log] */
    enum srv_log_level log_level;   /* info (key: log.level) */
    enum srv_log_format log_format; /* text (key: log.format) */
    char log_file[SRV_STR];         /* "" = stderr (key: log.file) */
    int log_requests; /* off: one line per request is always logged; on = also the prompt text */
};

/* Every key at its built-in default (the defaults live in config.c's key table). */
void srv_config_defaults(struct srv_config *c);

/* Parse an INI file over c (defaults first). Collects EVERY error: each "file:line: reason"
 * line appended to err (newline-separated, truncated with "..." if errlen is short). 0, or -1.
 * err is "" on success; err may be NULL. On -1, c holds what did parse: do not use it. The
 * cross-key rules (srv_config_check) run at the end, with the line of the key set last.
 * A missing file: "cannot open FILE: strerror". */
int srv_config_load(struct srv_config *c, const char *path, char *err, size_t errlen);
/* The same from a string (name used in messages), for tests. */
int srv_config_load_string(struct srv_config *c, const char *text, const char *name, char *err,
                           size_t errlen);

/* One override "section.key=value" (from --set or an env var); 0 or -1 with "--set section.key:
 * reason" (origin replaces "--set"; NULL = "--set"). Whitespace around the key and the value is
 * dropped. No cross-key check: run srv_config_check after the last override. */
int srv_config_set(struct srv_config *c, const char *assignment, const char *origin, char *err,
                   size_t errlen);

/* Environment overrides TANDEM_<SECTION>_<KEY> (upper case) for every key; 0 or -1 (all errors
 * collected, "TANDEM_SERVER_PORT (server.port): reason"). envp NULL = environ. A TANDEM_<SECTION>_
 * variable of a known section that names no key is an error; other TANDEM_* are not ours and
 * are left alone. */
int srv_config_env(struct srv_config *c, char *const *envp, char *err, size_t errlen);

/* The rules across keys, on the effective configuration (after the overrides): speculation.k
 * against speculation.method and scheduler.max_batch_tokens, the DSpark keys against
 * speculation.method, limits.max_prompt_tokens against model.max_context, server.max_connections
 * against limits.max_waiting + scheduler.max_running. 0, or -1 with every broken rule in err. */
int srv_config_check(const struct srv_config *c, char *err, size_t errlen);

/* A generate-style CLI flag that maps to a key ("--draft" -> "speculation.method", "--port" ->
 * "server.port", "--model"/"-m" -> "model.path", "--host", "--backend", "--draft-tokens" ->
 * speculation.k, "--dspark-dir", "--dspark-threshold" -> speculation.confidence_min,
 * "--max-batch-tokens", "--max-ctx" -> model.max_context, "--max-seqs" -> scheduler.max_running,
 * "--temperature", "--top-k", "--top-p", "--max-tokens", "--api-key-file"); value flags only.
 * NULL when the flag maps to nothing. The flag is matched whole ("--port", not "--port=9").
 * Boolean flags: "--deterministic" -> model.deterministic=on, "--no-graphs" -> model.graphs=off,
 * "--dummy-weights" -> model.dummy_weights=on, "--ignore-eos" -> sampling.ignore_eos=on:
 * srv_config_flag_bool returns the "section.key=value" assignment for those (NULL otherwise). */
const char *srv_config_flag_key(const char *flag);
const char *srv_config_flag_bool(const char *flag);

/* The effective configuration as INI text (every key, api_key_file shown but never a key's
 * contents), malloc'd (NULL when out of memory); srv_config_load_string reads it back to the same
 * struct. Also as a jansson object {section: {key: value}} for /props (a new reference; NULL
 * when out of memory). */
char *srv_config_ini(const struct srv_config *c);
struct json_t *srv_config_json(const struct srv_config *c);

/* A 64-bit FNV-1a hash of srv_config_ini's text, for system_fingerprint. */
unsigned long long srv_config_hash(const struct srv_config *c);

/* The help text listing every section.key with type, range and default (for `tandem serve
 * --help-config`). */
void srv_config_help(FILE *f);

#ifdef __cplusplus
}
#endif
#endif
