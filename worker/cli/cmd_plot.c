/* `ztrain plot`: draws a run's metrics.jsonl (train loss, validation loss, learning rate) as an SVG file,
 * written atomically. */
#include <getopt.h>
#include <stdio.h>

#include "common/log.h"
#include "common/status.h"
#include "worker/cli/commands.h"
#include "worker/train/plot.h"

static const char usage_text[] =
    "usage: ztrain plot --metrics FILE.jsonl --out FILE.svg [--title TEXT]\n"
    "\n"
    "Draws the train loss, validation loss and learning rate of a run as an SVG image.\n"
    "\n"
    "  --metrics FILE   the run's metrics.jsonl (written by 'ztrain train' in its --out directory)\n"
    "  --out FILE       the SVG file to write (replaced atomically if it exists)\n"
    "  --title TEXT     title above the plot (default: the metrics file's path)\n"
    "  --help           print this help\n";

/* Prints one usage error line and returns the usage exit status. */
static int usage_error(const char *msg)
{
    fprintf(stderr, "ztrain: error: plot: %s; run 'ztrain plot --help' for the flags\n", msg);
    return 2;
}

/* Runs `ztrain plot`: reads the metrics file, writes the SVG atomically, and returns the exit status
 * (0 written, 1 a file could not be read or written or held nothing to plot, 2 bad flags). */
int zt_cmd_plot(int argc, char **argv)
{
    enum { OPT_METRICS = 1000, OPT_OUT, OPT_TITLE, OPT_HELP };
    static const struct option options[] = {
        {"metrics", required_argument, NULL, OPT_METRICS},
        {"out", required_argument, NULL, OPT_OUT},
        {"title", required_argument, NULL, OPT_TITLE},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    const char *metrics = NULL, *out = NULL, *title = NULL;
    char msg[ZT_ERR_LEN];

    opterr = 0; /* we print our own one-line messages */
    optind = 0; /* glibc: restart scanning at argv[1] even if getopt ran before */
    for (;;) {
        int c = getopt_long(argc, argv, ":", options, NULL);
        if (c == -1)
            break;
        switch (c) {
        case OPT_METRICS: metrics = optarg; break;
        case OPT_OUT: out = optarg; break;
        case OPT_TITLE: title = optarg; break;
        case OPT_HELP: fputs(usage_text, stdout); return 0;
        case ':':
            snprintf(msg, sizeof(msg), "%s needs a value", argv[optind - 1]);
            return usage_error(msg);
        default:
            snprintf(msg, sizeof(msg), "unknown flag '%s'", argv[optind - 1]);
            return usage_error(msg);
        }
    }
    if (optind < argc) {
        snprintf(msg, sizeof(msg), "unexpected argument '%s'", argv[optind]);
        return usage_error(msg);
    }
    if (!metrics)
        return usage_error("--metrics FILE.jsonl is required (the metrics.jsonl of a run)");
    if (!out)
        return usage_error("--out FILE.svg is required");

    zt_err err = {{0}};
    if (zt_plot_metrics_file(metrics, out, title ? title : metrics, &err) < 0) {
        fprintf(stderr, "ztrain: error: %s\n", err.msg);
        return 1;
    }
    ZT_INFO("plot: wrote %s", out);
    return 0;
}
