package chartpolicy

import (
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// rbacObjects are the RBAC objects of one rendered template, by kind and name.
type rbacObjects struct {
	roles    map[string]rbacv1.ClusterRole // ClusterRoles and Roles (namespaced roles keyed "role/<name>")
	bindings map[string]rbacv1.ClusterRoleBinding
}

func renderRBAC(t *testing.T, template string, set map[string]any) rbacObjects {
	t.Helper()
	out := rbacObjects{roles: map[string]rbacv1.ClusterRole{}, bindings: map[string]rbacv1.ClusterRoleBinding{}}
	for _, doc := range renderTemplate(t, template, set) {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: %v\n%s", template, err, doc)
		}
		switch meta.Kind {
		case "ClusterRole", "Role":
			var r rbacv1.ClusterRole
			mustUnmarshal(t, doc, &r)
			key := r.Name
			if meta.Kind == "Role" {
				key = "role/" + r.Name
			}
			out.roles[key] = r
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			mustUnmarshal(t, doc, &b)
			out.bindings[b.Name] = b
		}
	}
	return out
}

func mustUnmarshal(t *testing.T, doc string, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
}

// grants reports whether a rule of role allows verb on resource of group (no resourceNames).
func grants(role rbacv1.ClusterRole, group, resource, verb string) bool {
	return slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) &&
			slices.Contains(r.Verbs, verb) && len(r.ResourceNames) == 0
	})
}

// TestMetricsRBAC: with metrics.auth delegated (the default) the kubelet plugin's, the device
// plugin's and the webhook's ClusterRoles may create TokenReviews and SubjectAccessReviews, and
// <release>-metrics-reader grants get on /metrics, bound to metrics.readers when given; with
// none, none of it.
func TestMetricsRBAC(t *testing.T) {
	roles := map[string]string{ // template → the ClusterRole of its binary
		"rbac.yaml":               releaseName + "-kubelet-plugin",
		"device-plugin-rbac.yaml": releaseName + "-device-plugin",
		"webhook-rbac.yaml":       releaseName + "-webhook",
	}
	reader := releaseName + "-metrics-reader"
	for _, auth := range []string{"delegated", "none"} {
		for template, name := range roles {
			objs := renderRBAC(t, template, map[string]any{"metrics.auth": auth, "mode": "per-node"})
			role, ok := objs.roles[name]
			if !ok {
				t.Fatalf("%s renders no ClusterRole %s", template, name)
			}
			reviews := grants(role, "authentication.k8s.io", "tokenreviews", "create") &&
				grants(role, "authorization.k8s.io", "subjectaccessreviews", "create")
			if reviews != (auth == "delegated") {
				t.Errorf("metrics.auth=%s: %s may create TokenReviews and SubjectAccessReviews: %v", auth, name, reviews)
			}
		}
		objs := renderRBAC(t, "rbac.yaml", map[string]any{"metrics.auth": auth})
		r, ok := objs.roles[reader]
		if ok != (auth == "delegated") {
			t.Fatalf("metrics.auth=%s: ClusterRole %s rendered: %v", auth, reader, ok)
		}
		if ok && (len(r.Rules) != 1 || !slices.Equal(r.Rules[0].NonResourceURLs, []string{"/metrics"}) || !slices.Equal(r.Rules[0].Verbs, []string{"get"})) {
			t.Errorf("%s rules %+v, want get on /metrics alone", reader, r.Rules)
		}
		if _, bound := objs.bindings[reader]; bound {
			t.Errorf("metrics.auth=%s: %s bound with no metrics.readers", auth, reader)
		}
	}

	prometheus := map[string]any{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}
	objs := renderRBAC(t, "rbac.yaml", map[string]any{"metrics.readers": []any{prometheus}})
	b, ok := objs.bindings[reader]
	if !ok || b.RoleRef.Name != reader || len(b.Subjects) != 1 || b.Subjects[0].Name != "prometheus" || b.Subjects[0].Namespace != "monitoring" {
		t.Errorf("metrics.readers: binding %+v, want %s bound to monitoring/prometheus", b, reader)
	}
}

// TestWebhookReadsOnlyItsSecret: in the self-managed TLS mode the webhook's Role grants nothing
// on Secrets but on its own TLS Secret, by name.
func TestWebhookReadsOnlyItsSecret(t *testing.T) {
	objs := renderRBAC(t, "webhook-rbac.yaml", nil)
	role, ok := objs.roles["role/"+releaseName+"-webhook"]
	if !ok {
		t.Fatal("webhook-rbac.yaml renders no Role for the webhook")
	}
	var verbs []string
	for _, r := range role.Rules {
		if !slices.Contains(r.Resources, "secrets") {
			continue
		}
		if !slices.Equal(r.ResourceNames, []string{releaseName + "-webhook-tls"}) {
			t.Errorf("rule %+v: Secrets beyond %s-webhook-tls", r, releaseName)
		}
		verbs = append(verbs, r.Verbs...)
	}
	for _, want := range []string{"get", "list", "watch", "update"} {
		if !slices.Contains(verbs, want) {
			t.Errorf("the webhook may not %s its TLS Secret: verbs %v", want, verbs)
		}
	}
}

// TestMetricsAuthFlag: the kubelet plugin, the device plugin and the webhook get metrics.auth
// as --metrics-auth.
func TestMetricsAuthFlag(t *testing.T) {
	for _, template := range []string{"daemonset.yaml", "device-plugin.yaml", "webhook-deployment.yaml"} {
		for _, auth := range []string{"delegated", "none"} {
			var found bool
			for _, doc := range renderTemplate(t, template, map[string]any{"metrics.auth": auth, "mode": "per-node"}) {
				found = found || strings.Contains(doc, "- --metrics-auth="+auth+"\n")
			}
			if !found {
				t.Errorf("%s with metrics.auth=%s: no --metrics-auth=%s", template, auth, auth)
			}
		}
	}
}
