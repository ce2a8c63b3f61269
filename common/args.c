/* Checked parsing of command-line flag values: the whole text must be a number in range, and the
 * message names the flag, the accepted range and what was given. */
#include "common/args.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

/* True when text starts like a number: an optional sign, then a digit (or '.' and a digit). Rules out
 * the leading spaces, "inf" and "nan" that strtoll/strtod would accept. */
static int starts_like_number(const char *text)
{
    const char *p = text;
    if (*p == '+' || *p == '-')
        p++;
    if (*p == '.')
        p++;
    return isdigit((unsigned char)*p);
}

/* Parses text as a decimal integer in [min, max]; returns 0 or ZT_EINVAL_CONFIG with a message. */
int zt_arg_int(const char *flag, const char *text, int64_t min, int64_t max, int64_t *out, zt_err *err)
{
    if (text != NULL && starts_like_number(text)) {
        char *end;
        errno = 0;
        long long v = strtoll(text, &end, 10);
        if (errno == 0 && end != text && *end == '\0' && v >= min && v <= max) {
            *out = v;
            return 0;
        }
    }
    return zt_fail(err, ZT_EINVAL_CONFIG, "%s: expected a whole number from %lld to %lld, got '%s'", flag,
                   (long long)min, (long long)max, text != NULL ? text : "");
}

/* Parses text as a finite decimal number in [min, max]; returns 0 or ZT_EINVAL_CONFIG with a message. */
int zt_arg_double(const char *flag, const char *text, double min, double max, double *out, zt_err *err)
{
    if (text != NULL && starts_like_number(text)) {
        char *end;
        errno = 0;
        double v = strtod(text, &end);
        /* ERANGE on underflow still gives a usable (tiny) value; overflow gives inf, caught by isfinite. */
        if (end != text && *end == '\0' && isfinite(v) && v >= min && v <= max) {
            *out = v;
            return 0;
        }
    }
    return zt_fail(err, ZT_EINVAL_CONFIG, "%s: expected a number from %g to %g, got '%s'", flag, min, max,
                   text != NULL ? text : "");
}
