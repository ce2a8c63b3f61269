/* Parsing and printing of sizes ("10GiB", "512MB", "4096") and durations ("90s", "5m", "1h"). */
#ifndef ZT_COMMON_UNITS_H
#define ZT_COMMON_UNITS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Parses a byte size: a non-negative integer or decimal followed by an optional unit B, K/KB (1000),
 * KiB (1024), M/MB, MiB, G/GB, GiB, T/TB, TiB (case-insensitive, optional space). Returns 0, or
 * ZT_EINVAL_CONFIG with a message in err for empty input, junk, a negative value or overflow. */
int zt_parse_size(const char *text, uint64_t *out, zt_err *err);

/* Parses a duration in seconds: a number with an optional unit ms, s, m, h. */
int zt_parse_duration(const char *text, double *seconds, zt_err *err);

/* Writes a byte count as "1.50 GiB" (binary units, 3 significant digits) into buf; returns buf. */
char *zt_format_size(uint64_t bytes, char *buf, size_t len);

/* Seconds on a monotonic clock (CLOCK_MONOTONIC), for measuring intervals. */
double zt_now_s(void);

/* Writes seconds as "1h02m03s", "4m05s" or "12.3s" into buf; returns buf. */
char *zt_format_duration(double seconds, char *buf, size_t len);

#endif
