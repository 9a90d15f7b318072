/* What the UDP test programs (shmem.c, timers.c, unixsock.c) share: the reply to one request,
 * built with put() (printf-style, appended, cut at REPLY_SIZE - 1 bytes and always
 * NUL-terminated; the caller sets olen = 0 before each request and sends olen bytes of out),
 * and die(). Define REPLY_SIZE before including this for another size than 4096.
 * testkit/src/programs.rs rebuilds a program when a header here is newer than its binary. */
#ifndef TARDI_TEST_REPLY_H
#define TARDI_TEST_REPLY_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef REPLY_SIZE
#define REPLY_SIZE 4096
#endif

static char out[REPLY_SIZE];
static size_t olen;

static void put(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void put(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out + olen, sizeof out - olen, fmt, ap);
    va_end(ap);
    if (n > 0) olen += (size_t)n < sizeof out - olen ? (size_t)n : sizeof out - olen - 1;
}

static void die(const char *w) {
    perror(w);
    exit(1);
}

#endif
