/* Line-oriented logging: one event per line, greppable, with a level and an optional rank prefix.
 *
 *   2026-11-29T15:04:05Z INFO  [r0] train: step 10/200 loss 3.4512 ...
 *
 * Lines go to stderr; the level is set once at start (zt_log_set_level) or from ZT_LOG_LEVEL
 * (debug|info|warn|error). Thread-safe: each line is written with a single write(). */
#ifndef ZT_COMMON_LOG_H
#define ZT_COMMON_LOG_H

enum zt_log_level { ZT_LOG_DEBUG = 0, ZT_LOG_INFO = 1, ZT_LOG_WARN = 2, ZT_LOG_ERROR = 3 };

/* Sets the lowest level that is printed. */
void zt_log_set_level(enum zt_log_level level);
/* Parses "debug", "info", "warn" or "error"; returns 0, or ZT_EINVAL_CONFIG for anything else. */
int zt_log_parse_level(const char *name, enum zt_log_level *out);
/* Sets the rank shown as [rN] on every line; a negative rank (the default) shows no prefix. */
void zt_log_set_rank(int rank);

void zt_log(enum zt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define ZT_DEBUG(...) zt_log(ZT_LOG_DEBUG, __VA_ARGS__)
#define ZT_INFO(...) zt_log(ZT_LOG_INFO, __VA_ARGS__)
#define ZT_WARN(...) zt_log(ZT_LOG_WARN, __VA_ARGS__)
#define ZT_ERROR(...) zt_log(ZT_LOG_ERROR, __VA_ARGS__)

#endif
