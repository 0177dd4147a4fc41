/* What the fuzz targets share: check() (aborts with the file and line of a broken invariant,
 * which libFuzzer reports as a crash) and, in fuzz_support.c, the one formatting helper of
 * src/common the parsers under test use (status.c would bring the logger along). */
#ifndef STOKE_FUZZ_SUPPORT_H
#define STOKE_FUZZ_SUPPORT_H

void stoke_fuzz_check_at(int ok, const char *file, int line, const char *what);
#define check(ok) stoke_fuzz_check_at((ok) != 0, __FILE__, __LINE__, #ok)

#endif
