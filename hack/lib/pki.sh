# shellcheck shell=bash
# Certificates and kubeconfigs of the local cluster, made with openssl. Sourced by cluster-up.sh
# after lib/cluster.sh. EC P-256 keys: generating them takes milliseconds on a loaded machine,
# RSA keys take seconds each.

# new_key FILE writes an EC private key.
new_key() {
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
  chmod 600 "$1"
}

make_ca() {
  new_key "${PKI_DIR}/ca.key"
  openssl req -x509 -new -key "${PKI_DIR}/ca.key" -subj "/CN=vgpu-dra-local-ca" -days 365 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "${PKI_DIR}/ca.crt" 2>/dev/null
}

# issue_cert NAME SUBJECT USAGE [SAN] signs PKI_DIR/NAME.{key,crt} with the cluster CA.
# USAGE is serverAuth or clientAuth; SAN is an openssl subjectAltName value.
issue_cert() {
  local name="$1" subject="$2" usage="$3" san="${4:-}" ext
  ext="$(mktemp)"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=${usage}"
    [[ -n "${san}" ]] && echo "subjectAltName=${san}"
  } >"${ext}"
  new_key "${PKI_DIR}/${name}.key"
  openssl req -new -key "${PKI_DIR}/${name}.key" -subj "${subject}" 2>/dev/null |
    openssl x509 -req -CA "${PKI_DIR}/ca.crt" -CAkey "${PKI_DIR}/ca.key" -CAcreateserial \
      -days 365 -extfile "${ext}" -out "${PKI_DIR}/${name}.crt" 2>/dev/null
  rm -f "${ext}"
}

# write_kubeconfig FILE CERT_NAME writes a kubeconfig that authenticates with PKI_DIR/CERT_NAME.
# Everything talks to the API server on loopback; only pods use the advertised node IP.
write_kubeconfig() {
  local file="$1" cert="$2"
  cat >"${file}" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: vgpu-dra-local
  cluster:
    server: https://127.0.0.1:${APISERVER_PORT}
    certificate-authority: ${PKI_DIR}/ca.crt
users:
- name: ${cert}
  user:
    client-certificate: ${PKI_DIR}/${cert}.crt
    client-key: ${PKI_DIR}/${cert}.key
contexts:
- name: vgpu-dra-local
  context:
    cluster: vgpu-dra-local
    user: ${cert}
current-context: vgpu-dra-local
EOF
  chmod 600 "${file}"
}

# make_pki writes the CA, every component's certificate and kubeconfig, and the service account
# signing key. Identities follow the names Kubernetes' default RBAC bindings expect
# (system:kube-controller-manager, system:kube-scheduler, system:kube-proxy, system:node:NODE).
make_pki() {
  local ip="$1"
  mkdir -p "${PKI_DIR}"
  chmod 700 "${PKI_DIR}"
  make_ca
  issue_cert apiserver "/CN=kube-apiserver" serverAuth \
    "IP:127.0.0.1,IP:${ip},IP:${SERVICE_KUBERNETES_IP},DNS:localhost,DNS:${NODE_NAME},DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  # The API server's identity towards the kubelet (exec, logs, port-forward).
  issue_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
  issue_cert admin "/O=system:masters/CN=vgpu-dra-admin" clientAuth
  issue_cert controller-manager "/CN=system:kube-controller-manager" clientAuth
  issue_cert scheduler "/CN=system:kube-scheduler" clientAuth
  issue_cert kube-proxy "/CN=system:kube-proxy" clientAuth
  issue_cert kubelet "/O=system:nodes/CN=system:node:${NODE_NAME}" clientAuth
  issue_cert kubelet-serving "/CN=${NODE_NAME}" serverAuth "IP:127.0.0.1,IP:${ip},DNS:${NODE_NAME}"
  new_key "${PKI_DIR}/service-account.key"
  openssl pkey -in "${PKI_DIR}/service-account.key" -pubout -out "${PKI_DIR}/service-account.pub" 2>/dev/null

  write_kubeconfig "${KUBECONFIG_ADMIN}" admin
  write_kubeconfig "${CONFIG_DIR}/controller-manager.kubeconfig" controller-manager
  write_kubeconfig "${CONFIG_DIR}/scheduler.kubeconfig" scheduler
  write_kubeconfig "${CONFIG_DIR}/kube-proxy.kubeconfig" kube-proxy
  write_kubeconfig "${CONFIG_DIR}/kubelet.kubeconfig" kubelet
}
