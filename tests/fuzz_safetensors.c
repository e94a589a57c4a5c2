/* fuzz_safetensors.c: libFuzzer target for safetensors headers (st_set_open_file). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "model/safetensors.h"

static char path[64]; /* the input as a file, one per process, removed at exit */

static void remove_file(void) {
    unlink(path);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t n) {
    if (!path[0]) {
        snprintf(path, sizeof path, "/tmp/td_fuzz_st_%d", (int)getpid());
        atexit(remove_file);
    }
    FILE *fp = fopen(path, "wb");
    if (!fp) return 0;
    fwrite(data, 1, n, fp);
    fclose(fp);
    struct st_set set;
    char err[256];
    if (st_set_open_file(&set, path, err, sizeof err) == 0) {
        // every entry's bytes must lie inside the mapping: read them all
        volatile unsigned char sink = 0;
        for (int i = 0; i < set.n_entries; i++)
            for (size_t b = 0; b < set.entries[i].nbytes; b++)
                sink ^= ((const unsigned char *)set.entries[i].t.data)[b];
        (void)sink;
        st_set_close(&set);
    }
    return 0;
}
