#ifndef VGPU_SPINLOCK_H
#define VGPU_SPINLOCK_H

#include <sched.h>
#include <stdatomic.h>

/* In-process lock for short critical sections. Deliberately not a pthread mutex: the
 * pthread symbols that moved into libc in glibc 2.34 would pin the library to 2.34.
 * Reset (not unlocked) in a forked child, where the holding thread no longer exists. */
typedef struct {
	atomic_int held;
} vgpu_spinlock;

#define VGPU_SPINLOCK_INIT { 0 }

static inline void vgpu_spin_lock(vgpu_spinlock *l)
{
	for (unsigned spins = 0;; spins++) {
		int expected = 0;
		if (atomic_compare_exchange_weak_explicit(&l->held, &expected, 1, memory_order_acquire,
							  memory_order_relaxed))
			return;
		if (spins > 64)
			sched_yield();
	}
}

static inline void vgpu_spin_unlock(vgpu_spinlock *l)
{
	atomic_store_explicit(&l->held, 0, memory_order_release);
}

static inline void vgpu_spin_reset(vgpu_spinlock *l)
{
	atomic_store_explicit(&l->held, 0, memory_order_relaxed);
}

#endif
