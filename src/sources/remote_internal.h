/* Private to the remote files: remote.c (the pool, its slots and the request engine: reads,
 * read_many through a libcurl multi handle, whole-file fetches, retries) and remote_aws.c (S3:
 * credentials, region and endpoint from the environment and ~/.aws, s3:// URLs turned into the
 * endpoint's, Signature V4 signing).  Built with libcurl only.  See remote.h. */
#ifndef STOKE_SOURCES_REMOTE_INTERNAL_H
#define STOKE_SOURCES_REMOTE_INTERNAL_H

#include <curl/curl.h>
#include <stddef.h>

#include "sources/remote.h"

/* A pool's S3 settings, read once at its create (remote_aws.c). */
typedef struct stoke__remote_aws {
    char region[64];
    char *endpoint;          /* AWS_ENDPOINT_URL(_S3) without a trailing '/'; NULL: AWS */
    char *userpwd;           /* "key:secret"; NULL: unsigned requests */
    struct curl_slist *hdrs; /* x-amz-content-sha256 (and x-amz-security-token) */
    char sigv4[96];          /* "aws:amz:REGION:s3" */
} stoke__remote_aws;

/* Fills *a (zeroed by the caller): the endpoint from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL,
 * the credentials from the environment, else the profile (AWS_PROFILE or "default") of the
 * credentials and config files, as the AWS tools do, and the region (default us-east-1).
 * Returns 0, or STOKE_EINVAL (an endpoint not http:// or https://, a bad region, AWS_PROFILE
 * without keys), STOKE_ENOMEM, with why set (never a secret).  Free with
 * stoke__remote_aws_free, after a failure too. */
int stoke__remote_aws_init(stoke__remote_aws *a, char *why, size_t why_len);
/* Frees what *a holds, the secret cleared first.  Thread-safe on distinct a. */
void stoke__remote_aws_free(stoke__remote_aws *a);

/* The URL to request for s3://BUCKET/KEY `url` (shown: url for messages, without user info):
 * path-style on the endpoint when there is one, else AWS's virtual host (path-style for a
 * dotted bucket), the key percent-encoded; malloc'd into *req.  0, or STOKE_EINVAL (not
 * s3://BUCKET/KEY), STOKE_ENOMEM, with why set. */
int stoke__remote_aws_url(const stoke__remote_aws *a, const char *url, const char *shown,
                          char **req, char *why, size_t why_len);

/* Sets h's headers and authentication for the next request of a file: for s3 (nonzero), S3's
 * headers, and Signature V4 (CURLOPT_AWS_SIGV4) when there are credentials; otherwise none
 * (user:password in an http(s) URL goes as Basic). */
void stoke__remote_aws_sign(const stoke__remote_aws *a, CURL *h, int s3);

/* s without leading and trailing white space (the end cleared in place). */
char *stoke__remote_trim(char *s);

#endif
