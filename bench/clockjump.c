/* A wall-clock step for one process, as NTP, a resumed VM or `date -s` makes it (bench/chaos.py,
 * scenario clock-jump): LD_PRELOAD'ed, it adds the whole seconds written in $CLOCKJUMP_FILE (re-read
 * every 0.2 s) to CLOCK_REALTIME, gettimeofday() and time(), and leaves CLOCK_MONOTONIC alone, as a
 * real step does. (libfaketime moves both, or breaks sleeps when told not to.) Built by the script
 * with `cc -shared -fPIC`. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static volatile long offset;
static volatile long long checked_ns = -1000000000LL;

static long current_offset(void) {
    struct timespec m;
    real_clock_gettime(CLOCK_MONOTONIC, &m);
    long long now = (long long)m.tv_sec * 1000000000LL + m.tv_nsec;
    if (now - checked_ns >= 200000000LL) {
        checked_ns = now;
        const char *path = getenv("CLOCKJUMP_FILE");
        FILE *f = path ? fopen(path, "re") : NULL;
        if (f) {
            long v;
            if (fscanf(f, "%ld", &v) == 1) offset = v;
            fclose(f);
        }
    }
    return offset;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (!real_clock_gettime) real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real_clock_gettime(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += current_offset();
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
