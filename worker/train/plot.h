/* Plots of a training run: reads a run's metrics.jsonl and draws an SVG 1.1 image by hand (no library).
 *
 * The image has a title, a loss panel (train loss as a thin line, validation loss as points joined by a
 * line, a legend) and a learning-rate panel below it; both panels share the step axis.
 *
 * metrics.jsonl holds one JSON object per line: train lines {"step":1,"loss":5.61,"lr":1.2e-5,...} and
 * eval lines {"step":100,"val_loss":2.31}. Lines that are not such objects are skipped and counted.
 * When a step appears more than once (a run resumed from an earlier checkpoint appends the steps it
 * repeats), the line that comes last in the file wins. */
#ifndef ZT_WORKER_PLOT_H
#define ZT_WORKER_PLOT_H

#include <stddef.h>

#include "common/status.h"

typedef struct zt_plot_point {
    double step;
    double value;
} zt_plot_point;

/* The series of one metrics file, each sorted by step with unique steps. */
typedef struct zt_plot_data {
    zt_plot_point *loss;     /* train loss; malloc'd, may be NULL when n_loss == 0 */
    size_t n_loss;
    zt_plot_point *lr;       /* learning rate of the train lines that have one */
    size_t n_lr;
    zt_plot_point *val_loss; /* eval lines */
    size_t n_val_loss;
    size_t n_lines;          /* non-blank lines read */
    size_t n_skipped;        /* non-blank lines that were neither a train nor an eval line */
    size_t first_skipped;    /* 1-based line number of the first skipped line; 0 when none */
} zt_plot_data;

/* Reads a metrics.jsonl file into d (zeroed first; free with zt_plot_data_free, also after a failure).
 * Malformed lines are skipped and counted, not errors. Returns 0, a negative errno when the file cannot
 * be read, or ZT_EFORMAT when it holds no train or eval point at all; err names the file. */
int zt_plot_data_read(zt_plot_data *d, const char *path, zt_err *err);
void zt_plot_data_free(zt_plot_data *d); /* accepts NULL and a zeroed struct */

/* Renders d as an SVG document into a malloc'd, NUL-terminated buffer (*out, freed by the caller; *len
 * excludes the NUL). title may be NULL (no title line); it is escaped for XML. Returns 0, ZT_EFORMAT
 * when d has no point, or ZT_ENOMEM. */
int zt_plot_render_svg(const zt_plot_data *d, const char *title, char **out, size_t *len, zt_err *err);

/* Reads metrics_path, renders it and writes svg_path atomically (no partial file on failure). Logs one
 * WARN line with the count of skipped lines, if any. Returns 0 or the first failure's code with a
 * message in err. */
int zt_plot_metrics_file(const char *metrics_path, const char *svg_path, const char *title, zt_err *err);

#endif
