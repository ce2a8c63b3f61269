/* Checked parsing of command-line flag values, with messages that name the flag and the accepted form:
 *   "--steps: expected a whole number from 1 to 1000000000, got '12x'". */
#ifndef ZT_COMMON_ARGS_H
#define ZT_COMMON_ARGS_H

#include <stdint.h>

#include "common/status.h"

int zt_arg_int(const char *flag, const char *text, int64_t min, int64_t max, int64_t *out, zt_err *err);
int zt_arg_double(const char *flag, const char *text, double min, double max, double *out, zt_err *err);

#endif
