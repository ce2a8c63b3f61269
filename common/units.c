/* Sizes ("10GiB", "512MB") and durations ("90s", "5m") as users type them in flags and configs, and
 * the same quantities printed for people ("1.50 GiB", "1h02m03s"). */
#include "common/units.h"

#include <time.h>

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SIZE_UNITS_HELP "use B, KB, KiB, MB, MiB, GB, GiB, TB, TiB"
#define DURATION_UNITS_HELP "use ms, s, m or h"

/* Skips a number of the form 123, 1.5, .5 or 12. and returns the end; returns start if there is none. */
static const char *scan_decimal(const char *start)
{
    const char *p = start;
    size_t int_digits = 0, frac_digits = 0;
    while (isdigit((unsigned char)*p)) {
        p++;
        int_digits++;
    }
    if (*p == '.') {
        const char *q = p + 1;
        while (isdigit((unsigned char)*q)) {
            q++;
            frac_digits++;
        }
        if (int_digits + frac_digits > 0)
            return q;
    }
    return int_digits > 0 ? p : start;
}

/* The unit after the number, without surrounding spaces: [*ubegin, *uend). */
static void unit_span(const char *after_number, const char **ubegin, const char **uend)
{
    const char *u = after_number;
    while (*u == ' ')
        u++;
    const char *e = u + strlen(u);
    while (e > u && isspace((unsigned char)e[-1]))
        e--;
    *ubegin = u;
    *uend = e;
}

static int unit_is(const char *u, size_t ulen, const char *name)
{
    return strlen(name) == ulen && strncasecmp(u, name, ulen) == 0;
}

/* Parses a byte size such as "4096", "512MB", "1.5 GiB"; see units.h for the accepted units. */
int zt_parse_size(const char *text, uint64_t *out, zt_err *err)
{
    if (text == NULL)
        text = "";
    const char *s = text;
    while (isspace((unsigned char)*s))
        s++;
    if (*s == '\0')
        return zt_fail(err, ZT_EINVAL_CONFIG, "size '%s': empty (expected a number with an optional unit, e.g. 512MiB)",
                       text);
    if (*s == '-')
        return zt_fail(err, ZT_EINVAL_CONFIG, "size '%s': must not be negative", text);
    const char *num_end = scan_decimal(s);
    if (num_end == s)
        return zt_fail(err, ZT_EINVAL_CONFIG, "size '%s': expected a number with an optional unit, e.g. 512MiB",
                       text);

    const char *ub, *ue;
    unit_span(num_end, &ub, &ue);
    size_t ulen = (size_t)(ue - ub);
    static const struct {
        const char *name;
        uint64_t mult;
    } units[] = {
        {"", 1ULL},
        {"B", 1ULL},
        {"K", 1000ULL},
        {"KB", 1000ULL},
        {"KiB", 1ULL << 10},
        {"M", 1000000ULL},
        {"MB", 1000000ULL},
        {"MiB", 1ULL << 20},
        {"G", 1000000000ULL},
        {"GB", 1000000000ULL},
        {"GiB", 1ULL << 30},
        {"T", 1000000000000ULL},
        {"TB", 1000000000000ULL},
        {"TiB", 1ULL << 40},
    };
    uint64_t mult = 0;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (unit_is(ub, ulen, units[i].name)) {
            mult = units[i].mult;
            break;
        }
    }
    if (mult == 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "size '%s': unknown unit '%.*s' (" SIZE_UNITS_HELP ")", text,
                       (int)ulen, ub);

    /* Integer part and fraction in exact integer arithmetic, so that "1.5GiB" is exactly 1610612736. */
    unsigned __int128 whole = 0;
    const char *p = s;
    for (; isdigit((unsigned char)*p); p++) {
        whole = whole * 10 + (unsigned)(*p - '0');
        if (whole > UINT64_MAX)
            goto too_large;
    }
    unsigned __int128 bytes = whole * mult;
    if (*p == '.') {
        unsigned __int128 frac = 0, scale = 1;
        for (p++; p < num_end; p++) {
            if (scale < 1000000000000000000ULL) { /* digits past the 18th cannot change a byte count */
                frac = frac * 10 + (unsigned)(*p - '0');
                scale *= 10;
            }
        }
        bytes += (frac * mult + scale / 2) / scale; /* rounded to the nearest byte */
    }
    if (bytes > UINT64_MAX)
        goto too_large;
    *out = (uint64_t)bytes;
    return 0;

too_large:
    return zt_fail(err, ZT_EINVAL_CONFIG, "size '%s': too large (at most 16 EiB, 18446744073709551615 bytes)", text);
}

/* Parses a duration such as "90s", "1.5h", "250ms" or "30" (seconds) into seconds. */
int zt_parse_duration(const char *text, double *seconds, zt_err *err)
{
    if (text == NULL)
        text = "";
    const char *s = text;
    while (isspace((unsigned char)*s))
        s++;
    if (*s == '\0')
        return zt_fail(err, ZT_EINVAL_CONFIG,
                       "duration '%s': empty (expected a number with an optional unit, e.g. 90s or 5m)", text);
    if (*s == '-')
        return zt_fail(err, ZT_EINVAL_CONFIG, "duration '%s': must not be negative", text);
    const char *num_end = scan_decimal(s);
    if (num_end == s)
        return zt_fail(err, ZT_EINVAL_CONFIG, "duration '%s': expected a number with an optional unit, e.g. 90s or 5m",
                       text);

    const char *ub, *ue;
    unit_span(num_end, &ub, &ue);
    size_t ulen = (size_t)(ue - ub);
    double mult;
    if (unit_is(ub, ulen, "") || unit_is(ub, ulen, "s"))
        mult = 1.0;
    else if (unit_is(ub, ulen, "ms"))
        mult = 1e-3;
    else if (unit_is(ub, ulen, "m"))
        mult = 60.0;
    else if (unit_is(ub, ulen, "h"))
        mult = 3600.0;
    else
        return zt_fail(err, ZT_EINVAL_CONFIG, "duration '%s': unknown unit '%.*s' (" DURATION_UNITS_HELP ")", text,
                       (int)ulen, ub);

    char number[64];
    size_t nlen = (size_t)(num_end - s);
    if (nlen >= sizeof(number))
        return zt_fail(err, ZT_EINVAL_CONFIG, "duration '%s': number too long", text);
    memcpy(number, s, nlen);
    number[nlen] = '\0';
    double v = strtod(number, NULL) * mult;
    if (!isfinite(v))
        return zt_fail(err, ZT_EINVAL_CONFIG, "duration '%s': too large", text);
    *seconds = v;
    return 0;
}

/* Writes bytes as "512 B", "1.50 GiB", "12.3 MiB" or "100 KiB" (binary units, 3 significant digits). */
char *zt_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (buf == NULL || len == 0)
        return buf;
    if (bytes < 1024) {
        snprintf(buf, len, "%u B", (unsigned)bytes);
        return buf;
    }
    int u = 0;
    double v = (double)bytes;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    /* Choose the decimals from the value as it will be rounded, so 9.999 prints "10.0", not "10.00". */
    if (v < 9.995)
        snprintf(buf, len, "%.2f %s", v, units[u]);
    else if (v < 99.95)
        snprintf(buf, len, "%.1f %s", v, units[u]);
    else
        snprintf(buf, len, "%.0f %s", v, units[u]);
    return buf;
}

/* Writes seconds as "12.3s" (under a minute), "4m05s" or "1h02m03s" (whole seconds). */
char *zt_format_duration(double seconds, char *buf, size_t len)
{
    if (buf == NULL || len == 0)
        return buf;
    if (!isfinite(seconds)) {
        snprintf(buf, len, "%gs", seconds);
        return buf;
    }
    const char *sign = "";
    if (seconds < 0) {
        sign = "-";
        seconds = -seconds;
    }
    if (seconds > 1e15) { /* beyond any run's length; keeps llround in range */
        snprintf(buf, len, "%s%.3gs", sign, seconds);
        return buf;
    }
    if (seconds < 59.95) {
        snprintf(buf, len, "%s%.1fs", sign, seconds);
        return buf;
    }
    unsigned long long total = (unsigned long long)llround(seconds);
    unsigned long long h = total / 3600, m = (total / 60) % 60, s = total % 60;
    if (h > 0)
        snprintf(buf, len, "%s%lluh%02llum%02llus", sign, h, m, s);
    else
        snprintf(buf, len, "%s%llum%02llus", sign, m, s);
    return buf;
}

/* Seconds on the monotonic clock; see units.h. */
double zt_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
