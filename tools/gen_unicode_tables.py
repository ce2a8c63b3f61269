#!/usr/bin/env python3
"""Generates worker/data/unicode_tables.c, the Unicode data of ztrain's tokenizers, from Python's unicodedata.

    python3 tools/gen_unicode_tables.py [OUTPUT]      (default: worker/data/unicode_tables.c)
    python3 tools/gen_unicode_tables.py --check FILE  (exit 0 if FILE is what this Python would write,
                                                       1 if it differs, 77 if this Python has another
                                                       Unicode version than the committed tables)

The tables (Unicode version: that of the Python that runs this; the committed file says which):
  - general category of every code point (two-stage table, 256 code points per block);
  - simple and full lowercase mapping of each code point (what Rust's char::to_lowercase gives, which
    is Python's str.lower() of the code point alone: no context such as Greek final sigma);
  - canonical decomposition of each code point, fully expanded (NFD of the code point alone), except
    Hangul syllables, which the C code decomposes algorithmically;
  - canonical combining class of each code point whose class is not 0 (for NFD's canonical ordering);
  - compatibility decomposition of each code point whose NFKD differs from its NFD, fully expanded (NFKD of
    the code point alone), and the primary composites of canonical composition: (first, second) ->
    composite for every code point that NFC composes back from its two-character canonical decomposition
    (composition exclusions and singletons left out), Hangul excepted (for NFKC).
White_Space and the CJK blocks of the BERT normalizer are short fixed lists kept in worker/data/unicode.c.
"""
import sys
import unicodedata

EXPECTED_VERSION = "14.0.0"  # the version of the committed tables (Debian 12's Python 3.11)

CATEGORIES = ["Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe",
              "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co"]
MAX_CP = 0x110000
BLOCK = 256


def is_hangul_syllable(cp):
    return 0xAC00 <= cp <= 0xD7A3


def c_array(ctype, name, values, per_line=16, fmt="{}"):
    lines = [f"const {ctype} {name}[{len(values)}] = {{"]
    for i in range(0, len(values), per_line):
        lines.append("    " + ", ".join(fmt.format(v) for v in values[i:i + per_line]) + ",")
    lines.append("};")
    return "\n".join(lines)


def generate():
    cat_index = {c: i for i, c in enumerate(CATEGORIES)}
    # General categories: stage1[cp >> 8] is a block number, stage2[block * 256 + (cp & 255)] the category.
    blocks, block_ids, stage1 = [], {}, []
    for start in range(0, MAX_CP, BLOCK):
        block = tuple(cat_index[unicodedata.category(chr(cp))] for cp in range(start, start + BLOCK))
        if block not in block_ids:
            block_ids[block] = len(blocks)
            blocks.append(block)
        stage1.append(block_ids[block])
    stage2 = [v for b in blocks for v in b]

    # Lowercase: (code point, start in the pool, length) sorted by code point.
    lower, lower_pool = [], []
    for cp in range(MAX_CP):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        lo = chr(cp).lower()
        if lo != chr(cp):
            lower.append((cp, len(lower_pool), len(lo)))
            lower_pool.extend(ord(c) for c in lo)

    # Canonical decompositions (fully expanded), Hangul syllables excepted.
    nfd, nfd_pool = [], []
    for cp in range(MAX_CP):
        if 0xD800 <= cp <= 0xDFFF or is_hangul_syllable(cp):
            continue
        d = unicodedata.normalize("NFD", chr(cp))
        if d != chr(cp):
            nfd.append((cp, len(nfd_pool), len(d)))
            nfd_pool.extend(ord(c) for c in d)

    # Canonical combining classes, as ranges of equal class: (first, last, class).
    ccc = []
    for cp in range(MAX_CP):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        k = unicodedata.combining(chr(cp))
        if k == 0:
            continue
        if ccc and ccc[-1][1] == cp - 1 and ccc[-1][2] == k:
            ccc[-1] = (ccc[-1][0], cp, k)
        else:
            ccc.append((cp, cp, k))

    # Compatibility decompositions (where NFKD differs from NFD), fully expanded.
    nfkd, nfkd_pool = [], []
    for cp in range(MAX_CP):
        if 0xD800 <= cp <= 0xDFFF or is_hangul_syllable(cp):
            continue
        d = unicodedata.normalize("NFKD", chr(cp))
        if d != unicodedata.normalize("NFD", chr(cp)):
            nfkd.append((cp, len(nfkd_pool), len(d)))
            nfkd_pool.extend(ord(c) for c in d)

    # Primary composites: pairs sorted by (first, second).
    comp = []
    for cp in range(MAX_CP):
        if 0xD800 <= cp <= 0xDFFF or is_hangul_syllable(cp):
            continue
        fields = unicodedata.decomposition(chr(cp)).split()
        if len(fields) != 2 or fields[0].startswith("<"):
            continue
        pair = "".join(chr(int(f, 16)) for f in fields)
        if unicodedata.normalize("NFC", pair) == chr(cp):
            comp.append((ord(pair[0]), ord(pair[1]), cp))
    comp.sort()

    out = []
    out.append("/* Unicode data for ztrain's tokenizers (worker/data/unicode.h). GENERATED by "
               "tools/gen_unicode_tables.py\n"
               f" * from Python's unicodedata, Unicode {unicodedata.unidata_version}: do not edit; "
               "run the script again instead. */")
    out.append('#include "worker/data/unicode.h"\n')
    out.append(f'const char zt__unicode_tables_version[] = "{unicodedata.unidata_version}";\n')
    out.append("/* General category (enum zt_ucat) of code point cp: "
               "zt__uc_cat_stage2[zt__uc_cat_stage1[cp >> 8] * 256 + (cp & 255)]. */")
    out.append(c_array("uint16_t", "zt__uc_cat_stage1", stage1, per_line=16))
    out.append(c_array("uint8_t", "zt__uc_cat_stage2", stage2, per_line=32))
    out.append(f"const int zt__uc_lower_count = {len(lower)};")
    out.append("/* Lowercase mappings: code point, start in zt__uc_lower_pool, length; sorted by code point. */")
    out.append(c_array("zt__uc_map", "zt__uc_lower", lower, per_line=4,
                       fmt="{{0x{0[0]:04X}, {0[1]}, {0[2]}}}"))
    out.append(c_array("uint32_t", "zt__uc_lower_pool", lower_pool, per_line=10, fmt="0x{:04X}"))
    out.append(f"const int zt__uc_nfd_count = {len(nfd)};")
    out.append("/* Canonical decompositions, fully expanded (Hangul syllables are decomposed in code). */")
    out.append(c_array("zt__uc_map", "zt__uc_nfd", nfd, per_line=4, fmt="{{0x{0[0]:04X}, {0[1]}, {0[2]}}}"))
    out.append(c_array("uint32_t", "zt__uc_nfd_pool", nfd_pool, per_line=10, fmt="0x{:04X}"))
    out.append(f"const int zt__uc_ccc_count = {len(ccc)};")
    out.append("/* Canonical combining classes other than 0, as ranges: first, last, class. */")
    out.append(c_array("zt__uc_range", "zt__uc_ccc", ccc, per_line=4,
                       fmt="{{0x{0[0]:04X}, 0x{0[1]:04X}, {0[2]}}}"))
    out.append(f"const int zt__uc_nfkd_count = {len(nfkd)};")
    out.append("/* Compatibility decompositions where NFKD differs from NFD, fully expanded. */")
    out.append(c_array("zt__uc_map", "zt__uc_nfkd", nfkd, per_line=4, fmt="{{0x{0[0]:04X}, {0[1]}, {0[2]}}}"))
    out.append(c_array("uint32_t", "zt__uc_nfkd_pool", nfkd_pool, per_line=10, fmt="0x{:04X}"))
    out.append(f"const int zt__uc_comp_count = {len(comp)};")
    out.append("/* Canonical composition: first, second, composite; sorted by first, then second. */")
    out.append(c_array("zt__uc_pair", "zt__uc_comp", comp, per_line=4,
                       fmt="{{0x{0[0]:04X}, 0x{0[1]:04X}, 0x{0[2]:04X}}}"))
    return "\n".join(out) + "\n"


def main():
    args = sys.argv[1:]
    if args and args[0] == "--check":
        if len(args) != 2:
            sys.exit(__doc__)
        if unicodedata.unidata_version != EXPECTED_VERSION:
            print(f"skipped: this Python has Unicode {unicodedata.unidata_version}, the committed tables "
                  f"{EXPECTED_VERSION}")
            sys.exit(77)
        with open(args[1], encoding="utf-8") as f:
            same = f.read() == generate()
        print("ok: the tables are up to date" if same else
              f"FAIL: {args[1]} differs from what tools/gen_unicode_tables.py writes; run it again")
        sys.exit(0 if same else 1)
    path = args[0] if args else "worker/data/unicode_tables.c"
    if unicodedata.unidata_version != EXPECTED_VERSION:
        print(f"note: this Python has Unicode {unicodedata.unidata_version}; the tables were "
              f"{EXPECTED_VERSION} (update EXPECTED_VERSION and the docs if this is on purpose)",
              file=sys.stderr)
    with open(path, "w", encoding="utf-8") as f:
        f.write(generate())
    print(f"wrote {path} (Unicode {unicodedata.unidata_version})")


if __name__ == "__main__":
    main()
