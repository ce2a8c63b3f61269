/* Status codes shared by every ztrain module.
 *
 * Recoverable errors (bad input, I/O, network, configuration) are returned as int: 0 on success or a
 * negative code. Codes are ZT_E* values below or negative errno values (-ENOENT, -EACCES, ...); both
 * print through zt_strerror(). Functions that can fail for a user-visible reason also take a
 * zt_err buffer and write one sentence into it that names the problem and how to fix it.
 * The enum only grows at its end: codes may be stored in files and logs. */
#ifndef ZT_COMMON_STATUS_H
#define ZT_COMMON_STATUS_H

#include <stddef.h>

enum zt_status {
    ZT_OK = 0,
    ZT_EINVAL_CONFIG = -1000, /* a configuration value is missing, unknown or out of range */
    ZT_EFORMAT = -1001,       /* a file is truncated, corrupt or not of the expected format */
    ZT_ECHECKSUM = -1002,     /* a checksum does not match the data */
    ZT_EMISMATCH = -1003,     /* two inputs disagree (vocab of data vs model, shapes, world size) */
    ZT_EUNSUPPORTED = -1004,  /* a valid request this build cannot serve (dtype, feature) */
    ZT_ENOMEM = -1005,        /* an allocation failed or a memory budget is exceeded */
    ZT_EIO = -1006,           /* a read or write failed for a reason errno does not describe */
    ZT_ESTATE = -1007,        /* an operation was called in the wrong state */
};

/* Room for one error sentence; every API that can fail for a user's reason takes one. */
#define ZT_ERR_LEN 512
typedef struct zt_err {
    char msg[ZT_ERR_LEN];
} zt_err;

/* Returns a static, human-readable name for a status code (ZT_E* or negative errno). Never NULL. */
const char *zt_strerror(int code);

/* Formats a message into err (if err is not NULL) and returns code, so that callers can write
 * `return zt_fail(err, ZT_EFORMAT, "%s: header is %zu bytes, file has %zu", path, a, b);`. */
int zt_fail(zt_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Puts "what: " before the message in err (if err is not NULL), cutting its end if the room runs out. */
void zt_err_prefix(zt_err *err, const char *what);

/* Aborts with file, line and the failed expression when a broken invariant is found. Not for user
 * errors: those return a code. */
#define ZT_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond))                                                                               \
            zt__assert_fail(__FILE__, __LINE__, #cond);                                            \
    } while (0)
void zt__assert_fail(const char *file, int line, const char *expr) __attribute__((noreturn));

/* malloc/calloc that abort on failure (for the sizes a program cannot run without). */
void *zt_xmalloc(size_t n);
void *zt_xcalloc(size_t count, size_t size);
void *zt_xrealloc(void *p, size_t n);
char *zt_xstrdup(const char *s);

#endif
