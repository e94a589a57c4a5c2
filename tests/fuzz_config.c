/* fuzz_config.c: libFuzzer target for config.json parsing (td_config_parse), `make fuzz`;
 * JSON-aware mutations (fuzz_json.h) beside the byte ones. Seeds: tests/fuzz/fuzz_config/. */
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "fuzz_json.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t n) {
    char *s = malloc(n + 1), err[256];
    memcpy(s, data, n);
    s[n] = 0;
    struct td_config c;
    td_config_parse(&c, s, err, sizeof err); // must return, never crash or read out of bounds
    free(s);
    return 0;
}
