/* Status codes to text, zt_fail (message plus code), the invariant-failure abort and aborting allocators. */
#include "common/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Returns a static, human-readable name for a ZT_E* code or a negative errno value. Never NULL. */
const char *zt_strerror(int code)
{
    switch (code) {
    case ZT_OK:
        return "success";
    case ZT_EINVAL_CONFIG:
        return "invalid configuration";
    case ZT_EFORMAT:
        return "malformed or truncated file";
    case ZT_ECHECKSUM:
        return "checksum mismatch";
    case ZT_EMISMATCH:
        return "inputs do not match";
    case ZT_EUNSUPPORTED:
        return "not supported by this build";
    case ZT_ENOMEM:
        return "out of memory";
    case ZT_EIO:
        return "input/output error";
    case ZT_ESTATE:
        return "operation called in the wrong state";
    default:
        break;
    }
    /* Negative errno values. strerror() formats unknown numbers into a per-thread buffer that the next
     * call frees, which would break the "static" promise; strerrordesc_np returns static text or NULL. */
    if (code < 0 && code > -1000) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
        const char *desc = strerrordesc_np(-code);
        if (desc != NULL)
            return desc;
#else
        return strerror(-code);
#endif
    }
    return "unknown status code";
}

/* Formats a message into err (when err is not NULL) and returns code unchanged. */
int zt_fail(zt_err *err, int code, const char *fmt, ...)
{
    if (err != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return code;
}

void zt_err_prefix(zt_err *err, const char *what)
{
    if (err == NULL)
        return;
    char msg[sizeof(err->msg)];
    memcpy(msg, err->msg, sizeof msg);
    if (snprintf(err->msg, sizeof err->msg, "%s: %s", what, msg) < 0) /* a cut message is kept as cut */
        memcpy(err->msg, msg, sizeof msg);
}

/* Prints "ztrain: internal error at FILE:LINE: EXPR" to stderr and aborts; called by ZT_ASSERT. */
void zt__assert_fail(const char *file, int line, const char *expr)
{
    fprintf(stderr, "ztrain: internal error at %s:%d: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}

/* Allocates n bytes or aborts with a message naming the size; malloc(0) is treated as malloc(1). */
void *zt_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "ztrain: out of memory allocating %zu bytes\n", n);
        abort();
    }
    return p;
}

/* Allocates count*size zeroed bytes or aborts (overflow of count*size included). */
void *zt_xcalloc(size_t count, size_t size)
{
    if (count == 0 || size == 0)
        count = size = 1;
    void *p = calloc(count, size);
    if (p == NULL) {
        fprintf(stderr, "ztrain: out of memory allocating %zu x %zu bytes\n", count, size);
        abort();
    }
    return p;
}

/* Resizes p to n bytes or aborts. */
void *zt_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL) {
        fprintf(stderr, "ztrain: out of memory allocating %zu bytes\n", n);
        abort();
    }
    return q;
}

/* Copies s or aborts. */
char *zt_xstrdup(const char *s)
{
    const size_t n = strlen(s) + 1;
    char *p = zt_xmalloc(n);
    memcpy(p, s, n);
    return p;
}
