/* Core-limit token bucket shared by a container's processes (one per device index), and the
 * controller that sets its refill rate from measured utilisation.
 *
 * Tokens are "blocks" (grid size): a launch costs its block count. The relation between
 * blocks and GPU time is unknown and changes with the workload, so the rate is not derived
 * from the limit directly: every control period the controller compares the container's
 * measured SM utilisation u with the target and moves the rate towards
 * spent_rate * target / u (feed-forward), plus an integral term that removes the bias of
 * noisy measurements. Refill is by elapsed time, so a stalled or failing measurement source
 * leaves the rate where it was: a launch waits at most VGPU_CORE_MAX_WAIT_NS.
 *
 * All functions take the time as an argument (lock-free, testable in a simulated clock). */
#ifndef VGPU_CORE_BUCKET_H
#define VGPU_CORE_BUCKET_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define VGPU_CORE_MAX_WAIT_NS 1000000000ull /* a launch is never held longer than this */
#define VGPU_CORE_BURST_NS 50000000ull      /* bucket capacity: 50 ms of refill */
#define VGPU_CORE_MIN_RATE 64ull            /* blocks/s floor */
#define VGPU_CORE_MAX_RATE (1ull << 40)
#define VGPU_CORE_INITIAL_RATE 200000ull    /* blocks/s before the first measurement */
#define VGPU_CORE_WINDOW_LAUNCHES 8ull   /* a controller window holds this many launches... */
#define VGPU_CORE_WINDOW_MAX_NS 5000000000ull /* ...or lasts this long */
#define VGPU_CORE_STALE_STEPS 2ull       /* measured steps dropped after a retarget */
#define VGPU_CORE_QUIET_NS 1000000000ull    /* no sample of the container ever, for this long: idle */

struct core_bucket {
	_Atomic int64_t tokens;         /* blocks; may go negative (debt of a large launch) */
	_Atomic uint64_t last_refill_ns;
	_Atomic uint64_t rate;          /* blocks per second */
	_Atomic uint64_t next_control_ns;
	_Atomic uint64_t spent;         /* blocks launched since the last control step */
	_Atomic uint64_t throttled;     /* denied takes since the last control step */
	_Atomic int64_t integral;       /* controller state, (target - u) * seconds * 1e6 */
	_Atomic uint64_t util_seen_us;  /* NVML lastSeenTimeStamp of the last measurement */
	/* The measurement window the controller is gathering (see core_bucket_control): launches
	 * and blocks counted since the last rate change (spent above), and the busy time and
	 * length of the measured windows since then. */
	_Atomic uint64_t launches;
	_Atomic uint64_t acc_busy_us;   /* sum of util (pp) * window (us) / 100: busy microseconds */
	_Atomic uint64_t acc_window_ns;
	_Atomic uint64_t stale_steps;   /* measured steps still to drop after a retarget */
	uint64_t reserved[4];           /* zero */
};

_Static_assert(sizeof(struct core_bucket) == 128, "core bucket layout");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "the bucket needs lock-free 64-bit atomics");

void core_bucket_init(struct core_bucket *b, uint64_t now_ns);

/* Takes cost blocks. Returns 0 when the launch may go, else how long to wait before
 * trying again (ns). */
uint64_t core_bucket_take(struct core_bucket *b, uint64_t cost, uint64_t now_ns);

/* A launch let through after waiting core_bucket_max_wait_ns without tokens: not charged to
 * the bucket (never a debt it cannot pay), but counted for the controller, whose measured busy
 * time includes it. */
void core_bucket_let_through(struct core_bucket *b, uint64_t cost);

/* Elects one caller per period to run the controller: 1 for the winner. */
int core_bucket_control_due(struct core_bucket *b, uint64_t now_ns, uint64_t period_ns);

/* One controller step. util_pct < 0 means no measurement: the rate is kept and the launches
 * counted so far are kept for the next measured step. window_ns is the time the measurement
 * covers (since the previous measured step). */
void core_bucket_control(struct core_bucket *b, int target_pct, double util_pct, uint64_t window_ns);

/* A process's view of a bucket that has never been measured (no NVML sample of the container's
 * processes since the bucket was made: util_seen_us is 0). */
struct core_quiet {
	_Atomic uint64_t first_ns; /* the first control step that found no sample; 0: none yet */
	_Atomic uint64_t last_ns;  /* the previous step that measured 0 %, or first_ns */
};

/* What a control step that found no new sample measured. A bucket that was measured once is
 * not quiet: the share over the gap is taken when the next sample comes (-1). One that never
 * was measured, for VGPU_CORE_QUIET_NS from this process's first such step on, measured 0 %
 * over that time: samples come every 1/6 s on a GPU, so the container's work took no GPU time
 * the driver could sample (too short, or NVML gives no per-process samples: a MIG partition,
 * no NVML) and launches held there were held by the initial rate, not by the GPU. From then
 * on every step measures 0 % over the time since the previous one (*window_ns). */
double core_bucket_quiet_util(struct core_quiet *q, uint64_t util_seen_us, uint64_t now_ns, uint64_t *window_ns);

/* The target changed from old_pct to new_pct (both 1-100): what the controller keeps for a
 * target, the rate and the integral, is scaled by new / old at once, so that the launches
 * follow the new target within milliseconds instead of a control step or more later. The
 * window gathered so far is dropped, and so are the next VGPU_CORE_STALE_STEPS measured
 * steps: their samples cover time before the change (a sample is read up to a period and
 * 50 ms after the work it covers), and paired with launches at the new rate they made the
 * controller correct the change a second time. */
void core_bucket_retarget(struct core_bucket *b, int old_pct, int new_pct);

/* How long a launch of a container limited to target_pct may be held: as long as a 1 s
 * kernel needs between launches at that limit (VGPU_CORE_MAX_WAIT_NS * 100 / target), so
 * that one long synchronous kernel per step is held to the limit too, never for ever. */
uint64_t core_bucket_max_wait_ns(int target_pct);

#endif
