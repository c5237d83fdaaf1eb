// Command vgpu-registry-client registers with the node's vGPU registry the way libvgpu.so
// does (contract §5) and prints the answer and pids.config: a debugging aid, run inside a
// vGPU container (or on the host with --socket and --pids-config).
//
//	vgpu-registry-client                          # identity from VGPU_POD_UID, VGPU_CONTAINER_NAME, MANAGER_CLIENT_REGISTER_UUID
//	vgpu-registry-client --pod-uid U --container-name app --socket /var/lib/vgpu-dra/registry/registry.sock
//	vgpu-registry-client --register-uuid U --once
//
// Exit status: 0 on OK, 1 on any other answer, 2 when no answer came.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

func main() {
	var (
		req    registry.Request
		socket = flag.String("socket", filepath.Join(contract.ContainerRegistryDir, contract.RegistrySocketName), "registry socket")
		pids   = flag.String("pids-config", filepath.Join(contract.ContainerConfigDir, contract.PIDsConfigName), "pids.config to print after OK (empty: do not print)")
		once   = flag.Bool("once", false, "one attempt, no retries")
		budget = flag.Duration("budget", contract.RegistryClientBudget, "retry budget from the first connect attempt")
	)
	flag.StringVar(&req.PodUID, "pod-uid", os.Getenv(contract.EnvPodUID), "pod UID (NRI path)")
	flag.StringVar(&req.ContainerName, "container-name", os.Getenv(contract.EnvContainerName), "container name (NRI path)")
	flag.StringVar(&req.RegisterUUID, "register-uuid", os.Getenv(contract.EnvRegisterUUID), "register UUID (per-claim path)")
	flag.StringVar(&req.ClientVersion, "client-version", "vgpu-registry-client", "client_version sent")
	flag.Parse()
	os.Exit(run(req, *socket, *pids, *once, *budget))
}

func run(req registry.Request, socket, pidsPath string, once bool, budget time.Duration) int {
	c := &registry.Client{Socket: socket, Budget: budget}
	ctx := context.Background()
	var resp registry.Response
	if once {
		r, err := c.RegisterOnce(ctx, req)
		if err != nil {
			fmt.Fprintln(os.Stderr, "error:", err)
			return 2
		}
		resp = r
	} else {
		res, err := c.Register(ctx, req)
		fmt.Printf("attempts: %d (connect failures %d, waits %v)\n", res.Attempts, res.ConnectFailures, res.Waits)
		if err != nil {
			fmt.Fprintln(os.Stderr, "error:", err)
			return 2
		}
		resp = res.Response
	}
	fmt.Printf("status: %s\n", resp.Status)
	if resp.Message != "" {
		fmt.Printf("message: %s\n", resp.Message)
	}
	if resp.HasRetryAfter {
		fmt.Printf("retry_after_ms: %d\n", resp.RetryAfter.Milliseconds())
	}
	if resp.Status != registry.StatusOK {
		return 1
	}
	if pidsPath != "" {
		b, err := os.ReadFile(pidsPath)
		if err != nil {
			fmt.Fprintln(os.Stderr, "error:", err)
			return 1
		}
		fmt.Printf("%s:\n%s", pidsPath, b)
	}
	return 0
}
