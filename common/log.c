/* Line-oriented logging to stderr: "2026-11-29T15:04:05.123Z INFO  [r0] message", one write(2) per line
 * so that lines from several threads or processes sharing stderr never interleave. */
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/status.h"

/* Longest line written; longer messages are cut and end with "...". */
#define LOG_LINE_MAX 4096

static atomic_int g_level = ZT_LOG_INFO;
static atomic_int g_rank = -1;
static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;

static void write_line(enum zt_log_level level, const char *fmt, va_list ap);

static void log_fmt(enum zt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_fmt(enum zt_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    write_line(level, fmt, ap);
    va_end(ap);
}

/* Reads ZT_LOG_LEVEL once, before the first line is printed or the level is set explicitly. */
static void read_env_level(void)
{
    const char *value = getenv("ZT_LOG_LEVEL");
    if (value == NULL || value[0] == '\0')
        return;
    enum zt_log_level level;
    if (zt_log_parse_level(value, &level) == 0) {
        atomic_store(&g_level, (int)level);
        return;
    }
    log_fmt(ZT_LOG_WARN, "ZT_LOG_LEVEL='%s' is not a log level (use debug, info, warn or error); using info",
            value);
}

static void init_once(void)
{
    pthread_once(&g_env_once, read_env_level);
}

/* Sets the lowest level that is printed; an explicit call wins over ZT_LOG_LEVEL. */
void zt_log_set_level(enum zt_log_level level)
{
    init_once();
    atomic_store(&g_level, (int)level);
}

/* Parses "debug", "info", "warn" or "error" (any case); returns 0, or ZT_EINVAL_CONFIG for anything else. */
int zt_log_parse_level(const char *name, enum zt_log_level *out)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    if (name == NULL)
        return ZT_EINVAL_CONFIG;
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(name, names[i]) == 0) {
            *out = (enum zt_log_level)i;
            return 0;
        }
    }
    return ZT_EINVAL_CONFIG;
}

/* Sets the rank printed as [rN] on every line; a negative rank removes the prefix. */
void zt_log_set_rank(int rank)
{
    atomic_store(&g_rank, rank < 0 ? -1 : rank);
}

static const char *level_label(enum zt_log_level level)
{
    switch (level) {
    case ZT_LOG_DEBUG:
        return "DEBUG";
    case ZT_LOG_INFO:
        return "INFO ";
    case ZT_LOG_WARN:
        return "WARN ";
    case ZT_LOG_ERROR:
        return "ERROR";
    }
    return "?????";
}

static void write_line(enum zt_log_level level, const char *fmt, va_list ap)
{
    char line[LOG_LINE_MAX];
    size_t cap = sizeof(line) - 1; /* room kept for the final '\n' */

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(line, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    int rank = atomic_load(&g_rank);
    int k;
    if (rank >= 0)
        k = snprintf(line + n, cap - n, ".%03ldZ %s [r%d] ", ts.tv_nsec / 1000000L, level_label(level), rank);
    else
        k = snprintf(line + n, cap - n, ".%03ldZ %s ", ts.tv_nsec / 1000000L, level_label(level));
    if (k > 0)
        n += (size_t)k < cap - n ? (size_t)k : cap - n - 1;

    k = vsnprintf(line + n, cap - n, fmt, ap);
    if (k < 0) {
        k = 0;
    } else if ((size_t)k >= cap - n) {
        /* Truncated: vsnprintf wrote cap - n - 1 characters; mark the cut. */
        n = cap - 1;
        memcpy(line + n - 3, "...", 3);
        k = 0;
    }
    n += (size_t)k;
    line[n++] = '\n';

    ssize_t w;
    do {
        w = write(STDERR_FILENO, line, n);
    } while (w < 0 && errno == EINTR);
}

/* Prints one line at level when level is at or above the configured level. */
void zt_log(enum zt_log_level level, const char *fmt, ...)
{
    init_once();
    if ((int)level < atomic_load(&g_level))
        return;
    va_list ap;
    va_start(ap, fmt);
    write_line(level, fmt, ap);
    va_end(ap);
}
