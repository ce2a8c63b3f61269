/* The run's metrics.jsonl: appending train and eval lines, and trimming it on resume (see metrics.h). */
#include "worker/train/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/fileio.h"

static int open_append(zt_metrics *mt, const char *path, const char *mode, zt_err *err)
{
    if (strlen(path) >= sizeof(mt->path))
        return zt_fail(err, ZT_EINVAL_CONFIG, "metrics path '%s' is too long", path);
    snprintf(mt->path, sizeof(mt->path), "%s", path);
    mt->f = fopen(path, mode);
    if (!mt->f) {
        int e = errno;
        return zt_fail(err, -e, "cannot open %s for writing: %s; check that the run directory is writable",
                       path, strerror(e));
    }
    return 0;
}

/* Creates or empties the metrics file; see metrics.h. */
int zt_metrics_create(zt_metrics *mt, const char *path, zt_err *err)
{
    memset(mt, 0, sizeof(*mt));
    return open_append(mt, path, "w", err);
}

/* Keeps the lines up to step and opens the file for appending; see metrics.h. */
int zt_metrics_resume(zt_metrics *mt, const char *path, int64_t step, double *first_val_loss, zt_err *err)
{
    memset(mt, 0, sizeof(*mt));
    if (first_val_loss)
        *first_val_loss = NAN;

    char *text = NULL;
    size_t len = 0;
    zt_err read_err;
    int rc = zt_read_file(path, &text, &len, &read_err);
    if (rc == -ENOENT)
        return open_append(mt, path, "w", err);
    if (rc < 0)
        return zt_fail(err, rc, "%s", read_err.msg);

    /* Keep the complete lines whose step is at most `step`, in their order. */
    char *kept = zt_xmalloc(len + 1);
    size_t nkept = 0;
    char *line = text;
    while (line < text + len) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        if (!nl)
            break; /* a last line without a newline was cut short: drop it */
        *nl = '\0';
        cJSON *obj = cJSON_Parse(line);
        const cJSON *s = obj ? cJSON_GetObjectItemCaseSensitive(obj, "step") : NULL;
        if (cJSON_IsObject(obj) && cJSON_IsNumber(s) && s->valuedouble <= (double)step) {
            const cJSON *vl = cJSON_GetObjectItemCaseSensitive(obj, "val_loss");
            if (first_val_loss && isnan(*first_val_loss) && cJSON_IsNumber(vl))
                *first_val_loss = vl->valuedouble;
            size_t n = (size_t)(nl - line);
            memcpy(kept + nkept, line, n);
            kept[nkept + n] = '\n';
            nkept += n + 1;
        }
        cJSON_Delete(obj);
        line = nl + 1;
    }
    free(text);
    rc = zt_write_file_atomic(path, kept, nkept, err);
    free(kept);
    if (rc < 0)
        return rc;
    return open_append(mt, path, "a", err);
}

/* Writes a finite number as %.9g (exact for floats) or null. */
static void put_number(FILE *f, const char *key, double v, const char *fmt)
{
    fprintf(f, ",\"%s\":", key);
    if (isfinite(v))
        fprintf(f, fmt, v);
    else
        fputs("null", f);
}

static int finish_line(zt_metrics *mt, zt_err *err)
{
    fputs("}\n", mt->f);
    if (fflush(mt->f) != 0 || ferror(mt->f)) {
        int e = errno;
        return zt_fail(err, e ? -e : ZT_EIO, "cannot write %s: %s; free some disk space and resume the run",
                       mt->path, e ? strerror(e) : "write error");
    }
    return 0;
}

/* Appends a train line; see metrics.h. */
int zt_metrics_write_train(zt_metrics *mt, const zt_metrics_train *l, zt_err *err)
{
    fprintf(mt->f, "{\"step\":%lld", (long long)l->step);
    put_number(mt->f, "loss", l->loss, "%.9g");
    put_number(mt->f, "lr", l->lr, "%.9g");
    put_number(mt->f, "grad_norm", l->grad_norm, "%.6g");
    put_number(mt->f, "tokens_per_s", l->tokens_per_s, "%.1f");
    put_number(mt->f, "elapsed_s", l->elapsed_s, "%.3f");
    if (l->skipped)
        fputs(",\"skipped\":true", mt->f);
    return finish_line(mt, err);
}

/* Appends an eval line; see metrics.h. */
int zt_metrics_write_eval(zt_metrics *mt, int64_t step, float val_loss, float val_accuracy, zt_err *err)
{
    fprintf(mt->f, "{\"step\":%lld", (long long)step);
    put_number(mt->f, "val_loss", val_loss, "%.9g");
    if (!isnan(val_accuracy))
        put_number(mt->f, "val_accuracy", val_accuracy, "%.9g");
    return finish_line(mt, err);
}

/* Closes the metrics file; see metrics.h. */
void zt_metrics_close(zt_metrics *mt)
{
    if (mt && mt->f) {
        fclose(mt->f);
        mt->f = NULL;
    }
}
