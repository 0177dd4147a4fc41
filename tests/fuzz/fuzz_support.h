/* What the fuzz targets share: check() (aborts with the file and line of a broken invariant,
 * which libFuzzer reports as a crash).  The parsers' own helpers (stoke__fmt, stoke__fail)
 * come from src/common, linked in (tests/fuzz/CMakeLists.txt). */
#ifndef STOKE_FUZZ_SUPPORT_H
#define STOKE_FUZZ_SUPPORT_H

void stoke_fuzz_check_at(int ok, const char *file, int line, const char *what);
#define check(ok) stoke_fuzz_check_at((ok) != 0, __FILE__, __LINE__, #ok)

#endif
