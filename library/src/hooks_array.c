/* CUDA arrays (cudaMallocArray, cudaMalloc3DArray, cudaMallocMipmappedArray, textures and
 * surfaces): charged against the memory limit when created, given back when destroyed.
 *
 * The driver does not say how much an array takes (its layout is tiled and
 * device-specific), so the charge is an upper estimate from the descriptor: each row of
 * width x channels x element size padded to ARRAY_ROW_ALIGN, times height and depth (or
 * layers), summed over the mipmap levels (each extent halved per level, at least 1; the
 * layers of a layered array are not halved), the total rounded up to ARRAY_SIZE_ALIGN.
 * A format the library does not know is charged 4 bytes a channel, the largest element of
 * any format. Sparse and deferred-mapping arrays hold no memory of their own: what backs
 * them comes from cuMemCreate, which is charged there. What the estimate misses shows up in
 * the NVML reconciliation. */
#include <stdint.h>

#include "hook_table.h"
#include "hooks.h"
#include "mem_account.h"

#define REAL_OR_FAIL(var, name)                 \
	__typeof__(&name) var = REAL(name);     \
	if (var == NULL)                        \
		return CUDA_ERROR_NOT_FOUND

#define ARRAY_ROW_ALIGN 512ull            /* the largest documented texture pitch alignment */
#define ARRAY_SIZE_ALIGN (64ull * 1024ull) /* the GPU's large page */
#define ARRAY_MAX_LEVELS 64u              /* past 64 halvings every extent is 1: the driver refuses */
#define CUDA_ARRAY3D_SPARSE 0x40u
#define CUDA_ARRAY3D_DEFERRED_MAPPING 0x80u

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
	return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t round_up(uint64_t v, uint64_t align)
{
	return v > UINT64_MAX - (align - 1) ? UINT64_MAX : (v + align - 1) / align * align;
}

static uint64_t channel_bytes(CUarray_format f)
{
	switch (f) {
	case CU_AD_FORMAT_UNSIGNED_INT8:
	case CU_AD_FORMAT_SIGNED_INT8:
		return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16:
	case CU_AD_FORMAT_SIGNED_INT16:
	case CU_AD_FORMAT_HALF:
		return 2;
	default:
		return 4; /* 32-bit formats, and the upper bound for any other */
	}
}

static uint64_t extent(uint64_t v)
{
	return v == 0 ? 1 : v; /* 0 height: a 1D array; 0 depth: a 2D one */
}

static uint64_t halve(uint64_t v)
{
	return v > 1 ? v / 2 : v;
}

/* The charge for an array of the given descriptor and mipmap levels (1 for a plain array). */
static uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned channels,
			    unsigned flags, unsigned levels)
{
	if (flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING))
		return 0;
	uint64_t elem = channel_bytes(f) * (channels == 0 ? 1 : channels);
	uint64_t total = 0;
	if (levels == 0)
		levels = 1;
	if (levels > ARRAY_MAX_LEVELS)
		levels = ARRAY_MAX_LEVELS;
	for (unsigned i = 0; i < levels; i++) {
		uint64_t row = round_up(sat_mul(extent(w), elem), ARRAY_ROW_ALIGN);
		total = sat_add(total, sat_mul(sat_mul(row, extent(h)), extent(d)));
		w = halve(w);
		h = halve(h);
		if (!(flags & CUDA_ARRAY3D_LAYERED))
			d = halve(d);
	}
	return round_up(total, ARRAY_SIZE_ALIGN);
}

/* create(handle, desc[, levels]): reserve the estimate, call the driver, record the handle. */
#define ARRAY_CREATE(name, bytes_of, params, ...)                                                     \
	CUresult name params                                                                          \
	{                                                                                             \
		REAL_OR_FAIL(real, name);                                                             \
		if (handle == NULL || desc == NULL)                                                   \
			return real(__VA_ARGS__); /* the driver refuses it */                        \
		struct vgpu_mem_op op;                                                                \
		CUresult r = vgpu_mem_reserve(-1, bytes_of, &op);                                     \
		if (r != CUDA_SUCCESS)                                                                \
			return r;                                                                     \
		r = real(__VA_ARGS__);                                                                \
		vgpu_mem_commit(&op, r, VGPU_ALLOC_ARRAY, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*handle : 0); \
		return r;                                                                             \
	}

#define BYTES_2D array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 0, 1)
#define BYTES_3D array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, desc->Flags, 1)
#define BYTES_MIP                                                                                     \
	array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, desc->Flags, \
		    numMipmapLevels)

ARRAY_CREATE(cuArrayCreate_v2, BYTES_2D,
	     (CUarray * handle, const CUDA_ARRAY_DESCRIPTOR *desc), handle, desc)
ARRAY_CREATE(cuArrayCreate, BYTES_2D,
	     (CUarray * handle, const CUDA_ARRAY_DESCRIPTOR_v1 *desc), handle, desc)
ARRAY_CREATE(cuArray3DCreate_v2, BYTES_3D,
	     (CUarray * handle, const CUDA_ARRAY3D_DESCRIPTOR *desc), handle, desc)
ARRAY_CREATE(cuArray3DCreate, BYTES_3D,
	     (CUarray * handle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc), handle, desc)
ARRAY_CREATE(cuMipmappedArrayCreate, BYTES_MIP,
	     (CUmipmappedArray * handle, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int numMipmapLevels),
	     handle, desc, numMipmapLevels)

/* Destroyed when the call returns: the charge comes back at once. */
#define ARRAY_DESTROY(name, handle_t)                                                    \
	CUresult name(handle_t handle)                                                   \
	{                                                                                \
		REAL_OR_FAIL(real, name);                                                \
		uint64_t key = (uint64_t)(uintptr_t)handle;                              \
		struct vgpu_alloc a;                                                     \
		int ours = vgpu_mem_free_begin(VGPU_ALLOC_ARRAY, key, &a);               \
		CUresult r = real(handle);                                               \
		if (ours)                                                                \
			vgpu_mem_free_end(VGPU_ALLOC_ARRAY, key, &a, r);                 \
		return r;                                                                \
	}

ARRAY_DESTROY(cuArrayDestroy, CUarray)
ARRAY_DESTROY(cuMipmappedArrayDestroy, CUmipmappedArray)
