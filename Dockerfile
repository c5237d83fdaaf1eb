# Multi-stage build of the vgpu-dra image, for users who build images with Docker. One image
# carries every binary; the chart runs each from it by command.
# It cannot be built on this project's CI machines (no Docker engine, no registry): there,
# hack/images.sh assembles the same filesystem layout from host files. Keep the two in step:
#   /usr/local/bin/<every binary of cmd/>  (vgpu-kubelet-plugin and vgpu-device-plugin: the chart
#                                          runs one of them per node by its command; vgpu-webhook:
#                                          the admission webhook's Deployment, as UID 65532;
#                                          vgpu-registry-client: a debugging aid)
#   /usr/local/lib/vgpu-dra/libvgpu.so   (installed into the host state dir by the plugin)
ARG GO_VERSION=1.26
FROM golang:${GO_VERSION}-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends cmake && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# cgo is on: go-nvml loads libnvidia-ml with dlopen.
RUN go build -trimpath -o /out/bin/ ./cmd/...
RUN cmake -S library -B /tmp/library -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF \
 && cmake --build /tmp/library --target vgpu -j"$(nproc)" \
 && install -D -m 0644 /tmp/library/libvgpu.so /out/lib/libvgpu.so

FROM debian:bookworm-slim
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/lib/libvgpu.so /usr/local/lib/vgpu-dra/libvgpu.so
ENTRYPOINT ["/usr/local/bin/vgpu-kubelet-plugin"]
