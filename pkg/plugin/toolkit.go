package plugin

import (
	"errors"
	"io/fs"

	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/toolkitconfig"
)

// checkToolkitConfig reads the NVIDIA Container Toolkit's config.toml (--toolkit-config) once at
// start-up when GPUs reach containers through NVIDIA_VISIBLE_DEVICES (--gpu-injection=env), and
// says what its setting means (contract §3, "env"): the toolkit either honours the variable from
// every unprivileged container, one without a claim too, or from none of them, the vGPU
// containers included. It changes nothing: the file is the node's, and both are an operator's
// choice. A file this process cannot see (the chart does not mount the host's) is one info line.
func checkToolkitConfig(logger klog.Logger, cfg Config) {
	if cfg.GPUInjection != cdi.InjectionEnv || cfg.ToolkitConfig == "" {
		return
	}
	s, err := toolkitconfig.Read(cfg.ToolkitConfig)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		logger.Info("NVIDIA Container Toolkit config not found: not checked whether pods without a claim can ask the toolkit for GPUs", "path", cfg.ToolkitConfig)
		return
	case err != nil:
		logger.Error(err, "NVIDIA Container Toolkit config not checked", "path", cfg.ToolkitConfig)
		return
	}
	key := toolkitconfig.KeyAcceptEnvvarUnprivileged
	if s.AcceptEnvvarUnprivileged {
		logger.Error(nil, "The NVIDIA Container Toolkit honours NVIDIA_VISIBLE_DEVICES from unprivileged containers: a container "+
			"without a vGPU claim that sets it, or whose image sets it (CUDA images set \"all\"), gets GPUs without any limit. "+
			"Use --gpu-injection=cdi and set the key to false; with env injection, refuse the variable at admission "+
			"(vgpu-webhook --refuse-nvidia-visible-devices) and keep images that set it off this node",
			"path", cfg.ToolkitConfig, "key", key, "value", true, "gpuInjection", cfg.GPUInjection)
		return
	}
	logger.Error(nil, "The NVIDIA Container Toolkit ignores NVIDIA_VISIBLE_DEVICES from unprivileged containers, the vGPU "+
		"containers' too: with --gpu-injection=env they get no GPU. Use --gpu-injection=cdi",
		"path", cfg.ToolkitConfig, "key", key, "value", false, "gpuInjection", cfg.GPUInjection)
}
