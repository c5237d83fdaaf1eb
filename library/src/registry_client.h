/* Registration client (contract.md §5, "Client (library)"). */
#ifndef VGPU_REGISTRY_CLIENT_H
#define VGPU_REGISTRY_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "registry_frame.h"

#define REG_BUDGET_MS 30000u       /* measured from the first connect attempt; covers a plugin restart
				    * (contract §5); contract.RegistryClientBudget is its Go twin */
#define REG_DEFAULT_WAIT_MS 100u   /* when a RETRY/BUSY carries no retry_after_ms, or connect failed */
#define REG_MIN_WAIT_MS 10u

/* Time and randomness are injected so the retry rules can be tested exactly. */
struct reg_client_deps {
	uint64_t (*now_ms)(void *ctx);
	void (*sleep_ms)(void *ctx, uint64_t ms);
	uint32_t (*rand32)(void *ctx);
	void *ctx;
};

enum reg_outcome {
	REG_OUTCOME_OK,            /* status OK */
	REG_OUTCOME_FINAL,         /* a final status (NOT_FOUND, DENIED, INVALID, INTERNAL, unknown) */
	REG_OUTCOME_BUDGET,        /* RETRY/BUSY/failed connect/dropped connection until the next wait
				    * would cross the budget */
	REG_OUTCOME_TRANSPORT,     /* connected, then a malformed, cut-short or missing response:
				    * final, see reg_register */
};

struct reg_attempt_log {
	unsigned attempts;         /* connect attempts made */
	unsigned connect_failures;
	unsigned dropped;          /* connections closed or reset before a byte of a response */
	uint64_t waits_ms[64];     /* the waits between attempts, in order (first 64) */
	unsigned nwaits;
};

/* Registers; retries exactly as the contract says. On return res holds the last response
 * (status -1 when the last attempt got none) and detail a human-readable reason.
 * Real clock and sleeps when deps is NULL. budget_ms is REG_BUDGET_MS in the library. */
enum reg_outcome reg_register(const char *socket_path, const struct reg_request *req, uint32_t budget_ms,
			      const struct reg_client_deps *deps, struct reg_response *res,
			      struct reg_attempt_log *log, char *detail, size_t detail_len);

/* The wait before the next attempt: max(retry_after or 100 ms, 10 ms) plus up to a quarter
 * more at random, never less. Exposed for the property test. */
uint64_t reg_retry_wait_ms(int has_retry_after, uint32_t retry_after_ms, uint32_t random);

#endif
