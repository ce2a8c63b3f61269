/* Tests of the metrics plot (worker/train/plot.h): parsing of metrics.jsonl (malformed lines skipped and
 * counted, repeated steps resolved to the last line), the SVG document (well-formed, escaped title,
 * coordinates inside the canvas and in the right direction) and the atomic file write. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/train/plot.h"

static char tmpdir[256];

static int make_tmpdir(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/zt_test_plot_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes text to tmpdir/name and returns the full path (static buffer, one at a time). */
static const char *write_tmp(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
    return path;
}

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Checks that doc is well-formed XML as far as an SVG writer can get it wrong: every element closed in
 * order, attribute values quoted, every '&' an entity. Fails the test at the first problem. */
static void assert_well_formed_xml(const char *doc)
{
    const char *stack[64];
    size_t stack_len[64];
    int depth = 0;
    int roots = 0;
    const char *p = doc;
    while (*p) {
        if (*p == '&') {
            static const char *entities[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
            bool ok = false;
            for (size_t i = 0; i < 5; i++)
                ok = ok || strncmp(p, entities[i], strlen(entities[i])) == 0;
            if (!ok)
                fail_msg("bare '&' at offset %td", p - doc);
            p++;
            continue;
        }
        if (*p == '>')
            fail_msg("bare '>' in text at offset %td", p - doc);
        if (*p != '<') {
            p++;
            continue;
        }
        if (p[1] == '?' || p[1] == '!') {
            const char *end = strchr(p, '>');
            assert_non_null(end);
            p = end + 1;
            continue;
        }
        if (p[1] == '/') {
            const char *name = p + 2;
            size_t n = strcspn(name, " >");
            assert_true(depth > 0);
            depth--;
            if (n != stack_len[depth] || strncmp(name, stack[depth], n) != 0)
                fail_msg("closing tag </%.*s> does not match <%.*s>", (int)n, name, (int)stack_len[depth],
                         stack[depth]);
            const char *end = strchr(name, '>');
            assert_non_null(end);
            p = end + 1;
            continue;
        }
        const char *name = p + 1;
        size_t n = strcspn(name, " />\n");
        assert_true(n > 0);
        const char *q = name + n;
        /* Attributes: skip quoted values, which may not contain '<'. */
        while (*q && *q != '>') {
            if (*q == '"') {
                const char *close = strchr(q + 1, '"');
                assert_non_null(close);
                for (const char *c = q + 1; c < close; c++)
                    assert_true(*c != '<');
                q = close + 1;
            } else {
                if (*q == '<')
                    fail_msg("'<' inside a tag at offset %td", q - doc);
                q++;
            }
        }
        assert_true(*q == '>');
        if (q[-1] != '/') {
            if (depth == 0)
                roots++;
            assert_true(depth < 64);
            stack[depth] = name;
            stack_len[depth] = n;
            depth++;
        } else if (depth == 0) {
            roots++;
        }
        p = q + 1;
    }
    assert_int_equal(depth, 0);
    assert_int_equal(roots, 1);
}

static size_t count_substr(const char *s, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static const char metrics_text[] =
    "{\"step\":3,\"loss\":4.0,\"lr\":3e-4,\"grad_norm\":1.5,\"tokens_per_s\":100,\"elapsed_s\":0.3}\n"
    "{\"step\":1,\"loss\":5.0,\"lr\":1e-4}\n"
    "this is not json\n"
    "\n"
    "{\"step\":2,\"loss\":4.5,\"lr\":2e-4}\n"
    "{\"loss\":9.0,\"lr\":1e-4}\n"               /* no step */
    "{\"step\":2,\"val_loss\":4.8}\n"
    "{\"step\":4,\"loss\":\"NaN\",\"lr\":4e-4}\n" /* loss is not a number */
    "[1,2,3]\n"
    "{\"step\":2,\"loss\":4.25,\"lr\":2e-4}\n"    /* repeats step 2 (a resumed run): this line wins */
    "   \t\n"
    "{\"step\":4,\"val_loss\":4.1}\n"
    "{\"step\":5,\"loss\":3.5}\n"                 /* no lr: a loss point only */
    "{\"step\":6,\"loss\":3.25,\"lr\":5e-4";      /* truncated last line, no newline */

static void test_read_skips_and_sorts(void **state)
{
    (void)state;
    const char *path = write_tmp("metrics.jsonl", metrics_text);
    zt_plot_data d;
    zt_err err = {{0}};
    assert_int_equal(zt_plot_data_read(&d, path, &err), 0);

    assert_int_equal(d.n_lines, 12);
    assert_int_equal(d.n_skipped, 5);
    assert_int_equal(d.first_skipped, 3);

    assert_int_equal(d.n_loss, 4);
    const double loss_steps[] = {1, 2, 3, 5};
    const double loss_values[] = {5.0, 4.25, 4.0, 3.5};
    for (size_t i = 0; i < 4; i++) {
        assert_true(d.loss[i].step == loss_steps[i]);
        assert_true(d.loss[i].value == loss_values[i]);
    }
    assert_int_equal(d.n_lr, 3);
    assert_true(d.lr[0].step == 1 && d.lr[0].value == 1e-4);
    assert_true(d.lr[1].step == 2 && d.lr[1].value == 2e-4);
    assert_true(d.lr[2].step == 3 && d.lr[2].value == 3e-4);
    assert_int_equal(d.n_val_loss, 2);
    assert_true(d.val_loss[0].step == 2 && d.val_loss[0].value == 4.8);
    assert_true(d.val_loss[1].step == 4 && d.val_loss[1].value == 4.1);
    zt_plot_data_free(&d);
    zt_plot_data_free(&d); /* a freed struct is zeroed, so a second free is harmless */
}

static void test_read_errors(void **state)
{
    (void)state;
    zt_plot_data d;
    zt_err err = {{0}};
    char missing[512];
    snprintf(missing, sizeof(missing), "%s/no_such_metrics.jsonl", tmpdir);
    assert_int_equal(zt_plot_data_read(&d, missing, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "no_such_metrics.jsonl"));
    zt_plot_data_free(&d);

    const char *empty = write_tmp("empty.jsonl", "\n\n");
    memset(&err, 0, sizeof(err));
    assert_int_equal(zt_plot_data_read(&d, empty, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "empty.jsonl"));
    assert_non_null(strstr(err.msg, "empty"));
    zt_plot_data_free(&d);

    const char *junk = write_tmp("junk.jsonl", "{\"step\":1}\nnot json\n{\"step\":\"x\",\"loss\":1}\n");
    memset(&err, 0, sizeof(err));
    assert_int_equal(zt_plot_data_read(&d, junk, &err), ZT_EFORMAT);
    assert_non_null(strstr(err.msg, "junk.jsonl"));
    assert_non_null(strstr(err.msg, "no train or eval points"));
    assert_int_equal(d.n_skipped, 3);
    zt_plot_data_free(&d);
}

/* Reads the numbers of the first polyline's points attribute after `from` into xs/ys; returns the count. */
static size_t parse_polyline(const char *from, double *xs, double *ys, size_t cap)
{
    const char *p = strstr(from, "<polyline");
    assert_non_null(p);
    p = strstr(p, "points=\"");
    assert_non_null(p);
    p += strlen("points=\"");
    size_t n = 0;
    while (*p != '"') {
        char *end;
        double x = strtod(p, &end);
        assert_true(end != p && *end == ',');
        double y = strtod(end + 1, &end);
        assert_true(n < cap);
        xs[n] = x;
        ys[n] = y;
        n++;
        p = end;
        while (*p == ' ')
            p++;
    }
    return n;
}

static void test_render_svg(void **state)
{
    (void)state;
    const char *path = write_tmp("metrics.jsonl", metrics_text);
    zt_plot_data d;
    zt_err err = {{0}};
    assert_int_equal(zt_plot_data_read(&d, path, &err), 0);

    char *svg = NULL;
    size_t len = 0;
    /* A title with markup characters, a control character and an invalid UTF-8 byte. */
    assert_int_equal(zt_plot_render_svg(&d, "loss <a> & \"b\"\t\xff \xc3\xa9", &svg, &len, &err), 0);
    assert_non_null(svg);
    assert_int_equal(strlen(svg), len);
    assert_true(strncmp(svg, "<?xml version=\"1.0\"", 19) == 0);
    assert_non_null(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\""));
    assert_well_formed_xml(svg);
    assert_non_null(strstr(svg, ">loss &lt;a&gt; &amp; &quot;b&quot;? \xc3\xa9</text>"));
    assert_null(strstr(svg, "nan"));
    assert_null(strstr(svg, "inf"));
    assert_non_null(strstr(svg, ">train loss</text>"));
    assert_non_null(strstr(svg, ">val loss</text>"));
    assert_non_null(strstr(svg, ">learning rate</text>"));
    assert_non_null(strstr(svg, ">step</text>"));
    /* Three polylines (train loss, val loss, lr); a circle per val point plus the legend's. */
    assert_int_equal(count_substr(svg, "<polyline"), 3);
    assert_int_equal(count_substr(svg, "<circle"), 3);

    /* Train loss: x grows with the step, y grows (downwards on screen) as the loss falls. */
    double xs[16], ys[16];
    size_t n = parse_polyline(svg, xs, ys, 16);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++) {
        assert_true(xs[i] > 0 && xs[i] < 900 && ys[i] > 0 && ys[i] < 660);
        if (i > 0) {
            assert_true(xs[i] > xs[i - 1]);
            assert_true(ys[i] > ys[i - 1]);
        }
    }
    /* The learning-rate polyline (the third one) lies below the loss panel and rises with the lr. */
    const char *third = strstr(strstr(strstr(svg, "<polyline") + 1, "<polyline") + 1, "<polyline");
    n = parse_polyline(third, xs, ys, 16);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++) {
        assert_true(ys[i] > 420 && ys[i] < 660);
        if (i > 0)
            assert_true(ys[i] < ys[i - 1]);
    }
    free(svg);
    zt_plot_data_free(&d);
}

static void test_render_degenerate(void **state)
{
    (void)state;
    /* One train point, no lr, no eval: still a valid document, with no NaN from a zero-width range. */
    const char *path = write_tmp("one.jsonl", "{\"step\":7,\"loss\":2.5}\n");
    zt_plot_data d;
    zt_err err = {{0}};
    assert_int_equal(zt_plot_data_read(&d, path, &err), 0);
    char *svg = NULL;
    size_t len = 0;
    assert_int_equal(zt_plot_render_svg(&d, NULL, &svg, &len, &err), 0);
    assert_well_formed_xml(svg);
    assert_null(strstr(svg, "nan"));
    assert_null(strstr(svg, "inf"));
    assert_non_null(strstr(svg, "no learning-rate values"));
    assert_null(strstr(svg, ">val loss</text>"));
    free(svg);
    zt_plot_data_free(&d);

    /* Only eval points, all equal. */
    path = write_tmp("flat.jsonl", "{\"step\":10,\"val_loss\":3}\n{\"step\":20,\"val_loss\":3}\n");
    assert_int_equal(zt_plot_data_read(&d, path, &err), 0);
    assert_int_equal(zt_plot_render_svg(&d, "flat", &svg, &len, &err), 0);
    assert_well_formed_xml(svg);
    assert_null(strstr(svg, "nan"));
    assert_null(strstr(svg, ">train loss</text>"));
    free(svg);
    zt_plot_data_free(&d);

    /* Nothing to draw is an error, not an empty picture. */
    zt_plot_data none;
    memset(&none, 0, sizeof(none));
    assert_int_equal(zt_plot_render_svg(&none, "x", &svg, &len, &err), ZT_EFORMAT);
    assert_null(svg);
}

static void test_metrics_file(void **state)
{
    (void)state;
    char metrics[512], out[512], tmp[520];
    snprintf(metrics, sizeof(metrics), "%s", write_tmp("m.jsonl", metrics_text));
    snprintf(out, sizeof(out), "%s/plot.svg", tmpdir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", out);
    zt_err err = {{0}};
    assert_int_equal(zt_plot_metrics_file(metrics, out, "run", &err), 0);
    assert_true(file_exists(out));
    assert_false(file_exists(tmp));

    /* The parent of the output is a regular file: an error naming the path, and nothing written. */
    char bad[600];
    snprintf(bad, sizeof(bad), "%s/plot.svg", metrics);
    memset(&err, 0, sizeof(err));
    assert_true(zt_plot_metrics_file(metrics, bad, "run", &err) < 0);
    assert_non_null(strstr(err.msg, "plot.svg"));
    assert_false(file_exists(bad));

    /* A metrics file with no points: an error, and no output file. */
    char none_out[512];
    snprintf(none_out, sizeof(none_out), "%s/none.svg", tmpdir);
    const char *junk = write_tmp("junk2.jsonl", "garbage\n");
    memset(&err, 0, sizeof(err));
    assert_int_equal(zt_plot_metrics_file(junk, none_out, NULL, &err), ZT_EFORMAT);
    assert_false(file_exists(none_out));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_skips_and_sorts),
        cmocka_unit_test(test_read_errors),
        cmocka_unit_test(test_render_svg),
        cmocka_unit_test(test_render_degenerate),
        cmocka_unit_test(test_metrics_file),
    };
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
