/* The SVG plot of a run's metrics.jsonl (see plot.h): parse the lines, then draw two panels that share
 * the step axis with plain SVG elements (rect, line, polyline, circle, text). */
#include "worker/train/plot.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/fileio.h"
#include "common/log.h"

/* ---- reading ------------------------------------------------------------------------------------- */

/* A point with the line it came from, so that the last of several lines for one step wins. */
typedef struct raw_point {
    double step;
    double value;
    size_t line;
} raw_point;

typedef struct raw_series {
    raw_point *p;
    size_t n, cap;
} raw_series;

static int series_push(raw_series *s, double step, double value, size_t line)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        raw_point *p = realloc(s->p, cap * sizeof(*p));
        if (!p)
            return ZT_ENOMEM;
        s->p = p;
        s->cap = cap;
    }
    s->p[s->n++] = (raw_point){step, value, line};
    return 0;
}

static int compare_raw(const void *pa, const void *pb)
{
    const raw_point *a = pa;
    const raw_point *b = pb;
    if (a->step != b->step)
        return a->step < b->step ? -1 : 1;
    return (a->line > b->line) - (a->line < b->line);
}

/* Sorts by step, keeps the last line of each step, and moves the result into a zt_plot_point array. */
static int series_finish(raw_series *s, zt_plot_point **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    if (s->n == 0)
        return 0;
    qsort(s->p, s->n, sizeof(*s->p), compare_raw);
    zt_plot_point *pts = malloc(s->n * sizeof(*pts));
    if (!pts)
        return ZT_ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (i + 1 < s->n && s->p[i + 1].step == s->p[i].step)
            continue; /* a later line has the same step */
        pts[n++] = (zt_plot_point){s->p[i].step, s->p[i].value};
    }
    *out = pts;
    *n_out = n;
    return 0;
}

/* Reads a finite number field; false when the key is absent or not a finite number. */
static bool get_number(const cJSON *obj, const char *key, double *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble))
        return false;
    *out = item->valuedouble;
    return true;
}

static bool is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    }
    return true;
}

void zt_plot_data_free(zt_plot_data *d)
{
    if (!d)
        return;
    free(d->loss);
    free(d->lr);
    free(d->val_loss);
    memset(d, 0, sizeof(*d));
}

int zt_plot_data_read(zt_plot_data *d, const char *path, zt_err *err)
{
    memset(d, 0, sizeof(*d));
    char *text = NULL;
    size_t len = 0;
    int rc = zt_read_file(path, &text, &len, err);
    if (rc == -ENOENT)
        return zt_fail(err, rc, "metrics file %s does not exist: pass the metrics.jsonl in the --out directory "
                       "of a 'ztrain train' run", path);
    if (rc < 0)
        return rc;

    raw_series loss = {0}, lr = {0}, val = {0};
    size_t line_no = 0;
    const char *p = text;
    const char *end = text + len;
    while (p < end && rc == 0) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        line_no++;
        if (!is_blank(p, n)) {
            d->n_lines++;
            cJSON *obj = cJSON_ParseWithLength(p, n);
            double step, value, rate;
            bool used = false;
            if (cJSON_IsObject(obj) && get_number(obj, "step", &step) && step >= 0) {
                if (get_number(obj, "val_loss", &value)) {
                    rc = series_push(&val, step, value, line_no);
                    used = true;
                } else if (get_number(obj, "loss", &value)) {
                    rc = series_push(&loss, step, value, line_no);
                    if (rc == 0 && get_number(obj, "lr", &rate))
                        rc = series_push(&lr, step, rate, line_no);
                    used = true;
                }
            }
            cJSON_Delete(obj);
            if (!used) {
                d->n_skipped++;
                if (d->first_skipped == 0)
                    d->first_skipped = line_no;
            }
        }
        p += n + 1;
    }
    free(text);

    if (rc == 0)
        rc = series_finish(&loss, &d->loss, &d->n_loss);
    if (rc == 0)
        rc = series_finish(&lr, &d->lr, &d->n_lr);
    if (rc == 0)
        rc = series_finish(&val, &d->val_loss, &d->n_val_loss);
    free(loss.p);
    free(lr.p);
    free(val.p);
    if (rc < 0)
        return zt_fail(err, rc, "out of memory while reading %s", path);

    if (d->n_loss == 0 && d->n_val_loss == 0) {
        if (d->n_lines == 0)
            return zt_fail(err, ZT_EFORMAT, "%s is empty: there is nothing to plot; pass the metrics.jsonl of "
                           "a run that has logged at least one step", path);
        return zt_fail(err, ZT_EFORMAT,
                       "%s has no train or eval points (%zu lines, none with a numeric \"step\" and \"loss\" or "
                       "\"val_loss\"; first bad line %zu): pass a run's metrics.jsonl",
                       path, d->n_lines, d->first_skipped);
    }
    return 0;
}

/* ---- a growing text buffer ----------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool failed; /* an allocation failed; later appends do nothing */
} sbuf;

static bool sb_reserve(sbuf *b, size_t extra)
{
    if (b->failed)
        return false;
    if (b->len + extra + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !sb_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

static void sb_putc(sbuf *b, char c)
{
    if (!sb_reserve(b, 1))
        return;
    b->p[b->len++] = c;
    b->p[b->len] = '\0';
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when it is not valid UTF-8. */
static int utf8_sequence_length(const unsigned char *s, size_t avail)
{
    unsigned char c = s[0];
    int n;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0; /* overlong */
        if (c == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if ((size_t)n > avail || s[1] < lo || s[1] > hi)
        return 0;
    for (int i = 2; i < n; i++) {
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    }
    return n;
}

/* Appends text as XML character data: markup characters escaped, control characters dropped (XML 1.0
 * does not allow them), invalid UTF-8 bytes replaced by '?', so any user title gives a valid file. */
static void sb_put_xml_text(sbuf *b, const char *text)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t avail = strlen(text);
    while (avail > 0) {
        unsigned char c = *s;
        int n = 1;
        if (c == '&')
            sb_printf(b, "&amp;");
        else if (c == '<')
            sb_printf(b, "&lt;");
        else if (c == '>')
            sb_printf(b, "&gt;");
        else if (c == '"')
            sb_printf(b, "&quot;");
        else if (c == '\'')
            sb_printf(b, "&apos;");
        else if (c < 0x20)
            ; /* tab, newline and other control characters: dropped to keep the title on one line */
        else if (c < 0x80)
            sb_putc(b, (char)c);
        else if ((n = utf8_sequence_length(s, avail)) > 0)
            for (int i = 0; i < n; i++)
                sb_putc(b, (char)s[i]);
        else {
            sb_putc(b, '?');
            n = 1;
        }
        s += n;
        avail -= (size_t)n;
    }
}

/* ---- axes ---------------------------------------------------------------------------------------- */

/* A "nice" step (1, 2 or 5 times a power of ten) close to range / target. */
static double nice_step(double range, int target)
{
    double raw = range / target;
    double mag = pow(10.0, floor(log10(raw)));
    double f = raw / mag;
    double nice = f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0;
    return nice * mag;
}

/* One axis: its range (widened to whole ticks) and its tick spacing. */
typedef struct axis {
    double lo, hi, tick;
} axis;

static axis make_axis(double lo, double hi, int target)
{
    if (!(hi > lo)) {
        double pad = fabs(lo) > 0 ? fabs(lo) * 0.1 : 1.0;
        lo -= pad;
        hi += pad;
    }
    axis a;
    a.tick = nice_step(hi - lo, target);
    a.lo = floor(lo / a.tick) * a.tick;
    a.hi = ceil(hi / a.tick) * a.tick;
    if (!(a.hi > a.lo))
        a.hi = a.lo + a.tick;
    return a;
}

/* The i-th tick value, with the rounding noise near zero removed (so 0 prints as "0", not 1e-17). */
static double tick_value(const axis *a, int i)
{
    double v = a->lo + i * a->tick;
    if (fabs(v) < a->tick * 1e-9)
        v = 0.0;
    return v;
}

static int tick_count(const axis *a)
{
    return (int)floor((a->hi - a->lo) / a->tick + 0.5) + 1;
}

/* A plotting area in pixels with its two axes. */
typedef struct panel {
    double x0, y0, w, h; /* pixels: left, top, width, height */
    axis x, y;
} panel;

static double px(const panel *p, double step)
{
    return p->x0 + (step - p->x.lo) / (p->x.hi - p->x.lo) * p->w;
}

static double py(const panel *p, double value)
{
    return p->y0 + p->h - (value - p->y.lo) / (p->y.hi - p->y.lo) * p->h;
}

/* Frame, grid, ticks and tick labels of a panel, and the rotated label of its y axis. */
static void draw_axes(sbuf *b, const panel *p, const char *y_label)
{
    sb_printf(b, "<g font-family=\"sans-serif\" font-size=\"11\" fill=\"#333333\">\n");
    int ny = tick_count(&p->y);
    for (int i = 0; i < ny; i++) {
        double v = tick_value(&p->y, i);
        double y = py(p, v);
        sb_printf(b, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#e4e4e4\" stroke-width=\"1\"/>\n",
                  p->x0, y, p->x0 + p->w, y);
        sb_printf(b, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#333333\" stroke-width=\"1\"/>\n",
                  p->x0 - 5, y, p->x0, y);
        sb_printf(b, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\">%.6g</text>\n", p->x0 - 8, y + 4, v);
    }
    int nx = tick_count(&p->x);
    for (int i = 0; i < nx; i++) {
        double v = tick_value(&p->x, i);
        double x = px(p, v);
        double bottom = p->y0 + p->h;
        sb_printf(b, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#333333\" stroke-width=\"1\"/>\n",
                  x, bottom, x, bottom + 5);
        sb_printf(b, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%.*f</text>\n", x, bottom + 18,
                  p->x.tick >= 1.0 ? 0 : 2, v);
    }
    sb_printf(b, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" stroke=\"#333333\" "
                 "stroke-width=\"1\"/>\n",
              p->x0, p->y0, p->w, p->h);
    double cx = p->x0 - 62, cy = p->y0 + p->h / 2;
    sb_printf(b, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"13\" text-anchor=\"middle\" "
                 "transform=\"rotate(-90 %.2f %.2f)\">%s</text>\n",
              cx, cy, cx, cy, y_label);
    sb_printf(b, "</g>\n");
}

static void draw_polyline(sbuf *b, const panel *p, const zt_plot_point *pts, size_t n, const char *color,
                          double width)
{
    if (n == 0)
        return;
    if (n == 1) {
        sb_printf(b, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2\" fill=\"%s\"/>\n", px(p, pts[0].step),
                  py(p, pts[0].value), color);
        return;
    }
    sb_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" stroke-linejoin=\"round\" points=\"",
              color, width);
    for (size_t i = 0; i < n; i++)
        sb_printf(b, "%s%.2f,%.2f", i ? " " : "", px(p, pts[i].step), py(p, pts[i].value));
    sb_printf(b, "\"/>\n");
}

static void draw_points(sbuf *b, const panel *p, const zt_plot_point *pts, size_t n, const char *color)
{
    for (size_t i = 0; i < n; i++)
        sb_printf(b, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\" fill=\"%s\" stroke=\"white\" stroke-width=\"0.8\"/>\n",
                  px(p, pts[i].step), py(p, pts[i].value), color);
}

static void range_of(const zt_plot_point *pts, size_t n, bool use_step, double *lo, double *hi)
{
    for (size_t i = 0; i < n; i++) {
        double v = use_step ? pts[i].step : pts[i].value;
        if (v < *lo)
            *lo = v;
        if (v > *hi)
            *hi = v;
    }
}

/* ---- the document -------------------------------------------------------------------------------- */

#define SVG_W 900
#define SVG_H 660
#define TRAIN_COLOR "#1f77b4"
#define VAL_COLOR "#e6550d"
#define LR_COLOR "#2ca02c"

int zt_plot_render_svg(const zt_plot_data *d, const char *title, char **out, size_t *len, zt_err *err)
{
    *out = NULL;
    *len = 0;
    if (d->n_loss == 0 && d->n_val_loss == 0)
        return zt_fail(err, ZT_EFORMAT, "there is no train or eval point to plot");

    double xlo = INFINITY, xhi = -INFINITY;
    range_of(d->loss, d->n_loss, true, &xlo, &xhi);
    range_of(d->val_loss, d->n_val_loss, true, &xlo, &xhi);
    range_of(d->lr, d->n_lr, true, &xlo, &xhi);
    double ylo = INFINITY, yhi = -INFINITY;
    range_of(d->loss, d->n_loss, false, &ylo, &yhi);
    range_of(d->val_loss, d->n_val_loss, false, &ylo, &yhi);

    const double left = 90, right = 30;
    panel loss = {.x0 = left, .y0 = 60, .w = SVG_W - left - right, .h = 360};
    loss.x = make_axis(xlo, xhi, 8);
    /* A little headroom so that a maximum on a tick does not run along the frame. */
    loss.y = make_axis(ylo, yhi + (yhi - ylo) * 0.02, 6);
    panel lr = {.x0 = left, .y0 = 470, .w = loss.w, .h = 130};
    lr.x = loss.x;
    if (d->n_lr > 0) {
        double rlo = INFINITY, rhi = -INFINITY;
        range_of(d->lr, d->n_lr, false, &rlo, &rhi);
        /* Learning rates start at or near zero: a zero baseline makes warmup and decay easy to read. */
        double base = rlo > 0 ? 0.0 : rlo;
        lr.y = make_axis(base, rhi + (rhi - base) * 0.05, 3);
    } else {
        lr.y = make_axis(0.0, 1.0, 2);
    }

    sbuf b = {0};
    sb_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n");
    sb_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
                  "viewBox=\"0 0 %d %d\">\n",
              SVG_W, SVG_H, SVG_W, SVG_H);
    sb_printf(&b, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n", SVG_W, SVG_H);
    if (title && title[0]) {
        sb_printf(&b, "<text x=\"%d\" y=\"32\" font-family=\"sans-serif\" font-size=\"18\" font-weight=\"bold\" "
                      "text-anchor=\"middle\" fill=\"#111111\">",
                  SVG_W / 2);
        sb_put_xml_text(&b, title);
        sb_printf(&b, "</text>\n");
    }

    /* Loss panel: train loss as a thin line, validation loss as points joined by a line. */
    draw_axes(&b, &loss, "loss");
    draw_polyline(&b, &loss, d->loss, d->n_loss, TRAIN_COLOR, 1.0);
    draw_polyline(&b, &loss, d->val_loss, d->n_val_loss, VAL_COLOR, 1.5);
    draw_points(&b, &loss, d->val_loss, d->n_val_loss, VAL_COLOR);

    /* Legend in the top right corner of the loss panel, one row per series that has data. */
    int rows = (d->n_loss > 0) + (d->n_val_loss > 0);
    double lx = loss.x0 + loss.w - 140, ly = loss.y0 + 10;
    sb_printf(&b, "<g font-family=\"sans-serif\" font-size=\"12\" fill=\"#333333\">\n");
    sb_printf(&b, "<rect x=\"%.2f\" y=\"%.2f\" width=\"130\" height=\"%d\" fill=\"white\" fill-opacity=\"0.9\" "
                  "stroke=\"#999999\" stroke-width=\"1\"/>\n",
              lx, ly, 8 + 20 * rows);
    double row_y = ly + 18;
    if (d->n_loss > 0) {
        sb_printf(&b, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" stroke-width=\"1.5\"/>\n",
                  lx + 10, row_y - 4, lx + 40, row_y - 4, TRAIN_COLOR);
        sb_printf(&b, "<text x=\"%.2f\" y=\"%.2f\">train loss</text>\n", lx + 48, row_y);
        row_y += 20;
    }
    if (d->n_val_loss > 0) {
        sb_printf(&b, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" stroke-width=\"1.5\"/>\n",
                  lx + 10, row_y - 4, lx + 40, row_y - 4, VAL_COLOR);
        sb_printf(&b, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\" fill=\"%s\"/>\n", lx + 25, row_y - 4, VAL_COLOR);
        sb_printf(&b, "<text x=\"%.2f\" y=\"%.2f\">val loss</text>\n", lx + 48, row_y);
    }
    sb_printf(&b, "</g>\n");

    /* Learning-rate panel. */
    draw_axes(&b, &lr, "learning rate");
    if (d->n_lr > 0)
        draw_polyline(&b, &lr, d->lr, d->n_lr, LR_COLOR, 1.5);
    else
        sb_printf(&b, "<text x=\"%.2f\" y=\"%.2f\" font-family=\"sans-serif\" font-size=\"12\" fill=\"#777777\" "
                      "text-anchor=\"middle\">no learning-rate values in the metrics</text>\n",
                  lr.x0 + lr.w / 2, lr.y0 + lr.h / 2);
    sb_printf(&b, "<text x=\"%.2f\" y=\"%.2f\" font-family=\"sans-serif\" font-size=\"13\" fill=\"#333333\" "
                  "text-anchor=\"middle\">step</text>\n",
              lr.x0 + lr.w / 2, lr.y0 + lr.h + 40);
    sb_printf(&b, "</svg>\n");

    if (b.failed) {
        free(b.p);
        return zt_fail(err, ZT_ENOMEM, "out of memory while drawing the plot");
    }
    *out = b.p;
    *len = b.len;
    return 0;
}

int zt_plot_metrics_file(const char *metrics_path, const char *svg_path, const char *title, zt_err *err)
{
    zt_plot_data d;
    int rc = zt_plot_data_read(&d, metrics_path, err);
    if (rc < 0) {
        zt_plot_data_free(&d);
        return rc;
    }
    if (d.n_skipped > 0)
        ZT_WARN("plot: skipped %zu malformed line%s of %zu in %s (first at line %zu)", d.n_skipped,
                d.n_skipped == 1 ? "" : "s", d.n_lines, metrics_path, d.first_skipped);

    char *svg = NULL;
    size_t len = 0;
    rc = zt_plot_render_svg(&d, title, &svg, &len, err);
    zt_plot_data_free(&d);
    if (rc < 0)
        return rc;
    rc = zt_write_file_atomic(svg_path, svg, len, err);
    free(svg);
    return rc;
}
