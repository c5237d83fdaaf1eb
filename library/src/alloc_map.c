#include "alloc_map.h"

#include <stdlib.h>
#include <string.h>

#include "spinlock.h"

/* Open addressing with linear probing and backward-shift deletion; grows at 50 % load. */
struct entry {
	uint64_t key; /* (kind << 63) | key, + 1 so that 0 marks an empty slot */
	uint64_t bytes;
	int dev;
};

static struct entry *table;
static size_t cap, count;
static vgpu_spinlock lock = VGPU_SPINLOCK_INIT;

static uint64_t mkkey(enum vgpu_alloc_kind kind, uint64_t key) { return ((key << 1) | (uint64_t)kind) + 1; }

static size_t slot_of(uint64_t k, size_t c)
{
	k ^= k >> 33; k *= 0xff51afd7ed558ccdull; k ^= k >> 33;
	return (size_t)k & (c - 1);
}

static int grow(void)
{
	size_t ncap = cap ? cap * 2 : 1024;
	struct entry *nt = calloc(ncap, sizeof(*nt));
	if (nt == NULL)
		return -1;
	for (size_t i = 0; i < cap; i++) {
		if (table[i].key == 0)
			continue;
		size_t j = slot_of(table[i].key, ncap);
		while (nt[j].key != 0)
			j = (j + 1) & (ncap - 1);
		nt[j] = table[i];
	}
	free(table);
	table = nt;
	cap = ncap;
	return 0;
}

static long find(uint64_t k)
{
	if (cap == 0)
		return -1;
	for (size_t j = slot_of(k, cap);; j = (j + 1) & (cap - 1)) {
		if (table[j].key == k)
			return (long)j;
		if (table[j].key == 0)
			return -1;
	}
}

int vgpu_alloc_map_put(enum vgpu_alloc_kind kind, uint64_t key, uint64_t bytes, int dev)
{
	uint64_t k = mkkey(kind, key);
	int rc = 0;
	vgpu_spin_lock(&lock);
	long at = find(k);
	if (at >= 0) {
		table[at].bytes = bytes;
		table[at].dev = dev;
	} else if ((count + 1) * 2 > cap && grow() != 0) {
		rc = -1;
	} else {
		size_t j = slot_of(k, cap);
		while (table[j].key != 0)
			j = (j + 1) & (cap - 1);
		table[j] = (struct entry){ k, bytes, dev };
		count++;
	}
	vgpu_spin_unlock(&lock);
	return rc;
}

int vgpu_alloc_map_get(enum vgpu_alloc_kind kind, uint64_t key, uint64_t *bytes, int *dev)
{
	vgpu_spin_lock(&lock);
	long at = find(mkkey(kind, key));
	if (at >= 0) {
		*bytes = table[at].bytes;
		*dev = table[at].dev;
	}
	vgpu_spin_unlock(&lock);
	return at >= 0;
}

int vgpu_alloc_map_take(enum vgpu_alloc_kind kind, uint64_t key, uint64_t *bytes, int *dev)
{
	vgpu_spin_lock(&lock);
	long at = find(mkkey(kind, key));
	if (at >= 0) {
		*bytes = table[at].bytes;
		*dev = table[at].dev;
		/* backward-shift deletion keeps probe chains intact */
		size_t i = (size_t)at;
		for (size_t j = (i + 1) & (cap - 1); table[j].key != 0; j = (j + 1) & (cap - 1)) {
			size_t home = slot_of(table[j].key, cap);
			if (((j - home) & (cap - 1)) >= ((j - i) & (cap - 1))) {
				table[i] = table[j];
				i = j;
			}
		}
		table[i].key = 0;
		count--;
	}
	vgpu_spin_unlock(&lock);
	return at >= 0;
}

void vgpu_alloc_map_reset(void)
{
	vgpu_spin_reset(&lock);
	if (table != NULL)
		memset(table, 0, cap * sizeof(*table));
	count = 0;
}
