package chartpolicy

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

const helmTestTemplate = "tests/node-check.yaml"

// claimTemplateName is the test claim template's: the pod's name and a hash of the claim.
var claimTemplateName = regexp.MustCompile(`^vgpu-dra-test-[0-9a-f]{8}$`)

// renderHelmTest renders the chart's `helm test` objects: the claim template and the test pod.
func renderHelmTest(t *testing.T, set map[string]any) (*resourceapi.ResourceClaimTemplate, *corev1.Pod) {
	t.Helper()
	docs := renderTemplate(t, helmTestTemplate, set)
	if len(docs) != 2 {
		t.Fatalf("%s rendered %d documents, want the claim template and the pod:\n%s", helmTestTemplate, len(docs), strings.Join(docs, "\n---\n"))
	}
	var tmpl resourceapi.ResourceClaimTemplate
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &tmpl); err != nil || tmpl.Kind != "ResourceClaimTemplate" {
		t.Fatalf("first document (%s): %v\n%s", tmpl.Kind, err, docs[0])
	}
	if err := yaml.UnmarshalStrict([]byte(docs[1]), &pod); err != nil || pod.Kind != "Pod" {
		t.Fatalf("second document (%s): %v\n%s", pod.Kind, err, docs[1])
	}
	return &tmpl, &pod
}

// TestHelmTestObjects: `helm test` runs one pod, a test hook that the next run replaces, whose
// claim is made from the release's template for a share of the DeviceClass, as values.yaml says.
func TestHelmTestObjects(t *testing.T) {
	tmpl, pod := renderHelmTest(t, nil)
	if !claimTemplateName.MatchString(tmpl.Name) || tmpl.Annotations["helm.sh/hook"] != "" {
		t.Errorf("claim template %s, annotations %v: want vgpu-dra-test-<hash>, an object of the release (not a hook: helm test --logs reads every test hook as a pod)", tmpl.Name, tmpl.Annotations)
	}
	if pod.Name != "vgpu-dra-test" {
		t.Errorf("pod %s, want vgpu-dra-test", pod.Name)
	}
	reqs := tmpl.Spec.Spec.Devices.Requests
	if len(reqs) != 1 || reqs[0].Exactly == nil || reqs[0].Exactly.DeviceClassName != "vgpu.dra.dev" || reqs[0].Exactly.Capacity == nil {
		t.Fatalf("claim template requests %+v, want one of the DeviceClass vgpu.dra.dev with a capacity", reqs)
	}
	capacity := reqs[0].Exactly.Capacity.Requests
	if m, c := capacity["memory"], capacity["cores"]; m.String() != "256Mi" || c.String() != "10" {
		t.Errorf("claim asks for memory %s, cores %s; want values.yaml's 256Mi and 10", m.String(), c.String())
	}

	if got := pod.Annotations["helm.sh/hook"]; got != "test" {
		t.Errorf("pod's helm.sh/hook %q, want test", got)
	}
	if got := pod.Annotations["helm.sh/hook-delete-policy"]; got != "before-hook-creation" {
		t.Errorf("pod's hook-delete-policy %q, want before-hook-creation (reruns replace it; --logs can read it)", got)
	}
	if got := pod.Annotations["required-plugins.noderesource.dev/container.check"]; got != `["vgpu.dra.dev"]` {
		t.Errorf("pod's required-plugins annotation %q, want the webhook's [\"vgpu.dra.dev\"]", got)
	}
	if pod.Labels["app.kubernetes.io/component"] != "test" {
		t.Errorf("pod's labels %v: want component test (no plugin or webhook selector may match it)", pod.Labels)
	}
	if len(pod.Spec.ResourceClaims) != 1 || pod.Spec.ResourceClaims[0].ResourceClaimTemplateName == nil || *pod.Spec.ResourceClaims[0].ResourceClaimTemplateName != tmpl.Name {
		t.Fatalf("pod's resourceClaims %+v, want one from %s", pod.Spec.ResourceClaims, tmpl.Name)
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || len(pod.Spec.Containers) != 1 {
		t.Fatalf("pod restartPolicy %q, %d containers: want Never and one", pod.Spec.RestartPolicy, len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if c.Name != "check" || len(c.Resources.Claims) != 1 || c.Resources.Claims[0].Name != pod.Spec.ResourceClaims[0].Name {
		t.Errorf("container %s with claims %v: want check with the pod's claim", c.Name, c.Resources.Claims)
	}
	if c.Image != cluster.WorkloadImage || c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("image %s (%s), want the cluster suites' test workload %s, IfNotPresent", c.Image, c.ImagePullPolicy, cluster.WorkloadImage)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["VGPU_TEST_MEMORY_MIB"] != "256" || env["VGPU_TEST_CORES"] != "10" {
		t.Errorf("container env %v, want the claim's 256 MiB and 10 cores", env)
	}
	if len(c.Command) != 3 || c.Command[0] != "sh" || c.Command[1] != "-c" {
		t.Errorf("command %q, want the built-in check: sh -c <script>", c.Command)
	}
	if len(pod.Spec.Tolerations) != 1 || pod.Spec.Tolerations[0].Key != "nvidia.com/gpu" {
		t.Errorf("tolerations %+v, want values.yaml's nvidia.com/gpu", pod.Spec.Tolerations)
	}
}

// TestHelmTestValues: the values change what they say, and the test is rendered only where a
// kubelet plugin runs.
func TestHelmTestValues(t *testing.T) {
	// Helm decodes values.yaml's numbers as float64: a large one must not become 1.048576e+06.
	def, _ := renderHelmTest(t, nil)
	tmpl, pod := renderHelmTest(t, map[string]any{"tests.memoryMiB": float64(1048576), "tests.cores": float64(99)})
	// A claim template's spec is immutable: a changed claim is another object, which an upgrade
	// creates instead of patching the old one.
	if tmpl.Name == def.Name || !claimTemplateName.MatchString(tmpl.Name) {
		t.Errorf("claim template of another claim is %s, the default's %s: want another vgpu-dra-test-<hash>", tmpl.Name, def.Name)
	}
	if again, _ := renderHelmTest(t, nil); again.Name != def.Name {
		t.Errorf("the default claim template's name changed between renders: %s, %s", def.Name, again.Name)
	}
	capacity := tmpl.Spec.Spec.Devices.Requests[0].Exactly.Capacity.Requests
	if m, c := capacity["memory"], capacity["cores"]; m.Value() != 1048576<<20 || c.String() != "99" {
		t.Errorf("claim asks for memory %s, cores %s; want 1048576Mi and 99", m.String(), c.String())
	}
	if got := pod.Spec.Containers[0].Env[0]; got.Value != "1048576" {
		t.Errorf("env %s=%q, want 1048576", got.Name, got.Value)
	}

	_, pod = renderHelmTest(t, map[string]any{
		"tests.command": []any{"my-check", "--all"}, "tests.image.repository": "registry.example/check", "tests.image.tag": "v1",
		"tests.image.pullPolicy": "Always", "tests.nodeSelector": map[string]any{"gpu": "yes"}, "tests.tolerations": []any{},
		"featureGates.NRISupport": false,
	})
	c := pod.Spec.Containers[0]
	if !reflect.DeepEqual(c.Command, []string{"my-check", "--all"}) || c.Image != "registry.example/check:v1" || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("command %q, image %s (%s): want tests.command and tests.image", c.Command, c.Image, c.ImagePullPolicy)
	}
	if !reflect.DeepEqual(pod.Spec.NodeSelector, map[string]string{"gpu": "yes"}) || len(pod.Spec.Tolerations) != 0 {
		t.Errorf("nodeSelector %v, tolerations %v: want tests.nodeSelector and none", pod.Spec.NodeSelector, pod.Spec.Tolerations)
	}
	if _, ok := pod.Annotations["required-plugins.noderesource.dev/container.check"]; ok {
		t.Errorf("required-plugins annotation with NRISupport off: no NRI plugin would ever start the pod")
	}

	for _, set := range []map[string]any{{"tests.enabled": false}, {"mode": "device-plugin"}} {
		if docs := renderTemplate(t, helmTestTemplate, set); len(docs) != 0 {
			t.Errorf("with %v: %d documents, want none", set, len(docs))
		}
	}
	if _, pod := renderHelmTest(t, map[string]any{"mode": "per-node"}); pod == nil {
		t.Error("mode per-node: no test pod")
	}
}

// checkNode is what the test pod's container sees, for running the built-in check here with
// stand-ins for the node's plugin and the image's tools.
type checkNode struct {
	podEnv     []corev1.EnvVar   // the pod's env for the container (the test's values)
	env        map[string]string // what the driver adds to it
	config     string            // vgpu.config's content
	writable   bool              // whether the check's user can write vgpu.config
	registry   string            // what vgpu-registry-client answers (status line)
	limitMiB   int               // what the stand-in library grants in total; <0: every allocation
	wantOK     int               // "ok:" lines expected
	wantFailed string            // in the FAIL line; empty: the check passes
}

// TestHelmTestCheckScript runs the built-in check (the script of the pod's command) against a
// container that has what the driver gives it, and against containers that miss one piece each:
// each of those fails the test, on the check that names it.
func TestHelmTestCheckScript(t *testing.T) {
	_, pod := renderHelmTest(t, nil)
	script, podEnv := pod.Spec.Containers[0].Command[2], pod.Spec.Containers[0].Env
	const dev = "GPU-0b1c2d3e-0000-1111-2222-333344445555"
	good := func() checkNode {
		return checkNode{
			podEnv: podEnv,
			env:    map[string]string{"MANAGER_VISIBLE_DEVICE_0": dev, "CUDA_MEM_LIMIT_0": "256m", "CUDA_CORE_LIMIT_0": "10"},
			config: "version 1\nclaim c1\nregister r1\ngpu 17 " + dev + " 268435456 10\n", registry: "OK",
			limitMiB: 256, wantOK: 4,
		}
	}
	cases := map[string]func(n *checkNode){
		"what-the-driver-gives": func(n *checkNode) {},
		"no-vgpu-in-the-env": func(n *checkNode) {
			delete(n.env, "MANAGER_VISIBLE_DEVICE_0")
			n.wantFailed = "MANAGER_VISIBLE_DEVICE_0 is not set"
			n.wantOK = 0
		},
		"env-memory-not-claims": func(n *checkNode) {
			n.env["CUDA_MEM_LIMIT_0"] = "512m"
			n.wantFailed = "CUDA_MEM_LIMIT_0=512m, want 256m"
			n.wantOK = 0
		},
		"env-cores-missing": func(n *checkNode) {
			delete(n.env, "CUDA_CORE_LIMIT_0")
			n.wantFailed = "CUDA_CORE_LIMIT_0=(unset), want 10"
			n.wantOK = 0
		},
		"config-of-another-gpu": func(n *checkNode) {
			n.config = "version 1\ngpu 0 GPU-other 268435456 10\n"
			n.wantFailed = "has no gpu line for " + dev
			n.wantOK = 1
		},
		"config-other-limit": func(n *checkNode) {
			n.config = "version 1\ngpu 17 " + dev + " 536870912 10\n"
			n.wantFailed = "want the limits 268435456 bytes and 10%"
			n.wantOK = 1
		},
		"config-writable": func(n *checkNode) { n.writable = true; n.wantFailed = "is writable from the container"; n.wantOK = 1 },
		"registration-denied": func(n *checkNode) {
			n.registry = "DENIED"
			n.wantFailed = "status: DENIED"
			n.wantOK = 2
		},
		"library-not-enforcing": func(n *checkNode) {
			n.limitMiB = -1
			n.wantFailed = "1 MiB past the limit was not refused"
			n.wantOK = 3
		},
		"library-limit-too-small": func(n *checkNode) {
			n.limitMiB = 128
			n.wantFailed = "the whole limit (256 MiB) was not granted"
			n.wantOK = 3
		},
	}
	shells := []string{"/bin/sh"}
	if bb, err := exec.LookPath("busybox"); err == nil {
		shells = append(shells, bb+" sh") // the test image's shell
	}
	for _, shell := range shells {
		for name, mutate := range cases {
			t.Run(filepath.Base(strings.Fields(shell)[0])+"/"+name, func(t *testing.T) {
				n := good()
				mutate(&n)
				out, err := runCheck(t, shell, script, n)
				if n.wantFailed == "" {
					if err != nil || !strings.HasSuffix(out, "PASS\n") {
						t.Fatalf("the check failed (%v) where the driver gave the container everything:\n%s", err, out)
					}
				} else if err == nil || !strings.Contains(out, "FAIL: ") || !strings.Contains(out, n.wantFailed) || strings.Contains(out, "PASS") {
					t.Fatalf("the check: %v, want it to fail with %q:\n%s", err, n.wantFailed, out)
				}
				if got := strings.Count("\n"+out, "\nok: "); got != n.wantOK {
					t.Errorf("%d checks passed before the end, want %d:\n%s", got, n.wantOK, out)
				}
			})
		}
	}
}

// runCheck runs the script as the pod's command would, with the config directory and stand-ins
// for vgpu-registry-client and vgpu_probe (the stand-in library grants allocations up to
// limitMiB MiB in total, as libvgpu.so would, and says CUDA_ERROR_OUT_OF_MEMORY after). As
// root, it runs as nobody, so that a read-only vgpu.config is one the check cannot write.
func runCheck(t *testing.T, shell, script string, n checkNode) (string, error) {
	t.Helper()
	// Not t.TempDir: its parent is private to root, and the check may run as nobody.
	dir, err := os.MkdirTemp("", "helmtest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg, bin := filepath.Join(dir, "config"), filepath.Join(dir, "bin")
	for _, d := range []string{dir, cfg, bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mode := os.FileMode(0o444)
	if n.writable {
		mode = 0o666
	}
	writeFile(t, filepath.Join(cfg, "vgpu.config"), n.config, mode)
	writeFile(t, filepath.Join(bin, "vgpu-registry-client"), "#!/bin/sh\necho 'attempts: 1'\necho 'status: "+n.registry+"'\n", 0o755)
	writeFile(t, filepath.Join(bin, "vgpu_probe"), `#!/bin/sh
[ "$1" = alloc ] || exit 64
[ "$FAKE_GPU_DEVICES" = "$MANAGER_VISIBLE_DEVICE_0:$((VGPU_TEST_MEMORY_MIB * 2))" ] || { echo "FAKE_GPU_DEVICES=$FAKE_GPU_DEVICES" >&2; exit 65; }
shift
echo "pid 42"
used=0
for mib in "$@"; do
  if [ "$STUB_LIMIT_MIB" -lt 0 ] || [ $((used + mib)) -le "$STUB_LIMIT_MIB" ]; then
    used=$((used + mib)); echo "alloc $mib MiB = 0"
  else
    echo "alloc $mib MiB = 2"
  fi
done
`, 0o755)
	fields := strings.Fields(shell)
	cmd := exec.Command(fields[0], append(fields[1:], "-c", script)...)
	cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "VGPU_TEST_CONFIG_DIR=" + cfg, "STUB_LIMIT_MIB=" + strconv.Itoa(n.limitMiB)}
	for _, e := range n.podEnv {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	for k, v := range n.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}
