/* Prints the memory ledger's layout (src/ledger.h) as the compiler lays it out: one
 * "<name> <value>" line per constant, field offset and size. The plugin's Go reader of the
 * ledger (pkg/usage) has a test that compiles and runs this program and fails when its own
 * layout differs in any line, so the two cannot drift apart unnoticed. Only the header is
 * needed: nothing is linked. */
#include <stddef.h>
#include <stdio.h>

#include "../src/ledger.h"

#define FIELD(type, field)                                                                        \
	printf(#type "." #field ".offset %zu\n" #type "." #field ".size %zu\n", offsetof(struct type, field), \
	       sizeof(((struct type *)0)->field))

int main(void)
{
	printf("file_name %s\n", LEDGER_FILE_NAME);
	printf("magic %u\n", LEDGER_MAGIC);
	printf("version %u\n", LEDGER_VERSION);
	printf("slots %u\n", LEDGER_SLOTS);
	printf("devices %d\n", VGPU_MAX_DEVICES);
	printf("slot_free %u\n", LEDGER_SLOT_FREE);
	printf("slot_used %u\n", LEDGER_SLOT_USED);
	printf("ledger_header.size %zu\n", sizeof(struct ledger_header));
	printf("ledger_slot.size %zu\n", sizeof(struct ledger_slot));
	printf("ledger_file.size %zu\n", sizeof(struct ledger_file));
	FIELD(ledger_header, magic);
	FIELD(ledger_header, version);
	FIELD(ledger_header, header_size);
	FIELD(ledger_header, slot_size);
	FIELD(ledger_header, nslots);
	FIELD(ledger_header, ndevices);
	FIELD(ledger_header, high_water);
	FIELD(ledger_header, unseen);
	FIELD(ledger_header, reconciled_ns);
	FIELD(ledger_header, reclaimed_ns);
	FIELD(ledger_header, refused);
	FIELD(ledger_slot, state);
	FIELD(ledger_slot, pid);
	FIELD(ledger_slot, owner);
	FIELD(ledger_slot, used);
	FIELD(ledger_file, h);
	FIELD(ledger_file, slot);
	return 0;
}
