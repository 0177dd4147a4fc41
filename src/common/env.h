/* Every environment variable libstoke reads, read in env.c and nowhere else.
 * The README's table lists the same variables; keep them in step. */
#ifndef STOKE_ENV_H
#define STOKE_ENV_H

#include <stddef.h>
#include <stdint.h>

/* X(ID, "NAME", "description for messages") */
#define STOKE_ENV_MAP(X)                                                                           \
    X(LOG, "STOKE_LOG", "log level: error, warn, info, debug, trace")                              \
    X(ACCELERATOR, "STOKE_ACCELERATOR", "explicit accelerator name[:index]")                       \
    X(PLUGIN_PATH, "STOKE_PLUGIN_PATH", "colon-separated plugin files or directories")             \
    X(PINNED, "STOKE_PINNED", "0 disables pinning")                                                \
    X(PINNED_LIMIT, "STOKE_PINNED_LIMIT", "cap on pinned bytes")                           \
    X(CUDA_LIBRARY, "STOKE_CUDA_LIBRARY", "path of the CUDA driver library")                       \
    X(OPENCL_LIBRARY, "STOKE_OPENCL_LIBRARY", "path of the OpenCL ICD loader")                     \
    X(HIP_LIBRARY, "STOKE_HIP_LIBRARY", "path of the HIP runtime library")                         \
    X(RANK, "RANK", "torchrun rank")                                                               \
    X(WORLD_SIZE, "WORLD_SIZE", "torchrun world size")                                             \
    X(OMPI_RANK, "OMPI_COMM_WORLD_RANK", "Open MPI rank")                                          \
    X(OMPI_SIZE, "OMPI_COMM_WORLD_SIZE", "Open MPI world size")                                    \
    X(SLURM_RANK, "SLURM_PROCID", "Slurm rank")                                                    \
    X(SLURM_SIZE, "SLURM_NTASKS", "Slurm world size")                                              \
    X(ARENA, "STOKE_ARENA", "loader batches from the shared arena name[:size]")                    \
    X(TORCHELASTIC_RUN_ID, "TORCHELASTIC_RUN_ID", "torchrun job id (arena name)")                  \
    X(SLURM_JOB_ID, "SLURM_JOB_ID", "Slurm job id (arena name)")                                   \
    X(SLURM_STEP_ID, "SLURM_STEP_ID", "Slurm step id (arena name)")                                \
    X(OMPI_JOBID, "OMPI_MCA_ess_base_jobid", "Open MPI job id (arena name)")                       \
    X(LOCAL_WORLD_SIZE, "LOCAL_WORLD_SIZE", "torchrun processes on this node")                     \
    X(REMOTE_RETRIES, "STOKE_REMOTE_RETRIES", "retries of a failed remote read")                   \
    X(REMOTE_TIMEOUT, "STOKE_REMOTE_TIMEOUT", "seconds a remote read may go under 1 KiB/s")        \
    X(REMOTE_CONNECTIONS, "STOKE_REMOTE_CONNECTIONS", "remote requests at once (read-ahead)")      \
    X(REMOTE_CHECK_VERSION, "STOKE_REMOTE_CHECK_VERSION", "compare remote answers' ETag")          \
    X(STREAM_AHEAD, "STOKE_STREAM_AHEAD", "bytes a streaming worker holds ahead")          \
    X(CA_BUNDLE, "STOKE_CA_BUNDLE", "CA certificates for https (PEM file)")                        \
    X(CACHE_DIR, "STOKE_CACHE_DIR", "directory of the local cache of remote shards")               \
    X(CACHE_LIMIT, "STOKE_CACHE_LIMIT", "size cap of the remote-shard cache")            \
    X(PROBE_CACHE, "STOKE_PROBE_CACHE", "directory of the probe answers kept this boot, 0: none")  \
    X(OCL_ICD_VENDORS, "OCL_ICD_VENDORS", "the OpenCL ICD loader's vendor directory")              \
    X(AWS_ACCESS_KEY_ID, "AWS_ACCESS_KEY_ID", "S3 access key")                                     \
    X(AWS_SECRET_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY", "S3 secret key")                             \
    X(AWS_SESSION_TOKEN, "AWS_SESSION_TOKEN", "S3 session token")                                  \
    X(AWS_REGION, "AWS_REGION", "S3 region")                                                       \
    X(AWS_DEFAULT_REGION, "AWS_DEFAULT_REGION", "S3 region (older name)")                          \
    X(AWS_PROFILE, "AWS_PROFILE", "profile of the AWS credentials and config files")               \
    X(AWS_ENDPOINT_URL, "AWS_ENDPOINT_URL", "S3-compatible endpoint (path-style)")                 \
    X(AWS_ENDPOINT_URL_S3, "AWS_ENDPOINT_URL_S3", "S3 endpoint, before AWS_ENDPOINT_URL")          \
    X(AWS_CREDENTIALS_FILE, "AWS_SHARED_CREDENTIALS_FILE", "AWS credentials file")                 \
    X(AWS_CONFIG_FILE, "AWS_CONFIG_FILE", "AWS config file")                                       \
    X(HOME, "HOME", "home directory (~/.aws)")

typedef enum stoke_env_id {
#define STOKE__ENV_ENUM(id, name, desc) STOKE_ENV_##id,
    STOKE_ENV_MAP(STOKE__ENV_ENUM)
#undef STOKE__ENV_ENUM
        STOKE_ENV_COUNT_
} stoke_env_id;

/* Variable's name ("STOKE_LOG"). */
const char *stoke__env_name(stoke_env_id id);
/* Raw value, or NULL when unset or empty.  Read at each call (tests change them). */
const char *stoke__env_str(stoke_env_id id);
/* Boolean (1/0/true/false/yes/no/on/off, any case): *out set and 1 returned when set and
 * valid; 0 when unset; an invalid value warns once per call and returns 0. */
int stoke__env_bool(stoke_env_id id, int *out);
/* Size with optional K/M/G/T suffix (powers of 1024, optional trailing "B"/"iB"): as above. */
int stoke__env_size(stoke_env_id id, uint64_t *out);
/* Non-negative integer: as above. */
int stoke__env_u64(stoke_env_id id, uint64_t *out);

/* Rank and world size from the first pair of variables that is set (RANK / WORLD_SIZE, Open
 * MPI's, Slurm's): 1 with *rank and *world set; 0 when none is; STOKE_EINVAL (recorded, naming
 * `who`) when only one of a pair is. */
int stoke__env_dist(const char *who, uint64_t *rank, uint64_t *world);

/* Appends "NAME=VALUE\n" for every variable of the environment whose name starts with one of
 * `prefixes` or contains one of `parts` (NULL-terminated lists), in name order, to the string
 * `key` (`len` bytes with its NUL).  Returns 0, or -1 when they did not all fit (the key is
 * then unusable).  For fingerprints of what a probe depends on (backends/probe_cache.c). */
int stoke__env_matching(const char *const *prefixes, const char *const *parts, char *key,
                        size_t len);

/* Parsers behind them, for options that come from elsewhere (CLI flags).  Return 0 on success,
 * -1 on a malformed value. */
int stoke__parse_bool(const char *s, int *out);
int stoke__parse_size(const char *s, uint64_t *out);
int stoke__parse_u64(const char *s, uint64_t *out);

#endif
