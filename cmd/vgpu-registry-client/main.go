// Command vgpu-registry-client registers with the node's vGPU registry the way libvgpu.so
// does (contract §5) and prints the answer and pids.config: a debugging aid, run inside a
// vGPU container (or on the host with --socket and --pids-config).
//
//	vgpu-registry-client                          # identity from /etc/vgpu-dra/config/vgpu.config, as the library takes it
//	                                              # (env VGPU_POD_UID, VGPU_CONTAINER_NAME, MANAGER_CLIENT_REGISTER_UUID where there is no file)
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
	id := defaultIdentity(filepath.Join(contract.ContainerConfigDir, contract.ContainerConfigName))
	flag.StringVar(&req.PodUID, "pod-uid", id.PodUID, "pod UID (NRI path); default from vgpu.config")
	flag.StringVar(&req.ContainerName, "container-name", id.ContainerName, "container name (NRI path); default from vgpu.config")
	flag.StringVar(&req.RegisterUUID, "register-uuid", id.RegisterUUID, "register UUID (per-claim path); default from vgpu.config")
	flag.StringVar(&req.ClientVersion, "client-version", "vgpu-registry-client", "client_version sent")
	flag.Parse()
	os.Exit(run(req, *socket, *pids, *once, *budget))
}

// defaultIdentity is the identity the library registers with: vgpu.config's (contract §4a; the
// library never takes it from env), else the env's, for a host or an older container. With a
// register UUID the per-claim identity is used alone, as the library does.
func defaultIdentity(configPath string) contract.ContainerConfig {
	id := contract.ContainerConfig{PodUID: os.Getenv(contract.EnvPodUID), ContainerName: os.Getenv(contract.EnvContainerName), RegisterUUID: os.Getenv(contract.EnvRegisterUUID)}
	if data, err := os.ReadFile(configPath); err == nil {
		c, err := contract.ParseContainerConfig(data)
		if err != nil {
			fmt.Fprintf(os.Stderr, "warning: %v; the identity comes from env\n", err)
			return id
		}
		id = c
	}
	if id.RegisterUUID != "" {
		id.PodUID, id.ContainerName = "", ""
	}
	return id
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
		fmt.Printf("attempts: %d (connect failures %d, dropped %d, waits %v)\n", res.Attempts, res.ConnectFailures, res.Dropped, res.Waits)
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
