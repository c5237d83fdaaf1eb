package deviceplugin

import (
	"context"

	"k8s.io/client-go/kubernetes"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce/podevents"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// startEnforcer runs the node-side enforcer (pkg/enforce, contract §15) over the containers
// that hold shares, as the kubelet plugin's owner instance does over its claims' containers.
// The device plugin holds the instance lock for its whole life and never hands over, so the
// running instance is the owner: it acts from the first refresh of its targets on, until Stop.
// Its view: the shares of this plugin's GPUs, which pod holds which (the kubelet's
// pod-resources API and the pod's UID from the API server, targetSource), each process's
// cgroup (the hierarchy the registry checks callers in) and the registry's record of who
// registered. None of it is a file a container can write.
func (p *Plugin) startEnforcer(ctx context.Context, h *holders, kube kubernetes.Interface, reg k8smetrics.KubeRegistry, logger klog.Logger) {
	cfg := p.cfg
	if !cfg.Enforce {
		return
	}
	logger = logger.WithName("enforce")
	cgroups := p.cgroups
	freeze, registered := enforce.NodeHooks(logger, cfg.Enforcement, cgroups, cfg.Layout().LibraryInstalled(), p.regSrv.Registered)
	gpus := make([]string, len(p.inv.GPUs))
	for i, g := range p.inv.GPUs {
		gpus[i] = g.Device.UUID
	}
	src := newTargetSource(p.inv, cfg.Layout(), h, logger.WithName("targets"))
	events := podevents.New(kube, cfg.NodeName)
	e := enforce.New(cfg.Enforcement.Config(), enforce.Deps{
		Ready:       src.ready,
		GPUs:        func() []string { return gpus },
		Targets:     src.snapshot,
		Processes:   p.gpus.ProcessMemory,
		Utilization: p.gpus.ProcessUtilization,
		Freeze:      freeze,
		CgroupOf:    cgroups.OfPID,
		Registered:  registered,
		PodOf:       src.podOf,
		Kill:        enforce.Killer{Cgroups: cgroups}.Kill,
		Event:       events.Warn,
		Metrics:     metrics.NewEnforcementMetrics(reg),
	})
	c := e.Config()
	logger.Info("Node-side enforcement of the shares' memory and core limits", "period", c.Period, "grace", c.Grace, "slackPerProcess", c.SlackPerProcess,
		"foreignGPUProcess", c.Foreign, "coreEnforcement", c.Cores, "coreMargin", c.CoreMargin, "coreWindow", c.CoreWindow, "throttle", freeze != nil, "cgroups", cgroups.String())
	// The kubelet's pod-resources API is rate-limited for every client on the node: list it at
	// most once a second. A pod appears there at Allocate, before its container starts.
	p.wg.Go(func() { src.run(ctx, max(c.Period, targetRefresh)) })
	p.wg.Go(func() {
		e.Run(klog.NewContext(ctx, logger))
		events.Shutdown()
	})
}
