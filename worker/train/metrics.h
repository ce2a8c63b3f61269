/* metrics.jsonl of a run: one JSON object per line, appended as training goes, read by `ztrain plot`.
 *   {"step":1,"loss":5.61,"lr":1.2e-05,"grad_norm":3.2,"tokens_per_s":1234.5,"elapsed_s":0.8}
 *   {"step":100,"val_loss":2.31}
 * A skipped step (non-finite loss or norm) writes null for the non-finite values and "skipped":true.
 * Losses are written with 9 significant digits, which is exact for a float.
 * When a run resumes at step N, the lines of steps after N (written before an interruption, or cut short
 * by a crash) are dropped first, so that the file reads as if the run had never stopped. */
#ifndef ZT_WORKER_METRICS_H
#define ZT_WORKER_METRICS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"

typedef struct zt_metrics {
    FILE *f;            /* open for appending; NULL when closed */
    char path[1024];
} zt_metrics;

/* One train line. */
typedef struct zt_metrics_train {
    int64_t step;
    float loss;
    double lr;
    double grad_norm;
    double tokens_per_s;
    double elapsed_s;
    bool skipped;
} zt_metrics_train;

/* Creates (or empties) path and opens it for appending. Returns 0 or a negative errno with a message. */
int zt_metrics_create(zt_metrics *mt, const char *path, zt_err *err);

/* Opens an existing path to continue a run resumed after step: lines with a step above it, and lines
 * that are not complete JSON objects, are removed first (the file is rewritten atomically). A missing
 * file is created. If first_val_loss is not NULL it receives the val_loss of the earliest eval line
 * kept, or NAN if there is none. Returns 0 or a negative code with a message. */
int zt_metrics_resume(zt_metrics *mt, const char *path, int64_t step, double *first_val_loss, zt_err *err);

/* Appends a train line, or an eval line (with "val_accuracy" unless val_accuracy is NAN), and flushes it.
 * Returns 0 or a negative errno with a message. */
int zt_metrics_write_train(zt_metrics *mt, const zt_metrics_train *line, zt_err *err);
int zt_metrics_write_eval(zt_metrics *mt, int64_t step, float val_loss, float val_accuracy, zt_err *err);

/* Closes the file; accepts a closed one. */
void zt_metrics_close(zt_metrics *mt);

#endif
