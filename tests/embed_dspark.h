/* embed_dspark.h: a checkpoint that carries its DSpark head in its own files, made at test time
 * from a target fixture and a drafter folder (header-only, static), as V4-Flash-0731 and the
 * -DSpark releases lay it out (drafters.md 2.4, released_formats.md 1.10):
 *   model-00001-of-00002.safetensors   the target's tensors, its mtp.* (an MTP layer) left out
 *   model-00002-of-00002.safetensors   the stages mtp.0 .. mtp.S-1, with their own names
 *   model.safetensors.index.json       naming both
 *   config.json                        the target's, with the folder's dspark_block_size,
 *                                      dspark_noise_token_id, dspark_markov_rank and
 *                                      dspark_target_layer_ids (no dspark_num_stages: the
 *                                      releases count the mtp.<s> prefixes), and compress_ratios,
 *                                      when it has one, cut to the target's layers plus a 0 a stage
 *   tokenizer*.json, generation_config.json   linked, where the target has them
 *
 *   struct st_tensor *t = ...;   // the stages to write (st_list of the folder, edited), or NULL
 *   if (embed_dspark(out, "tests/fixtures/c_upstream_sharded", "tests/fixtures/dspark_c/dspark",
 *                    t, n, "{\"dspark_markov_rank\": 8}", NULL, err, sizeof err)) ...
 */
#ifndef TD_TESTS_EMBED_DSPARK_H
#define TD_TESTS_EMBED_DSPARK_H

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/safetensors.h"
#include "st_write.h"

/* the tensors of the set at dir as a malloc'd editable list (views into *set, which the caller
 * closes after writing), room for `extra` more; NULL with err */
static inline struct st_tensor *embed_list(struct st_set *set, const char *dir, int extra, int *n,
                                           char *err, size_t errlen) {
    if (st_set_open(set, dir, err, errlen)) return NULL;
    struct st_tensor *t = calloc((size_t)set->n_entries + (size_t)extra + 1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "out of memory");
        st_set_close(set);
        return NULL;
    }
    *n = st_list(set, t);
    return t;
}

static inline int embed_link(const char *from_dir, const char *name, const char *out) {
    char from[PATH_MAX], abs[PATH_MAX], to[PATH_MAX];
    snprintf(from, sizeof from, "%s/%s", from_dir, name);
    if (access(from, R_OK) || !realpath(from, abs)) return 0; // absent: nothing to link
    snprintf(to, sizeof to, "%s/%s", out, name);
    return symlink(abs, to) ? -1 : 0;
}

/* out (made here) = target's files but mtp.*, plus the stages: stages[n], or the folder
 * dspark's tensors when stages is NULL; the config as above, then patch (a JSON object, or NULL)
 * merged into it and the space-separated keys of del (or NULL) removed. 0, or -1 with err. */
static inline int embed_dspark(const char *out, const char *target, const char *dspark,
                               const struct st_tensor *stages, int n, const char *patch,
                               const char *del, char *err, size_t errlen) {
    struct st_set ts, ds;
    memset(&ds, 0, sizeof ds);
    int nt = 0, rc = -1;
    struct st_tensor *t = embed_list(&ts, target, 0, &nt, err, errlen), *d = NULL;
    json_t *cfg = NULL, *dcfg = NULL, *index = json_object(), *wm = json_object();
    char path[PATH_MAX];
    if (!t) goto done;
    if (!stages && !(stages = d = embed_list(&ds, dspark, 0, &n, err, errlen))) goto done;
    if (mkdir(out, 0700)) {
        snprintf(err, errlen, "cannot make %s", out);
        goto done;
    }
    int k = 0;
    for (int i = 0; i < nt; i++)
        if (strncmp(t[i].name, "mtp.", 4)) t[k++] = t[i];
    for (int i = 0; i < k; i++)
        json_object_set_new(wm, t[i].name, json_string("model-00001-of-00002.safetensors"));
    for (int i = 0; i < n; i++)
        json_object_set_new(wm, stages[i].name, json_string("model-00002-of-00002.safetensors"));
    json_object_set_new(index, "metadata", json_object());
    json_object_set(index, "weight_map", wm);
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", out);
    int ok = !st_write(path, t, k, 0);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", out);
    ok = ok && !st_write(path, stages, n, 0);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
    ok = ok && !json_dump_file(index, path, JSON_INDENT(1));
    // the config: the target's, the folder's four keys, compress_ratios for the stages
    snprintf(path, sizeof path, "%s/config.json", target);
    cfg = json_load_file(path, 0, NULL);
    snprintf(path, sizeof path, "%s/config.json", dspark);
    dcfg = json_load_file(path, 0, NULL);
    if (!ok || !cfg || !dcfg) {
        snprintf(err, errlen, "cannot write %s, or read the configs of %s and %s", out, target,
                 dspark);
        goto done;
    }
    const char *keys[] = {"dspark_block_size", "dspark_noise_token_id", "dspark_markov_rank",
                          "dspark_target_layer_ids"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        json_object_set(cfg, keys[i], json_object_get(dcfg, keys[i]));
    json_t *cr = json_object_get(cfg, "compress_ratios");
    int layers = (int)json_integer_value(json_object_get(cfg, "num_hidden_layers"));
    int n_stages = (int)json_integer_value(json_object_get(dcfg, "dspark_num_stages"));
    if (json_is_array(cr)) {
        while ((int)json_array_size(cr) > layers)
            json_array_remove(cr, json_array_size(cr) - 1);
        for (int s = 0; s < n_stages; s++)
            json_array_append_new(cr, json_integer(0));
    }
    if (patch) {
        json_t *p = json_loads(patch, 0, NULL);
        if (!p || json_object_update(cfg, p)) {
            json_decref(p);
            snprintf(err, errlen, "bad patch %s", patch);
            goto done;
        }
        json_decref(p);
    }
    if (del) {
        char keyl[512], *save = NULL;
        snprintf(keyl, sizeof keyl, "%s", del);
        for (char *key = strtok_r(keyl, " ", &save); key; key = strtok_r(NULL, " ", &save))
            json_object_del(cfg, key);
    }
    snprintf(path, sizeof path, "%s/config.json", out);
    const char *links[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    ok = !json_dump_file(cfg, path, JSON_INDENT(1));
    for (size_t i = 0; ok && i < sizeof links / sizeof *links; i++)
        ok = !embed_link(target, links[i], out);
    if (!ok) {
        snprintf(err, errlen, "cannot write the config or the links in %s", out);
        goto done;
    }
    rc = 0;
done:
    json_decref(cfg);
    json_decref(dcfg);
    json_decref(wm);
    json_decref(index);
    free(t);
    free(d);
    if (t) st_set_close(&ts);
    if (d) st_set_close(&ds);
    return rc;
}

#endif
