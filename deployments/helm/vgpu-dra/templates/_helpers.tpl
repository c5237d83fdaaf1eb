{{- define "vgpu-dra.fullname" -}}
{{- printf "%s" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "vgpu-dra.labels" -}}
app.kubernetes.io/name: vgpu-dra
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "vgpu-dra.selectorLabels" -}}
app.kubernetes.io/name: vgpu-dra
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kubelet-plugin
{{- end -}}

{{- define "vgpu-dra.serviceAccount" -}}
{{ include "vgpu-dra.fullname" . }}-kubelet-plugin
{{- end -}}

{{- define "vgpu-dra.devicePluginSelectorLabels" -}}
app.kubernetes.io/name: vgpu-dra
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: device-plugin
{{- end -}}

{{- define "vgpu-dra.devicePluginServiceAccount" -}}
{{ include "vgpu-dra.fullname" . }}-device-plugin
{{- end -}}

{{/* runsDRA / runsDevicePlugin: "true" when the mode installs that plugin on some nodes. */}}
{{- define "vgpu-dra.runsDRA" -}}
{{- if has .Values.mode (list "dra" "per-node") }}true{{ end -}}
{{- end -}}
{{- define "vgpu-dra.runsDevicePlugin" -}}
{{- if has .Values.mode (list "device-plugin" "per-node") }}true{{ end -}}
{{- end -}}

{{/*
vgpu-dra.affinity: the user's affinity, and in mode per-node the node label that picks the
plugin ANDed into every required node selector term. Call with (dict "root" $ "operator" "In"|"NotIn").
*/}}
{{- define "vgpu-dra.affinity" -}}
{{- $root := .root -}}
{{- $aff := deepCopy ($root.Values.affinity | default dict) -}}
{{- if eq $root.Values.mode "per-node" -}}
{{- $expr := dict "key" $root.Values.modeLabel "operator" .operator "values" (list "device-plugin") -}}
{{- $na := get $aff "nodeAffinity" | default dict -}}
{{- $req := get $na "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := get $req "nodeSelectorTerms" | default (list (dict)) -}}
{{- $merged := list -}}
{{- range $terms -}}
{{- $t := deepCopy . -}}
{{- $_ := set $t "matchExpressions" (append (get $t "matchExpressions" | default list) $expr) -}}
{{- $merged = append $merged $t -}}
{{- end -}}
{{- $_ := set $req "nodeSelectorTerms" $merged -}}
{{- $_ := set $na "requiredDuringSchedulingIgnoredDuringExecution" $req -}}
{{- $_ := set $aff "nodeAffinity" $na -}}
{{- end -}}
{{- if $aff }}{{ toYaml $aff }}{{ end -}}
{{- end -}}

{{- define "vgpu-dra.featureGates" -}}
{{- $gates := list -}}
{{- range $k, $v := .Values.featureGates -}}
{{- $gates = append $gates (printf "%s=%t" $k $v) -}}
{{- end -}}
{{- join "," $gates -}}
{{- end -}}

{{- define "vgpu-dra.webhookSelectorLabels" -}}
app.kubernetes.io/name: vgpu-dra
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "vgpu-dra.webhookName" -}}
{{ include "vgpu-dra.fullname" . }}-webhook
{{- end -}}

{{/* The Secret of the webhook's serving certificate (cert-controller's or cert-manager's). */}}
{{- define "vgpu-dra.webhookTLSSecret" -}}
{{ include "vgpu-dra.fullname" . }}-webhook-tls
{{- end -}}

{{/* The name the API server calls the webhook by, which its certificate is issued for. */}}
{{- define "vgpu-dra.webhookDNSName" -}}
{{ include "vgpu-dra.webhookName" . }}.{{ .Release.Namespace }}.svc
{{- end -}}

{{/*
webhookExtendedResource: the extended resource the webhook treats as a vGPU served through DRA,
in mode dra only. In mode device-plugin the device plugin serves it (no NRI plugin runs, so the
required-plugins annotation would make containerd refuse every such container); in mode per-node
the scheduler picks the node, so admission cannot tell which plugin will serve it.
*/}}
{{- define "vgpu-dra.webhookExtendedResource" -}}
{{- if eq .Values.mode "dra" }}{{ .Values.driverName }}/vgpu{{ end -}}
{{- end -}}

{{/* CEL: the container asks for the DeviceClass's extended resource. */}}
{{- define "vgpu-dra.usesExtendedResource" -}}
has(c.resources) && ((has(c.resources.limits) && '{{ .Values.driverName }}/vgpu' in c.resources.limits) || (has(c.resources.requests) && '{{ .Values.driverName }}/vgpu' in c.resources.requests))
{{- end -}}

{{/* CEL over a ResourceClaimSpec at $spec: some request may be served by the DeviceClass. */}}
{{- define "vgpu-dra.specUsesClass" -}}
{{- $spec := index . 0 -}}{{- $classes := include "vgpu-dra.celClassList" (index . 1) -}}
has({{ $spec }}.devices) && has({{ $spec }}.devices.requests) && {{ $spec }}.devices.requests.exists(r, (has(r.exactly) && r.exactly.deviceClassName in {{ $classes }}) || (has(r.firstAvailable) && r.firstAvailable.exists(s, s.deviceClassName in {{ $classes }})))
{{- end -}}

{{/*
vgpu-dra.deviceClasses: the DeviceClasses whose requests are vGPU requests, comma-separated, the
main one first (the webhook's --device-class); the compute classes' with deviceClass.computeClasses;
the MIG class's always, created or not: an upgrade that turns mig.gpus on creates the class while
the webhook of the release before still runs, and that one must not refuse it as a foreign class.
*/}}
{{- define "vgpu-dra.deviceClasses" -}}
{{ .Values.driverName }}
{{- if .Values.deviceClass.computeClasses }},guaranteed.{{ .Values.driverName }},best-effort.{{ .Values.driverName }}{{ end -}}
,mig.{{ .Values.driverName }}
{{- end -}}

{{/*
vgpu-dra.migOn: "true" when mig.gpus names any GPU; a number (--set mig.gpus=0) is falsy to "if".
*/}}
{{- define "vgpu-dra.migOn" -}}
{{- if ne (printf "%v" .Values.mig.gpus) "" }}true{{ end -}}
{{- end -}}

{{/*
vgpu-dra.deviceOfType: a DeviceClass's CEL selector of the driver's devices of one type (contract
§2, §18): "vgpu" for whole GPUs, "mig" for MIG partitions.
*/}}
{{- define "vgpu-dra.deviceOfType" -}}
{{- $driver := index . 0 -}}
device.driver == {{ $driver | quote }} && device.attributes[{{ $driver | quote }}].type == {{ index . 1 | quote }}
{{- end -}}

{{/* vgpu-dra.celClassList: those names as a CEL list, ['a', 'b']. */}}
{{- define "vgpu-dra.celClassList" -}}
['{{ .Values.driverName }}'{{ if .Values.deviceClass.computeClasses }}, 'guaranteed.{{ .Values.driverName }}', 'best-effort.{{ .Values.driverName }}'{{ end }}, 'mig.{{ .Values.driverName }}']
{{- end -}}

{{/* What every webhook of the chart shares (contract §12). */}}
{{- define "vgpu-dra.webhookCommon" -}}
admissionReviewVersions: ["v1"]
sideEffects: None
failurePolicy: Fail
timeoutSeconds: {{ .Values.webhook.timeoutSeconds }}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: [{{ .Release.Namespace | quote }}, "kube-system"]
{{- end }}

{{/*
Pods that may use a vGPU: resourceClaims, or (mode dra) the extended resource in any container.
Called with (list $ toolkitEnv): with toolkitEnv, also pods with a container that sets one of
the NVIDIA Container Toolkit's device variables (webhook.refuseNvidiaVisibleDevices).
*/}}
{{- define "vgpu-dra.webhookPodConditions" -}}
{{- $root := index . 0 -}}{{- $toolkitEnv := index . 1 -}}
matchConditions:
  - name: may-use-a-gpu
    expression: >-
      (has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)
      {{- if include "vgpu-dra.webhookExtendedResource" $root }} ||
      object.spec.containers.exists(c, {{ include "vgpu-dra.usesExtendedResource" $root }}) ||
      (has(object.spec.initContainers) && object.spec.initContainers.exists(c, {{ include "vgpu-dra.usesExtendedResource" $root }}))
      {{- end }}
      {{- if $toolkitEnv }} ||
      object.spec.containers.exists(c, {{ include "vgpu-dra.setsToolkitEnv" $root }}) ||
      (has(object.spec.initContainers) && object.spec.initContainers.exists(c, {{ include "vgpu-dra.setsToolkitEnv" $root }})) ||
      (has(object.spec.ephemeralContainers) && object.spec.ephemeralContainers.exists(c, {{ include "vgpu-dra.setsToolkitEnv" $root }}))
      {{- end }}
{{- end }}

{{/* CEL: the container sets a variable through which it asks the NVIDIA Container Toolkit for devices. */}}
{{- define "vgpu-dra.setsToolkitEnv" -}}
has(c.env) && c.env.exists(e, e.name in ['NVIDIA_VISIBLE_DEVICES', 'NVIDIA_MIG_CONFIG_DEVICES', 'NVIDIA_MIG_MONITOR_DEVICES', 'NVIDIA_IMEX_CHANNELS'])
{{- end -}}
