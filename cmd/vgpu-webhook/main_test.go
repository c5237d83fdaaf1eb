package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestConfig: the flags become the webhook's Config, NRISupport decides the annotation, and
// every problem of a TLS mode is reported.
func TestConfig(t *testing.T) {
	parse := func(t *testing.T, args ...string) *flags {
		t.Helper()
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		f, err := addFlags(fs)
		if err != nil {
			t.Fatal(err)
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := f.common.Validate(); err != nil {
			t.Fatal(err)
		}
		return f
	}
	selfManaged := []string{"--tls-secret=vgpu-dra/vgpu-dra-webhook-tls", "--tls-dns-name=vgpu-dra-webhook.vgpu-dra.svc",
		"--mutating-webhook-configuration=m", "--validating-webhook-configuration=v"}

	f := parse(t, selfManaged...)
	cfg, err := f.config()
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Rules
	if !slices.Equal(r.DeviceClasses, []string{"vgpu.dra.dev"}) || r.Driver != "vgpu.dra.dev" || r.ExtendedResource != "vgpu.dra.dev/vgpu" || r.UUIDAttribute != "vgpu.dra.dev/uuid" || r.RequiredPlugin != "vgpu.dra.dev" {
		t.Errorf("rules from the defaults: %+v", r)
	}
	if cfg.Rotator == nil || cfg.Rotator.SecretNamespace != "vgpu-dra" || cfg.Rotator.SecretName != "vgpu-dra-webhook-tls" {
		t.Errorf("self-managed TLS: %+v", cfg.Rotator)
	}

	f = parse(t, append(selfManaged, "--feature-gates=NRISupport=false", "--driver-name=gpu.example.com")...)
	if cfg, err = f.config(); err != nil || cfg.Rules.RequiredPlugin != "" || cfg.Rules.UUIDAttribute != "gpu.example.com/uuid" {
		t.Errorf("NRISupport off: required plugin %q, uuid %q, %v", cfg.Rules.RequiredPlugin, cfg.Rules.UUIDAttribute, err)
	}

	if cfg.Rules.RefuseToolkitEnv {
		t.Error("--refuse-nvidia-visible-devices is on by default")
	}
	f = parse(t, append(selfManaged, "--refuse-nvidia-visible-devices")...)
	if cfg, err = f.config(); err != nil || !cfg.Rules.RefuseToolkitEnv {
		t.Errorf("--refuse-nvidia-visible-devices: %+v, %v", cfg.Rules, err)
	}

	f = parse(t, append(selfManaged, "--device-class=vgpu.dra.dev,guaranteed.vgpu.dra.dev,best-effort.vgpu.dra.dev")...)
	if cfg, err = f.config(); err != nil || !slices.Equal(cfg.Rules.DeviceClasses,
		[]string{"vgpu.dra.dev", "guaranteed.vgpu.dra.dev", "best-effort.vgpu.dra.dev"}) {
		t.Errorf("--device-class with the compute classes: %q, %v", cfg.Rules.DeviceClasses, err)
	}

	f = parse(t, "--tls-mode=files")
	if cfg, err = f.config(); err != nil || cfg.Rotator != nil {
		t.Errorf("files mode: %+v, %v", cfg.Rotator, err)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-secret=only-a-name"}, "--tls-secret as <namespace>/<name>"},
		{[]string{"--tls-mode=magic"}, `--tls-mode "magic"`},
		{append(selfManaged, "--device-class="), "--device-class must name at least one DeviceClass"},
		{append(selfManaged, "--device-class=vgpu.dra.dev,,x"), "and no empty one"},
		{append(selfManaged, "--max-missing-claim-waits=0"), "--max-missing-claim-waits 0: want at least 1"},
	} {
		f := parse(t, tt.args...)
		if _, err := f.config(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want %q", tt.args, err, tt.want)
		}
	}
}
