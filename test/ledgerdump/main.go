// Command ledgerdump reads a container's memory ledger with the plugin's own reader
// (pkg/usage) and prints what the plugin's metrics would take from it. The library's test
// suite runs it on a ledger that the real libvgpu.so wrote (test_real_registry ledger), so the
// Go reader is checked against the C writer, OFD-lock liveness included.
//
//	ledgerdump <vmem_node directory>
//
// prints one "used <position> <bytes>" line per GPU position of vgpu.config (0-15), then
// "refused <n>" and "processes <n>"; exit status 1 with the error on stderr when the ledger
// cannot be read.
package main

import (
	"fmt"
	"os"

	"github.com/vgpu-dra/vgpu-dra/pkg/usage"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: ledgerdump <vmem_node directory>")
		os.Exit(2)
	}
	var r usage.LedgerReader
	l, err := r.Read(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledgerdump:", err)
		os.Exit(1)
	}
	for pos, used := range l.Used {
		fmt.Printf("used %d %d\n", pos, used)
	}
	fmt.Printf("refused %d\nprocesses %d\n", l.Refused, l.Processes)
}
