/* SYNC_FLUSH group commit, the part that runs without the GIL (RocketMQ's GroupCommitService).
 *
 * Writers append (pwrite) and then wait here until everything below their record's end offset is
 * durable; the flush thread waits here for requests, fdatasyncs the segment once for all of them
 * and wakes them (one at a time, see "Waking writers" below).  Puts that arrive while an fdatasync runs are covered by the next one (the
 * request "list" is just the largest end offset asked for).  Neither side holds the GIL while it
 * waits or syncs, so a round costs one fdatasync plus one wake-up per writer: no Python Condition,
 * no Future, and no GIL hand-off on the flush thread between rounds.
 *
 * The flush thread serves rounds natively while every request lies in the segment it was given
 * (and everything before that segment is durable); anything else — a request past the segment end
 * after a roll, a round whose Futures must be resolved, time for bookkeeping — makes rmq_gc_serve
 * return to Python, which flushes through the general path and reports back with rmq_gc_complete.
 */
#ifndef RMQ_STORE_GROUP_COMMIT_H
#define RMQ_STORE_GROUP_COMMIT_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum {
    RMQ_GC_OK = 0,          /* durable (await) / round done (serve) */
    RMQ_GC_TIMEOUT = 1,     /* await: not durable within the timeout; serve: nothing to do in time */
    RMQ_GC_STOPPED = 2,
    RMQ_GC_NEED_FLUSH = 3,  /* serve: pending requests outside the segment: flush in Python */
    RMQ_GC_RETURN = 4,      /* serve: a round done and the caller asked to see each one */
    RMQ_GC_IO_ERROR = 5,    /* serve: fdatasync failed (errno in last_errno) */
};

/* Writers covered by round r sleep on done[r % 4]: the baton of one round is still being passed
 * while the next one or two complete, and each round's writers must be woken separately. */
#define RMQ_GC_SLOTS 4

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t work;      /* the flush thread waits here for requests */
    pthread_cond_t done[RMQ_GC_SLOTS]; /* writers wait here, by the round that covers them (mod 4) */
    int sleepers[RMQ_GC_SLOTS];        /* writers asleep on done[i] ... */
    int64_t target[RMQ_GC_SLOTS];      /* ... for round target[i] (the latest to sleep there) */
    int64_t rounds_started;   /* native rounds whose requested offset was taken */
    int64_t requested;        /* largest end offset asked to be durable */
    int64_t requested_ts;     /* largest store timestamp among those requests */
    int64_t flushed;          /* every byte below is durable */
    int64_t flushed_ts;       /* store timestamp of a record known durable (checkpoint) */
    int64_t rounds;           /* fdatasync rounds served natively (failed ones too) */
    int64_t rounds_failed;
    int64_t sync_ns;          /* time spent in native fdatasync rounds (instrumentation) */
    int64_t idle_ns;          /* time the serving thread waited for requests */
    int64_t awaits;           /* writers that had to wait for a round */
    int serving;              /* the flush thread is waiting on `work` */
    int return_each_round;    /* serve returns after every round (Futures to resolve) */
    int stopped;              /* no more waiting: awaits answer RMQ_GC_STOPPED */
    int halted;               /* the flush thread leaves rmq_gc_serve (its last flush follows) */
    int kicked;               /* rmq_gc_serve returns once (the caller changed how to serve) */
    int last_errno;
    /* An event loop resolves the Futures itself (GroupCommitService.attach_loop): after a round
     * that covers a Future's request, the flush thread writes to notify_fd (an eventfd or pipe the
     * loop reads) and keeps serving - it never waits for the GIL between rounds. */
    pthread_mutex_t notify_mu; /* guards notify_fd and every write to it (not mu: writers must
                                * not queue behind a syscall) */
    int notify_fd;            /* -1: no loop; Futures are resolved by the flush thread */
    int notifying;            /* (under mu) a loop is attached: rounds ping it */
    int64_t notify_end;       /* largest end offset asked for by a request with a Future */
    int64_t notified;         /* the loop has been told about everything durable below this */
} rmq_gc;

static inline void rmq_gc_deadline(struct timespec *ts, int64_t ns)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ns / 1000000000);
    ts->tv_nsec += (long)(ns % 1000000000);
    if (ts->tv_nsec >= 1000000000) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000;
    }
}

static inline int64_t rmq_gc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int rmq_gc_past(const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > deadline->tv_sec || (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec);
}

static int rmq_gc_init(rmq_gc *g)
{
    pthread_condattr_t ca;
    int i;
    memset(g, 0, sizeof(*g));
    g->notify_fd = -1;
    if (pthread_mutex_init(&g->mu, NULL)) return -1;
    if (pthread_mutex_init(&g->notify_mu, NULL)) return -1;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);  /* timeouts immune to wall-clock steps */
    if (pthread_cond_init(&g->work, &ca)) {
        pthread_condattr_destroy(&ca);
        return -1;
    }
    for (i = 0; i < RMQ_GC_SLOTS; i++) {
        if (pthread_cond_init(&g->done[i], &ca)) {
            pthread_condattr_destroy(&ca);
            return -1;
        }
    }
    pthread_condattr_destroy(&ca);
    return 0;
}

static void rmq_gc_destroy(rmq_gc *g)
{
    pthread_cond_destroy(&g->work);
    int i;
    for (i = 0; i < RMQ_GC_SLOTS; i++) pthread_cond_destroy(&g->done[i]);
    pthread_mutex_destroy(&g->mu);
    pthread_mutex_destroy(&g->notify_mu);
}

/* Waking writers.  After a native round only ONE writer it covers is woken; that writer, once it
 * has run its Python and calls rmq_gc_await again (GIL released), wakes the next one (the baton).
 * So each writer is woken exactly when the GIL is free for it — one wake-up per put instead of a
 * herd that wakes at once only to queue on the GIL (on two cores, the herd's context switches
 * cost more than the puts).  A baton that is not passed on (the thread stopped putting) is
 * replaced by the flush thread, which wakes every covered writer after RMQ_GC_BATON_NS without
 * progress.  Rounds flushed through Python, resets and stops wake everybody. */
#define RMQ_GC_BATON_NS 500000

/* Caller holds mu: writers asleep on done[p] are covered by a completed round. */
static inline int rmq_gc_covered(const rmq_gc *g, int p)
{
    return g->sleepers[p] > 0 && g->rounds >= g->target[p];
}

static inline void rmq_gc_wake_all(rmq_gc *g)
{
    int i;
    for (i = 0; i < RMQ_GC_SLOTS; i++) pthread_cond_broadcast(&g->done[i]);
}

static inline int rmq_gc_any_covered(const rmq_gc *g)
{
    int i;
    for (i = 0; i < RMQ_GC_SLOTS; i++)
        if (rmq_gc_covered(g, i)) return 1;
    return 0;
}

/* Caller holds mu.  Returns whether the flush thread must be woken: the caller signals `work`
 * after unlocking, so the woken thread does not run straight into the held mutex. */
static inline int rmq_gc_note_request(rmq_gc *g, int64_t end, int64_t store_ts)
{
    /* atomic: the serving thread polls it without mu right after a round (rmq_gc_poll_request) */
    if (end > g->requested) __atomic_store_n(&g->requested, end, __ATOMIC_RELEASE);
    if (store_ts > g->requested_ts) g->requested_ts = store_ts;
    return g->serving;
}

/* Tell the loop (if one is attached) that Futures may be resolvable.  Called without mu; under
 * notify_mu, so once a detach (which takes notify_mu) returns, no write to its descriptor is under
 * way and it may be closed.  The descriptor is non-blocking: a full pipe means a wake-up is already
 * pending, which is all the loop needs. */
static void rmq_gc_ping(rmq_gc *g)
{
    uint64_t one = 1;
    ssize_t n;
    pthread_mutex_lock(&g->notify_mu);
    if (g->notify_fd >= 0) {
        do {
            n = write(g->notify_fd, &one, sizeof(one));
        } while (n < 0 && errno == EINTR);
    }
    pthread_mutex_unlock(&g->notify_mu);
}

/* Caller holds mu, after `flushed` moved: whether the loop must hear of a request with a Future
 * it now covers (the caller pings after unlocking). */
static inline int rmq_gc_ping_due(rmq_gc *g)
{
    if (!g->notifying || g->notify_end <= g->notified || g->flushed <= g->notified) return 0;
    g->notified = g->flushed;
    return 1;
}

/* Rounds started so far, read without mu: a request made now is covered by round epoch + 1 at
 * the latest (a little later if a round starts before the request reaches the gate). */
static inline int64_t rmq_gc_epoch(rmq_gc *g)
{
    return __atomic_load_n(&g->rounds_started, __ATOMIC_ACQUIRE);
}

/* Ask for bytes below `end` to become durable without waiting.  return_each_round: the serving
 * thread returns after the next round (it has Futures to resolve); notify: the request has a
 * Future the attached loop resolves (pinged after the round that covers it - or now, when it is
 * covered already). */
static void rmq_gc_request(rmq_gc *g, int64_t end, int64_t store_ts, int return_each_round, int notify)
{
    int wake = 0, ping = 0;
    pthread_mutex_lock(&g->mu);
    if (return_each_round) g->return_each_round = 1;
    if (notify && end > g->notify_end) g->notify_end = end;
    if (end > g->flushed) wake = rmq_gc_note_request(g, end, store_ts);
    else if (return_each_round) wake = g->serving;
    else ping = notify && g->notifying;  /* durable already: no round will ping for it */
    pthread_mutex_unlock(&g->mu);
    if (wake) pthread_cond_signal(&g->work);
    if (ping) rmq_gc_ping(g);
}

/* Attach (fd >= 0) or detach (-1) the loop's descriptor.  Attaching pings it once, so Futures
 * of requests made before are looked at. */
static void rmq_gc_set_notify_fd(rmq_gc *g, int fd)
{
    pthread_mutex_lock(&g->notify_mu);
    g->notify_fd = fd;
    pthread_mutex_unlock(&g->notify_mu);
    pthread_mutex_lock(&g->mu);
    g->notifying = fd >= 0;
    g->notified = g->flushed;
    /* requests made before have Futures too (resolved by whichever side sees them covered) */
    if (g->requested > g->notify_end) g->notify_end = g->requested;
    pthread_mutex_unlock(&g->mu);
    if (fd >= 0) rmq_gc_ping(g);
}

/* A writer: wait until bytes below `end` are durable, at most timeout_ns. */
static int rmq_gc_await(rmq_gc *g, int64_t end, int64_t store_ts, int64_t timeout_ns)
{
    struct timespec deadline;
    int64_t target;
    int r, p, rc;
    pthread_mutex_lock(&g->mu);
    if (g->flushed >= end) {
        pthread_mutex_unlock(&g->mu);
        return RMQ_GC_OK;
    }
    if (g->stopped) {
        pthread_mutex_unlock(&g->mu);
        return RMQ_GC_STOPPED;
    }
    /* the first round to take the requested offset after this request covers it */
    target = g->rounds_started + 1;
    if (rmq_gc_note_request(g, end, store_ts)) {
        /* the flush thread sleeps on `work` under mu: wake it after dropping mu */
        pthread_mutex_unlock(&g->mu);
        pthread_cond_signal(&g->work);
        pthread_mutex_lock(&g->mu);
    }
    /* the baton: this thread holds no GIL now, so a covered writer may run */
    for (p = 0; p < RMQ_GC_SLOTS; p++)
        if (rmq_gc_covered(g, p)) pthread_cond_signal(&g->done[p]);
    rmq_gc_deadline(&deadline, timeout_ns);
    g->awaits++;
    while (g->flushed < end && !g->stopped) {
        /* that round done and still not durable (it failed, or Python flushes this one): the
         * request stands, so the next round to start covers it */
        if (g->rounds >= target) target = g->rounds_started + 1;
        p = (int)(target % RMQ_GC_SLOTS);
        g->target[p] = target;
        g->sleepers[p]++;
        rc = pthread_cond_timedwait(&g->done[p], &g->mu, &deadline);
        g->sleepers[p]--;
        if (rc == ETIMEDOUT) break;
    }
    r = g->flushed >= end ? RMQ_GC_OK : g->stopped ? RMQ_GC_STOPPED : RMQ_GC_TIMEOUT;
    pthread_mutex_unlock(&g->mu);
    return r;
}

/* The flush thread, after flushing through Python: everything below `flushed` is durable. */
static void rmq_gc_complete(rmq_gc *g, int64_t flushed, int64_t store_ts)
{
    int ping;
    pthread_mutex_lock(&g->mu);
    if (flushed > g->flushed) {
        g->flushed = flushed;
        if (store_ts > g->flushed_ts) g->flushed_ts = store_ts;
    }
    rmq_gc_wake_all(g);
    ping = rmq_gc_ping_due(g);
    pthread_mutex_unlock(&g->mu);
    if (ping) rmq_gc_ping(g);
}

/* Set the durable offset outright (recovery, truncation): later requests compare against it. */
static void rmq_gc_reset(rmq_gc *g, int64_t flushed)
{
    pthread_mutex_lock(&g->mu);
    g->flushed = flushed;
    if (g->requested < flushed) g->requested = flushed;
    rmq_gc_wake_all(g);
    pthread_mutex_unlock(&g->mu);
}

/* Make a running rmq_gc_serve return once, before its next round. */
static void rmq_gc_kick(rmq_gc *g)
{
    pthread_mutex_lock(&g->mu);
    g->kicked = 1;
    pthread_cond_broadcast(&g->work);
    pthread_mutex_unlock(&g->mu);
}

/* Make rmq_gc_serve return (the flush thread's final flush still releases the writers). */
static void rmq_gc_halt(rmq_gc *g)
{
    pthread_mutex_lock(&g->mu);
    g->halted = 1;
    pthread_cond_broadcast(&g->work);
    pthread_mutex_unlock(&g->mu);
}

static void rmq_gc_stop(rmq_gc *g)
{
    pthread_mutex_lock(&g->mu);
    g->stopped = 1;
    g->halted = 1;
    pthread_cond_broadcast(&g->work);
    rmq_gc_wake_all(g);
    pthread_mutex_unlock(&g->mu);
}

/* How long the serving thread polls for the next request after a round before it sleeps. */
#define RMQ_GC_POLL_NS 30000

static inline void rmq_gc_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Poll (mu not held) until a request past the durable offset arrives, or the serving thread is
 * told to return, or RMQ_GC_POLL_NS pass. */
static void rmq_gc_poll_request(rmq_gc *g)
{
    int64_t until = rmq_gc_now_ns() + RMQ_GC_POLL_NS;
    int64_t flushed = __atomic_load_n(&g->flushed, __ATOMIC_ACQUIRE);
    int i;
    for (;;) {
        for (i = 0; i < 64; i++) {
            if (__atomic_load_n(&g->requested, __ATOMIC_ACQUIRE) > flushed) return;
            rmq_gc_cpu_relax();
        }
        if (__atomic_load_n(&g->halted, __ATOMIC_RELAXED) || __atomic_load_n(&g->kicked, __ATOMIC_RELAXED)
            || rmq_gc_now_ns() >= until)
            return;
    }
}

/* The flush thread: serve rounds on the segment [seg_from, seg_end) whose descriptor is fd, for at
 * most budget_ns; return_each_round: return after each round (the caller has Futures to resolve).
 * *upto gets the requested offset when returning RMQ_GC_NEED_FLUSH. */
static int rmq_gc_serve(rmq_gc *g, int fd, int64_t seg_from, int64_t seg_end, int64_t budget_ns,
                        int return_each_round, int64_t *upto)
{
    struct timespec deadline, baton, *until;
    int64_t want, want_ts, t0;
    int rc, stalled, p, err, polled;
    rmq_gc_deadline(&deadline, budget_ns);
    pthread_mutex_lock(&g->mu);
    for (;;) {
        if (g->kicked) {
            g->kicked = 0;
            pthread_mutex_unlock(&g->mu);
            return RMQ_GC_OK;
        }
        polled = 0;
        while (g->requested <= g->flushed && !g->halted && !g->kicked) {
            if (!polled && !rmq_gc_any_covered(g)) {
                /* right after a round, under load, the next request is microseconds away: poll
                 * for it instead of sleeping, so requesters need not wake this thread (a futex
                 * call on their side, an IPI to an idle vCPU on this one) */
                polled = 1;
                pthread_mutex_unlock(&g->mu);
                rmq_gc_poll_request(g);
                pthread_mutex_lock(&g->mu);
                continue;
            }
            /* covered writers still asleep: if the baton does not reach them soon, wake them all */
            stalled = rmq_gc_any_covered(g);
            until = &deadline;
            if (stalled) {
                rmq_gc_deadline(&baton, RMQ_GC_BATON_NS);
                if (baton.tv_sec < deadline.tv_sec || (baton.tv_sec == deadline.tv_sec && baton.tv_nsec < deadline.tv_nsec))
                    until = &baton;
            }
            g->serving = 1;
            t0 = rmq_gc_now_ns();
            rc = pthread_cond_timedwait(&g->work, &g->mu, until);
            g->idle_ns += rmq_gc_now_ns() - t0;
            g->serving = 0;
            if (g->kicked) break;
            if (rc == ETIMEDOUT && until == &baton) {
                if (rmq_gc_any_covered(g)) rmq_gc_wake_all(g);
                continue;
            }
            if (rc == ETIMEDOUT && g->requested <= g->flushed) {
                if (rmq_gc_any_covered(g)) rmq_gc_wake_all(g);
                pthread_mutex_unlock(&g->mu);
                return RMQ_GC_TIMEOUT;
            }
        }
        if (g->halted) {
            pthread_mutex_unlock(&g->mu);
            return RMQ_GC_STOPPED;
        }
        if (g->kicked) continue;  /* returns at the top */
        want = g->requested;
        want_ts = g->requested_ts;
        if (fd < 0 || want > seg_end || g->flushed < seg_from) {
            *upto = want;
            pthread_mutex_unlock(&g->mu);
            return RMQ_GC_NEED_FLUSH;
        }
        /* writers asking from now on wait for the round after this one (atomic: rmq_gc_epoch) */
        __atomic_store_n(&g->rounds_started, g->rounds_started + 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&g->mu);
        /* every put asking for <= want finished its pwrite before asking: one fdatasync covers it */
        t0 = rmq_gc_now_ns();
        rc = fdatasync(fd);
        err = rc != 0 ? errno : 0;
        t0 = rmq_gc_now_ns() - t0;
        pthread_mutex_lock(&g->mu);
        g->sync_ns += t0;
        g->rounds++;  /* counted also when failed: round numbers stay paired with rounds_started */
        if (err) {
            g->rounds_failed++;
            g->last_errno = err;
            rmq_gc_wake_all(g);  /* they re-check and keep waiting (until their timeout) */
            pthread_mutex_unlock(&g->mu);
            return RMQ_GC_IO_ERROR;
        }
        if (want > g->flushed) {
            g->flushed = want;
            if (want_ts > g->flushed_ts) g->flushed_ts = want_ts;
        }
        if (rmq_gc_ping_due(g)) {  /* the loop resolves the Futures; this thread goes on serving */
            pthread_mutex_unlock(&g->mu);
            rmq_gc_ping(g);
            pthread_mutex_lock(&g->mu);
        }
        p = (int)(g->rounds % RMQ_GC_SLOTS);
        /* returning to Python: no baton fallback runs meanwhile, so wake every covered writer */
        if (return_each_round || g->return_each_round) {
            g->return_each_round = 0;
            pthread_mutex_unlock(&g->mu);
            rmq_gc_wake_all(g);
            return RMQ_GC_RETURN;
        }
        if (rmq_gc_past(&deadline)) {
            pthread_mutex_unlock(&g->mu);
            rmq_gc_wake_all(g);
            return RMQ_GC_OK;
        }
        pthread_mutex_unlock(&g->mu);  /* the woken writer must not queue on mu behind us */
        pthread_cond_signal(&g->done[p]);
        pthread_mutex_lock(&g->mu);
    }
}

#endif
