/* Shard patterns of the tar source (tar_shards.c): brace groups expanded before tar.c globs
 * what is left of each. */
#ifndef STOKE_SOURCES_TAR_SHARDS_H
#define STOKE_SOURCES_TAR_SHARDS_H

/* The most shards a tar: spec may name, and the most values one {A..B} range may have. */
#define STOKE__TAR_SHARDS_MAX 1000000

/* Called with each pattern left without a '{': 0 to go on, else the error to stop with. */
typedef int (*stoke__tar_leaf_fn)(void *ctx, const char *pat);

/* Expands the first brace group of pat, recursively, in order: {A..B} (decimal, ascending or
 * descending, zero-padded to the longer end's width when either end has a leading zero) or
 * {x,y,...} (items may hold groups of their own, as braceexpand's), and calls leaf(ctx, p) for
 * every pattern p without a '{' it makes.  Returns 0, leaf's first nonzero return, or
 * STOKE_EINVAL ('{' without '}'; groups nested more than 16 deep), STOKE_ELIMIT (a range of
 * more than STOKE__TAR_SHARDS_MAX values), STOKE_ENOMEM, the error set naming spec. */
int stoke__tar_expand(const char *spec, const char *pat, stoke__tar_leaf_fn leaf, void *ctx);

#endif
