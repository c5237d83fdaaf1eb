#include "alloc_map.h"

#include <stdlib.h>
#include <string.h>

#include "spinlock.h"

/* Open addressing with linear probing and backward-shift deletion; grows at 50 % load. */
struct entry {
	uint64_t key;
	uint32_t tag; /* kind + 1; 0 marks an empty slot */
	uint32_t pad;
	struct vgpu_alloc v;
};

static struct entry *table;
static size_t cap, count;
static vgpu_spinlock lock = VGPU_SPINLOCK_INIT;

static size_t slot_of(uint64_t k, uint32_t tag, size_t c)
{
	k ^= (uint64_t)tag * 0x9e3779b97f4a7c15ull;
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
		if (table[i].tag == 0)
			continue;
		size_t j = slot_of(table[i].key, table[i].tag, ncap);
		while (nt[j].tag != 0)
			j = (j + 1) & (ncap - 1);
		nt[j] = table[i];
	}
	free(table);
	table = nt;
	cap = ncap;
	return 0;
}

static long find(uint64_t k, uint32_t tag)
{
	if (cap == 0)
		return -1;
	for (size_t j = slot_of(k, tag, cap);; j = (j + 1) & (cap - 1)) {
		if (table[j].tag == tag && table[j].key == k)
			return (long)j;
		if (table[j].tag == 0)
			return -1;
	}
}

int vgpu_alloc_map_put(enum vgpu_alloc_kind kind, uint64_t key, const struct vgpu_alloc *a)
{
	uint32_t tag = (uint32_t)kind + 1;
	int rc = 0;
	vgpu_spin_lock(&lock);
	long at = find(key, tag);
	if (at >= 0) {
		table[at].v = *a;
	} else if ((count + 1) * 2 > cap && grow() != 0) {
		rc = -1;
	} else {
		size_t j = slot_of(key, tag, cap);
		while (table[j].tag != 0)
			j = (j + 1) & (cap - 1);
		table[j] = (struct entry){ .key = key, .tag = tag, .v = *a };
		count++;
	}
	vgpu_spin_unlock(&lock);
	return rc;
}

int vgpu_alloc_map_get(enum vgpu_alloc_kind kind, uint64_t key, struct vgpu_alloc *out)
{
	vgpu_spin_lock(&lock);
	long at = find(key, (uint32_t)kind + 1);
	if (at >= 0)
		*out = table[at].v;
	vgpu_spin_unlock(&lock);
	return at >= 0;
}

int vgpu_alloc_map_take(enum vgpu_alloc_kind kind, uint64_t key, struct vgpu_alloc *out)
{
	vgpu_spin_lock(&lock);
	long at = find(key, (uint32_t)kind + 1);
	if (at >= 0) {
		*out = table[at].v;
		/* backward-shift deletion keeps probe chains intact */
		size_t i = (size_t)at;
		for (size_t j = (i + 1) & (cap - 1); table[j].tag != 0; j = (j + 1) & (cap - 1)) {
			size_t home = slot_of(table[j].key, table[j].tag, cap);
			if (((j - home) & (cap - 1)) >= ((j - i) & (cap - 1))) {
				table[i] = table[j];
				i = j;
			}
		}
		table[i].tag = 0;
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
