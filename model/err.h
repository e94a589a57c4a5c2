/* err.h: recoverable errors (STYLE.md 9.4): a one-line message into the caller's buffer. */
#ifndef TD_ERR_H
#define TD_ERR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* printf into err[errlen] (when err is not NULL); returns -1, so `return td_errf(...);` */
__attribute__((format(printf, 3, 4))) int td_errf(char *err, size_t errlen, const char *fmt, ...);

#ifdef __cplusplus
}
#endif
#endif
