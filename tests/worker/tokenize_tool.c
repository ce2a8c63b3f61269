/* Runs `ztrain tokenize` (zt_cmd_tokenize) as its own program, for tests that check its files from
 * another language: tokenize_tool --input FILE --out-dir DIR ... */
#include "worker/cli/commands.h"

int main(int argc, char **argv)
{
    return zt_cmd_tokenize(argc, argv);
}
