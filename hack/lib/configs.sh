# shellcheck shell=bash
# Configuration files of the local cluster's node components. Sourced by cluster-up.sh after
# lib/cluster.sh. Pitfalls referenced here: hack/README.md, "Facts of this project's machines".

# write_containerd_config: containerd 2.4 (config version 4) with CRI, NRI and CDI.
write_containerd_config() {
  mkdir -p "${RUN_DIR}/containerd" "${RUN_DIR}/nri/plugins" "${RUN_DIR}/nri/conf.d"
  cat >"${CONFIG_DIR}/containerd.toml" <<EOF
version = 4
root = "${RUN_DIR}/containerd/root"
state = "${RUN_DIR}/containerd/state"
# Default /etc/containerd/conf.d/*.toml: nothing from the host's containerd setup may leak in.
imports = []

[plugins]
  # Config version 4 moved the sockets from [grpc]/[ttrpc] into server plugins.
  [plugins.'io.containerd.server.v1.grpc']
    address = "${CONTAINERD_SOCKET}"
  [plugins.'io.containerd.server.v1.ttrpc']
    address = "${CONTAINERD_SOCKET}.ttrpc"
  # Shim sockets default to /run/containerd/s (sha256 names: ${#RUN_DIR} + 78 bytes here).
  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = "${RUN_DIR}/containerd/s"
  # Default /opt/containerd: keep even this directory under the run dir.
  [plugins.'io.containerd.internal.v1.opt']
    path = "${RUN_DIR}/containerd/opt"

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      # Built by hack/images.sh; there is no registry to pull registry.k8s.io/pause from.
      sandbox = "${PAUSE_IMAGE}"

  [plugins.'io.containerd.cri.v1.runtime']
    # Root here lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj to the kubelet's -998
    # for sandboxes and every pod fails with "can't get final child's PID from pipe: EOF".
    restrict_oom_score_adj = true
    # CDI is always on in containerd 2.x (there is no enable_cdi key any more).
    cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
    # Network namespaces are bind-mounted under the state dir instead of /var/run/netns, so
    # cluster-down finds every mount under the run dir.
    netns_mounts_under_state_dir = true
    # This VM mounts no hugetlb controller.
    tolerate_missing_hugetlb_controller = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "$(command -v runc)"
          # The kubelet uses the cgroupfs driver on this hybrid-cgroup VM; both must agree.
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["${CNI_BIN_DIR}"]
      conf_dir = "${CNI_CONF_DIR}"
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"

  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = "${NRI_SOCKET}"
    plugin_path = "${RUN_DIR}/nri/plugins"
    plugin_config_path = "${RUN_DIR}/nri/conf.d"
    plugin_registration_timeout = "5s"
    plugin_request_timeout = "2s"
    # The default validator enforces the required-plugins annotation (contract.md §1): a
    # container that requires the vgpu-dra NRI plugin is refused while the plugin is absent,
    # instead of starting without its limits.
    [plugins.'io.containerd.nri.v1.nri'.default_validator]
      enable = true
EOF
}

# write_cni_config: one bridge network with host-local IPAM whose state stays in the run dir.
# No ipMasq: pods only need the node (API server) and each other, and it would add iptables
# chains per pod.
write_cni_config() {
  mkdir -p "${CNI_CONF_DIR}" "${RUN_DIR}/cni/ipam"
  cat >"${CNI_CONF_DIR}/10-vgd.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "vgd",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "${CNI_BRIDGE}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "${RUN_DIR}/cni/ipam",
        "ranges": [[{"subnet": "${POD_CIDR}"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
}

# write_kubelet_config: what this VM needs (notes: "kubelet on this hybrid-cgroup VM").
write_kubelet_config() {
  local ip="$1"
  cat >"${CONFIG_DIR}/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: ${ip}
port: ${KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${KUBELET_HEALTHZ_PORT}
tlsCertFile: ${PKI_DIR}/kubelet-serving.crt
tlsPrivateKeyFile: ${PKI_DIR}/kubelet-serving.key
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: ${PKI_DIR}/ca.crt
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://${CONTAINERD_SOCKET}
# cgroup v1 controllers with a v2 hierarchy beside them: systemd does not manage cgroups here.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
# Default /usr/libexec/kubernetes/...: keep it under the run dir.
volumePluginDir: ${RUN_DIR}/kubelet-volume-plugins
# Images are imported, never pulled: the kubelet must not garbage-collect them when other work
# fills the shared disk, nor evict test pods over disk pressure.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
# Logs stay short; e2e reads them with kubectl logs.
containerLogMaxSize: 10Mi
containerLogMaxFiles: 2
EOF
  # The chaos suite kills the plugin a hundred times: with the default back-off (10 s doubling to
  # 5 min) the kubelet would soon wait minutes before each restart. Only how soon it restarts
  # changes (KubeletCrashLoopBackOffMax, beta and on since 1.35).
  if [[ -n "${VGPU_DRA_KUBELET_MAX_RESTART_PERIOD:-}" ]]; then
    cat >>"${CONFIG_DIR}/kubelet.yaml" <<EOF
crashLoopBackOff:
  maxContainerRestartPeriod: ${VGPU_DRA_KUBELET_MAX_RESTART_PERIOD}
EOF
  fi
}

# write_kube_proxy_config: iptables mode, told not to touch conntrack or route_localnet sysctls
# so that cluster-down has less to restore.
write_kube_proxy_config() {
  local ip="$1"
  cat >"${CONFIG_DIR}/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: ${POD_CIDR}
hostnameOverride: ${NODE_NAME}
bindAddress: ${ip}
metricsBindAddress: 127.0.0.1:${KUBE_PROXY_METRICS_PORT}
healthzBindAddress: 127.0.0.1:${KUBE_PROXY_HEALTHZ_PORT}
clientConnection:
  kubeconfig: ${CONFIG_DIR}/kube-proxy.kubeconfig
iptables:
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}
